// Bitonic networks for descending order of packed (key, index) integers:
// register arrays of a compile-time size (sort, clean, keep-top-K merge) used
// by the warp-sort kernel (host-callable too, for the host simulation in
// tests/), and a block sort (registers, shuffles, shared memory) that orders
// the threshold kernel's candidates and radix select's survivors. All values
// being distinct, the result of every network is the one sorted permutation:
// deterministic by construction.
#pragma once

#include "cuda/primitives.cuh"

namespace jax_topk::cuda {

// Puts the larger of (a, b) in a.
template <typename P>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void order_desc(P& a, P& b) {
  const P hi = max_of(a, b);
  b = min_of(a, b);
  a = hi;
}

// Sorts a[0:K) descending (K a power of two). Indices are compile-time after
// unrolling, so the array stays in registers.
template <int K, typename P>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void bitonic_sort_desc(P (&a)[K]) {
  static_assert((K & (K - 1)) == 0, "power of two");
JAX_TOPK_UNROLL
  for (int size = 2; size <= K; size *= 2) {
JAX_TOPK_UNROLL
    for (int stride = size / 2; stride > 0; stride /= 2) {
JAX_TOPK_UNROLL
      for (int i = 0; i < K; ++i) {
        const int j = i ^ stride;
        if (j > i) {
          // Runs of length `size` alternate direction; the last (size == K)
          // is descending everywhere.
          if ((i & size) == 0) {
            order_desc(a[i], a[j]);
          } else {
            order_desc(a[j], a[i]);
          }
        }
      }
    }
  }
}

// Sorts a bitonic sequence a[0:K) descending.
template <int K, typename P>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void bitonic_clean_desc(P (&a)[K]) {
JAX_TOPK_UNROLL
  for (int stride = K / 2; stride > 0; stride /= 2) {
JAX_TOPK_UNROLL
    for (int i = 0; i < K; ++i) {
      if ((i & stride) == 0) order_desc(a[i], a[i + stride]);
    }
  }
}

// a, b sorted descending: a <- the K largest of a ∪ b, sorted descending.
// max(a[i], b[K-1-i]) keeps exactly the top K and leaves a bitonic sequence.
template <int K, typename P>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void merge_top_desc(P (&a)[K], const P (&b)[K]) {
JAX_TOPK_UNROLL
  for (int i = 0; i < K; ++i) a[i] = max_of(a[i], b[K - 1 - i]);
  bitonic_clean_desc(a);
}

// a[j] for a run-time j < K without indexing the register array.
template <int K, typename P>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE P select_at(const P (&a)[K], int j) {
  P r = a[0];
JAX_TOPK_UNROLL
  for (int i = 1; i < K; ++i) r = (i == j) ? a[i] : r;
  return r;
}

// ---------------------------------------------------------------------------
// Block bitonic sort. Thread t holds the kBlockSortPerThread = 8 consecutive
// positions [8t, 8t + 8) in registers, so of the log2(N)(log2(N)+1)/2 stages
// only those with stride >= 256 (one warp's span) go through shared memory
// (10 of 78 at N = 4096, two barriers each); strides 8..128 are lane
// shuffles and strides 1..4 compare-exchanges inside a thread. The old
// all-shared-memory network spent a barrier on every stage and two run-time
// divisions on every pair (it was the threshold kernel's largest cost at
// k = 2048).
inline constexpr int kBlockSortPerThread = 8;
inline constexpr int kBlockSortWarpSpan = kWarpSize * kBlockSortPerThread;

// In a bitonic network, the element at `pos` keeps the larger of itself and
// its partner pos ^ stride iff it is the lower of the two in a descending
// run (runs of length `size` alternate direction; the final size is all
// descending).
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE bool bitonic_keeps_max(int pos, int stride, int size) {
  return ((pos & stride) == 0) == ((pos & size) == 0);
}

// Shared-memory slot of position pos in the sort's exchange stages: an xor of
// the low 3 bits with bits 4-6, a permutation within each aligned group of 8.
// Thread t writes positions 8t..8t+7; without it the 16 threads of one 64-bit
// shared-memory wavefront would hit 2 bank pairs (8-way conflict), with it 16.
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE int block_sort_slot(int pos) {
  return pos ^ ((pos >> 4) & 7);
}

// Sorts s[0:count) descending with the whole block (every thread calls it;
// count a power of two <= kBlockSortPerThread * blockDim.x; pad with 0 below
// the real entries). Starts and ends with a barrier. Threads past
// max(count, 256) / 8 only join the barriers (warp-uniform: both are
// multiples of 8 * 32).
template <typename P>
__device__ void block_bitonic_sort_desc(P* s, int count) {
  constexpr int kE = kBlockSortPerThread;
  const int n = count > kBlockSortWarpSpan ? count : kBlockSortWarpSpan;  // below: 0 in registers
  const int base = int(threadIdx.x) * kE;
  const bool active = base < n;
  P v[kE];
  __syncthreads();
JAX_TOPK_UNROLL
  for (int e = 0; e < kE; ++e) v[e] = active && base + e < count ? s[base + e] : P(0);
  for (int size = 2; size <= n; size *= 2) {
    for (int stride = size / 2; stride >= kE; stride /= 2) {
      // Every element of this thread has the same (pos & stride) and
      // (pos & size) bits (stride, size >= 8 > e).
      const bool keep_max = bitonic_keeps_max(base, stride, size);
      if (stride >= kBlockSortWarpSpan) {  // uniform: partner in another warp
        __syncthreads();  // the previous exchange's reads are done
        if (active) {
JAX_TOPK_UNROLL
          for (int e = 0; e < kE; ++e) s[block_sort_slot(base + e)] = v[e];
        }
        __syncthreads();
        if (active) {
JAX_TOPK_UNROLL
          for (int e = 0; e < kE; ++e) {
            const P o = s[block_sort_slot((base + e) ^ stride)];
            v[e] = keep_max ? max_of(v[e], o) : min_of(v[e], o);
          }
        }
      } else if (active) {  // partner in lane ^ (stride / 8), same e
JAX_TOPK_UNROLL
        for (int e = 0; e < kE; ++e) {
          const P o = shfl_xor_wide(v[e], stride / kE);
          v[e] = keep_max ? max_of(v[e], o) : min_of(v[e], o);
        }
      }
    }
    if (active) {
JAX_TOPK_UNROLL
      for (int stride = kE / 2; stride > 0; stride /= 2) {
        if (stride >= size) continue;
JAX_TOPK_UNROLL
        for (int e = 0; e < kE; ++e) {
          if ((e & stride) != 0) continue;
          const P hi = max_of(v[e], v[e + stride]), lo = min_of(v[e], v[e + stride]);
          const bool desc = ((base + e) & size) == 0;
          v[e] = desc ? hi : lo;
          v[e + stride] = desc ? lo : hi;
        }
      }
    }
  }
  __syncthreads();  // the last exchange's reads are done
  if (active) {
JAX_TOPK_UNROLL
    for (int e = 0; e < kE; ++e) {
      if (base + e < count) s[base + e] = v[e];
    }
  }
  __syncthreads();
}

}  // namespace jax_topk::cuda
