// Threshold top-k, one block per row (regime kThresholdRowPerBlock): keys of
// at most 32 bits, k <= kThresholdMaxK, any n. Two reads of the row instead
// of the 4-6 scans of radix select:
//
// 1. Group maxima. The row is split into G = kRadixThreads * kR groups
//    (group = (thread, slot), slot = position in the thread's unrolled load
//    step mod kR); each thread keeps its kR group maxima of PACKED values
//    (key << 32 | ~index) in registers. The G maxima are distinct elements
//    (or 0 for an empty group), so T = the k-th largest maximum has at least
//    k elements >= T: the k best elements of the row are all >= T. Any
//    partition into groups gives this guarantee; empty groups (0) only lower T.
// 2. T: block radix select (8-bit digits over the 64-bit packed value) of the
//    G maxima in shared memory; typically 3-4 passes over G values.
// 3. Candidates: a second read of the row (from L2: rows in flight are capped)
//    keeps the packed elements >= T in shared memory (warp-aggregated slots,
//    scheduling-dependent ORDER, exact SET). Expected count for G groups:
//    c ~ G * -ln(1 - k/G): 1.15k at G = 4k, 1.39k at G = 2k; for all-equal
//    rows the packed maxima make c ~ k (ties broken by index).
// 4. Sort the c candidates (bitonic over next_pow2(c), padded with 0 which is
//    below every element), write the first k. Deterministic: packed values
//    are distinct, so the sorted order is unique.
// Fallback: c > G (capacity) -- only when many groups are empty or, with
// G < the number of elements, heavy ties beyond the groups' reach -- runs the
// radix select of topk_radix.cuh for that row, in the same block and the same
// shared memory. Always correct, slower.
//
// Per-row lengths: both reads walk the row's first len elements only. A row
// shorter than k has fewer than k non-empty groups, so T = 0 and all of its
// len elements are candidates; the sort's 0 pads then fill the slots past
// them, written as padding.
#pragma once

#include "cuda/primitives.cuh"
#include "cuda/topk_bitonic.cuh"
#include "cuda/topk_radix.cuh"

namespace jax_topk::cuda {

inline constexpr int kThresholdSelectBits = 8;
inline constexpr int kThresholdSelectBins = 1 << kThresholdSelectBits;
inline constexpr int kThresholdSelectPasses = 64 / kThresholdSelectBits;
static_assert(kThresholdSelectBins * kThresholdSelectPasses <= kRadixBins,
              "the selection histograms live in the radix histogram");

// Groups per thread (G = kRadixThreads * R), the smallest R in {1, 2, 8}
// with (a) G >= 4k (random rows: ~1.15k candidates) and (b) all-equal rows
// still fit: there a group's maximum is its first element, a thread's groups
// start within its first 16-byte vector (16/bytes elements), so the k-th
// smallest group start is ~ (16/bytes)/R * k and that many candidates must
// fit in G: (16/bytes) * k <= kRadixThreads * R^2.
JAX_TOPK_HOST_DEVICE constexpr int threshold_slots(int64_t k, int elem_bytes) {
  const int64_t vec = 16 / elem_bytes;
  if (k <= kRadixThreads / 4 && vec * k <= kRadixThreads) return 1;
  if (k <= kRadixThreads / 2 && vec * k <= 4 * kRadixThreads) return 2;
  return 8;
}

// Dynamic shared memory of threshold_topk_row_per_block_kernel<U, R>.
JAX_TOPK_HOST_DEVICE constexpr size_t threshold_smem_bytes(int slots) {
  return size_t(kRadixBins) * sizeof(uint32_t) + size_t(kRadixThreads) * size_t(slots) * sizeof(uint64_t);
}

struct ThresholdShared {
  unsigned long long t_min;
  uint32_t digit, above, count;
  uint32_t candidates;
};

// walk_row (primitives.cuh) that also passes the element's position in the
// thread's unrolled step (0 for the scalar head and tail): a compile-time
// constant once the loops are unrolled, so it may index a register array.
template <typename U, int kUnroll, typename Visit>
__device__ JAX_TOPK_FORCE_INLINE void walk_row_pos(const U* __restrict__ row, int64_t n, int tid,
                                                   int nthreads, Visit&& visit) {
  constexpr int kVec = int(16 / sizeof(U));
  if (n <= 0) return;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(row);
  const int64_t to_aligned = int64_t((16 - (addr & 15)) & 15) / int64_t(sizeof(U));
  const int64_t head = to_aligned < n ? to_aligned : n;
  {
    const bool valid = tid < head;
    visit(valid ? row[tid] : U(0), int64_t(tid), valid, 0);
  }
  const int64_t nvec = (n - head) / kVec;
  const uint4* vecs = reinterpret_cast<const uint4*>(row + head);
  for (int64_t v0 = 0; v0 < nvec; v0 += int64_t(nthreads) * kUnroll) {
    Vec16<U> data[kUnroll];
JAX_TOPK_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + int64_t(u) * nthreads + tid;
      data[u].raw = v < nvec ? __ldg(vecs + v) : make_uint4(0, 0, 0, 0);
    }
JAX_TOPK_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + int64_t(u) * nthreads + tid;
      const bool valid = v < nvec;
JAX_TOPK_UNROLL
      for (int e = 0; e < kVec; ++e) visit(data[u].elems[e], head + v * kVec + e, valid, u * kVec + e);
    }
  }
  {
    const int64_t i = head + nvec * kVec + tid;  // fewer than kVec left
    const bool valid = i < n;
    visit(valid ? row[i] : U(0), i, valid, 0);
  }
}

