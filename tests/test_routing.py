"""jax_topk.routing against a float64 numpy reference written from the formulas
(DESIGN section 5), presets, gradients, a toy MoE layer, and errors."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from scipy.special import expit

import jax_topk
from jax_topk import _route, routing


def np_scores(z: np.ndarray, score: str) -> np.ndarray:
    z = z.astype(np.float64)
    if score == "softmax":
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    if score == "sigmoid":
        return expit(z)  # stable for large |z|
    return np.sqrt(np.maximum(z, 0.0) + np.log1p(np.exp(-np.abs(z))))


def np_best_first(v: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries, ties to the lower index, NaN largest."""
    v = np.where(np.isnan(v), np.inf, v)
    order = np.lexsort((np.arange(v.size), -v, ~np.isnan(v)))  # NaN first, then descending
    return order[:k]


def np_route(z, k, score="softmax", bias=None, n_groups=None, top_groups=None, renormalize=False, scale=1.0,
             return_keys=False):
    """DESIGN section 5 with the documented selection rule: with a bias or
    groups, rank the float32 c = float32(score) + bias; otherwise rank the
    logits (every score is increasing in the logit), all NaN for a softmax
    whose normaliser is NaN. With return_keys, also the ranked keys (-inf for
    the experts of dropped groups)."""
    s = np_scores(z, score)
    selects_by_score = bias is not None or n_groups is not None
    if selects_by_score:
        c = s.astype(np.float32)
        if bias is not None:
            c = c + bias.astype(np.float32)
    else:
        c = z.astype(np.float32).copy()
        if score == "softmax":
            c[~np.isfinite(z.max(-1))] = np.nan
    weights, ids, keys = [], [], []
    for s_t, c_t in zip(s.reshape(-1, s.shape[-1]), c.reshape(-1, c.shape[-1])):
        c_t = c_t.astype(np.float64)
        if n_groups is not None:
            groups = c_t.reshape(n_groups, -1)
            group_scores = np.array([g[np_best_first(g, 2)].astype(np.float32).sum(dtype=np.float32)
                                     for g in groups])
            kept = np_best_first(group_scores, top_groups)
            mask = np.zeros(n_groups, bool)
            mask[kept] = True
            c_t[~np.repeat(mask, groups.shape[1])] = -np.inf
        chosen = np_best_first(c_t, k)
        w = s_t[chosen]
        if renormalize:
            w = w / w.sum()
        weights.append(w * scale)
        ids.append(chosen)
        keys.append(c_t)
    shape = z.shape[:-1] + (k,)
    out = np.array(weights).reshape(shape), np.array(ids).reshape(shape)
    return out + (np.array(keys).reshape(z.shape),) if return_keys else out


def assert_same_choice(weights, ids, want_weights, want_ids, keys, ulps=4):
    """ids equal to the reference's, except at near-ties: where the two
    experts' float32 selection keys are within `ulps` ulps, a rounding of the
    score arithmetic may order them either way. Weights match where ids do."""
    ids, want_ids = np.asarray(ids), np.asarray(want_ids)
    got_keys = np.take_along_axis(keys, ids, axis=-1)
    want_keys = np.take_along_axis(keys, want_ids, axis=-1)
    tol = ulps * np.spacing(np.abs(want_keys).astype(np.float32)).astype(np.float64)
    same = ids == want_ids
    near_tie = np.abs(got_keys - want_keys) <= tol
    assert np.all(same | near_tie), f"ids differ beyond near-ties at {np.argwhere(~(same | near_tie))[:5].tolist()}"
    assert same.mean() > 0.99, "near-ties should be rare"
    np.testing.assert_allclose(np.asarray(weights)[same], want_weights[same], rtol=1e-6, atol=1e-7)


