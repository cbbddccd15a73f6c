// Host-side entry point of the CUDA sparse-attention indexer
// (jax_topk/indexer.h). No XLA or JAX headers: ffi/indexer.cc calls it.
#pragma once

#include "jax_topk/gpu_compat.h"

#include <cstddef>
#include <cstdint>

#include "jax_topk/dtypes.h"
#include "jax_topk/indexer.h"

namespace jax_topk::cuda {

// Bytes of device scratch indexer_top_k needs: the [batch, n] float32 scores
// (fused: each row's candidates, scores and ids, and their counts) and the
// top-k's own scratch.
size_t indexer_scratch_bytes(DType dtype, int64_t batch, int64_t heads, int64_t n, int64_t dim, int64_t k,
                             IndexerFusion fusion);

// Whether the scores of (dtype, heads, dim) come from tensor cores (bfloat16,
// heads a multiple of 16 up to 128, dim 16, 32, 64 or 128): the path depends on these only, never on
// the batch or n, so every row's result is batch-invariant either way.
bool indexer_uses_tensor_cores(DType dtype, int64_t heads, int64_t dim);

// How a call runs (for tests and benchmarks): tensor cores or the exact
// order; fused or not, with the keys of a fused block and its buffer's
// capacity (past it the block keeps its k best); the largest k the fused
// kernel of this (dtype, heads, dim) takes (0: none).
struct IndexerPath {
  bool tensor_cores = false;
  bool fused = false;
  int64_t chunk_keys = 0;
  int64_t capacity = 0;
  int64_t fused_max_k = 0;
};
IndexerPath indexer_path(DType dtype, int64_t batch, int64_t heads, int64_t n, int64_t dim, int64_t k,
                         IndexerFusion fusion);

// q [batch, heads, dim], keys [batch / items_per_keys, n, dim] (float32 or
// bfloat16; item b reads key set b / items_per_keys: 1 for keys per item,
// batch for keys every item shares), weights [batch, heads] float32,
// lengths [batch] int32 (any values: clamped to [0, n] on the device) -> scores [batch, k] float32 and ids [batch, k]
// int32, best first; slots past min(k, length) hold -inf and -1.
// Scores: tensor cores (bfloat16 MMA, float32 accumulation in a fixed order
// of 16-wide steps over dim) where indexer_uses_tensor_cores, else the exact
// order of indexer.h (then bit-identical to the CPU kernel). `fusion` picks
// where the scores go (indexer.h); every choice gives the same bits.
gpuError_t indexer_top_k(DType dtype, const void* q, const void* keys, const float* weights,
                          const int32_t* lengths, int64_t batch, int64_t heads, int64_t n, int64_t dim,
                          int64_t k, int64_t items_per_keys, IndexerFusion fusion, float* scores, int32_t* ids,
                          void* scratch, size_t scratch_bytes, gpuStream_t stream);

}  // namespace jax_topk::cuda