// The k-th largest of a[0:count) (1 <= k <= count; values may repeat, e.g.
// zeros) with the whole block: radix select on 8-bit digits from the top,
// stopping when the chosen bucket is exactly what is still needed; the
// answer is then the bucket's minimum. hist: kThresholdSelectPasses *
// kThresholdSelectBins u32. Starts and ends with a barrier.
template <int kThreads>
__device__ uint64_t block_kth_largest(const uint64_t* a, int count, uint32_t k, uint32_t* hist,
                                      ThresholdShared& ts) {
  const int tid = int(threadIdx.x);
  for (int i = tid; i < kThresholdSelectPasses * kThresholdSelectBins; i += kThreads) hist[i] = 0;
  if (tid == 0) ts.t_min = ~0ull;
  __syncthreads();
  uint64_t prefix = 0;
  uint32_t k_left = k;
  int shift = 64;
  for (int pass = 0;; ++pass) {
    const int hs = shift;  // bits at and above hs are fixed by prefix
    shift -= kThresholdSelectBits;
    uint32_t* h = hist + pass * kThresholdSelectBins;
    for (int i = tid; i < count; i += kThreads) {
      const uint64_t e = a[i];
      if (hs == 64 || (e >> hs) == (prefix >> hs)) {
        atomicAdd(&h[uint32_t(e >> shift) & (kThresholdSelectBins - 1)], 1u);
      }
    }
    __syncthreads();
    if (tid < kWarpSize) {
      // Lane l owns bins [256 - 8(l+1), 256 - 8l), walked from the top.
      constexpr int kPer = kThresholdSelectBins / kWarpSize;
      const int top = kThresholdSelectBins - 1 - tid * kPer;
      uint32_t mine = 0;
JAX_TOPK_UNROLL
      for (int j = 0; j < kPer; ++j) mine += h[top - j];
      uint32_t incl = mine;
JAX_TOPK_UNROLL
      for (int d = 1; d < kWarpSize; d *= 2) {
        const uint32_t t = __shfl_up_sync(kFullWarpMask, incl, d);
        if (tid >= d) incl += t;
      }
      const uint32_t above = incl - mine;
      if (above < k_left && k_left <= incl) {
        uint32_t acc = above;
        for (int j = 0; j < kPer; ++j) {
          const uint32_t c = h[top - j];
          if (acc + c >= k_left) {
            ts.digit = uint32_t(top - j);
            ts.above = acc;
            ts.count = c;
            break;
          }
          acc += c;
        }
      }
    }
    __syncthreads();
    // Everybody reads ts before the next pass's first barrier; the next write
    // to it comes after that barrier.
    prefix |= uint64_t(ts.digit) << shift;
    k_left -= ts.above;
    if (ts.count == k_left || shift == 0) break;  // uniform
  }
  // Every element of the chosen bucket is among the k largest: the k-th
  // largest is its minimum.
  unsigned long long m = ~0ull;
  for (int i = tid; i < count; i += kThreads) {
    const uint64_t e = a[i];
    if ((e >> shift) == (prefix >> shift) && e < m) m = e;
  }
JAX_TOPK_UNROLL
  for (int d = kWarpSize / 2; d > 0; d /= 2) m = min_of(m, shfl_xor_wide(m, d));
  if ((tid & (kWarpSize - 1)) == 0) atomicMin(&ts.t_min, m);
  __syncthreads();
  const uint64_t t = ts.t_min;
  __syncthreads();
  return t;
}

