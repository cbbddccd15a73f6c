// Cheap estimates of the route scores, with bounds on their distance from
// the exact scores of jax_topk/routing.h (the bounds path of routing.cu).
//
// The exact scores (IEEE operations only, so that the CPU computes the same
// bits) cost ~50 (sigmoid) to ~90 (sqrt(softplus)) instructions an expert. A
// route reads them only to choose the k best c = score + bias and to weight
// those k, so routing.cu scores every expert with the hardware's approximate
// exp / log / reciprocal / rsqrt instead (one MUFU instruction each), bounds
// each exact c within [c_hat - delta, c_hat + delta], and computes exact
// scores only for the experts whose interval reaches the k-th best lower
// bound: the selection among those is the selection among all, bit for bit.
//
// The bounds (ScoreErrorBound) allow 2^-16 relative. The largest error comes
// from rounding the exponent's argument, z * log2(e): up to |z| 2^-24
// relative in the result, ~2^-17.5 at |z| ~ 88, to which the approximations
// add a few ulp. csrc/cuda/tests/route_bounds_test.cu checks the bounds over
// every finite float32 logit on the GPU (H200: at most 0.26 of the
// allowance). On ROCm, whose approximations are not checked, the route
// scores every expert exactly (kHaveBoundedFastScores).
#pragma once

#include <cstdint>

#include "jax_topk/gpu_compat.h"
#include "jax_topk/routing.h"

namespace jax_topk::cuda::route_bounds {

#if defined(JAX_TOPK_HIP)
inline constexpr bool kHaveBoundedFastScores = false;
#else
inline constexpr bool kHaveBoundedFastScores = true;
#endif

// |exact(z) - fast(z)| <= relative * |fast(z)| + absolute for every finite z.
struct ScoreErrorBound {
  float relative;
  float absolute;
};
// Sigmoid: below z ~ -87.3 the fast score is 0 and the exact one under 2^-125.
inline constexpr float kSigmoidRelativeError = 0x1p-16f;
inline constexpr float kSigmoidAbsoluteError = 0x1p-120f;
// sqrt(softplus): below z ~ -87 the fast exp flushes to 0, and the exact score
// is the square root of a number under 2^-125: under 2^-62.
inline constexpr float kSqrtSoftplusRelativeError = 0x1p-16f;
inline constexpr float kSqrtSoftplusAbsoluteError = 0x1p-60f;

// (Built from scalars: device code may read host constexpr scalars, not objects.)
JAX_TOPK_HOST_DEVICE constexpr ScoreErrorBound score_error_bound(RouteScore score) {
  return score == RouteScore::kSigmoid ? ScoreErrorBound{kSigmoidRelativeError, kSigmoidAbsoluteError}
                                       : ScoreErrorBound{kSqrtSoftplusRelativeError, kSqrtSoftplusAbsoluteError};
}

// The hardware's approximations (PTX ex2 / lg2 / rcp / rsqrt .approx.ftz:
// one MUFU instruction each, no subnormal fix-ups). (HIP: the bounds path is
// not taken there; these only keep it compiling.)
#if defined(JAX_TOPK_HIP)
__device__ JAX_TOPK_FORCE_INLINE float approx_exp2(float x) { return exp2f(x); }
__device__ JAX_TOPK_FORCE_INLINE float approx_log2(float x) { return log2f(x); }
__device__ JAX_TOPK_FORCE_INLINE float approx_rcp(float x) { return 1.0f / x; }
__device__ JAX_TOPK_FORCE_INLINE float approx_rsqrt(float x) { return rsqrtf(x); }
#else
#define JAX_TOPK_PTX_APPROX(name, instruction)                          \
  __device__ JAX_TOPK_FORCE_INLINE float name(float x) {                \
    float y;                                                            \
    asm(instruction " %0, %1;" : "=f"(y) : "f"(x));                     \
    return y;                                                           \
  }
JAX_TOPK_PTX_APPROX(approx_exp2, "ex2.approx.ftz.f32")
JAX_TOPK_PTX_APPROX(approx_log2, "lg2.approx.ftz.f32")
JAX_TOPK_PTX_APPROX(approx_rcp, "rcp.approx.ftz.f32")
JAX_TOPK_PTX_APPROX(approx_rsqrt, "rsqrt.approx.ftz.f32")
#undef JAX_TOPK_PTX_APPROX
#endif

inline constexpr float kLog2E = 1.44269504f;
inline constexpr float kLn2 = 0.693147182f;

// 1 / (1 + exp(-z)): below z ~ -87.3 the reciprocal's result is subnormal,
// flushed to 0.
__device__ JAX_TOPK_FORCE_INLINE float fast_sigmoid(float z) {
  return approx_rcp(1.0f + approx_exp2(z * -kLog2E));
}

// sqrt(max(z, 0) + log1p(exp(-|z|))). log1p(t) by its series below 2^-5
// (truncation t^3 / 4 relative, under 2^-17), where 1 + t would lose t's
// bits; a subnormal softplus (z below ~ -87) gives 0.
__device__ JAX_TOPK_FORCE_INLINE float fast_sqrt_softplus(float z) {
  const float t = approx_exp2(fabsf(z) * -kLog2E);
  const float series = t * (1.0f - t * (0.5f - t * 0.333333343f));
  const float log1p_t = t < 0x1p-5f ? series : approx_log2(1.0f + t) * kLn2;
  const float softplus = fmaxf(z, 0.0f) + log1p_t;
  return softplus >= 0x1p-126f ? softplus * approx_rsqrt(softplus) : 0.0f;
}

__device__ JAX_TOPK_FORCE_INLINE float fast_score(RouteScore score, float z) {
  return score == RouteScore::kSigmoid ? fast_sigmoid(z) : fast_sqrt_softplus(z);
}

// delta for c_hat = fast + bias (or fast alone): |c - c_hat| <= delta where c
// = rn(exact + bias). The score error is doubled; 2^-22 |c_hat| covers the
// two sums' roundings (half an ulp each, 2^-24 of the value) with as much
// again to spare for the roundings of c_hat +- delta and of this sum.
__device__ JAX_TOPK_FORCE_INLINE float selection_delta(float fast, float c_hat, ScoreErrorBound bound) {
  return 2.0f * (bound.relative * fabsf(fast) + bound.absolute) + 0x1p-22f * fabsf(c_hat);
}

}  // namespace jax_topk::cuda::route_bounds
