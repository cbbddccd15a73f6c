// CUDA fused MoE routing: one warp per token (DESIGN section 5).
#pragma once

#include "jax_topk/gpu_compat.h"

#include <cstdint>

#include "jax_topk/dtypes.h"
#include "jax_topk/routing.h"

namespace jax_topk::cuda {

// The CUDA twin of cpu::route_tokens (cpu/routing_cpu.h): same arguments,
// device pointers, same results bit for bit. Enqueues on `stream`; returns
// the launch status (gpuErrorInvalidValue for an unsupported dtype).
gpuError_t route_tokens(DType dtype, const void* logits, const float* bias, float* weights, int32_t* ids,
                         const RouteConfig& cfg, gpuStream_t stream);

}  // namespace jax_topk::cuda
