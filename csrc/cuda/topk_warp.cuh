// Warp-sort top-k for short rows and small k (regimes kTinyRows and kSmallK).
//
// A group of `lanes` (4..32, a power of two) lanes owns one row; a warp holds
// 32 / lanes rows. Each lane keeps the K best packed (key, ~index) values it
// has seen, sorted descending in registers (K = next power of two >= k). The
// row is streamed in 16-byte loads; a chunk of K new values is sorted and
// merged into the list only when one of them beats the lane's pruning
// threshold. At the end log2(lanes) butterfly steps (each lane trades its
// list with lane ^ m and keeps the top K of both) leave the group's top K in
// every lane, and lanes write the k outputs in parallel.
//
// Pruning threshold: the largest over the group of each lane's k-th best. A
// lane whose k-th best is t holds k values >= t, so nothing below t can be in
// the row's top k; the true top k is never pruned and always fits in the
// list of its own lane, so the merge sees all of it.
//
// Per-row lengths: the row's length bounds the loads (positions past it load
// as 0, below every element, and never pass the pruning test); list entries
// still 0 at the end are written as padding. With lengths the host picks the
// scalar layout (a vector straddling the length would need a per-element test
// on the whole-row path).
#pragma once

#include "cuda/dependent_launch.cuh"
#include "cuda/primitives.cuh"
#include "cuda/topk_bitonic.cuh"

