// MoE routing (DESIGN section 5): what the CPU and CUDA kernels share, so that
// both compute the same selection bit for bit.
//
// Per token, in float32 whatever the logits' dtype:
//   s = score(z); c = s + bias (if any); groups keep the top_groups groups by
//   (best c + second c); ids = the k best c in the total order, ties to the
//   lower expert; w = s[ids], renormalised and scaled.
//
// Bit-identical ids on every platform need bit-identical scores wherever the
// selection reads them (with a bias or groups). Library exp/log differ between
// libm and CUDA's libdevice by an ulp here and there, so the scores are
// computed here from IEEE-754 operations only (+, -, *, /, sqrt, conversions),
// each rounded on its own: device code calls the explicitly rounded intrinsics
// (never fused into an FMA) and host code is built with -ffp-contract=off.
// The functions are written branch-free so that a host compiler vectorises
// them over experts.
//
// Without a bias and groups every score is a strictly increasing function of
// the logit, so the selection ranks the logits themselves: the exact order of
// the scores, with no ties made by rounding (two logits 1 ulp apart can give
// one float32 softmax value). A softmax whose normaliser is NaN (a NaN logit,
// a +inf logit, or all -inf) has NaN for every score: every expert then ranks
// as +NaN and the k lowest experts are chosen, as top_k(NaN scores) would.
#pragma once

#include <cstdint>
#include <cstring>

#include "jax_topk/dtypes.h"
#include "jax_topk/gpu_compat.h"
#include "jax_topk/keys.h"

namespace jax_topk {

// The logits' dtypes the fused kernels read (others lower to the composition).
#define JAX_TOPK_FOR_EACH_ROUTE_DTYPE(X) X(float32) X(bfloat16) X(float16)

#define JAX_TOPK_IS_ROUTE_DTYPE(name) || d == DType::name
constexpr bool is_route_dtype(DType d) { return false JAX_TOPK_FOR_EACH_ROUTE_DTYPE(JAX_TOPK_IS_ROUTE_DTYPE); }
#undef JAX_TOPK_IS_ROUTE_DTYPE

enum class RouteScore : int32_t { kSoftmax = 0, kSigmoid = 1, kSqrtSoftplus = 2 };

// Limits of the fused kernels (one warp per token on the GPU: every lane holds
// experts/32 logits and one of the k outputs). Larger routes lower to the
// pure-JAX composition; the Python side reads these from build_info().
inline constexpr int32_t kRouteMaxExperts = 1024;
inline constexpr int32_t kRouteMaxK = 32;
// The canonical reduction width: sums are formed as 32 strided partial sums
// combined by an xor butterfly, the order a warp computes them in.
inline constexpr int32_t kRouteLanes = 32;

struct RouteConfig {
  int64_t tokens = 0;
  int32_t experts = 0;
  int32_t k = 0;
  RouteScore score = RouteScore::kSoftmax;
  // 0: no bias; otherwise the bias has this many floats between tokens
  // (0 stride means one [experts] bias shared by every token).
  bool has_bias = false;
  int64_t bias_token_stride = 0;
  int32_t n_groups = 0;  // 0: no groups
  int32_t top_groups = 0;
  bool renormalize = false;
  float scale = 1.0f;

