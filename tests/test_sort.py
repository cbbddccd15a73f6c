"""jax_topk.sort / argsort against the numpy oracle (both directions, special
values, lengths) and jnp.argsort where their orders agree."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jax_topk
import oracle
from conftest import FALLBACK_DTYPES, KERNEL_DTYPES, TEST_DEVICE, TEST_MODULE, make_input, np_dtype
from jax_topk._keys import lowest_value


def run_sort(x, axis=-1, descending=False, lengths=None):
    with jax.default_device(TEST_DEVICE):
        fn = jax.jit(lambda a, l: jax_topk.sort(a, axis=axis, descending=descending, lengths=l))
        v, i = fn(jnp.asarray(x), None if lengths is None else jnp.asarray(lengths))
    return np.asarray(v), np.asarray(i)


def assert_sorted_like_oracle(x, axis=-1, descending=False):
    values, indices = run_sort(x, axis, descending)
    want_values, want_indices = oracle.sort(x, axis, descending)
    np.testing.assert_array_equal(indices, want_indices)
    assert oracle.same_bits(values, want_values)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES + FALLBACK_DTYPES)
@pytest.mark.parametrize("kind", ["random", "ties", "equal", "special"])
@pytest.mark.parametrize("descending", [False, True])
def test_matches_oracle(dtype, kind, descending, rng):
    for shape in ((37, 301), (3, 1), (2, 4097), (0, 5), (4, 0)):
        assert_sorted_like_oracle(make_input(kind, shape, dtype, rng), descending=descending)


@pytest.mark.parametrize("n", [1, 2, 17, 64, 65, 255, 256, 257, 1000, 4096, 65536])
def test_lengths_of_rows(n, rng):
    for descending in (False, True):
        assert_sorted_like_oracle(make_input("ties", (3, n), "float32", rng), descending=descending)


def test_long_rows(rng):
    for dtype in ("float32", "bfloat16", "float64"):
        assert_sorted_like_oracle(make_input("random", (1, 1 << 20), dtype, rng), descending=True)
    assert_sorted_like_oracle(make_input("ties", (2, 1 << 18), "int32", rng))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_axes(axis, rng):
    x = make_input("special", (6, 9, 11), "float16", rng)
    for descending in (False, True):
        assert_sorted_like_oracle(x, axis, descending)


def test_agrees_with_jnp_argsort_without_nan_or_signed_zero(rng):
    x = np.round(rng.standard_normal((50, 300)) * 4).astype(np.float32) + 0.5  # ties, never +-0
    for descending in (False, True):
        _, indices = run_sort(x, descending=descending)
        want = jnp.argsort(jnp.asarray(x), axis=-1, stable=True, descending=descending)
        np.testing.assert_array_equal(indices, np.asarray(want))


def padded_sort_reference(row, length, descending):
    length = int(np.clip(length, 0, row.shape[-1]))
    v, i = oracle.sort(row[:length], descending=descending)
    pad = row.shape[-1] - length
    return (np.concatenate([v, np.full(pad, lowest_value(row.dtype), row.dtype)]),
            np.concatenate([i, np.full(pad, -1, np.int32)]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "uint64", "bool"])
@pytest.mark.parametrize("descending", [False, True])
def test_lengths(dtype, descending, rng):
    x = make_input("special" if "float" in dtype else "ties", (9, 300), dtype, rng)
    lengths = np.array([0, 300, 1, 2, 299, 150, -3, 1000, 64], np.int32)
    values, indices = run_sort(x, descending=descending, lengths=lengths)
    for b in range(x.shape[0]):
        want_v, want_i = padded_sort_reference(x[b], lengths[b], descending)
        np.testing.assert_array_equal(indices[b], want_i, err_msg=f"row {b}")
        assert oracle.same_bits(values[b], want_v), f"row {b}"


def test_argsort_is_sorts_indices(rng):
    x = jnp.asarray(make_input("ties", (5, 40), "int32", rng))
    for descending in (False, True):
        np.testing.assert_array_equal(jax_topk.argsort(x, descending=descending),
                                      jax_topk.sort(x, descending=descending)[1])


def count_custom_calls(fn, *args, op="sort") -> int:
    target = jax_topk.info()["platforms"][TEST_MODULE]["targets"].get(op)
    return jax.jit(fn).lower(*args).as_text().count(f"stablehlo.custom_call @{target}") if target else None


@pytest.mark.parametrize("in_axis", [0, 1])
def test_vmap_is_one_call(in_axis, rng):
    x = jnp.asarray(make_input("ties", (4, 6, 30), "float32", rng))
    fn = jax.vmap(lambda r: jax_topk.sort(r, descending=True), in_axes=in_axis)
    values, indices = fn(x)
    for b in range(x.shape[in_axis]):
        want_v, want_i = oracle.sort(np.asarray(jnp.take(x, b, axis=in_axis)), descending=True)
        assert oracle.same_bits(values[b], want_v) and np.array_equal(indices[b], want_i)
    calls = count_custom_calls(fn, x)
    assert calls in (1, None)  # None: this platform sorts through the fallback


def test_vmap_over_lengths_is_one_call(rng):
    x = jnp.asarray(make_input("random", (3, 5, 20), "float32", rng))
    lengths = jnp.asarray(rng.integers(0, 21, size=(3, 5)).astype(np.int32))
    fn = jax.vmap(lambda a, l: jax_topk.sort(a, lengths=l), in_axes=(None, 0))
    values, indices = fn(x[0], lengths)
    for b in range(3):
        for r in range(5):
            want_v, want_i = padded_sort_reference(np.asarray(x[0, r]), int(lengths[b, r]), False)
            assert oracle.same_bits(values[b, r], want_v) and np.array_equal(indices[b, r], want_i)
    assert count_custom_calls(fn, x[0], lengths, op="sort_lengths") in (1, None)


def test_gradients(rng):
    x = jnp.asarray(rng.permutation(60).reshape(3, 20).astype(np.float64) / 60)
    check_grads(lambda a: jax_topk.sort(a)[0], (x,), order=2, modes=("fwd", "rev"))
    check_grads(lambda a: jax_topk.sort(a, descending=True, axis=0)[0], (x,), order=1, modes=("fwd", "rev"))


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda: jax_topk.sort(jnp.zeros((3, 5)), axis=2), ValueError, r"jax_topk.sort: axis=2 is out of range"),
        (lambda: jax_topk.argsort(jnp.zeros(()),), ValueError, r"jax_topk.argsort: x must have at least one dimension"),
        (lambda: jax_topk.sort([3, 1]), TypeError, r"jax_topk.sort: x must be a jax.Array"),
        (lambda: jax_topk.sort(jnp.zeros(3, jnp.complex64)), TypeError, r"no total order"),
        (lambda: jax_topk.sort(jnp.zeros(3), descending=1), TypeError, r"descending must be a bool"),
        (lambda: jax_topk.sort(jnp.zeros((2, 3)), lengths=jnp.zeros(3, jnp.int32)), ValueError,
         r"lengths must have shape \(2,\)"),
    ],
)
def test_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_native_kernel_serves_sort_on_cpu():
    if TEST_MODULE != "cpu":
        pytest.skip("CPU only")
    text = jax.jit(lambda a: jax_topk.sort(a)).lower(jnp.zeros((3, 8), np_dtype("float32"))).as_text()
    assert "jax_topk_sort" in text
