// Ordering a block's candidates by rank instead of sorting them: every value
// finds its output position pos = #{values greater than it} on its own, so
// the c candidates of the threshold kernel go to their slots without a
// network of barrier-separated stages. Measured on an H200 (512 threads,
// clock cycles of one block, tests/block_sort_bench.cu): the bitonic
// network takes ~8.6K cycles even for 64 values (36 dependent stages in one
// warp) and 45K for 2048 with two blocks per SM; ranking 64 values by
// counting takes 1.1K, 256 take 4.8K.
//
// - c <= rank_by_counting_max_c(threads): thread i counts the values above
//   a[i] (c loads of a broadcast shared-memory word each).
// - larger c: values are bucketed by their offset from the minimum or a
//   known lower bound (the top rank_bucket_bits(threads) bits of the range, up to the
//   maximum or a known upper bound), the buckets laid out from the top by
//   a block scan, the values scattered into their bucket's span, and each
//   value counts only the members of its own bucket above it. Buckets hold
//   ~1 value for smooth data; when one holds more than kRankMaxBucket (values
//   clustered far below a few outliers) the caller falls back to a sort.
// Values must be distinct (packed key and index): the ranks are then a
// permutation, and the result is deterministic whatever the order of the
// shared-memory atomics.
#pragma once

#include <climits>

#include "cuda/primitives.cuh"

