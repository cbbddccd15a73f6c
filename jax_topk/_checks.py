"""Argument checks shared by the public ops: clear errors at trace time that
name the function, the argument and the shapes. Nothing is silently clamped."""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np

from jax_topk import _keys


def as_array(x, name: str, fn: str) -> jax.Array | np.ndarray:
    """Accepts JAX arrays (tracers too) and NumPy arrays; rejects everything else."""
    if isinstance(x, (jax.Array, np.ndarray)) or hasattr(x, "__jax_array__"):
        return x
    if isinstance(x, np.generic):
        return np.asarray(x)
    raise TypeError(
        f"{fn}: {name} must be a jax.Array or numpy.ndarray, got {type(x).__name__}"
        + (" (convert lists with jnp.asarray first)" if isinstance(x, (list, tuple)) else "")
    )


def static_int(value, name: str, fn: str) -> int:
    """A Python or NumPy integer known at trace time (not a bool, float or tracer)."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{fn}: {name} must be a static Python int, got a traced value; "
            f"mark it static (e.g. jax.jit(..., static_argnums=...))"
        )
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{fn}: {name} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__} {value!r}") from None


def canonical_axis(axis, ndim: int, shape: tuple[int, ...], fn: str) -> int:
    axis = static_int(axis, "axis", fn)
    if ndim == 0:
        raise ValueError(f"{fn}: x must have at least one dimension, got a scalar (shape ())")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{fn}: axis={axis} is out of range for x of shape {shape} (ndim {ndim})")
    return axis % ndim


def orderable_dtype(dtype, fn: str) -> None:
    if not _keys.is_orderable(dtype):
        raise TypeError(
            f"{fn}: x has dtype {np.dtype(dtype).name}, which has no total order; "
            f"supported: bool, integer and real floating dtypes"
        )


def lengths_for(lengths, shape: tuple[int, ...], axis: int, fn: str) -> jax.Array:
    """Checks ``lengths`` against ``x``'s shape without ``axis`` and returns it as int32."""
    expected = tuple(shape[:axis]) + tuple(shape[axis + 1 :])
    if isinstance(lengths, (int, np.integer)) and not isinstance(lengths, (bool, np.bool_)):
        lengths = np.asarray(lengths)
    lengths = as_array(lengths, "lengths", fn)
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise TypeError(f"{fn}: lengths must have an integer dtype, got {np.dtype(lengths.dtype).name}")
    if tuple(lengths.shape) != expected:
        raise ValueError(
            f"{fn}: lengths must have shape {expected} (x's shape {tuple(shape)} without axis {axis}), "
            f"got {tuple(lengths.shape)}"
        )
    return jnp.asarray(lengths).astype(jnp.int32)
