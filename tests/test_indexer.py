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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("b,n", [(7, 7), (5, 40), (9, 4)])
def test_causal_shared_keys_equal_per_item_keys(rng, dtype, b, n):
    """Keys [N, D] shared by the batch score like the same keys given to every
    item; causal=True is lengths N - B + b + 1 (with lengths given too, the
    shorter). Bit for bit on the kernels; the float64 reference's ids where
    its scores are apart."""
    np_dtype = getattr(ml_dtypes, dtype) if dtype == "bfloat16" else np.float32
    h, d, k = 4, 12, min(n, 5)
    q, keys, w = make(rng, b, h, n, d, np_dtype)
    shared = keys[0]
    per_item = np.broadcast_to(shared, keys.shape)
    causal = n - b + 1 + np.arange(b)
    got = [np.asarray(r) for r in jax_topk.indexer_top_k(q, shared, w, k, causal=True)]
    want = [np.asarray(r) for r in jax_topk.indexer_top_k(q, per_item, w, k, lengths=causal)]
    assert got[0].tobytes() == want[0].tobytes() and np.array_equal(got[1], want[1])
    for row in range(b):  # never a key after the item's position
        assert np.all(got[1][row] < max(causal[row], 0)) and np.all(got[1][row, max(causal[row], 0):] == -1)
    capped = rng.integers(0, n + 1, size=b).astype(np.int32)
    got = [np.asarray(r) for r in jax_topk.indexer_top_k(q, shared, w, k, causal=True, lengths=capped)]
    want = [np.asarray(r) for r in jax_topk.indexer_top_k(q, per_item, w, k, lengths=np.minimum(capped, causal))]
    assert got[0].tobytes() == want[0].tobytes() and np.array_equal(got[1], want[1])
    plain = [np.asarray(r) for r in jax_topk.indexer_top_k(q, shared, w, k)]
    ref, tol = reference_scores(q, per_item, w)
    for row in range(b):
        order = np.argsort(-ref[row], kind="stable")
        r = ref[row, order]
        sep = np.abs(np.diff(r)) > 2 * np.maximum(tol[row, order][:-1], tol[row, order][1:])
        if k and (k == n or sep[k - 1]):
            assert set(plain[1][row].tolist()) == set(order[:k].tolist())


def test_shared_keys_under_vmap_and_grad(rng):
    """vmap over sequences (each with its own shared keys) and over queries
    only (the keys stay one array): one custom call, equal to a loop; the
    gradient reaches the shared keys."""
    v, b, h, n, d, k = 3, 6, 4, 16, 8, 4
    q = rng.standard_normal((v, b, h, d)).astype(np.float32)
    keys = rng.standard_normal((v, n, d)).astype(np.float32)
    w = rng.standard_normal((b, h)).astype(np.float32)
    fn = lambda q_, k_: jax_topk.indexer_top_k(q_, k_, w, k, causal=True)  # noqa: E731
    for in_axes, pick in (((0, 0), lambda i: (q[i], keys[i])), ((0, None), lambda i: (q[i], keys[0]))):
        args = (q, keys if in_axes[1] == 0 else keys[0])
        got = jax.jit(jax.vmap(fn, in_axes))(*args)
        for i in range(v):
            want = fn(*pick(i))
            np.testing.assert_array_equal(np.asarray(got[1][i]), np.asarray(want[1]))
            assert np.asarray(got[0][i]).tobytes() == np.asarray(want[0]).tobytes()
        if HAS_KERNEL:
            assert indexer_custom_calls(jax.vmap(fn, in_axes), *args) == 1
    g = jax.grad(lambda k_: jax_topk.indexer_top_k(q[0], k_, w, k, causal=True)[0].clip(-1e30).sum())(keys[0])
    assert np.abs(np.asarray(g)).sum() > 0


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
    (dict(fusion="always"), "fusion='always'"),
    (dict(causal=True), "causal=True needs keys shared"),
    (dict(keys=np.zeros((10, 5), np.float32)), "keys"),
    (dict(causal=1, keys=np.zeros((10, 4), np.float32)), "causal must be a bool"),
])
def test_bad_input_names_the_argument(bad, message):
    args = dict(q=np.zeros((2, 3, 4), np.float32), keys=np.zeros((2, 10, 4), np.float32),
                weights=np.zeros((2, 3), np.float32), k=2, lengths=None, causal=False, fusion="auto")
    args.update(bad)
    with pytest.raises((ValueError, TypeError), match=message):
        jax_topk.indexer_top_k(args["q"], args["keys"], args["weights"], args["k"], lengths=args["lengths"],
                               causal=args["causal"], fusion=args["fusion"])


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
    # batch-invariant on the GPU: each row alone, at its own length, and
    # re-padded to a larger N (garbage past its length) beside other rows
    for row in range(b):
        m = min(k, int(lengths[row]))
        alone = jax.jit(lambda *a: jax_topk.indexer_top_k(*a, m))(
            *(jax.device_put(a, _gpu()) for a in (q[row:row + 1], keys[row:row + 1, :lengths[row]], w[row:row + 1])))
        assert np.asarray(alone[0])[0].tobytes() == gs[row, :m].tobytes()
        assert np.array_equal(np.asarray(alone[1])[0], gi[row, :m])
    big = rng.standard_normal((b, 2 * n + 64, d)).astype(np_dtype)
    big[:, :n] = keys[::-1]
    padded = jax.jit(lambda *a: jax_topk.indexer_top_k(*a[:3], k, lengths=a[3]))(
        *(jax.device_put(a, _gpu()) for a in (q[::-1], big, w[::-1], lengths[::-1].copy())))
    assert np.asarray(padded[0])[::-1].tobytes() == gs.tobytes()
    assert np.array_equal(np.asarray(padded[1])[::-1], gi)


