// CPU scores of the sparse-attention indexer (jax_topk/indexer.h): one row of
// scores per batch item, later reduced by topk_rows.
#pragma once

#include <cstdint>

#include "cpu/task_runner.h"
#include "jax_topk/dtypes.h"

namespace jax_topk::cpu {

// scores[b, s] for s < lengths[b] (lengths clamped to [0, n] by the caller;
// the rest of the row is left as it is): q [batch, heads, dim], keys
// [batch / items_per_keys, n, dim] of `dtype` (float32 or bfloat16; item b
// reads key set b / items_per_keys), weights [batch, heads] float32, scores
// [batch, n] float32. Returns false for another dtype.
bool indexer_scores(DType dtype, const void* q, const void* keys, const float* weights,
                    int64_t batch, int64_t heads, int64_t n, int64_t dim, int64_t items_per_keys,
                    const int32_t* lengths, float* scores, TaskRunner& runner);

}  // namespace jax_topk::cpu
