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


def lowest_value(dtype) -> np.ndarray:
    """What padded output slots hold: -inf for floats (the most negative finite
    value for float types without infinities), the minimum for integers, False
    for bool. Matches the table in csrc/include/jax_topk/dtypes.h."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(False)
    if jnp.issubdtype(dtype, jnp.integer):
        return np.array(jnp.iinfo(dtype).min, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        neg_inf = np.array(-np.inf).astype(dtype)
    return neg_inf if np.isinf(neg_inf.astype(np.float32)) else np.array(jnp.finfo(dtype).min, dtype)


def valid_mask(lengths: jax.Array, n: int) -> jax.Array:
    """[..., n] mask of the elements that take part: ``arange(n) < lengths``
    (a sequence mask: a length <= 0 selects nothing, >= n the whole row)."""
    return lax.broadcasted_iota(jnp.int32, lengths.shape + (n,), lengths.ndim) < lengths[..., None]


def sort_order(x: jax.Array, lengths: jax.Array | None = None, *, descending: bool = True) -> jax.Array:
    """Indices that order the last axis of ``x`` (descending: best first) in
    the contract's order, ties by lower index in both directions, as int32.
    With ``lengths``, the elements past each row's length come last."""
    keys = ordered_keys(x)
    iota = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    # Ascending on the complemented key is descending on the key; the index as
    # last sort key (and a stable sort) puts lower indices first among ties.
    operands = (~keys if descending else keys, iota)
    if lengths is not None:
        operands = ((~valid_mask(lengths, x.shape[-1])).astype(jnp.uint8),) + operands
    *_, order = lax.sort(operands, dimension=x.ndim - 1, num_keys=len(operands), is_stable=True)
    return order


def to_bits(x: jax.Array) -> jax.Array:
    """The raw bits of ``x`` as unsigned integers (bool stays bool). Data
    movement (gather, select, pad, concatenate) of bfloat16/float16 may
    round-trip through float32 on some backends and quiet NaN payloads; moving
    bits keeps every element exact."""
    dtype = np.dtype(x.dtype)
    return x if dtype == np.bool_ else lax.bitcast_convert_type(x, _UNSIGNED_BY_WIDTH[dtype.itemsize])


def from_bits(bits: jax.Array, dtype) -> jax.Array:
    dtype = np.dtype(dtype)
    return bits if dtype == np.bool_ else lax.bitcast_convert_type(bits, dtype)


def take_bits(x: jax.Array, indices: jax.Array) -> jax.Array:
    """``take_along_axis(x, indices, axis=-1)`` moving raw bits (see to_bits)."""
    return from_bits(jnp.take_along_axis(to_bits(x), indices, axis=-1), x.dtype)


def pad_past_lengths(values: jax.Array, indices: jax.Array, lengths: jax.Array | None):
    """Slots at or past each row's length get the lowest value and index -1."""
    if lengths is None:
        return values, indices
    valid = valid_mask(lengths, values.shape[-1])
    lowest = to_bits(jnp.asarray(lowest_value(values.dtype)))
    padded = from_bits(jnp.where(valid, to_bits(values), lowest), values.dtype)
    return padded, jnp.where(valid, indices, -1)


def top_k_reference(x: jax.Array, k: int, lengths: jax.Array | None = None):
    """Top-k along the last axis by a full sort on ordered keys: slow, exact, and
    runnable on every backend. The fallback lowering of the ``top_k`` primitive."""
    indices = sort_order(x, lengths)[..., :k]
    return pad_past_lengths(take_bits(x, indices), indices, lengths)


def sort_reference(x: jax.Array, descending: bool, lengths: jax.Array | None = None):
    """Stable sort along the last axis on ordered keys: the fallback lowering of ``sort``."""
    indices = sort_order(x, lengths, descending=descending)
    return pad_past_lengths(take_bits(x, indices), indices, lengths)
