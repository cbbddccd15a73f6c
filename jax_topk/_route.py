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

from jax_topk import _compat, _info, _registry, _sharding
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
# when the logits are sharded (_sharding.py: tokens stay where they are; a
# sharded expert axis is merged from candidates, route_candidate_merge, or
# gathered where a merge would not be exact).
route_local_p = Primitive("jax_topk_route_local")
route_local_p.multiple_results = True


def _abstract_eval(logits, bias, *, k, **_):
    shape = logits.shape[:-1] + (k,)
    extra = _sharding.output_sharding(logits)
    return (logits.update(shape=shape, dtype=jnp.float32, weak_type=False, **extra),
            logits.update(shape=shape, dtype=jnp.int32, weak_type=False, **extra))


route_p.def_abstract_eval(_abstract_eval)
route_local_p.def_abstract_eval(_abstract_eval)


def _per_token_bias(logits, bias) -> bool:
    """Whether a bias is one row per token (shaped like the logits) rather
    than one per expert shared by every token (or absent)."""
    return bias.ndim == logits.ndim and logits.ndim > 1


def _roles(avals):
    """(logits, bias) to the partitioning: a bias is absent or per expert
    (shared by every token), or per token (sharded like the logits)."""
    return _sharding.ELEMENTS, _sharding.ELEMENTS if _per_token_bias(*avals) else _sharding.SHARED


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


def _kept_per_group(k: int, group: int, grouped: bool) -> int:
    """How many of a group's experts (or, without groups, a device's) the
    merge keeps: ``min(k, group)``, and with groups at least the two best
    that make the group's score."""
    return min(max(k, 2) if grouped else k, group)


def candidates_per_shard(experts: int, shards: int, k: int, n_groups: int) -> int:
    """How many experts per row each of ``shards`` devices contributes to
    ``route_candidate_merge``: its best ``min(k, experts / shards)``, or
    with groups (whole groups per device) each group's best
    ``min(max(k, 2), group size)``."""
    local = experts // shards
    group = experts // n_groups if n_groups else local
    return local // group * _kept_per_group(k, group, bool(n_groups))


def merge_is_exact(avals_in, params, shards: int, platform: str) -> bool:
    """Whether ``route_candidate_merge`` gives the unsharded result bit for
    bit for logits whose expert axis is split over ``shards`` devices.

    Not where a softmax's normaliser is needed (a bias, groups, or no
    renormalisation): it is a sum over the whole row in one canonical order
    that per-device partial sums would round differently. Not where a group
    would be split across devices, and only where the kernel (not the
    composition, whose exp/log differ) routes both the rows and the
    candidates."""
    logits, bias = avals_in
    experts, k, n_groups = logits.shape[-1], params["k"], params["n_groups"]
    if params["score"] == "softmax" and (bias.size or n_groups or not params["renormalize"]):
        return False
    if experts % shards or (n_groups and (experts // shards) % (experts // n_groups)):
        return False
    lowering_platform = _info._lowering_platform(platform)
    limits = _registry.build_info(lowering_platform).get("route_limits", {})
    widest = experts + k if params["score"] == "softmax" else experts  # the degenerate rows' call
    return (_registry.kernel_target("route", lowering_platform, logits.dtype) is not None
            and widest <= limits.get("max_experts", 0) and k <= limits.get("max_k", 0))


def route_candidate_merge(bind_local, operands, axes: tuple[str, ...], *, k, score, n_groups,
                          top_groups, renormalize, scale):
    """``route`` of logits whose expert axis is split over mesh ``axes`` (run
    per device; only where ``merge_is_exact``).

    1. Each device ranks its experts by the selection key (c = score + bias,
       or the logits themselves) and keeps its best ``candidates_per_shard``;
       with groups, each of its (whole) groups' best. The logits are ranked
       through a sigmoid for a softmax route: the same order, but a NaN or
       +inf logit ranks first instead of making the device's own softmax
       degenerate, so every row's maximum is among the candidates.
    2. The candidates' logits and global ids (and per-token biases; a bias
       per expert is on every device) are all-gathered in device order
       (equal keys keep the lower expert first) and the kernel
       routes them with the call's parameters: the groups' two best, the k
       best and, for a renormalised softmax, the row's maximum logit and the
       chosen numerators are all among them, so weights and ids are the
       unsharded ones.
    3. A softmax row whose maximum is NaN or +-inf (every score NaN) routes to
       experts 0..k-1: those, gathered, are routed again in front of the
       candidates (same maximum), and replace that row's result.
    """
    logits, bias = operands
    local = logits.shape[-1]
    offset = lax.axis_index(axes) * local
    shared_bias = bias if bias.size and not _per_token_bias(logits, bias) else None
    if not bias.size:
        bias = None
    elif shared_bias is not None:  # one per expert: every device holds all of them
        bias = jnp.broadcast_to(lax.dynamic_slice_in_dim(bias, offset, local), logits.shape)
    no_bias = jnp.zeros((0,), jnp.float32)
    group = local * lax.axis_size(axes) // n_groups if n_groups else local
    rows = logits.reshape(logits.shape[:-1] + (local // group, group))
    _, best = bind_local(rows, no_bias if bias is None else bias.reshape(rows.shape),
                         k=_kept_per_group(k, group, bool(n_groups)),
                         score="sigmoid" if score == "softmax" else score, n_groups=0, top_groups=0,
                         renormalize=False, scale=1.0)
    best = (best + group * jnp.arange(local // group, dtype=best.dtype)[:, None]).reshape(
        logits.shape[:-1] + (-1,))

    def gather(a):
        return _sharding.gather_last_axis(a, axes)

    candidates = gather(jnp.take_along_axis(logits, best, axis=-1))
    ids = gather(best + offset)
    if shared_bias is not None:  # looked up by global id: nothing to gather
        cand_bias = shared_bias[ids]
    else:
        cand_bias = no_bias if bias is None else gather(jnp.take_along_axis(bias, best, axis=-1))
    weights, at = bind_local(candidates, cand_bias, k=k, score=score, n_groups=n_groups,
                             top_groups=top_groups, renormalize=renormalize, scale=scale)
    ids = jnp.take_along_axis(ids, at, axis=-1)
    if score != "softmax":
        return weights, ids
    head = gather(logits[..., :min(k, local)])[..., :k]  # experts 0..k-1
    head_weights, _ = bind_local(jnp.concatenate([head, candidates], axis=-1), no_bias, k=k,
                                 score=score, n_groups=0, top_groups=0, renormalize=renormalize,
                                 scale=scale)
    degenerate = ~jnp.isfinite(jnp.max(candidates.astype(jnp.float32), axis=-1, keepdims=True))
    first = jnp.broadcast_to(jnp.arange(k, dtype=ids.dtype), ids.shape)
    return jnp.where(degenerate, head_weights, weights), jnp.where(degenerate, first, ids)


batching.primitive_batchers[route_p] = _batch
ad.primitive_jvps[route_p] = _jvp
_sharding.register(route_p, _sharding.partitioned_lowering(
    route_local_p, roles=_roles, split_rule=route_candidate_merge, split_applies=merge_is_exact))
mlir.register_lowering(route_local_p, _fallback_lowering)
for _platform in _registry.platforms():
    mlir.register_lowering(route_local_p, _kernel_lowering(_platform), platform=_platform)
