// CPU top-k along the last axis of a row-major [rows, n] array.
#pragma once

#include <cstdint>

#include "cpu/task_runner.h"
#include "jax_topk/dtypes.h"

namespace jax_topk::cpu {

// Writes the k best elements of each row (raw bits, same dtype) to `values`
// ([rows, k]) and their positions to `indices`, best first by the IEEE total
// order, ties by lower index. Requires 0 <= k <= n < 2^31. With `lengths`
// (one int32 per row in [0, n], may be null; the FFI layer applies the
// sequence-mask rule to user lengths) only the first lengths[r] elements of
// row r take part, and output slots past that many hold the dtype's lowest
// value and index -1. Returns false for a dtype outside the
// table in dtypes.h.
bool topk_rows(DType dtype, const void* x, void* values, int32_t* indices,
               int64_t rows, int64_t n, int64_t k, const int32_t* lengths,
               TaskRunner& runner);

}  // namespace jax_topk::cpu