def _gpu_plan(dtype, b, h, n, d, k, fusion):
    from jax_topk import _registry
    return _registry.indexer_plan("cuda", dtype, b, h, n, d, k, fusion)


def _patterned(rng, pattern, b, h, n, d, dtype):
    """Inputs whose scores are random, all equal (q = 0: every score +0.0),
    ascending with the key index in plateaus of ties (every step of a chunk
    raises the fused kernel's threshold), or with non-finite weights
    (scores +-inf and NaN)."""
    q, keys, w = make(rng, b, h, n, d, dtype)
    if pattern == "ties":
        q[:] = 0
    elif pattern == "ascending":
        q[:] = 1
        keys[:] = (np.arange(n, dtype=np.float32) / n)[None, :, None].astype(dtype)
        w[:] = np.abs(w)
    elif pattern == "special":
        w[:, 0], w[1 % b, 1 % h] = np.inf, np.nan
        w[2 % b, :] = -np.inf
    return q, keys, w


@pytest.mark.skipif(_gpu() is None, reason="no GPU")
@pytest.mark.parametrize("pattern", ["random", "ties", "ascending", "special"])
@pytest.mark.parametrize("dtype,h,d,k,outgrown", [
    ("bfloat16", 32, 128, 128, True), ("bfloat16", 64, 128, 512, True), ("bfloat16", 128, 64, 128, False),
    ("bfloat16", 64, 64, 17, False), ("float32", 5, 7, 100, True), ("bfloat16", 80, 96, 80, True)])
def test_gpu_fused_equals_unfused(rng, pattern, dtype, h, d, k, outgrown):
    """The fused kernels (each block keeps its chunk's k best) give the
    unfused path's bits: lengths of 0, below k, at and around chunk ends, and
    rows whose chunks outgrow the block's buffer (it keeps its k best on the
    way), on random, tied, ascending and non-finite scores."""
    np_dtype = getattr(ml_dtypes, dtype) if dtype == "bfloat16" else np.float32
    b, n = 6, 48 * k + 1000
    plan = _gpu_plan(dtype, b, h, n, d, k, "fused")
    assert plan["fused"], plan
    chunk = plan["chunk_keys"]
    assert (chunk > plan["capacity"]) == outgrown, plan  # outgrown: blocks keep their k best on the way
    q, keys, w = _patterned(rng, pattern, b, h, n, d, np_dtype)
    lengths = np.array([n, 0, k - 1, chunk, 2 * chunk + 1, n - 3], np.int32)
    gpu = _gpu()
    args = [jax.device_put(a, gpu) for a in (q, keys, w, lengths)]
    out = {}
    for fusion in ("fused", "unfused"):
        run = jax.jit(lambda *a, f=fusion: jax_topk.indexer_top_k(*a[:3], k, lengths=a[3], fusion=f))
        out[fusion] = [np.asarray(r) for r in run(*args)]
    (fs, fi), (us, ui) = out["fused"], out["unfused"]
    assert fs.tobytes() == us.tobytes()
    np.testing.assert_array_equal(fi, ui)
    for row in range(b):
        m = min(k, int(lengths[row]))
        assert np.all(fi[row, m:] == -1) and len(set(fi[row, :m].tolist())) == m
        assert np.all((fi[row, :m] >= 0) & (fi[row, :m] < lengths[row]))
    if pattern == "ties":  # every score equal: the lowest indices, in order
        for row in range(b):
            m = min(k, int(lengths[row]))
            np.testing.assert_array_equal(fi[row, :m], np.arange(m))


