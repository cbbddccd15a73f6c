"""Building blocks of ``jax_topk.nsa``: masked attention, query tiling, the
map from compression-block to selection-block scores, and cu_seqlens packing.

Shapes follow ``nsa``: queries are grouped as ``[B, T, Hkv, G, D]`` (query head
``h`` reads KV head ``h // G``), keys and values are ``[B, T, Hkv, D]``.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

# NSAConfig.implementation: which code runs the branches (_nsa_dispatch.plan decides).
IMPLEMENTATIONS = ("auto", "xla", "pallas")


def compute_dtype(dtype) -> jnp.dtype:
    """Attention math runs in float32, or float64 for float64 inputs."""
    return jnp.promote_types(dtype, jnp.float32)


def gated_sum(outputs, gates, dtype) -> jax.Array:
    """``nsa_attention``'s mix: ``outputs[i]`` times ``gates[i]`` (each
    broadcastable to it), summed in branch order in the compute dtype,
    rounded to ``dtype``. One definition for the plain path and the selected
    kernel's epilogue (``_nsa_pallas``), so both mix in the same order."""
    compute = compute_dtype(dtype)
    return sum(g.astype(compute) * out.astype(compute) for g, out in zip(gates, outputs)).astype(dtype)


def round_to(x: jax.Array, dtype) -> jax.Array:
    """``x`` rounded to ``dtype``'s precision, kept in ``x``'s dtype; the gradient
    passes unrounded (a bfloat16 cast would round the cotangent too). Exact:
    ``rounded - x`` is exact for neighbours, and so is ``x + (rounded - x)``."""
    return x + lax.stop_gradient(x.astype(dtype).astype(x.dtype) - x)


