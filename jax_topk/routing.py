"""MoE routing: score the experts of every token, pick k, weight them.

``route`` follows DESIGN section 5, in order, per token, in float32 whatever
the logits' dtype:

1. ``s = score(z)``: ``softmax``, ``sigmoid`` or ``sqrt_softplus``
   (softplus computed stably as ``max(z, 0) + log1p(exp(-|z|))``).
2. ``c = s + bias`` when a bias is given (selection only: DeepSeek's
   aux-loss-free balancing bias; no gradient flows to it).
3. Groups (DeepSeek-V3): a group's score is the sum of its two best ``c``;
   the ``top_groups`` best groups are kept (ties: lower group index) and the
   experts of the other groups cannot be selected.
4. ``ids = top_k(c, k)`` in the total order, ties to the lower expert index.
5. ``w = s[ids]`` (unbiased scores); ``w / sum(w)`` if ``renormalize``; then
   ``w * scale``.

Each call is ONE fused kernel on CPU and CUDA (float32, bfloat16 and float16
logits, up to 1024 experts, k up to 32): the logits are read once and the
weights and ids written once. Other dtypes and sizes lower to the same math as
plain JAX ops over ``jax_topk.top_k``. The kernels compute the scores from
IEEE operations only, so CPU and GPU choose the same ids bit for bit.

Selection: with a bias or groups the experts are ranked by the float32 ``c``.
Without them every score is a strictly increasing function of the logit, so
the logits themselves are ranked: the exact order of the scores, with no ties
made by float32 rounding (ties between equal logits go to the lower expert).
A NaN selection score counts as +NaN (the largest value of the total order,
whatever sign the arithmetic gave it: x86 produces -NaN), so an expert with a
NaN logit is chosen first and the NaN propagates into its weight. A softmax
over a row holding a NaN or +inf logit (or only -inf) has every score NaN:
every expert then ranks as +NaN, the first k experts are chosen, and every
weight is NaN.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from jax_topk import _checks, _route

Score = Literal["softmax", "sigmoid", "sqrt_softplus"]
_SCORES = _route.SCORES


def route(
    logits: jax.Array,
    k: int,
    *,
    score: Score = "softmax",
    bias: jax.Array | None = None,
    n_groups: int | None = None,
    top_groups: int | None = None,
    renormalize: bool = False,
    scale: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Routes every token to ``k`` experts; returns ``(weights, ids)``.

    Args:
      logits: ``[..., experts]`` router logits (any real floating dtype); the
        leading dimensions are tokens (any number of them).
      k: static number of experts per token, ``1 <= k <= experts``.
      score: ``"softmax"``, ``"sigmoid"`` or ``"sqrt_softplus"``.
      bias: optional ``[experts]`` selection bias, added to the scores for
        choosing only (its gradient is zero).
      n_groups, top_groups: optional expert groups (both or neither):
        ``n_groups`` must divide ``experts``, ``1 <= top_groups <= n_groups``
        and the kept groups must hold at least ``k`` experts.
      renormalize: divide the k weights by their sum.
      scale: multiply the weights by this factor (after renormalising).

    Returns:
      ``weights`` float32 ``[..., k]`` and ``ids`` int32 ``[..., k]``, ids by
      selection score descending (ties to the lower expert index). Weights are
      differentiable with respect to the logits; ids are not.

    Example:
      >>> import jax.numpy as jnp, jax_topk
      >>> w, ids = jax_topk.routing.route(jnp.array([[0.0, 2.0, 1.0, 2.0]]), 2, renormalize=True)
      >>> ids.tolist(), [round(v, 4) for v in w[0].tolist()]
      ([[1, 3]], [0.5, 0.5])
    """
    fn = "jax_topk.routing.route"
    logits = _checks.as_array(logits, "logits", fn)
    if np.ndim(logits) < 1 or not jnp.issubdtype(logits.dtype, jnp.floating):
        raise TypeError(f"{fn}: logits must be a floating array of shape [..., experts], "
                        f"got {np.dtype(logits.dtype).name} of shape {tuple(np.shape(logits))}")
    experts = logits.shape[-1]
    k = _checks.static_int(k, "k", fn)
    if not 1 <= k <= experts:
        raise ValueError(f"{fn}: k={k} must be in [1, {experts}] for logits of shape {tuple(logits.shape)}")
    if score not in _SCORES:
        raise ValueError(f"{fn}: unknown score {score!r}; expected one of {', '.join(map(repr, _SCORES))}")
    if bias is not None:
        bias = _checks.as_array(bias, "bias", fn)
        if tuple(np.shape(bias)) != (experts,):
            raise ValueError(f"{fn}: bias must have shape ({experts},) (one per expert of logits "
                             f"{tuple(logits.shape)}), got {tuple(np.shape(bias))}")
    if (n_groups is None) != (top_groups is None):
        raise ValueError(f"{fn}: n_groups and top_groups go together; got n_groups={n_groups}, top_groups={top_groups}")
    if n_groups is not None:
        n_groups = _checks.static_int(n_groups, "n_groups", fn)
        top_groups = _checks.static_int(top_groups, "top_groups", fn)
        if n_groups < 1 or experts % n_groups:
            raise ValueError(f"{fn}: n_groups={n_groups} must divide the {experts} experts")
        if not 1 <= top_groups <= n_groups:
            raise ValueError(f"{fn}: top_groups={top_groups} must be in [1, n_groups={n_groups}]")
        if top_groups * (experts // n_groups) < k:
            raise ValueError(f"{fn}: top_groups * (experts / n_groups) = {top_groups} * {experts // n_groups} "
                             f"= {top_groups * (experts // n_groups)} experts can be chosen, fewer than k={k}")

    bias = jnp.zeros((0,), jnp.float32) if bias is None else jnp.asarray(bias).astype(jnp.float32)
    return _route.route_p.bind(jnp.asarray(logits), bias, k=k, score=score, n_groups=n_groups or 0,
                               top_groups=top_groups or 0, renormalize=bool(renormalize), scale=float(scale))


def hash_route(
    token_ids: jax.Array,
    table: jax.Array,
    scores: jax.Array | None = None,
    *,
    renormalize: bool = True,
    scale: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """DeepSeek-V4 hash routing: ``ids = table[token_ids]``.

    Args:
      token_ids: integer ``[...]`` token ids.
      table: integer ``[vocab, k]`` expert ids per token id.
      scores: optional ``[..., experts]`` scores to gather the weights from;
        without them every chosen expert weighs ``1 / k`` (before ``scale``).
      renormalize: divide gathered weights by their sum.
      scale: multiply the weights by this factor.

    Returns:
      ``weights`` float32 ``[..., k]`` and ``ids`` int32 ``[..., k]``.

    Example:
      >>> import jax.numpy as jnp, jax_topk
      >>> w, ids = jax_topk.routing.hash_route(jnp.array([1, 0]), jnp.array([[0, 1], [2, 3]]))
      >>> ids.tolist(), w.tolist()
      ([[2, 3], [0, 1]], [[0.5, 0.5], [0.5, 0.5]])
    """
    fn = "jax_topk.routing.hash_route"
    token_ids = _checks.as_array(token_ids, "token_ids", fn)
    table = _checks.as_array(table, "table", fn)
    if not jnp.issubdtype(token_ids.dtype, jnp.integer):
        raise TypeError(f"{fn}: token_ids must be integers, got {np.dtype(token_ids.dtype).name}")
    if np.ndim(table) != 2 or not jnp.issubdtype(table.dtype, jnp.integer):
        raise TypeError(f"{fn}: table must be an integer [vocab, k] array, got "
                        f"{np.dtype(table.dtype).name} of shape {tuple(np.shape(table))}")
    ids = jnp.asarray(table)[jnp.asarray(token_ids)].astype(jnp.int32)
    k = ids.shape[-1]
    if scores is None:
        w = jnp.full(ids.shape, 1.0 / k, jnp.float32)
    else:
        scores = _checks.as_array(scores, "scores", fn)
        if tuple(np.shape(scores))[:-1] != tuple(np.shape(token_ids)):
            raise ValueError(f"{fn}: scores must have shape {tuple(np.shape(token_ids))} + (experts,), "
                             f"got {tuple(np.shape(scores))}")
        w = jnp.take_along_axis(jnp.asarray(scores).astype(jnp.float32), ids, axis=-1)
        if renormalize:
            w = w / w.sum(-1, keepdims=True)
    return w * jnp.float32(scale), ids


@dataclasses.dataclass(frozen=True)
class Preset:
    """A model family's routing, with its source formula; call it on logits
    (and a bias, for the presets that select with one).

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_topk.routing import PRESETS
      >>> weights, ids = PRESETS["mixtral"](jnp.array([[0.0, 3.0, 1.0, 2.0, 0.5, -1.0, 2.5, 0.0]]))
      >>> ids.tolist(), round(float(weights.sum()), 6)
      ([[1, 6]], 1.0)
    """

    k: int
    score: Score
    renormalize: bool
    scale: float = 1.0
    n_groups: int | None = None
    top_groups: int | None = None
    uses_bias: bool = False
    source: str = ""

    def __call__(self, logits: jax.Array, bias: jax.Array | None = None):
        if self.uses_bias and bias is None:
            raise ValueError(f"this preset ({self.source}) selects with a bias; pass bias=[experts]")
        return route(logits, self.k, score=self.score, bias=bias, n_groups=self.n_groups,
                     top_groups=self.top_groups, renormalize=self.renormalize, scale=self.scale)


PRESETS: dict[str, Preset] = {
    "deepseek_v3": Preset(8, "sigmoid", True, 2.5, n_groups=8, top_groups=4, uses_bias=True,
                          source="DeepSeek-V3: sigmoid, bias for selection, 8 groups keep 4 (group score "
                                 "= sum of top-2), k=8, renormalised, x2.5"),
    "deepseek_v4": Preset(6, "sqrt_softplus", True, 1.5, uses_bias=True,
                          source="DeepSeek-V4: sqrt(softplus), bias for selection, k=6, renormalised, x1.5"),
    "mixtral": Preset(2, "softmax", True, source="Mixtral: softmax over experts, top-2, renormalised"),
    "qwen2_moe": Preset(4, "softmax", False, source="Qwen2-MoE: softmax, top-k, not renormalised"),
    "qwen3_moe": Preset(8, "softmax", True, source="Qwen3-MoE: softmax, top-8, renormalised"),
    "gpt_oss": Preset(4, "softmax", True, source="gpt-oss: top-4 of the logits, softmax over the chosen "
                                                 "four (equals renormalised softmax weights)"),
    "topk_sigmoid": Preset(8, "sigmoid", False, source="AMD-style topk_sigmoid: sigmoid, no bias, "
                                                       "not renormalised"),
}