namespace jax_topk::cuda {

// Counting costs each thread c^2 / threads compares; bucketing costs a block
// about the same whatever c (~2.2K warp instructions a row at c ~ 500 on 128
// threads, ncu on an H100). 256 is the crossing measured on 512 threads, so
// it scales with the square root of the threads: 128 on 128 threads, where
// rows of 1024 x 8192 k = 64 with c of 130..256 spent 4.3-6.3 us ranking by
// counting against ~2.6 bucketed (H100 block timeline) and were the launch's
// slowest blocks.
JAX_TOPK_HOST_DEVICE constexpr int rank_by_counting_max_c(int threads) {
  int c = 1;
  while (c < 256 && (c + 1) * (c + 1) <= 128 * threads) ++c;
  return c;
}
static_assert(rank_by_counting_max_c(128) == 128 && rank_by_counting_max_c(512) == 256, "the crossings measured");
inline constexpr int kRankBucketBits = 11;  // the most: the shared-memory words every kernel sets aside
inline constexpr int kRankBuckets = 1 << kRankBucketBits;
inline constexpr uint32_t kRankMaxBucket = 64;

// Bucket bits of a block of `threads`: four buckets a thread, at most
// kRankBucketBits. Each thread zeroes its buckets and scans their starts, so
// on 128 threads 2048 buckets cost 48 shared-memory accesses a thread for
// ~600 candidates (1024 x 8192 k = 256); 512 threads keep 2048.
JAX_TOPK_HOST_DEVICE constexpr int rank_bucket_bits(int threads) {
  int bits = 0;
  while (bits < kRankBucketBits && (2 << bits) <= 4 * threads) ++bits;
  return bits;
}
static_assert(rank_bucket_bits(128) == 9 && rank_bucket_bits(512) == kRankBucketBits, "four buckets a thread");

// Bucket of value e, from the minimum lo and the range hi - lo: the range's
// top `bits` bits (host-callable: the host simulation mirrors it).
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE int rank_bucket_shift(uint64_t lo, uint64_t hi, int bits) {
  const int width = bit_width_u64(hi - lo);
  return width > bits ? width - bits : 0;
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

struct RankBuckets {
  uint64_t lo;
  int shift;
  uint32_t count;  // buckets: 1 << rank_bucket_bits(threads)
  __device__ JAX_TOPK_FORCE_INLINE uint32_t of(uint64_t e) const { return rank_bucket(e, lo, shift); }
};

// Bounds lo <= every value <= hi that a caller already knows (the threshold
// kernel: T and the largest candidate its compaction saw); hi == 0 (never
// the largest of real packed values) for none.
struct RankRange {
  uint64_t lo = 0, hi = 0;
};
// The buckets of a[0:c): over range where it is known, else over the
// smallest and largest value (a block reduction and three barriers: ~0.9 us
// of the 4.8 that the threshold kernel's rank and write took per row at
// c ~ 2500, 512 threads).
template <int kThreads>
__device__ RankBuckets block_rank_buckets(const uint64_t* a, int c, BlockRankShared<kThreads>& rs,
                                          RankRange range) {
  if (range.hi == 0) block_min_max<kThreads>(a, c, &rs.lo, &rs.hi, &range.lo, &range.hi);
  constexpr int kBits = rank_bucket_bits(kThreads);
  return RankBuckets{range.lo, rank_bucket_shift(range.lo, range.hi, kBits), 1u << kBits};
}

// The values of a[0:c) (c above rank_by_counting_max_c, distinct, written and
// followed by a barrier) scattered into spill[] by bucket rb.of(), buckets
// laid out from the top: bucket b spans [bins[b + 1], bins[b]) of spill
// afterwards (from 0 for the top bucket). bins: rb.count u32. False,
// having scattered nothing, when a bucket is too full (the caller then
// sorts); every thread gets the same answer. Ends with a barrier.
template <int kThreads>
__device__ bool block_scatter_rank_buckets(const uint64_t* a, int c, RankBuckets rb, uint64_t* spill,
                                           uint32_t* bins, BlockRankShared<kThreads>& rs) {
  constexpr int kBuckets = 1 << rank_bucket_bits(kThreads);  // rb.count
  const int tid = int(threadIdx.x);
  for (int b = tid; b < kBuckets; b += kThreads) bins[b] = 0;
  if (tid == 0) rs.max_bucket = 0;
  __syncthreads();
  for (int i = tid; i < c; i += kThreads) atomicAdd(&bins[rb.of(a[i])], 1u);
  __syncthreads();
  // Bucket starts from the top: thread t owns kPer buckets from bucket
  // kBuckets - 1 - t * kPer downwards.
  constexpr int kPer = kBuckets / kThreads;
  static_assert(kBuckets % kThreads == 0, "whole buckets per thread");
  const int top = kBuckets - 1 - tid * kPer;
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
  // Scatter: after it, bins[b] is the END of bucket b.
  for (int i = tid; i < c; i += kThreads) {
    const uint64_t e = a[i];
    spill[atomicAdd(&bins[rb.of(e)], 1u)] = e;
  }
  __syncthreads();
  return true;
}

// The span [begin, end) of spill that block_scatter_rank_buckets gave e's bucket.
struct BucketSpan {
  int begin, end;
};
__device__ JAX_TOPK_FORCE_INLINE BucketSpan bucket_span(uint64_t e, const uint32_t* bins, RankBuckets rb) {
  const uint32_t b = rb.of(e);
  return BucketSpan{b + 1 < rb.count ? int(bins[b + 1]) : 0, int(bins[b])};
}

// Rank from the top of e among all the values block_scatter_rank_buckets put:
// the buckets above its own (its span's begin), plus the members of its own
// above it.
__device__ JAX_TOPK_FORCE_INLINE int rank_in_span(uint64_t e, const uint64_t* spill, BucketSpan span) {
  int rank = span.begin;
  for (int j = span.begin; j < span.end; ++j) rank += spill[j] > e ? 1 : 0;
  return rank;
}

// Rank from the top of `mine` among a[0:c) by counting (c <= rank_by_counting_max_c).
__device__ JAX_TOPK_FORCE_INLINE int rank_by_counting(const uint64_t* a, int c, uint64_t mine) {
  int rank = 0;
#pragma unroll 8
  for (int j = 0; j < c; ++j) rank += a[j] > mine ? 1 : 0;
  return rank;
}

// Calls emit(value, pos) for each of the c values of a[0:c) whose rank pos
// (from the top among all c, 0 = largest) is below `wanted`, in the share of
// part `part` of `parts`: several blocks holding the same a[] split the work
// (the cluster kernel), and each such value is emitted by exactly one part.
// Counting, a part takes a slice of a[]. Bucketed, it takes the buckets
// whose span begins in its slice of [0, min(c, wanted)): by spans, not by
// positions in spill[], whose order within a bucket differs from block to
// block (the scatter's atomics); a value's rank lies within its bucket's
// span, so a warp's emits fall on few lines. a: c distinct values, written
// and followed by a barrier. spill: room for c values; bins: kRankBuckets
// u32; range: as block_rank_buckets. Returns false, having emitted nothing,
// when a bucket is too full (the caller then sorts); every thread gets the
// same answer. Ends with a barrier.
template <int kThreads, typename Emit>
__device__ bool block_rank_desc(const uint64_t* a, int c, int wanted, int part, int parts, uint64_t* spill,
                                uint32_t* bins, BlockRankShared<kThreads>& rs, RankRange range, Emit&& emit) {
  const int tid = int(threadIdx.x);
  if (c <= rank_by_counting_max_c(kThreads)) {
    const int first = int(int64_t(c) * part / parts), last = int(int64_t(c) * (part + 1) / parts);
    for (int i = first + tid; i < last; i += kThreads) {
      const int pos = rank_by_counting(a, c, a[i]);
      if (pos < wanted) emit(a[i], pos);
    }
    __syncthreads();
    return true;
  }
  const RankBuckets rb = block_rank_buckets<kThreads>(a, c, rs, range);
  if (!block_scatter_rank_buckets<kThreads>(a, c, rb, spill, bins, rs)) return false;
  const int covered = min_of(c, wanted);  // spans beginning at or past it hold no rank below wanted
  const int first = int(int64_t(covered) * part / parts), last = int(int64_t(covered) * (part + 1) / parts);
  const int end = min_of(c, last + int(kRankMaxBucket));  // the last owned span ends before it
  for (int p = first + tid; p < end; p += kThreads) {
    const uint64_t e = spill[p];
    const BucketSpan span = bucket_span(e, bins, rb);
    if (span.begin < first || span.begin >= last) continue;  // another part's bucket
    const int pos = rank_in_span(e, spill, span);
    if (pos < wanted) emit(e, pos);
  }
  __syncthreads();
  return true;
}

// The c values of a[0:c) in descending order, in shared memory: returns the
// array whose slot pos holds the value of rank pos (spill when counting, a
// itself when bucketed: the ranks are then taken from spill, so a[] is free
// to take the values), or nullptr, with a[] unchanged, when a bucket is too
// full (the caller then sorts). Callers write their outputs from it in
// order: coalesced stores instead of one scattered store per value (a warp's
// 32 ranks are 32 different lines). Arguments as block_rank_desc; ends with
// a barrier. range: as block_rank_buckets. Bucketed, only the slots below
// `wanted` are filled: the values of the buckets whose span begins below it,
// which lie in spill[0, wanted + kRankMaxBucket) (1024 x 8192: ~600
// candidates for k = 256, ~500 for k = 64, each ranked within its bucket).
template <int kThreads>
__device__ const uint64_t* block_order_by_rank_desc(uint64_t* a, int c, uint64_t* spill, uint32_t* bins,
                                                    BlockRankShared<kThreads>& rs,
                                                    RankRange range = RankRange{}, int wanted = INT_MAX) {
  const int tid = int(threadIdx.x);
  if (c <= rank_by_counting_max_c(kThreads)) {
    for (int i = tid; i < c; i += kThreads) spill[rank_by_counting(a, c, a[i])] = a[i];
    __syncthreads();
    return spill;
  }
  const RankBuckets rb = block_rank_buckets<kThreads>(a, c, rs, range);
  if (!block_scatter_rank_buckets<kThreads>(a, c, rb, spill, bins, rs)) return nullptr;
  const int end = wanted < c - int(kRankMaxBucket) ? wanted + int(kRankMaxBucket) : c;
  for (int i = tid; i < end; i += kThreads) {
    const uint64_t e = spill[i];
    const BucketSpan span = bucket_span(e, bins, rb);
    if (span.begin < wanted) a[rank_in_span(e, spill, span)] = e;  // else every rank of its bucket is past wanted
  }
  __syncthreads();
  return a;
}

}  // namespace jax_topk::cuda
