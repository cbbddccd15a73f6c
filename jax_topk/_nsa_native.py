"""NSA's selection scores by the CUDA block-score kernel (``csrc/cuda/nsa.cu``).

The same scores as ``_nsa_pallas``'s block-score kernel (compressed attention
probabilities from the compressed branch's log-sum-exp, summed over each GQA
group and mapped to selection blocks by their overlap), on tensor cores:
Hopper's warpgroup products for groups of more than 8 heads on an H100/H200
(``JAX_TOPK_NSA_NO_WGMMA=1`` turns them off), else mma.sync with a warp per
two queries; the Pallas kernel's [256, 64] float32 scores per program left
Triton two programs per SM (NOTES.md). bfloat16 and
float16 on CUDA; the shapes it takes are ``jax_topk/nsa.h``'s, read through
the FFI module (``unsupported``). Equal to the Pallas kernel up to the order
of float sums.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_topk import _nsa_tiled as tiled
from jax_topk import _registry

_OP = "nsa_block_scores"


def unsupported(cfg, dtype, groups: int, dim: int) -> str | None:
    """Why the CUDA kernel cannot score these queries (None when it can)."""
    if _registry.kernel_target(_OP, "cuda", dtype) is None:
        return f"no CUDA block-score kernel for {np.dtype(dtype).name}"
    return _registry.nsa_block_scores_unsupported("cuda", groups, dim, cfg.block_size, cfg.stride,
                                                  cfg.select_size)


def block_scores(start, queries, k_cmp, lse, *, cfg, num_blocks: int, chunk: int, width: int, scale: float,
                 ranked: bool = False):
    """Selection scores ``[B, Hkv, chunk, width]`` (float32) of queries
    ``start .. start + chunk - 1``: queries ``[B, T', Hkv, G, D]``, k_cmp
    ``[B, Nk, Hkv, D]`` (its first ``num_blocks`` rows real), lse ``[B, T',
    Hkv, G]`` (base 2), ``scale`` the base-2 score scale. Blocks past what a
    query sees score 0. ``ranked``: what ``_nsa_tiled.rank_blocks`` makes of
    them instead (blocks after the query -inf, forced blocks +inf), written
    by the kernel, so that ``top_k`` takes them as they are. Under vmap the
    mapped axes become more items (one call). Raises ValueError, with
    ``unsupported``'s reason, for what the kernel cannot take.
    """
    kv_heads, groups, dim = queries.shape[-3:]
    why = unsupported(cfg, queries.dtype, groups, dim)
    if why is not None:
        raise ValueError(f"NSA's CUDA block-score kernel cannot take queries {tuple(queries.shape)} "
                         f"{np.dtype(queries.dtype).name}: {why}")
    out = jax.ShapeDtypeStruct(queries.shape[:-4] + (kv_heads, chunk, width), jnp.float32)
    if num_blocks == 0:  # shorter than one compression block: nothing is seen (and no keys to pass)
        scores = jnp.zeros(out.shape, out.dtype)
        if not ranked:
            return scores
        positions = jnp.reshape(start, ()).astype(jnp.int32) + jnp.arange(chunk, dtype=jnp.int32)
        return tiled.rank_blocks(scores, positions, cfg)
    target = _registry.kernel_target(_OP, "cuda", queries.dtype)
    call = jax.ffi.ffi_call(target, out, vmap_method="broadcast_all")
    return call(jnp.reshape(start, (1,)).astype(jnp.int32), queries, k_cmp, lse.astype(jnp.float32),
                num_blocks=np.int64(num_blocks), block_size=np.int64(cfg.block_size), stride=np.int64(cfg.stride),
                select_size=np.int64(cfg.select_size), scale=np.float32(scale), ranked=bool(ranked),
                initial_blocks=np.int64(cfg.initial_blocks), local_blocks=np.int64(cfg.local_blocks))
