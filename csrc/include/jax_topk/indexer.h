// The sparse-attention indexer's score, defined once for every platform:
//
//   score[b, s] = sum_h weights[b, h] * relu(q[b, h] . keys[b, s])
//
// with float32 arithmetic in ONE fixed order, which is what makes the result
// batch-invariant: it depends on the row's own q, keys and weights only, never
// on the batch size, the padded key count or a launch configuration.
//   dot = ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)), where lane
//         p_j = sum over d = j, j + 8, j + 16, ... (increasing d) of q[d] * k[d]
//   score = sum over h = 0, 1, ... (increasing) of weights[h] * relu(dot_h)
// Every product and every sum is rounded on its own (no fused multiply-add),
// and inputs (bfloat16 or float32) are widened to float32 exactly first.
// relu(x) = x > 0 ? x : 0 (a NaN dot gives 0; -0.0 gives 0).
#pragma once

#include <cstdint>
#include <cstring>

#include "jax_topk/dtypes.h"
#include "jax_topk/gpu_compat.h"

namespace jax_topk {

inline constexpr int kIndexerLanes = 8;

// The element types of q and keys the kernels read (weights are float32).
constexpr bool is_indexer_dtype(DType d) { return d == DType::float32 || d == DType::bfloat16; }

JAX_TOPK_HOST_DEVICE inline float indexer_widen(float x) { return x; }
JAX_TOPK_HOST_DEVICE inline float indexer_widen(uint16_t bf16_bits) {
  const uint32_t bits = uint32_t(bf16_bits) << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

JAX_TOPK_HOST_DEVICE inline float indexer_relu(float x) { return x > 0.0f ? x : 0.0f; }

// The lane sums combined in the fixed tree above.
JAX_TOPK_HOST_DEVICE inline float indexer_combine_lanes(const float* p) {
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

}  // namespace jax_topk