CONFIGS = [
    dict(score=score, bias=bias, groups=groups, renormalize=renormalize, scale=scale)
    for score, bias, groups, renormalize, scale in itertools.product(
        ["softmax", "sigmoid", "sqrt_softplus"], [False, True], [None, (8, 4)], [False, True], [1.0, 2.5])
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_matches_reference(config, dtype, rng):
    experts, k = 64, 6
    z = jnp.asarray(rng.standard_normal((3, 5, experts)) * 2).astype(dtype)
    bias = rng.standard_normal(experts).astype(np.float32) * 0.1 if config["bias"] else None
    n_groups, top_groups = config["groups"] or (None, None)
    kwargs = dict(score=config["score"], n_groups=n_groups, top_groups=top_groups,
                  renormalize=config["renormalize"], scale=config["scale"])
    w, ids = jax.jit(lambda z: routing.route(z, k, bias=bias, **kwargs))(z)
    want_w, want_ids = np_route(np.asarray(z.astype(jnp.float32)), k, bias=bias, **kwargs)
    assert w.dtype == jnp.float32 and ids.dtype == jnp.int32 and w.shape == (3, 5, k)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(w, want_w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("experts,k", [(2, 1), (2, 2), (7, 7), (8, 2), (9, 9), (16, 5), (17, 1), (31, 3), (32, 32),
                                       (33, 8), (100, 7), (384, 6), (512, 32)])
def test_any_expert_count(experts, k, rng):
    # Rows of up to 32 experts are selected in place on the CPU (widths 8, 16, 32), longer ones by
    # the top-k kernel: each kind of route on either side of those widths.
    z = jnp.asarray(rng.standard_normal((7, experts)).astype(np.float32))
    bias = rng.standard_normal(experts).astype(np.float32) * 0.1
    for kwargs in (dict(score="sigmoid", renormalize=True), dict(score="softmax", renormalize=True),
                   dict(score="softmax", renormalize=False), dict(score="sqrt_softplus", bias=bias)):
        w, ids = routing.route(z, k, **kwargs)
        want_w, want_ids = np_route(np.asarray(z), k, **kwargs)
        np.testing.assert_array_equal(ids, want_ids, err_msg=str(kwargs))
        np.testing.assert_allclose(w, want_w, rtol=1e-6, err_msg=str(kwargs))


def test_ties_go_to_the_lower_expert():
    z = jnp.zeros((2, 16))
    _, ids = routing.route(z, 4)
    np.testing.assert_array_equal(ids, [[0, 1, 2, 3]] * 2)
    z = jnp.array([[1.0, 3.0, 3.0, 0.0, 3.0]])
    _, ids = routing.route(z, 2, score="sigmoid")
    np.testing.assert_array_equal(ids, [[1, 2]])


def test_equal_group_scores_keep_the_lower_group():
    z = jnp.zeros((1, 8))  # 4 groups of 2, all equal: groups 0 and 1 are kept
    _, ids = routing.route(z, 4, score="sigmoid", n_groups=4, top_groups=2)
    np.testing.assert_array_equal(ids, [[0, 1, 2, 3]])


def test_large_magnitude_logits_stay_finite(rng):
    z = jnp.asarray((rng.standard_normal((4, 32)) * 1e4).astype(np.float32))
    for score in ("softmax", "sigmoid", "sqrt_softplus"):
        w, ids = routing.route(z, 4, score=score, renormalize=True)
        assert np.all(np.isfinite(w)), score
        np.testing.assert_array_equal(ids, np_route(np.asarray(z), 4, score=score, renormalize=True)[1])


@pytest.mark.parametrize("score,base", [("sigmoid", -88.0), ("sqrt_softplus", -100.0)])
@pytest.mark.parametrize("groups", [None, (4, 2)])
def test_subnormal_scores_keep_their_order(score, base, groups):
    # Scores below 2^-126 (sigmoid(-88) ~ 6e-39; sqrt(softplus(-100)) is the root of the
    # subnormal exp(-100)): XLA runs CPU kernels with subnormals flushed to zero, which would
    # tie every expert here at 0 and choose the lowest indices. The kernels compute with IEEE
    # subnormals on every platform, so the larger logits win, as in numpy.
    experts, k = 64, 3
    z = np.full((2, experts), base, np.float32)
    z[:, [14, 9, 3]] = np.float32(base) + np.float32([1.0, 0.5, 0.25])  # one group of (4, 2)
    bias = np.zeros(experts, np.float32)  # the selection reads the scores
    n_groups, top_groups = groups or (None, None)
    kwargs = dict(score=score, bias=bias, n_groups=n_groups, top_groups=top_groups, renormalize=False)
    w, ids = jax.jit(lambda z: routing.route(z, k, **kwargs))(jnp.asarray(z))
    want_w, want_ids = np_route(z, k, **kwargs)
    np.testing.assert_array_equal(ids, [[14, 9, 3]] * 2)
    np.testing.assert_array_equal(ids, want_ids)
    assert np.all(np.asarray(w) > 0)
    np.testing.assert_allclose(w, want_w, rtol=1e-2)  # subnormal weights carry few significant bits


def test_nan_logits_rank_first_and_propagate():
    # Documented: NaN scores rank by the total order (+NaN first), and the
    # weights carry the NaN (renormalising spreads it over the row).
    z = jnp.array([[0.0, jnp.nan, 1.0, -1.0]])
    w, ids = routing.route(z, 2, score="sigmoid")
    np.testing.assert_array_equal(ids, [[1, 2]])
    assert np.isnan(w[0, 0]) and np.isfinite(w[0, 1])
    w, _ = routing.route(z, 2, score="sigmoid", renormalize=True)
    assert np.all(np.isnan(w))


def _exact_sum(words: np.ndarray) -> Fraction:
    """A partial normaliser's uint32 words (routing.h, ExactSum: an integer
    count of 2^-149, least significant word first) as an exact number."""
    n = sum(int(w) << (32 * i) for i, w in enumerate(words))
    assert n >> 191 == 0, "NaN flag set"
    return Fraction(n, 2**149)


def test_softmax_normaliser_is_the_exactly_rounded_sum(rng):
    # The softmax normaliser is the sum of the row's terms exp(z - max) rounded
    # once to double (the order-free sum an expert-sharded route rebuilds from
    # partial sums). Each term alone, as a one-expert partial sum, is a float32;
    # the row's partial sum is exactly their sum; and the weights (k = every
    # expert, not renormalised) are float32(term) / float32(math.fsum(terms)),
    # fsum being the correctly rounded sum. Rows spread so that terms underflow
    # to subnormals and 0.
    tokens, experts = 12, 32
    spread = np.array([0.5, 3.0, 12.0, 30.0] * 3, np.float32)[:, None]
    z = (rng.standard_normal((tokens, experts)).astype(np.float32) * spread).astype(np.float32)
    shift = z.max(-1)
    partial = jax.jit(lambda a, m: _route.softmax_partial_p.bind(a, m))
    whole = np.asarray(partial(z, shift))
    alone = np.asarray(partial(z[..., None], np.broadcast_to(shift[:, None], z.shape)))
    route_all = jax.jit(lambda a: routing.route(a, experts, renormalize=False))
    weights, ids = map(np.asarray, route_all(z))
    perm = rng.permutation(experts)
    weights_p, ids_p = map(np.asarray, route_all(z[:, perm]))
    for t in range(tokens):
        terms = [_exact_sum(alone[t, i]) for i in range(experts)]
        assert all(Fraction(float(np.float32(float(e)))) == e for e in terms), t  # each a float32
        assert _exact_sum(whole[t]) == sum(terms), t
        denominator = np.float32(math.fsum(float(e) for e in terms))
        want = np.array([np.float32(float(terms[i])) / denominator for i in ids[t]], np.float32)
        np.testing.assert_array_equal(weights[t].view(np.uint32), want.view(np.uint32), err_msg=f"row {t}")
        # The experts' order changes no bit.
        np.testing.assert_array_equal(perm[ids_p[t]], ids[t])
        np.testing.assert_array_equal(weights_p[t].view(np.uint32), weights[t].view(np.uint32))


def test_presets_are_their_documented_routes(rng):
    for name, preset in routing.PRESETS.items():
        experts = 256 if preset.n_groups else 64
        z = jnp.asarray(rng.standard_normal((5, experts)).astype(np.float32))
        bias = jnp.asarray(rng.standard_normal(experts).astype(np.float32) * 0.1) if preset.uses_bias else None
        w, ids = preset(z, bias)
        want_w, want_ids = np_route(np.asarray(z), preset.k, score=preset.score,
                                    bias=None if bias is None else np.asarray(bias),
                                    n_groups=preset.n_groups, top_groups=preset.top_groups,
                                    renormalize=preset.renormalize, scale=preset.scale)
        np.testing.assert_array_equal(ids, want_ids, err_msg=name)
        np.testing.assert_allclose(w, want_w, rtol=1e-6, err_msg=name)
        assert preset.source, name
    with pytest.raises(ValueError, match="selects with a bias"):
        routing.PRESETS["deepseek_v3"](jnp.zeros((1, 256)))


# Routes every kind of CPU route (scores, bias, groups, renormalisation,
# short and long rows, special logits) and saves weights and ids to argv[1];
# prints the route ISA it ran on. Run once per JAX_TOPK_ROUTE_ISA.
_ROUTE_ISA_SCRIPT = """
import itertools
import sys
import numpy as np
import jax
import jax_topk
from jax_topk import routing

rng = np.random.default_rng(11)
out = {}
for experts, k, groups in [(8, 2, None), (20, 3, None), (64, 6, (8, 4)), (100, 7, None), (384, 6, None)]:
    z = (rng.standard_normal((40, experts)) * 3).astype(np.float32)
    z[0, 3] = np.nan
    z[1, :] = -np.inf
    z[2, 5] = np.inf
    z[3, :] = 0.0
    z[4, :] = -100.0 + rng.random(experts).astype(np.float32)  # subnormal sigmoid / sqrt(softplus) scores
    z[5, :] *= 1e4
    bias = (rng.standard_normal(experts) * 0.1).astype(np.float32)
    for score, with_bias, grouped, renormalize in itertools.product(
            ["softmax", "sigmoid", "sqrt_softplus"], [False, True], [False, True], [False, True]):
        if grouped and groups is None:
            continue
        n_groups, top_groups = groups if grouped else (None, None)
        for dtype in ["float32", "bfloat16"]:
            w, ids = routing.route(jax.numpy.asarray(z).astype(dtype), k, score=score,
                                   bias=bias if with_bias else None, n_groups=n_groups,
                                   top_groups=top_groups, renormalize=renormalize, scale=1.5)
            name = f"{experts}-{score}-{with_bias}-{grouped}-{renormalize}-{dtype}"
            out[name + "-w"] = np.asarray(w).view(np.uint32)
            out[name + "-ids"] = np.asarray(ids)
np.savez(sys.argv[1], **out)
print(jax_topk.info()["platforms"]["cpu"]["build"]["route_isa"])
"""


def test_cpu_route_isas_give_the_same_bits(tmp_path):
    # The CPU route's scoring loops are built for the baseline ISA, AVX2 and
    # AVX-512 and the widest the CPU has runs; all must give the same bits.
    results = {}
    for cap in ("baseline", "avx2", "avx512"):
        env = dict(os.environ, JAX_TOPK_ROUTE_ISA=cap, JAX_PLATFORMS="cpu")
        path = tmp_path / f"{cap}.npz"
        proc = subprocess.run([sys.executable, "-c", _ROUTE_ISA_SCRIPT, str(path)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ran = proc.stdout.strip().splitlines()[-1]
        assert ran in ("baseline", "avx2", "avx512")
        results.setdefault(ran, dict(np.load(path)))
    if len(results) < 2:
        pytest.skip(f"this CPU runs one route ISA ({', '.join(results)})")
    (first, want), *others = results.items()
    for isa, got in others:
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{isa} vs {first}: {name}")


def test_gradients_flow_to_logits_not_bias(rng):
    z = jnp.asarray(rng.standard_normal((3, 16)))
    bias = jnp.asarray(rng.standard_normal(16) * 0.1)
    for score in ("softmax", "sigmoid", "sqrt_softplus"):
        check_grads(lambda z: routing.route(z, 4, score=score, bias=bias, renormalize=True)[0], (z,), order=1,
                    modes=("fwd", "rev"))
    g_bias = jax.grad(lambda b: routing.route(z, 4, score="sigmoid", bias=b)[0].sum())(bias)
    np.testing.assert_array_equal(g_bias, np.zeros(16))


def test_vmap_and_jit_equal_the_batched_call(rng):
    z = jnp.asarray(rng.standard_normal((4, 6, 32)).astype(np.float32))
    direct = routing.route(z, 3, score="sigmoid", renormalize=True)
    mapped = jax.jit(jax.vmap(lambda t: routing.route(t, 3, score="sigmoid", renormalize=True)))(z)
    np.testing.assert_array_equal(direct[1], mapped[1])
    np.testing.assert_allclose(direct[0], mapped[0], rtol=1e-7)


def route_custom_calls(fn, *args) -> int:
    return jax.jit(fn).lower(*args).as_text().count("custom_call @jax_topk_route")


def test_one_fused_kernel_per_call(rng):
    assert "route" in jax_topk.info()["platforms"]["cpu"]["targets"]
    z = jnp.asarray(rng.standard_normal((4, 6, 64)).astype(np.float32))
    biases = jnp.asarray(rng.standard_normal((4, 64)).astype(np.float32))
    route = lambda z, b=None: routing.route(z, 4, score="sigmoid", bias=b, renormalize=True)  # noqa: E731
    assert route_custom_calls(route, z) == 1
    assert route_custom_calls(jax.vmap(route), z) == 1
    assert route_custom_calls(jax.vmap(route), z, biases) == 1
    assert route_custom_calls(jax.vmap(jax.vmap(route, (0, None)), (None, 0)), z[0], biases) == 1


def test_vmapped_bias_equals_a_loop(rng):
    z = jnp.asarray(rng.standard_normal((3, 5, 64)).astype(np.float32))
    biases = jnp.asarray(rng.standard_normal((3, 64)).astype(np.float32) * 0.1)
    route = lambda z, b: routing.route(z, 4, score="sigmoid", bias=b, n_groups=8, top_groups=3)  # noqa: E731
    for in_axes, zs in (((0, 0), z), ((None, 0), z[0])):
        w, ids = jax.jit(jax.vmap(route, in_axes))(zs, biases)
        for i in range(3):
            w_i, ids_i = route(zs if in_axes[0] is None else zs[i], biases[i])
            np.testing.assert_array_equal(ids[i], ids_i)
            np.testing.assert_array_equal(w[i], w_i)


@pytest.mark.parametrize("experts,k", [(1100, 3), (64, 40)])
def test_routes_past_the_kernel_limits_use_the_composition(experts, k, rng):
    limits = jax_topk.info()["platforms"]["cpu"]["build"]["route_limits"]
    assert experts > limits["max_experts"] or k > limits["max_k"]
    z = jnp.asarray(rng.standard_normal((5, experts)).astype(np.float32))
    assert route_custom_calls(lambda z: routing.route(z, k, score="sqrt_softplus"), z) == 0
    w, ids = routing.route(z, k, score="sqrt_softplus", renormalize=True)
    want_w, want_ids = np_route(np.asarray(z), k, score="sqrt_softplus", renormalize=True)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(w, want_w, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(routing.PRESETS))
def test_kernel_agrees_with_the_composition(name, rng):
    # The fallback lowering (pure JAX over top_k) against the fused kernel:
    # the same ids on random logits, weights to float32 rounding.
    from jax_topk import _route

    preset = routing.PRESETS[name]
    experts = 256
    z = jnp.asarray(rng.standard_normal((300, experts)).astype(np.float32))
    bias = jnp.asarray(rng.standard_normal(experts).astype(np.float32) * 0.1) if preset.uses_bias else None
    w, ids = preset(z, bias)
    cw, cids = jax.jit(lambda z: _route.composition(
        z, jnp.zeros((0,), jnp.float32) if bias is None else bias, k=preset.k, score=preset.score,
        n_groups=preset.n_groups or 0, top_groups=preset.top_groups or 0, renormalize=preset.renormalize,
        scale=preset.scale))(z)
    np.testing.assert_array_equal(ids, cids)
    np.testing.assert_allclose(w, cw, rtol=2e-6)


def toy_moe(x, router, experts, route_fn):
    """Dispatch each token to its k experts (by id) and combine by weight."""
    w, ids = route_fn(x @ router)
    outs = jnp.einsum("td,tkde->tke", x, experts[ids])
    return (w[..., None] * outs).sum(1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])  # the fused kernel, and the composition
def test_toy_moe_layer_matches_a_dense_layer(dtype, rng):
    tokens, d, e, k = 12, 8, 16, 4
    x = jnp.asarray(rng.standard_normal((tokens, d)), dtype)
    router = jnp.asarray(rng.standard_normal((d, e)), dtype)
    experts = jnp.asarray(rng.standard_normal((e, d, d)) / d, dtype)
    route_fn = lambda z: routing.route(z, k, renormalize=True)  # noqa: E731
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == "float64" else dict(rtol=2e-5, atol=1e-6)
    # Full-precision matmuls on every backend (GPUs default to TF32 for float32).
    with jax.default_matmul_precision("highest"):
        def dense(x, router, experts):
            # Every expert on every token, gated by a dense weight vector built
            # from the reference formula (softmax, top-k mask, renormalise).
            s = jax.nn.softmax(x @ router, axis=-1)
            kth = jnp.sort(s, axis=-1)[:, -k][:, None]
            gate = jnp.where(s >= kth, s, 0.0)
            gate = gate / gate.sum(-1, keepdims=True)
            return jnp.einsum("te,tef->tf", gate, jnp.einsum("td,edf->tef", x, experts))

        # Routing weights are computed in float32 (whatever the logits' dtype); the
        # dense layer here runs in the inputs' dtype.
        np.testing.assert_allclose(toy_moe(x, router, experts, route_fn), dense(x, router, experts), **tol)
        loss = lambda f: (lambda *a: (f(*a) ** 2).sum())  # noqa: E731
        g_moe = jax.grad(loss(lambda x, r, ex: toy_moe(x, r, ex, route_fn)), argnums=(0, 1, 2))(x, router, experts)
        g_dense = jax.grad(loss(dense), argnums=(0, 1, 2))(x, router, experts)
        for a, b in zip(g_moe, g_dense):
            np.testing.assert_allclose(a, b, rtol=1e-5 if dtype == "float64" else 1e-4, atol=1e-6 if dtype == "float64" else 1e-5)


def test_hash_route(rng):
    table = jnp.asarray(rng.integers(0, 32, size=(100, 4)).astype(np.int32))
    tokens = jnp.asarray(rng.integers(0, 100, size=(3, 7)))
    w, ids = routing.hash_route(tokens, table, scale=2.0)
    np.testing.assert_array_equal(ids, np.asarray(table)[np.asarray(tokens)])
    np.testing.assert_allclose(w, np.full((3, 7, 4), 0.5))
    scores = jnp.asarray(rng.random((3, 7, 32)))
    w, _ = routing.hash_route(tokens, table, scores)
    gathered = np.take_along_axis(np.asarray(scores), np.asarray(ids), axis=-1)
    np.testing.assert_allclose(w, gathered / gathered.sum(-1, keepdims=True), rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(k=9), ValueError, r"k=9 must be in \[1, 8\] for logits of shape \(2, 8\)"),
        (dict(k=0), ValueError, r"k=0 must be in \[1, 8\]"),
        (dict(k=2, score="relu"), ValueError, r"unknown score 'relu'"),
        (dict(k=2, bias=jnp.zeros(7)), ValueError, r"bias must have shape \(8,\) .* got \(7,\)"),
        (dict(k=2, n_groups=3, top_groups=1), ValueError, r"n_groups=3 must divide the 8 experts"),
        (dict(k=2, n_groups=4, top_groups=5), ValueError, r"top_groups=5 must be in \[1, n_groups=4\]"),
        (dict(k=5, n_groups=4, top_groups=2), ValueError, r"2 \* 2 = 4 experts can be chosen, fewer than k=5"),
        (dict(k=2, n_groups=4), ValueError, r"n_groups and top_groups go together"),
    ],
)
def test_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        routing.route(jnp.zeros((2, 8)), **kwargs)


def test_integer_logits_are_rejected():
    with pytest.raises(TypeError, match="logits must be a floating array"):
        routing.route(jnp.zeros((2, 8), jnp.int32), 2)
