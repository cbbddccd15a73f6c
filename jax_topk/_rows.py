"""The rules shared by the row primitives (``top_k``, ``sort``).

A row primitive takes ``x`` of shape ``[..., n]`` and, optionally, ``lengths``
of shape ``[...]`` (int32, one per row), works on the LAST axis (the public
functions move the requested axis last), and returns ``values [..., m]`` (x's
dtype) and ``indices [..., m]`` (int32), where ``m`` depends on the op's
static parameters. Every leading axis is a row, which makes batching trivial
and cheap: a batched dimension is moved to the front and becomes more rows, so
``vmap`` at any depth and on any axis lowers to ONE kernel call.

Side by side here: abstract eval, batching, JVP, the kernel lowering per
platform (FFI targets from the registry) and the pure-JAX fallback lowering.
Across devices the primitive lowers through ``_sharding.py`` (rows stay where
they are; a sharded last axis runs the op's split rule).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_topk import _compat, _registry, _sharding


def make_row_primitive(
    name: str,
    *,
    out_len: Callable[..., int],
    reference: Callable[..., tuple[jax.Array, jax.Array]],
    ops: tuple[str, str],
    ffi_attributes: Callable[..., dict],
    workspace_k: Callable[..., int] | None = None,
    split_rule: _sharding.SplitRule | None = None,
) -> Primitive:
    """Builds and registers a row primitive.

    Args:
      name: the primitive's name.
      out_len: ``(n, **params) -> m``, the length of the outputs' last axis.
      reference: ``(x, lengths_or_None, **params) -> (values, indices)`` in
        pure JAX: the fallback lowering, with exactly the kernels' results.
      ops: the registry op names of the kernels without and with lengths.
      ffi_attributes: ``(**params) -> dict`` of the FFI attributes (NumPy scalars).
      workspace_k: ``(n, **params) -> k`` passed to the registry's workspace
        rule; platforms whose handlers take a workspace (GPU) get an extra
        uint8 result of that many bytes, dropped after the call.
      split_rule: how the op runs when the last axis is sharded across
        devices (``_sharding.py``); None gathers that axis first.
    """
    p = Primitive(name)
    p.multiple_results = True
    p.def_impl(functools.partial(_compat.apply_primitive, p))
    # The kernel call itself; `p` lowers to it, partitioned across devices
    # when its operands are sharded (_sharding.py).
    local = Primitive(name + "_local")
    local.multiple_results = True

    def abstract_eval(x, *lengths, **params):
        shape = x.shape[:-1] + (out_len(x.shape[-1], **params),)
        extra = _sharding.output_sharding(x)
        return (
            x.update(shape=shape, dtype=x.dtype, weak_type=False, **extra),
            x.update(shape=shape, dtype=jnp.int32, weak_type=False, **extra),
        )

    def batch(args, dims, **params):
        # Every batched dimension becomes the leading row dimension: one kernel
        # call. x and lengths may be batched independently; an unbatched one is
        # broadcast along the other's batch dimension.
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        moved = [jnp.broadcast_to(a, (size,) + a.shape) if d is None else jnp.moveaxis(a, d, 0)
                 for a, d in zip(args, dims)]
        return p.bind(*moved, **params), (0, 0)

    def jvp(primals, tangents, **params):
        x, *lengths = primals
        t = tangents[0]
        values, indices = p.bind(x, *lengths, **params)
        if type(t) is ad.Zero:
            t_values = _compat.symbolic_zero_tangent(values)
        elif lengths:
            # Padded slots (index -1) hold a constant: their tangent is zero.
            gathered = jnp.take_along_axis(t, jnp.maximum(indices, 0), axis=-1)
            t_values = jnp.where(indices >= 0, gathered, jnp.zeros_like(gathered))
        else:
            t_values = jnp.take_along_axis(t, indices, axis=-1)
        return (values, indices), (t_values, _compat.symbolic_zero_tangent(indices))

    fallback_lowering = mlir.lower_fun(
        lambda x, *lengths, **params: reference(x, lengths[0] if lengths else None, **params),
        multiple_results=True,
    )

    def kernel_lowering(platform: str):
        def lowering(ctx, x, *lengths, **params):
            op = ops[bool(lengths)]
            aval = ctx.avals_in[0]
            target = _registry.kernel_target(op, platform, aval.dtype)
            if target is None:
                return fallback_lowering(ctx, x, *lengths, **params)
            attributes = ffi_attributes(**params)
            n = aval.shape[-1]
            rows = math.prod(aval.shape[:-1])
            k = workspace_k(n, **params) if workspace_k else n
            extra = _registry.workspace_bytes(op, platform, aval.dtype, rows, n, k)
            if extra is None:
                return jax.ffi.ffi_lowering(target)(ctx, x, *lengths, **attributes)
            workspace = _compat.ShapedArray((max(extra, 1),), np.uint8)
            ctx = ctx.replace(avals_out=[*ctx.avals_out, workspace])
            return jax.ffi.ffi_lowering(target)(ctx, x, *lengths, **attributes)[:-1]

        return lowering

    p.def_abstract_eval(abstract_eval)
    local.def_abstract_eval(abstract_eval)
    batching.primitive_batchers[p] = batch
    ad.primitive_jvps[p] = jvp
    _sharding.register(p, _sharding.partitioned_lowering(
        local, roles=lambda avals: (_sharding.ELEMENTS, _sharding.ROWS)[: len(avals)],
        split_rule=split_rule))
    mlir.register_lowering(local, fallback_lowering)  # every platform without a kernel
    for platform in _registry.platforms():
        mlir.register_lowering(local, kernel_lowering(platform), platform=platform)
    return p
