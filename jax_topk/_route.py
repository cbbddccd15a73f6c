"""The ``route`` primitive: fused MoE routing (DESIGN section 5).

Side by side here: the pure-JAX composition (the fallback lowering, and the
function whose derivative the JVP takes), abstract eval, batching, JVP and the
kernel lowering. The public function with its argument checks is
``jax_topk.routing.route``.

Operands: ``logits [..., experts]`` and ``bias`` (float32): shape ``(0,)``
without a bias, ``(experts,)`` shared by every token, or ``logits.shape`` (one
row per token; what batching produces when the bias is vmapped). Results:
``weights`` float32 and ``ids`` int32, both ``[..., k]``.

Selection rule shared with the kernels (``csrc/include/jax_topk/routing.h``):
with a bias or groups the experts are ranked by ``c = score + bias`` in
float32; without them every score is a strictly increasing function of the
logit, so the logits themselves are ranked (the exact order of the scores,
with no ties made by float32 rounding). A NaN ranks as +NaN (first); a softmax
with a NaN normaliser has every score NaN, so every expert ranks as +NaN.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_topk import _compat, _registry, _sharding
from jax_topk._topk import top_k

SCORES = ("softmax", "sigmoid", "sqrt_softplus")  # index = RouteScore in routing.h


def scores(z: jax.Array, score: str) -> jax.Array:
    """``score(z)`` in float32 (``z`` float32)."""
    if score == "softmax":
        return jax.nn.softmax(z, axis=-1)
    if score == "sigmoid":
        return jax.nn.sigmoid(z)
    softplus = jnp.maximum(z, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(z)))
    return jnp.sqrt(softplus)


def _plus_nan(v: jax.Array) -> jax.Array:
    """Every NaN as +NaN: the sign arithmetic gives a NaN is platform-dependent."""
    return jnp.where(jnp.isnan(v), jnp.float32(np.nan), v)


def _keep_top_groups(c: jax.Array, n_groups: int, top_groups: int) -> jax.Array:
    """c with the experts outside the best ``top_groups`` groups set to -inf.

    A group's score is the sum of its two best entries (its one entry when a
    group holds a single expert); ties between groups go to the lower index."""
    per_group = c.shape[-1] // n_groups
    grouped = c.reshape(c.shape[:-1] + (n_groups, per_group))
    group_scores = _plus_nan(top_k(grouped, min(2, per_group))[0].sum(-1))
    _, best = top_k(group_scores, top_groups)
    kept = jax.nn.one_hot(best, n_groups, dtype=jnp.bool_).any(-2)
    return jnp.where(jnp.repeat(kept, per_group, axis=-1), c, -jnp.inf)


def _select(z, s, bias, *, k, score, n_groups, top_groups) -> jax.Array:
    """The chosen expert ids (int32 [..., k]) by the selection rule above."""
    if bias is None and not n_groups:
        keys = z
        if score == "softmax":
            m = z.max(-1, keepdims=True)
            keys = jnp.where(jnp.isfinite(m), z, jnp.float32(np.nan))
        return top_k(_plus_nan(keys), k)[1]
    c = s if bias is None else s + lax.stop_gradient(bias)
    c = _plus_nan(c)
    if n_groups:
        c = _keep_top_groups(c, n_groups, top_groups)
    return top_k(c, k)[1]


def weights_at(logits, ids, *, score, renormalize, scale) -> jax.Array:
    """The weights of the chosen ``ids``: a smooth function of the logits
    (the JVP differentiates this)."""
    s = scores(logits.astype(jnp.float32), score)
    w = jnp.take_along_axis(s, ids, axis=-1)
    if renormalize:
        w = w / w.sum(-1, keepdims=True)
    return w * jnp.float32(scale)


def composition(logits, bias, *, k, score, n_groups, top_groups, renormalize, scale):
    """Routing as plain JAX ops over ``jax_topk.top_k``: the fallback lowering.

    Its ids equal the kernels' wherever no two selection scores are within
    the few ulps by which XLA's exp/log and the kernels' may differ; its
    weights agree to float32 rounding."""
    z = logits.astype(jnp.float32)
    s = scores(z, score)
    bias = None if bias.size == 0 else bias.astype(jnp.float32)
    ids = _select(z, s, bias, k=k, score=score, n_groups=n_groups, top_groups=top_groups)
    return weights_at(z, ids, score=score, renormalize=renormalize, scale=scale), ids


route_p = Primitive("jax_topk_route")
route_p.multiple_results = True
route_p.def_impl(functools.partial(_compat.apply_primitive, route_p))
# The kernel call itself; route_p lowers to it, partitioned across devices
# when the logits are sharded (_sharding.py: tokens stay where they are, a
# sharded expert axis is gathered).
route_local_p = Primitive("jax_topk_route_local")
route_local_p.multiple_results = True


def _abstract_eval(logits, bias, *, k, **_):
    shape = logits.shape[:-1] + (k,)
    extra = _sharding.output_sharding(logits)
    return (logits.update(shape=shape, dtype=jnp.float32, weak_type=False, **extra),
            logits.update(shape=shape, dtype=jnp.int32, weak_type=False, **extra))


route_p.def_abstract_eval(_abstract_eval)
route_local_p.def_abstract_eval(_abstract_eval)


def _roles(avals):
    """(logits, bias) to the partitioning: a bias is absent or per expert
    (shared by every token), or per token (sharded like the logits)."""
    per_token = avals[1].ndim == avals[0].ndim and avals[0].ndim > 1
    return _sharding.ELEMENTS, _sharding.ELEMENTS if per_token else _sharding.SHARED


def _batch(args, dims, **params):
    # The batch dimension becomes more tokens: one kernel call. A batched bias
    # (one per vmapped instance) becomes a per-token bias.
    logits, bias = args
    logits_dim, bias_dim = dims
    size = logits.shape[logits_dim] if logits_dim is not None else bias.shape[bias_dim]
    if logits_dim is None:
        logits = jnp.broadcast_to(logits, (size,) + logits.shape)
    else:
        logits = jnp.moveaxis(logits, logits_dim, 0)
    if bias_dim is not None:
        bias = jnp.moveaxis(bias, bias_dim, 0)
        if bias.ndim == 2:  # [size, experts]: shared within each instance
            bias = bias.reshape((size,) + (1,) * (logits.ndim - 2) + bias.shape[-1:])
        bias = jnp.broadcast_to(bias, logits.shape)
    elif bias.size and bias.ndim > 1:  # already per token
        bias = jnp.broadcast_to(bias, logits.shape)
    return route_p.bind(logits, bias, **params), (0, 0)


def _jvp(primals, tangents, **params):
    logits, bias = primals
    t_logits = tangents[0]
    weights, ids = route_p.bind(logits, bias, **params)
    if type(t_logits) is ad.Zero:
        t_weights = _compat.symbolic_zero_tangent(weights)
    else:  # the bias is selection-only: no tangent flows from it
        fn = functools.partial(weights_at, ids=ids, score=params["score"],
                               renormalize=params["renormalize"], scale=params["scale"])
        _, t_weights = jax.jvp(fn, (logits,), (t_logits,))
    return (weights, ids), (t_weights, _compat.symbolic_zero_tangent(ids))


_fallback_lowering = mlir.lower_fun(composition, multiple_results=True)


def _kernel_lowering(platform: str):
    def lowering(ctx, logits, bias, *, k, score, n_groups, top_groups, renormalize, scale):
        params = dict(k=k, score=score, n_groups=n_groups, top_groups=top_groups,
                      renormalize=renormalize, scale=scale)
        aval = ctx.avals_in[0]
        target = _registry.kernel_target("route", platform, aval.dtype)
        limits = _registry.build_info(platform).get("route_limits", {})
        if target is None or aval.shape[-1] > limits.get("max_experts", 0) or k > limits.get("max_k", 0):
            return _fallback_lowering(ctx, logits, bias, **params)
        return jax.ffi.ffi_lowering(target)(
            ctx, logits, bias, k=np.int64(k), score=np.int64(SCORES.index(score)),
            n_groups=np.int64(n_groups), top_groups=np.int64(top_groups),
            renormalize=bool(renormalize), scale=np.float32(scale))

    return lowering


batching.primitive_batchers[route_p] = _batch
ad.primitive_jvps[route_p] = _jvp
_sharding.register(route_p, _sharding.partitioned_lowering(
    route_local_p, roles=_roles, split_rule=None))
mlir.register_lowering(route_local_p, _fallback_lowering)
for _platform in _registry.platforms():
    mlir.register_lowering(route_local_p, _kernel_lowering(_platform), platform=_platform)