  // The selection reads the float32 scores (else it ranks the logits).
  JAX_TOPK_HOST_DEVICE bool selects_by_score() const { return has_bias || n_groups > 0; }
  // Every score is needed: for the selection, or for the softmax normaliser
  // when the weights are not renormalised (with renormalisation the
  // normaliser cancels: w_i = e_i / sum over the chosen e_j).
  JAX_TOPK_HOST_DEVICE bool needs_softmax_sum() const {
    return score == RouteScore::kSoftmax && (selects_by_score() || !renormalize);
  }
};

namespace route_math {

// ---- explicitly rounded IEEE operations --------------------------------------
#if defined(JAX_TOPK_DEVICE_PASS)
JAX_TOPK_DEVICE JAX_TOPK_FORCE_INLINE float add(float a, float b) { return __fadd_rn(a, b); }
JAX_TOPK_DEVICE JAX_TOPK_FORCE_INLINE float sub(float a, float b) { return __fsub_rn(a, b); }
JAX_TOPK_DEVICE JAX_TOPK_FORCE_INLINE float mul(float a, float b) { return __fmul_rn(a, b); }
JAX_TOPK_DEVICE JAX_TOPK_FORCE_INLINE float div(float a, float b) { return __fdiv_rn(a, b); }
JAX_TOPK_DEVICE JAX_TOPK_FORCE_INLINE float sqrt(float a) { return __fsqrt_rn(a); }
JAX_TOPK_DEVICE JAX_TOPK_FORCE_INLINE double add(double a, double b) { return __dadd_rn(a, b); }
JAX_TOPK_DEVICE JAX_TOPK_FORCE_INLINE double mul(double a, double b) { return __dmul_rn(a, b); }
JAX_TOPK_DEVICE JAX_TOPK_FORCE_INLINE double div(double a, double b) { return __ddiv_rn(a, b); }
JAX_TOPK_DEVICE JAX_TOPK_FORCE_INLINE float bits_to_float(int32_t i) { return __int_as_float(i); }
JAX_TOPK_DEVICE JAX_TOPK_FORCE_INLINE int32_t float_to_bits(float f) { return __float_as_int(f); }
#else
// (Host-device in a GPU compiler's host pass, where clang checks device callers.)
JAX_TOPK_HOST_DEVICE inline float add(float a, float b) { return a + b; }
JAX_TOPK_HOST_DEVICE inline float sub(float a, float b) { return a - b; }
JAX_TOPK_HOST_DEVICE inline float mul(float a, float b) { return a * b; }
JAX_TOPK_HOST_DEVICE inline float div(float a, float b) { return a / b; }
JAX_TOPK_HOST_DEVICE inline float sqrt(float a) { return __builtin_sqrtf(a); }
JAX_TOPK_HOST_DEVICE inline double add(double a, double b) { return a + b; }
JAX_TOPK_HOST_DEVICE inline double mul(double a, double b) { return a * b; }
JAX_TOPK_HOST_DEVICE inline double div(double a, double b) { return a / b; }
JAX_TOPK_HOST_DEVICE inline float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}
JAX_TOPK_HOST_DEVICE inline int32_t float_to_bits(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}
#endif

JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE bool is_nan(float x) { return !(x == x); }
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE float positive_part(float x) { return x > 0.0f ? x : 0.0f; }
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE float negative_abs(float x) {
  return bits_to_float(float_to_bits(x) | int32_t(0x80000000u));
}

// exp(hi + lo) for |lo| <= ulp(hi) / 2 (lo: the rounding error of a float
// subtraction, see softmax_exp; absent elsewhere). Cody-Waite reduction by
// ln 2 split in two (the high part has 9 significant bits, so n * hi is exact
// for every n in range), a degree-7 polynomial on |r| <= ln(2)/2 (~1 ulp),
// and the scale 2^n applied as two exact power-of-two factors, so results in
// the subnormal range round once. n = round(x / ln 2) comes from adding
// 1.5 * 2^23 (the sum's low mantissa bits are n): float adds only, no
// conversion instructions (quarter rate on GPUs). The clamp to [-104, 89]
// changes no result: exp(89) overflows to +inf and exp(-104) rounds to 0.
// NaN propagates (the arithmetic on it is discarded by the last select).
template <bool kWithLo>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE float exp_parts(float hi, float lo) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundShift = 12582912.0f;  // 1.5 * 2^23
  float x = hi > 89.0f ? 89.0f : hi;
  x = x < -104.0f ? -104.0f : x;
  const float shifted = add(mul(x, kLog2e), kRoundShift);
  const float nf = sub(shifted, kRoundShift);  // round(x * log2(e)), exactly
  const int32_t n = float_to_bits(shifted) - float_to_bits(kRoundShift);  // in [-150, 129]
  float r = sub(sub(x, mul(nf, kLn2Hi)), mul(nf, kLn2Lo));
  if constexpr (kWithLo) r = add(r, lo);
  // exp(r) = 1 + r + r^2 (1/2 + r (1/6 + ...)): the coefficients of Cephes' expf.
  float p = 1.9875691500e-4f;
  p = add(mul(p, r), 1.3981999507e-3f);
  p = add(mul(p, r), 8.3334519073e-3f);
  p = add(mul(p, r), 4.1665795894e-2f);
  p = add(mul(p, r), 1.6666665459e-1f);
  p = add(mul(p, r), 5.0000001201e-1f);
  p = add(add(mul(mul(p, r), r), r), 1.0f);
  const int32_t n1 = n >> 1;  // both halves are normal exponents
  const int32_t n2 = n - n1;
  const float scale1 = bits_to_float(int32_t(uint32_t(n1 + 127) << 23));
  const float scale2 = bits_to_float(int32_t(uint32_t(n2 + 127) << 23));
  const float result = mul(mul(p, scale1), scale2);
  return is_nan(hi) ? hi : result;
}

JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE float exp(float x) { return exp_parts<false>(x, 0.0f); }

// exp(z - m) with the subtraction's rounding error carried along (Knuth's
// two-sum of z and -m), so a large |z - m| costs no accuracy.
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE float softmax_exp(float z, float m) {
  const float minus_m = sub(0.0f, m);
  const float d = add(z, minus_m);
  const float b_part = sub(d, z);
  const float a_part = sub(d, b_part);
  const float lo = add(sub(z, a_part), sub(minus_m, b_part));
  return exp_parts<true>(d, is_nan(lo) ? 0.0f : lo);
}

// log(1 + t) for t in [0, 1] (t = exp(-|z|)): 2 atanh(u) with |u| <= 0.1716,
// u = t / (2 + t) for t <= sqrt(2) - 1, else log 2 + 2 atanh((t - 1) / (t + 3)).
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE float log1p_unit(float t) {
  const bool high = t > 0.414213562f;
  const float u = div(high ? sub(t, 1.0f) : t, high ? add(t, 3.0f) : add(t, 2.0f));
  const float u2 = mul(u, u);
  float q = 0.181818187f;             // 2/11
  q = add(mul(q, u2), 0.222222224f);  // 2/9
  q = add(mul(q, u2), 0.285714298f);  // 2/7
  q = add(mul(q, u2), 0.400000006f);  // 2/5
  q = add(mul(q, u2), 0.666666687f);  // 2/3
  q = add(mul(q, u2), 2.0f);
  const float series = mul(q, u);
  return high ? add(0.693147182f, series) : series;
}

JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE float sigmoid(float z) {
  return div(1.0f, add(1.0f, exp(sub(0.0f, z))));
}

// sqrt(softplus(z)), softplus = max(z, 0) + log1p(exp(-|z|)).
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE float sqrt_softplus(float z) {
  const float softplus = add(positive_part(z), log1p_unit(exp(negative_abs(z))));
  return is_nan(z) ? z : sqrt(softplus);
}

// NaN-propagating max (the softmax shift): any NaN makes the result NaN.
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE float max_propagating(float a, float b) {
  return (a > b || is_nan(a)) ? a : b;
}

// A float as the ordered key of the total order, every NaN as +NaN (the
// sign of a NaN out of arithmetic is platform-dependent: x86 makes -NaN).
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE uint32_t selection_key(float v) {
  const uint32_t bits = is_nan(v) ? 0x7FC00000u : uint32_t(float_to_bits(v));
  return ordered_key<KeyKind::kFloat>(bits);
}

// A candidate as one integer whose unsigned maximum is the best: eligible
// (not in a dropped group) first, then the larger key, then the lower index.
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE uint64_t pack_candidate(bool eligible, uint32_t key,
                                                                   int32_t index) {
  return (uint64_t(eligible) << 63) | (uint64_t(key) << 31) | uint64_t(0x7FFFFFFF - index);
}
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE int32_t candidate_index(uint64_t packed) {
  return 0x7FFFFFFF - int32_t(packed & 0x7FFFFFFFu);
}

// The canonical sum of 32 partial sums: what a warp's xor butterfly leaves in
// every lane (addition commutes exactly, so lane 0's value is this halving
// tree: v[i] += v[i + offset] for offset 16, 8, 4, 2, 1). When only the first
// `width` (a power of two) partial sums can be nonzero, the levels above
// width / 2 only add +0, which changes no sum of non-negative terms (nor a
// NaN): they are skipped.
JAX_TOPK_HOST_DEVICE inline double butterfly_sum(double (&partial)[kRouteLanes], int width = kRouteLanes) {
  for (int offset = width / 2; offset > 0; offset /= 2) {
    for (int i = 0; i < offset; ++i) partial[i] = add(partial[i], partial[i + offset]);
  }
  return partial[0];
}

// The smallest power of two >= n (n <= 32): the width of butterfly_sum's nonzero lanes.
JAX_TOPK_HOST_DEVICE inline int butterfly_width(int n) {
  int width = 1;
  while (width < n && width < kRouteLanes) width *= 2;
  return width;
}

// A weight from its score: numerator / denominator * scale in float32, the
// denominator being the double sum of the chosen scores (or, for a
// renormalised softmax, of the chosen exp(z - max)) or the softmax normaliser.
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE float weight(float numerator, double denominator, float scale) {
  return mul(div(numerator, float(denominator)), scale);
}

}  // namespace route_math
}  // namespace jax_topk
