"""GPU top_k == CPU top_k, bit for bit, around every regime boundary of the
CUDA dispatcher (skipped without a GPU). The rest of the suite runs on the GPU
with `JAX_TOPK_TEST_PLATFORM=gpu pytest`."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_topk
import oracle
from conftest import gpu_device, make_input

GPU = gpu_device()
CPU = jax.devices("cpu")[0]
if GPU is None:
    pytest.skip("no GPU", allow_module_level=True)


def boundaries() -> tuple[list[int], list[int]]:
    """n and k values just below, at and above each dispatch threshold that
    the CUDA module reports, plus a few generic sizes."""
    ns = {1, 2, 33, 1000, 5000, 40000, 1 << 20}
    ks = {1, 2, 7, 16, 64, 100, 256, 1000, 2048, 4096}
    info = jax_topk.info()["platforms"].get("cuda", {})
    for name, value in info.get("build", {}).get("topk_thresholds", {}).items():
        (ks if name.endswith("_k") else ns).update({value - 1, value, value + 1} - {0})
    return sorted(ns), sorted(ks)


def top_k_on(device, x, k, lengths=None):
    with jax.default_device(device):
        if lengths is None:
            values, indices = jax.jit(lambda a: jax_topk.top_k(a, k))(jax.device_put(x, device))
        else:
            values, indices = jax.jit(lambda a, n: jax_topk.top_k(a, k, lengths=n))(
                jax.device_put(x, device), jax.device_put(lengths, device))
    return np.asarray(values), np.asarray(indices)


def assert_gpu_equals_cpu(x, k, check_oracle=False, lengths=None):
    gv, gi = top_k_on(GPU, x, k, lengths)
    cv, ci = top_k_on(CPU, x, k, lengths)
    assert np.array_equal(gi, ci), f"indices differ: shape {x.shape} {x.dtype} k={k} lengths={lengths is not None}"
    assert oracle.same_bits(gv, cv), f"values differ: shape {x.shape} {x.dtype} k={k} lengths={lengths is not None}"
    if check_oracle:
        ov, oi = oracle.top_k(x, k)
        assert np.array_equal(gi, oi) and oracle.same_bits(gv, ov)


NS, KS = boundaries()
CASES = [(n, k) for n, k in itertools.product(NS, KS) if k <= n]


@pytest.mark.parametrize("n,k", CASES)
def test_boundaries_float32(n, k, rng):
    # 1 and 5 rows split a row over blocks; 300 and 600 rows straddle the
    # "enough rows to fill the chip" thresholds of the warp and radix kernels.
    for rows in (1, 5, 300, 600):
        if rows * n > (1 << 22) or (rows in (5, 600) and n > 20000):
            continue
        for kind in ("random", "ties") + (("special",) if rows == 1 else ()):
            assert_gpu_equals_cpu(make_input(kind, (rows, n), "float32", rng), k, check_oracle=rows * n < 200_000)


def user_lengths(rows: int, n: int, k: int, rng) -> np.ndarray:
    """Per-row lengths covering the rule's edges: 0, 1, k-1, k, k+1, n-1, n,
    n+1, negative, int32 extremes, and random in [0, n]."""
    special = [0, 1, k - 1, k, k + 1, n - 1, n, n + 1, -1, np.iinfo(np.int32).min, np.iinfo(np.int32).max]
    lengths = rng.integers(0, n + 1, size=rows)
    lengths[: min(rows, len(special))] = special[: min(rows, len(special))]
    return rng.permutation(lengths).astype(np.int32)


@pytest.mark.parametrize("n,k", CASES)
def test_boundaries_with_lengths(n, k, rng):
    # Every kernel takes per-row lengths; the regime is chosen from (rows, n, k).
    for rows in (1, 13, 300):
        if rows * n > (1 << 22):
            continue
        lengths = user_lengths(rows, n, k, rng)
        assert_gpu_equals_cpu(make_input("random", (rows, n), "float32", rng), k, lengths=lengths)
    rows = max(1, min(300, (1 << 22) // n))
    assert_gpu_equals_cpu(make_input("ties", (rows, n), "bfloat16", rng), k, lengths=user_lengths(rows, n, k, rng))


def test_ragged_case_of_the_issue_on_gpu(rng):
    # 31 rows of 2000..8000 elements, k=512: one padded call, bit-identical to
    # the per-row top_k on the CPU.
    lengths = rng.integers(2000, 8001, size=31).astype(np.int32)
    x = make_input("random", (31, 8000), "float32", rng)
    assert_gpu_equals_cpu(x, 512, lengths=lengths)
    values, indices = top_k_on(GPU, x, 512, lengths)
    for r, length in enumerate(lengths):
        ov, oi = oracle.top_k(x[r : r + 1, :length], 512)
        assert np.array_equal(indices[r], oi[0]) and oracle.same_bits(values[r], ov[0])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64", "int32", "uint8", "int64"])
@pytest.mark.parametrize("n,k", [(64, 2), (256, 8), (384, 6), (2048, 16), (2048, 32), (8192, 256), (65536, 2048),
                                 (131072, 50), (1 << 20, 2048), (1000, 1000), (7, 0)])
def test_dtypes_gpu(dtype, n, k, rng):
    rows = max(1, min(64, (1 << 21) // n))
    for kind in ("random", "ties", "special", "equal"):
        assert_gpu_equals_cpu(make_input(kind, (rows, n), dtype, rng), k)


def test_threshold_block_width_boundary(rng):
    # The threshold kernel's narrow blocks (more rows in flight) take k up to
    # threshold_narrow_max_k from threshold_narrow_min rows per SM on; one row
    # fewer, or k one more, runs wide blocks.
    build = jax_topk.info()["platforms"]["cuda"]["build"]
    sms = getattr(GPU, "core_count", None)
    if not sms or "topk_rows_per_sm_thresholds" not in build:
        pytest.skip("the SM count or the threshold is not reported")
    rows_min = build["topk_rows_per_sm_thresholds"]["threshold_narrow_min"] * sms
    max_k = build["topk_thresholds"]["threshold_narrow_max_k"]
    for rows in (rows_min - 1, rows_min):
        for n, k in ((1500, 33), (3000, 64), (8192, max_k), (8192, max_k + 1)):
            for kind in ("random", "ties"):
                assert_gpu_equals_cpu(make_input(kind, (rows, n), "float32", rng), k)
    assert_gpu_equals_cpu(make_input("equal", (rows_min, 4096), "bfloat16", rng), 100)
    assert_gpu_equals_cpu(make_input("special", (rows_min, 4096), "float32", rng), 100,
                          lengths=user_lengths(rows_min, 4096, 100, rng))


def test_threshold_sampled_narrow_boundary(rng):
    # Narrow threshold blocks whose k alone gives too few slots for a sampled
    # threshold (k = 64 of 8192) take 8 slots and a sample from
    # threshold_sampled_narrow_min rows per SM on; one row fewer, the two
    # reads. (Rows made against the sample, which take the radix select, are
    # the CUDA self-test's.)
    build = jax_topk.info()["platforms"]["cuda"]["build"]
    sms = getattr(GPU, "core_count", None)
    per_sm = build.get("topk_rows_per_sm_thresholds", {})
    if not sms or "threshold_sampled_narrow_min" not in per_sm:
        pytest.skip("the SM count or the threshold is not reported")
    rows_min = per_sm["threshold_sampled_narrow_min"] * sms
    for rows in (rows_min - 1, rows_min):
        for kind in ("random", "ties", "equal"):
            assert_gpu_equals_cpu(make_input(kind, (rows, 8192), "float32", rng), 64)
        # Sorted rows: each sample chunk is a run of consecutive values.
        assert_gpu_equals_cpu(np.tile(np.arange(8192, dtype=np.float32), (rows, 1)), 64)
    assert_gpu_equals_cpu(make_input("special", (rows_min, 8192), "float32", rng), 33)
    assert_gpu_equals_cpu(make_input("random", (rows_min, 8192), "bfloat16", rng), 64)


def test_threshold_stream_boundary(rng):
    # Few rows (no more than SMs) of at most 512 KB whose input reaches
    # threshold_stream_min bytes take the streamed threshold kernel (the row
    # read once) for k up to threshold_stream_max_k; one row fewer, or k one
    # more, the two-read kernel. Ascending rows raise its threshold at every
    # step of the row.
    build = jax_topk.info()["platforms"]["cuda"]["build"]
    sms = getattr(GPU, "core_count", None)
    if not sms or "topk_bytes_thresholds" not in build:
        pytest.skip("the SM count or the threshold is not reported")
    n = 131072
    rows_min = -(-build["topk_bytes_thresholds"]["threshold_stream_min"] // (4 * n))
    max_k = build["topk_thresholds"]["threshold_stream_max_k"]
    if rows_min > sms:
        pytest.skip(f"{rows_min} rows of {n} float32 are more than the {sms} SMs")
    for rows in (rows_min - 1, rows_min):
        for k in (1, max_k, max_k + 1):
            for kind in ("random", "ties"):
                assert_gpu_equals_cpu(make_input(kind, (rows, n), "float32", rng), k)
    ascending = np.tile(np.arange(n, dtype=np.float32), (rows_min, 1))
    assert_gpu_equals_cpu(ascending, max_k)
    assert_gpu_equals_cpu(make_input("special", (rows_min, n), "float32", rng), max_k,
                          lengths=user_lengths(rows_min, n, max_k, rng))


@pytest.mark.parametrize("rows,n,k", [(140, 65536, 2048), (130, 131072, 1024), (600, 8192, 256), (300, 32768, 600)])
def test_threshold_sampled_rows(rows, n, k, rng):
    # Whole rows of these shapes take the threshold kernel's sampled T
    # (threshold_sample in topk_dispatch.h: the row read once); with lengths,
    # the same rows take group maxima. Ascending rows put the top k at the
    # end, all-equal rows rank by index.
    for kind in ("random", "ties", "equal"):
        assert_gpu_equals_cpu(make_input(kind, (rows, n), "float32", rng), k)
    ascending = np.tile(np.arange(n, dtype=np.float32), (rows, 1))
    assert_gpu_equals_cpu(ascending, k)
    assert_gpu_equals_cpu(make_input("special", (rows, n), "bfloat16", rng), k,
                          lengths=user_lengths(rows, n, k, rng))


def test_register_rows_boundary(rng):
    # Rows of at most register_rows_max_n on at most register_rows_max rows
    # per SM (and not the warp kernels') take one block per row: a radix
    # pass, then its candidates ranked by key buckets where they fit (else
    # the exact radix select and a sort); one row more, another kernel.
    # Ties at the k-th key, special values, short rows with lengths, rows
    # whose values cluster in a few buckets, and all-equal rows (one bucket,
    # or the sort) must come out as the CPU kernel's.
    build = jax_topk.info()["platforms"]["cuda"]["build"]
    sms = getattr(GPU, "core_count", None)
    if not sms or "register_rows_max" not in build.get("topk_rows_per_sm_thresholds", {}):
        pytest.skip("the SM count or the register rows' limit is not reported")
    limits = build["topk_thresholds"]
    rows_most = build["topk_rows_per_sm_thresholds"]["register_rows_max"] * sms
    max_n, max_k = limits["register_rows_max_n"], limits["register_rows_max_k"]
    for n in (limits["warp_select_max_n"] + 1, 8000, max_n):
        for rows in (1, rows_most, rows_most + 1):
            for k in (1, 64, 511, 1024, max_k):
                if k > n:
                    continue
                for kind in ("random", "ties"):
                    assert_gpu_equals_cpu(make_input(kind, (rows, n), "float32", rng), k)
            assert_gpu_equals_cpu(make_input("special", (rows, n), "bfloat16", rng), 300,
                                  lengths=user_lengths(rows, n, 300, rng))
        # Values in a few narrow clusters (many candidates share a bucket),
        # and all-equal rows.
        noise = make_input("random", (3, n), "float32", rng)
        clustered = (np.floor(noise * 2.0) + noise * 1e-6).astype(np.float32)
        assert_gpu_equals_cpu(clustered, 511, check_oracle=True)
        assert_gpu_equals_cpu(make_input("equal", (3, n), "float32", rng), 511, check_oracle=True)


def test_cluster_sampled_boundary(rng):
    # Whole rows of 32768..131072 whose sample has a window take a cluster per
    # row with a sampled threshold while the clusters' blocks (at least
    # ceil(row bytes / chunk_bytes) and two) fit the SMs (wide_sm_share of them
    # for clusters of more than two); one row more, the threshold kernel.
    # Rows made against the sample (its chunks high or low), all-equal and
    # sorted rows take the radix select in the same kernel, over the chunks
    # it holds; rows with lengths, their own sample.
    build = jax_topk.info()["platforms"]["cuda"]["build"]
    sms = getattr(GPU, "core_count", None)
    if not sms or "topk_cluster_sampled" not in build:
        pytest.skip("the SM count or the cluster's sampled threshold are not reported")
    sampled = build["topk_cluster_sampled"]
    slots = sampled["sample_slots"]
    for n, k in ((65536, 2048), (131072, 1024), (32768, 100)):
        blocks = max(2, -(-n * 4 // sampled["chunk_bytes"]))
        rows_most = int((sampled["wide_sm_share"] * sms if blocks > 2 else sms) // blocks)
        for rows in (1, 17, rows_most, rows_most + 1):
            assert_gpu_equals_cpu(make_input("random", (rows, n), "float32", rng), k)
        rows = 17
        for kind in ("ties", "equal", "special"):
            assert_gpu_equals_cpu(make_input(kind, (rows, n), "float32", rng), k)
        assert_gpu_equals_cpu(np.sort(make_input("random", (rows, n), "float32", rng), axis=1), k)
        assert_gpu_equals_cpu(make_input("random", (rows, n), "bfloat16", rng), k)
        assert_gpu_equals_cpu(make_input("random", (rows, n), "float32", rng), k,
                              lengths=user_lengths(rows, n, k, rng))
        # The sample: slots / 32 chunks of 32 elements, spread evenly
        # (threshold_sample_chunk_start in topk_dispatch.h).
        chunks = slots // 32
        step = ((n - 32) << 32) // (chunks - 1)
        starts = ((np.arange(chunks, dtype=np.uint64) * np.uint64(step)) >> np.uint64(32)).astype(np.int64)
        in_sample = np.zeros(n, dtype=bool)
        in_sample[(starts[:, None] + np.arange(32)).ravel()] = True
        noise = make_input("random", (rows, n), "float32", rng)
        for high in (True, False):
            x = np.where(in_sample == high, noise + 100.0, noise).astype(np.float32)
            assert_gpu_equals_cpu(x, k, check_oracle=True)


def test_many_rows_and_one_long_row(rng):
    assert_gpu_equals_cpu(make_input("random", (16384, 256), "float32", rng), 8)
    assert_gpu_equals_cpu(make_input("ties", (1, 1 << 22), "float32", rng), 2048)
    assert_gpu_equals_cpu(make_input("special", (1, 1 << 20), "bfloat16", rng), 16)


@pytest.mark.parametrize("n", [64, 256, 1000, 2048])
def test_rows_mostly_masked(n, rng):
    """Rows of -inf (or one repeated value) but for a few elements, fewer or
    more than k of them, as a causal mask leaves them: their ties at the
    threshold send the warp-select kernel to its packed threshold."""
    rows = 4096
    for fill in (-np.inf, 0.5):
        x = np.full((rows, n), fill, np.float32)
        live = rng.random((rows, n)) < np.linspace(0.0, 0.2, rows)[:, None]
        x[live] = rng.standard_normal(int(live.sum())).astype(np.float32)
        for k in (1, 8, 16, 32):
            assert_gpu_equals_cpu(x, k, check_oracle=True)


def test_deterministic_on_gpu(rng):
    for shape, k in (((4096, 2048), 16), ((1, 1 << 20), 2048), ((2048, 65536), 2048)):
        x = jax.device_put(make_input("ties", shape, "float32", rng), GPU)
        first = top_k_on(GPU, x, k)
        for _ in range(3):
            again = top_k_on(GPU, x, k)
            assert np.array_equal(first[1], again[1]) and oracle.same_bits(first[0], again[0])


def test_nan_and_signed_zero_kept_where_lax_gpu_drops_them():
    # lax.top_k's GPU fast path (float32, k <= 16, n >= 1024) drops NaN and
    # conflates -0.0 with +0.0; ours follows the total order on the GPU too.
    x = np.zeros((4, 2048), np.float32)
    x[:, 5] = np.nan
    x[:, 9] = -0.0
    x[:, 100] = 1.0
    x[1, 7] = -np.nan
    v, i = top_k_on(GPU, x, 3)
    np.testing.assert_array_equal(i[0], [5, 100, 0])
    assert np.isnan(v[0, 0]) and v[0, 1] == 1.0
    ov, oi = oracle.top_k(x, 3)
    assert np.array_equal(i, oi) and oracle.same_bits(v, ov)
