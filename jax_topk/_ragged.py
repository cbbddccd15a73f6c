"""``ragged_top_k`` / ``ragged_sort``: a list of 1-D arrays of different
lengths, padded into one matrix with ``lengths`` and handled by ONE kernel call
(instead of one call per array)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_topk import _checks, _keys
from jax_topk._sort import sort
from jax_topk._topk import top_k


def _pad_rows(arrays: Sequence, fn: str) -> tuple[jax.Array, jax.Array]:
    """Stacks 1-D arrays of one dtype into [len(arrays), max_len] plus their lengths."""
    if isinstance(arrays, (jax.Array, np.ndarray)) or not isinstance(arrays, Sequence) or not arrays:
        raise TypeError(f"{fn}: arrays must be a non-empty list or tuple of 1-D arrays, got {type(arrays).__name__}")
    arrays = [_checks.as_array(a, f"arrays[{i}]", fn) for i, a in enumerate(arrays)]
    for i, a in enumerate(arrays):
        if np.ndim(a) != 1:
            raise ValueError(f"{fn}: arrays[{i}] must be 1-D, got shape {tuple(np.shape(a))}")
    dtypes = {np.dtype(a.dtype) for a in arrays}
    if len(dtypes) != 1:
        raise TypeError(f"{fn}: arrays must share one dtype, got {sorted(d.name for d in dtypes)}")
    width = max(a.shape[0] for a in arrays)
    # Pad and stack raw bits: moving bfloat16 through XLA may quiet NaN payloads.
    bits = jnp.stack([jnp.pad(_keys.to_bits(jnp.asarray(a)), (0, width - a.shape[0])) for a in arrays])
    x = _keys.from_bits(bits, arrays[0].dtype)
    lengths = jnp.array([a.shape[0] for a in arrays], jnp.int32)
    return x, lengths


def ragged_top_k(arrays: Sequence[jax.Array], k: int) -> tuple[jax.Array, jax.Array]:
    """Top-k of each of several 1-D arrays of different lengths, in one kernel call.

    Equivalent to ``[top_k(a, min(k, len(a))) for a in arrays]``, padded: row
    ``b`` of the results holds array ``b``'s best ``min(k, len(a))`` elements
    and indices (into that array), then the dtype's lowest value and index -1.

    Args:
      arrays: a list or tuple of 1-D arrays of one real dtype.
      k: static int, ``0 <= k <= max(len(a) for a in arrays)``.

    Returns:
      ``(values, indices)`` of shape ``[len(arrays), k]``.

    Example:
      >>> import jax.numpy as jnp, jax_topk
      >>> v, i = jax_topk.ragged_top_k([jnp.array([1.0, 5.0, 3.0]), jnp.array([2.0])], 2)
      >>> v.tolist(), i.tolist()
      ([[5.0, 3.0], [2.0, -inf]], [[1, 2], [0, -1]])
    """
    x, lengths = _pad_rows(arrays, "jax_topk.ragged_top_k")
    return top_k(x, k, lengths=lengths)


def ragged_sort(arrays: Sequence[jax.Array], *, descending: bool = False) -> tuple[jax.Array, jax.Array]:
    """Stable sort of each of several 1-D arrays of different lengths, in one call.

    Row ``b`` of the results holds array ``b`` sorted (total order, ties by
    lower index) and its indices, padded to the longest array with the dtype's
    lowest value and index -1.

    Example:
      >>> import jax.numpy as jnp, jax_topk
      >>> v, i = jax_topk.ragged_sort([jnp.array([3, 1, 2], jnp.int32), jnp.array([7], jnp.int32)])
      >>> v.tolist(), i.tolist()
      ([[1, 2, 3], [7, -2147483648, -2147483648]], [[1, 2, 0], [0, -1, -1]])
    """
    x, lengths = _pad_rows(arrays, "jax_topk.ragged_sort")
    return sort(x, descending=descending, lengths=lengths)
