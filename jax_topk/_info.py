"""``jax_topk.info()``: which kernels are compiled and registered, and which path runs."""

from __future__ import annotations

import jax
import jaxlib

from jax_topk import _registry
from jax_topk._version import __version__

OPS = ("top_k", "top_k_lengths", "sort", "sort_lengths", "route", "indexer", "nsa_block_scores")
# What runs an op where no native kernel takes the dtype (default: the pure-JAX fallback).
_FALLBACK = {"nsa_block_scores": "NSA's Pallas block-score kernel on a CUDA GPU, plain JAX elsewhere"}


def _lowering_platform(backend: str) -> str:
    """The registry's platform key for a jax backend name ("gpu" is CUDA or ROCm)."""
    if backend != "gpu":
        return backend
    version = jax.devices("gpu")[0].client.platform_version.lower()
    return "rocm" if "rocm" in version else "cuda"


def info() -> dict:
    """What this installation can run.

    Returns a dict with the library, jax and jaxlib versions, the default
    backend, and per platform (``"cpu"``, ``"cuda"``, ``"rocm"``) whether its native module
    is compiled and registered, its FFI targets, the dtypes its kernels handle
    and how it was built (or why it is unavailable). ``"paths"`` tells, for the
    default backend, which ops run a native kernel and for which dtypes; every
    other real dtype runs the pure-JAX fallback with identical results (NSA's
    block scores: its Pallas kernel or plain JAX, equal up to float sums).

    Example:
      >>> import jax_topk
      >>> sorted(jax_topk.info()["platforms"])
      ['cpu', 'cuda', 'rocm']
    """
    platforms = _registry.describe()
    backend = jax.default_backend()
    native = platforms.get(_lowering_platform(backend), {})
    return {
        "jax_topk": __version__,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": backend,
        "platforms": platforms,
        "paths": {
            op: (
                {"kernel": native["op_dtypes"][op], "other dtypes": _FALLBACK.get(op, "pure-JAX fallback")}
                if native.get("native") and op in native["targets"]
                else {"all dtypes": _FALLBACK.get(op, "pure-JAX fallback")}
            )
            for op in OPS
        },
    }
