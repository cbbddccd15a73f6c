"""GPU routing == CPU routing (skipped without a GPU): the same ids bit for bit
and weights within 1 ulp, for every score/bias/group/renormalise combination,
odd expert counts, the presets, and special logits. Both fused kernels compute
the scores from IEEE operations only (csrc/include/jax_topk/routing.h)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import gpu_device
from test_routing import CONFIGS, assert_same_choice, np_route
from jax_topk import routing

GPU = gpu_device()
CPU = jax.devices("cpu")[0]
if GPU is None:
    pytest.skip("no GPU", allow_module_level=True)


def route_on(device, z, k, bias=None, **kwargs):
    with jax.default_device(device):
        b = None if bias is None else jax.device_put(bias, device)
        w, ids = jax.jit(lambda z: routing.route(z, k, bias=b, **kwargs))(jax.device_put(z, device))
    return np.asarray(w), np.asarray(ids)


def assert_gpu_equals_cpu(z, k, bias=None, **kwargs):
    gw, gids = route_on(GPU, z, k, bias, **kwargs)
    cw, cids = route_on(CPU, z, k, bias, **kwargs)
    np.testing.assert_array_equal(gids, cids, err_msg=f"ids: {z.shape} {z.dtype} k={k} {kwargs}")
    finite = np.isfinite(cw)
    np.testing.assert_array_equal(np.isnan(gw), np.isnan(cw))
    np.testing.assert_array_max_ulp(gw[finite], cw[finite], maxulp=1)
    return gw, gids


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("experts,k", [(5, 3), (16, 4), (32, 8), (33, 2), (64, 6), (100, 12), (128, 16),
                                       (256, 8), (512, 9), (1000, 32)])
def test_gpu_equals_cpu(config, dtype, experts, k, rng):
    # 257 tokens: the last warp is partial. 5 and 16 experts: several tokens per warp. 33..256
    # experts: routes that rank the logits take top_k's warp-select kernel (4..32 lanes per
    # token; 33 and 100 leave the lanes uneven, 100 in 16-byte vectors with filled slots;
    # 128 with k = 16 takes the most output slots). 32, 512 and 1000 experts: one warp per
    # token with 1, 16 and 32 slots per lane.
    if config["groups"] and experts % config["groups"][0]:
        pytest.skip("groups must divide the experts")
    z = jnp.asarray(rng.standard_normal((257, experts)) * 3).astype(dtype)
    bias = jnp.asarray(rng.standard_normal(experts).astype(np.float32) * 0.1) if config["bias"] else None
    n_groups, top_groups = config["groups"] or (None, None)
    kwargs = dict(score=config["score"], n_groups=n_groups, top_groups=top_groups,
                  renormalize=config["renormalize"], scale=config["scale"])
    w, ids = assert_gpu_equals_cpu(z, k, bias, **kwargs)
    want_w, want_ids, keys = np_route(np.asarray(z.astype(jnp.float32)), k, return_keys=True,
                                      bias=None if bias is None else np.asarray(bias), **kwargs)
    assert_same_choice(w, ids, want_w, want_ids, keys)


@pytest.mark.parametrize("name", sorted(routing.PRESETS))
def test_presets_gpu_equals_cpu(name, rng):
    preset = routing.PRESETS[name]
    experts = {"deepseek_v3": 256, "deepseek_v4": 384, "mixtral": 8}.get(name, 128)
    z = jnp.asarray(rng.standard_normal((4096, experts)).astype(np.float32))
    bias = jnp.asarray(rng.standard_normal(experts).astype(np.float32) * 0.1) if preset.uses_bias else None
    assert_gpu_equals_cpu(z, preset.k, bias, score=preset.score, n_groups=preset.n_groups,
                          top_groups=preset.top_groups, renormalize=preset.renormalize, scale=preset.scale)


@pytest.mark.parametrize("score", ["softmax", "sigmoid", "sqrt_softplus"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("experts", [48, 256])
def test_special_logits_gpu_equals_cpu(score, bias, experts, rng):
    # 48 experts: two slots per lane, 6 groups of 8 keeping 2; 256: eight slots, 8 groups of 32
    # keeping 3.
    z = rng.standard_normal((8, experts)).astype(np.float32)
    z[0] = 0.0  # every logit tied
    z[1, 5] = np.nan
    z[2, 7] = np.inf
    z[3] = -np.inf
    z[4] *= 1e4  # saturated scores
    z[5, ::2] = z[5, 1::2]  # pairwise ties
    z[6] = np.float32(1e-30) * np.arange(experts)  # denormal-scale differences
    z[7, 3] = -np.nan
    b = jnp.asarray(rng.standard_normal(experts).astype(np.float32) * 0.1) if bias else None
    groups = (6, 2) if experts == 48 else (8, 3)
    for kwargs in (dict(renormalize=True), dict(renormalize=False, n_groups=groups[0], top_groups=groups[1])):
        assert_gpu_equals_cpu(jnp.asarray(z), 5, b, score=score, **kwargs)


def near_tie_logits(experts, rng):
    """Rows whose scores lie within a few ulps of each other: all logits equal,
    logits 1 ulp apart, saturated scores (one float for many logits), scores of
    1e-6 logits, subnormal scores (XLA flushes those to zero on CPU threads; the
    kernels must not), and random ones."""
    rows = np.empty((6, experts), np.float32)
    rows[0] = 0.25
    rows[1] = 0.5
    for e in range(1, experts):
        rows[1, e] = np.nextafter(rows[1, e - 1], np.float32(np.inf))
    rows[1] = rng.permutation(rows[1])
    rows[2] = np.float32(18.0) + rng.standard_normal(experts).astype(np.float32) * np.float32(0.5)
    rows[3] = rng.standard_normal(experts).astype(np.float32) * np.float32(1e-6)
    rows[4] = -rng.uniform(80, 110, experts).astype(np.float32)  # scores near the subnormal range
    rows[5] = rng.standard_normal(experts).astype(np.float32)
    return rows


@pytest.mark.parametrize("score", ["sigmoid", "sqrt_softplus"])
@pytest.mark.parametrize("bias_kind", ["none", "ulp_steps", "large"])
@pytest.mark.parametrize("experts,k,groups", [(96, 6, None), (128, 8, (8, 4)), (384, 6, None),
                                              (320, 7, (10, 4)), (384, 8, (12, 5)), (512, 9, (4, 2))])
def test_near_ties_gpu_equals_cpu(score, bias_kind, experts, k, groups, rng):
    # With the bias in ulp steps or large (which rounds the score differences away: ties in c
    # broken by index), most experts reach the selection threshold: more than the 128
    # candidates the warp kernel ranks in shared memory (its k-round fallback).
    if bias_kind == "none" and groups is None:
        pytest.skip("no bias and no groups: the selection ranks the logits (no scores read)")
    z = near_tie_logits(experts, rng)
    if bias_kind == "ulp_steps":  # every c within a few ulps, in a random order
        bias = np.full(experts, np.float32(0.1))
        for e in range(1, experts):
            bias[e] = np.nextafter(bias[e - 1], np.float32(np.inf))
        bias = rng.permutation(bias)
    elif bias_kind == "large":
        bias = (rng.standard_normal(experts) * 1e3).astype(np.float32)
        bias[: experts // 2] = np.float32(1024.0)
    else:
        bias = None
    n_groups, top_groups = groups or (None, None)
    for renormalize in (False, True):
        assert_gpu_equals_cpu(jnp.asarray(z), k, None if bias is None else jnp.asarray(bias), score=score,
                              n_groups=n_groups, top_groups=top_groups, renormalize=renormalize)


@pytest.mark.parametrize("score", ["sigmoid", "sqrt_softplus"])
@pytest.mark.parametrize("experts,k,groups", [(256, 8, (8, 4)), (384, 6, None), (96, 5, (3, 2))])
def test_score_bounds_gpu_equals_cpu(score, experts, k, groups, rng):
    # The CUDA route of sigmoid / sqrt(softplus) scores with a bias ranks by the hardware's
    # approximate functions first and scores exactly only the experts whose bounds reach the
    # k-th best (csrc/cuda/route_bounds.cuh), falling back on every exact score where groups
    # are too close to call. Here the scores of each row are spaced 2^-24 .. 2^-8 apart
    # (relative), below, at and above the bounds' width (~2^-15), around several logit
    # magnitudes (saturated scores, and the approximate exp's widest error near z ~ -87), so
    # that both the bounds path and its fallback decide near-ties; 96 experts in 3 groups of
    # 32 are groups that are slots, kept 2.
    rows = []
    for center in (-86.0, -20.0, -1.0, 0.0, 0.5, 3.0, 16.0):
        for spacing in 2.0 ** np.arange(-24, -7, 2):
            offsets = rng.permutation(experts).astype(np.float64) * spacing * max(1.0, abs(center))
            rows.append((center + offsets).astype(np.float32))
    z = jnp.asarray(np.stack(rows))
    n_groups, top_groups = groups or (None, None)
    for bias in (np.zeros(experts, np.float32), (rng.standard_normal(experts) * 1e-4).astype(np.float32)):
        assert_gpu_equals_cpu(z, k, jnp.asarray(bias), score=score, n_groups=n_groups, top_groups=top_groups,
                              renormalize=True)
