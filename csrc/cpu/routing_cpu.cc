// CPU fused MoE routing. Per block of tokens: load each token's logits once
// into float32, score them with the shared IEEE-only math of jax_topk/routing.h
// (vectorised loops over experts) into selection keys; select with the
// library's CPU top-k kernel over the keys (by insertion for rows of at most
// 32 experts); write k weights and ids. The softmax normaliser is summed
// exactly (route_math::ExactSum) and renormalisations in the canonical 32-lane
// order, so the CUDA kernel's results are the same bits.

#include "cpu/routing_cpu.h"

#include "cpu/topk_cpu.h"

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace jax_topk::cpu {
namespace {

namespace rm = route_math;

// XLA runs CPU kernels with subnormals flushed to zero (FTZ and DAZ in x86's
// MXCSR, FZ in AArch64's FPCR). The routing scores are IEEE arithmetic with
// subnormals, as the GPU computes them: sqrt(softplus(-100)) is 1.9e-22, not
// 0 (exp(-100) is subnormal), and under the flush a row of such scores would
// tie at 0 and select differently from the GPU. Each task restores IEEE behaviour
// while it runs and puts the caller's mode back.
class IeeeSubnormals {
 public:
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
  IeeeSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~(kFlushToZero | kDenormalsAreZero)); }
  ~IeeeSubnormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFlushToZero = 1u << 15, kDenormalsAreZero = 1u << 6;
  unsigned saved_;
#elif defined(__aarch64__)
  IeeeSubnormals() {
    asm volatile("mrs %0, fpcr" : "=r"(saved_));
    asm volatile("msr fpcr, %0" : : "r"(saved_ & ~kFlushToZero));
  }
  ~IeeeSubnormals() { asm volatile("msr fpcr, %0" : : "r"(saved_)); }

 private:
  static constexpr uint64_t kFlushToZero = uint64_t(1) << 24;
  uint64_t saved_;
#else
  IeeeSubnormals() = default;  // (other hosts: left as the caller has it)
#endif
 public:
  IeeeSubnormals(const IeeeSubnormals&) = delete;
  IeeeSubnormals& operator=(const IeeeSubnormals&) = delete;
};

