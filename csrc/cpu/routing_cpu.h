// CPU fused MoE routing: one pass per token over its logits (DESIGN section 5).
#pragma once

#include <cstdint>

#include "cpu/task_runner.h"
#include "jax_topk/dtypes.h"
#include "jax_topk/routing.h"

namespace jax_topk::cpu {

// Routes cfg.tokens tokens of cfg.experts logits each (row-major, see
// RouteInputs): writes weights [tokens, k] (float32) and ids [tokens, k]
// (int32, best first). Requires 1 <= k <= experts <= kRouteMaxExperts,
// k <= kRouteMaxK, valid groups, and normaliser parts only where
// cfg.needs_softmax_sum() (the FFI layer checks). Returns false for any
// other dtype.
bool route_tokens(DType dtype, const RouteInputs& in, float* weights, int32_t* ids, const RouteConfig& cfg,
                  TaskRunner& runner);

// The vector ISA the route's scoring loops run on this CPU: "avx512",
// "avx2" or "baseline" (SSE2 on x86-64; the compiler's target elsewhere),
// the widest the CPU has unless the environment variable JAX_TOPK_ROUTE_ISA
// names a narrower one. Every choice computes the same bits.
const char* route_isa();

// Per token t of `tokens` rows of `experts` logits: the exact sum of
// exp(z - shift[t]) over the row (route_math::ExactSum, the softmax normaliser
// a route computes), written as kExactSumWords words to sums + t * kExactSumWords. The
// partial sums of a row split over devices add up to its normaliser.
bool softmax_partial_sums(DType dtype, const void* logits, const float* shift, uint32_t* sums, int64_t tokens,
                          int32_t experts, TaskRunner& runner);

}  // namespace jax_topk::cpu