// Dynamic shared memory: threshold_smem_bytes(kR) = hist[kRadixBins] u32,
// then G = kRadixThreads * kR u64 (the maxima, then the candidates, then for
// the fallback: next_pow2(k) survivors + two candidate buffers).
template <typename U, int kR>
__global__ void __launch_bounds__(kRadixThreads)
    threshold_topk_row_per_block_kernel(const U* __restrict__ x, int64_t rows, int64_t n,
                                        int64_t k, int index_bits, KeyCodec<U> codec,
                                        RowLengths<U> lengths, U* __restrict__ values,
                                        int32_t* __restrict__ indices) {
  static_assert(sizeof(U) <= 4, "packed values are u64");
  using P = uint64_t;
  using Pack = KeyIndexPacking<U, P>;
  constexpr int kG = kRadixThreads * kR;
  constexpr int kUnroll = kRadixUnroll<U>;
  static_assert(kUnroll * int(16 / sizeof(U)) % kR == 0, "slots cover the step evenly");
  extern __shared__ uint4 threshold_smem[];
  uint32_t* hist = reinterpret_cast<uint32_t*>(threshold_smem);
  P* a = reinterpret_cast<P*>(hist + kRadixBins);
  __shared__ ThresholdShared ts;
  __shared__ RadixBlockShared<P> rs;
  const int tid = int(threadIdx.x);

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const U* in = x + row * n;
    // 32 bits (n < 2^31): one register less through both walks (sm_100
    // spilled with a 64-bit length).
    const int len = int(lengths.of_loaded(row, n));
    // 1. Group maxima (packed; 0 for empty groups and invalid calls).
    P m[kR];
JAX_TOPK_UNROLL
    for (int r = 0; r < kR; ++r) m[r] = 0;
    walk_row_pos<U, kUnroll>(in, len, tid, kRadixThreads, [&](U bits, int64_t i, bool valid, int pos) {
      const P e = valid ? Pack::pack(codec.key(bits), uint32_t(i)) : P(0);
      m[pos % kR] = max_of(m[pos % kR], e);
    });
JAX_TOPK_UNROLL
    for (int r = 0; r < kR; ++r) a[r * kRadixThreads + tid] = m[r];
    if (tid == 0) ts.candidates = 0;
    __syncthreads();
    // 2. T = the k-th largest maximum.
    const P t = block_kth_largest<kRadixThreads>(a, kG, uint32_t(k), hist, ts);
    // 3. Candidates >= T (at least k of them).
    walk_row_pos<U, kUnroll>(in, len, tid, kRadixThreads, [&](U bits, int64_t i, bool valid, int) {
      const P e = Pack::pack(codec.key(bits), uint32_t(i));
      const bool take = valid && e >= t;
      const uint32_t slot = reserve_slot(&ts.candidates, take);
      if (take && slot < uint32_t(kG)) a[slot] = e;
    });
    __syncthreads();
    const uint32_t c = ts.candidates;
    if (c <= uint32_t(kG)) {  // uniform
      // 4. Sort them, write the first k (c < k only in a row shorter than k:
      // the pads past c are written as padding).
      const int count = int(next_pow2(int64_t(c < k ? k : c)));
      for (int i = int(c) + tid; i < count; i += kRadixThreads) a[i] = 0;
      block_bitonic_sort_desc(a, count);
      for (int j = tid; j < k; j += kRadixThreads) {
        write_packed_output(a[j], codec, lengths.pad_bits, values, indices, row * k + j);
      }
    } else {
      // Too many candidates: radix select of the row in this block. Room:
      // next_pow2(k) <= kG survivors, the rest split into two candidate buffers.
      const int survivors = int(next_pow2(k));
      const int capacity = (kG - survivors) / 2;
      radix_select_row_in_block<U, true>(in, len, k, index_bits, capacity, codec,
                                         lengths.pad_bits, hist, a + survivors, a, rs,
                                         values + row * k, indices + row * k);
    }
    __syncthreads();  // shared memory is reused by the next row
  }
}

}  // namespace jax_topk::cuda
