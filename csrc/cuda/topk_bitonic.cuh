// Bitonic networks for descending order of packed (key, index) integers:
// register arrays of a compile-time size (sort, clean, keep-top-K merge) used
// by the warp-sort kernel (host-callable too, for the host simulation in
// tests/), and a shared-memory block sort used to order the
// survivors of radix select. All values being distinct, the result of every
// network is the one sorted permutation: deterministic by construction.
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

// Sorts s[0:count) descending in shared memory with the whole block (all
// threads must call it). count must be a power of two; pad with 0 below the
// real entries. Starts and ends with a barrier.
template <typename P>
__device__ void block_bitonic_sort_desc(P* s, int count) {
  const int pairs = count / 2;
  __syncthreads();
  for (int size = 2; size <= count; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int p = int(threadIdx.x); p < pairs; p += int(blockDim.x)) {
        const int i = 2 * stride * (p / stride) + (p % stride);  // i has bit `stride` clear
        const int j = i + stride;
        P a = s[i], b = s[j];
        if ((i & size) == 0) {
          order_desc(a, b);
        } else {
          order_desc(b, a);
        }
        s[i] = a;
        s[j] = b;
      }
      __syncthreads();
    }
  }
}

}  // namespace jax_topk::cuda
