"""Test configuration: 64-bit dtypes on, and shared input generators."""

from __future__ import annotations

import os
import zlib

# Eight CPU devices for the sharding tests, set before jax initialises its
# backends (tests on one device are unaffected: jit runs on the default one).
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax_topk  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# `python -m pytest` puts the working directory first on sys.path, so from the
# repository root it would import the unbuilt source tree and silently test the
# pure-JAX fallback instead of the kernels.
if not jax_topk.info()["platforms"]["cpu"]["native"]:
    raise RuntimeError(
        f"jax_topk was imported from {jax_topk.__file__} without its compiled CPU module "
        f"({jax_topk.info()['platforms']['cpu']['reason']}). Install it (pip install '.[test]') "
        "and run `pytest` rather than `python -m pytest` from the repository root."
    )

# The platform whose kernels the suite exercises: `JAX_TOPK_TEST_PLATFORM=gpu
# pytest` runs the whole suite on the GPU (comparisons with lax stay on CPU).
TEST_PLATFORM = os.environ.get("JAX_TOPK_TEST_PLATFORM", "cpu")
TEST_DEVICE = jax.devices(TEST_PLATFORM)[0]
jax.config.update("jax_default_device", TEST_DEVICE)
# jax_topk.info()'s platform key for it ("gpu" devices run the "cuda" module).
TEST_MODULE = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda"}[TEST_PLATFORM]


def gpu_device():
    """The first GPU, or None."""
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


# Dtypes with a native CPU kernel, and real dtypes that take the pure-JAX fallback.
KERNEL_DTYPES = [
    "float32", "bfloat16", "float16", "float64",
    "int32", "int64", "int16", "int8", "uint32", "uint64", "uint16", "uint8",
]
FALLBACK_DTYPES = ["bool", "float8_e4m3fn"]
FLOAT_DTYPES = ["float32", "bfloat16", "float16", "float64"]


def np_dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)


def special_floats(dtype) -> np.ndarray:
    """NaNs of both signs (with payloads), +-inf, +-0, denormals, extremes, ordinary values."""
    dtype = np.dtype(dtype)
    info = ml_dtypes.finfo(dtype)
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
    width = dtype.itemsize * 8
    nan_bits = np.array(np.nan, dtype).view(unsigned)
    nans = np.array([nan_bits, nan_bits | unsigned(1), nan_bits | unsigned(1 << (width - 1)),
                     nan_bits | unsigned(1 << (width - 1)) | unsigned(1)], unsigned).view(dtype)
    vals = [np.inf, -np.inf, 0.0, -0.0, float(info.smallest_subnormal), -float(info.smallest_subnormal),
            float(info.max), float(info.min), float(info.tiny), 1.0, -1.0, 0.5]
    return np.concatenate([nans, np.array(vals).astype(dtype)])


def make_input(kind: str, shape, dtype_name: str, rng: np.random.Generator) -> np.ndarray:
    """Inputs that break kernels: random, heavy ties, all equal, special values."""
    dtype = np_dtype(dtype_name)
    size = int(np.prod(shape))
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    is_float = "float" in dtype_name
    if kind == "random":
        if is_float:
            return rng.standard_normal(size).astype(dtype).reshape(shape)
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=size, endpoint=True, dtype=dtype).reshape(shape)
    if kind == "ties":
        return rng.integers(-2, 3, size=size).astype(dtype).reshape(shape) if dtype.kind != "u" else \
            rng.integers(0, 3, size=size).astype(dtype).reshape(shape)
    if kind == "equal":
        return np.full(shape, 1, dtype=dtype)
    if kind == "special":
        pool = special_floats(dtype) if is_float else np.array(
            [np.iinfo(dtype).min, np.iinfo(dtype).max, 0, 1], dtype=dtype)
        return rng.choice(pool, size=size).reshape(shape)
    raise ValueError(kind)


@pytest.fixture
def rng(request) -> np.random.Generator:
    # Deterministic per test (crc32, not the salted hash()), different across tests.
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
