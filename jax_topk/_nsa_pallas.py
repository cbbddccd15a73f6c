"""Pallas (Triton) kernels for NSA's compressed and selected branches: forward passes.

Forward kernels, each one program per (query tile, KV head), each holding the
GQA group's ``G = Hq / Hkv`` query heads together (the NSA paper's layout: the
group shares its keys and its selection):

* ``compressed_attention``: flash attention of the queries over the
  compressed keys, a query seeing block i iff ``i*d + l - 1 <= t``. Writes the
  branch output and each query row's log-sum-exp (in base 2, as every score
  here: see ``_score_scale``).
* ``block_scores``: recomputes the compressed scores with that log-sum-exp,
  so the probabilities are final without a ``[T, Hq, Nc]`` array, sums them
  over the group and maps them to selection blocks (eq. 9 as overlap weights)
  in the same pass, writing ``[tokens, Ns]`` selection scores per KV head.
  ``selection_ids`` runs it over chunks of queries and selects through
  ``jax_topk.top_k``, so memory stays O(T).
* ``selected_attention``: per (token, KV head) the group's ``[G, D]`` queries
  walk the ``n`` selected ``[l', D]`` blocks with an online softmax; given the
  other two branches' outputs and the gates, it also mixes the three, so
  ``nsa_attention``'s output is written once.

And the selected branch's backward (``selected_attention_bwd``): dq per
(token, KV head) as the forward; dk and dv per key block over the tokens that
chose it, in segments summed in order (deterministic, no atomics).

Each equals its plain-JAX branch in ``_nsa_tiled`` up to the order of float
sums and, for bfloat16, the rounding of the probabilities to bfloat16 before
they meet the values (as every flash-attention kernel does). Scores are
computed from operands in the input dtype (the compressed keys are rounded to
it, as ``nsa_attention`` does on every path), accumulated in float32; float32
inputs use IEEE float32 dots, never TF32.

Shape rules (``unsupported`` says which one fails; ``nsa`` falls back to the
plain path then): Triton blocks have power-of-two sizes and dots need every
dimension >= 16, so D, G, l' and l'/d are powers of two (D and l' >= 16,
G <= 128); G below 16 is padded with zero queries in the selected kernel.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from jax_topk import _nsa_core as core
from jax_topk import _nsa_native as native_scores
from jax_topk import _nsa_tiled as tiled
from jax_topk._sort import argsort

_MIN_DOT = 16          # Triton's dot needs every dimension >= 16
_MAX_GROUP = 128       # query heads per KV head the kernels take
_COMPRESSED_ROWS = 64  # query rows (tokens x G) of a compressed-attention program (at least G)
_TOKEN_QUANTUM = 128   # queries are padded to a multiple of this (and of every tile size here)
_KEYS_PER_STEP = 64    # compressed keys per online-softmax step
_SCORE_TOKENS = 16     # tokens per block-score program (the group-sum dot's M)
_SELECTION_CHUNK = 4096  # queries per block-score call: its [Hkv, chunk, Ns] scores bound the memory
_WIDTH_RUNS = 8        # at most this many score widths in selection_ids (one lax.map each)
# Tokens per program of the forced-block pass, which share those blocks (2, 16: slower; 8 within 1%).
# Its slots run as a loop, one K and V tile live at a time: 180 registers a thread where the unrolled
# slots held 246 (ncu, H200, forty-fifth session).
_FORCED_TOKENS = 4
# Triton launch parameters per kernel, (num_warps, num_stages): see benchmarks/results/NOTES.md.
# Every kernel names its launch: a pallas_call without Triton parameters takes jax's default GPU
# backend, Mosaic GPU in jax 0.10+, which stages whole blocks in shared memory.
LAUNCH = {"compressed": (4, 3), "block_scores": (4, 2), "selected": (4, 3), "selected_forced": (4, 2),
          "selected_dq": (4, 3), "selected_dkv": (4, 3), "sum_segments": (4, 3)}


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def unsupported(cfg, q_shape: tuple[int, ...], kv_heads: int) -> str | None:
    """Why the kernels cannot run these shapes (None when they can)."""
    dim, groups = q_shape[-1], q_shape[2] // kv_heads
    ratio = cfg.select_size // cfg.stride
    if not (_pow2(dim) and dim >= _MIN_DOT):
        return f"head_dim={dim} is not a power of two >= {_MIN_DOT}"
    if not (_pow2(groups) and groups <= _MAX_GROUP):
        return f"Hq/Hkv={groups} is not a power of two <= {_MAX_GROUP}"
    if not (_pow2(cfg.select_size) and cfg.select_size >= _MIN_DOT):
        return f"select_size={cfg.select_size} is not a power of two >= {_MIN_DOT}"
    if not _pow2(ratio):
        return f"select_size/stride={ratio} is not a power of two"
    return None


def _precision(dtype):
    """IEEE float32 dots for float32 operands (Triton's default would be TF32)."""
    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None


def _dot(a, b, dtype):
    return jnp.dot(a, b, precision=_precision(dtype), preferred_element_type=jnp.float32)


_LOG2_E = 1.4426950408889634


def _score_scale(scale: float) -> float:
    """The kernels' scores are in base 2 (log2(e) folded into the softmax
    scale), so each exponential is one ``exp2`` (a single ``ex2.approx``)
    rather than libdevice's ``expf``: on an H200 that took 16K tokens from
    7.26 to 6.94 ms (benchmarks/results/NOTES.md)."""
    return scale * _LOG2_E


def _online_softmax_step(carry, scores, values, dtype):
    """One flash-attention step: masked scores are -inf; a row that has seen no
    allowed key keeps m = -inf and shifts by 0."""
    m, l, acc = carry
    m_new = jnp.maximum(m, scores.max(axis=1))
    shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp2(scores - shift[:, None])
    rescale = jnp.exp2(jnp.where(m == -jnp.inf, -jnp.inf, m - shift))
    l = l * rescale + p.sum(axis=1)
    acc = acc * rescale[:, None] + _dot(p.astype(values.dtype), values, dtype)
    return m_new, l, acc


def _initial_carry(rows: int, dim: int):
    return (jnp.full((rows,), -jnp.inf, jnp.float32), jnp.zeros((rows,), jnp.float32),
            jnp.zeros((rows, dim), jnp.float32))


def _finish_softmax(carry, empty_lse: float):
    """``(out [rows, D], lse [rows])`` of a flash-attention carry: the
    normalised output (0 for a row that saw no key) and the log-sum-exp (base
    2), ``empty_lse`` for a row that saw no key."""
    m, l, acc = carry
    lse = jnp.where(l > 0, m + jnp.log2(jnp.where(l > 0, l, 1.0)), empty_lse)
    return acc / jnp.where(l == 0, 1.0, l)[:, None], lse


def _visible_blocks(last_position, cfg, num_blocks: int):
    """Compressed blocks wholly at or before ``last_position`` (blocks i with i*d + l - 1 <= t)."""
    seen = (jnp.maximum(last_position - (cfg.block_size - 1), -1) + cfg.stride) // cfg.stride
    return jnp.clip(seen, 0, num_blocks)


def _cdiv(a, b: int):
    return (a + b - 1) // b


def _compiler(kernel: str):
    num_warps, num_stages = LAUNCH[kernel]
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


# ----------------------------------------------------------------------------- compressed attention


def _compressed_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, cfg, num_tiles, num_blocks, keys_per_step,
                       scale):
    tokens, groups, dim = q_ref.shape
    rows = tokens * groups
    first = _reversed_tile(pl.program_id(0), num_tiles) * tokens
    q = q_ref[...].reshape(rows, dim)
    positions = first + jnp.arange(rows, dtype=jnp.int32) // groups
    steps = _cdiv(_visible_blocks(first + tokens - 1, cfg, num_blocks), keys_per_step)
    offsets = jnp.arange(keys_per_step, dtype=jnp.int32)

    def step(j, carry):
        start = j * keys_per_step
        keys = k_ref[pl.ds(start, keys_per_step), :]
        scores = _dot(q, keys.T, q.dtype) * scale
        ends = (start + offsets) * cfg.stride + cfg.block_size - 1
        scores = jnp.where(ends[None, :] <= positions[:, None], scores, -jnp.inf)
        return _online_softmax_step(carry, scores, v_ref[pl.ds(start, keys_per_step), :], q.dtype)

    # +inf where no block is visible: the block-score pass then gets exp(s - inf) = 0.
    out, lse = _finish_softmax(jax.lax.fori_loop(0, steps, step, _initial_carry(rows, dim)), jnp.inf)
    o_ref[...] = out.reshape(tokens, groups, dim).astype(o_ref.dtype)
    lse_ref[...] = lse.reshape(tokens, groups)


