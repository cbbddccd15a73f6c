// The one list of FFI targets this library registers. Each row: the op family
// (the key Python looks up), the XLA custom-call target name (the same on every
// platform), the stem of the handler symbols (`<stem>Cpu`, `<stem>Gpu`), and
// whether the CPU and GPU (CUDA or ROCm) modules have a handler for it (1/0),
// and the predicate (namespace jax_topk) of the dtypes its kernels read. A platform
// without a handler, or a dtype outside the predicate, lowers the op through
// the pure-JAX fallback.
#pragma once

#include "jax_topk/dtypes.h"
#include "jax_topk/gpu_compat.h"  // JAX_TOPK_PLATFORM_GPU
#include "jax_topk/indexer.h"
#include "jax_topk/nsa.h"
#include "jax_topk/routing.h"
#include "jax_topk/sort_dispatch.h"

namespace jax_topk {
// The sort kernels' dtypes: every dtype on the CPU; keys of at most 32 bits
// on the GPU (sort_dispatch.h), where 64-bit dtypes take the pure-JAX sort.
#if defined(JAX_TOPK_PLATFORM_GPU)
constexpr bool sort_dtype(DType d) { return sort_gpu_dtype(d); }
#else
constexpr bool sort_dtype(DType d) { return any_dtype(d); }
#endif
// The top-k kernels' dtypes: every dtype, but on ROCm keys of at most 32 bits:
// 64-bit keys with a large k end in a device-wide sort of 128-bit packed
// (key, index) values, which rocPRIM 5 does not have (jax_topk/gpu_compat.h).
#if defined(JAX_TOPK_PLATFORM_ROCM)
constexpr bool topk_dtype(DType d) { return sort_gpu_dtype(d); }
#else
constexpr bool topk_dtype(DType d) { return any_dtype(d); }
#endif
}  // namespace jax_topk

#define JAX_TOPK_FOR_EACH_TARGET(X) \
  X(top_k, "jax_topk_top_k", JaxTopkTopK, 1, 1, topk_dtype) \
  X(top_k_lengths, "jax_topk_top_k_lengths", JaxTopkTopKLengths, 1, 1, topk_dtype) \
  X(sort, "jax_topk_sort", JaxTopkSort, 1, 1, sort_dtype) \
  X(sort_lengths, "jax_topk_sort_lengths", JaxTopkSortLengths, 1, 1, sort_dtype) \
  X(route, "jax_topk_route", JaxTopkRoute, 1, 1, is_route_dtype) \
  X(route_softmax_partial, "jax_topk_route_softmax_partial", JaxTopkRouteSoftmaxPartial, 1, 1, is_route_dtype) \
  X(indexer, "jax_topk_indexer", JaxTopkIndexer, 1, 1, is_indexer_dtype) \
  X(nsa_block_scores, "jax_topk_nsa_block_scores", JaxTopkNsaBlockScores, 0, 1, nsa_score_dtype)

// JAX_TOPK_ON_THIS_PLATFORM(cpu_flag, gpu_flag, code...) keeps `code` only
// when the module being compiled has the handler.
#define JAX_TOPK_WHEN_0(...)
#define JAX_TOPK_WHEN_1(...) __VA_ARGS__
#define JAX_TOPK_WHEN_(flag, ...) JAX_TOPK_WHEN_##flag(__VA_ARGS__)
#define JAX_TOPK_WHEN(flag, ...) JAX_TOPK_WHEN_(flag, __VA_ARGS__)
#if defined(JAX_TOPK_PLATFORM_CPU)
#define JAX_TOPK_ON_THIS_PLATFORM(cpu, gpu, ...) JAX_TOPK_WHEN(cpu, __VA_ARGS__)
#elif defined(JAX_TOPK_PLATFORM_GPU)
#define JAX_TOPK_ON_THIS_PLATFORM(cpu, gpu, ...) JAX_TOPK_WHEN(gpu, __VA_ARGS__)
#endif
