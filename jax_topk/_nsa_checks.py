"""Argument checks of ``jax_topk.nsa``: clear errors at trace time that name the
function, the argument and the shapes."""

from __future__ import annotations

import math
import operator

import jax
import jax.numpy as jnp
import numpy as np

from jax_topk import _checks
from jax_topk import _nsa_core as core

_POSITIVE = ("block_size", "stride", "select_size", "num_selected", "window", "query_tile")
_NON_NEGATIVE = ("initial_blocks", "local_blocks")
_MLP_SHAPES = {"pos": "[l, D]", "w1": "[l*D, H]", "b1": "[H]", "w2": "[H, D]", "b2": "[D]"}


def _int_field(cfg, name: str, minimum: int) -> None:
    value = getattr(cfg, name)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"NSAConfig: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"NSAConfig: {name}={value} must be >= {minimum}")
    object.__setattr__(cfg, name, operator.index(value))  # numpy ints -> int, so equal configs hash alike


def config(cfg, fn: str | None = None) -> None:
    """Validates an ``NSAConfig`` (``fn`` None: at construction) or checks that ``cfg`` is one."""
    if fn is not None:
        if type(cfg).__name__ != "NSAConfig" or not hasattr(cfg, "softmax_scale"):
            raise TypeError(f"{fn}: cfg must be a jax_topk.nsa.NSAConfig, got {type(cfg).__name__}")
        return
    for name in _POSITIVE:
        _int_field(cfg, name, 1)
    for name in _NON_NEGATIVE:
        _int_field(cfg, name, 0)
    if cfg.block_size % cfg.stride or cfg.select_size % cfg.stride:
        raise ValueError(f"NSAConfig: stride={cfg.stride} must divide block_size={cfg.block_size} "
                         f"and select_size={cfg.select_size}")
    if cfg.block_size > cfg.select_size:
        raise ValueError(f"NSAConfig: block_size={cfg.block_size} must be <= select_size={cfg.select_size}")
    if cfg.initial_blocks + cfg.local_blocks > cfg.num_selected:
        raise ValueError(f"NSAConfig: the forced blocks (initial_blocks={cfg.initial_blocks} + "
                         f"local_blocks={cfg.local_blocks}) must fit in num_selected={cfg.num_selected}")
    if cfg.compression not in ("mean", "mlp"):
        raise ValueError(f"NSAConfig: compression must be 'mean' or 'mlp', got {cfg.compression!r}")
    if cfg.implementation not in core.IMPLEMENTATIONS:
        raise ValueError(f"NSAConfig: implementation must be one of {core.IMPLEMENTATIONS}, "
                         f"got {cfg.implementation!r}")
    if cfg.scale is not None:
        if isinstance(cfg.scale, (bool, np.bool_)) or not isinstance(cfg.scale, (int, float, np.number)):
            raise TypeError(f"NSAConfig: scale must be a float or None, got {type(cfg.scale).__name__}")
        if not (math.isfinite(cfg.scale) and cfg.scale > 0):
            raise ValueError(f"NSAConfig: scale={cfg.scale} must be a positive finite number")
        object.__setattr__(cfg, "scale", float(cfg.scale))


def array(x, name: str, fn: str, *, floating: bool = True):
    x = _checks.as_array(x, name, fn)
    if floating and not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{fn}: {name} must have a floating dtype, got {np.dtype(x.dtype).name}")
    if not floating and not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{fn}: {name} must have an integer dtype, got {np.dtype(x.dtype).name}")
    return x


def rank(x, ndim: int, name: str, layout: str, fn: str) -> None:
    if np.ndim(x) != ndim:
        raise ValueError(f"{fn}: {name} must be {layout}, got shape {tuple(np.shape(x))}")


