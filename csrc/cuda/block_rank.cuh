// Ordering a block's candidates by rank instead of sorting them: every value
// finds its output position pos = #{values greater than it} on its own, so
// the c candidates of the threshold kernel go to their slots without a
// network of barrier-separated stages. Measured on an H200 (512 threads,
// clock cycles of one block, tests/block_sort_bench.cu): the bitonic
// network takes ~8.6K cycles even for 64 values (36 dependent stages in one
// warp) and 45K for 2048 with two blocks per SM; ranking 64 values by
// counting takes 1.1K, 256 take 4.8K.
//
// - c <= kRankByCountingMaxC: thread i counts the values above a[i] (c loads
//   of a broadcast shared-memory word each).
// - larger c: values are bucketed by their offset from the minimum (the top
//   kRankBucketBits bits of the range), the buckets laid out from the top by
//   a block scan, the values scattered into their bucket's span, and each
//   value counts only the members of its own bucket above it. Buckets hold
//   ~1 value for smooth data; when one holds more than kRankMaxBucket (values
//   clustered far below a few outliers) the caller falls back to a sort.
// Values must be distinct (packed key and index): the ranks are then a
// permutation, and the result is deterministic whatever the order of the
// shared-memory atomics.
#pragma once

#include "cuda/primitives.cuh"

namespace jax_topk::cuda {

inline constexpr int kRankByCountingMaxC = 256;
inline constexpr int kRankBucketBits = 11;
inline constexpr int kRankBuckets = 1 << kRankBucketBits;
inline constexpr uint32_t kRankMaxBucket = 64;

// Bucket of value e, from the minimum lo and the range hi - lo: the range's
// top kRankBucketBits bits (host-callable: the host simulation mirrors it).
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE int rank_bucket_shift(uint64_t lo, uint64_t hi) {
  const int width = bit_width_u64(hi - lo);
  return width > kRankBucketBits ? width - kRankBucketBits : 0;
}
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE uint32_t rank_bucket(uint64_t e, uint64_t lo, int shift) {
  return uint32_t((e - lo) >> shift);
}

template <int kThreads>
struct BlockRankShared {
  unsigned long long lo, hi;
  uint32_t max_bucket;
  uint32_t warp_totals[kThreads / kWarpSize];
};

// Smallest and largest of a[0:count) in every thread (count >= 1). Starts
// with the caller's barrier (a[] written and visible); ends with one.
template <int kThreads>
__device__ void block_min_max(const uint64_t* a, int count, unsigned long long* lo_shared,
                              unsigned long long* hi_shared, uint64_t* lo_out, uint64_t* hi_out) {
  const int tid = int(threadIdx.x);
  if (tid == 0) {
    *lo_shared = ~0ull;
    *hi_shared = 0;
  }
  unsigned long long lo = ~0ull, hi = 0;
  for (int i = tid; i < count; i += kThreads) {
    lo = min_of(lo, (unsigned long long)a[i]);
    hi = max_of(hi, (unsigned long long)a[i]);
  }
JAX_TOPK_UNROLL
  for (int d = kWarpSize / 2; d > 0; d /= 2) {
    lo = min_of(lo, shfl_xor_wide(lo, d));
    hi = max_of(hi, shfl_xor_wide(hi, d));
  }
  __syncthreads();  // the resets above come before every atomic below
  if ((tid & (kWarpSize - 1)) == 0) {
    atomicMin(lo_shared, lo);
    atomicMax(hi_shared, hi);
  }
  __syncthreads();
  *lo_out = *lo_shared;
  *hi_out = *hi_shared;
  __syncthreads();  // read before anyone writes them again
}

// Calls emit(value, pos) for every value a[i], first <= i < last, of the c
// values a[0:c); pos = its rank from the top among all c (0 = largest). a: c
// distinct values, written and followed by a barrier. Several blocks holding
// the same a[] may split [0, c) between them (the cluster kernel): each
// ranks its slice against all c. spill: room for c values (the bucket
// spans); bins: kRankBuckets u32. Returns false, having emitted nothing, when
// a bucket is too full (the caller then sorts); every thread gets the same
// answer. Ends with a barrier.
template <int kThreads, typename Emit>
__device__ bool block_rank_desc(const uint64_t* a, int c, int first, int last, uint64_t* spill,
                                uint32_t* bins, BlockRankShared<kThreads>& rs, Emit&& emit) {
  const int tid = int(threadIdx.x);
  if (c <= kRankByCountingMaxC) {
    for (int i = first + tid; i < last; i += kThreads) {
      const uint64_t mine = a[i];
      int rank = 0;
#pragma unroll 8
      for (int j = 0; j < c; ++j) rank += a[j] > mine ? 1 : 0;
      emit(mine, rank);
    }
    __syncthreads();
    return true;
  }
  uint64_t lo, hi;
  block_min_max<kThreads>(a, c, &rs.lo, &rs.hi, &lo, &hi);
  const int shift = rank_bucket_shift(lo, hi);
  for (int b = tid; b < kRankBuckets; b += kThreads) bins[b] = 0;
  if (tid == 0) rs.max_bucket = 0;
  __syncthreads();
  for (int i = tid; i < c; i += kThreads) atomicAdd(&bins[rank_bucket(a[i], lo, shift)], 1u);
  __syncthreads();
  // Bucket starts from the top: thread t owns kPer buckets from bucket
  // kRankBuckets - 1 - t * kPer downwards.
  constexpr int kPer = kRankBuckets / kThreads;
  static_assert(kRankBuckets % kThreads == 0, "whole buckets per thread");
  const int top = kRankBuckets - 1 - tid * kPer;
  uint32_t counts[kPer];
  uint32_t mine = 0, biggest = 0;
JAX_TOPK_UNROLL
  for (int j = 0; j < kPer; ++j) {
    counts[j] = bins[top - j];
    mine += counts[j];
    biggest = max_of(biggest, counts[j]);
  }
  uint32_t start = block_exclusive_sum<kThreads>(mine, rs.warp_totals);  // ends with a barrier
JAX_TOPK_UNROLL
  for (int j = 0; j < kPer; ++j) {
    bins[top - j] = start;  // start of bucket top - j
    start += counts[j];
  }
  if (biggest > kRankMaxBucket) atomicMax(&rs.max_bucket, biggest);
  __syncthreads();
  if (rs.max_bucket > kRankMaxBucket) {  // uniform
    __syncthreads();
    return false;
  }
  // Scatter: after it, bins[b] is the END of bucket b, and bucket b spans
  // [bins[b + 1], bins[b]) (b + 1 = kRankBuckets: from 0).
  for (int i = tid; i < c; i += kThreads) {
    const uint64_t e = a[i];
    spill[atomicAdd(&bins[rank_bucket(e, lo, shift)], 1u)] = e;
  }
  __syncthreads();
  for (int i = first + tid; i < last; i += kThreads) {
    const uint64_t e = a[i];
    const uint32_t b = rank_bucket(e, lo, shift);
    const int begin = b + 1 < uint32_t(kRankBuckets) ? int(bins[b + 1]) : 0;
    const int end = int(bins[b]);
    int rank = begin;
    for (int j = begin; j < end; ++j) rank += spill[j] > e ? 1 : 0;
    emit(e, rank);
  }
  __syncthreads();
  return true;
}

}  // namespace jax_topk::cuda
