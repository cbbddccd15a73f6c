"""A Pallas kernel for NSA's selected branch (forward), one program per
(query token, KV head).

The plain-JAX branch gathers ``n * l'`` keys per query into memory
(``_nsa_tiled.selected_tile``): at T = 64K on an H200 that took 226 ms
(``benchmarks/results/NOTES.md``). Here a program holds the GQA group's
``G = Hq / Hkv`` query heads ``[G, D]`` (the NSA paper's layout: the group
shares its selection, so each selected block is read once for all G heads),
walks its ``n`` selected blocks with an online softmax, and writes ``[G, D]``.
Each block is one ``[l', D]`` slice of the KV head's keys and values; keys
after the query and ids of -1 are masked, as in ``selected_tile``.

Status: equal to the plain-JAX branch in Pallas's interpret mode
(tests/test_nsa.py) and on an H200 through Triton (float32 to 6e-7, bfloat16
to one output ulp), where it took 19.7 ms at T = 64K against the plain
branch's 226.7 ms (benchmarks/results/NOTES.md). Not yet dispatched by
``nsa.selected_attention``: that needs a backward (or the plain branch's VJP
under a custom_vjp) and GPU tests of the dispatched path.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jax_topk import _nsa_core as core


def _selected_kernel(ids_ref, q_ref, k_ref, v_ref, o_ref, *, length, kv_heads, select_size, num_ids, scale):
    row = pl.program_id(0)  # (b, t, h) flattened, h fastest
    position = (row // kv_heads) % length
    q = q_ref[...]  # [G, D]
    groups, dim = q.shape
    offsets = jnp.arange(select_size, dtype=jnp.int32)

    def visit(j, carry):
        m, l, acc = carry
        block = ids_ref[j]
        start = jnp.maximum(block, 0) * select_size
        keys = k_ref[pl.ds(start, select_size), :]
        values = v_ref[pl.ds(start, select_size), :]
        scores = jnp.dot(q, keys.T, preferred_element_type=jnp.float32) * scale  # [G, l']
        allowed = (block >= 0) & (start + offsets <= position)
        scores = jnp.where(allowed[None, :], scores, -jnp.inf)
        m_new = jnp.maximum(m, scores.max(axis=1))
        # Rows that have seen no allowed key keep m = -inf: shift by 0 there.
        shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(scores - shift[:, None])
        rescale = jnp.exp(jnp.where(m == -jnp.inf, -jnp.inf, m - shift))
        l = l * rescale + p.sum(axis=1)
        acc = acc * rescale[:, None] + jnp.dot(p.astype(values.dtype), values, preferred_element_type=jnp.float32)
        return m_new, l, acc

    init = (jnp.full((groups,), -jnp.inf, jnp.float32), jnp.zeros((groups,), jnp.float32),
            jnp.zeros((groups, dim), jnp.float32))
    _, l, acc = jax.lax.fori_loop(0, num_ids, visit, init)
    o_ref[...] = (acc / jnp.where(l == 0, 1.0, l)[:, None]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("cfg", "interpret"))
def selected_attention(q, k, v, block_ids, *, cfg, interpret: bool = False):
    """``nsa.selected_attention`` by the kernel: q ``[B, T, Hq, D]``, k and v
    ``[B, T, Hkv, D]``, block_ids int32 ``[B, T, Hkv, n]`` -> ``[B, T, Hq, D]``."""
    batch, length, q_heads, dim = q.shape
    kv_heads = k.shape[2]
    groups = q_heads // kv_heads
    select_size = cfg.select_size
    padded = core.num_selection_blocks(length, select_size) * select_size
    num_ids = block_ids.shape[-1]

    def head_major(x):  # [B, T, Hkv, D] -> [B, Hkv, T', D], zero rows past T (always masked)
        return jnp.moveaxis(jnp.pad(x, [(0, 0), (0, padded - length), (0, 0), (0, 0)]), 2, 1)

    rows = batch * length * kv_heads
    queries = core.group_queries(q, kv_heads).reshape(rows, groups, dim)
    # Ids past the last block select nothing (as in the plain branch); every
    # slice the kernel reads then lies within the padded keys.
    ids = block_ids.astype(jnp.int32).reshape(rows, num_ids)
    ids = jnp.where(ids < padded // select_size, ids, -1)

    def kv_block(row):  # the row's (batch, KV head) slab of keys or values
        return row // (length * kv_heads), row % kv_heads, 0, 0

    kernel = functools.partial(_selected_kernel, length=length, kv_heads=kv_heads, select_size=select_size,
                               num_ids=num_ids, scale=cfg.softmax_scale(dim))
    out = pl.pallas_call(
        kernel,
        grid=(rows,),
        in_specs=[
            pl.BlockSpec((None, num_ids), lambda r: (r, 0)),
            pl.BlockSpec((None, groups, dim), lambda r: (r, 0, 0)),
            pl.BlockSpec((None, None, padded, dim), kv_block),
            pl.BlockSpec((None, None, padded, dim), kv_block),
        ],
        out_specs=pl.BlockSpec((None, groups, dim), lambda r: (r, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, groups, dim), q.dtype),
        interpret=interpret,
    )(ids, queries, head_major(k), head_major(v))
    return out.reshape(batch, length, q_heads, dim)
