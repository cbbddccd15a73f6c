"""top_k(..., lengths=): each row equals the unpadded call, padded; vmap over
x and lengths is one call; the documented rule for lengths outside [0, n]."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_topk
import oracle
from conftest import FALLBACK_DTYPES, KERNEL_DTYPES, TEST_DEVICE, TEST_MODULE, make_input, np_dtype
from jax_topk._keys import lowest_value


def padded_row_reference(row: np.ndarray, k: int, length: int):
    """top_k of the row's first `length` elements, padded to k slots."""
    length = int(np.clip(length, 0, row.shape[-1]))
    v, i = oracle.top_k(row[:length], min(k, length))
    pad = k - v.shape[0]
    return (np.concatenate([v, np.full(pad, lowest_value(row.dtype), row.dtype)]),
            np.concatenate([i, np.full(pad, -1, np.int32)]))


def run(x, k, lengths, axis=-1):
    with jax.default_device(TEST_DEVICE):
        fn = jax.jit(lambda a, l: jax_topk.top_k(a, k, axis=axis, lengths=l))
        v, i = fn(jnp.asarray(x), jnp.asarray(lengths))
    return np.asarray(v), np.asarray(i)


def assert_rows_match(x, k, lengths):
    values, indices = run(x, k, lengths)
    for b in range(x.shape[0]):
        want_v, want_i = padded_row_reference(x[b], k, lengths[b])
        np.testing.assert_array_equal(indices[b], want_i, err_msg=f"row {b}, length {lengths[b]}")
        assert oracle.same_bits(values[b], want_v), f"row {b}, length {lengths[b]}"


@pytest.mark.parametrize("dtype", KERNEL_DTYPES + FALLBACK_DTYPES)
@pytest.mark.parametrize("kind", ["random", "ties", "special"])
def test_each_row_equals_the_unpadded_call(dtype, kind, rng):
    x = make_input(kind, (12, 70), dtype, rng)
    lengths = np.array([0, 70, 1, 5, 69, 33, 8, 9, 70, 2, 40, 10], np.int32)
    for k in (0, 1, 8, 40, 70):
        assert_rows_match(x, k, lengths)


def test_large_rows_mixed_lengths(rng):
    # The variable-length batch of the issue: 31 rows of 2000..8000, k=512.
    lengths = rng.integers(2000, 8001, size=31).astype(np.int32)
    x = make_input("random", (31, 8000), "float32", rng)
    assert_rows_match(x, 512, lengths)
    x = make_input("ties", (3, 1 << 18), "float32", rng)  # long rows take the split path
    assert_rows_match(x, 1000, np.array([1 << 18, 100_000, 5], np.int32))


def test_lengths_outside_the_row_read_as_a_sequence_mask(rng):
    # Documented rule: arange(n) < lengths, so <= 0 selects nothing, >= n all.
    x = make_input("random", (4, 30), "float32", rng)
    lengths = np.array([-5, 0, 31, 1000], np.int32)
    values, indices = run(x, 4, lengths)
    assert np.all(indices[:2] == -1) and np.all(np.isneginf(values[:2]))
    for b in (2, 3):
        v, i = oracle.top_k(x[b], 4)
        assert oracle.same_bits(values[b], v) and np.array_equal(indices[b], i)


def test_other_axis_and_3d(rng):
    x = make_input("special", (5, 20, 3), "float32", rng)  # top_k along axis 1
    lengths = rng.integers(0, 21, size=(5, 3)).astype(np.int32)
    values, indices = run(x, 6, lengths, axis=1)
    for a in range(5):
        for c in range(3):
            want_v, want_i = padded_row_reference(x[a, :, c], 6, lengths[a, c])
            assert oracle.same_bits(values[a, :, c], want_v) and np.array_equal(indices[a, :, c], want_i)


def test_lengths_of_any_integer_dtype_and_scalar_for_1d(rng):
    x = make_input("random", (3, 10), "float32", rng)
    a = jax_topk.top_k(jnp.asarray(x), 3, lengths=np.array([2, 5, 10], np.int64))
    b = jax_topk.top_k(jnp.asarray(x), 3, lengths=jnp.array([2, 5, 10], jnp.uint8))
    assert np.array_equal(a[1], b[1])
    v, i = jax_topk.top_k(jnp.asarray(x[0]), 3, lengths=2)
    assert np.array_equal(i[2], -1) and i[0] >= 0


def count_custom_calls(fn, *args) -> int:
    target = jax_topk.info()["platforms"][TEST_MODULE]["targets"]["top_k_lengths"]
    return jax.jit(fn).lower(*args).as_text().count(f"stablehlo.custom_call @{target}")


@pytest.mark.parametrize("batched", ["both", "x", "lengths"])
def test_vmap_over_x_and_lengths_is_one_call(batched, rng):
    x = jnp.asarray(make_input("ties", (4, 6, 25), "float32", rng))  # vmap over axis 0
    lengths = jnp.asarray(rng.integers(-1, 27, size=(4, 6)).astype(np.int32))
    in_axes = {"both": (0, 0), "x": (0, None), "lengths": (None, 0)}[batched]
    xs = x if in_axes[0] == 0 else x[0]
    ls = lengths if in_axes[1] == 0 else lengths[0]
    fn = jax.vmap(lambda a, l: jax_topk.top_k(a, 5, lengths=l), in_axes=in_axes)
    values, indices = fn(xs, ls)
    for b in range(4):
        xb = np.asarray(x[b] if in_axes[0] == 0 else x[0])
        lb = np.asarray(lengths[b] if in_axes[1] == 0 else lengths[0])
        for r in range(6):
            want_v, want_i = padded_row_reference(xb[r], 5, lb[r])
            assert oracle.same_bits(values[b, r], want_v) and np.array_equal(indices[b, r], want_i)
    if jax_topk.info()["platforms"][TEST_MODULE]["targets"].get("top_k_lengths"):
        assert count_custom_calls(fn, xs, ls) == 1


def test_gradient_is_zero_at_padded_slots(rng):
    x = jnp.asarray(rng.permutation(40).reshape(4, 10).astype(np.float32) / 40)
    lengths = jnp.array([0, 3, 10, 7], jnp.int32)
    g = jax.grad(lambda a: jax_topk.top_k(a, 5, lengths=lengths)[0].clip(-10).sum())(x)
    for b in range(4):
        _, idx = padded_row_reference(np.asarray(x[b]), 5, int(lengths[b]))
        want = np.zeros(10, np.float32)
        want[idx[idx >= 0]] = 1.0
        np.testing.assert_array_equal(np.asarray(g[b]), want)


@pytest.mark.parametrize(
    "lengths,error,message",
    [
        (np.zeros(4, np.int32), ValueError, r"lengths must have shape \(3,\) \(x's shape \(3, 5\) without axis 1\), got \(4,\)"),
        (np.zeros(3, np.float32), TypeError, r"lengths must have an integer dtype, got float32"),
        ([1, 2, 3], TypeError, r"lengths must be a jax.Array or numpy.ndarray, got list"),
    ],
)
def test_lengths_errors(lengths, error, message):
    with pytest.raises(error, match=message):
        jax_topk.top_k(jnp.zeros((3, 5)), 2, lengths=lengths)


def test_native_kernel_serves_lengths_on_cpu():
    if TEST_MODULE != "cpu":
        pytest.skip("CPU only")
    text = jax.jit(lambda a, l: jax_topk.top_k(a, 2, lengths=l)).lower(
        jnp.zeros((3, 8), np_dtype("float32")), jnp.zeros(3, jnp.int32)).as_text()
    assert "jax_topk_top_k_lengths" in text
