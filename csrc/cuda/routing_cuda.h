// CUDA fused MoE routing: one warp per token (DESIGN section 5).
#pragma once

#include "jax_topk/gpu_compat.h"

#include <cstdint>

#include "jax_topk/dtypes.h"
#include "jax_topk/routing.h"

namespace jax_topk::cuda {

// The CUDA twins of cpu::route_tokens and cpu::softmax_partial_sums
// (cpu/routing_cpu.h): same arguments, device pointers, same results bit for
// bit. Enqueue on `stream`; return the launch status (gpuErrorInvalidValue
// for an unsupported dtype).
gpuError_t route_tokens(DType dtype, const RouteInputs& in, float* weights, int32_t* ids, const RouteConfig& cfg,
                         gpuStream_t stream);
gpuError_t softmax_partial_sums(DType dtype, const void* logits, const float* shift, uint32_t* sums, int64_t tokens,
                                int32_t experts, gpuStream_t stream);

}  // namespace jax_topk::cuda
