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
#include <cstdlib>
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

// A row of logits as float32: float32 rows are read in place, the others are
// converted into `buffer` (count floats).
template <DType D>
JAX_TOPK_FORCE_INLINE const float* logits_as_float(const void* logits, int64_t offset, int32_t count,
                                                   float* buffer) {
  if constexpr (D == DType::float32) {
    return static_cast<const float*>(logits) + offset;
  } else {
    load_logits<D>(logits, offset, count, buffer);
    return buffer;
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

// Rows of at most this many experts are selected in place (select_in_row)
// rather than by the top-k kernel, whose per-row setup would dominate.
constexpr int32_t kSmallRow = 32;

// The k largest keys of a short row, best first (ties: lower index), as ids:
// k rounds of a maximum over the packed candidates below the last round's
// (pack_candidate: distinct, and their order is the selection's), without
// branches (on random keys an insertion's branches are coin flips: the
// whole Mixtral route took 57 ns per token by insertion, 17 now). The row is
// padded to N with packed 0, which no round takes, so that the loops have
// constant trip counts.
template <int N>
JAX_TOPK_FORCE_INLINE void select_in_padded_row(const uint32_t* key, int32_t n, int32_t k, int32_t* ids) {
  uint64_t packed[N];
  for (int32_t i = 0; i < N; ++i) packed[i] = i < n ? rm::pack_candidate(true, key[i], i) : 0;
  uint64_t above = ~uint64_t(0);
  for (int32_t j = 0; j < k; ++j) {
    uint64_t best = 0;
    for (int32_t i = 0; i < N; ++i) best = packed[i] < above && packed[i] > best ? packed[i] : best;
    ids[j] = rm::candidate_index(best);
    above = best;
  }
}

JAX_TOPK_FORCE_INLINE void select_in_row(const uint32_t* key, int32_t n, int32_t k, int32_t* ids) {
  static_assert(kSmallRow == 32, "the pads below cover kSmallRow");
  if (n <= 8) {
    select_in_padded_row<8>(key, n, k, ids);
  } else if (n <= 16) {
    select_in_padded_row<16>(key, n, k, ids);
  } else {
    select_in_padded_row<32>(key, n, k, ids);
  }
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
// expert; short rows in place), then the weights.
//
// Every buffer is written before it is read, so a thread keeps one Block
// across calls and only ever grows it (for_tokens): a fresh one per call
// cost page faults and zero-filling on every call.
struct Block {
  static Block& for_tokens(const RouteConfig& cfg, int64_t tokens) {
    thread_local Block b;
    const auto at_least = [](auto& v, int64_t n) {
      if (int64_t(v.size()) < n) v.resize(n);
    };
    at_least(b.z, cfg.experts), at_least(b.s, cfg.experts), at_least(b.c, cfg.experts);
    at_least(b.key, tokens * cfg.experts), at_least(b.chosen_keys, tokens * cfg.k);
    at_least(b.shift, tokens), at_least(b.softmax_sum, tokens);
    at_least(b.chosen_z, tokens * cfg.k), at_least(b.chosen_shift, tokens * cfg.k);
    at_least(b.numerator, tokens * cfg.k);
    return b;
  }
  std::vector<float> z, s, c;
  std::vector<uint32_t> key, chosen_keys;
  std::vector<float> shift;         // per token: the softmax's max logit
  std::vector<double> softmax_sum;  // per token: the normaliser S, when needed
  // Per chosen expert [token][k]: its logit, its token's softmax shift, its numerator.
  std::vector<float> chosen_z, chosen_shift;
  std::vector<double> numerator;
};

// A softmax route ranking the logits without needing every numerator takes
// its shift, the row's maximum, from its first choice (token_numerator_inputs)
// instead of a pass over the row.
inline bool shift_after_choice(const RouteConfig& cfg) {
  return cfg.score == RouteScore::kSoftmax && !cfg.selects_by_score() && !cfg.needs_softmax_sum();
}

// Phase 1 for one token: its selection keys (routing.h: scores plus bias when
// the selection reads them, else the logits), its softmax shift and sum.
template <DType D>
JAX_TOPK_FORCE_INLINE void token_keys_body(const RouteInputs& in, const RouteConfig& cfg, int64_t token,
                                           int64_t slot, Block& b) {
  const void* logits = in.logits;
  const float* bias = in.bias;
  const int32_t experts = cfg.experts;
  const float* z = logits_as_float<D>(logits, token * experts, experts, b.z.data());
  float* s = b.s.data();
  float* c = b.c.data();
  uint32_t* key = b.key.data() + slot * experts;
  const bool softmax = cfg.score == RouteScore::kSoftmax;
  const uint32_t* given = cfg.normaliser_parts ? in.normaliser + token * normaliser_words(cfg.normaliser_parts)
                                               : nullptr;
  const float m = given                             ? rm::given_shift(given)
                  : softmax && !shift_after_choice(cfg) ? softmax_shift(z, experts)
                                                        : 0.0f;
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
  if (!cfg.selects_by_score()) {  // (a degenerate softmax is settled after the selection)
    for (int32_t i = 0; i < experts; ++i) key[i] = rm::selection_key(z[i]);
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

// Phases 1 and, for rows of at most kSmallRow experts, 2 (their ids) for the
// block's tokens [begin, begin + count).
template <DType D>
struct BlockKeys {
  static JAX_TOPK_FORCE_INLINE void run(const RouteInputs& in, const RouteConfig& cfg, int64_t begin, int64_t count,
                                        Block& b, int32_t* ids) {
    for (int64_t t = 0; t < count; ++t) token_keys_body<D>(in, cfg, begin + t, t, b);
    if (cfg.experts <= kSmallRow) {
      for (int64_t t = 0; t < count; ++t) {
        select_in_row(b.key.data() + t * cfg.experts, cfg.experts, cfg.k, ids + (begin + t) * cfg.k);
      }
    }
  }
};

// Phase 3b: the block's k * count numerators from the chosen logits (and
// their softmax shifts), one flat loop that vectorises across tokens (each
// token's own k exps are a dependent chain too short to hide). They are
// computed by the same functions as the scores the selection saw, so they
// equal them.
struct BlockNumerators {
  static JAX_TOPK_FORCE_INLINE void run(const RouteConfig& cfg, int64_t count, Block& b) {
    const float* z = b.chosen_z.data();
    const float* shift = b.chosen_shift.data();
    double* out = b.numerator.data();
    if (cfg.score == RouteScore::kSoftmax) {
      for (int64_t i = 0; i < count; ++i) out[i] = rm::softmax_exp(z[i], shift[i]);
    } else if (cfg.score == RouteScore::kSigmoid) {
      for (int64_t i = 0; i < count; ++i) out[i] = rm::sigmoid(z[i]);
    } else {
      for (int64_t i = 0; i < count; ++i) out[i] = rm::sqrt_softplus(z[i]);
    }
  }
};

// Phase::run compiled for the baseline ISA and, on x86-64, for AVX2 and
// AVX-512 (8 and 16 floats per vector instead of 4: DeepSeek-V4's
// sqrt(softplus) route took 2.23, 1.49 and 0.89 us per token on one core of
// an AMD EPYC with AVX-512). Only code inlined into an entry is compiled for
// its ISA, so no shared out-of-line code needs it; all run the same IEEE
// operations per element (no FMA: neither ISA implies it, and contraction
// is off), so they give the same bits. route_isa() picks the entry.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(JAX_TOPK_ROUTE_BASELINE_ONLY)
#define JAX_TOPK_ROUTE_X86_ISAS 1
#endif

template <typename Phase, typename Fn = decltype(&Phase::run)>
struct OnIsa;

template <typename Phase, typename... A>
struct OnIsa<Phase, void (*)(A...)> {
  using Fn = void (*)(A...);
  static void baseline(A... a) { Phase::run(a...); }
#if defined(JAX_TOPK_ROUTE_X86_ISAS)
  __attribute__((target("avx2"))) static void avx2(A... a) { Phase::run(a...); }
  __attribute__((target("avx512f"))) static void avx512(A... a) { Phase::run(a...); }
#endif
  // The entry for this CPU; AVX2 at most where 16 lanes do not pay (loops
  // over rows of at most kSmallRow experts: Mixtral's 8 took 70 ns per
  // token against 36).
  static Fn pick(bool avx512_pays) {
#if defined(JAX_TOPK_ROUTE_X86_ISAS)
    const char* isa = route_isa();
    if (!std::strcmp(isa, "avx512") && avx512_pays) return avx512;
    if (!std::strcmp(isa, "avx512") || !std::strcmp(isa, "avx2")) return avx2;  // (AVX-512 CPUs have AVX2)
#else
    (void)avx512_pays;
#endif
    return baseline;
  }
};

// Phase 3a for one token: settles a degenerate softmax and the shift, and
// lays out the chosen logits for BlockNumerators.
template <DType D>
JAX_TOPK_FORCE_INLINE void token_numerator_inputs(const void* logits, const RouteConfig& cfg, int64_t token,
                                                  int64_t slot, Block& b, int32_t* ids) {
  float shift = b.shift[slot];
  if (cfg.score == RouteScore::kSoftmax && !cfg.selects_by_score()) {
    if (shift_after_choice(cfg)) {  // the first choice is the maximum (a NaN ranks first: the shift is NaN)
      load_logits<D>(logits, token * cfg.experts + ids[0], 1, &shift);
      shift = rm::is_nan(shift) ? __builtin_nanf("") : shift;
    }
    // A softmax with a NaN or infinite shift has every score NaN, and NaN
    // scores tie: the k lowest experts are chosen.
    if (!(shift - shift == 0.0f)) {
      for (int32_t j = 0; j < cfg.k; ++j) ids[j] = j;
    }
  }
  for (int32_t j = 0; j < cfg.k; ++j) {
    load_logits<D>(logits, token * cfg.experts + ids[j], 1, &b.chosen_z[slot * cfg.k + j]);
    b.chosen_shift[slot * cfg.k + j] = shift;
  }
}

// Phase 3c for one token: numerator / denominator * scale (routing.h,
// weight()), the denominator being the canonical butterfly of the k
// numerators or the softmax normaliser.
JAX_TOPK_FORCE_INLINE void token_weights(const RouteConfig& cfg, int64_t slot, const Block& b, float* weights) {
  const int32_t width = rm::butterfly_width(cfg.k);
  double lanes[kRouteLanes];
  for (int32_t j = 0; j < width; ++j) lanes[j] = j < cfg.k ? b.numerator[slot * cfg.k + j] : 0.0;
  double denominator = 1.0;
  if (cfg.renormalize) {
    denominator = rm::butterfly_sum(lanes, width);
  } else if (cfg.score == RouteScore::kSoftmax) {
    denominator = b.softmax_sum[slot];
  }
  for (int32_t j = 0; j < cfg.k; ++j) {
    weights[j] = rm::weight(float(b.numerator[slot * cfg.k + j]), denominator, cfg.scale);
  }
}

template <DType D>
void route_all(const RouteInputs& in, float* weights, int32_t* ids, const RouteConfig& cfg, TaskRunner& runner) {
  const void* logits = in.logits;
  // Tasks of at most kTaskLogits logits, at least 4 per thread to balance,
  // and at least 16 tokens to amortise scheduling. A call of at most
  // kTaskLogits logits is one task, on the calling thread: waking a helper
  // cost it more than the helper saved (Mixtral, 4096 tokens of 8 experts,
  // on a 2-core VM: 54 or 125 us with a helper, by the process; 86-90 alone).
  constexpr int64_t kTaskLogits = int64_t(1) << 16;
  const int64_t balanced = (cfg.tokens + 4 * runner.concurrency() - 1) / (4 * runner.concurrency());
  const int64_t per_task = cfg.tokens * cfg.experts <= kTaskLogits
                               ? std::max<int64_t>(1, cfg.tokens)
                               : std::max<int64_t>(16, std::min<int64_t>(kTaskLogits / cfg.experts, balanced));
  const int64_t tasks = (cfg.tokens + per_task - 1) / per_task;
  const auto block_keys = OnIsa<BlockKeys<D>>::pick(cfg.experts > kSmallRow);
  const auto block_numerators = OnIsa<BlockNumerators>::pick(true);
  runner.run(tasks, [&](int64_t task) {
    const IeeeSubnormals ieee;
    const int64_t begin = task * per_task;
    const int64_t count = std::min(cfg.tokens, begin + per_task) - begin;
    Block& b = Block::for_tokens(cfg, count);
    block_keys(in, cfg, begin, count, b, ids);
    if (cfg.experts > kSmallRow) {
      SerialRunner serial;
      topk_rows(DType::uint32, b.key.data(), b.chosen_keys.data(), ids + begin * cfg.k, count, cfg.experts, cfg.k,
                nullptr, serial);
    }
    for (int64_t t = 0; t < count; ++t) {
      token_numerator_inputs<D>(logits, cfg, begin + t, t, b, ids + (begin + t) * cfg.k);
    }
    block_numerators(cfg, count * cfg.k, b);
    for (int64_t t = 0; t < count; ++t) token_weights(cfg, t, b, weights + (begin + t) * cfg.k);
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

const char* route_isa() {
  static const char* const isa = [] {
    const char* cap = std::getenv("JAX_TOPK_ROUTE_ISA");
    const bool below_avx2 = cap && !std::strcmp(cap, "baseline");
    const bool below_avx512 = below_avx2 || (cap && !std::strcmp(cap, "avx2"));
#if defined(JAX_TOPK_ROUTE_X86_ISAS)
    if (!below_avx512 && __builtin_cpu_supports("avx512f")) return "avx512";
    if (!below_avx2 && __builtin_cpu_supports("avx2")) return "avx2";
#else
    (void)below_avx512;
#endif
    return "baseline";
  }();
  return isa;
}

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