def same_shape(a, b, name_a: str, name_b: str, fn: str) -> None:
    for x, name in ((a, name_a), (b, name_b)):
        array(x, name, fn)
        rank(x, 4, name, "[B, T, H, D]", fn)
    if a.shape != b.shape:
        raise ValueError(f"{fn}: {name_a} and {name_b} must have the same shape, "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")


def heads(q, k, q_name: str, k_name: str, fn: str) -> None:
    """Batch, head dim and GQA grouping of ``q`` ``[B, T, Hq, D]`` against ``k`` ``[B, *, Hkv, D]``."""
    rank(q, 4, q_name, "[B, T, Hq, D]", fn)
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{fn}: {q_name} {tuple(q.shape)} and {k_name} {tuple(k.shape)} differ in batch size")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"{fn}: head dim D differs: {q_name} {tuple(q.shape)}, {k_name} {tuple(k.shape)}")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(f"{fn}: the query heads Hq={q.shape[2]} of {q_name} {tuple(q.shape)} must be a "
                         f"multiple of the KV heads Hkv={k.shape[2]} of {k_name} {tuple(k.shape)}")


def qkv(q, k, v, fn: str) -> None:
    array(q, "q", fn)
    same_shape(k, v, "k", "v", fn)
    heads(q, k, "q", "k", fn)
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"{fn}: q {tuple(q.shape)} and k {tuple(k.shape)} must have the same length T")


def gates(g, q, fn: str) -> None:
    array(g, "gates", fn)
    expected = (*q.shape[:3], 3)
    if tuple(g.shape) != expected:
        raise ValueError(f"{fn}: gates must have shape [B, T, Hq, 3] = {expected} for q of shape "
                         f"{tuple(q.shape)}, got {tuple(g.shape)}")


def params(p, cfg, head_dim: int, fn: str) -> dict | None:
    """The MLP parameters for ``cfg.compression == "mlp"``, or None for ``"mean"``."""
    if cfg.compression == "mean":
        if p:
            raise ValueError(f"{fn}: params were given but cfg.compression is 'mean' (pass params=None)")
        return None
    if not isinstance(p, dict) or set(p) != {"key", "value"}:
        raise ValueError(f"{fn}: cfg.compression='mlp' needs params={{'key': ..., 'value': ...}} "
                         f"from jax_topk.nsa.init_params, got {type(p).__name__}")
    for half in ("key", "value"):
        mlp = p[half]
        if not isinstance(mlp, dict) or set(mlp) != set(_MLP_SHAPES):
            raise ValueError(f"{fn}: params[{half!r}] must have the entries {sorted(_MLP_SHAPES)}")
        hidden = np.shape(mlp["b1"])[0] if np.ndim(mlp["b1"]) == 1 else -1
        expected = {"pos": (cfg.block_size, head_dim), "w1": (cfg.block_size * head_dim, hidden),
                    "b1": (hidden,), "w2": (hidden, head_dim), "b2": (head_dim,)}
        for name, shape in expected.items():
            if tuple(np.shape(mlp[name])) != shape:
                raise ValueError(f"{fn}: params[{half!r}][{name!r}] must be {_MLP_SHAPES[name]} = {shape} "
                                 f"(l={cfg.block_size}, D={head_dim}), got {tuple(np.shape(mlp[name]))}")
    return p


def attention_inputs(q, k, v, gates_, cfg, params_, fn: str) -> dict | None:
    """Every argument of a whole NSA call (``nsa_attention``, ``reference``);
    returns the MLP parameters (None for mean pooling)."""
    config(cfg, fn)
    qkv(q, k, v, fn)
    gates(gates_, q, fn)
    return params(params_, cfg, q.shape[-1], fn)


