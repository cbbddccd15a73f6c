// A stable block-wide LSD radix sort of packed (key, ~index) values by their
// KEY word, descending, over only the key bits that differ: the order of the
// k selected in the register-rows kernel.
//
// Why not a bitonic network: its O(c log^2 c) compare-exchanges of 64-bit
// values are issue-bound in a 1024-thread block (H200: 6 us for 512 values,
// 17 us for 2048, measured with the phase timer). A counting pass costs
// O(c) plus a scan of 256 digits x the warps, and the selected keys rarely
// differ in more than 24-25 bits: 3-4 passes.
//
// Stability is what makes sorting the KEY word enough: the caller hands the
// values over in index order, and equal keys keep that order, which is the
// contract's tie rule (lower index first).
//
// One pass over digit bits [shift, shift + 8) (digit complemented, so that
// ascending digits are descending keys):
// 1. item i of lane l in warp w sits at position w * 32 * kItems + 32 * i + l;
//    each warp ranks its items among its own of the same digit, in position
//    order (the lanes sharing a digit by ballots; a per-warp counter per
//    digit adds the earlier items);
// 2. one block scan of the (digit, warp) counts, digit-major, gives every
//    (digit, warp) its first slot;
// 3. each value goes to slot start(digit, warp) + rank: to the buffer, or to
//    emit() after the last pass.
#pragma once

#include "cuda/primitives.cuh"

namespace jax_topk::cuda {

inline constexpr int kBlockRadixDigitBits = 8;
inline constexpr int kBlockRadixDigits = 1 << kBlockRadixDigitBits;

template <int kThreads>
struct BlockRadixSortShared {
  static constexpr int kWarps = kThreads / kWarpSize;
  // counts[d][w]: warp w's values of digit d, then the slot of the first of
  // them. 16 bits: a warp holds at most 32 * kItems values and the sort at
  // most 65535. The row padding (kWarps + 1) puts the digits one warp's
  // leaders touch on different banks.
  uint16_t counts[kBlockRadixDigits][kWarps + 1];
  uint32_t warp_totals[kWarps];
};

// The pass's digit of a packed value, complemented: ascending digits are
// descending keys.
__device__ JAX_TOPK_FORCE_INLINE int block_radix_digit(uint64_t v, int shift) {
  return int(~(uint32_t(v >> 32) >> shift) & (kBlockRadixDigits - 1));
}

// Sorts the count values of buf[0:count) (count <= kThreads * kItems) by key
// word descending, stably, looking at key bits [0, key_bits) only (the bits
// above must be equal in all of them); calls emit(value, slot) once per value
// with its sorted slot (0 = first). buf is overwritten. Every thread calls it
// after a barrier that makes buf visible; barriers depend on key_bits only.
template <int kThreads, int kItems, typename Emit>
__device__ JAX_TOPK_FORCE_INLINE void block_radix_sort_desc(uint64_t* buf, int count, int key_bits,
                                                            BlockRadixSortShared<kThreads>& sh, Emit&& emit) {
  constexpr int kWarps = kThreads / kWarpSize;
  constexpr int kSpan = kWarpSize * kItems;
  constexpr int kPerThread = kBlockRadixDigits * kWarps / kThreads;  // (digit, warp) counts per thread
  static_assert(kThreads % kWarpSize == 0 && kWarps % kPerThread == 0, "whole runs of one digit per thread");
  static_assert(kThreads * kItems <= 0xffff, "16-bit counts");
  const int tid = int(threadIdx.x), lane = lane_id(), warp = tid / kWarpSize;
  uint64_t v[kItems];
JAX_TOPK_UNROLL
  for (int i = 0; i < kItems; ++i) {
    const int pos = warp * kSpan + i * kWarpSize + lane;
    v[i] = pos < count ? buf[pos] : uint64_t(0);
  }
  if (key_bits <= 0) {  // all keys equal: the given order is the sorted one
JAX_TOPK_UNROLL
    for (int i = 0; i < kItems; ++i) {
      const int pos = warp * kSpan + i * kWarpSize + lane;
      if (pos < count) emit(v[i], pos);
    }
    return;
  }
  for (int shift = 0;; shift += kBlockRadixDigitBits) {
    const bool last = shift + kBlockRadixDigitBits >= key_bits;
    // 1. Ranks within the warp. (The previous pass read every count before
    // its last barrier; buf was read into v before the first.)
    for (int d = lane; d < kBlockRadixDigits; d += kWarpSize) sh.counts[d][warp] = 0;
    warp_sync();
    uint32_t rank[kItems];
JAX_TOPK_UNROLL
    for (int i = 0; i < kItems; ++i) {
      const bool real = warp * kSpan + i * kWarpSize + lane < count;
      const int d = block_radix_digit(v[i], shift);
      rank[i] = warp_digit_rank<kBlockRadixDigitBits>(d, real, &sh.counts[d][warp]);
    }
    __syncthreads();
    // 2. (digit, warp) starts: thread t holds kPerThread consecutive entries
    // of the digit-major order.
    const int d0 = tid * kPerThread / kWarps, w0 = tid * kPerThread % kWarps;
    uint32_t c[kPerThread], sum = 0;
JAX_TOPK_UNROLL
    for (int j = 0; j < kPerThread; ++j) {
      c[j] = sh.counts[d0][w0 + j];
      sum += c[j];
    }
    uint32_t start = block_exclusive_sum<kThreads>(sum, sh.warp_totals);
JAX_TOPK_UNROLL
    for (int j = 0; j < kPerThread; ++j) {
      sh.counts[d0][w0 + j] = uint16_t(start);
      start += c[j];
    }
    __syncthreads();
    // 3. Scatter.
JAX_TOPK_UNROLL
    for (int i = 0; i < kItems; ++i) {
      if (warp * kSpan + i * kWarpSize + lane >= count) continue;
      const uint32_t slot = sh.counts[block_radix_digit(v[i], shift)][warp] + rank[i];
      if (last) {
        emit(v[i], int(slot));
      } else {
        buf[slot] = v[i];
      }
    }
    if (last) return;
    __syncthreads();
JAX_TOPK_UNROLL
    for (int i = 0; i < kItems; ++i) {
      const int pos = warp * kSpan + i * kWarpSize + lane;
      v[i] = pos < count ? buf[pos] : uint64_t(0);
    }
  }
}

}  // namespace jax_topk::cuda
