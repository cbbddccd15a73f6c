"""``indexer_top_k``: the sparse-attention indexer, score and top-k in one call.

Side by side here: the pure-JAX composition (the fallback lowering), abstract
eval, batching, JVP and the kernel lowering of the ``indexer`` primitive, and
the public function with its argument checks.

Operands: ``q [B, H, D]``, ``keys [G, N, D]`` (one dtype; G divides B and item
b reads key set ``b // (B // G)``: G = B for keys per item, 1 for keys every
item shares), ``weights [B, H]`` float32, ``lengths [B]`` int32 (``N`` for
whole rows). Results: ``scores [B, k]`` float32 and ``ids [B, k]`` int32.
Parameters: ``k`` and ``fusion`` (where the GPU kernels put the scores;
``FUSIONS``).

The score and its one fixed order of float32 operations are defined in
``csrc/include/jax_topk/indexer.h``; the native kernels follow it, which makes
every row's result independent of the batch it is computed in and of the padded
``N``. The pure-JAX composition (used where no kernel exists) computes the same
scores with XLA's dot, whose rounding is its own.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_topk import _checks, _compat, _registry, _sharding
from jax_topk._topk import top_k


def _f32(x):
    return jnp.asarray(x).astype(jnp.float32)


def scores_reference(q, keys, weights) -> jax.Array:
    """``sum_h weights[b, h] * relu(q[b, h] . keys[g(b), s])`` in float32 ([B, N])."""
    (b, h, d), g = q.shape, keys.shape[0]
    q_sets = _f32(q).reshape(g, b // g if g else 0, h, d)  # the items of each key set
    dots = jnp.einsum("grhd,gnd->grhn", q_sets, _f32(keys), precision=lax.Precision.HIGHEST)
    return jnp.einsum("bh,bhn->bn", _f32(weights), jnp.maximum(dots, 0.0).reshape(b, h, -1),
                      precision=lax.Precision.HIGHEST)


def scores_at(q, keys, weights, ids) -> jax.Array:
    """The scores of the keys ``ids`` ([B, k]; -1 gives 0): a smooth function
    of q, keys and weights (the JVP differentiates this)."""
    b, g = q.shape[0], keys.shape[0]
    key_set = (jnp.arange(b) // (b // g if g else 1))[:, None]
    picked = _f32(keys)[key_set, jnp.maximum(ids, 0)]  # [B, k, D]
    dots = jnp.einsum("bhd,bkd->bhk", _f32(q), picked, precision=lax.Precision.HIGHEST)
    s = jnp.einsum("bh,bhk->bk", _f32(weights), jnp.maximum(dots, 0.0), precision=lax.Precision.HIGHEST)
    return jnp.where(ids >= 0, s, 0.0)


# Where the GPU kernels put the scores (IndexerFusion in indexer.h): "auto"
# fuses the top-k into the score kernel where k << N and the [B, N] scores
# would be large, "fused" wherever the fused kernels take the shape, "unfused"
# never. Every choice gives the same bits; the CPU kernel and the composition
# have one way.
FUSIONS = ("auto", "fused", "unfused")


def composition(q, keys, weights, lengths, *, k, fusion="auto"):
    """The indexer as plain JAX ops over ``jax_topk.top_k``: the fallback lowering."""
    del fusion  # one way here
    return top_k(scores_reference(q, keys, weights), k, lengths=lengths)


indexer_p = Primitive("jax_topk_indexer")
indexer_p.multiple_results = True
indexer_p.def_impl(functools.partial(_compat.apply_primitive, indexer_p))
# The kernel call itself; indexer_p lowers to it, partitioned over the batch
# across devices (_sharding.batch_partitioned_lowering).
indexer_local_p = Primitive("jax_topk_indexer_local")
indexer_local_p.multiple_results = True


def _abstract_eval(q, keys, weights, lengths, *, k, fusion):
    shape = (q.shape[0], k)
    sharding = getattr(q, "sharding", None)
    extra = {}
    if sharding is not None and hasattr(sharding, "update"):
        extra = {"sharding": sharding.update(spec=jax.sharding.PartitionSpec(
            _sharding.padded_spec(sharding, 1)[0], None))}
    return (q.update(shape=shape, dtype=jnp.float32, weak_type=False, **extra),
            q.update(shape=shape, dtype=jnp.int32, weak_type=False, **extra))


indexer_p.def_abstract_eval(_abstract_eval)
indexer_local_p.def_abstract_eval(_abstract_eval)


def _batch(args, dims, *, k, fusion):
    # A vmapped axis becomes more batch items: V x [B, ...] -> [V * B, ...],
    # one kernel call. Unbatched operands are broadcast, but for one key set
    # every item shares, which stays one: V * B items on it.
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    flat = []
    for i, (a, d) in enumerate(zip(args, dims)):
        if i == 1 and d is None and a.shape[0] == 1:
            flat.append(a)
            continue
        a = jnp.broadcast_to(a, (size,) + a.shape) if d is None else jnp.moveaxis(a, d, 0)
        flat.append(a.reshape((size * a.shape[1],) + a.shape[2:]))
    scores, ids = indexer_p.bind(*flat, k=k, fusion=fusion)
    return (scores.reshape(size, -1, k), ids.reshape(size, -1, k)), (0, 0)


def _jvp(primals, tangents, *, k, fusion):
    q, keys, weights, lengths = primals
    scores, ids = indexer_p.bind(q, keys, weights, lengths, k=k, fusion=fusion)
    t_in = tangents[:3]
    if all(type(t) is ad.Zero for t in t_in):
        t_scores = _compat.symbolic_zero_tangent(scores)
    else:
        t_in = [jnp.zeros_like(_f32(p)) if type(t) is ad.Zero else _f32(t) for p, t in zip(primals[:3], t_in)]
        fn = functools.partial(scores_at, ids=ids)
        _, t_scores = jax.jvp(fn, tuple(_f32(p) for p in primals[:3]), tuple(t_in))
    return (scores, ids), (t_scores, _compat.symbolic_zero_tangent(ids))


_fallback_lowering = mlir.lower_fun(composition, multiple_results=True)


def _kernel_lowering(platform: str):
    def lowering(ctx, q, keys, weights, lengths, *, k, fusion):
        target = _registry.kernel_target("indexer", platform, ctx.avals_in[0].dtype)
        if target is None:
            return _fallback_lowering(ctx, q, keys, weights, lengths, k=k, fusion=fusion)
        b, h, d = ctx.avals_in[0].shape
        plan = _registry.indexer_plan(platform, ctx.avals_in[0].dtype, b, h, ctx.avals_in[1].shape[1], d, k, fusion)
        if plan is None:  # CPU handlers take no workspace (and have one way)
            return jax.ffi.ffi_lowering(target)(ctx, q, keys, weights, lengths, k=np.int64(k))
        workspace = _compat.ShapedArray((max(plan["workspace_bytes"], 1),), np.uint8)
        ctx = ctx.replace(avals_out=[*ctx.avals_out, workspace])
        return jax.ffi.ffi_lowering(target)(ctx, q, keys, weights, lengths, k=np.int64(k),
                                            fusion=np.int64(plan["fusion"]))[:-1]

    return lowering


def _partition_factors(avals_in):
    """The batch splits with keys per item (sharded like it) or one key set
    every item shares (replicated); with several shared sets it is not split."""
    batch, key_sets = avals_in[0].shape[0], avals_in[1].shape[0]
    if key_sets not in (batch, 1):
        return None
    keys = "b n d" if key_sets == batch else "g n d"
    return ("b h d", keys, "b h", "b"), ("b k", "b k")


batching.primitive_batchers[indexer_p] = _batch
ad.primitive_jvps[indexer_p] = _jvp
_sharding.register(indexer_p, _sharding.batch_partitioned_lowering(indexer_local_p, factors=_partition_factors))
mlir.register_lowering(indexer_local_p, _fallback_lowering)
for _platform in _registry.platforms():
    mlir.register_lowering(indexer_local_p, _kernel_lowering(_platform), platform=_platform)


def indexer_top_k(q: jax.Array, keys: jax.Array, weights: jax.Array, k: int, *,
                  lengths: jax.Array | None = None, causal: bool = False,
                  fusion: str = "auto") -> tuple[jax.Array, jax.Array]:
    """Sparse-attention indexer: score every key of each item, keep the best ``k``.

    For each batch item ``b`` and key ``s < lengths[b]``::

        score[b, s] = sum_h weights[b, h] * relu(q[b, h] . keys[b, s])

    in float32, then the ``k`` best scores of each item in the IEEE total order
    (ties by lower key index), like ``jax_topk.top_k``. One call covers the
    whole batch.

    Keys ``[N, D]`` (2-D) are shared: every item scores the same keys
    (``keys[s]`` in place of ``keys[b, s]``), read from one array, never
    broadcast. That is prefill, where the items are a sequence's query
    positions; ``causal=True`` then lets item ``b``, at position
    ``N - B + b`` (the last ``B`` positions of the keys: ``B == N`` for a
    whole sequence, ``B < N`` for a chunk after a cached prefix), see keys
    ``s <= N - B + b`` only. The scores take ``[B, N]`` float32 of device
    memory on the way (unfused): prefill a long sequence in chunks of queries.

    Batch invariance: where a native kernel runs (``jax_topk.info()``, op
    ``indexer``: CPU and CUDA), each score is computed by one fixed sequence
    of float32 operations that depends on the item's own q, keys and weights
    only. An item's scores and ids are then bit-identical whether it is
    computed alone, in any batch, padded to any ``N``, or against shared keys.
    The order is that of ``csrc/include/jax_topk/indexer.h`` on the CPU and,
    on CUDA, for float32 inputs or shapes without tensor-core tiles (then
    GPU == CPU bit for bit); bfloat16 inputs with ``H`` a multiple of 16 up
    to 128 and ``D`` in 16, 32, 64, 128 take tensor cores on CUDA (float32
    accumulation in a fixed order, the hardware's rounding: batch-invariant,
    within float32 rounding of the CPU). Elsewhere the pure-JAX composition
    runs (XLA's dot), which agrees to float32 rounding but carries no such
    guarantee.

    On CUDA the top-k can be fused into the score kernel (``fusion``): each
    block keeps the k best of its chunk of keys as it scores them, so only
    ``B x (N / chunk) x k`` candidates reach device memory instead of the
    ``[B, N]`` scores. It is the slower path where measured (0.71-0.90x on an
    H200: the keys' read, not the scores', sets the time), so ``"auto"``
    fuses only where ``k << N`` (``N >= 32 k``) and the ``[B, N]`` scores
    would take 256 MiB or more. Fused or not, the results are the same bits.

    Args:
      q: queries ``[B, H, D]``, float32 or bfloat16 (kernels; any float dtype
        runs the composition).
      keys: ``[B, N, D]`` (keys per item) or ``[N, D]`` (shared by every
        item), the same dtype as ``q``.
      weights: per-head weights ``[B, H]`` (used in float32).
      k: static number of keys to keep, ``0 <= k <= N``.
      lengths: optional integer ``[B]``: only keys ``s < lengths[b]`` take part
        (the rule of ``top_k``'s ``lengths``: <= 0 selects nothing, >= N
        everything). Slots past ``min(k, lengths[b])`` hold score ``-inf`` and
        id -1.
      causal: shared keys only: item ``b`` sees keys ``s <= N - B + b`` (with
        ``lengths`` too: the shorter of the two).
      fusion: where the CUDA kernels put the scores: ``"auto"`` (fused when
        k << N and the scores would be large), ``"fused"`` (wherever the
        fused kernels take the shape: k up to 128-1024 by head count and
        dim), ``"unfused"`` (through the ``[B, N]`` scores). Every choice
        gives the same bits; it moves time and memory.

    Returns:
      ``(scores, ids)``: float32 ``[B, k]`` and int32 ``[B, k]``, best first.
      Scores are differentiable with respect to ``q``, ``keys`` and
      ``weights`` (the tangent of the chosen keys' scores); ids are not.
      Under ``jax.vmap`` the vmapped axis folds into ``B``: one call (shared
      keys the vmap does not map stay one array).

    Example:
      >>> import numpy as np, jax_topk
      >>> q = np.ones((1, 2, 4), np.float32)
      >>> keys = np.arange(12, dtype=np.float32).reshape(1, 3, 4) - 4  # dots -10, 6, 22
      >>> scores, ids = jax_topk.indexer_top_k(q, keys, np.array([[1.0, 0.5]], np.float32), 2)
      >>> scores.tolist(), ids.tolist()
      ([[33.0, 9.0]], [[2, 1]])
      >>> q3 = np.ones((3, 1, 4), np.float32)   # prefill: 3 positions, shared keys
      >>> jax_topk.indexer_top_k(q3, keys[0], np.ones((3, 1), np.float32), 2, causal=True)[1].tolist()
      [[0, -1], [1, 0], [2, 1]]
    """
    fn = "jax_topk.indexer_top_k"
    q = _checks.as_array(q, "q", fn)
    keys = _checks.as_array(keys, "keys", fn)
    weights = _checks.as_array(weights, "weights", fn)
    k = _checks.static_int(k, "k", fn)
    if np.ndim(q) != 3 or np.ndim(keys) not in (2, 3):
        raise ValueError(f"{fn}: q and keys must be [B, H, D] and [B, N, D] or [N, D], got shapes "
                         f"{tuple(np.shape(q))} and {tuple(np.shape(keys))}")
    shared = np.ndim(keys) == 2
    (b, h, d), n, kd = q.shape, keys.shape[-2], keys.shape[-1]
    if kd != d or (not shared and keys.shape[0] != b):
        raise ValueError(f"{fn}: keys {tuple(keys.shape)} must be [B, N, D] = [{b}, N, {d}] or [N, D] = [N, {d}] "
                         f"for q {tuple(q.shape)}")
    if tuple(np.shape(weights)) != (b, h):
        raise ValueError(f"{fn}: weights must have shape [B, H] = {(b, h)} for q {tuple(q.shape)}, "
                         f"got {tuple(np.shape(weights))}")
    for name, a in (("q", q), ("keys", keys), ("weights", weights)):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            raise TypeError(f"{fn}: {name} must have a floating dtype, got {np.dtype(a.dtype).name}")
    if q.dtype != keys.dtype:
        raise TypeError(f"{fn}: q and keys must have one dtype, got {np.dtype(q.dtype).name} and "
                        f"{np.dtype(keys.dtype).name}")
    if not 0 <= k <= n:
        raise ValueError(f"{fn}: k={k} must be in [0, N={n}] for keys {tuple(keys.shape)}")
    if fusion not in FUSIONS:
        raise ValueError(f"{fn}: fusion={fusion!r} must be one of {FUSIONS}")
    if not isinstance(causal, bool):
        raise TypeError(f"{fn}: causal must be a bool, got {causal!r}")
    if causal and not shared:
        raise ValueError(f"{fn}: causal=True needs keys shared by the batch ([N, D]), got keys "
                         f"{tuple(keys.shape)}: item b sits at position N - B + b of those keys")
    if lengths is None:
        lengths = jnp.full((b,), n, jnp.int32)
    else:
        lengths = _checks.lengths_for(lengths, (b, n), 1, fn)
    if causal:
        lengths = jnp.minimum(lengths, n - b + 1 + jnp.arange(b, dtype=jnp.int32))
    keys = jnp.asarray(keys)
    if shared:
        keys = keys[None]  # one key set for every item
    return tuple(indexer_p.bind(jnp.asarray(q), keys, _f32(weights), lengths, k=k, fusion=fusion))
