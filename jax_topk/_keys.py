"""Order-preserving integer keys in pure JAX: the contract of DESIGN section 1.

``ordered_keys(x)`` maps every element to an unsigned integer of the same width
whose integer order is the IEEE-754 total order for floats
(-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN) and the ordinary order for
integers; it is the same transform as ``csrc/include/jax_topk/keys.h``. The
reference (fallback) implementations sort on these keys with ties broken by
lower index, so they give exactly what the native kernels give.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_UNSIGNED_BY_WIDTH = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def is_orderable(dtype) -> bool:
    """True for dtypes with a total order: bool, integers and real floats."""
    dtype = np.dtype(dtype)
    return dtype == np.bool_ or jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)


def ordered_keys(x: jax.Array) -> jax.Array:
    """Unsigned integer keys of ``x`` whose integer order is the contract's order."""
    dtype = np.dtype(x.dtype)
    if dtype == np.bool_:
        return x.astype(jnp.uint8)
    unsigned = _UNSIGNED_BY_WIDTH[dtype.itemsize]
    bits = lax.bitcast_convert_type(x, unsigned)
    sign_bit = np.array(1 << (8 * dtype.itemsize - 1), dtype=unsigned)
    if jnp.issubdtype(dtype, jnp.floating):
        # Negative: flip every bit. Positive: set the sign bit.
        negative = (bits >> (8 * dtype.itemsize - 1)) * np.array(-1, dtype=np.int64).astype(unsigned)
        return bits ^ (negative | sign_bit)
    if jnp.issubdtype(dtype, jnp.signedinteger):
        return bits ^ sign_bit
    return bits


def sort_order(x: jax.Array) -> jax.Array:
    """Indices that order the last axis of ``x`` best first (descending in the
    contract's order, ties by lower index), as int32."""
    keys = ordered_keys(x)
    iota = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    # Ascending on the complemented key is descending on the key; the index as
    # second sort key (and a stable sort) puts lower indices first among ties.
    _, order = lax.sort((~keys, iota), dimension=x.ndim - 1, num_keys=2, is_stable=True)
    return order


def take_bits(x: jax.Array, indices: jax.Array) -> jax.Array:
    """``take_along_axis(x, indices, axis=-1)`` moving raw bits: a gather of
    bfloat16/float16 may round-trip through float32 and quiet NaN payloads."""
    dtype = np.dtype(x.dtype)
    if dtype == np.bool_:
        return jnp.take_along_axis(x, indices, axis=-1)
    bits = lax.bitcast_convert_type(x, _UNSIGNED_BY_WIDTH[dtype.itemsize])
    return lax.bitcast_convert_type(jnp.take_along_axis(bits, indices, axis=-1), dtype)


def top_k_reference(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Top-k along the last axis by a full sort on ordered keys: slow, exact, and
    runnable on every backend. The fallback lowering of the ``top_k`` primitive."""
    indices = sort_order(x)[..., :k]
    return take_bits(x, indices), indices
