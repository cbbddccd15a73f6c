"""indexer_top_k: scores against a float64 NumPy reference, batch invariance
bit for bit, vmap/jit with one custom call, gradients, and bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.test_util import check_grads

import jax_topk
from conftest import TEST_MODULE

HAS_KERNEL = "indexer" in jax_topk.info()["platforms"][TEST_MODULE].get("targets", {})
needs_kernel = pytest.mark.skipif(not HAS_KERNEL, reason=f"no indexer kernel on {TEST_MODULE} (composition)")


def make(rng, b, h, n, d, dtype=np.float32):
    q = rng.standard_normal((b, h, d)).astype(dtype)
    keys = rng.standard_normal((b, n, d)).astype(dtype)
    w = rng.standard_normal((b, h)).astype(np.float32)
    return q, keys, w


def reference_scores(q, keys, w) -> np.ndarray:
    """float64 scores [B, N] and, per score, the float32 error bound of its
    evaluation (a few ulps of the sum of the terms' magnitudes)."""
    q, keys, w = (np.asarray(a, np.float64) for a in (q, keys, w))
    dots = np.einsum("bhd,bnd->bhn", q, keys)
    scores = np.einsum("bh,bhn->bn", w, np.maximum(dots, 0))
    dot_mag = np.einsum("bhd,bnd->bhn", np.abs(q), np.abs(keys))
    mag = np.einsum("bh,bhn->bn", np.abs(w), dot_mag)
    return scores, 4 * (q.shape[1] + q.shape[2]) * np.finfo(np.float32).eps * mag + 1e-30


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("b,h,n,d,k", [(3, 4, 50, 20, 7), (2, 8, 300, 16, 64), (1, 2, 9, 3, 9), (4, 3, 40, 8, 0)])
def test_matches_float64_reference(rng, dtype, b, h, n, d, k):
    q, keys, w = make(rng, b, h, n, d, getattr(ml_dtypes, dtype) if dtype == "bfloat16" else np.float32)
    lengths = rng.integers(0, n + 1, size=b).astype(np.int32)
    lengths[0] = n
    scores, ids = map(np.asarray, jax_topk.indexer_top_k(q, keys, w, k, lengths=lengths))
    assert scores.shape == ids.shape == (b, k) and scores.dtype == np.float32 and ids.dtype == np.int32
    ref, tol = reference_scores(q, keys, w)
    for row in range(b):
        m = min(k, int(lengths[row]))
        assert np.all(ids[row, m:] == -1) and np.all(scores[row, m:] == -np.inf)
        got = ids[row, :m]
        assert len(set(got.tolist())) == m and np.all((got >= 0) & (got < lengths[row]))
        np.testing.assert_array_less(np.abs(scores[row, :m] - ref[row, got]), tol[row, got])
        # ids equal the reference's wherever its k-th and (k+1)-th scores are apart
        order = np.argsort(-ref[row, : lengths[row]], kind="stable")
        r = ref[row, order]
        sep = np.abs(np.diff(r)) > 2 * np.maximum(tol[row, order][:-1], tol[row, order][1:])
        if m and (m == lengths[row] or sep[m - 1]):
            assert set(got.tolist()) == set(order[:m].tolist())
        assert np.all(np.diff(scores[row, :m]) <= 0)


@needs_kernel
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batch_invariance_bit_for_bit(rng, dtype):
    """A row's result is the same in a batch, alone, and padded to a larger N."""
    np_dtype = getattr(ml_dtypes, dtype) if dtype == "bfloat16" else np.float32
    b, h, n, d, k = 5, 6, 240, 24, 16
    q, keys, w = make(rng, b, h, n, d, np_dtype)
    lengths = np.array([240, 17, 100, 0, 233], np.int32)
    scores, ids = map(np.asarray, jax_topk.indexer_top_k(q, keys, w, k, lengths=lengths))
    for row in range(b):
        length = int(lengths[row])
        kk = min(k, length)
        alone = jax_topk.indexer_top_k(q[row:row + 1], keys[row:row + 1, :length], w[row:row + 1], kk)
        np.testing.assert_array_equal(np.asarray(alone[1])[0], ids[row, :kk])
        assert np.asarray(alone[0])[0].tobytes() == scores[row, :kk].tobytes()
        # padded to a larger N with garbage past the length, in a batch of 3
        big = rng.standard_normal((3, 2 * n + 7, d)).astype(np_dtype)
        big[1, :length] = keys[row, :length]
        padded = jax_topk.indexer_top_k(
            np.stack([q[row]] * 3), big, np.stack([w[row]] * 3), k, lengths=np.array([2 * n, length, n], np.int32))
        np.testing.assert_array_equal(np.asarray(padded[1])[1], ids[row])
        assert np.asarray(padded[0])[1].tobytes() == scores[row].tobytes()


def indexer_custom_calls(fn, *args) -> int:
    return jax.jit(fn).lower(*args).as_text().count("custom_call @jax_topk_indexer")


def test_vmap_and_jit_equal_a_loop(rng):
    v, b, h, n, d, k = 3, 2, 4, 64, 8, 5
    q = rng.standard_normal((v, b, h, d)).astype(np.float32)
    keys = rng.standard_normal((v, b, n, d)).astype(np.float32)
    w = rng.standard_normal((b, h)).astype(np.float32)  # shared by the vmapped instances
    lengths = rng.integers(0, n + 1, size=(v, b)).astype(np.int32)
    fn = lambda q_, k_, w_, l_: jax_topk.indexer_top_k(q_, k_, w_, k, lengths=l_)  # noqa: E731
    got = jax.jit(jax.vmap(fn, (0, 0, None, 0)))(q, keys, w, lengths)
    for i in range(v):
        want = fn(q[i], keys[i], w, lengths[i])
        np.testing.assert_array_equal(np.asarray(got[1][i]), np.asarray(want[1]))
        np.testing.assert_array_equal(np.asarray(got[0][i]), np.asarray(want[0]))
    if HAS_KERNEL:
        assert indexer_custom_calls(jax.vmap(fn, (0, 0, None, 0)), q, keys, w, lengths) == 1


def test_gradients(rng):
    b, h, n, d, k = 2, 3, 20, 6, 4
    q, keys, w = make(rng, b, h, n, d, np.float64)
    q, keys = q.astype(np.float32), keys.astype(np.float32)

    def f(q_, keys_, w_):
        return jax_topk.indexer_top_k(q_, keys_, w_, k)[0]

    check_grads(f, (q, keys, w), order=1, modes=("fwd", "rev"), atol=2e-2, rtol=2e-2, eps=1e-3)
    # the tangent is the chosen keys' score tangent: compare with the float64 formula
    t = tuple(rng.standard_normal(a.shape).astype(np.float32) for a in (q, keys, w))
    (scores, ids), (t_scores, _) = jax.jvp(lambda *a: jax_topk.indexer_top_k(*a, k), (q, keys, w), t)
    ids = np.asarray(ids)
    picked = np.take_along_axis(keys.astype(np.float64), ids[..., None], axis=1)
    t_picked = np.take_along_axis(t[1].astype(np.float64), ids[..., None], axis=1)
    dots = np.einsum("bhd,bkd->bhk", q.astype(np.float64), picked)
    t_dots = np.einsum("bhd,bkd->bhk", t[0], picked) + np.einsum("bhd,bkd->bhk", q, t_picked)
    want = np.einsum("bh,bhk->bk", t[2], np.maximum(dots, 0)) + np.einsum("bh,bhk->bk", w, (dots > 0) * t_dots)
    np.testing.assert_allclose(np.asarray(t_scores), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad,message", [
    (dict(q=np.zeros((2, 3))), "must be \\[B, H, D\\]"),
    (dict(keys=np.zeros((3, 10, 4), np.float32)), "keys"),
    (dict(keys=np.zeros((2, 10, 5), np.float32)), "keys"),
    (dict(weights=np.zeros((2, 4), np.float32)), "weights must have shape"),
    (dict(k=11), "k=11"),
    (dict(keys=np.zeros((2, 10, 4), np.float64)), "one dtype"),
    (dict(q=np.zeros((2, 3, 4), np.int32), keys=np.zeros((2, 10, 4), np.int32)), "floating"),
    (dict(lengths=np.zeros((3,), np.int32)), "lengths"),
])
def test_bad_input_names_the_argument(bad, message):
    args = dict(q=np.zeros((2, 3, 4), np.float32), keys=np.zeros((2, 10, 4), np.float32),
                weights=np.zeros((2, 3), np.float32), k=2, lengths=None)
    args.update(bad)
    with pytest.raises((ValueError, TypeError), match=message):
        jax_topk.indexer_top_k(args["q"], args["keys"], args["weights"], args["k"], lengths=args["lengths"])