@pytest.mark.skipif(_gpu() is None, reason="no GPU")
def test_gpu_auto_fuses_when_k_is_small_and_the_scores_large():
    """fusion="auto" fuses where the fused kernels take the shape, N >= r k
    and the [B, N] float32 scores would take at least the module's bytes
    (the rule of indexer.h); "fused" wherever the kernels take the shape
    (not 16 heads, nor k past their largest)."""
    rule = jax_topk.info()["platforms"]["cuda"]["build"]["indexer_auto_fusion"]
    ratio, min_bytes = rule["min_n_over_k"], rule["min_scores_bytes"]
    h, d, k = 64, 128, 64
    n = ratio * k
    b = -(-min_bytes // (4 * n))  # the fewest rows whose scores reach the bytes
    assert _gpu_plan("bfloat16", b, h, n, d, k, "auto")["fused"]
    assert not _gpu_plan("bfloat16", b - 1, h, n, d, k, "auto")["fused"]
    assert not _gpu_plan("bfloat16", 2 * b, h, n - 1, d, k, "auto")["fused"]
    assert _gpu_plan("bfloat16", 1, h, n, d, k, "fused")["fused"]
    assert not _gpu_plan("bfloat16", 1, 16, n, d, k, "fused")["fused"]
    max_k = _gpu_plan("bfloat16", 1, h, n, d, k, "fused")["fused_max_k"]
    assert not _gpu_plan("bfloat16", 1, h, n, d, max_k + 1, "fused")["fused"]
    assert not _gpu_plan("bfloat16", b, h, n, d, k, "unfused")["fused"]


@pytest.mark.skipif(_gpu() is None, reason="no GPU")
@pytest.mark.parametrize("fusion", ["unfused", "fused"])
@pytest.mark.parametrize("dtype,h,d", [("bfloat16", 64, 128), ("float32", 6, 20)])
def test_gpu_causal_prefill_equals_per_item_keys(rng, fusion, dtype, h, d):
    """Prefill of a chunk of queries after a cached prefix (B < N), keys read
    from one shared array: bit for bit the per-item call on the same keys with
    the causal lengths (tensor cores: batch invariance), and the CPU's where
    the GPU takes the exact order."""
    np_dtype = getattr(ml_dtypes, dtype) if dtype == "bfloat16" else np.float32
    b, n, k = 300, 4000, 64
    q, _, w = make(rng, b, h, 1, d, np_dtype)
    keys = rng.standard_normal((n, d)).astype(np_dtype)
    gpu = _gpu()
    run = jax.jit(lambda q_, k_, w_: jax_topk.indexer_top_k(q_, k_, w_, k, causal=True, fusion=fusion))
    got = [np.asarray(r) for r in run(*(jax.device_put(a, gpu) for a in (q, keys, w)))]
    causal = (n - b + 1 + np.arange(b)).astype(np.int32)
    per_item = jax.jit(lambda q_, k_, w_, l_: jax_topk.indexer_top_k(
        q_, jnp.broadcast_to(k_, (b, n, d)), w_, k, lengths=l_, fusion="unfused"))
    want = [np.asarray(r) for r in per_item(*(jax.device_put(a, gpu) for a in (q, keys, w, causal)))]
    assert got[0].tobytes() == want[0].tobytes() and np.array_equal(got[1], want[1])
    assert np.all(got[1] < causal[:, None])
    if dtype == "float32":
        cpu = [np.asarray(r) for r in run(*(jax.device_put(a, jax.devices("cpu")[0]) for a in (q, keys, w)))]
        assert got[0].tobytes() == cpu[0].tobytes() and np.array_equal(got[1], cpu[1])