namespace jax_topk::cuda {

// 128 threads: the K = 32 instantiation needs ~170 registers, and smaller blocks
// pack more warps per SM under that register budget (3 blocks = 12 warps).
inline constexpr int kWarpSortThreads = 128;

template <typename U>
struct WarpSortPacked {
  // 8/16-bit keys + 16-bit index fit a u32 (n <= kWarpSortMaxN < 65535).
  using type = std::conditional_t<(sizeof(U) <= 2), uint32_t, uint64_t>;
};

// Loads the it-th chunk of kElems values of this lane as packed values (0 for
// positions past the row's length n; the vector path needs n a multiple of
// the vector). Vector path: lane l reads whole 16-byte vectors, consecutive
// lanes consecutive vectors. Scalar path (rows not 16-byte aligned, or rows
// with lengths): consecutive lanes read consecutive elements. Either way every
// element of the row lands in exactly one (iteration, lane, slot).
template <typename U, typename P, int kElems>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void load_packed_chunk(const U* __restrict__ row, int n,
                                                        bool vectorised, int it, int lane,
                                                        int lanes, bool row_valid,
                                                        KeyCodec<U> codec, P (&out)[kElems]) {
  using Pack = KeyIndexPacking<U, P>;
  constexpr int kVec = int(16 / sizeof(U));
  if (vectorised) {
    static_assert(kElems % kVec == 0, "whole vectors");
    constexpr int kVecs = kElems / kVec;
    const uint4* vecs = reinterpret_cast<const uint4*>(row);
JAX_TOPK_UNROLL
    for (int q = 0; q < kVecs; ++q) {
      const int v = (it * kVecs + q) * lanes + lane;
      const bool valid = row_valid && v * kVec < n;  // n is a multiple of kVec here
      Vec16<U> data;
      data.raw = valid ? vecs[v] : make_uint4(0, 0, 0, 0);
JAX_TOPK_UNROLL
      for (int e = 0; e < kVec; ++e) {
        out[q * kVec + e] = valid ? Pack::pack(codec.key(data.elems[e]), uint32_t(v * kVec + e)) : P(0);
      }
    }
  } else {
JAX_TOPK_UNROLL
    for (int t = 0; t < kElems; ++t) {
      const int i = (it * kElems + t) * lanes + lane;
      const bool valid = row_valid && i < n;
      out[t] = valid ? Pack::pack(codec.key(row[i]), uint32_t(i)) : P(0);
    }
  }
}

// Merges a lane's freshly loaded values into its sorted list, K at a time,
// skipping (no sort, no merge) any K that has nothing above the lane's K-th
// best or the group's pruning threshold.
template <int K, int kElems, typename P>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void absorb_chunk(P (&list)[K], const P (&chunk)[kElems],
                                                            P prune) {
  static_assert(kElems % K == 0, "whole parts");
JAX_TOPK_UNROLL
  for (int c = 0; c < kElems / K; ++c) {
    P part[K];
    const P threshold = max_of(list[K - 1], prune);
    bool any = false;
JAX_TOPK_UNROLL
    for (int i = 0; i < K; ++i) {
      part[i] = chunk[c * K + i];
      any |= part[i] > threshold;
    }
    if (any) {
      bitonic_sort_desc(part);
      merge_top_desc(list, part);
    }
  }
}

// Sorts one value per lane descending across the whole warp (lane 0 gets the
// largest) with shuffles. All 32 lanes call it.
template <typename P>
__device__ JAX_TOPK_FORCE_INLINE P warp_sort_desc_across_lanes(P v) {
  const int lane = lane_id();
JAX_TOPK_UNROLL
  for (int size = 2; size <= kWarpSize; size *= 2) {
JAX_TOPK_UNROLL
    for (int stride = size / 2; stride > 0; stride /= 2) {
      const P other = shfl_xor_wide(v, stride);
      const bool descending_run = (lane & size) == 0;
      const bool lower = (lane & stride) == 0;
      v = (lower == descending_run) ? max_of(v, other) : min_of(v, other);
    }
  }
  return v;
}

// Strict pruning threshold from lane maxima (whole warp per row, k <= 32):
// the k-th largest lane maximum M has k distinct elements at or above it, so
// nothing below M is in the top k. Returns M - 1 because the kernels keep
// values strictly above the threshold and M itself may belong to the answer.
template <typename P>
__device__ JAX_TOPK_FORCE_INLINE P lane_maxima_threshold(P lane_max, int k) {
  const P m = shfl_wide(warp_sort_desc_across_lanes(lane_max), k - 1);
  return m > P(0) ? P(m - 1) : P(0);
}

// Group-wide maximum over `lanes` consecutive lanes (all 32 lanes call it).
template <typename P>
__device__ JAX_TOPK_FORCE_INLINE P group_max(P v, int lanes) {
  for (int m = 1; m < lanes; m *= 2) v = max_of(v, shfl_xor_wide(v, m));
  return v;
}

// K: list capacity (power of two, k <= K). Grid: ceil(rows * lanes / threads)
// blocks of kWarpSortThreads threads.
template <typename U, int K>
__global__ void __launch_bounds__(kWarpSortThreads)
    warp_sort_topk_kernel(const U* __restrict__ x, U* __restrict__ values,
                          int32_t* __restrict__ indices, int64_t rows, int n, int k,
                          int log2_lanes, bool vectorised, KeyCodec<U> codec,
                          RowLengths<U> lengths) {
  wait_for_previous_grid();  // launched dependent (dependent_launch.cuh): the kernel before may still run
  using P = typename WarpSortPacked<U>::type;
  constexpr int kVec = int(16 / sizeof(U));
  constexpr int kElems = K > kVec ? K : kVec;  // values loaded per lane per iteration

  const int lanes = 1 << log2_lanes;
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = thread >> log2_lanes;
  const int lane = int(threadIdx.x) & (lanes - 1);
  const bool row_valid = row < rows;  // lanes past the last row still join the shuffles
  const U* in = x + (row_valid ? row : 0) * int64_t(n);
  const int len = row_valid ? int(lengths.of(row, n)) : 0;  // == n when vectorised

  P list[K];
JAX_TOPK_UNROLL
  for (int i = 0; i < K; ++i) list[i] = P(0);
  P prune = P(0);  // values at or below it are not in the row's top k (see top)

  const int per_iteration = lanes * kElems;
  // From n, not len: the same for the whole warp (shuffles below).
  const int iterations = (n + per_iteration - 1) / per_iteration;
  if (lanes == kWarpSize && iterations > 1) {
    // A first, cheap pass (the second one mostly hits L1/L2): lane maxima give
    // a threshold that lets the main pass skip nearly every sort and merge.
    P lane_max = P(0);
    for (int it = 0; it < iterations; ++it) {
      P chunk[kElems];
      load_packed_chunk<U, P, kElems>(in, len, vectorised, it, lane, lanes, row_valid, codec, chunk);
JAX_TOPK_UNROLL
      for (int i = 0; i < kElems; ++i) lane_max = max_of(lane_max, chunk[i]);
    }
    prune = lane_maxima_threshold(lane_max, k);
  }
  for (int it = 0; it < iterations; ++it) {
    P chunk[kElems];
    load_packed_chunk<U, P, kElems>(in, len, vectorised, it, lane, lanes, row_valid, codec, chunk);
    absorb_chunk<K, kElems>(list, chunk, prune);
    if (iterations > 1) prune = max_of(prune, group_max(select_at(list, k - 1), lanes));
  }

  // Butterfly: after step m each lane holds the top K of 2m lanes' lists.
  for (int m = 1; m < lanes; m *= 2) {
    P other[K];
JAX_TOPK_UNROLL
    for (int i = 0; i < K; ++i) other[i] = shfl_xor_wide(list[i], m);
    merge_top_desc(list, other);
  }

  if (!row_valid) return;
  const int64_t out_base = row * int64_t(k);
  for (int j = lane; j < k; j += lanes) {
    write_packed_output(select_at(list, j), codec, lengths.pad_bits, values, indices, out_base + j);
  }
}

}  // namespace jax_topk::cuda
