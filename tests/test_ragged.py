"""ragged_top_k / ragged_sort equal per-array calls, padded, in one kernel call."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_topk
import oracle
from conftest import TEST_MODULE, make_input
from jax_topk._keys import lowest_value


def arrays_of(lengths, dtype, rng, kind="ties"):
    return [jnp.asarray(make_input(kind, (n,), dtype, rng)) for n in lengths]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int16", "uint64"])
def test_ragged_top_k_equals_per_array_calls(dtype, rng):
    arrays = arrays_of([5, 0, 70, 1, 33, 70], dtype, rng, kind="special" if "float" in dtype else "ties")
    for k in (0, 1, 8, 70):
        values, indices = jax_topk.ragged_top_k(arrays, k)
        assert values.shape == (len(arrays), k)
        for b, a in enumerate(arrays):
            m = min(k, a.shape[0])
            v, i = jax_topk.top_k(a, m)
            assert oracle.same_bits(values[b, :m], v) and np.array_equal(indices[b, :m], i)
            assert np.all(np.asarray(indices[b, m:]) == -1)
            assert oracle.same_bits(values[b, m:], np.full(k - m, lowest_value(a.dtype), a.dtype))


@pytest.mark.parametrize("descending", [False, True])
def test_ragged_sort_equals_per_array_calls(descending, rng):
    arrays = arrays_of([3, 17, 1, 0, 17], "float32", rng, kind="special")
    values, indices = jax_topk.ragged_sort(arrays, descending=descending)
    assert values.shape == (5, 17)
    for b, a in enumerate(arrays):
        n = a.shape[0]
        v, i = oracle.sort(np.asarray(a), descending=descending)
        assert oracle.same_bits(values[b, :n], v) and np.array_equal(indices[b, :n], i)
        assert np.all(np.asarray(indices[b, n:]) == -1)


def test_issue_case_31_rows(rng):
    # 31 rows of 2000..8000, k=512: one padded call equals the per-row loop.
    lengths = rng.integers(2000, 8001, size=31)
    arrays = arrays_of(lengths, "float32", rng, kind="random")
    values, indices = jax_topk.ragged_top_k(arrays, 512)
    for b, a in enumerate(arrays):
        v, i = jax.lax.top_k(a, 512)
        assert oracle.same_bits(values[b], v) and np.array_equal(indices[b], i)


def test_one_kernel_call(rng):
    arrays = arrays_of([10, 20, 30], "float32", rng)
    target = jax_topk.info()["platforms"][TEST_MODULE]["targets"].get("top_k_lengths")
    if target is None:
        pytest.skip("this platform serves lengths through the fallback")
    text = jax.jit(lambda *a: jax_topk.ragged_top_k(list(a), 4)).lower(*arrays).as_text()
    assert text.count(f"stablehlo.custom_call @{target}") == 1


@pytest.mark.parametrize(
    "arrays,error,message",
    [
        (jnp.zeros((2, 3)), TypeError, r"arrays must be a non-empty list or tuple of 1-D arrays, got ArrayImpl"),
        ([], TypeError, r"arrays must be a non-empty list"),
        ([jnp.zeros(3), jnp.zeros((2, 2))], ValueError, r"arrays\[1\] must be 1-D, got shape \(2, 2\)"),
        ([jnp.zeros(3), jnp.zeros(2, jnp.int32)], TypeError, r"arrays must share one dtype"),
        ([[1.0, 2.0]], TypeError, r"arrays\[0\] must be a jax.Array or numpy.ndarray, got list"),
    ],
)
def test_errors(arrays, error, message):
    with pytest.raises(error, match=message):
        jax_topk.ragged_top_k(arrays, 1)


def test_k_larger_than_the_longest_array_is_an_error():
    with pytest.raises(ValueError, match=r"k=4 must be in \[0, 3\]"):
        jax_topk.ragged_top_k([jnp.zeros(3), jnp.zeros(2)], 4)


def test_benchmark_ragged_batch_pads_past_each_length():
    """The benchmarks' ragged batch (benchmarks/ragged.py, trace_calls.py --op
    ragged): lengths within bounds, -inf exactly past each row's length,
    distinct replicas; top_k with lengths= equals the padded lax.top_k on it."""
    from jax_topk import _bench

    batch = _bench.make_ragged_batch(5, 2, low=3, high=40, seed=1)
    assert batch.lengths.dtype == np.int32 and np.all((batch.lengths >= 3) & (batch.lengths <= 40))
    assert all(x.shape == (5, batch.n) for x in batch.inputs)
    for x in map(np.asarray, batch.inputs):
        past = np.arange(batch.n)[None, :] >= batch.lengths[:, None]
        assert np.all(np.isneginf(x[past])) and np.all(np.isfinite(x[~past]))
    assert not np.array_equal(np.asarray(batch.inputs[0]), np.asarray(batch.inputs[1]))
    want = jax.lax.top_k(batch.inputs[0], 3)
    got = jax_topk.top_k(batch.inputs[0], 3, lengths=jnp.asarray(batch.lengths))
    assert oracle.same_bits(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_benchmark_ragged_batch_pads_to_a_given_width():
    """``width`` pads the same draw wider (the rows aligned to 16 bytes), and
    refuses a width below the longest length."""
    from jax_topk import _bench

    narrow = _bench.make_ragged_batch(4, 1, low=3, high=21, seed=2)
    wide = _bench.make_ragged_batch(4, 1, low=3, high=21, seed=2, width=24)
    assert np.array_equal(narrow.lengths, wide.lengths) and wide.inputs[0].shape == (4, 24)
    past = np.arange(24)[None, :] >= wide.lengths[:, None]
    assert np.all(np.isneginf(np.asarray(wide.inputs[0])[past]))
    with pytest.raises(ValueError, match=f"width=2 is less than the longest drawn length {narrow.lengths.max()}"):
        _bench.make_ragged_batch(4, 1, low=3, high=21, seed=2, width=2)