def compressed_inputs(q, k_cmp, v_cmp, cfg, fn: str) -> None:
    config(cfg, fn)
    array(q, "q", fn)
    same_shape(k_cmp, v_cmp, "k_cmp", "v_cmp", fn)
    heads(q, k_cmp, "q", "k_cmp", fn)
    expected = core.num_compressed_blocks(q.shape[1], cfg.block_size, cfg.stride)
    if k_cmp.shape[1] != expected:
        raise ValueError(f"{fn}: k_cmp {tuple(k_cmp.shape)} must hold the {expected} compressed blocks of "
                         f"T={q.shape[1]} (l={cfg.block_size}, d={cfg.stride}); make it with compress_kv")


def block_ids(ids, q, k, cfg, fn: str) -> None:
    config(cfg, fn)
    array(ids, "block_ids", fn, floating=False)
    expected = (*k.shape[:3], cfg.num_selected)
    if tuple(ids.shape) != expected:
        raise ValueError(f"{fn}: block_ids must have shape [B, T, Hkv, n] = {expected}, got {tuple(ids.shape)}")


def positions(pos, scores, fn: str) -> None:
    array(scores, "scores", fn)
    array(pos, "positions", fn, floating=False)
    try:
        jnp.broadcast_shapes(np.shape(pos), scores.shape[:-1])
    except ValueError:
        raise ValueError(f"{fn}: positions of shape {tuple(np.shape(pos))} do not broadcast to "
                         f"scores.shape[:-1] = {tuple(scores.shape[:-1])}") from None


def gate_params(hidden, p) -> None:
    fn = "jax_topk.nsa.gates"
    array(hidden, "hidden", fn)
    if not isinstance(p, dict) or set(p) != {"weight", "bias"}:
        raise ValueError(f"{fn}: params must be {{'weight': [C, Hq, 3], 'bias': [Hq, 3]}} (init_gate_params)")
    weight, bias = np.shape(p["weight"]), np.shape(p["bias"])
    if len(weight) != 3 or weight[0] != np.shape(hidden)[-1] or weight[2] != 3 or bias != weight[1:]:
        raise ValueError(f"{fn}: weight {weight} must be [C, Hq, 3] with C = hidden's last dim "
                         f"{np.shape(hidden)[-1]}, and bias {bias} [Hq, 3]")


def cu_seqlens(cu, max_seqlen, q_shape, fn: str) -> tuple[jax.Array, int]:
    """Checks the packing and returns ``(cu_seqlens as int32, the static padded length)``."""
    cu = array(cu, "cu_seqlens", fn, floating=False)
    if np.ndim(cu) != 1 or cu.shape[0] < 2:
        raise ValueError(f"{fn}: cu_seqlens must be 1-D [S + 1] with S >= 1, got shape {tuple(cu.shape)}")
    if q_shape[0] != 1:
        raise ValueError(f"{fn}: with cu_seqlens, q must be a batch of one packed sequence "
                         f"[1, total, Hq, D], got {tuple(q_shape)}")
    total = q_shape[1]
    if max_seqlen is not None:
        max_seqlen = _checks.static_int(max_seqlen, "max_seqlen", fn)
        if max_seqlen < 0:
            raise ValueError(f"{fn}: max_seqlen={max_seqlen} must be >= 0")
    if isinstance(cu, jax.core.Tracer):
        if max_seqlen is None:
            raise ValueError(f"{fn}: cu_seqlens is traced: pass a static max_seqlen (the longest sequence)")
        return cu.astype(jnp.int32), max_seqlen
    bounds = np.asarray(cu).astype(np.int64)
    lengths = np.diff(bounds)
    if bounds[0] != 0 or (lengths < 0).any() or bounds[-1] > total:
        raise ValueError(f"{fn}: cu_seqlens must start at 0, never decrease and end at most at "
                         f"T={total} (q {tuple(q_shape)}), got {bounds.tolist()}")
    longest = int(lengths.max())
    if max_seqlen is not None and max_seqlen < longest:
        raise ValueError(f"{fn}: max_seqlen={max_seqlen} is shorter than the longest sequence ({longest})")
    return jnp.asarray(bounds, jnp.int32), longest if max_seqlen is None else max_seqlen
