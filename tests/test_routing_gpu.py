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
    # experts: routes that rank the logits take 4 lanes per token (lists of 4, 8, 16; 33 and 100
    # leave the lanes uneven; 128 with k = 16 fills the longest list). 32, 512 and 1000
    # experts: one warp per token with 1, 16 and 32 slots per lane.
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
