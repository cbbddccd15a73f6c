"""cuDNN's flash attention for two NSA branches (CUDA GPUs, bfloat16 and float16).

* ``window_attention``: the sliding-window branch is cuDNN's causal
  sliding-window attention as it is.
* ``compressed_rows``: the compressed branch, with the log-sum-exp the
  block-score kernel needs, as ONE causal flash attention. Query t sees
  compressed block i iff ``i*d + l - 1 <= t``; shifted by ``l - 1`` and split
  into rows of d (``t - l + 1 = a*d + r``) the rule is ``i <= a`` for every
  residue r, so the shifted queries laid out as d times the query heads are
  plain top-left causal attention over the compressed keys. Every query
  attends the same keys with the same scores as in the compressed kernel;
  only the flash kernel is cuDNN's, which measured about twice the Pallas
  kernel's FLOP rate on an H200 (``benchmarks/results/NOTES.md``). Its
  backward pass is cuDNN's as well. The output stays in cuDNN's layout: the
  selected kernel's gate mix reads it there (``compressed_attention`` gives
  the branch's ``[B, T, Hq, D]``).

The log-sum-exp comes from ``jax._src.cudnn``'s attention: the public
``jax.nn.dot_product_attention(..., return_residual=True)`` rounds it to the
inputs' dtype, too coarse for ranking blocks; ``available()`` says whether
this JAX has it, and ``_nsa_dispatch`` falls back to the Pallas kernel if not.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from jax_topk import _nsa_core as core

DTYPES = (jnp.bfloat16, jnp.float16)
MAX_HEAD_DIM = 128

# (q [B, Tq, N, D], k, v [B, S, Nkv, D], scale) -> (out [B, Tq, N, D], lse [B, Tq, N] float32):
# top-left causal attention (row j sees keys 0 .. j), lse in base e of the scaled scores.
Attention = Callable[[jax.Array, jax.Array, jax.Array, float], tuple[jax.Array, jax.Array]]


def supports(dtype, head_dim: int) -> bool:
    """Whether cuDNN's flash attention takes queries of this dtype and head size."""
    return jnp.dtype(dtype) in map(jnp.dtype, DTYPES) and head_dim % 8 == 0 and head_dim <= MAX_HEAD_DIM


def available() -> bool:
    """Whether this JAX exposes cuDNN attention with a float32 log-sum-exp."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fused
    except ImportError:
        return False
    return hasattr(fused, "dot_product_attention") and hasattr(fused, "MaskType")


def cudnn_causal_attention(q, k, v, scale: float):
    """Causal flash attention by cuDNN: ``(out, lse [B, Tq, N] float32)``."""
    from jax._src.cudnn import fused_attention_stablehlo as fused

    out, lse = fused.dot_product_attention(q, k, v, scale=scale, mask_type=fused.MaskType.CAUSAL,
                                           return_residual=True)
    return out, jnp.swapaxes(lse, 1, 2)  # cuDNN's residual is [B, N, Tq] whatever the layout


def window_attention(q, k, v, cfg):
    """The sliding-window branch: cuDNN's causal attention over the last ``w`` tokens."""
    length = q.shape[1]
    window = min(cfg.window, max(length, 1))
    # cuDNN's training path takes even lengths only (a window is a bias there): one
    # more token at the end changes no earlier output (causal), and is dropped.
    q, k, v = (jnp.pad(x, [(0, 0), (0, length % 2), (0, 0), (0, 0)]) for x in (q, k, v))
    out = jax.nn.dot_product_attention(q, k, v, scale=cfg.softmax_scale(q.shape[-1]), is_causal=True,
                                       local_window_size=(window - 1, 0), implementation="cudnn")
    return out[:, :length]


