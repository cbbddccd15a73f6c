"""Dense NSA for tests: every branch with explicit ``[T, T]`` (or ``[T, Nc]``)
masks, written apart from the tiled path (no tiles, no shifted sums, no top_k).
Memory O(T^2)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def _softmax(scores: jax.Array, mask) -> jax.Array:
    """Masked softmax; all-masked rows give zeros (masked scores are a finite -1e30, so no NaN)."""
    if scores.shape[-1] == 0:
        return scores
    probs = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
    return probs * jnp.any(mask, axis=-1, keepdims=True)


def _compress(x: jax.Array, cfg, mlp: dict | None) -> jax.Array:
    """``[B, T, H, D] -> [B, Nc, H, D]`` by gathering each block's tokens."""
    length = x.shape[1]
    num_blocks = (length - cfg.block_size) // cfg.stride + 1 if length >= cfg.block_size else 0
    index = np.arange(num_blocks)[:, None] * cfg.stride + np.arange(cfg.block_size)[None, :]
    blocks = x[:, index]  # [B, Nc, l, H, D]
    if mlp is None:
        return blocks.mean(axis=2)
    blocks = blocks + mlp["pos"].astype(x.dtype)[None, None, :, None, :]
    batch, _, _, heads, dim = blocks.shape
    flat = blocks.transpose(0, 1, 3, 2, 4).reshape(batch, num_blocks, heads, -1)
    hidden = jax.nn.gelu(flat @ mlp["w1"].astype(x.dtype) + mlp["b1"].astype(x.dtype))
    return hidden @ mlp["w2"].astype(x.dtype) + mlp["b2"].astype(x.dtype)


def _overlap(num_compressed: int, num_select: int, cfg) -> np.ndarray:
    """``[Nc, Ns]``: tokens shared by compression block c and selection block j, over d."""
    c_start = np.arange(num_compressed)[:, None] * cfg.stride
    j_start = np.arange(num_select)[None, :] * cfg.select_size
    shared = np.minimum(c_start + cfg.block_size, j_start + cfg.select_size) - np.maximum(c_start, j_start)
    return np.maximum(shared, 0) / cfg.stride


def _attend(q, k, v, mask, scale):
    """Dense attention, ``q`` ``[B, T, H, D]``, ``mask`` ``[B or 1, H or 1, T, S]``."""
    probs = _softmax(jnp.einsum("bthd,bshd->bhts", q, k) * scale, mask)
    return jnp.einsum("bhts,bshd->bthd", probs, v), probs


def _selected_mask(p_cmp, cfg, num_kv_heads: int, length: int) -> jax.Array:
    """``[B, Hkv, T, T]``: the tokens of each query's selected blocks, causal."""
    batch, q_heads, _, num_compressed = p_cmp.shape
    num_select = -(-length // cfg.select_size)
    group_probs = p_cmp.reshape(batch, num_kv_heads, q_heads // num_kv_heads, length, num_compressed).sum(2)
    scores = group_probs @ jnp.asarray(_overlap(num_compressed, num_select, cfg), p_cmp.dtype)
    positions = np.arange(length)
    own = positions[:, None] // cfg.select_size
    blocks = np.arange(num_select)[None, :]
    causal_blocks = blocks <= own
    forced = (blocks < cfg.initial_blocks) | (blocks > own - cfg.local_blocks)
    rank_key = jnp.where(causal_blocks, jnp.where(forced, jnp.inf, scores), -jnp.inf)
    order = jnp.argsort(-rank_key, axis=-1, stable=True)  # best first, ties to the lower block
    chosen = (jnp.argsort(order, axis=-1) < cfg.num_selected) & causal_blocks
    token_chosen = chosen[..., positions // cfg.select_size]
    return token_chosen & (positions[None, :] <= positions[:, None])


@functools.partial(jax.jit, static_argnames=("cfg",))
def dense_nsa(q, k, v, gates, mlp: dict | None, *, cfg) -> jax.Array:
    dtype = jnp.promote_types(q.dtype, jnp.float32)
    out_dtype = q.dtype
    q, k, v, gates = (x.astype(dtype) for x in (q, k, v, gates))
    _, length, q_heads, dim = q.shape
    kv_heads = k.shape[2]
    group = q_heads // kv_heads
    scale = cfg.softmax_scale(dim)
    positions = np.arange(length)
    causal = positions[None, :] <= positions[:, None]

    k_cmp = _compress(k, cfg, None if mlp is None else mlp["key"])
    v_cmp = _compress(v, cfg, None if mlp is None else mlp["value"])
    # rounded to the input dtype as nsa_attention does (the gradient unrounded)
    k_cmp, v_cmp = (x + jax.lax.stop_gradient(x.astype(out_dtype).astype(dtype) - x) for x in (k_cmp, v_cmp))
    block_ends = np.arange(k_cmp.shape[1]) * cfg.stride + cfg.block_size - 1
    visible = block_ends[None, :] <= positions[:, None]
    o_cmp, p_cmp = _attend(q, jnp.repeat(k_cmp, group, axis=2), jnp.repeat(v_cmp, group, axis=2),
                           visible, scale)

    selected = jnp.repeat(_selected_mask(p_cmp, cfg, kv_heads, length), group, axis=1)
    k_full, v_full = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    o_slc, _ = _attend(q, k_full, v_full, selected, scale)
    window = causal & (positions[:, None] - positions[None, :] < cfg.window)
    o_win, _ = _attend(q, k_full, v_full, window, scale)

    out = gates[..., 0, None] * o_cmp + gates[..., 1, None] * o_slc + gates[..., 2, None] * o_win
    return out.astype(out_dtype)
