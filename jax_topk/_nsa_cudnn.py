"""cuDNN's flash attention for two NSA branches (CUDA GPUs, bfloat16 and float16).

* ``window_attention``: the sliding-window branch is cuDNN's causal
  sliding-window attention as it is.
* ``compressed_attention``: the compressed branch, with the log-sum-exp the
  block-score kernel needs, as two causal flash attentions. Query t sees
  compressed block i iff ``i*d + l - 1 <= t``. Split t = a*d + r (row a,
  residue r) and write l = m*d (d divides l): the rule becomes ``i <= a - m``
  for r < d - 1 and ``i <= a - m + 1`` for r = d - 1. So the queries of
  residues 0 .. d-2, rows a >= m, shifted up by m rows and laid side by side
  as extra query heads, are plain causal attention over the compressed keys
  (row a - m sees keys 0 .. a - m), and so are the queries of residue d - 1
  shifted by m - 1. Every query attends the same keys with the same scores as
  in the compressed kernel; only the flash kernel is cuDNN's, which measured
  about twice the Pallas kernel's FLOP rate on an H200
  (``benchmarks/results/NOTES.md``). Its backward pass is cuDNN's as well.

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


def _causal_rows(attention: Attention, rows, k, v, scale: float):
    """``attention`` of ``rows [B, L, R, Hq, D]`` (R residues of L query rows,
    row j seeing keys 0 .. j) over ``k``, ``v`` ``[B, S, Hkv, D]``, the residues
    laid out as query heads, KV head major: each KV head's ``R * G`` query heads
    read it (GQA), so the keys are not copied per residue (laying the residues
    out first and copying the keys measured the same).
    Returns ``(out [B, L, R, Hq, D], lse [B, L, R, Hq] float32)``."""
    b, length, residues, q_heads, dim = rows.shape
    kv_heads = k.shape[2]
    groups = q_heads // kv_heads
    # cuDNN's backward pass takes even lengths only. Padded keys come last: a real
    # row j < S never sees them, and padded rows are dropped.
    even = lambda x: jnp.pad(x, [(0, 0), (0, x.shape[1] % 2), (0, 0), (0, 0)])
    heads = rows.reshape(b, length, residues, kv_heads, groups, dim).transpose(0, 1, 3, 2, 4, 5)
    out, lse = attention(even(heads.reshape(b, length, kv_heads * residues * groups, dim)), even(k), even(v), scale)
    out = out[:, :length].reshape(b, length, kv_heads, residues, groups, dim).transpose(0, 1, 3, 2, 4, 5)
    lse = lse[:, :length].reshape(b, length, kv_heads, residues, groups).transpose(0, 1, 3, 2, 4)
    return out.reshape(rows.shape), lse.reshape(rows.shape[:4]).astype(jnp.float32)


def _by_row_and_residue(rest, last, first_rows: int, fill):
    """``[B, A, d, ...]`` from the rows a >= m of residues 0 .. d-2 (``rest``,
    A - m rows) and the rows a >= m - 1 of residue d - 1 (``last``), ``fill``
    everywhere else (queries that see no block). A pad, then ``last`` written
    in place: XLA writes the result in about one pass (a concatenation of the
    two measured 4x slower on an H200: benchmarks/results/NOTES.md)."""
    widths = [(0, 0), (first_rows, 0), (0, 1)] + [(0, 0)] * (rest.ndim - 3)
    return jnp.pad(rest, widths, constant_values=fill).at[:, first_rows - 1:, -1:].set(last)


def compressed_attention(q, k_cmp, v_cmp, cfg, *, lse_length: int,
                         attention: Attention = cudnn_causal_attention):
    """The compressed branch and its log-sum-exp, by causal flash attention per residue class.

    q ``[B, T, Hq, D]``; k_cmp, v_cmp ``[B, Nc, Hkv, D]`` in q's dtype. Returns
    ``(out [B, T, Hq, D] in q's dtype, lse [B, lse_length, Hkv, G] float32)``
    as ``_nsa_pallas.compressed_attention`` does: the log-sum-exp in base 2 of
    the base-2 scores, +inf for queries that see no block and past T.
    """
    b, length, q_heads, dim = q.shape
    kv_heads = k_cmp.shape[2]
    d, m = cfg.stride, cfg.block_size // cfg.stride
    lse_shape = (b, lse_length, kv_heads, q_heads // kv_heads)
    if not core.num_compressed_blocks(length, cfg.block_size, d):  # T < l: no query sees a block
        return jnp.zeros_like(q), jnp.full(lse_shape, jnp.inf, jnp.float32)
    rows = -(-length // d)
    grid = jnp.pad(q, [(0, 0), (0, rows * d - length), (0, 0), (0, 0)]).reshape(b, rows, d, q_heads, dim)
    run = lambda part: _causal_rows(attention, part, k_cmp, v_cmp, cfg.softmax_scale(dim))
    last = run(grid[:, m - 1:, d - 1:])  # residue d - 1: row a - m + 1 sees blocks 0 .. a - m + 1
    if d > 1 and rows > m:  # residues 0 .. d-2: row a - m sees blocks 0 .. a - m
        rest = run(grid[:, m:, :d - 1])
    else:
        rest = (jnp.zeros((b, rows - m, d - 1, q_heads, dim), q.dtype),
                jnp.zeros((b, rows - m, d - 1, q_heads), jnp.float32))
    out = _by_row_and_residue(rest[0].astype(q.dtype), last[0].astype(q.dtype), m, 0)
    lse = _by_row_and_residue(rest[1], last[1], m, jnp.inf)
    out = out.reshape(b, rows * d, q_heads, dim)[:, :length]
    lse = lse.reshape(b, rows * d, *lse_shape[2:])[:, :length] * math.log2(math.e)
    return out, jnp.pad(lse, [(0, 0), (0, lse_length - length), (0, 0), (0, 0)], constant_values=jnp.inf)
