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
// The canonical reduction width of a renormalisation: the k chosen scores
// (lane j holding the j-th) combined by a 32-lane xor butterfly, the order a
// warp computes them in. (The softmax normaliser is summed exactly: ExactSum.)
inline constexpr int32_t kRouteLanes = 32;

// A softmax normaliser given per token instead of computed from the row (a
// route over an expert axis split across devices): the shift (the row's max
// logit, as float bits) and `parts` partial sums (ExactSum words below).
inline constexpr int32_t kExactSumWords = 6;
JAX_TOPK_HOST_DEVICE constexpr int32_t normaliser_words(int32_t parts) { return 1 + kExactSumWords * parts; }

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
  // 0: the softmax shift and normaliser come from the row; P > 0: from the
  // normaliser operand, normaliser_words(P) uint32 per token (only where
  // needs_softmax_sum()).
  int32_t normaliser_parts = 0;

  // The selection reads the float32 scores (else it ranks the logits).
  JAX_TOPK_HOST_DEVICE bool selects_by_score() const { return has_bias || n_groups > 0; }
  // Every score is needed: for the selection, or for the softmax normaliser
  // when the weights are not renormalised (with renormalisation the
  // normaliser cancels: w_i = e_i / sum over the chosen e_j).
  JAX_TOPK_HOST_DEVICE bool needs_softmax_sum() const {
    return score == RouteScore::kSoftmax && (selects_by_score() || !renormalize);
  }
};

