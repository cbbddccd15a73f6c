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


def _top_k_abstract_eval(x, *, k):
    shape = x.shape[:-1] + (k,)
    return (
        x.update(shape=shape, dtype=x.dtype, weak_type=False),
        x.update(shape=shape, dtype=jnp.int32, weak_type=False),
    )


def _top_k_batch(args, dims, *, k):
    (x,), (dim,) = args, dims
    # The batched dimension becomes the leading row dimension: one kernel call.
    x = jnp.moveaxis(x, dim, 0)
    return top_k_p.bind(x, k=k), (0, 0)


def _top_k_jvp(primals, tangents, *, k):
    (x,), (t,) = primals, tangents
    values, indices = top_k_p.bind(x, k=k)
    if type(t) is ad.Zero:
        t_values = _compat.symbolic_zero_tangent(values)
    else:
        t_values = jnp.take_along_axis(t, indices, axis=-1)
    return (values, indices), (t_values, _compat.symbolic_zero_tangent(indices))


_top_k_fallback_lowering = mlir.lower_fun(_keys.top_k_reference, multiple_results=True)


def _top_k_lowering(platform: str):
    def lowering(ctx, x, *, k):
        target = _registry.kernel_target("top_k", platform, ctx.avals_in[0].dtype)
        if target is None:
            return _top_k_fallback_lowering(ctx, x, k=k)
        return jax.ffi.ffi_lowering(target)(ctx, x, k=np.int64(k))

    return lowering


top_k_p.def_abstract_eval(_top_k_abstract_eval)
batching.primitive_batchers[top_k_p] = _top_k_batch
ad.primitive_jvps[top_k_p] = _top_k_jvp
mlir.register_lowering(top_k_p, _top_k_fallback_lowering)  # every platform without a kernel
for _platform in _registry.platforms():
    mlir.register_lowering(top_k_p, _top_k_lowering(_platform), platform=_platform)


def top_k(x: jax.Array, k: int, *, axis: int = -1) -> tuple[jax.Array, jax.Array]:
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
    x = jnp.moveaxis(jnp.asarray(x), axis, -1)
    values, indices = top_k_p.bind(x, k=k)
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(indices, -1, axis)
