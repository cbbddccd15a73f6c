"""Which implementation runs each NSA branch, decided in one place, and the
composition of ``nsa_attention`` from them.

Paths (``NSAConfig.implementation``):

* ``"xla"``: the plain-JAX tiled branches of ``_nsa_tiled`` everywhere.
* ``"pallas"``: the Pallas kernels of ``_nsa_pallas`` for the compressed branch
  with its block scores and for the selected branch (in Pallas's interpreter
  off the GPU: slow, for tests); an error when the shapes do not suit them.
* ``"auto"`` (default): the kernels on a CUDA GPU when the shapes suit them,
  else the plain path.

On a CUDA GPU with bfloat16 or float16 inputs (``"auto"`` or ``"pallas"``),
cuDNN's flash attention (``_nsa_cudnn``) runs the window branch (18x the
plain-JAX window on an H200) and, on the kernel path, the compressed branch
with its log-sum-exp (one causal attention over the queries shifted by
``l - 1`` and laid out by residue; about twice the Pallas kernel's FLOP rate,
with cuDNN's backward pass; the gate mix reads its output in cuDNN's layout), and
the selection scores come from the CUDA block-score kernel (``_nsa_native``)
where it takes the shapes: ``benchmarks/results/NOTES.md``.

On the kernel path the selected-attention kernel also mixes the three
branches by their gates in its epilogue (``_nsa_core.gated_sum``), so the
output is written once instead of by a pass over all three branch outputs.

Gradients: cuDNN's backward passes for its branches; for the selected kernel
its own backward kernels (``_nsa_pallas.selected_attention_bwd``: dq per
token, dk and dv per key block over the tokens that chose it, from the
forward's log-sum-exp); for the float32 compressed kernel the plain branch's
VJP, which recomputes it tile by tile. Training memory stays O(T). The
selection is never differentiated.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from jax_topk import _info
from jax_topk import _nsa_core as core
from jax_topk import _nsa_cudnn as cudnn
from jax_topk import _nsa_native as native
from jax_topk import _nsa_pallas as kernels
from jax_topk import _nsa_tiled as tiled


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one call runs (static: part of the jit cache key)."""

    kernels: bool = False       # Pallas kernels: block scores, selected branch, compressed (unless cuDNN's)
    interpret: bool = False     # ... run by Pallas's interpreter (implementation="pallas" off the GPU)
    cudnn_window: bool = False  # cuDNN's sliding-window attention for the window branch
    cudnn_compressed: bool = False  # cuDNN's flash attention for the compressed branch (with kernels)
    native_scores: bool = False  # the CUDA block-score kernel (_nsa_native) for the selection (with kernels)


def _on_cuda() -> bool:
    return jax.default_backend() == "gpu" and _info._lowering_platform("gpu") == "cuda"


