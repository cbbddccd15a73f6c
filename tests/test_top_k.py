"""jax_topk.top_k against the numpy oracle and lax.top_k (CPU), bit for bit."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

import jax_topk
import oracle
from conftest import FALLBACK_DTYPES, FLOAT_DTYPES, KERNEL_DTYPES, TEST_DEVICE, TEST_MODULE, make_input, np_dtype

CPU = jax.devices("cpu")[0]
ALL_DTYPES = KERNEL_DTYPES + FALLBACK_DTYPES
KINDS = ["random", "ties", "equal", "special"]


def run_top_k(x: np.ndarray, k: int, axis: int = -1):
    """jax_topk.top_k under jit on the platform under test."""
    with jax.default_device(TEST_DEVICE):
        values, indices = jax.jit(functools.partial(jax_topk.top_k, k=k, axis=axis))(jnp.asarray(x))
    return np.asarray(values), np.asarray(indices)


def assert_matches_oracle(x: np.ndarray, k: int, axis: int = -1, *, with_lax: bool = True):
    values, indices = run_top_k(x, k, axis)
    want_values, want_indices = oracle.top_k(x, k, axis)
    np.testing.assert_array_equal(indices, want_indices)
    assert oracle.same_bits(values, want_values), "values differ from the oracle bit-wise"
    lax_departs = x.dtype.name == "bfloat16" and oracle.has_nan_payloads(x)
    if with_lax and x.dtype != np.bool_ and not lax_departs:
        # lax.top_k on CPU follows the same contract (DESIGN section 1), except
        # that jax 0.10 quiets bfloat16 NaN payloads first.
        with jax.default_device(CPU):
            xl = jnp.moveaxis(jnp.asarray(x), axis, -1)
            lv, li = jax.lax.top_k(xl, k)
            lv, li = np.asarray(jnp.moveaxis(lv, -1, axis)), np.asarray(jnp.moveaxis(li, -1, axis))
        np.testing.assert_array_equal(indices, li)
        assert oracle.same_bits(values, lv), "values differ from lax.top_k bit-wise"


def test_bfloat16_nan_payloads_follow_the_total_order():
    # We rank bfloat16 NaNs by payload (the total order) and keep their bits.
    # lax.top_k on CPU quiets them first in jax 0.10 (and so may rank them as
    # ties); that version-dependent behaviour is why assert_matches_oracle does
    # not compare with lax for such inputs.
    x = np.array([0x7FC0, 0x7FC1, 0xFFC1, 0x3F80], np.uint16).view(np_dtype("bfloat16"))
    values, indices = run_top_k(x, 4)
    np.testing.assert_array_equal(indices, [1, 0, 3, 2])
    assert oracle.same_bits(values, x[[1, 0, 3, 2]])


def test_oracle_ranks_follow_the_total_order():
    # An independent check of the oracle itself: a hand-ordered list.
    for name in FLOAT_DTYPES:
        dtype = np_dtype(name)
        unsigned = {2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
        nan = np.array(np.nan, dtype).view(unsigned)
        neg_nan = (nan | unsigned(1) << unsigned(dtype.itemsize * 8 - 1)).view(dtype)
        ordered = np.array([neg_nan, -np.inf, -1.0, -0.0, 0.0, 1.0, np.inf, np.nan], dtype)
        r = oracle.rank(ordered)
        assert np.all(r[1:] > r[:-1]), name
    r = oracle.rank(np.array([-128, -1, 0, 1, 127], np.int8))
    assert np.all(r[1:] > r[:-1])


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_matches_oracle_and_lax(dtype, kind, rng):
    x = make_input(kind, (37, 301), dtype, rng)
    for k in (0, 1, 5, 64, 300, 301):
        assert_matches_oracle(x, k)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "float64", "uint8"])
@pytest.mark.parametrize(
    "shape,k",
    [((1, 1), 1), ((4, 1), 0), ((3, 7), 7), ((5, 2048), 16), ((2, 8192), 256), ((8, 4099), 1000),
     ((0, 10), 3), ((3, 0), 0)],
)
def test_edge_shapes(dtype, shape, k, rng):
    for kind in ("random", "ties", "special"):
        assert_matches_oracle(make_input(kind, shape, dtype, rng), k)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_long_rows(dtype, rng):
    # n = 2^20, one row (the kernel splits it across threads) and a few rows.
    for rows, k in ((1, 2048), (1, 16), (3, 100)):
        x = make_input("random", (rows, 1 << 20), dtype, rng)
        assert_matches_oracle(x, k)
    x = make_input("ties", (1, 1 << 20), dtype, rng)
    assert_matches_oracle(x, 4000, with_lax=False)


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_3d_and_other_axes(axis, rng):
    x = make_input("special", (6, 9, 11), "float32", rng)
    for k in (0, 1, 4, x.shape[axis]):
        assert_matches_oracle(x, k, axis)


def test_sorted_and_reversed_rows():
    # Adversarial for threshold filters: every element improves on the last.
    x = np.stack([np.arange(5000, dtype=np.float32), np.arange(5000, 0, -1).astype(np.float32)])
    for k in (1, 10, 2500):
        assert_matches_oracle(x, k)


_special_floats = st.sampled_from([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 2.0])


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    data=st.data(),
    dtype=st.sampled_from(["float32", "bfloat16", "float16", "float64", "int16", "uint32", "int8"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_hypothesis_shapes_and_values(shape, data, dtype, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    k = data.draw(st.integers(0, shape[axis]), label="k")
    # Hypothesis picks a small palette of (often special) values; numpy fills
    # the array from it, so ties and special values are dense at any size.
    if "float" in dtype:
        palette = data.draw(st.lists(st.one_of(_special_floats, st.floats(-3, 3, width=32)), min_size=1, max_size=8))
    else:
        info = np.iinfo(dtype)
        palette = data.draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=1, max_size=8))
    x = np.random.default_rng(seed).choice(np.array(palette).astype(np_dtype(dtype)), size=shape)
    assert_matches_oracle(x, k, axis)


def test_runs_the_native_kernel_for_kernel_dtypes():
    platform = jax_topk.info()["platforms"][TEST_MODULE]
    assert platform["native"], platform
    assert set(KERNEL_DTYPES) <= set(platform["dtypes"])
    target = platform["targets"]["top_k"]

    def lowered(dtype):
        x = jax.device_put(jnp.zeros((3, 8), np_dtype(dtype)), TEST_DEVICE)
        return jax.jit(lambda a: jax_topk.top_k(a, 2)).lower(x).as_text()

    for dtype in KERNEL_DTYPES:
        assert target in lowered(dtype), dtype
    assert target not in lowered("bool")  # a fallback dtype lowers without the custom call


def test_deterministic_across_calls(rng):
    x = make_input("ties", (64, 4096), "float32", rng)
    first = run_top_k(x, 300)
    for _ in range(3):
        again = run_top_k(x, 300)
        assert oracle.same_bits(first[0], again[0]) and np.array_equal(first[1], again[1])


# ---------------------------------------------------------------- transformations


def count_custom_calls(fn, *args) -> int:
    target = jax_topk.info()["platforms"][TEST_MODULE]["targets"]["top_k"]
    return jax.jit(fn).lower(*args).as_text().count(f"stablehlo.custom_call @{target}")


def loop_top_k(x, k, in_axis):
    """The same computation one row at a time in Python."""
    rows = [jax_topk.top_k(jnp.take(x, i, axis=in_axis), k) for i in range(x.shape[in_axis])]
    return np.stack([np.asarray(r[0]) for r in rows]), np.stack([np.asarray(r[1]) for r in rows])


@pytest.mark.parametrize("in_axis", [0, 1, 2])
def test_vmap_any_axis_is_one_call(in_axis, rng):
    x = jnp.asarray(make_input("ties", (5, 6, 40), "float32", rng))
    fn = jax.vmap(lambda r: jax_topk.top_k(r, 3), in_axes=in_axis)
    values, indices = fn(x)
    want_values, want_indices = loop_top_k(x, 3, in_axis)
    assert oracle.same_bits(values, want_values) and np.array_equal(indices, want_indices)
    assert count_custom_calls(fn, x) == 1


def test_nested_vmap_is_one_call(rng):
    # Outer vmap over axis 0, inner over axis 1 of what remains: per (a, c),
    # a (5, 30) block whose rows get top_k along the last axis.
    x = jnp.asarray(make_input("special", (4, 5, 6, 30), "float32", rng))
    fn = jax.vmap(jax.vmap(lambda block: jax_topk.top_k(block, 4), in_axes=1), in_axes=0)
    values, indices = fn(x)
    assert values.shape == (4, 6, 5, 4)
    for a in range(4):
        for c in range(6):
            v, i = oracle.top_k(np.asarray(x[a, :, c, :]), 4)
            assert oracle.same_bits(values[a, c], v) and np.array_equal(indices[a, c], i)
    assert count_custom_calls(fn, x) == 1


def test_vmap_of_axis_zero_top_k(rng):
    # Per-example top_k along axis 0, batched over the last axis of the input.
    x = jnp.asarray(make_input("random", (50, 7), "float32", rng))
    fn = jax.vmap(lambda col: jax_topk.top_k(col, 5), in_axes=1, out_axes=1)
    values, indices = fn(x)
    want_values, want_indices = oracle.top_k(np.asarray(x), 5, axis=0)
    assert oracle.same_bits(values, want_values) and np.array_equal(indices, want_indices)
    assert count_custom_calls(fn, x) == 1


def test_vmap_with_other_batched_operands(rng):
    # in_axes on different axes for two arguments that meet in one top_k.
    x = jnp.asarray(make_input("random", (8, 30), "float32", rng))
    y = jnp.asarray(make_input("random", (30, 8), "float32", rng))
    fn = jax.vmap(lambda a, b: jax_topk.top_k(a + b, 6), in_axes=(0, 1))
    values, indices = fn(x, y)
    want_values, want_indices = oracle.top_k(np.asarray(x + y.T), 6)
    assert oracle.same_bits(values, want_values) and np.array_equal(indices, want_indices)
    assert count_custom_calls(fn, x, y) == 1


def test_jit_matches_eager(rng):
    x = jnp.asarray(make_input("special", (9, 33), "float32", rng))
    eager = jax_topk.top_k(x, 5)
    jitted = jax.jit(jax_topk.top_k, static_argnums=1)(x, 5)
    assert oracle.same_bits(eager[0], jitted[0]) and np.array_equal(eager[1], jitted[1])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gradients(dtype, rng):
    # Distinct, well-separated values so finite differences never swap ranks.
    x = jnp.asarray(rng.permutation(60).reshape(3, 20).astype(dtype) / 60)
    check_grads(lambda a: jax_topk.top_k(a, 4)[0], (x,), order=2, modes=("fwd", "rev"))
    check_grads(lambda a: jax_topk.top_k(a, 3, axis=0)[0], (x,), order=2, modes=("fwd", "rev"))
    # The gradient of the sum of the top values is the indicator of the chosen elements.
    g = jax.grad(lambda a: jax_topk.top_k(a, 4)[0].sum())(x)
    _, idx = oracle.top_k(np.asarray(x), 4)
    want = np.zeros(x.shape, dtype)
    np.put_along_axis(want, idx, 1.0, axis=-1)
    np.testing.assert_array_equal(np.asarray(g), want)


def test_indices_have_float0_tangent():
    x = jnp.arange(10.0)
    _, (t_values, t_indices) = jax.jvp(lambda a: jax_topk.top_k(a, 3), (x,), (jnp.ones(10),))
    assert t_indices.dtype == jax.dtypes.float0
    np.testing.assert_array_equal(t_values, np.ones(3))


def test_vmap_of_grad(rng):
    x = jnp.asarray(rng.permutation(80).reshape(4, 20).astype(np.float32))
    g = jax.vmap(jax.grad(lambda r: jax_topk.top_k(r, 2)[0] @ jnp.array([1.0, 2.0])))(x)
    for row, grow in zip(np.asarray(x), np.asarray(g)):
        _, idx = oracle.top_k(row, 2)
        want = np.zeros_like(row)
        want[idx] = [1.0, 2.0]
        np.testing.assert_array_equal(grow, want)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "args,kwargs,error,message",
    [
        ((jnp.zeros((3, 5)), 6), {}, ValueError, r"k=6 must be in \[0, 5\] for x of shape \(3, 5\)"),
        ((jnp.zeros((3, 5)), -1), {}, ValueError, r"k=-1 must be in \[0, 5\]"),
        ((jnp.zeros((3, 5)), 2.0), {}, TypeError, r"k must be an int, got float"),
        ((jnp.zeros((3, 5)), True), {}, TypeError, r"k must be an int, got bool"),
        ((jnp.zeros((3, 5)), 2), {"axis": 2}, ValueError, r"axis=2 is out of range for x of shape \(3, 5\)"),
        ((jnp.zeros((3, 5)), 2), {"axis": -3}, ValueError, r"axis=-3 is out of range"),
        ((jnp.zeros((3, 5)), 2), {"axis": 0.5}, TypeError, r"axis must be an int"),
        (([1.0, 2.0, 3.0], 1), {}, TypeError, r"x must be a jax.Array or numpy.ndarray, got list"),
        (("abc", 1), {}, TypeError, r"x must be a jax.Array or numpy.ndarray, got str"),
        ((jnp.zeros(()), 0), {}, ValueError, r"x must have at least one dimension, got a scalar"),
        ((jnp.zeros((2, 3), jnp.complex64), 1), {}, TypeError, r"complex64, which has no total order"),
    ],
)
def test_errors(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        jax_topk.top_k(*args, **kwargs)


def test_traced_k_is_rejected():
    with pytest.raises(TypeError, match="k must be a static Python int, got a traced value"):
        jax.jit(jax_topk.top_k)(jnp.zeros(5), 2)
