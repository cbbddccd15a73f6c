"""GPU sort == CPU sort, bit for bit, around every boundary of the CUDA sort
dispatcher (block shapes, the tile regime's tiles and row chunks), both
directions, with and without per-row lengths (skipped without a GPU). The CPU
side is the native CPU kernel, itself checked against the numpy oracle in
test_sort.py; the oracle is also checked directly on small cases here."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_topk
import oracle
from conftest import KERNEL_DTYPES, gpu_device, make_input, np_dtype

GPU = gpu_device()
CPU = jax.devices("cpu")[0]
if GPU is None:
    pytest.skip("no GPU", allow_module_level=True)


def sort_boundaries() -> list[int]:
    """Row lengths just below, at and above each threshold the CUDA module
    reports (warp slots, block shapes, tiles), plus rows of many tiles."""
    ns = {1, 2, 3, 31, 5000, 40000, (1 << 17) + 3}
    info = jax_topk.info()["platforms"].get("cuda", {})
    for capacity in info.get("build", {}).get("sort_thresholds_n", []):
        ns.update({capacity - 1, capacity, capacity + 1})
    return sorted(ns)


def sort_on(device, x, descending, lengths=None):
    with jax.default_device(device):
        fn = jax.jit(lambda a, n: jax_topk.sort(a, descending=descending, lengths=n))
        values, indices = fn(jax.device_put(x, device), None if lengths is None else jax.device_put(lengths, device))
    return np.asarray(values), np.asarray(indices)


def assert_gpu_equals_cpu(x, descending, lengths=None, check_oracle=False):
    gv, gi = sort_on(GPU, x, descending, lengths)
    cv, ci = sort_on(CPU, x, descending, lengths)
    what = f"shape {x.shape} {x.dtype} descending={descending} lengths={lengths is not None}"
    assert np.array_equal(gi, ci), f"indices differ: {what}"
    assert oracle.same_bits(gv, cv), f"values differ: {what}"
    if check_oracle and lengths is None:
        ov, oi = oracle.sort(x, -1, descending)
        assert np.array_equal(gi, oi) and oracle.same_bits(gv, ov), f"differs from the oracle: {what}"


def user_lengths(rows: int, n: int, rng) -> np.ndarray:
    special = [0, 1, n - 1, n, n + 1, -1, np.iinfo(np.int32).min, np.iinfo(np.int32).max, n // 2]
    lengths = rng.integers(0, n + 1, size=rows)
    lengths[: min(rows, len(special))] = special[: min(rows, len(special))]
    return rng.permutation(lengths).astype(np.int32)


@pytest.mark.parametrize("n", sort_boundaries())
def test_boundaries_float32(n, rng):
    for rows in (1, 3, 300):
        if rows * n > (1 << 22):
            continue
        for kind in ("random", "ties", "special"):
            for descending in (False, True):
                assert_gpu_equals_cpu(make_input(kind, (rows, n), "float32", rng), descending,
                                      check_oracle=rows * n < 100_000)


@pytest.mark.parametrize("n", sort_boundaries())
def test_boundaries_with_lengths(n, rng):
    rows = max(1, min(40, (1 << 21) // n))
    for descending in (False, True):
        assert_gpu_equals_cpu(make_input("ties", (rows, n), "float32", rng), descending,
                              lengths=user_lengths(rows, n, rng))


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("n", [7, 256, 4097, 70000])
def test_dtypes_gpu(dtype, n, rng):
    rows = max(1, min(64, (1 << 20) // n))
    for kind in ("random", "ties", "special", "equal"):
        for descending in (False, True):
            assert_gpu_equals_cpu(make_input(kind, (rows, n), dtype, rng), descending)
    assert_gpu_equals_cpu(make_input("random", (rows, n), dtype, rng), True, lengths=user_lengths(rows, n, rng))


def test_row_tiles_in_several_chunks(rng):
    # 65 rows of 2^20: more than one chunk of the tile regime (2^26 elements each).
    x = make_input("ties", (65, 1 << 20), "uint8", rng)
    for descending in (False, True):
        assert_gpu_equals_cpu(x, descending, lengths=user_lengths(65, 1 << 20, rng))


def test_deterministic_on_gpu(rng):
    for shape in ((4096, 2048), (64, 65536)):
        x = jax.device_put(make_input("ties", shape, "float32", rng), GPU)
        first = sort_on(GPU, x, True)
        again = sort_on(GPU, x, True)
        assert np.array_equal(first[1], again[1]) and oracle.same_bits(first[0], again[0])


def test_kernel_serves_the_gpu_sort():
    # 32-bit and narrower keys: the CUDA kernel; 64-bit keys: the pure-JAX sort.
    def lowered(dtype):
        x = jax.device_put(jnp.ones((3, 8), np_dtype(dtype)), GPU)
        return jax.jit(lambda a: jax_topk.sort(a)).lower(x).as_text()

    assert "jax_topk_sort" in lowered("float32")
    assert "jax_topk_sort" in lowered("uint8")
    assert "jax_topk_sort" not in lowered("float64")