// A route's operands (device pointers for the CUDA kernels): the logits
// [tokens, experts] (float32, bfloat16 or float16); the bias, null without
// one, else RouteConfig::bias_token_stride floats apart per token; the
// normaliser words [tokens, normaliser_words(cfg.normaliser_parts)], null
// when the parts are 0.
struct RouteInputs {
  const void* logits = nullptr;
  const float* bias = nullptr;
  const uint32_t* normaliser = nullptr;
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

#if defined(JAX_TOPK_DEVICE_PASS)
JAX_TOPK_DEVICE JAX_TOPK_FORCE_INLINE double bits_to_double(uint64_t i) { return __longlong_as_double(int64_t(i)); }
#else
JAX_TOPK_HOST_DEVICE inline double bits_to_double(uint64_t i) {
  double d;
  std::memcpy(&d, &i, sizeof d);
  return d;
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
// (Any power-of-two array of partial sums: a kernel holding kList numerators
// sums them the same way.)
template <int N>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE double butterfly_sum(double (&partial)[N], int width = N) {
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

// The softmax normaliser summed exactly. Every term exp(z - max) is a float32
// in [0, 1] (or NaN): an integer multiple of 2^-149 below 2^150. The sum is
// kept as that integer (three 64-bit limbs, room for 2^40 terms of up to 2)
// and rounded to double once, to nearest even. Integer addition is
// associative, so the result does not depend on the order of the additions:
// a warp adds its lanes in any order, the CPU adds experts in turn, and a row
// whose experts are split over devices adds the devices' partial sums, all
// with the same bits (DESIGN section 5; the rounded sum is also the most
// accurate double there is). A NaN term makes the sum NaN.
struct ExactSum {
  uint64_t limb[3] = {0, 0, 0};  // least significant first, in units of 2^-149
  bool nan = false;

  // Adds a term in [0, 2) (the magnitude of e is taken; an infinity or NaN
  // makes the sum NaN).
  JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void add(float e) {
    const uint32_t bits = uint32_t(float_to_bits(e)) & 0x7FFFFFFFu;
    const uint32_t exponent = bits >> 23;
    nan |= exponent == 0xFFu;
    // value = mantissa * 2^(exponent - 150) = (mantissa << shift) * 2^-149;
    // a subnormal is its mantissa bits times 2^-149.
    const uint64_t mantissa = exponent ? (bits & 0x7FFFFFu) | 0x800000u : bits;
    uint32_t shift = exponent ? exponent - 1 : 0;
    shift = shift > 127 ? 127 : shift;  // only above 2 (or NaN): keeps the limb index in range
    const uint32_t r = shift & 63u;
    const uint64_t low = mantissa << r;
    const uint64_t high = r ? mantissa >> (64 - r) : 0;
    const bool upper = shift >= 64;
    add_limbs(upper ? 0 : low, upper ? low : high, upper ? high : 0);
  }

  JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void add(const ExactSum& other) {
    add_limbs(other.limb[0], other.limb[1], other.limb[2]);
    nan |= other.nan;
  }

  JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void add_limbs(uint64_t a0, uint64_t a1, uint64_t a2) {
    const uint64_t s0 = limb[0] + a0;
    const uint64_t carry0 = s0 < a0;
    const uint64_t t1 = limb[1] + a1;
    const uint64_t s1 = t1 + carry0;
    const uint64_t carry1 = uint64_t(t1 < a1) | uint64_t(s1 < t1);
    limb[0] = s0;
    limb[1] = s1;
    limb[2] = limb[2] + a2 + carry1;
  }

  // The sum rounded to the nearest double (ties to even).
  JAX_TOPK_HOST_DEVICE inline double to_double() const {
    if (nan) return bits_to_double(0x7FF8000000000000ull);
    const int top = limb[2] ? 128 + highest_bit(limb[2]) : limb[1] ? 64 + highest_bit(limb[1])
                                                                  : limb[0] ? highest_bit(limb[0]) : -1;
    if (top < 53) return mul(double(limb[0]), power_of_two(-149));  // exact (0 included)
    const int low = top - 52;  // the lowest of the 53 bits kept
    uint64_t mantissa = bits_from(low) & ((uint64_t(1) << 53) - 1);
    const bool half = (bits_from(low - 1) & 1u) != 0;
    const bool sticky = below(low - 1);
    mantissa += uint64_t(half && (sticky || (mantissa & 1u)));  // 2^53 when it carries: still exact
    return mul(double(mantissa), power_of_two(low - 149));
  }

  // As kExactSumWords 32-bit words (the NaN flag in the top bit, which no
  // sum of fewer than 2^40 terms reaches), and back.
  JAX_TOPK_HOST_DEVICE inline void to_words(uint32_t* out) const {
    for (int i = 0; i < 3; ++i) {
      const uint64_t l = i == 2 && nan ? limb[i] | (uint64_t(1) << 63) : limb[i];
      out[2 * i] = uint32_t(l);
      out[2 * i + 1] = uint32_t(l >> 32);
    }
  }
  JAX_TOPK_HOST_DEVICE static inline ExactSum from_words(const uint32_t* in) {
    ExactSum s;
    for (int i = 0; i < 3; ++i) s.limb[i] = uint64_t(in[2 * i]) | (uint64_t(in[2 * i + 1]) << 32);
    s.nan = (s.limb[2] >> 63) != 0;
    s.limb[2] &= ~(uint64_t(1) << 63);
    return s;
  }

 private:
  // Index of the highest set bit of v != 0 (no intrinsics: runs once per token).
  JAX_TOPK_HOST_DEVICE static inline int highest_bit(uint64_t v) {
    int bit = 0;
    for (int step = 32; step > 0; step /= 2) {
      const bool above = (v >> step) != 0;
      bit += above ? step : 0;
      v = above ? v >> step : v;
    }
    return bit;
  }
  JAX_TOPK_HOST_DEVICE inline uint64_t limb_at(int i) const {
    return i == 0 ? limb[0] : i == 1 ? limb[1] : i == 2 ? limb[2] : 0;
  }
  // The 64 bits of the sum starting at bit p >= 0.
  JAX_TOPK_HOST_DEVICE inline uint64_t bits_from(int p) const {
    const int q = p >> 6, r = p & 63;
    return (limb_at(q) >> r) | (r ? limb_at(q + 1) << (64 - r) : 0);
  }
  // Whether any bit below bit p is set.
  JAX_TOPK_HOST_DEVICE inline bool below(int p) const {
    bool any = false;
    for (int i = 0; i < 3; ++i) {
      const int bits = p - 64 * i;  // how many of this limb's bits lie below p
      const uint64_t mask = bits >= 64 ? ~uint64_t(0) : bits <= 0 ? 0 : (uint64_t(1) << bits) - 1;
      any |= (limb[i] & mask) != 0;
    }
    return any;
  }
  JAX_TOPK_HOST_DEVICE static inline double power_of_two(int p) {  // -1022 <= p <= 1023
    return bits_to_double(uint64_t(p + 1023) << 52);
  }
};

// A token's softmax shift and normaliser from its normaliser words
// (RouteConfig::normaliser_parts): the shift's float bits, then the partial
// sums, added exactly.
JAX_TOPK_HOST_DEVICE inline float given_shift(const uint32_t* words) { return bits_to_float(int32_t(words[0])); }
JAX_TOPK_HOST_DEVICE inline double given_normaliser(const uint32_t* words, int32_t parts) {
  ExactSum sum;
  for (int32_t p = 0; p < parts; ++p) sum.add(ExactSum::from_words(words + normaliser_words(p)));
  return sum.to_double();
}

// A weight from its score: numerator / denominator * scale in float32, the
// denominator being the double sum of the chosen scores (or, for a
// renormalised softmax, of the chosen exp(z - max)) or the softmax normaliser.
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE float weight(float numerator, double denominator, float scale) {
  return mul(div(numerator, float(denominator)), scale);
}

}  // namespace route_math
}  // namespace jax_topk