def plan(cfg, q_shape: tuple[int, ...], q_dtype, kv_heads: int, fn: str) -> Plan:
    """The plan for queries of ``q_shape``/``q_dtype`` over ``kv_heads`` KV heads."""
    if cfg.implementation == "xla":
        return Plan()
    on_gpu = _on_cuda()
    reason = kernels.unsupported(cfg, q_shape, kv_heads)
    if cfg.implementation == "pallas" and reason is not None:
        raise ValueError(f"{fn}: implementation='pallas' cannot run these shapes (q {tuple(q_shape)}, "
                         f"{kv_heads} KV heads): {reason}; use implementation='auto' or 'xla'")
    use_kernels = reason is None and (on_gpu or cfg.implementation == "pallas")
    cudnn_window = on_gpu and cudnn.supports(q_dtype, q_shape[-1])
    native_scores = (use_kernels and on_gpu
                     and native.unsupported(cfg, q_dtype, q_shape[2] // kv_heads, q_shape[-1]) is None)
    return Plan(kernels=use_kernels, interpret=use_kernels and not on_gpu, cudnn_window=cudnn_window,
                cudnn_compressed=cudnn_window and use_kernels and cudnn.available(), native_scores=native_scores)


# ----------------------------------------------------------------------------- kernels and their VJPs


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _compressed_kernel(q, k_cmp, v_cmp, cfg, interpret):
    # k_cmp and v_cmp arrive rounded to q's dtype but in the compute dtype, so
    # their cotangents (the plain VJP's) are not rounded to it.
    return kernels.compressed_attention(q, k_cmp.astype(q.dtype), v_cmp.astype(q.dtype), cfg=cfg,
                                        interpret=interpret)


def _compressed_fwd(q, k_cmp, v_cmp, cfg, interpret):
    return _compressed_kernel(q, k_cmp, v_cmp, cfg, interpret), (q, k_cmp, v_cmp)


def _compressed_bwd(cfg, interpret, residuals, cotangents):
    del interpret
    out_cotangent, _ = cotangents  # the log-sum-exp only feeds the (undifferentiated) selection
    _, vjp = jax.vjp(functools.partial(tiled.compressed_attention, cfg=cfg), *residuals)
    return vjp(out_cotangent)


_compressed_kernel.defvjp(_compressed_fwd, _compressed_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _selected_kernel(q, k, v, block_ids, cfg, interpret):
    return kernels.selected_attention(q, k, v, block_ids, cfg=cfg, interpret=interpret)


def _selected_fwd(q, k, v, block_ids, cfg, interpret):
    out, _, lse = kernels.selected_attention(q, k, v, block_ids, cfg=cfg, interpret=interpret, residuals=True)
    return out, (q, k, v, block_ids, out, lse)


def _selected_bwd(cfg, interpret, residuals, cotangent):
    q, k, v, block_ids, out, lse = residuals
    grads = kernels.selected_attention_bwd(q, k, v, block_ids, out, lse, cotangent, cfg=cfg, interpret=interpret)
    return (*grads, None)


_selected_kernel.defvjp(_selected_fwd, _selected_bwd)


def mix_branches(compressed, selected, window, gates, dtype):
    """``nsa_attention``'s output in ``dtype`` (q's): the branches weighted by
    their gates ``[..., 3]`` (``_nsa_core.gated_sum``)."""
    return core.gated_sum((compressed, selected, window), [gates[..., i, None] for i in range(3)], dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8))
def _selected_mixed_kernel(q, k, v, block_ids, compressed, window, gates, cfg, interpret):
    """``mix_branches`` of the three branches, the selected one by the kernel,
    which mixes in its epilogue (the output is written once)."""
    return kernels.selected_attention(q, k, v, block_ids, (compressed, window, gates), cfg=cfg, interpret=interpret)


def _selected_mixed_fwd(q, k, v, block_ids, compressed, window, gates, cfg, interpret):
    out, selected, lse = kernels.selected_attention(q, k, v, block_ids, (compressed, window, gates), cfg=cfg,
                                                    interpret=interpret, residuals=True)
    return out, (q, k, v, block_ids, compressed, window, gates, selected, lse)


def _selected_mixed_bwd(cfg, interpret, residuals, cotangent):
    q, k, v, block_ids, compressed, window, gates, selected, lse = residuals

    def mix(compressed, selected, window, gates):  # compressed in the layout the forward read
        if compressed.ndim == 5:
            compressed = cudnn.rows_to_tokens(compressed, cfg, q)
        return mix_branches(compressed, selected, window, gates, q.dtype)

    d_compressed, d_selected, d_window, d_gates = jax.vjp(mix, compressed, selected, window, gates)[1](cotangent)
    dq, dk, dv = kernels.selected_attention_bwd(q, k, v, block_ids, selected, lse, d_selected, cfg=cfg,
                                                interpret=interpret)
    return dq, dk, dv, None, d_compressed, d_window, d_gates


_selected_mixed_kernel.defvjp(_selected_mixed_fwd, _selected_mixed_bwd)


# ----------------------------------------------------------------------------- branches


def _per_platform(how: Plan, run, *args):
    """``run(how, *args)`` where the plan's kernels lower (CUDA), the plain plan elsewhere.

    ``plan`` looks at the default backend at trace time; the computation may
    still run on another device (a CPU array on a GPU machine), so the choice
    is left to lowering: only the branch of the target platform is compiled.
    """
    if how == Plan() or how.interpret:
        return run(how, *args)
    return lax.platform_dependent(*args, cuda=functools.partial(run, how), default=functools.partial(run, Plan()))


def selected_attention(q, k, v, block_ids, cfg, how: Plan):
    return _per_platform(how, functools.partial(_selected, cfg=cfg), q, k, v, block_ids)


def sliding_window_attention(q, k, v, cfg, how: Plan):
    return _per_platform(how, functools.partial(_window, cfg=cfg), q, k, v)


def _selected(how, q, k, v, block_ids, *, cfg):
    if how.kernels:
        return _selected_kernel(q, k, v, block_ids.astype(jnp.int32), cfg, how.interpret)
    return tiled.selected_attention(q, k, v, block_ids, cfg=cfg)


def _window(how, q, k, v, *, cfg):
    if how.cudnn_window:
        return cudnn.window_attention(q, k, v, cfg)
    return tiled.sliding_window_attention(q, k, v, cfg=cfg)


def _compressed_and_selection(q, k_cmp, v_cmp, cfg, how: Plan):
    """``(compressed branch, selected ids [B, T, Hkv, n])``: the branch as
    ``[B, T, Hq, D]``, or on cuDNN's path as ``_nsa_cudnn.compressed_rows``
    lays it out (which only the selected kernel's gate mix reads)."""
    if not how.kernels:
        return tiled.compressed_and_selection(q, k_cmp, v_cmp, cfg=cfg)
    if how.cudnn_compressed:  # the gate mix reads cuDNN's layout where it can: no pass over the output
        out, lse = cudnn.compressed_rows(q, k_cmp.astype(q.dtype), v_cmp.astype(q.dtype), cfg,
                                         lse_length=kernels.padded_length(q.shape[1]))
        if out is None or not kernels.takes_compressed_rows(q.shape[2] // k_cmp.shape[2]):
            out = cudnn.rows_to_tokens(out, cfg, q)
    else:
        out, lse = _compressed_kernel(q, k_cmp, v_cmp, cfg, how.interpret)
    block_ids = kernels.selection_ids(*map(lax.stop_gradient, (q, k_cmp.astype(q.dtype), lse)), cfg=cfg,
                                      interpret=how.interpret, native=how.native_scores)
    return out, block_ids


@functools.partial(jax.jit, static_argnames=("cfg", "how"))
def nsa_attention(q, k, v, gates, mlp, *, cfg, how: Plan):
    if q.shape[1] == 0:
        return jnp.zeros(q.shape, q.dtype)
    return _per_platform(how, functools.partial(_nsa, cfg=cfg), q, k, v, gates, mlp)


def _nsa(how, q, k, v, gates, mlp, *, cfg):
    k_cmp, v_cmp = tiled.compress_kv(k, v, mlp, cfg=cfg)
    # Rounded to the input dtype, as a model stores them (and as the kernels read them).
    k_cmp, v_cmp = core.round_to(k_cmp, q.dtype), core.round_to(v_cmp, q.dtype)
    compressed, block_ids = _compressed_and_selection(q, k_cmp, v_cmp, cfg, how)
    window = _window(how, q, k, v, cfg=cfg)
    if how.kernels:  # compressed (the kernel's) and window (cuDNN's or the plain one's) in q's dtype
        return _selected_mixed_kernel(q, k, v, block_ids.astype(jnp.int32), compressed, window, gates, cfg,
                                      how.interpret)
    return mix_branches(compressed, _selected(how, q, k, v, block_ids, cfg=cfg), window, gates, q.dtype)


@functools.partial(jax.jit, static_argnames=("cfg", "how", "max_seqlen"))
def packed_nsa_attention(q, k, v, gates, mlp, cu_seqlens, *, cfg, how: Plan, max_seqlen):
    """Packed sequences as a padded batch ``[S, max_seqlen]``, packed back afterwards."""
    index, real = core.packed_index(cu_seqlens, max_seqlen)
    padded = [core.pad_sequences(x, index, real) for x in (q, k, v, gates)]
    return core.unpad_sequences(nsa_attention(*padded, mlp, cfg=cfg, how=how), cu_seqlens, q.shape[1])
