"""The few JAX internals this package needs, behind one door (jax 0.10 to 0.12)."""

from __future__ import annotations

import jax
from jax.interpreters import ad

from jax._src.core import ShapedArray  # noqa: F401  (abstract values of extra results)

try:  # where eager calls of a primitive are dispatched
    from jax._src.dispatch import apply_primitive
except ImportError:  # pragma: no cover - future layouts
    from jax._src.interpreters.xla import apply_primitive  # type: ignore


def symbolic_zero_tangent(primal) -> ad.Zero:
    """A symbolic-zero tangent for ``primal`` (float0 for integer primals)."""
    return ad.Zero(jax.typeof(primal).to_tangent_aval())


def requires_devices_during_lowering(primitive) -> None:
    """Asks JAX to give ``primitive``'s lowering the device assignment (its
    partitioned lowering builds a ``custom_partitioning`` call, which needs it)."""
    from jax._src import dispatch

    dispatch.prim_requires_devices_during_lowering.add(primitive)