// Exact float32 value of a float16 (binary16) element.
inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {
    const float magnitude = float(mantissa) * 5.9604644775390625e-8f;  // mantissa * 2^-24, exact
    std::memcpy(&bits, &magnitude, sizeof bits);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <DType D>
JAX_TOPK_FORCE_INLINE void load_logits(const void* logits, int64_t offset, int32_t count, float* z) {
  if constexpr (D == DType::float32) {
    std::memcpy(z, static_cast<const float*>(logits) + offset, sizeof(float) * count);
  } else if constexpr (D == DType::bfloat16) {
    const uint16_t* x = static_cast<const uint16_t*>(logits) + offset;
    for (int32_t i = 0; i < count; ++i) {
      const uint32_t bits = uint32_t(x[i]) << 16;
      std::memcpy(z + i, &bits, sizeof bits);
    }
  } else {
    const uint16_t* x = static_cast<const uint16_t*>(logits) + offset;
    for (int32_t i = 0; i < count; ++i) z[i] = half_bits_to_float(x[i]);
  }
}

// Keeps the `k` largest candidates (packed, see pack_candidate), largest first.
class BestK {
 public:
  BestK(uint64_t* slots, int32_t k) : slots_(slots), k_(k) {}
  void offer(uint64_t c) {
    if (filled_ == k_ && c <= slots_[k_ - 1]) return;
    int32_t j = filled_ < k_ ? filled_++ : k_ - 1;
    for (; j > 0 && slots_[j - 1] < c; --j) slots_[j] = slots_[j - 1];
    slots_[j] = c;
  }

 private:
  uint64_t* slots_;
  int32_t k_;
  int32_t filled_ = 0;
};

// Rows of at most this many experts are selected by insertion (BestK) rather
// than by the top-k kernel, whose per-row setup would dominate.
constexpr int32_t kSmallRow = 32;

// The k largest keys of a short row, best first (ties: lower index), as ids.
void select_in_row(const uint32_t* key, int32_t n, int32_t k, int32_t* ids) {
  uint64_t best[kRouteMaxK];
  BestK top(best, k);
  for (int32_t i = 0; i < n; ++i) top.offer(rm::pack_candidate(true, key[i], i));
  for (int32_t j = 0; j < k; ++j) ids[j] = rm::candidate_index(best[j]);
}

// The softmax shift: max of z[0..n), NaN if any is NaN. Vectorised as a
// signed-integer max of the float bits with the negative floats' magnitude
// bits flipped (an order-preserving map for non-NaN floats). Which NaN, and
// which zero of -0/+0, comes out does not matter: the shift enters only as
// 0 - m, and a NaN shift makes every score NaN.
JAX_TOPK_FORCE_INLINE float softmax_shift(const float* z, int32_t n) {
  int32_t best = INT32_MIN, nan = 0;
  for (int32_t i = 0; i < n; ++i) {
    int32_t bits;
    std::memcpy(&bits, z + i, sizeof bits);
    const int32_t key = bits ^ ((bits >> 31) & 0x7FFFFFFF);
    best = key > best ? key : best;
    nan |= int32_t(z[i] != z[i]);
  }
  const int32_t bits = best ^ ((best >> 31) & 0x7FFFFFFF);
  float m;
  std::memcpy(&m, &bits, sizeof m);
  return nan ? __builtin_nanf("") : m;
}

// Sets the key of every expert outside the top_groups best groups to 0,
// below every real key (NaNs are +NaN, so no real key is 0); k <= the kept
// experts, so none of them is chosen. A group's score is its best c plus its
// second best (ties: lower expert); ties between groups: lower group.
void drop_groups(const RouteConfig& cfg, const float* c, uint32_t* key) {
  const int32_t per_group = cfg.experts / cfg.n_groups;
  uint64_t best_groups[kRouteMaxExperts];
  BestK groups(best_groups, cfg.top_groups);
  for (int32_t g = 0; g < cfg.n_groups; ++g) {
    // The two best keys of the group, branch-free (strict >: the lower index
    // wins ties). Keys are > 0, so 0 means "none yet".
    const int32_t begin = g * per_group;
    uint32_t key1 = 0, key2 = 0;
    int32_t first = begin, second = begin;
    for (int32_t i = begin; i < begin + per_group; ++i) {
      const uint32_t k = key[i];
      const bool above1 = k > key1, above2 = k > key2;
      second = above1 ? first : (above2 ? i : second);
      key2 = above1 ? key1 : (above2 ? k : key2);
      first = above1 ? i : first;
      key1 = above1 ? k : key1;
    }
    const float score = per_group == 1 ? c[first] : rm::add(c[first], c[second]);
    groups.offer(rm::pack_candidate(true, rm::selection_key(score), g));
  }
  bool kept[kRouteMaxExperts] = {};
  for (int32_t j = 0; j < cfg.top_groups; ++j) kept[rm::candidate_index(best_groups[j])] = true;
  for (int32_t g = 0; g < cfg.n_groups; ++g) {
    if (!kept[g]) std::fill(key + g * per_group, key + (g + 1) * per_group, 0u);
  }
}

// A block of tokens: keys for all of them, one call of the CPU top-k kernel
// over the keys (the unsigned order is the selection order, ties to the lower
// expert; short rows by insertion), then the weights.
struct Block {
  explicit Block(const RouteConfig& cfg, int64_t tokens)
      : z(cfg.experts), s(cfg.experts), c(cfg.experts), key(tokens * cfg.experts),
        chosen_keys(tokens * cfg.k), shift(tokens), softmax_sum(tokens) {}
  std::vector<float> z, s, c;
  std::vector<uint32_t> key, chosen_keys;
  std::vector<float> shift;         // per token: the softmax's max logit
  std::vector<double> softmax_sum;  // per token: the normaliser S, when needed
};

// Phase 1 for one token: its selection keys (routing.h: scores plus bias when
// the selection reads them, else the logits), its softmax shift and sum.
template <DType D>
JAX_TOPK_FORCE_INLINE void token_keys_body(const RouteInputs& in, const RouteConfig& cfg, int64_t token,
                                           int64_t slot, Block& b) {
  const void* logits = in.logits;
  const float* bias = in.bias;
  const int32_t experts = cfg.experts;
  float* z = b.z.data();
  float* s = b.s.data();
  float* c = b.c.data();
  uint32_t* key = b.key.data() + slot * experts;
  load_logits<D>(logits, token * experts, experts, z);
  const bool softmax = cfg.score == RouteScore::kSoftmax;
  const uint32_t* given = cfg.normaliser_parts ? in.normaliser + token * normaliser_words(cfg.normaliser_parts)
                                               : nullptr;
  const float m = given ? rm::given_shift(given) : softmax ? softmax_shift(z, experts) : 0.0f;
  b.shift[slot] = m;
  if (cfg.needs_softmax_sum()) {
    for (int32_t i = 0; i < experts; ++i) s[i] = rm::softmax_exp(z[i], m);  // numerators e_i
    if (given) {
      b.softmax_sum[slot] = rm::given_normaliser(given, cfg.normaliser_parts);
    } else {
      rm::ExactSum sum;
      for (int32_t i = 0; i < experts; ++i) sum.add(s[i]);
      b.softmax_sum[slot] = sum.to_double();
    }
  }
  if (!cfg.selects_by_score()) {
    const bool degenerate = softmax && !(m - m == 0.0f);  // m is NaN or +-inf: every score is NaN
    for (int32_t i = 0; i < experts; ++i) key[i] = rm::selection_key(degenerate ? m - m : z[i]);
    return;
  }
  if (softmax) {
    const double sum = b.softmax_sum[slot];
    for (int32_t i = 0; i < experts; ++i) s[i] = float(rm::div(double(s[i]), sum));
  } else if (cfg.score == RouteScore::kSigmoid) {
    for (int32_t i = 0; i < experts; ++i) s[i] = rm::sigmoid(z[i]);
  } else {
    for (int32_t i = 0; i < experts; ++i) s[i] = rm::sqrt_softplus(z[i]);
  }
  if (bias) {
    const float* bt = bias + token * cfg.bias_token_stride;
    for (int32_t i = 0; i < experts; ++i) c[i] = rm::add(s[i], bt[i]);
  } else {
    std::memcpy(c, s, sizeof(float) * experts);
  }
  for (int32_t i = 0; i < experts; ++i) key[i] = rm::selection_key(c[i]);
  if (cfg.n_groups > 0) drop_groups(cfg, c, key);
}

// token_keys_body compiled twice: for the baseline ISA and, on x86-64, for
// AVX2 (8 floats per vector instead of 4: 1.75x on sqrt(softplus) scores).
// Only code inlined into the AVX2 entry is compiled for AVX2, so no shared
// out-of-line code needs it; both run the same IEEE operations per element
// (no FMA: AVX2 does not imply it, and contraction is off), so they give the
// same bits.
using TokenKeysFn = void (*)(const RouteInputs&, const RouteConfig&, int64_t, int64_t, Block&);

template <DType D>
void token_keys_baseline(const RouteInputs& in, const RouteConfig& cfg, int64_t token, int64_t slot, Block& b) {
  token_keys_body<D>(in, cfg, token, slot, b);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(JAX_TOPK_ROUTE_NO_AVX2)
#define JAX_TOPK_ROUTE_AVX2 1
template <DType D>
__attribute__((target("avx2"))) void token_keys_avx2(const RouteInputs& in, const RouteConfig& cfg, int64_t token,
                                                     int64_t slot, Block& b) {
  token_keys_body<D>(in, cfg, token, slot, b);
}
#endif

template <DType D>
TokenKeysFn token_keys_for_this_cpu() {
#if defined(JAX_TOPK_ROUTE_AVX2)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return token_keys_avx2<D>;
#endif
  return token_keys_baseline<D>;
}

// Phase 3 for one token: numerator / denominator * scale (routing.h,
// weight()); the numerators are recomputed from the chosen logits with the
// same functions, so they equal the values the selection saw.
template <DType D>
void token_weights(const void* logits, const RouteConfig& cfg, int64_t token, int64_t slot, const Block& b,
                   float* weights, const int32_t* ids) {
  const bool softmax = cfg.score == RouteScore::kSoftmax;
  double lanes[kRouteLanes] = {};
  for (int32_t j = 0; j < cfg.k; ++j) {
    float z;
    load_logits<D>(logits, token * cfg.experts + ids[j], 1, &z);
    lanes[j] = softmax ? rm::softmax_exp(z, b.shift[slot])
               : cfg.score == RouteScore::kSigmoid ? rm::sigmoid(z)
                                                    : rm::sqrt_softplus(z);
  }
  float numerator[kRouteMaxK];
  for (int32_t j = 0; j < cfg.k; ++j) numerator[j] = float(lanes[j]);
  double denominator = 1.0;
  if (cfg.renormalize) {
    denominator = rm::butterfly_sum(lanes, rm::butterfly_width(cfg.k));
  } else if (softmax) {
    denominator = b.softmax_sum[slot];
  }
  for (int32_t j = 0; j < cfg.k; ++j) weights[j] = rm::weight(numerator[j], denominator, cfg.scale);
}

template <DType D>
void route_all(const RouteInputs& in, float* weights, int32_t* ids, const RouteConfig& cfg, TaskRunner& runner) {
  const void* logits = in.logits;
  // Tasks of at most ~64k logits, at least 4 per thread to balance, and at
  // least 16 tokens to amortise scheduling.
  const int64_t balanced = (cfg.tokens + 4 * runner.concurrency() - 1) / (4 * runner.concurrency());
  const int64_t per_task = std::max<int64_t>(16, std::min<int64_t>((int64_t(1) << 16) / cfg.experts, balanced));
  const int64_t tasks = (cfg.tokens + per_task - 1) / per_task;
  const TokenKeysFn token_keys = token_keys_for_this_cpu<D>();
  runner.run(tasks, [&](int64_t task) {
    const IeeeSubnormals ieee;
    const int64_t begin = task * per_task;
    const int64_t count = std::min(cfg.tokens, begin + per_task) - begin;
    Block b(cfg, count);
    if (cfg.experts <= kSmallRow) {  // too short to gain from wider vectors: no indirect call
      for (int64_t t = 0; t < count; ++t) token_keys_body<D>(in, cfg, begin + t, t, b);
    } else {
      for (int64_t t = 0; t < count; ++t) token_keys(in, cfg, begin + t, t, b);
    }
    if (cfg.experts <= kSmallRow) {  // per-row setup of the top-k kernel would dominate
      for (int64_t t = 0; t < count; ++t) {
        select_in_row(b.key.data() + t * cfg.experts, cfg.experts, cfg.k, ids + (begin + t) * cfg.k);
      }
    } else {
      SerialRunner serial;
      topk_rows(DType::uint32, b.key.data(), b.chosen_keys.data(), ids + begin * cfg.k, count, cfg.experts, cfg.k,
                nullptr, serial);
    }
    for (int64_t t = 0; t < count; ++t) {
      token_weights<D>(logits, cfg, begin + t, t, b, weights + (begin + t) * cfg.k, ids + (begin + t) * cfg.k);
    }
  });
}

template <DType D>
void partial_sums_all(const void* logits, const float* shift, uint32_t* sums, int64_t tokens, int32_t experts,
                      TaskRunner& runner) {
  const int64_t per_task = std::max<int64_t>(16, (int64_t(1) << 16) / experts);
  runner.run((tokens + per_task - 1) / per_task, [&](int64_t task) {
    const IeeeSubnormals ieee;
    std::vector<float> z(experts);
    for (int64_t t = task * per_task; t < std::min(tokens, (task + 1) * per_task); ++t) {
      load_logits<D>(logits, t * experts, experts, z.data());
      rm::ExactSum sum;
      for (int32_t i = 0; i < experts; ++i) sum.add(rm::softmax_exp(z[i], shift[t]));
      sum.to_words(sums + t * kExactSumWords);
    }
  });
}

}  // namespace

bool softmax_partial_sums(DType dtype, const void* logits, const float* shift, uint32_t* sums, int64_t tokens,
                          int32_t experts, TaskRunner& runner) {
  switch (dtype) {
#define JAX_TOPK_PARTIAL_CASE(name)                                                  \
  case DType::name:                                                                  \
    partial_sums_all<DType::name>(logits, shift, sums, tokens, experts, runner);     \
    return true;
    JAX_TOPK_FOR_EACH_ROUTE_DTYPE(JAX_TOPK_PARTIAL_CASE)
#undef JAX_TOPK_PARTIAL_CASE
    default:
      return false;
  }
}

bool route_tokens(DType dtype, const RouteInputs& in, float* weights, int32_t* ids, const RouteConfig& cfg,
                  TaskRunner& runner) {
  switch (dtype) {
#define JAX_TOPK_ROUTE_CASE(name)                            \
  case DType::name:                                          \
    route_all<DType::name>(in, weights, ids, cfg, runner);   \
    return true;
    JAX_TOPK_FOR_EACH_ROUTE_DTYPE(JAX_TOPK_ROUTE_CASE)
#undef JAX_TOPK_ROUTE_CASE
    default:
      return false;
  }
}

}  // namespace jax_topk::cpu
