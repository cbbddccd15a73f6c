// Host-side entry point of the CUDA sparse-attention indexer
// (jax_topk/indexer.h). No XLA or JAX headers: ffi/indexer.cc calls it.
#pragma once

#include "jax_topk/gpu_compat.h"

#include <cstddef>
#include <cstdint>

#include "jax_topk/dtypes.h"

namespace jax_topk::cuda {

// Bytes of device scratch indexer_top_k needs: the [batch, n] float32 scores
// and the top-k's own scratch.
size_t indexer_scratch_bytes(int64_t batch, int64_t n, int64_t k);

// Whether the scores of (dtype, heads, dim) come from tensor cores (bfloat16,
// heads a multiple of 16 up to 128, dim 16, 32, 64 or 128): the path depends on these only, never on
// the batch or n, so every row's result is batch-invariant either way.
bool indexer_uses_tensor_cores(DType dtype, int64_t heads, int64_t dim);

// q [batch, heads, dim], keys [batch, n, dim] (float32 or bfloat16), weights
// [batch, heads] float32, lengths [batch] int32 (any values: clamped to
// [0, n] on the device) -> scores [batch, k] float32 and ids [batch, k]
// int32, best first; slots past min(k, length) hold -inf and -1.
// Scores: tensor cores (bfloat16 MMA, float32 accumulation in a fixed order
// of 16-wide steps over dim) where indexer_uses_tensor_cores, else the exact
// order of indexer.h (then bit-identical to the CPU kernel).
gpuError_t indexer_top_k(DType dtype, const void* q, const void* keys, const float* weights,
                          const int32_t* lengths, int64_t batch, int64_t heads, int64_t n, int64_t dim,
                          int64_t k, float* scores, int32_t* ids, void* scratch, size_t scratch_bytes,
                          gpuStream_t stream);

}  // namespace jax_topk::cuda
