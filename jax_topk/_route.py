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
# gathered where a merge would not be exact). Operands (logits, bias) or,
# inside a merge, (logits, bias, normaliser): per token the softmax shift's
# float bits and the partial normalisers of the devices (uint32 words), used
# instead of the row's own (kernels only).
route_local_p = Primitive("jax_topk_route_local")
route_local_p.multiple_results = True
# Per token of logits [..., n] and a shift [...]: the exact sum of
# exp(z - shift) over the row as uint32 words [..., words] (routing.h,
# ExactSum); the partial sums of a row's parts add up to its normaliser.
softmax_partial_p = Primitive("jax_topk_route_softmax_partial")


def needs_normaliser(*, score, has_bias, n_groups, renormalize) -> bool:
    """Whether a route reads the softmax normaliser (the sum over the whole
    row): to select by score (a bias or groups), or for weights that are not
    renormalised. RouteConfig::needs_softmax_sum in routing.h."""
    return score == "softmax" and (has_bias or bool(n_groups) or not renormalize)


def _exact_sum_words() -> int:
    """uint32 words per partial normaliser (kExactSumWords in routing.h)."""
    for platform in _registry.platforms():
        words = _registry.build_info(platform).get("route_limits", {}).get("exact_sum_words")
        if words:
            return int(words)
    raise RuntimeError("jax_topk: no compiled routing kernel reports its partial normaliser's size")


def _partial_abstract_eval(logits, shift):
    return logits.update(shape=logits.shape[:-1] + (_exact_sum_words(),), dtype=jnp.uint32, weak_type=False,
                         **_sharding.output_sharding(logits))


softmax_partial_p.def_abstract_eval(_partial_abstract_eval)


def _abstract_eval(logits, bias, *normaliser, k, **_):
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
    def lowering(ctx, logits, bias, *normaliser, k, score, n_groups, top_groups, renormalize, scale):
        params = dict(k=k, score=score, n_groups=n_groups, top_groups=top_groups,
                      renormalize=renormalize, scale=scale)
        aval = ctx.avals_in[0]
        target = _registry.kernel_target("route", platform, aval.dtype)
        limits = _registry.build_info(platform).get("route_limits", {})
        if target is None or aval.shape[-1] > limits.get("max_experts", 0) or k > limits.get("max_k", 0):
            if normaliser:
                raise NotImplementedError("jax_topk: a route with a given normaliser needs the fused kernel "
                                          f"({platform}, {aval.dtype}, {aval.shape[-1]} experts, k={k})")
            return _fallback_lowering(ctx, logits, bias, **params)
        if not normaliser:  # the row's own: an empty operand
            normaliser = (mlir.ir_constant(np.zeros((0,), np.uint32)),)
            ctx = ctx.replace(avals_in=[*ctx.avals_in, _compat.ShapedArray((0,), np.uint32)])
        return jax.ffi.ffi_lowering(target)(
            ctx, logits, bias, *normaliser, k=np.int64(k), score=np.int64(SCORES.index(score)),
            n_groups=np.int64(n_groups), top_groups=np.int64(top_groups),
            renormalize=bool(renormalize), scale=np.float32(scale))

    return lowering


def _partial_lowering(platform: str):
    def lowering(ctx, logits, shift):
        target = _registry.kernel_target("route_softmax_partial", platform, ctx.avals_in[0].dtype)
        if target is None:  # merge_is_exact keeps merges that need it off such platforms
            raise NotImplementedError(f"jax_topk: no softmax partial-sum kernel for {platform}, "
                                      f"{ctx.avals_in[0].dtype}")
        return jax.ffi.ffi_lowering(target)(ctx, logits, shift)

    return lowering


def _kept_per_part(k: int, part: int, grouped: bool) -> int:
    """How many experts of a part (a group, or a device's share of one, or
    without groups all of a device's) the merge keeps: ``min(k, part)``, and
    with groups at least the two best that can make the group's score."""
    return min(max(k, 2) if grouped else k, part)