def _gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


@pytest.mark.skipif(_gpu() is None, reason="no GPU")
@pytest.mark.parametrize("dtype,h,d", [("float32", 64, 128), ("float32", 5, 7), ("bfloat16", 6, 20),
                                       ("bfloat16", 80, 144), ("bfloat16", 80, 96), ("bfloat16", 80, 64),
                                       ("bfloat16", 64, 128), ("bfloat16", 144, 64), ("bfloat16", 32, 32),
                                       ("bfloat16", 16, 16)])
def test_gpu_against_cpu(rng, dtype, h, d):
    """GPU == CPU bit for bit where the GPU takes the exact order of
    indexer.h (float32, or shapes without 16x16 tiles); within float32
    rounding where bfloat16 takes tensor cores, and batch-invariant there."""
    np_dtype = getattr(ml_dtypes, dtype) if dtype == "bfloat16" else np.float32
    b, n, k = 4, 3000, 100
    q, keys, w = make(rng, b, h, n, d, np_dtype)
    lengths = np.array([3000, 1, 2047, 100], np.int32)
    run = jax.jit(lambda *a: jax_topk.indexer_top_k(*a[:3], k, lengths=a[3]))
    on = {dev: [np.asarray(r) for r in run(*(jax.device_put(a, dev) for a in (q, keys, w, lengths)))]
          for dev in (jax.devices("cpu")[0], _gpu())}
    (cs, ci), (gs, gi) = on.values()
    tensor_cores = dtype == "bfloat16" and h % 16 == 0 and h <= 128 and d in (16, 32, 64, 128)
    if not tensor_cores:
        assert gs.tobytes() == cs.tobytes() and np.array_equal(gi, ci)
        return
    ref, tol = reference_scores(q, keys, w)
    for row in range(b):
        m = min(k, int(lengths[row]))
        assert np.all(gi[row, m:] == -1)
        np.testing.assert_array_less(np.abs(gs[row, :m] - ref[row, gi[row, :m]]), tol[row, gi[row, :m]])
    # batch-invariant on the GPU: each row alone, at its own length
    for row in range(b):
        m = min(k, int(lengths[row]))
        alone = jax.jit(lambda *a: jax_topk.indexer_top_k(*a, m))(
            *(jax.device_put(a, _gpu()) for a in (q[row:row + 1], keys[row:row + 1, :lengths[row]], w[row:row + 1])))
        assert np.asarray(alone[0])[0].tobytes() == gs[row, :m].tobytes()
        assert np.array_equal(np.asarray(alone[1])[0], gi[row, :m])
