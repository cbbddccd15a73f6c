"""Native Sparse Attention (NSA, arXiv 2502.11089) as pure JAX functions.

Each query attends through three branches, mixed by per-head gates:

1. **Compressed**: keys and values are cut into causal blocks of length
   ``l`` every ``d`` tokens (block i covers tokens ``[i*d, i*d + l)``) and each
   block becomes one key and one value (mean pooling, or a learned MLP over the
   block with an intra-block position embedding: ``compress_kv``). A query at
   position t attends the blocks that lie wholly at or before it
   (``i*d + l - 1 <= t``). A query that sees no complete block (t < l - 1)
   gets a **zero** output from this branch (and zero block scores).
2. **Selected**: the compressed attention probabilities, summed over the query
   heads of each GQA group, score selection blocks of length ``l'``
   (block j covers ``[j*l', (j+1)*l')``; ``block_scores``). Per query token and
   KV head, the top ``n`` blocks are chosen through ``jax_topk.top_k``
   (``select_blocks``) and the query attends their tokens (``selected_attention``).
3. **Sliding window**: the last ``w`` tokens, ``t - w < s <= t``
   (``sliding_window_attention``).

``nsa_attention`` returns ``g_cmp * o_cmp + g_slc * o_slc + g_win * o_win``
with gates ``[B, T, Hq, 3]`` (compressed, selected, window; ``gates`` makes
them as a sigmoid of a linear map of the hidden state, or pass your own).
Causal everywhere: no output at position t depends on a token after t.

Layout: queries ``[B, T, Hq, D]``, keys and values ``[B, T, Hkv, D]`` with
``Hq`` a multiple of ``Hkv``; query head h reads KV head ``h // (Hq // Hkv)``.
Attention math runs in float32 (float64 for float64 inputs); branch outputs
and ``nsa_attention`` return the query dtype. The softmax scale is
``cfg.scale`` or ``1/sqrt(D)``.

Selection rule (deterministic): per query t and KV head, the blocks that start
after t rank -inf, the forced blocks rank +inf (the first
``cfg.initial_blocks`` blocks and the ``cfg.local_blocks`` blocks ending at the
query's own block ``t // l'``), every other block ranks by its score; the top n
are taken in the total order of ``jax_topk.top_k``, ties to the lower block
index. Picks of blocks that start after t (when fewer than n blocks start at or
before t) become id -1 and are never attended. Inside the query's own block,
keys after t are masked. Selection is not differentiated (ids are integers); the
scores still get gradients through the compressed branch.

Compression-to-selection map (the paper's eq. 9): selection block j scores
``sum_c p[c] * overlap(c, j) / d``, where ``overlap`` counts the tokens that
compression block c shares with selection block j: the double sum over
``m < l'/d``, ``n < l/d`` of ``p[(l'/d)*j + m - n]``. (The printed index
``(l'/d)*j - m - n`` would give block j the blocks of block j - 1.)

Memory is O(T): the compressed branch with block scoring and selection, the
selected branch and the window branch each run over query tiles of
``cfg.query_tile`` queries with ``jax.lax.map`` (peak per tile: ``tile * Nc``
scores, ``tile * n * l'`` gathered keys, ``tile * (tile + w)`` window scores),
and tiles are rematerialised under ``jax.grad``. No ``[T, T]`` array exists.

Implementations (``NSAConfig.implementation``, decided in ``_nsa_dispatch``):
on a CUDA GPU the selected branch is a Pallas (Triton) kernel
(``_nsa_pallas``), and so are the block scores in float32, which in bfloat16
and float16 come from a CUDA tensor-core kernel (``_nsa_native``, for GQA
groups of at most 16 and head dims 64 and 128; else Pallas); the compressed
branch is cuDNN's flash attention
(bfloat16 and float16: one causal attention over the queries shifted by
``l - 1``, ``_nsa_cudnn``) or a Pallas kernel (float32), and the window branch is cuDNN's
sliding-window flash attention (bfloat16 and float16); elsewhere, and for
shapes the kernels do not take (head dim, ``Hq/Hkv``, ``l'`` and ``l'/d`` must
be powers of two), the plain-JAX tiled branches run. All compute the same
function: they differ by the order of float sums and, in bfloat16, by the
kernels rounding attention probabilities to bfloat16 before they meet the
values. The kernels' block scores exist for 4096 queries at a time (memory stays
O(T)). Gradients: cuDNN's backward passes for its branches, backward kernels
for the selected branch, the plain branch's VJP for the float32 compressed
kernel. On every path the compressed keys and values are rounded to the input
dtype before attention.

Variable-length batches: ``nsa_attention(..., cu_seqlens=...)`` takes packed
sequences in a batch of one (``q`` ``[1, total, Hq, D]``) and int32
``cu_seqlens`` ``[S + 1]`` (starts, ``cu_seqlens[0] == 0``, non-decreasing,
``cu_seqlens[-1] <= total``). Positions and blocks restart at every sequence;
tokens after ``cu_seqlens[-1]`` get zeros. The sequences are gathered into a
padded ``[S, max_seqlen]`` batch, run, and scattered back.

``reference`` computes the same function with dense ``[T, T]`` masks, for tests.

Example:
  >>> import numpy as np, jax.numpy as jnp
  >>> from jax_topk import nsa
  >>> cfg = nsa.NSAConfig(block_size=4, stride=2, select_size=4, num_selected=3, window=4)
  >>> q, k, v = np.random.default_rng(0).standard_normal((3, 1, 10, 2, 8), np.float32)
  >>> g = jnp.full((1, 10, 2, 3), 0.5)
  >>> out = nsa.nsa_attention(q, k, v, g, cfg)
  >>> out.shape, bool(jnp.allclose(out, nsa.reference(q, k, v, g, cfg), atol=1e-5))
  ((1, 10, 2, 8), True)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp

from jax_topk import _nsa_checks as checks
from jax_topk import _nsa_dispatch as dispatch
from jax_topk import _nsa_reference
from jax_topk import _nsa_tiled as tiled

__all__ = [
    "NSAConfig", "block_scores", "compress_kv", "compressed_attention", "gates", "init_gate_params",
    "init_params", "nsa_attention", "reference", "select_blocks", "selected_attention",
    "sliding_window_attention",
]

Params = dict[str, dict[str, jax.Array]]


@dataclasses.dataclass(frozen=True)
class NSAConfig:
    """Static NSA sizes (hashable: pass it as a static argument of ``jax.jit``).

    Attributes:
      block_size: compression block length l.
      stride: compression stride d; divides ``block_size`` and ``select_size``.
      select_size: selection block length l' (``block_size <= select_size``).
      num_selected: selected blocks n per query and KV head (forced blocks included).
      window: sliding window w (the query and the ``w - 1`` tokens before it).
      compression: ``"mean"`` (mean pooling) or ``"mlp"`` (learned, ``init_params``).
      initial_blocks: leading selection blocks always selected (the paper: 1).
      local_blocks: selection blocks ending at the query's own block always selected (the paper: 2).
      scale: softmax scale; None means ``1/sqrt(head_dim)``.
      query_tile: queries per tile of the O(T)-memory loops.
      implementation: ``"auto"`` (Pallas kernels and cuDNN's flash attention
        on a CUDA GPU, where the shapes suit them; plain JAX elsewhere),
        ``"xla"`` (plain JAX everywhere) or ``"pallas"`` (the kernels, in Pallas's interpreter off
        the GPU; an error when the shapes do not suit them). All give the same
        function; see "Implementations" in the module docstring.

    Example:
      >>> from jax_topk.nsa import NSAConfig
      >>> NSAConfig().select_size, NSAConfig(window=128).window
      (64, 128)
      >>> NSAConfig(block_size=24, stride=16)
      Traceback (most recent call last):
      ...
      ValueError: NSAConfig: stride=16 must divide block_size=24 and select_size=64
    """

    block_size: int = 32
    stride: int = 16
    select_size: int = 64
    num_selected: int = 16
    window: int = 512
    compression: Literal["mean", "mlp"] = "mean"
    initial_blocks: int = 1
    local_blocks: int = 2
    scale: float | None = None
    query_tile: int = 64
    implementation: Literal["auto", "xla", "pallas"] = "auto"

    def __post_init__(self):
        checks.config(self)

    def softmax_scale(self, head_dim: int) -> float:
        """``scale`` or ``1/sqrt(head_dim)``.

        Example:
          >>> NSAConfig().softmax_scale(16)
          0.25
        """
        return float(self.scale) if self.scale is not None else 1.0 / math.sqrt(head_dim)


def init_params(key: jax.Array, cfg: NSAConfig, head_dim: int, *, hidden_dim: int | None = None,
                dtype=jnp.float32) -> Params:
    """Parameters of the learned compression (a plain dict; empty for ``"mean"``).

    ``{"key": mlp, "value": mlp}`` with ``mlp = {"pos": [l, D], "w1": [l*D, H],
    "b1": [H], "w2": [H, D], "b2": [D]}`` (H = ``hidden_dim``, default D),
    shared by all KV heads: ``phi(block) = w2 . gelu(w1 . flatten(block + pos) + b1) + b2``.

    Example:
      >>> import jax
      >>> from jax_topk import nsa
      >>> p = nsa.init_params(jax.random.key(0), nsa.NSAConfig(compression="mlp"), 16)
      >>> p["key"]["w1"].shape, nsa.init_params(jax.random.key(0), nsa.NSAConfig(), 16)
      ((512, 16), {})
    """
    checks.config(cfg)
    if cfg.compression == "mean":
        return {}
    hidden_dim = head_dim if hidden_dim is None else hidden_dim
    fan_in = cfg.block_size * head_dim

    def mlp(k):
        k_pos, k1, k2 = jax.random.split(k, 3)
        return {
            "pos": 0.02 * jax.random.normal(k_pos, (cfg.block_size, head_dim), dtype),
            "w1": jax.random.normal(k1, (fan_in, hidden_dim), dtype) / math.sqrt(fan_in),
            "b1": jnp.zeros((hidden_dim,), dtype),
            "w2": jax.random.normal(k2, (hidden_dim, head_dim), dtype) / math.sqrt(hidden_dim),
            "b2": jnp.zeros((head_dim,), dtype),
        }

    key_k, key_v = jax.random.split(key)
    return {"key": mlp(key_k), "value": mlp(key_v)}


def init_gate_params(key: jax.Array, hidden_dim: int, num_heads: int, *, dtype=jnp.float32) -> dict[str, jax.Array]:
    """Parameters of ``gates``: ``{"weight": [C, Hq, 3], "bias": [Hq, 3]}``.

    Example:
      >>> import jax
      >>> from jax_topk import nsa
      >>> p = nsa.init_gate_params(jax.random.key(0), 32, 4)
      >>> p["weight"].shape, p["bias"].shape
      ((32, 4, 3), (4, 3))
    """
    weight = jax.random.normal(key, (hidden_dim, num_heads, 3), dtype) / math.sqrt(hidden_dim)
    return {"weight": weight, "bias": jnp.zeros((num_heads, 3), dtype)}


def gates(hidden: jax.Array, params: dict[str, jax.Array]) -> jax.Array:
    """Branch gates ``sigmoid(hidden @ weight + bias)``: ``[..., C] -> [..., Hq, 3]``.

    The last axis is (compressed, selected, window), as ``nsa_attention`` takes them.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jax_topk import nsa
      >>> g = nsa.gates(jnp.zeros((1, 5, 32)), nsa.init_gate_params(jax.random.key(0), 32, 4))
      >>> g.shape, float(g[0, 0, 0, 0])
      ((1, 5, 4, 3), 0.5)
    """
    checks.gate_params(hidden, params)
    return jax.nn.sigmoid(jnp.einsum("...c,chk->...hk", hidden, params["weight"]) + params["bias"])


def compress_kv(k: jax.Array, v: jax.Array, cfg: NSAConfig, *, params: Params | None = None
                ) -> tuple[jax.Array, jax.Array]:
    """Compressed keys and values ``[B, Nc, Hkv, D]``, ``Nc = (T - l) // d + 1`` (0 if T < l).

    Block i summarises tokens ``[i*d, i*d + l)`` by their mean, or by the MLP
    of ``params`` (``cfg.compression == "mlp"``). Returned in the compute dtype
    (float32, or float64 for float64 input).

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_topk import nsa
      >>> k = jnp.arange(8.0).reshape(1, 8, 1, 1)
      >>> kc, vc = nsa.compress_kv(k, k, nsa.NSAConfig(block_size=4, stride=2, select_size=4))
      >>> kc[0, :, 0, 0].tolist()
      [1.5, 3.5, 5.5]
    """
    fn = "jax_topk.nsa.compress_kv"
    checks.config(cfg, fn)
    checks.same_shape(k, v, "k", "v", fn)
    mlp = checks.params(params, cfg, k.shape[-1], fn)
    return tiled.compress_kv(k, v, mlp, cfg=cfg)


def compressed_attention(q: jax.Array, k_cmp: jax.Array, v_cmp: jax.Array, cfg: NSAConfig) -> jax.Array:
    """The compressed branch: ``[B, T, Hq, D]`` in ``q``'s dtype.

    Query t attends compressed block i iff ``i*d + l - 1 <= t``; a query that
    sees no block (t < l - 1) gets zeros. ``k_cmp``, ``v_cmp``: ``compress_kv``'s output.

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_topk import nsa
      >>> cfg = nsa.NSAConfig(block_size=4, stride=2, select_size=4)
      >>> q = k = jnp.ones((1, 8, 1, 2))
      >>> kc, vc = nsa.compress_kv(k, k, cfg)
      >>> nsa.compressed_attention(q, kc, vc, cfg)[0, :, 0, 0].tolist()
      [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """
    checks.compressed_inputs(q, k_cmp, v_cmp, cfg, "jax_topk.nsa.compressed_attention")
    return tiled.compressed_attention(q, k_cmp, v_cmp, cfg=cfg)


def block_scores(q: jax.Array, k_cmp: jax.Array, cfg: NSAConfig) -> jax.Array:
    """Selection-block scores ``[B, T, Hkv, Ns]`` in the compute dtype, ``Ns = ceil(T / l')``.

    The compressed attention probabilities of each query, summed over the query
    heads of its GQA group, mapped to selection blocks by overlap (the module
    docstring's eq. 9). The result itself is ``T * Ns`` large: ``nsa_attention``
    scores and selects tile by tile instead of calling this.

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_topk import nsa
      >>> cfg = nsa.NSAConfig(block_size=4, stride=4, select_size=4)
      >>> k = jnp.ones((1, 8, 1, 2))
      >>> kc, _ = nsa.compress_kv(k, k, cfg)
      >>> nsa.block_scores(jnp.ones((1, 8, 2, 2)), kc, cfg)[0, :, 0].tolist()   # 2 heads per group
      [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [2.0, 0.0], [2.0, 0.0], [2.0, 0.0], [2.0, 0.0], [1.0, 1.0]]
    """
    fn = "jax_topk.nsa.block_scores"
    checks.compressed_inputs(q, k_cmp, k_cmp, cfg, fn)
    return tiled.block_scores(q, k_cmp, cfg=cfg)


def select_blocks(scores: jax.Array, cfg: NSAConfig, *, positions: jax.Array | None = None) -> jax.Array:
    """Selected block ids ``[..., n]`` (int32) from block scores ``[..., Ns]``.

    Ranked through ``jax_topk.top_k``: forced blocks (the first
    ``cfg.initial_blocks``, and the ``cfg.local_blocks`` ending at the query's
    block) first, in increasing order, then the highest scores, ties to the
    lower block index. Blocks that start after the query are never chosen: when
    fewer than n blocks start at or before it, the missing picks are -1.

    ``positions`` (integer, broadcastable to ``scores.shape[:-1]``) are the
    queries' positions; by default ``scores`` is ``[B, T, Hkv, Ns]`` as
    ``block_scores`` returns it and the positions are ``arange(T)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_topk import nsa
      >>> cfg = nsa.NSAConfig(block_size=4, stride=4, select_size=4, num_selected=3, local_blocks=1)
      >>> scores = jnp.array([0.0, 0.5, 0.9, 0.1, 0.7, 0.0])
      >>> nsa.select_blocks(scores, cfg, positions=jnp.array(17)).tolist()
      [0, 4, 2]
      >>> nsa.select_blocks(scores, cfg, positions=jnp.array(5)).tolist()
      [0, 1, -1]
    """
    fn = "jax_topk.nsa.select_blocks"
    checks.config(cfg, fn)
    if positions is None:
        checks.rank(scores, 4, "scores", "[B, T, Hkv, Ns]", fn)
        positions = jnp.arange(scores.shape[1], dtype=jnp.int32)[:, None]
    checks.positions(positions, scores, fn)
    return tiled.select_blocks(scores, jnp.asarray(positions).astype(jnp.int32), cfg=cfg)


def selected_attention(q: jax.Array, k: jax.Array, v: jax.Array, block_ids: jax.Array, cfg: NSAConfig
                       ) -> jax.Array:
    """The selected branch: attention over the tokens of each query's blocks, ``[B, T, Hq, D]``.

    ``block_ids``: int32 ``[B, T, Hkv, n]``, per query token and KV head the
    selection blocks to attend (block j = tokens ``[j*l', (j+1)*l')``), as
    ``select_blocks`` makes them: distinct, -1 for none, any order. Keys after
    the query are masked, so a block that starts after it adds nothing. Every
    query head of a GQA group uses its KV head's blocks. Runs over query tiles,
    or as a Pallas kernel on a CUDA GPU (``NSAConfig.implementation``).

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_topk import nsa
      >>> cfg = nsa.NSAConfig(block_size=4, stride=4, select_size=4, num_selected=1, initial_blocks=0,
      ...                     local_blocks=0)
      >>> v = jnp.arange(8.0).reshape(1, 8, 1, 1)
      >>> ids = jnp.full((1, 8, 1, 1), 1, jnp.int32)   # every query: tokens 4..7
      >>> nsa.selected_attention(jnp.zeros((1, 8, 1, 1)), v, v, ids, cfg)[0, :, 0, 0].tolist()
      [0.0, 0.0, 0.0, 0.0, 4.0, 4.5, 5.0, 5.5]
    """
    fn = "jax_topk.nsa.selected_attention"
    checks.qkv(q, k, v, fn)
    checks.block_ids(block_ids, q, k, cfg, fn)
    how = dispatch.plan(cfg, q.shape, q.dtype, k.shape[2], fn)
    return dispatch.selected_attention(q, k, v, block_ids, cfg, how)


def sliding_window_attention(q: jax.Array, k: jax.Array, v: jax.Array, cfg: NSAConfig) -> jax.Array:
    """The window branch: query t attends keys ``t - w < s <= t``, ``[B, T, Hq, D]``.

    Runs over query tiles, each reading a key span of ``tile + w - 1``, or
    through cuDNN's sliding-window attention on a CUDA GPU (bfloat16, float16).

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_topk import nsa
      >>> v = jnp.arange(6.0).reshape(1, 6, 1, 1)
      >>> out = nsa.sliding_window_attention(jnp.zeros((1, 6, 1, 1)), v, v, nsa.NSAConfig(window=2))
      >>> out[0, :, 0, 0].tolist()
      [0.0, 0.5, 1.5, 2.5, 3.5, 4.5]
    """
    fn = "jax_topk.nsa.sliding_window_attention"
    checks.config(cfg, fn)
    checks.qkv(q, k, v, fn)
    how = dispatch.plan(cfg, q.shape, q.dtype, k.shape[2], fn)
    return dispatch.sliding_window_attention(q, k, v, cfg, how)


def nsa_attention(q: jax.Array, k: jax.Array, v: jax.Array, gates: jax.Array, cfg: NSAConfig, *,
                  params: Params | None = None, cu_seqlens: jax.Array | None = None,
                  max_seqlen: int | None = None) -> jax.Array:
    """Native Sparse Attention: the gated sum of the three branches, ``[B, T, Hq, D]`` in ``q``'s dtype.

    Args:
      q: queries ``[B, T, Hq, D]``.
      k, v: keys and values ``[B, T, Hkv, D]``, ``Hq`` a multiple of ``Hkv``.
      gates: ``[B, T, Hq, 3]`` weights of the (compressed, selected, window) branches.
      cfg: the static sizes (``NSAConfig``).
      params: ``init_params``'s dict when ``cfg.compression == "mlp"``.
      cu_seqlens: int ``[S + 1]`` sequence starts of packed sequences in a batch
        of one (``B == 1``): ``cu_seqlens[0] == 0``, non-decreasing,
        ``cu_seqlens[-1] <= T``. Sequences never attend across boundaries;
        tokens after ``cu_seqlens[-1]`` get zeros.
      max_seqlen: static bound on the sequence lengths (the padded length);
        needed when ``cu_seqlens`` is traced, derived when it is concrete.

    Per query tile, the compressed attention probabilities give the block
    scores and the selection in one pass; ``selected_attention`` and
    ``sliding_window_attention`` then run tiled too, so memory is O(T).
    Differentiable in ``q``, ``k``, ``v``, ``gates`` and ``params``; works
    under ``jit`` (``cfg`` static), ``vmap`` and ``grad``.

    Example:
      >>> import numpy as np, jax.numpy as jnp
      >>> from jax_topk import nsa
      >>> cfg = nsa.NSAConfig(block_size=4, stride=2, select_size=4, num_selected=3, window=4)
      >>> rng = np.random.default_rng(0)
      >>> q, k = rng.standard_normal((1, 12, 4, 8), np.float32), rng.standard_normal((1, 12, 2, 8), np.float32)
      >>> g = jnp.ones((1, 12, 4, 3)) / 3    # k doubles as v below
      >>> both = nsa.nsa_attention(q, k, k, g, cfg, cu_seqlens=jnp.array([0, 5, 12], jnp.int32))
      >>> first = nsa.nsa_attention(q[:, :5], k[:, :5], k[:, :5], g[:, :5], cfg)
      >>> bool(jnp.allclose(both[:, :5], first, atol=1e-6))
      True
    """
    fn = "jax_topk.nsa.nsa_attention"
    mlp = checks.attention_inputs(q, k, v, gates, cfg, params, fn)
    how = dispatch.plan(cfg, q.shape, q.dtype, k.shape[2], fn)
    if cu_seqlens is None:
        return dispatch.nsa_attention(q, k, v, gates, mlp, cfg=cfg, how=how)
    cu_seqlens, max_seqlen = checks.cu_seqlens(cu_seqlens, max_seqlen, q.shape, fn)
    return dispatch.packed_nsa_attention(q, k, v, gates, mlp, cu_seqlens, cfg=cfg, how=how,
                                         max_seqlen=max_seqlen)


def reference(q: jax.Array, k: jax.Array, v: jax.Array, gates: jax.Array, cfg: NSAConfig, *,
              params: Params | None = None) -> jax.Array:
    """``nsa_attention`` by brute force with dense ``[T, T]`` masks, for tests (memory O(T^2)).

    Written apart from the tiled path: dense masks per branch, an explicit
    overlap matrix for the block scores, and a stable argsort with the same
    tie rule for the selection.

    Example:
      >>> import numpy as np, jax.numpy as jnp
      >>> from jax_topk import nsa
      >>> cfg = nsa.NSAConfig(block_size=2, stride=2, select_size=2, window=3)
      >>> q, k, v = np.random.default_rng(1).standard_normal((3, 2, 7, 1, 4), np.float32)
      >>> g = jnp.ones((2, 7, 1, 3))
      >>> bool(jnp.allclose(nsa.reference(q, k, v, g, cfg), nsa.nsa_attention(q, k, v, g, cfg), atol=1e-5))
      True
    """
    mlp = checks.attention_inputs(q, k, v, gates, cfg, params, "jax_topk.nsa.reference")
    return _nsa_reference.dense_nsa(q, k, v, gates, mlp, cfg=cfg)

