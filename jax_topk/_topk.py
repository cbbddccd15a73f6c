"""The ``top_k`` primitive: abstract eval, batching, JVP and lowering side by side.

The primitive always works on the LAST axis of its operand and treats every
leading axis as a row; the public ``top_k`` moves the requested axis last. That
makes batching trivial and cheap: a batched dimension is moved to the front and
becomes more rows, so ``vmap`` at any depth and on any axis lowers to ONE
kernel call.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_topk import _checks, _compat, _keys, _registry

top_k_p = Primitive("jax_topk_top_k")
top_k_p.multiple_results = True
top_k_p.def_impl(functools.partial(_compat.apply_primitive, top_k_p))

# Operands: x [..., n] and optionally lengths [...] (int32, one per row).


def _top_k_abstract_eval(x, *lengths, k):
    shape = x.shape[:-1] + (k,)
    return (
        x.update(shape=shape, dtype=x.dtype, weak_type=False),
        x.update(shape=shape, dtype=jnp.int32, weak_type=False),
    )


def _top_k_batch(args, dims, *, k):
    # Every batched dimension becomes the leading row dimension: one kernel
    # call. x and lengths may be batched independently; an unbatched one is
    # broadcast along the other's batch dimension.
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    moved = [
        jnp.broadcast_to(a, (size,) + a.shape) if d is None else jnp.moveaxis(a, d, 0)
        for a, d in zip(args, dims)
    ]
    return top_k_p.bind(*moved, k=k), (0, 0)


def _top_k_jvp(primals, tangents, *, k):
    x, *lengths = primals
    t = tangents[0]
    values, indices = top_k_p.bind(x, *lengths, k=k)
    if type(t) is ad.Zero:
        t_values = _compat.symbolic_zero_tangent(values)
    else:
        # Padded slots (index -1) hold a constant: their tangent is zero.
        gathered = jnp.take_along_axis(t, jnp.maximum(indices, 0), axis=-1)
        t_values = jnp.where(indices >= 0, gathered, jnp.zeros_like(gathered)) if lengths else gathered
    return (values, indices), (t_values, _compat.symbolic_zero_tangent(indices))


def _top_k_fallback(x, *lengths, k):
    return _keys.top_k_reference(x, k, lengths[0] if lengths else None)


_top_k_fallback_lowering = mlir.lower_fun(_top_k_fallback, multiple_results=True)


def _top_k_lowering(platform: str):
    def lowering(ctx, x, *lengths, k):
        op = "top_k_lengths" if lengths else "top_k"
        target = _registry.kernel_target(op, platform, ctx.avals_in[0].dtype)
        if target is None:
            return _top_k_fallback_lowering(ctx, x, *lengths, k=k)
        return jax.ffi.ffi_lowering(target)(ctx, x, *lengths, k=np.int64(k))

    return lowering


top_k_p.def_abstract_eval(_top_k_abstract_eval)
batching.primitive_batchers[top_k_p] = _top_k_batch
ad.primitive_jvps[top_k_p] = _top_k_jvp
mlir.register_lowering(top_k_p, _top_k_fallback_lowering)  # every platform without a kernel
for _platform in _registry.platforms():
    mlir.register_lowering(top_k_p, _top_k_lowering(_platform), platform=_platform)


def top_k(x: jax.Array, k: int, *, axis: int = -1, lengths: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """The ``k`` largest elements along ``axis`` and their indices, best first.

    A drop-in replacement for ``jax.lax.top_k`` with the same results on CPU,
    bit for bit, on every backend. Elements are ordered by the IEEE-754 total
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
