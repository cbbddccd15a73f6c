// Host-side entry points of the CUDA sort kernels. No XLA or JAX headers:
// the FFI layer (ffi/sort.cc) decodes buffers and calls these.
#pragma once

#include "jax_topk/gpu_compat.h"

#include <cstddef>
#include <cstdint>

#include "jax_topk/dtypes.h"
#include "jax_topk/sort_dispatch.h"

namespace jax_topk::cuda {

// Bytes of device scratch `sort_rows` needs (may be 0), whatever the lengths
// and the direction. Pure function of its arguments.
size_t sort_scratch_bytes(DType dtype, int64_t rows, int64_t n);

// Stable sort of every row of a row-major [rows, n] array of `dtype` in the
// IEEE total order (keys.h), ascending or descending; ties keep the lower
// index first in both directions. `values` receives the raw bits ([rows, n],
// same dtype), `indices` the positions (int32). Enqueued on `stream`; returns
// the launch error if any. Requires dtype_bytes(dtype) <= 4
// (sort_gpu_dtype), 0 <= n < 2^31.
//
// `lengths`: a DEVICE array of one int32 per row, or null. Each value is
// clamped to L = min(max(v, 0), n): the row's first L elements are sorted into
// slots [0, L), and slots [L, n) hold the dtype's lowest value and index -1,
// as cpu::sort_rows does.
gpuError_t sort_rows(DType dtype, const void* x, void* values, int32_t* indices, int64_t rows,
                      int64_t n, bool descending, const int32_t* lengths, void* scratch,
                      size_t scratch_bytes, gpuStream_t stream);

// The same in a given regime rather than choose_sort_regime's (tests and
// benchmarks: a regime sorts any row it holds, sort_regime_holds), with the
// scratch that regime needs. An empty problem returns success; a regime that
// cannot hold n returns gpuErrorInvalidValue.
size_t sort_scratch_bytes(DType dtype, int64_t rows, int64_t n, SortRegime regime);
gpuError_t sort_rows(DType dtype, const void* x, void* values, int32_t* indices, int64_t rows,
                      int64_t n, bool descending, const int32_t* lengths, void* scratch,
                      size_t scratch_bytes, gpuStream_t stream, SortRegime regime);

}  // namespace jax_topk::cuda
