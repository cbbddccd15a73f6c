// CPU fused MoE routing: one pass per token over its logits (DESIGN section 5).
#pragma once

#include <cstdint>

#include "cpu/task_runner.h"
#include "jax_topk/dtypes.h"
#include "jax_topk/routing.h"

namespace jax_topk::cpu {

// Routes cfg.tokens tokens of cfg.experts logits each (row-major, dtype
// float32, bfloat16 or float16): writes weights [tokens, k] (float32) and ids
// [tokens, k] (int32, best first). `bias` is null without a bias, else
// cfg.bias_token_stride floats apart per token (0: one shared [experts]).
// Requires 1 <= k <= experts <= kRouteMaxExperts, k <= kRouteMaxK and valid
// groups (the FFI layer checks). Returns false for any other dtype.
bool route_tokens(DType dtype, const void* logits, const float* bias, float* weights, int32_t* ids,
                  const RouteConfig& cfg, TaskRunner& runner);

}  // namespace jax_topk::cpu
