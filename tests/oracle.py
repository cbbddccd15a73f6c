"""The numpy oracle: ordered integer ranks and a stable argsort.

Written from the contract (DESIGN section 1), independently of the kernels and
of jax_topk/_keys.py: every element gets a uint64 rank whose integer order is
the total order (floats from their sign and magnitude, integers from their
value), and a stable argsort of the complemented rank puts the best first with
ties by lower index.
"""

from __future__ import annotations

import numpy as np

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def is_float(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or "float" in dtype.name  # ml_dtypes floats have kind "V"


def rank(x: np.ndarray) -> np.ndarray:
    """uint64 ranks in the total order: -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN."""
    x = np.asarray(x)
    dtype = np.dtype(x.dtype)
    if dtype == np.bool_ or np.issubdtype(dtype, np.unsignedinteger):
        return x.astype(np.uint64)
    if np.issubdtype(dtype, np.signedinteger):
        # Shift the signed range up to start at zero (wrapping arithmetic in uint64).
        return x.astype(np.int64).view(np.uint64) + np.uint64(1 << 63)
    width = dtype.itemsize * 8
    bits = x.view(_UNSIGNED[dtype.itemsize]).astype(np.uint64)
    half = np.uint64(1 << (width - 1))
    negative = bits >= half
    magnitude = bits & (half - np.uint64(1))  # NaN payloads rank by their bits
    return np.where(negative, half - np.uint64(1) - magnitude, half + magnitude)


def argsort_desc(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Best-first order along axis: descending rank, ties by lower index."""
    r = rank(np.moveaxis(np.asarray(x), axis, -1))
    return np.moveaxis(np.argsort(~r, axis=-1, kind="stable"), -1, axis)


def argsort(x: np.ndarray, axis: int = -1, descending: bool = False) -> np.ndarray:
    """Stable order along axis in either direction; ties by lower index in both."""
    if descending:
        return argsort_desc(x, axis)
    r = rank(np.moveaxis(np.asarray(x), axis, -1))
    return np.moveaxis(np.argsort(r, axis=-1, kind="stable"), -1, axis)


def sort(x: np.ndarray, axis: int = -1, descending: bool = False) -> tuple[np.ndarray, np.ndarray]:
    idx = argsort(x, axis, descending)
    return np.take_along_axis(np.asarray(x), idx, axis=axis), idx.astype(np.int32)


def top_k(x: np.ndarray, k: int, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x)
    idx = np.take(argsort_desc(x, axis), np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int32)


def same_bits(a, b) -> bool:
    """Bit-for-bit equality of dtype, shape and every bit (NaN payloads, -0.0)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == np.bool_:
        return bool(np.array_equal(a, b))
    return bool(np.array_equal(a.view(_UNSIGNED[a.dtype.itemsize]), b.view(_UNSIGNED[b.dtype.itemsize])))



def has_nan_payloads(x) -> bool:
    """True if x holds a NaN other than the quiet NaN of its sign (bits differ
    from +-nan). lax.top_k on CPU quiets bfloat16 NaNs before comparing, so for
    those inputs it departs from the total order, which ranks NaNs by payload."""
    x = np.asarray(x)
    if not is_float(x.dtype):
        return False
    u = _UNSIGNED[x.dtype.itemsize]
    sign_mask = u(1) << u(x.dtype.itemsize * 8 - 1)
    quiet = np.array(np.nan, x.dtype).view(u)
    nan = np.isnan(x.astype(np.float64))
    return bool(np.any(nan & ((x.view(u) & ~sign_mask) != quiet)))