def _part(experts: int, shards: int, n_groups: int) -> int:
    """The experts a device ranks together in a merge: a whole group when a
    device holds whole groups, its share of a group when a group spans
    several devices, all of its experts without groups."""
    local = experts // shards
    return min(experts // n_groups, local) if n_groups else local


def candidates_per_shard(experts: int, shards: int, k: int, n_groups: int) -> int:
    """How many experts per row each of ``shards`` devices contributes to
    ``route_candidate_merge``: its best ``min(k, experts / shards)``, or
    with groups each of its parts' best ``min(max(k, 2), part size)``."""
    part = _part(experts, shards, n_groups)
    return experts // shards // part * _kept_per_part(k, part, bool(n_groups))


def merge_is_exact(avals_in, params, shards: int, platform: str) -> bool:
    """Whether ``route_candidate_merge`` gives the unsharded result bit for
    bit for logits whose expert axis is split over ``shards`` devices.

    Not where groups and devices cut the experts unevenly (a device must
    hold whole groups, or a group whole devices), and only where the kernel
    (not the composition, whose exp/log differ) routes the rows, the
    candidates and, for a softmax normaliser, the partial sums."""
    logits, bias = avals_in
    experts, k, n_groups = logits.shape[-1], params["k"], params["n_groups"]
    if experts % shards:
        return False
    local, group = experts // shards, experts // n_groups if n_groups else 0
    if n_groups and local % group and group % local:
        return False
    lowering_platform = _info._lowering_platform(platform)
    limits = _registry.build_info(lowering_platform).get("route_limits", {})
    widest = experts + k if params["score"] == "softmax" else experts  # the degenerate rows' call
    normaliser = needs_normaliser(score=params["score"], has_bias=bool(bias.size), n_groups=n_groups,
                                  renormalize=params["renormalize"])
    return (_registry.kernel_target("route", lowering_platform, logits.dtype) is not None
            and (not normaliser
                 or _registry.kernel_target("route_softmax_partial", lowering_platform, logits.dtype) is not None)
            and widest <= limits.get("max_experts", 0) and k <= limits.get("max_k", 0))


def _shared_normaliser(logits, gather):
    """Per token the softmax shift (the row's max logit, NaN-propagating) and
    every device's exact partial normaliser, as the kernel's uint32 words:
    the shift and the sum one device computes for the whole row."""
    shift = jnp.max(gather(jnp.max(logits.astype(jnp.float32), axis=-1, keepdims=True)), axis=-1)
    parts = gather(softmax_partial_p.bind(logits, shift))
    return jnp.concatenate([lax.bitcast_convert_type(shift, jnp.uint32)[..., None], parts], axis=-1), shift


def route_candidate_merge(bind_local, operands, axes: tuple[str, ...], *, k, score, n_groups,
                          top_groups, renormalize, scale):
    """``route`` of logits whose expert axis is split over mesh ``axes`` (run
    per device; only where ``merge_is_exact``).

    0. A softmax whose normaliser is read (a bias, groups, or weights not
       renormalised) first shares it: the row's max logit (one float per
       device and token, gathered) and each device's exact partial sum of
       exp(z - max) (``softmax_partial_p``, gathered). Partial sums are
       integers (routing.h, ExactSum), so they add up to the very bits one
       device computes; every kernel call below takes them instead of its
       own row's.
    1. Each device ranks its experts by the selection key (c = score + bias,
       the score alone with groups, or the logits themselves) and keeps its
       best ``candidates_per_shard``; with groups, each of its groups' best,
       or of its share of a group that spans devices (the group's two best,
       which make its score, are among its shares' two best). Without a
       bias or groups a softmax route's logits are ranked through a sigmoid:
       the same order, but a NaN or +inf logit ranks first instead of making
       the device's own softmax degenerate, so every row's maximum is among
       the candidates.
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

    def gather(a):
        return _sharding.gather_last_axis(a, axes)

    normaliser, shift = (), None
    if needs_normaliser(score=score, has_bias=bias is not None, n_groups=n_groups, renormalize=renormalize):
        words, shift = _shared_normaliser(logits, gather)
        normaliser = (words,)

    # Parts in device order are in expert order: a group spanning devices
    # has its candidates side by side after the gather, as the grouped
    # kernel call below reads them.
    part = _part(local * lax.axis_size(axes), lax.axis_size(axes), n_groups)
    rows = logits.reshape(logits.shape[:-1] + (local // part, part))
    kept = _kept_per_part(k, part, bool(n_groups))
    if bias is not None or n_groups:  # the final selection's key, c = score + bias (a zero bias: c = score exactly)
        rank_bias = jnp.zeros((part,), jnp.float32) if bias is None else bias.reshape(rows.shape)
        rank_normaliser = tuple(jnp.broadcast_to(w[..., None, :], rows.shape[:-1] + w.shape[-1:]) for w in normaliser)
        rank_score = score
    else:  # the logits' order
        rank_bias, rank_normaliser, rank_score = no_bias, (), "sigmoid" if score == "softmax" else score
    _, best = bind_local(rows, rank_bias, *rank_normaliser, k=kept, score=rank_score, n_groups=0, top_groups=0,
                         renormalize=False, scale=1.0)
    best = (best + part * jnp.arange(local // part, dtype=best.dtype)[:, None]).reshape(
        logits.shape[:-1] + (-1,))

    candidates = gather(jnp.take_along_axis(logits, best, axis=-1))
    ids = gather(best + offset)
    if shared_bias is not None:  # looked up by global id: nothing to gather
        cand_bias = shared_bias[ids]
    else:
        cand_bias = no_bias if bias is None else gather(jnp.take_along_axis(bias, best, axis=-1))
    weights, at = bind_local(candidates, cand_bias, *normaliser, k=k, score=score, n_groups=n_groups,
                             top_groups=top_groups, renormalize=renormalize, scale=scale)
    ids = jnp.take_along_axis(ids, at, axis=-1)
    if score != "softmax":
        return weights, ids
    head = gather(logits[..., :min(k, local)])[..., :k]  # experts 0..k-1
    head_row = jnp.concatenate([head, candidates], axis=-1)
    # Every key NaN (the row's max is NaN or +inf): the first k. With a shared
    # normaliser the keys are c = NaN + 0 (a zero bias) and the shared shift
    # and sum weigh them; else the row's own shift (the candidates hold its max).
    head_bias = jnp.zeros(head_row.shape[-1:], jnp.float32) if normaliser else no_bias
    head_weights, _ = bind_local(head_row, head_bias, *normaliser, k=k, score=score, n_groups=0, top_groups=0,
                                 renormalize=renormalize, scale=scale)
    row_max = shift[..., None] if normaliser else jnp.max(candidates.astype(jnp.float32), axis=-1, keepdims=True)
    degenerate = ~jnp.isfinite(row_max)
    first = jnp.broadcast_to(jnp.arange(k, dtype=ids.dtype), ids.shape)
    return jnp.where(degenerate, head_weights, weights), jnp.where(degenerate, first, ids)


batching.primitive_batchers[route_p] = _batch
ad.primitive_jvps[route_p] = _jvp
_sharding.register(route_p, _sharding.partitioned_lowering(
    route_local_p, roles=_roles, split_rule=route_candidate_merge, split_applies=merge_is_exact))
mlir.register_lowering(route_local_p, _fallback_lowering)  # softmax_partial_p has none: kernels only
for _platform in _registry.platforms():
    mlir.register_lowering(route_local_p, _kernel_lowering(_platform), platform=_platform)
    mlir.register_lowering(softmax_partial_p, _partial_lowering(_platform), platform=_platform)
