"""``top_k``: the k best elements along an axis, and their indices.

The primitive is a row primitive (``_rows.py``: abstract eval, batching, JVP,
kernel and fallback lowerings); this module adds its parameters, its pure-JAX
reference and the public function with its argument checks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_topk import _checks, _keys, _rows, _sharding

top_k_p = _rows.make_row_primitive(
    "jax_topk_top_k",
    out_len=lambda n, *, k: k,
    reference=lambda x, lengths, *, k: _keys.top_k_reference(x, k, lengths),
    ops=("top_k", "top_k_lengths"),
    ffi_attributes=lambda *, k: {"k": np.int64(k)},
    workspace_k=lambda n, *, k: k,
    split_rule=_sharding.top_k_candidate_merge,
)


def top_k(x: jax.Array, k: int, *, axis: int = -1, lengths: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """The ``k`` largest elements along ``axis`` and their indices, best first.

    A drop-in replacement for ``jax.lax.top_k``: on every backend it returns,
    bit for bit, what ``lax.top_k`` returns on CPU. Elements are ordered by the IEEE-754 total
    order (``-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN``; integers in
    their ordinary order) and ties go to the lower index. Unlike ``lax.top_k``
    on GPU, NaNs are never dropped and ``-0.0`` ranks below ``+0.0``.

    Args:
      x: array of rank >= 1 of a real dtype (bool, integer or floating).
        Complex dtypes raise ``TypeError`` (they have no total order).
      k: static number of elements to keep, ``0 <= k <= x.shape[axis]``.
      axis: axis to select along (default: the last).
      lengths: optional integer array shaped like ``x`` without ``axis``: only
        the first ``lengths[...]`` elements of each row take part. It reads as
        a sequence mask ``arange(n) < lengths``: a length <= 0 selects nothing
        and a length >= n the whole row. Output slots past a row's length hold
        index -1 and the dtype's lowest value (-inf for floats). This is how a
        batch of rows of different lengths becomes one padded kernel call.

    Returns:
      ``(values, indices)``: ``values`` has ``x``'s dtype and shape with
      ``x.shape[axis]`` replaced by ``k``; ``indices`` is int32 of that shape.
      Values are differentiable (the tangent is gathered at ``indices``);
      indices are not (float0 tangent).

    Dtypes with a native kernel on the current platform (``jax_topk.info()``)
    run it; every other real dtype and platform runs a pure-JAX sort on the
    same ordered keys, so results are identical either way. Under ``jax.vmap``
    any number of batch dimensions fold into one kernel call.

    Example:
      >>> import jax.numpy as jnp, jax_topk
      >>> values, indices = jax_topk.top_k(jnp.array([1.0, 3.0, 2.0, 3.0]), 2)
      >>> values.tolist(), indices.tolist()
      ([3.0, 3.0], [1, 3])
    """
    fn = "jax_topk.top_k"
    x = _checks.as_array(x, "x", fn)
    k = _checks.static_int(k, "k", fn)
    axis = _checks.canonical_axis(axis, np.ndim(x), np.shape(x), fn)
    _checks.orderable_dtype(x.dtype, fn)
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ValueError(f"{fn}: k={k} must be in [0, {n}] for x of shape {tuple(x.shape)} along axis {axis}")
    operands = (jnp.moveaxis(jnp.asarray(x), axis, -1),)
    if lengths is not None:
        operands += (_checks.lengths_for(lengths, x.shape, axis, fn),)
    values, indices = top_k_p.bind(*operands, k=k)
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(indices, -1, axis)
