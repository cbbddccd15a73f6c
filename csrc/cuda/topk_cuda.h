// Host-side entry points of the CUDA top-k kernels. No XLA or JAX headers:
// the FFI layer (ffi/topk.cc) decodes buffers and calls these.
#pragma once

#include "jax_topk/gpu_compat.h"

#include <cstddef>
#include <cstdint>

#include "jax_topk/dtypes.h"
#include "jax_topk/topk_dispatch.h"

namespace jax_topk::cuda {

// Bytes of device scratch `topk_rows` needs for this problem (may be 0),
// whatever the lengths. Pure function of its arguments and the current
// device's properties.
size_t topk_scratch_bytes(DType dtype, int64_t rows, int64_t n, int64_t k);

// Top-k along the last axis of a row-major [rows, n] array of `dtype`.
// `values` receives the raw bits of the k best elements of each row ([rows, k],
// same dtype) and `indices` their positions (int32), sorted best first by the
// IEEE total order (ties: lower index first). Enqueued on `stream`; returns the
// launch error if any. Requires 0 <= k <= n < 2^31; rows or k may be 0.
//
// `lengths`: a DEVICE array of one int32 per row, or null (every row whole).
// Its values may be anything; the kernels clamp each to L = min(max(v, 0), n)
// (the sequence-mask rule: only elements [0, L) of the row take part). Slots
// j < min(k, L) then hold the best of that prefix, and slots j >= min(k, L)
// the dtype's lowest value (DTypeTraits::kLowestBits) and index -1: the same
// as cpu::topk_rows with the clamped lengths. The kernel is still chosen from
// (rows, n, k).
gpuError_t topk_rows(DType dtype, const void* x, void* values, int32_t* indices,
                      int64_t rows, int64_t n, int64_t k, const int32_t* lengths,
                      void* scratch, size_t scratch_bytes, gpuStream_t stream);

// The same in a given regime instead of the dispatcher's (benchmarks and
// tests compare regimes): gpuErrorInvalidValue / 0 bytes where the regime
// does not hold the problem (topk_regime_holds).
size_t topk_scratch_bytes(DType dtype, int64_t rows, int64_t n, int64_t k, TopkRegime regime);
gpuError_t topk_rows(DType dtype, const void* x, void* values, int32_t* indices,
                      int64_t rows, int64_t n, int64_t k, const int32_t* lengths,
                      void* scratch, size_t scratch_bytes, gpuStream_t stream,
                      TopkRegime regime);

#if defined(JAX_TOPK_PHASE_TIMING)
// Builds with phase timing only: copies the per-phase clock-cycle counters of
// the kernels that mark phases (PhaseTimer in primitives.cuh) into out[0:8)
// and zeroes them.
gpuError_t read_phase_cycles(unsigned long long* out);
// ... and the block timeline of the last launch (g_block_timeline: per block
// of the first kBlockTimelineBlocks, begin ns, end ns, SM, the clock at its
// start and at each phase's last mark (0: none); zeros for blocks that did
// not run) into out[0:kBlockTimelineWords * kBlockTimelineBlocks), and
// zeroes it.
gpuError_t read_block_timeline(unsigned long long* out);
#endif

}  // namespace jax_topk::cuda