def group_queries(q: jax.Array, num_kv_heads: int) -> jax.Array:
    """``[B, T, Hq, D] -> [B, T, Hkv, G, D]``: consecutive query heads share a KV head."""
    b, t, hq, d = q.shape
    return q.reshape(b, t, num_kv_heads, hq // num_kv_heads, d)


def ungroup_queries(x: jax.Array) -> jax.Array:
    """``[B, T, Hkv, G, D] -> [B, T, Hq, D]``."""
    b, t, hkv, g, d = x.shape
    return x.reshape(b, t, hkv * g, d)


def masked_softmax(scores: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax over the last axis where ``mask`` holds, zero elsewhere.

    A row with no allowed entry (or no entry at all) gives zeros, and the
    gradient is finite everywhere: masked scores are replaced by -inf before
    ``exp`` (so no inf ever meets a zero cotangent), and the row maximum is a
    constant shift (stop_gradient: softmax does not depend on it).
    """
    scores = jnp.where(mask, scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True, initial=-jnp.inf)
    row_max = lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
    weights = jnp.exp(scores - row_max)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    return weights / jnp.where(total > 0, total, 1.0)


def map_query_tiles(body: Callable, length: int, tile: int, tiled: tuple[jax.Array, ...]):
    """Runs ``body(start, *tiles)`` over consecutive query tiles with ``lax.map``.

    ``tiled`` arrays have the query axis at position 1 (``[B, T, ...]``); each
    is zero-padded to a multiple of ``tile`` and cut into ``[B, tile, ...]``
    pieces. ``body`` returns a pytree of ``[B, tile, ...]`` arrays, which come
    back concatenated as ``[B, length, ...]`` (padded queries dropped).

    The body is rematerialised (``jax.checkpoint``), so under ``jax.grad`` the
    loop saves only its inputs and recomputes each tile's scores in the
    backward pass: training memory stays O(T * tile) like the forward pass.
    """
    num_tiles = -(-length // tile)
    padding = num_tiles * tile - length

    def split(x):
        x = jnp.pad(x, [(0, 0), (0, padding)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape(x.shape[0], num_tiles, tile, *x.shape[2:]), 1, 0)

    def merge(y):
        y = jnp.moveaxis(y, 0, 1)
        return y.reshape(y.shape[0], num_tiles * tile, *y.shape[3:])[:, :length]

    starts = jnp.arange(num_tiles, dtype=jnp.int32) * tile
    step = jax.checkpoint(lambda args: body(*args), prevent_cse=False)
    return jax.tree.map(merge, lax.map(step, (starts, *map(split, tiled))))


def tile_size(length: int, query_tile: int) -> int:
    """The configured tile, never larger than the sequence (no padding of short inputs)."""
    return max(1, min(query_tile, length))


def num_compressed_blocks(length: int, block_size: int, stride: int) -> int:
    """Complete compression blocks ``[i*d, i*d + l)`` inside ``length`` tokens."""
    return 0 if length < block_size else (length - block_size) // stride + 1


def num_selection_blocks(length: int, select_size: int) -> int:
    """Selection blocks ``[j*l', (j+1)*l')`` covering ``length`` tokens (the last may be partial)."""
    return -(-length // select_size)


def compressed_visible(positions: jax.Array, num_blocks: int, block_size: int, stride: int) -> jax.Array:
    """``[..., num_blocks]`` mask: compression block i lies wholly at or before the query."""
    block_ends = jnp.arange(num_blocks) * stride + block_size - 1
    return block_ends <= positions[..., None]


def compression_to_selection(probs: jax.Array, block_size: int, stride: int, select_size: int,
                             num_select: int) -> jax.Array:
    """Maps compression-block scores ``[..., Nc]`` to selection-block scores ``[..., Ns]`` (eq. 9).

    Selection block j collects every compression block that overlaps it,
    weighted by the overlap in units of the stride d:
    ``score[j] = sum_c p[c] * |[c*d, c*d + l) & [j*l', (j+1)*l')| / d``.
    This is the paper's double sum over ``m < l'/d`` and ``n < l/d`` with the
    index ``(l'/d)*j + m - n`` (the printed ``- m`` would credit block j with
    blocks that lie in block j - 1). It is computed as two box filters over
    stride-long chunks: each chunk u gets the sum of the l/d compression blocks
    that contain it, and each selection block sums its l'/d chunks.
    """
    per_block, per_select = block_size // stride, select_size // stride
    num_chunks = num_select * per_select
    num_compressed = probs.shape[-1]
    padded = jnp.pad(probs, [(0, 0)] * (probs.ndim - 1)
                     + [(per_block - 1, max(0, num_chunks - num_compressed))])
    # chunk u lies in compression blocks u - per_block + 1 .. u
    chunk_scores = sum(padded[..., per_block - 1 - r: per_block - 1 - r + num_chunks] for r in range(per_block))
    return chunk_scores.reshape(*probs.shape[:-1], num_select, per_select).sum(axis=-1)


def packed_index(cu_seqlens: jax.Array, max_len: int) -> tuple[jax.Array, jax.Array]:
    """``[S, max_len]`` packed-token index of every padded slot and whether it is a real token."""
    starts, lengths = cu_seqlens[:-1], cu_seqlens[1:] - cu_seqlens[:-1]
    offsets = jnp.arange(max_len, dtype=cu_seqlens.dtype)
    real = offsets < lengths[:, None]
    return jnp.where(real, starts[:, None] + offsets, 0), real


def pad_sequences(x: jax.Array, index: jax.Array, real: jax.Array) -> jax.Array:
    """Packed ``[1, total, ...]`` -> padded ``[S, max_len, ...]`` (zeros past each length)."""
    gathered = x[0][index]
    return jnp.where(real.reshape(*real.shape, *(1,) * (gathered.ndim - 2)), gathered, 0)


def unpad_sequences(y: jax.Array, cu_seqlens: jax.Array, total: int) -> jax.Array:
    """Padded ``[S, max_len, ...]`` -> packed ``[1, total, ...]``.

    Tokens after ``cu_seqlens[-1]``, and tokens past ``max_len`` within their
    sequence (only possible with a too-small traced ``max_seqlen``), get zeros.
    """
    positions = jnp.arange(total, dtype=cu_seqlens.dtype)
    # the last sequence starting at or before the token holds it (empty sequences are skipped)
    sequence = jnp.clip(jnp.searchsorted(cu_seqlens, positions, side="right") - 1, 0, y.shape[0] - 1)
    offset = positions - cu_seqlens[sequence]
    inside = (positions < cu_seqlens[-1]) & (offset < y.shape[1])
    gathered = y[sequence, jnp.clip(offset, 0, y.shape[1] - 1)]
    return jnp.where(inside.reshape(total, *(1,) * (gathered.ndim - 1)), gathered, 0)[None]