def padded_length(length: int) -> int:
    """Queries padded to whole selection chunks (a multiple of every tile size here)."""
    chunk = min(_SELECTION_CHUNK, -(-length // _TOKEN_QUANTUM) * _TOKEN_QUANTUM)
    return -(-length // chunk) * chunk


def _pad_tokens(x, size: int):
    """Zeros after the end of axis 1 (tokens or compressed blocks), up to ``size``."""
    return jnp.pad(x, [(0, 0), (0, size - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def _reversed_tile(r, num_tiles: int):
    """The query tile of program r: the longest tiles (last queries) first, so fewer
    programs are left running alone at the end."""
    return num_tiles - 1 - r % num_tiles


def _block_layout(cfg, length: int):
    """(keys per score step Bc, selection blocks per step Bs, steps) for a sequence of ``length``."""
    ratio = cfg.select_size // cfg.stride
    keys_per_step = _MIN_DOT * ratio  # so that Bs = Bc * d / l' = 16 (the map dot's N)
    steps = -(-core.num_selection_blocks(length, cfg.select_size) // _MIN_DOT)
    return keys_per_step, _MIN_DOT, steps


@functools.partial(jax.jit, static_argnames=("cfg", "interpret"))
def compressed_attention(q, k_cmp, v_cmp, *, cfg, interpret: bool = False):
    """The compressed branch and its log-sum-exp (base 2, of the base-2 scores).

    q ``[B, T, Hq, D]``; k_cmp, v_cmp ``[B, Nc, Hkv, D]`` in q's dtype. Returns
    ``(out [B, T, Hq, D], lse [B, T', Hkv, G])`` float32 with ``T'`` the
    padded length (+inf where a query sees no block).
    """
    batch, length, q_heads, dim = q.shape
    kv_heads = k_cmp.shape[2]
    groups = q_heads // kv_heads
    padded = padded_length(length)
    tokens = max(1, _COMPRESSED_ROWS // groups)
    num_tiles = padded // tokens
    score_keys, _, steps = _block_layout(cfg, padded)
    num_blocks = k_cmp.shape[1]
    slab = steps * score_keys  # the block-score kernel's padding, >= Nc
    keys_per_step = min(_KEYS_PER_STEP, score_keys)  # both powers of two: divides the slab
    queries = _pad_tokens(core.group_queries(q, kv_heads), padded)
    k_cmp, v_cmp = _pad_tokens(k_cmp, slab), _pad_tokens(v_cmp, slab)

    def tile_block(r):  # (b, tile, h) of program r: KV head major, tiles reversed inside
        bh = r // num_tiles
        return bh // kv_heads, _reversed_tile(r, num_tiles), bh % kv_heads

    def q_block(r):
        b, t, h = tile_block(r)
        return b, t, h, 0, 0

    def kv_block(r):
        b, _, h = tile_block(r)
        return b, 0, h, 0

    kernel = functools.partial(_compressed_kernel, cfg=cfg, num_tiles=num_tiles, num_blocks=num_blocks,
                               keys_per_step=keys_per_step, scale=_score_scale(cfg.softmax_scale(dim)))
    out, lse = pl.pallas_call(
        kernel,
        grid=(batch * kv_heads * num_tiles,),
        in_specs=[pl.BlockSpec((None, tokens, None, groups, dim), q_block),
                  pl.BlockSpec((None, slab, None, dim), kv_block),
                  pl.BlockSpec((None, slab, None, dim), kv_block)],
        out_specs=[pl.BlockSpec((None, tokens, None, groups, dim), q_block),
                   pl.BlockSpec((None, tokens, None, groups), lambda r: q_block(r)[:4])],
        out_shape=[jax.ShapeDtypeStruct(queries.shape, q.dtype),
                   jax.ShapeDtypeStruct(queries.shape[:4], jnp.float32)],
        compiler_params=_compiler("compressed"),
        interpret=interpret,
    )(queries, k_cmp, v_cmp)
    return core.ungroup_queries(out[:, :length]), lse


# ----------------------------------------------------------------------------- block scores


def _selection_weights(cfg, keys_per_step: int, blocks_per_step: int):
    """``(own [Bc, Bs], spill [Bc])``: the tokens compression block c of a step
    shares with the step's selection block j, and with the next step's first
    block, in units of d. A step's Bc blocks start at its first selection
    block's first token (Bc*d = Bs*l'), and a block of l <= l' tokens reaches at
    most one selection block further."""
    c_start = jnp.arange(keys_per_step, dtype=jnp.int32)[:, None] * cfg.stride
    j_start = jnp.arange(blocks_per_step + 1, dtype=jnp.int32)[None, :] * cfg.select_size
    shared = jnp.minimum(c_start + cfg.block_size, j_start + cfg.select_size) - jnp.maximum(c_start, j_start)
    weights = (jnp.maximum(shared, 0) // cfg.stride).astype(jnp.float32)
    return weights[:, :blocks_per_step], weights[:, blocks_per_step]


def _block_score_kernel(start_ref, q_ref, k_ref, lse_ref, own_ref, spill_ref, s_ref, *, cfg, num_tiles,
                        num_blocks, steps, scale):
    tokens = s_ref.shape[0]
    _, groups, dim = q_ref.shape
    keys_per_step, blocks_per_step = own_ref.shape
    rows = tokens * groups
    first = start_ref[0] + (pl.program_id(0) % num_tiles) * tokens
    q = q_ref[pl.ds(first, tokens), :, :].reshape(rows, dim)
    lse = lse_ref[pl.ds(first, tokens), :].reshape(rows)
    positions = first + jnp.arange(rows, dtype=jnp.int32) // groups
    visible = _cdiv(_visible_blocks(first + tokens - 1, cfg, num_blocks), keys_per_step)
    own, spill = own_ref[...], spill_ref[...]
    offsets = jnp.arange(keys_per_step, dtype=jnp.int32)
    first_column = jnp.arange(blocks_per_step, dtype=jnp.int32)[None, :] == 0

    def step(j, carry):  # carry: the previous step's share of this step's first block
        start = j * keys_per_step
        scores = _dot(q, k_ref[pl.ds(start, keys_per_step), :].T, q.dtype) * scale
        ends = (start + offsets) * cfg.stride + cfg.block_size - 1
        probs = jnp.where(ends[None, :] <= positions[:, None], jnp.exp2(scores - lse[:, None]), 0.0)
        per_token = probs.reshape(tokens, groups, keys_per_step).sum(axis=1)
        blocks = _dot(per_token, own, jnp.float32) + jnp.where(first_column, carry[:, None], 0.0)
        s_ref[:, pl.ds(j * blocks_per_step, blocks_per_step)] = blocks
        return jnp.sum(per_token * spill[None, :], axis=1)

    def zeros(j, carry):  # steps past the last visible block: only the spill of the last one
        s_ref[:, pl.ds(j * blocks_per_step, blocks_per_step)] = jnp.where(first_column, carry[:, None], 0.0)
        return jnp.zeros_like(carry)

    carry = jax.lax.fori_loop(0, visible, step, jnp.zeros((tokens,), jnp.float32))
    jax.lax.fori_loop(visible, steps, zeros, carry)


def _block_scores_chunk(start, queries, k_cmp, lse, *, cfg, chunk, num_blocks, interpret, steps=None):
    """Selection scores ``[B, Hkv, chunk, steps * Bs]`` (float32) of queries
    ``start .. start + chunk``: the first ``steps`` steps of blocks (all of
    them by default; at least ``_chunk_steps``' for the chunk)."""
    batch, padded, kv_heads, groups, dim = queries.shape
    keys_per_step, blocks_per_step, all_steps = _block_layout(cfg, padded)
    steps = all_steps if steps is None else steps
    tokens = _SCORE_TOKENS
    num_tiles = chunk // tokens
    own, spill = _selection_weights(cfg, keys_per_step, blocks_per_step)

    def head(r):
        bh = r // num_tiles
        return bh // kv_heads, bh % kv_heads

    kernel = functools.partial(_block_score_kernel, cfg=cfg, num_tiles=num_tiles, num_blocks=num_blocks,
                               steps=steps, scale=_score_scale(cfg.softmax_scale(dim)))
    return pl.pallas_call(
        kernel,
        grid=(batch * kv_heads * num_tiles,),
        in_specs=[pl.BlockSpec((1,), lambda r: (0,)),
                  pl.BlockSpec((None, padded, None, groups, dim), lambda r: (head(r)[0], 0, head(r)[1], 0, 0)),
                  pl.BlockSpec((None, k_cmp.shape[1], None, dim), lambda r: (head(r)[0], 0, head(r)[1], 0)),
                  pl.BlockSpec((None, padded, None, groups), lambda r: (head(r)[0], 0, head(r)[1], 0)),
                  pl.BlockSpec(own.shape, lambda r: (0, 0)),
                  pl.BlockSpec(spill.shape, lambda r: (0,))],
        out_specs=pl.BlockSpec((None, None, tokens, steps * blocks_per_step),
                               lambda r: (*head(r), r % num_tiles, 0)),
        out_shape=jax.ShapeDtypeStruct((batch, kv_heads, chunk, steps * blocks_per_step), jnp.float32),
        compiler_params=_compiler("block_scores"),
        interpret=interpret,
    )(jnp.reshape(start, (1,)).astype(jnp.int32), queries, k_cmp, lse, own, spill)


def _chunk_steps(cfg, starts, chunk: int, blocks_per_step: int, steps: int) -> list[int]:
    """How many of the ``steps`` steps of ``blocks_per_step`` selection blocks
    each chunk of queries (from each of ``starts``) scores and ranks: those up
    to its last query's own block (no query of the chunk can select a later
    one: ``select`` ranks them -inf), rounded up to a multiple of ``steps /
    _WIDTH_RUNS`` so that few widths occur. At 64K tokens that is 576 of the
    1024 blocks per chunk on average."""
    quantum = _cdiv(steps, _WIDTH_RUNS)
    widths = []
    for start in starts:  # the chunk's blocks: up to its last query's own one
        needed = _cdiv(core.num_selection_blocks(start + chunk, cfg.select_size), blocks_per_step)
        widths.append(min(steps, _cdiv(needed, quantum) * quantum))
    return widths


@functools.partial(jax.jit, static_argnames=("cfg", "interpret", "native"))
def selection_ids(q, k_cmp, lse, *, cfg, interpret: bool = False, native: bool = False):
    """Selected block ids ``[B, T, Hkv, n]`` from the block-score kernel.

    ``lse`` is ``compressed_attention``'s. Queries run in chunks of
    ``_SELECTION_CHUNK`` under ``lax.map``: each chunk's scores
    ``[B, Hkv, chunk, Ns']`` are made, ranked by ``_nsa_tiled.select``
    (through ``jax_topk.top_k``; the CUDA kernel writes the ranks itself)
    and dropped, so no ``[T, Ns]`` array exists.
    ``Ns'`` pads Ns to whole steps; ``select`` ranks blocks after the query
    -inf, the padding included; each chunk scores and ranks only the steps
    its queries can see (``_chunk_steps``). ``native``: the scores by the
    CUDA kernel of ``_nsa_native`` (where ``_nsa_native.unsupported`` is
    None) instead of the Pallas one.
    """
    batch, length, q_heads, dim = q.shape
    kv_heads = k_cmp.shape[2]
    padded = lse.shape[1]
    chunk = min(_SELECTION_CHUNK, padded)
    keys_per_step, blocks_per_step, steps = _block_layout(cfg, padded)
    queries = _pad_tokens(core.group_queries(q, kv_heads), padded)
    k_padded = k_cmp if native else _pad_tokens(k_cmp, steps * keys_per_step)

    def one_chunk(start, steps):  # the chunk's blocks in its first `steps` steps: all it can see
        positions = (start + jnp.arange(chunk, dtype=jnp.int32))[None, None, :]
        if native:  # the kernel writes the ranks: no pass over the scores before top_k
            ranked = native_scores.block_scores(start, queries, k_padded, lse, cfg=cfg, num_blocks=k_cmp.shape[1],
                                                chunk=chunk, width=steps * blocks_per_step,
                                                scale=_score_scale(cfg.softmax_scale(dim)), ranked=True)
            return tiled.select_ranked(ranked, positions, cfg)  # [B, Hkv, chunk, n]
        scores = _block_scores_chunk(start, queries, k_padded, lse, cfg=cfg, chunk=chunk,
                                     num_blocks=k_cmp.shape[1], interpret=interpret, steps=steps)
        return tiled.select(scores, positions, cfg)

    # Chunks of equal width (consecutive: widths grow with the queries) share one lax.map.
    starts = range(0, padded, chunk)
    widths = _chunk_steps(cfg, starts, chunk, blocks_per_step, steps)
    runs = itertools.groupby(zip(starts, widths), key=lambda pair: pair[1])
    ids = jnp.concatenate([jax.lax.map(functools.partial(one_chunk, steps=run_steps),
                                       jnp.asarray([start for start, _ in run], jnp.int32))
                           for run_steps, run in runs])
    ids = jnp.moveaxis(ids, 0, 2).reshape(batch, kv_heads, padded, -1)[:, :, :length]
    return jnp.swapaxes(ids, 1, 2)


# ----------------------------------------------------------------------------- selected attention


def _selected_block(ids_ref, j, select_size: int, position):
    """A token's j-th selected block: its first key, and ``[1, l']`` which of
    its keys the token attends (an id of -1 none, and none after the token)."""
    block = ids_ref[j]
    start = jnp.maximum(block, 0) * select_size
    allowed = (block >= 0) & (start + jnp.arange(select_size, dtype=jnp.int32) <= position)
    return start, allowed[None, :]


def _forced_slot(cfg, slot: int, own):
    """The block ``select`` puts in ``slot`` (< initial + local) for a query
    in selection block ``own``: its forced blocks that start at or before the
    query, ascending (the first ``initial_blocks``, then the
    ``local_blocks`` ending at ``own``, each once), then -1."""
    initial = jnp.minimum(cfg.initial_blocks, own + 1)
    block = jnp.where(slot < initial, slot, jnp.maximum(own - cfg.local_blocks + 1, cfg.initial_blocks) + slot - initial)
    return jnp.where(block <= own, block, -1)


def _forced_first(cfg, slot_ids, own):
    """Whether a token's ids begin as ``select`` begins them: ``slot_ids(s)``
    is the id in slot s, and each of the first ``initial + local`` is
    ``_forced_slot``'s. Then the forced pass holds those slots and the walk
    starts after them; otherwise (ids from elsewhere, or NaN scores ranked
    above the forced blocks) the walk takes every slot and the pass none."""
    same = True
    for slot in range(cfg.initial_blocks + cfg.local_blocks):
        same = same & (slot_ids(slot) == _forced_slot(cfg, slot, own))
    return same


def _selected_rows(ids_ref, q_ref, k_ref, v_ref, forced_refs=(), *, cfg, length, num_ids, scale):
    """The group's ``[rows, D]`` float32 outputs of one (token, KV head), and
    their log-sum-exp ``[rows]`` (base 2, of the base-2 scores; +inf for a row
    that sees no key): the backward pass's residual. With ``forced_refs``
    (``_forced_attention``'s output and log-sum-exp for this token) the walk
    starts from that state, after the forced slots, where the pass took them."""
    position = pl.program_id(0) % length  # programs run KV head major, token minor
    q = q_ref[...]  # [G, D]
    first_slot, carry = 0, _initial_carry(*q.shape)
    if forced_refs:
        out_ref, lse_ref = forced_refs
        m = lse_ref[...]
        carry = (m, jnp.where(m == -jnp.inf, 0.0, 1.0), out_ref[...].astype(jnp.float32))
        forced = _forced_first(cfg, lambda slot: ids_ref[slot], position // cfg.select_size)
        # (Not jnp.where of two constants: Triton's lowering makes that an i1 loop bound.)
        first_slot = forced.astype(jnp.int32) * (cfg.initial_blocks + cfg.local_blocks)

    def visit(j, carry):
        start, allowed = _selected_block(ids_ref, j, cfg.select_size, position)
        scores = _dot(q, k_ref[pl.ds(start, cfg.select_size), :].T, q.dtype) * scale
        scores = jnp.where(allowed, scores, -jnp.inf)
        return _online_softmax_step(carry, scores, v_ref[pl.ds(start, cfg.select_size), :], q.dtype)

    upper = jnp.int32(num_ids) if forced_refs else num_ids  # scf.for's bounds share one type
    return _finish_softmax(jax.lax.fori_loop(first_slot, upper, visit, carry), jnp.inf)


def _split_refs(refs, forced: bool):
    """``(forced_refs, rest)``: the forced pass's two inputs come first when there are any."""
    return (tuple(refs[:2]), refs[2:]) if forced else ((), refs)


def _selected_kernel(ids_ref, q_ref, k_ref, v_ref, *refs, forced: bool, **kw):
    forced_refs, (o_ref, *lse_ref) = _split_refs(refs, forced)
    out, lse = _selected_rows(ids_ref, q_ref, k_ref, v_ref, forced_refs, **kw)
    o_ref[...] = out.astype(o_ref.dtype)
    if lse_ref:
        lse_ref[0][...] = lse


def _selected_mixed_kernel(ids_ref, q_ref, k_ref, v_ref, *refs, forced: bool, compressed_from: int, **kw):
    """The selected branch, then ``nsa``'s gate mix of the three branches
    (``_nsa_core.gated_sum``; the selected output rounded to the input dtype
    first, as the branch returns it): one pass over the outputs, not two.
    The compressed output of tokens before ``compressed_from`` is zero (its
    block, read from ``_nsa_cudnn.compressed_rows``' layout, is another
    token's). With ``residual_refs`` (the VJP's forward) it also writes the
    selected output and its log-sum-exp."""
    forced_refs, refs = _split_refs(refs, forced)
    cmp_ref, win_ref, g_cmp_ref, g_slc_ref, g_win_ref, o_ref, *residual_refs = refs
    out, lse = _selected_rows(ids_ref, q_ref, k_ref, v_ref, forced_refs, **kw)
    selected = out.astype(o_ref.dtype)
    gates = [ref[...][:, None] for ref in (g_cmp_ref, g_slc_ref, g_win_ref)]
    compressed = cmp_ref[...]
    if compressed_from:
        compressed = jnp.where(pl.program_id(0) % kw["length"] >= compressed_from, compressed, 0)
    o_ref[...] = core.gated_sum((compressed, selected, win_ref[...]), gates, o_ref.dtype)
    if residual_refs:
        residual_refs[0][...] = selected
        residual_refs[1][...] = lse


def forced_tokens(cfg) -> int:
    """Tokens per program of the forced-block pass (``_forced_attention``), 0
    where it does not run: no forced blocks, or selection blocks too short
    for a program's tokens to share them (they must lie in one)."""
    if not cfg.initial_blocks + cfg.local_blocks:
        return 0
    tokens = math.gcd(_FORCED_TOKENS, cfg.select_size)
    return tokens if tokens > 1 else 0


def _forced_kernel(ids_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, cfg, num_tiles, scale):
    """The forced blocks of ``tokens`` consecutive queries of one (b, KV
    head), which lie in one selection block and so share them: each block is
    read once for all, and the tokens' ``tokens * G`` rows make one dot. A
    token whose ids do not begin as ``select`` begins them takes none
    (``_forced_first``: its walk takes every slot). Writes each token's
    normalised output and log-sum-exp (base 2; -inf where it attends nothing)."""
    tokens, groups, dim = q_ref.shape
    rows = tokens * groups
    first = (pl.program_id(0) % num_tiles) * tokens
    own = first // cfg.select_size
    q = q_ref[...].reshape(rows, dim)
    positions = first + jnp.arange(rows, dtype=jnp.int32) // groups
    forced = _forced_first(cfg, lambda slot: ids_ref[:, slot], own)  # [tokens]
    row_forced = jnp.broadcast_to(forced[:, None], (tokens, groups)).reshape(rows)
    keys_in_block = jnp.arange(cfg.select_size, dtype=jnp.int32)

    def visit(slot, carry):
        block = _forced_slot(cfg, slot, own)
        start = jnp.maximum(block, 0) * cfg.select_size
        scores = _dot(q, k_ref[pl.ds(start, cfg.select_size), :].T, q.dtype) * scale
        allowed = (row_forced & (block >= 0))[:, None] & (start + keys_in_block[None, :] <= positions[:, None])
        return _online_softmax_step(carry, jnp.where(allowed, scores, -jnp.inf),
                                    v_ref[pl.ds(start, cfg.select_size), :], q.dtype)

    # A loop, not a Python one: unrolled, Triton held every slot's K and V tiles at once (246 registers,
    # 2.01 ms at 64K; 180 and 1.77 ms as a loop, H200).
    carry = jax.lax.fori_loop(0, cfg.initial_blocks + cfg.local_blocks, visit, _initial_carry(rows, dim))
    out, lse = _finish_softmax(carry, -jnp.inf)  # -inf: the walk's carry then starts empty
    o_ref[...] = out.reshape(tokens, groups, dim).astype(o_ref.dtype)
    lse_ref[...] = lse.reshape(tokens, groups)


def _forced_attention(ids, queries, k, v, *, cfg, tokens: int, scale: float, interpret: bool):
    """The forced-block pass: ``(out [B, T', Hkv, rows, D] in the queries'
    dtype, lse [B, T', Hkv, rows] float32)`` over ``ids [B, T, Hkv, slots]``
    and ``queries [B, T, Hkv, rows, D]`` (T' pads T to whole programs), a
    program per ``tokens`` tokens of one (b, KV head), KV head major.

    Each forced block is gathered once per program instead of once per
    token: with the default config 3 of a token's 16 blocks (19% of the
    selected branch's gathers) are forced."""
    batch, length, kv_heads, rows, dim = queries.shape
    num_tiles = -(-length // tokens)
    padded = num_tiles * tokens
    ids = jnp.pad(ids, [(0, 0), (0, padded - length), (0, 0), (0, 0)], constant_values=-1)
    queries = _pad_tokens(queries, padded)

    tile = functools.partial(_program_token, length=num_tiles, kv_heads=kv_heads)  # (b, tile, h) of program r

    group_spec = pl.BlockSpec((None, tokens, None, rows, dim), lambda r: (*tile(r), 0, 0))
    row_spec = pl.BlockSpec((None, tokens, None, rows), lambda r: (*tile(r), 0))
    kv_spec = pl.BlockSpec((None, k.shape[1], None, dim), lambda r: (tile(r)[0], 0, tile(r)[2], 0))
    return pl.pallas_call(
        functools.partial(_forced_kernel, cfg=cfg, num_tiles=num_tiles, scale=scale),
        grid=(batch * kv_heads * num_tiles,),
        in_specs=[pl.BlockSpec((None, tokens, None, ids.shape[-1]), lambda r: (*tile(r), 0)), group_spec, kv_spec,
                  kv_spec],
        out_specs=[group_spec, row_spec],
        out_shape=[jax.ShapeDtypeStruct(queries.shape, queries.dtype),
                   jax.ShapeDtypeStruct(queries.shape[:4], jnp.float32)],
        compiler_params=_compiler("selected_forced"),
        interpret=interpret,
    )(ids, queries, k, v)


def _selected_layout(q, k, v, block_ids, select_size: int):
    """What the selected kernels read: ``(rows, padded, ids, k, v, grouped)``:
    the dot's M (G, at least 16: small groups get zero queries), the keys
    padded to whole blocks, the ids padded to a power-of-two count with -1
    (also for ids past the last block, which select nothing, as in the plain
    branch; every slice a kernel reads then lies within the padded keys), and
    ``grouped(x)``: ``[B, T, Hq, ...] -> [B, T, Hkv, rows, ...]``."""
    length, q_heads = q.shape[1:3]
    kv_heads = k.shape[2]
    groups = q_heads // kv_heads
    rows = max(groups, _MIN_DOT)
    padded = core.num_selection_blocks(length, select_size) * select_size
    num_ids = block_ids.shape[-1]
    id_slots = 1 << max(0, num_ids - 1).bit_length()
    ids = block_ids.astype(jnp.int32)
    ids = jnp.where(ids < padded // select_size, ids, -1)
    ids = jnp.pad(ids, [(0, 0)] * 3 + [(0, id_slots - num_ids)], constant_values=-1)

    def grouped(x):
        x = x.reshape(*x.shape[:2], kv_heads, groups, *x.shape[3:])
        return jnp.pad(x, [(0, 0)] * 3 + [(0, rows - groups)] + [(0, 0)] * (x.ndim - 4))

    return rows, padded, ids, _pad_tokens(k, padded), _pad_tokens(v, padded), grouped


def _program_token(r, length: int, kv_heads: int):
    """(b, t, h) of program r of the per-token selected kernels: KV head major, token minor
    (with ``length`` the tiles per head, (b, tile, h) of the forced pass's programs)."""
    bh = r // length
    return bh // kv_heads, r % length, bh % kv_heads


def _token_specs(length: int, kv_heads: int, rows: int, dim: int, padded: int, id_slots: int):
    """Block specs of the per-token selected kernels (a program per (b, t, h),
    KV head major, token minor): ``(ids, group [rows, D], row [rows], keys)``."""
    token = functools.partial(_program_token, length=length, kv_heads=kv_heads)
    return (pl.BlockSpec((None, None, None, id_slots), lambda r: (*token(r), 0)),
            pl.BlockSpec((None, None, None, rows, dim), lambda r: (*token(r), 0, 0)),
            pl.BlockSpec((None, None, None, rows), lambda r: (*token(r), 0)),
            pl.BlockSpec((None, padded, None, dim), lambda r: (token(r)[0], 0, token(r)[2], 0)))


def takes_compressed_rows(groups: int) -> bool:
    """Whether the gate mix reads the compressed branch in
    ``_nsa_cudnn.compressed_rows``' layout (a row block is one token's G heads:
    groups of at least the dot's 16 rows, so no padding rows)."""
    return groups >= _MIN_DOT


def _compressed_rows_spec(cfg, length: int, kv_heads: int, rows: int, dim: int):
    """Block spec of ``compressed_rows``' ``[B, R, Hkv*d, G, D]`` for the
    per-token kernels: token t reads row ``(t - l + 1) // d``, head block
    ``h*d + (t - l + 1) % d`` (tokens before ``l - 1`` read row 0, and the
    kernel zeroes it)."""
    d, shift = cfg.stride, cfg.block_size - 1

    def index(r):
        b, t, h = _program_token(r, length, kv_heads)
        shifted = jnp.maximum(t - shift, 0)
        return b, shifted // d, h * d + shifted % d, 0, 0

    return pl.BlockSpec((None, None, None, rows, dim), index)


@functools.partial(jax.jit, static_argnames=("cfg", "interpret", "residuals"))
def selected_attention(q, k, v, block_ids, mix=None, *, cfg, interpret: bool = False, residuals: bool = False):
    """``nsa.selected_attention`` by the kernel: q ``[B, T, Hq, D]``, k and v
    ``[B, T, Hkv, D]``, block_ids int32 ``[B, T, Hkv, n]`` -> ``[B, T, Hq, D]``.

    ``mix=(compressed, window, gates)`` (outputs ``[B, T, Hq, D]`` in q's
    dtype, or the compressed one as ``_nsa_cudnn.compressed_rows`` lays it
    out, read there; gates ``[B, T, Hq, 3]``) returns ``nsa_attention``'s output instead:
    the three branches weighted by their gates, summed in the compute dtype
    and rounded to q's dtype, by ``_nsa_core.gated_sum`` as on the plain path.
    ``residuals=True`` returns ``(output, selected [B, T, Hq, D], lse)`` for
    ``selected_attention_bwd`` (lse ``[B, T, Hkv, rows]`` float32).

    Programs run KV head major (token minor), so the programs resident at
    once gather from one head's keys and values, which then stay in L2.
    Where the config forces blocks, ``_forced_attention`` first reads them
    once per ``forced_tokens`` tokens (which share them) and each token's
    walk starts from its state after them. The gathers are bound by L2's
    bandwidth, not its capacity (H200: 8.3 TB/s of a 9.0 TB/s roof for random
    16 KB blocks, benchmarks/results/NOTES.md): only fewer bytes help.
    """
    batch, length, q_heads, dim = q.shape
    kv_heads = k.shape[2]
    groups = q_heads // kv_heads
    rows, padded, ids, k, v, grouped = _selected_layout(q, k, v, block_ids, cfg.select_size)
    queries = grouped(q)

    ids_spec, group_spec, row_spec, kv_spec = _token_specs(length, kv_heads, rows, dim, padded, ids.shape[-1])
    in_specs = [ids_spec, group_spec, kv_spec, kv_spec]
    operands = [ids, queries, k, v]
    scale = _score_scale(cfg.softmax_scale(dim))
    tokens = forced_tokens(cfg)
    kw = dict(cfg=cfg, length=length, num_ids=block_ids.shape[-1], scale=scale, forced=tokens > 0)
    forced_at = len(operands)  # where the forced pass's output and log-sum-exp go among the operands
    if tokens:  # the forced blocks once per few tokens; the walk below starts after them
        in_specs += [group_spec, row_spec]
        operands += _forced_attention(ids, queries, k, v, cfg=cfg, tokens=tokens, scale=scale, interpret=interpret)
    kernel = functools.partial(_selected_kernel, **kw)
    out_specs, out_shape = [group_spec], [jax.ShapeDtypeStruct(queries.shape, q.dtype)]
    if mix is not None:
        compressed, window, gates = mix
        gate_columns = [grouped(gates[..., i:i + 1])[..., 0] for i in range(3)]  # [B, T, Hkv, rows] each
        if compressed.ndim == 5:  # compressed_rows' layout
            if not takes_compressed_rows(groups):
                raise ValueError(f"compressed rows need groups of at least {_MIN_DOT} query heads, not {groups}")
            cmp_spec = _compressed_rows_spec(cfg, length, kv_heads, rows, dim)
            compressed_from = cfg.block_size - 1
        else:
            cmp_spec, compressed, compressed_from = group_spec, grouped(compressed), 0
        in_specs += [cmp_spec, group_spec] + [row_spec] * 3
        operands += [compressed, grouped(window)] + gate_columns
        kernel = functools.partial(_selected_mixed_kernel, compressed_from=compressed_from, **kw)
        if residuals:  # the selected output beside the mix
            out_specs.append(group_spec)
            out_shape.append(jax.ShapeDtypeStruct(queries.shape, q.dtype))
    if residuals:
        out_specs.append(row_spec)
        out_shape.append(jax.ShapeDtypeStruct(queries.shape[:4], jnp.float32))
    # Each program reads its token's forced state before it writes the token's output, so the walk's
    # outputs may take the pass's buffers (where T is whole programs of the pass): 1 GiB less at 64K.
    aliases = {}
    if tokens and operands[forced_at].shape == queries.shape:
        aliases[forced_at] = 0
        if residuals:
            aliases[forced_at + 1] = len(out_shape) - 1
    outs = pl.pallas_call(
        kernel,
        grid=(batch * kv_heads * length,),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        input_output_aliases=aliases,
        compiler_params=_compiler("selected"),
        interpret=interpret,
    )(*operands)
    out = core.ungroup_queries(outs[0][..., :groups, :])
    if not residuals:
        return out
    selected = out if mix is None else core.ungroup_queries(outs[1][..., :groups, :])
    return out, selected, outs[-1]


# ----------------------------------------------------------------------------- selected attention, backward

_SEGMENT_VISITS = 1024  # (token, block) visits per program of the key-block gradient kernel


def _visit_gradients(q, do, lse, delta, keys, values, allowed, scale):
    """One (token, selected block) of the backward pass: the probabilities
    from the forward's log-sum-exp (base 2), ``(p, ds)`` ``[rows, l']``
    float32, ds the gradient of the loss in the (unscaled) scores."""
    scores = _dot(q, keys.T, q.dtype) * scale
    p = jnp.where(allowed, jnp.exp2(scores - lse[:, None]), 0.0)
    return p, p * (_dot(do, values.T, q.dtype) - delta[:, None])


def _selected_dq_kernel(ids_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, length, select_size,
                        scale, softmax_scale):
    """dq of one (token, KV head): the group's rows over the token's blocks."""
    position = pl.program_id(0) % length
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]

    def visit(j, dq):
        start, allowed = _selected_block(ids_ref, j, select_size, position)
        keys = k_ref[pl.ds(start, select_size), :]
        _, ds = _visit_gradients(q, do, lse, delta, keys, v_ref[pl.ds(start, select_size), :], allowed, scale)
        return dq + _dot(ds.astype(q.dtype), keys, q.dtype)

    dq = jax.lax.fori_loop(0, ids_ref.shape[0], visit, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * softmax_scale).astype(dq_ref.dtype)


def _selected_dkv_kernel(segments_ref, tokens_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
                         *, num_segments, select_size, scale, softmax_scale):
    """Partial dk, dv of one key block from one segment of the tokens that
    selected it (``segments_ref``: block, first and end visit; ``tokens_ref``:
    the visits' tokens, by block, then token)."""
    segment = pl.program_id(0) % num_segments
    block, first, end = segments_ref[segment, 0], segments_ref[segment, 1], segments_ref[segment, 2]
    start = jnp.maximum(block, 0) * select_size
    keys, values = k_ref[pl.ds(start, select_size), :], v_ref[pl.ds(start, select_size), :]
    key_positions = start + jnp.arange(select_size, dtype=jnp.int32)

    def visit(j, carry):
        dk, dv = carry
        t = tokens_ref[j]
        q, do = q_ref[pl.ds(t, 1)][0], do_ref[pl.ds(t, 1)][0]
        lse, delta = lse_ref[pl.ds(t, 1)][0], delta_ref[pl.ds(t, 1)][0]
        p, ds = _visit_gradients(q, do, lse, delta, keys, values, (key_positions <= t)[None, :], scale)
        return dk + _dot(ds.astype(q.dtype).T, q, q.dtype), dv + _dot(p.astype(q.dtype).T, do, q.dtype)

    zeros = jnp.zeros(keys.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(first, end, visit, (zeros, zeros))
    dk_ref[...] = dk * softmax_scale
    dv_ref[...] = dv


def _sum_segments_kernel(first_ref, dk_ref, dv_ref, dk_out_ref, dv_out_ref, *, num_blocks):
    """One key block's dk, dv: its segments' partial sums, in segment order (deterministic)."""
    block = pl.program_id(0) % num_blocks

    def add(i, carry):
        return carry[0] + dk_ref[pl.ds(i, 1)][0], carry[1] + dv_ref[pl.ds(i, 1)][0]

    zeros = jnp.zeros(dk_out_ref.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(first_ref[block], first_ref[block + 1], add, (zeros, zeros))
    dk_out_ref[...], dv_out_ref[...] = dk, dv


def _visit_segments(ids, num_blocks: int):
    """The (token, block) visits of ids ``[B, T, Hkv, slots]`` by block, and
    segments of at most ``_SEGMENT_VISITS`` of them within a block, per (batch,
    KV head): ``(tokens [B, Hkv, T * slots], segments [B, Hkv, S, 3], first
    [B, Hkv, Ns + 1])``: the visits' tokens (by block, then token; unused
    visits last), each segment's (block, first visit, end visit) (-1, 0, 0
    past the last), and each block's first segment. S = T * slots /
    _SEGMENT_VISITS + Ns bounds the segments: memory stays O(T)."""
    batch, length, kv_heads, slots = ids.shape
    visits = length * slots
    size = _SEGMENT_VISITS
    max_segments = -(-visits // size) + num_blocks
    keys = jnp.where(ids >= 0, ids, num_blocks).transpose(0, 2, 1, 3).reshape(batch, kv_heads, visits)
    order = argsort(keys, axis=-1)  # the library's own stable sort
    tokens = (order // slots).astype(jnp.int32)

    def per_head(keys):
        counts = jnp.zeros(num_blocks + 1, jnp.int32).at[keys].add(1)[:num_blocks]
        starts = jnp.cumsum(counts) - counts
        per_block = -(-counts // size)
        first = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(per_block)]).astype(jnp.int32)
        index = jnp.arange(max_segments, dtype=jnp.int32)
        block = jnp.clip(jnp.searchsorted(first, index, side="right") - 1, 0, num_blocks - 1)
        used = index < first[-1]
        begin = starts[block] + (index - first[block]) * size
        end = jnp.minimum(begin + size, starts[block] + counts[block])
        segments = jnp.stack([jnp.where(used, block, -1), jnp.where(used, begin, 0), jnp.where(used, end, 0)], -1)
        return segments.astype(jnp.int32), first

    segments, first = jax.vmap(jax.vmap(per_head))(keys)
    return tokens, segments, first


@functools.partial(jax.jit, static_argnames=("cfg", "interpret"))
def selected_attention_bwd(q, k, v, block_ids, selected, lse, d_selected, *, cfg, interpret: bool = False):
    """Gradients ``(dq, dk, dv)`` of the selected branch from the cotangent of
    its output ``d_selected``, given its output ``selected`` and log-sum-exp
    ``lse`` (``selected_attention(..., residuals=True)``).

    dq: a program per (token, KV head), as the forward. dk, dv: each key
    block gathers the tokens that selected it (a stable sort of the
    (token, block) visits by block), in segments of ``_SEGMENT_VISITS``
    visits so that blocks picked by every token (the forced first block) do
    not serialise the grid; a second kernel sums each block's segments in
    order, so the gradients are deterministic (no atomics).
    """
    batch, length, q_heads, dim = q.shape
    kv_heads = k.shape[2]
    groups = q_heads // kv_heads
    select_size = cfg.select_size
    rows, padded, ids, k_pad, v_pad, grouped = _selected_layout(q, k, v, block_ids, select_size)
    num_blocks = padded // select_size
    delta = jnp.sum(d_selected.astype(jnp.float32) * selected.astype(jnp.float32), axis=-1)
    queries, d_out, delta = grouped(q), grouped(d_selected.astype(q.dtype)), grouped(delta)
    scale, softmax_scale = _score_scale(cfg.softmax_scale(dim)), cfg.softmax_scale(dim)

    ids_spec, group_spec, row_spec, kv_spec = _token_specs(length, kv_heads, rows, dim, padded, ids.shape[-1])
    dq = pl.pallas_call(
        functools.partial(_selected_dq_kernel, length=length, select_size=select_size, scale=scale,
                          softmax_scale=softmax_scale),
        grid=(batch * kv_heads * length,),
        in_specs=[ids_spec, group_spec, kv_spec, kv_spec, group_spec, row_spec, row_spec],
        out_specs=group_spec,
        out_shape=jax.ShapeDtypeStruct(queries.shape, q.dtype),
        compiler_params=_compiler("selected_dq"),
        interpret=interpret,
    )(ids, queries, k_pad, v_pad, d_out, lse, delta)

    tokens, segments, first = _visit_segments(ids, num_blocks)
    num_segments = segments.shape[2]

    def whole(x, per_head: int, axis: int):
        """A (batch, KV head)'s whole slice of ``x``, its KV heads on ``axis``
        (1: the tables ``[B, Hkv, ...]``, 2: the sequences ``[B, T, Hkv, ...]``),
        for a grid of ``per_head`` programs per (batch, KV head)."""
        block = tuple(None if i in (0, axis) else n for i, n in enumerate(x.shape))
        return pl.BlockSpec(block, lambda r: tuple(
            r // per_head // kv_heads if i == 0 else r // per_head % kv_heads if i == axis else 0
            for i in range(x.ndim)))

    def one_block(per_head: int):  # block r % per_head of [B, Hkv, per_head, l', D]
        return pl.BlockSpec((None, None, None, select_size, dim),
                            lambda r: (r // per_head // kv_heads, r // per_head % kv_heads, r % per_head, 0, 0))

    parts = jax.ShapeDtypeStruct((batch, kv_heads, num_segments, select_size, dim), jnp.float32)
    tables, sequences = (segments, tokens), (queries, k_pad, v_pad, d_out, lse, delta)
    dk_parts, dv_parts = pl.pallas_call(
        functools.partial(_selected_dkv_kernel, num_segments=num_segments, select_size=select_size, scale=scale,
                          softmax_scale=softmax_scale),
        grid=(batch * kv_heads * num_segments,),
        in_specs=[whole(x, num_segments, 1) for x in tables] + [whole(x, num_segments, 2) for x in sequences],
        out_specs=[one_block(num_segments)] * 2,
        out_shape=[parts] * 2,
        compiler_params=_compiler("selected_dkv"),
        interpret=interpret,
    )(*tables, *sequences)
    dk, dv = pl.pallas_call(
        functools.partial(_sum_segments_kernel, num_blocks=num_blocks),
        grid=(batch * kv_heads * num_blocks,),
        in_specs=[whole(x, num_blocks, 1) for x in (first, dk_parts, dv_parts)],
        out_specs=[one_block(num_blocks)] * 2,
        out_shape=[jax.ShapeDtypeStruct((batch, kv_heads, num_blocks, select_size, dim), jnp.float32)] * 2,
        compiler_params=_compiler("sum_segments"),
        interpret=interpret,
    )(first, dk_parts, dv_parts)

    def as_tokens(x, like):  # [B, Hkv, Ns, l', D] -> [B, T, Hkv, D] in like's dtype
        return jnp.moveaxis(x.reshape(batch, kv_heads, padded, dim), 1, 2)[:, :length].astype(like.dtype)

    return core.ungroup_queries(dq[..., :groups, :]), as_tokens(dk, k), as_tokens(dv, v)