def compressed_rows(q, k_cmp, v_cmp, cfg, *, lse_length: int, attention: Attention = cudnn_causal_attention):
    """The compressed branch in cuDNN's layout and its log-sum-exp: one causal flash attention.

    Query t sees compressed block i iff ``i*d + l - 1 <= t``. With the query
    shifted by ``l - 1`` (``t' = t - l + 1 = a*d + r``) that is ``i <= a``: the
    queries from ``l - 1`` on, cut into rows of d and laid out as d times the
    query heads (KV head major, so each KV head's ``d * G`` query heads read it
    by GQA), are top-left causal attention over the compressed keys, square
    (rows = Nc). q ``[B, T, Hq, D]``; k_cmp, v_cmp ``[B, Nc, Hkv, D]`` in q's dtype.

    Returns ``(rows, lse)``: ``rows [B, R, Hkv*d, G, D]`` in q's dtype, with
    ``rows[b, a, h*d + r]`` the output of query ``a*d + r + l - 1`` for KV
    head h's G query heads (R >= Nc: rows past Nc, and queries past T, are
    padding), or None when T < l (no query sees a block); ``lse [B,
    lse_length, Hkv, G]`` float32 as ``_nsa_pallas.compressed_attention``
    gives it: base 2 of the base-2 scores, +inf for queries that see no block
    and past T. ``rows_to_tokens`` gives the branch's own layout; the selected
    kernel's gate mix reads ``rows`` as they are (no pass over the output).
    """
    b, length, q_heads, dim = q.shape
    kv_heads = k_cmp.shape[2]
    groups = q_heads // kv_heads
    d, shift = cfg.stride, cfg.block_size - 1
    num_blocks = core.num_compressed_blocks(length, cfg.block_size, d)
    lse_shape = (b, lse_length, kv_heads, groups)
    if not num_blocks:
        return None, jnp.full(lse_shape, jnp.inf, jnp.float32)
    # cuDNN's backward pass takes even lengths only. Padded keys come last: a real
    # row j < Nc never sees them, and padded rows are never read.
    rows = num_blocks + num_blocks % 2
    shifted = jnp.pad(q[:, shift:], [(0, 0), (0, rows * d - (length - shift)), (0, 0), (0, 0)])
    heads = shifted.reshape(b, rows, d, kv_heads, groups, dim).transpose(0, 1, 3, 2, 4, 5)
    even = lambda x: jnp.pad(x, [(0, 0), (0, rows - num_blocks), (0, 0), (0, 0)])
    out, lse = attention(heads.reshape(b, rows, kv_heads * d * groups, dim), even(k_cmp), even(v_cmp),
                         cfg.softmax_scale(dim))
    lse = lse.reshape(b, rows, kv_heads, d, groups).transpose(0, 1, 3, 2, 4).reshape(b, rows * d, kv_heads, groups)
    lse = lse[:, :length - shift].astype(jnp.float32) * math.log2(math.e)
    lse = jnp.pad(lse, [(0, 0), (shift, lse_length - length), (0, 0), (0, 0)], constant_values=jnp.inf)
    return out.astype(q.dtype).reshape(b, rows, kv_heads * d, groups, dim), lse


def rows_to_tokens(rows, cfg, q):
    """``compressed_rows``' output in the branch's layout ``[B, T, Hq, D]``
    and q's dtype (zeros for the queries before ``l - 1``, which see no
    block); ``q`` is the queries, or anything with their shape and dtype."""
    b, length, q_heads, dim = q.shape
    d, shift = cfg.stride, cfg.block_size - 1
    if rows is None:
        return jnp.zeros(q.shape, q.dtype)
    num_rows, kv_heads = rows.shape[1], rows.shape[2] // d
    tokens = rows.reshape(b, num_rows, kv_heads, d, -1, dim).transpose(0, 1, 3, 2, 4, 5)
    tokens = tokens.reshape(b, num_rows * d, q_heads, dim)[:, :length - shift]
    return jnp.pad(tokens, [(0, 0), (shift, 0), (0, 0), (0, 0)]).astype(q.dtype)


def compressed_attention(q, k_cmp, v_cmp, cfg, *, lse_length: int,
                         attention: Attention = cudnn_causal_attention):
    """The compressed branch and its log-sum-exp by ``compressed_rows``, in the branch's layout.

    Returns ``(out [B, T, Hq, D] in q's dtype, lse [B, lse_length, Hkv, G]
    float32)`` as ``_nsa_pallas.compressed_attention`` does.
    """
    rows, lse = compressed_rows(q, k_cmp, v_cmp, cfg, lse_length=lse_length, attention=attention)
    return rows_to_tokens(rows, cfg, q), lse
