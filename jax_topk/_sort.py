"""``sort`` and ``argsort``: a stable sort along an axis in the total order.

The primitive is a row primitive (``_rows.py``); this module adds its
parameter (the direction), its pure-JAX reference and the public functions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_topk import _checks, _keys, _rows

sort_p = _rows.make_row_primitive(
    "jax_topk_sort",
    out_len=lambda n, *, descending: n,
    reference=lambda x, lengths, *, descending: _keys.sort_reference(x, descending, lengths),
    ops=("sort", "sort_lengths"),
    ffi_attributes=lambda *, descending: {"descending": np.bool_(descending)},
    workspace_k=lambda n, *, descending: n,
)


def _sort(fn: str, x, axis, descending, lengths) -> tuple[jax.Array, jax.Array]:
    x = _checks.as_array(x, "x", fn)
    axis = _checks.canonical_axis(axis, np.ndim(x), np.shape(x), fn)
    _checks.orderable_dtype(x.dtype, fn)
    if not isinstance(descending, (bool, np.bool_)):
        raise TypeError(f"{fn}: descending must be a bool, got {type(descending).__name__} {descending!r}")
    operands = (jnp.moveaxis(jnp.asarray(x), axis, -1),)
    if lengths is not None:
        operands += (_checks.lengths_for(lengths, x.shape, axis, fn),)
    values, indices = sort_p.bind(*operands, descending=bool(descending))
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(indices, -1, axis)


def sort(x: jax.Array, *, axis: int = -1, descending: bool = False,
         lengths: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Stable sort along ``axis`` in the IEEE-754 total order; values and indices.

    Elements are ordered ``-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf <
    +NaN`` (integers in their ordinary order), and equal elements keep their
    original order (lower index first) in both directions, so a descending sort
    is not the reverse of an ascending one when there are ties. Unlike
    ``jnp.sort``/``jnp.argsort``, ``-0.0`` sorts below ``+0.0`` and NaNs are
    ranked by sign and payload rather than collapsed.

    Args:
      x: array of rank >= 1 of a real dtype (bool, integer or floating).
      axis: axis to sort along (default: the last).
      descending: largest first if True.
      lengths: optional integer array shaped like ``x`` without ``axis``: only
        the first ``lengths[...]`` elements of each row are sorted (read as the
        sequence mask ``arange(n) < lengths``); the slots past a row's length
        hold index -1 and the dtype's lowest value (-inf for floats).

    Returns:
      ``(values, indices)`` shaped like ``x``; indices are int32. Values are
      differentiable (the tangent is gathered at ``indices``).

    Example:
      >>> import jax.numpy as jnp, jax_topk
      >>> values, indices = jax_topk.sort(jnp.array([2.0, -0.0, 0.0, 1.0]))
      >>> values.tolist(), indices.tolist()
      ([-0.0, 0.0, 1.0, 2.0], [1, 2, 3, 0])
    """
    return _sort("jax_topk.sort", x, axis, descending, lengths)


def argsort(x: jax.Array, *, axis: int = -1, descending: bool = False,
            lengths: jax.Array | None = None) -> jax.Array:
    """The indices of ``sort(x, axis=axis, descending=descending, lengths=lengths)``.

    Example:
      >>> import jax.numpy as jnp, jax_topk
      >>> jax_topk.argsort(jnp.array([3, 1, 2, 1]), descending=True).tolist()
      [0, 2, 1, 3]
    """
    return _sort("jax_topk.argsort", x, axis, descending, lengths)[1]
