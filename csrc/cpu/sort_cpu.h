// CPU stable sort along the last axis of a row-major [rows, n] array.
#pragma once

#include <cstdint>

#include "cpu/task_runner.h"
#include "jax_topk/dtypes.h"

namespace jax_topk::cpu {

// Stable sort of each row of a row-major [rows, n] array of `dtype` by the IEEE
// total order (keys.h), descending or ascending; equal keys keep their original
// order (lower index first) in BOTH directions, so ascending is not the reverse
// of descending when there are ties. Writes the sorted elements' raw bits to
// `values` ([rows, n], same dtype) and their positions to `indices` (int32).
//
// If lengths != nullptr, row r sorts only its first lengths[r] elements
// (0 <= lengths[r] <= n, validated by the caller); output slots j >= lengths[r]
// hold DTypeTraits<D>::kLowestBits and index -1.
//
// Requires n < 2^31. Allocates its scratch per call (about 2 * 8 bytes per
// element of the rows in flight, 16 bytes per element for 64-bit dtypes).
// Returns false for a dtype outside the table in dtypes.h.
bool sort_rows(DType dtype, const void* x, void* values, int32_t* indices, int64_t rows, int64_t n,
               bool descending, const int32_t* lengths, TaskRunner& runner);

}  // namespace jax_topk::cpu
