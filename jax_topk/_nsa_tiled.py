"""The tiled O(T)-memory implementation behind ``jax_topk.nsa``.

The ``*_tile`` functions compute one branch for one query tile: inputs in the
compute dtype, queries grouped as ``[B, tile, Hkv, G, D]``, ``start`` the
(traced) position of the tile's first query. The jitted entry points at the
end (``cfg`` static) run them over all tiles with
``_nsa_core.map_query_tiles``; ``nsa.py`` checks the arguments and calls them.
Jitting each entry point keeps eager (notebook) calls to one compiled program.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_topk import _nsa_core as core
from jax_topk._topk import top_k


def compress(x: jax.Array, cfg, mlp: dict | None) -> jax.Array:
    """``[B, T, H, D] -> [B, Nc, H, D]``: block i summarises tokens ``[i*d, i*d + l)``.

    ``mlp`` is None for mean pooling, else one half of ``nsa.init_params``:
    ``phi(block) = W2 gelu(W1 flatten(block + pos) + b1) + b2``, shared by the heads.
    """
    batch, length, heads, dim = x.shape
    num_blocks = core.num_compressed_blocks(length, cfg.block_size, cfg.stride)
    if num_blocks == 0:
        return jnp.zeros((batch, 0, heads, dim), x.dtype)
    per_block = cfg.block_size // cfg.stride
    # Blocks overlap by l - d tokens: cut stride-long chunks once, then block i
    # is chunks i .. i + l/d - 1 (slices, not a gather: the gradient is a pad).
    num_chunks = num_blocks - 1 + per_block
    chunks = x[:, : num_chunks * cfg.stride].reshape(batch, num_chunks, cfg.stride, heads, dim)
    blocks = jnp.concatenate([chunks[:, r: r + num_blocks] for r in range(per_block)], axis=2)
    if mlp is None:
        return blocks.mean(axis=2)
    blocks = blocks + mlp["pos"].astype(x.dtype)[:, None, :]
    flat = jnp.moveaxis(blocks, 2, 3).reshape(batch, num_blocks, heads, cfg.block_size * dim)
    hidden = jax.nn.gelu(flat @ mlp["w1"].astype(x.dtype) + mlp["b1"].astype(x.dtype))
    return hidden @ mlp["w2"].astype(x.dtype) + mlp["b2"].astype(x.dtype)


def tile_positions(start: jax.Array, tile: int) -> jax.Array:
    return start + jnp.arange(tile, dtype=jnp.int32)


def compressed_tile(start, q, k_cmp, v_cmp, cfg, scale) -> tuple[jax.Array, jax.Array]:
    """Compressed attention of a tile: ``(out [B, tile, Hkv, G, D], probs [B, tile, Hkv, G, Nc])``.

    A query sees block i only when the whole block is at or before it; a query
    that sees none (t < l - 1) gets zero output and zero probabilities.
    """
    visible = core.compressed_visible(tile_positions(start, q.shape[1]), k_cmp.shape[1],
                                      cfg.block_size, cfg.stride)
    scores = jnp.einsum("btkgd,bckd->btkgc", q, k_cmp) * scale
    probs = core.masked_softmax(scores, visible[None, :, None, None, :])
    return jnp.einsum("btkgc,bckd->btkgd", probs, v_cmp), probs


def selection_scores(probs: jax.Array, cfg, num_select: int) -> jax.Array:
    """``[B, tile, Hkv, G, Nc] -> [B, tile, Hkv, Ns]``: summed over the GQA group, mapped to selection blocks."""
    return core.compression_to_selection(probs.sum(axis=3), cfg.block_size, cfg.stride,
                                         cfg.select_size, num_select)


def rank_blocks(scores: jax.Array, positions: jax.Array, cfg) -> jax.Array:
    """What ``select`` ranks block scores ``[..., Ns]`` by: forced blocks
    (the first ``initial_blocks`` and the ``local_blocks`` ending at the
    query's own block) +inf, blocks that start after the query -inf, every
    other its score. ``positions`` broadcast to ``scores.shape[:-1]``."""
    blocks = jnp.arange(scores.shape[-1], dtype=jnp.int32)
    own = (positions // cfg.select_size)[..., None]
    forced = (blocks < cfg.initial_blocks) | (blocks > own - cfg.local_blocks)
    return jnp.where(blocks <= own, jnp.where(forced, jnp.inf, scores), -jnp.inf)


def select_ranked(ranked: jax.Array, positions: jax.Array, cfg) -> jax.Array:
    """``select`` of ranks ``rank_blocks`` made (or a kernel wrote the same way)."""
    num_select = ranked.shape[-1]
    own = (positions // cfg.select_size)[..., None]
    _, ids = top_k(jax.lax.stop_gradient(ranked), min(cfg.num_selected, num_select))
    # Fewer causal blocks than n: the remaining picks are future blocks, dropped.
    ids = jnp.where(ids <= own, ids, -1)
    missing = cfg.num_selected - ids.shape[-1]
    return jnp.pad(ids, [(0, 0)] * (ids.ndim - 1) + [(0, missing)], constant_values=-1)


def select(scores: jax.Array, positions: jax.Array, cfg) -> jax.Array:
    """Top-n selection-block ids ``[..., n]`` (int32, -1 for no block) of scores ``[..., Ns]``.

    ``positions`` (broadcastable to ``scores.shape[:-1]``) are the queries'
    positions. Forced blocks (the first ``initial_blocks`` and the
    ``local_blocks`` ending at the query's own block) rank +inf, blocks that
    start after the query -inf; ``top_k`` breaks ties by lower block index.
    """
    return select_ranked(rank_blocks(scores, positions, cfg), positions, cfg)


def selected_tile(start, q, block_ids, k_blocks, v_blocks, scale) -> jax.Array:
    """Attention of a tile over its selected blocks' tokens.

    ``block_ids`` ``[B, tile, Hkv, n]``; ``k_blocks``/``v_blocks``
    ``[B, Hkv, Ns, l', D]`` (zero-padded to whole blocks). Gathers
    ``n * l'`` keys per query and KV head: memory ``tile * Hkv * n * l' * D``.
    """
    batch, tile, kv_heads, _ = block_ids.shape
    num_select, select_size = k_blocks.shape[2:4]
    # In-bounds gather indices (an out-of-range gather may fill NaN, and 0 * NaN
    # is NaN); -1 and blocks past the end are masked below.
    safe_ids = jnp.clip(block_ids, 0, num_select - 1)
    batch_index = jnp.arange(batch)[:, None, None, None]
    head_index = jnp.arange(kv_heads)[None, None, :, None]

    def gather(blocks):  # -> [B, tile, Hkv, n * l', D]
        picked = blocks[batch_index, head_index, safe_ids]
        return picked.reshape(batch, tile, kv_heads, -1, picked.shape[-1])

    key_positions = block_ids[..., None] * select_size + jnp.arange(select_size, dtype=jnp.int32)
    queries = tile_positions(start, tile)[None, :, None, None, None]
    allowed = (block_ids[..., None] >= 0) & (key_positions <= queries)
    allowed = allowed.reshape(batch, tile, kv_heads, 1, -1)
    scores = jnp.einsum("btkgd,btksd->btkgs", q, gather(k_blocks)) * scale
    return jnp.einsum("btkgs,btksd->btkgd", core.masked_softmax(scores, allowed), gather(v_blocks))


def window_tile(start, q, k_padded, v_padded, window: int, scale) -> jax.Array:
    """Attention of a tile over the keys ``t - w < s <= t`` (``window`` = w, at most T).

    ``k_padded``/``v_padded`` hold ``w - 1`` zero rows before position 0 (and
    zeros after the end), so the tile's key span ``[start - w + 1, start + tile)``
    is one slice of ``tile + w - 1`` rows.
    """
    tile = q.shape[1]
    span = tile + window - 1
    keys = jax.lax.dynamic_slice_in_dim(k_padded, start, span, axis=1)
    values = jax.lax.dynamic_slice_in_dim(v_padded, start, span, axis=1)
    key_positions = start - (window - 1) + jnp.arange(span, dtype=jnp.int32)
    queries = tile_positions(start, tile)[:, None]
    allowed = (key_positions <= queries) & (key_positions > queries - window) & (key_positions >= 0)
    scores = jnp.einsum("btkgd,bskd->btkgs", q, keys) * scale
    return jnp.einsum("btkgs,bskd->btkgd", core.masked_softmax(scores, allowed[None, :, None, None, :]), values)


# ----------------------------------------------------------------------------- entry points

_jit = functools.partial(jax.jit, static_argnames=("cfg",))


@_jit
def compress_kv(k, v, mlp, *, cfg):
    dtype = core.compute_dtype(k.dtype)
    return (compress(k.astype(dtype), cfg, None if mlp is None else mlp["key"]),
            compress(v.astype(dtype), cfg, None if mlp is None else mlp["value"]))


def _compressed_tiles(q, k_cmp, v_cmp, cfg, tile_result):
    """Maps ``tile_result(start, out, probs)`` over the query tiles of the compressed branch."""
    dtype = core.compute_dtype(q.dtype)
    k_cmp, v_cmp = k_cmp.astype(dtype), v_cmp.astype(dtype)
    scale = cfg.softmax_scale(q.shape[-1])

    def body(start, q_tile):
        out, probs = compressed_tile(start, q_tile, k_cmp, v_cmp, cfg, scale)
        return tile_result(start, out, probs)

    queries = core.group_queries(q.astype(dtype), k_cmp.shape[2])
    return core.map_query_tiles(body, q.shape[1], core.tile_size(q.shape[1], cfg.query_tile), (queries,))


@_jit
def compressed_attention(q, k_cmp, v_cmp, *, cfg):
    out = _compressed_tiles(q, k_cmp, v_cmp, cfg, lambda start, out, probs: out)
    return core.ungroup_queries(out).astype(q.dtype)


@_jit
def block_scores(q, k_cmp, *, cfg):
    num_select = core.num_selection_blocks(q.shape[1], cfg.select_size)
    return _compressed_tiles(q, k_cmp, k_cmp, cfg,
                             lambda start, out, probs: selection_scores(probs, cfg, num_select))


select_blocks = _jit(select)


def _grouped(q, k, v):
    dtype = core.compute_dtype(q.dtype)
    return core.group_queries(q.astype(dtype), k.shape[2]), k.astype(dtype), v.astype(dtype)


@_jit
def selected_attention(q, k, v, block_ids, *, cfg):
    queries, k, v = _grouped(q, k, v)
    length, select_size = q.shape[1], cfg.select_size
    num_select = core.num_selection_blocks(length, select_size)

    def as_blocks(x):  # [B, T, Hkv, D] -> [B, Hkv, Ns, l', D], zero-padded to whole blocks
        x = jnp.pad(x, [(0, 0), (0, num_select * select_size - length), (0, 0), (0, 0)])
        return jnp.moveaxis(x.reshape(x.shape[0], num_select, select_size, *x.shape[2:]), 3, 1)

    k_blocks, v_blocks, scale = as_blocks(k), as_blocks(v), cfg.softmax_scale(q.shape[-1])
    out = core.map_query_tiles(
        lambda start, q_tile, ids_tile: selected_tile(start, q_tile, ids_tile, k_blocks, v_blocks, scale),
        length, core.tile_size(length, cfg.query_tile), (queries, block_ids.astype(jnp.int32)))
    return core.ungroup_queries(out).astype(q.dtype)


@_jit
def sliding_window_attention(q, k, v, *, cfg):
    queries, k, v = _grouped(q, k, v)
    length = q.shape[1]
    window, tile = min(cfg.window, max(length, 1)), core.tile_size(length, cfg.query_tile)
    tail = -(-length // tile) * tile - length

    def padded(x):  # w - 1 zero rows before position 0, the tiles' padding after the end
        return jnp.pad(x, [(0, 0), (window - 1, tail), (0, 0), (0, 0)])

    k_padded, v_padded, scale = padded(k), padded(v), cfg.softmax_scale(q.shape[-1])
    out = core.map_query_tiles(
        lambda start, q_tile: window_tile(start, q_tile, k_padded, v_padded, window, scale),
        length, tile, (queries,))
    return core.ungroup_queries(out).astype(q.dtype)


@_jit
def compressed_and_selection(q, k_cmp, v_cmp, *, cfg):
    """The compressed branch ``[B, T, Hq, D]`` and the selected ids ``[B, T, Hkv, n]``.

    Per query tile, the compressed probabilities give the branch output, the
    block scores and the selection in one pass (no ``[T, Ns]`` score array).
    """
    num_select = core.num_selection_blocks(q.shape[1], cfg.select_size)

    def compressed_and_ids(start, out, probs):
        positions = tile_positions(start, out.shape[1])[None, :, None]
        return out, select(selection_scores(probs, cfg, num_select), positions, cfg)

    compressed, block_ids = _compressed_tiles(q, k_cmp, v_cmp, cfg, compressed_and_ids)
    return core.ungroup_queries(compressed).astype(q.dtype), block_ids
