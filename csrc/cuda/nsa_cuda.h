// Host-side entry point of NSA's block-score kernel (jax_topk/nsa.h). No XLA
// or JAX headers: ffi/nsa.cc calls it.
#pragma once

#include "jax_topk/gpu_compat.h"

#include <cstdint>

#include "jax_topk/dtypes.h"
#include "jax_topk/nsa.h"

namespace jax_topk::cuda {

// Selection scores [batch, kv_heads, chunk, width] float32 of the queries
// start .. start + chunk - 1 (start: one int32 on the device), per
// jax_topk/nsa.h; blocks past what a query sees score 0. dtype: bfloat16 or
// float16 (nsa_score_dtype); the shape must pass nsa_block_scores_unsupported
// and chunk be a multiple of 16.
gpuError_t nsa_block_scores(DType dtype, const void* q, const void* k_cmp, const float* lse, const int32_t* start,
                            const NsaScoreShape& shape, float* out, gpuStream_t stream);

}  // namespace jax_topk::cuda
