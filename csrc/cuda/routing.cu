// CUDA fused MoE routing: one warp per token. Lane l holds experts l, l + 32,
// l + 64, ... in registers (coalesced loads, any expert count), scores them
// with the IEEE-only math of jax_topk/routing.h, and the warp picks the k
// best (a threshold, then a rank of the few candidates). Sigmoid and
// sqrt(softplus) routes that select by score bound every score with the
// hardware's approximations first and score exactly only the experts that
// can be chosen (route_token_by_bounds). Groups of 32 experts
// (one slot each) are ranked by warp reductions, others in shared memory.
// Routes that rank the logits themselves take top_k's warp-select kernel
// instead (RouteByLogitsOutput).
// The softmax normaliser is summed exactly (route_math::ExactSum: any order
// gives the same bits) and renormalisations in the canonical order (xor
// butterfly) that cpu/routing_cpu.cc emulates, so both produce the same bits.

#include <algorithm>

#include "cuda/dependent_launch.cuh"
#include "cuda/device_info.h"
#include "cuda/route_bounds.cuh"
#include "cuda/routing_cuda.h"
#include "cuda/topk_warp_select.cuh"

namespace jax_topk::cuda {
namespace {

namespace rm = route_math;

constexpr int kLanes = kRouteLanes;
constexpr int kWarpsPerBlock = 4;

// A logit of dtype D as float32 (exact), from its bits.
template <DType D>
__device__ __forceinline__ float logit_from_bits(typename DTypeTraits<D>::Bits bits) {
  if constexpr (D == DType::float32) {
    return __uint_as_float(bits);
  } else if constexpr (D == DType::bfloat16) {
    return __uint_as_float(uint32_t(bits) << 16);
  } else {
    return half_bits_to_float(bits);
  }
}

template <DType D>
__device__ __forceinline__ float load_logit(const void* logits, int64_t i) {
  return logit_from_bits<D>(__ldg(static_cast<const typename DTypeTraits<D>::Bits*>(logits) + i));
}

__device__ __forceinline__ uint64_t warp_max(uint64_t v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    const uint64_t other = warp_shfl_xor(v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// Reductions over segments of kWidth lanes (a token's lanes; the whole warp
// when kWidth == 32).
template <int kWidth>
__device__ __forceinline__ float segment_max_propagating(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) {
    v = rm::max_propagating(v, warp_shfl_xor(v, offset, kWidth));
  }
  return v;
}

// The exact sum of the segment's lanes' sums (integer limbs: any order is exact).
template <int kWidth>
__device__ __forceinline__ rm::ExactSum segment_exact_sum(rm::ExactSum v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) {
    rm::ExactSum other;
#pragma unroll
    for (int i = 0; i < 3; ++i) other.limb[i] = warp_shfl_xor(v.limb[i], offset, kWidth);
    other.nan = warp_shfl_xor(int(v.nan), offset, kWidth) != 0;
    v.add(other);
  }
  return v;
}

// The segment's exact sum rounded to double. Not inlined: its limbs and
// rounding, inlined with the given normaliser's loop below, raised the
// register count of every route kernel, those that never sum a softmax
// included (DeepSeek-V4's 12-slot kernel: 79 -> 90 registers, 49.4 -> 55.7 us
// on an H200; 80 and 48.9 us this way).
template <int kWidth>
__device__ __noinline__ double segment_exact_total(rm::ExactSum v) {
  return segment_exact_sum<kWidth>(v).to_double();
}

// A token's given normaliser (past the last token: 1). Not inlined, likewise.
__device__ __noinline__ double given_normaliser_of(const RouteInputs& in, const RouteConfig& cfg, int64_t token,
                                                   bool active) {
  return active ? rm::given_normaliser(in.normaliser + token * normaliser_words(cfg.normaliser_parts),
                                       cfg.normaliser_parts)
                : 1.0;
}

// The canonical butterfly of rm::butterfly_sum, with shuffles. A segment of
// kWidth < 32 lanes gives the same value as the 32-lane butterfly whenever
// the lanes outside it would hold zeros (true here: at most kWidth experts
// and k <= kWidth): the levels above kWidth / 2 would only add +0.
template <int kWidth>
__device__ __forceinline__ double segment_sum(double v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) v = rm::add(v, warp_shfl_xor(v, offset, kWidth));
  return v;
}

__device__ __forceinline__ float score_of(RouteScore score, float z) {
  return score == RouteScore::kSigmoid ? rm::sigmoid(z) : rm::sqrt_softplus(z);
}

// Exclusive prefix sum of `v` over the warp; `total` receives the sum.
__device__ __forceinline__ int warp_exclusive_sum(int v, int lane, int* total) {
  int inclusive = v;
#pragma unroll
  for (int offset = 1; offset < kLanes; offset *= 2) {
    const int other = warp_shfl_up(inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  *total = warp_shfl(inclusive, kLanes - 1);
  return inclusive - v;
}

// A bound T for the k best of the warp's candidates, given each lane's best
// (0: none): at least k lanes' bests are >= T, so every one of the k best is
// >= T, and only those need ranking. T is the k-th largest lane best rounded
// down to its high 32 bits, found by repeated warp maxima of the high words
// (one hardware reduction each) until k lanes are at or above it. Needs at
// least k lanes with a candidate.
__device__ __forceinline__ uint64_t kth_lane_best_bound(uint64_t lane_best, int k) {
  const uint32_t high = uint32_t(lane_best >> 32);
  uint32_t below = 0xFFFFFFFFu;  // consider lanes whose high word is <= below
  for (;;) {
    const uint32_t m = warp_reduce_max(high <= below ? high : 0u);
    if (m == 0 || __popc(warp_ballot(high >= m)) >= k) return uint64_t(m) << 32;
    below = m - 1;
  }
}

// Whether each group is one slot: 32 experts, expert s * 32 + lane in group s
// (DeepSeek-V3: 8 groups of 32). A group's best two are then two warp
// reductions over registers (group_scores_in_registers), and the warp needs no
// shared group arrays.
__host__ __device__ inline bool groups_are_slots(const RouteConfig& cfg) {
  return cfg.n_groups > 0 && cfg.experts == cfg.n_groups * kLanes;
}

// Whether route_tokens_kernel<..., kGroupsAreSlots> ranks groups in shared
// memory (mark_kept_groups): the launcher gives groups that are slots the
// kernel that ranks them in registers.
template <bool kGroupsAreSlots>
__host__ __device__ inline bool groups_in_shared(const RouteConfig& cfg) {
  return cfg.n_groups > 0 && !kGroupsAreSlots;
}

// Per-warp shared memory. Candidates of the selection (packed, with the value
// their weight needs), the chosen numerators by output rank, and for groups
// ranked in shared memory the token's c and keys and each expert's "in a kept
// group" flag.
constexpr int kCandidateCapacity = 128;

struct WarpShared {
  uint64_t* candidate;   // [kCandidateCapacity]
  float* candidate_value;  // [kCandidateCapacity]
  int32_t* chosen_id;    // [kRouteMaxK]
  float* chosen_value;   // [kRouteMaxK]
  float* c;              // [experts]       (groups only)
  uint32_t* key;         // [experts]       (groups only)
  uint64_t* group;       // [n_groups]      (groups only)
  uint8_t* kept;         // [experts]       (groups only)
};

// `shared_groups`: the kernel's groups_in_shared().
__host__ __device__ inline size_t warp_shared_bytes(const RouteConfig& cfg, bool shared_groups) {
  size_t bytes = kCandidateCapacity * (sizeof(uint64_t) + sizeof(float)) + kRouteMaxK * (sizeof(int32_t) + sizeof(float));
  if (shared_groups) {
    bytes += size_t(cfg.n_groups) * sizeof(uint64_t) + size_t(cfg.experts) * (sizeof(float) + sizeof(uint32_t) + 1);
  }
  return (bytes + 15) / 16 * 16;
}

__device__ inline WarpShared carve_warp_shared(unsigned char* base, const RouteConfig& cfg, bool shared_groups) {
  WarpShared w;
  w.candidate = reinterpret_cast<uint64_t*>(base);
  w.group = w.candidate + kCandidateCapacity;
  w.candidate_value = reinterpret_cast<float*>(w.group + (shared_groups ? cfg.n_groups : 0));
  w.chosen_value = w.candidate_value + kCandidateCapacity;
  w.c = w.chosen_value + kRouteMaxK;
  w.chosen_id = reinterpret_cast<int32_t*>(w.c + (shared_groups ? cfg.experts : 0));
  w.key = reinterpret_cast<uint32_t*>(w.chosen_id + kRouteMaxK);
  w.kept = reinterpret_cast<uint8_t*>(w.key + (shared_groups ? cfg.experts : 0));
  return w;
}

// Groups: marks each expert kept or not in sh.kept (sh.c and sh.key hold the
// token's c and selection keys). A group's score is its best c plus its second
// best (ties: lower expert); the top_groups best groups (ties: lower group)
// are kept. Each group is scanned by `lanes_per_group` lanes whose partial
// top-2 are merged by shuffles.
__device__ void mark_kept_groups(const RouteConfig& cfg, const WarpShared& sh, int lane) {
  const int per_group = cfg.experts / cfg.n_groups;
  int lanes_per_group = 1;
  while (lanes_per_group * 2 * cfg.n_groups <= kLanes) lanes_per_group *= 2;
  const int sub = lane % lanes_per_group;
  for (int g0 = 0; g0 < cfg.n_groups; g0 += kLanes / lanes_per_group) {
    const int g = g0 + lane / lanes_per_group;
    uint64_t first = 0, second = 0;
    if (g < cfg.n_groups) {
      for (int i = g * per_group + sub; i < (g + 1) * per_group; i += lanes_per_group) {
        const uint64_t cand = rm::pack_candidate(true, sh.key[i], i);
        second = cand > first ? first : (cand > second ? cand : second);
        first = cand > first ? cand : first;
      }
    }
    for (int offset = lanes_per_group / 2; offset > 0; offset /= 2) {  // merge pairs of top-2
      const uint64_t other_first = warp_shfl_xor(first, offset);
      const uint64_t other_second = warp_shfl_xor(second, offset);
      const uint64_t low_first = other_first > first ? first : other_first;
      const uint64_t next_second = other_first > first ? (other_second > first ? other_second : first)
                                                        : (second > other_first ? second : other_first);
      first = other_first > first ? other_first : first;
      second = low_first > next_second ? low_first : next_second;
    }
    if (g < cfg.n_groups && sub == 0) {
      float score = sh.c[rm::candidate_index(first)];
      if (per_group > 1) score = rm::add(score, sh.c[rm::candidate_index(second)]);
      sh.group[g] = rm::pack_candidate(true, rm::selection_key(score), g);
    }
  }
  warp_sync();
  // A group is kept when fewer than top_groups groups beat it; its lanes
  // then flag its experts.
  for (int g0 = 0; g0 < cfg.n_groups; g0 += kLanes / lanes_per_group) {
    const int g = g0 + lane / lanes_per_group;
    if (g < cfg.n_groups) {
      const uint64_t mine = sh.group[g];
      int rank = 0;
      for (int j = 0; j < cfg.n_groups; ++j) rank += sh.group[j] > mine;
      const uint8_t kept = rank < cfg.top_groups;
      for (int i = g * per_group + sub; i < (g + 1) * per_group; i += lanes_per_group) sh.kept[i] = kept;
    }
  }
  warp_sync();
}

// mark_kept_groups for groups that are slots, in registers, in two steps:
// group_scores_in_registers gives lane g group g's score, top_groups_of the
// kept groups (bit s set: group s, slot s, is kept). key and c are the lane's
// experts' selection keys and c values (expert s * 32 + lane is in group s).
// The same rule: a group's score is its best c plus its second best (ties:
// the lower expert, which is the lower lane), and the top_groups best groups
// are kept (ties: the lower group).
template <int kSlots>
__device__ __forceinline__ float group_scores_in_registers(const RouteConfig& cfg, const uint32_t (&key)[kSlots],
                                                           const float (&c)[kSlots], int lane) {
  float mine = 0.0f;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if (s < cfg.n_groups) {  // (the same in every lane)
      const uint32_t best = warp_reduce_max(key[s]);
      const int winner = __ffs(int(warp_ballot(key[s] == best))) - 1;
      const uint32_t offered = lane == winner ? 0u : key[s];  // 0: below every key
      const uint32_t next = warp_reduce_max(offered);
      const int runner_up = __ffs(int(warp_ballot(offered == next))) - 1;
      const float score = rm::add(warp_shfl(c[s], winner), warp_shfl(c[s], runner_up));
      if (lane == s) mine = score;
    }
  }
  return mine;
}

// score: lane g's group's score (lanes from n_groups on: ignored).
__device__ __forceinline__ uint32_t top_groups_of(const RouteConfig& cfg, float score, int lane) {
  const uint64_t my_group = lane < cfg.n_groups ? rm::pack_candidate(true, rm::selection_key(score), lane) : 0;
  int rank = 0;  // how many groups beat lane g's
  for (int j = 0; j < cfg.n_groups; ++j) rank += warp_shfl(my_group, j) > my_group;
  return warp_ballot(lane < cfg.n_groups && rank < cfg.top_groups);
}

// The k best of the `total` (>= k) distinct packed candidates in
// sh.candidate (written and synced), each ranked by counting: lane j < k
// receives the j-th one's id and the value stored with it.
__device__ __forceinline__ void rank_shared_candidates(const WarpShared& sh, int total, int k, int lane, int32_t* id,
                                                       float* chosen_value) {
  for (int i = lane; i < total; i += kLanes) {
    const uint64_t mine = sh.candidate[i];
    int rank = 0;
    for (int j = 0; j < total; ++j) rank += sh.candidate[j] > mine;
    if (rank < k) {
      sh.chosen_id[rank] = rm::candidate_index(mine);
      sh.chosen_value[rank] = sh.candidate_value[i];
    }
  }
  warp_sync();
  if (lane < k) {
    *id = sh.chosen_id[lane];
    *chosen_value = sh.chosen_value[lane];
  }
  warp_sync();  // the buffers are reused by the warp's next token
}

// The k best candidates (packed; 0 = none) of the warp, best first: lane j < k
// receives the j-th one's id and the value stored with it. Only candidates
// at or above kth_lane_best_bound (typically about k of them) are ranked, by
// counting in shared memory. Should they overflow the buffer, k rounds of
// warp argmax decide instead.
template <int kSlots>
__device__ __forceinline__ void select_top_k(uint64_t (&cand)[kSlots], const float (&value)[kSlots], int k,
                                             const WarpShared& sh, int lane, int32_t* id, float* chosen_value) {
  // With one slot per lane every candidate is ranked (at most 32 of them).
  uint64_t threshold = 1;
  if constexpr (kSlots > 1) {
    uint64_t lane_max = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) lane_max = cand[s] > lane_max ? cand[s] : lane_max;
    threshold = kth_lane_best_bound(lane_max, k);
    threshold = threshold ? threshold : 1;  // never the empty slots (0)
  }
  int count = 0;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) count += cand[s] >= threshold;
  int total;
  int offset = warp_exclusive_sum(count, lane, &total);
  if (total <= kCandidateCapacity) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (cand[s] >= threshold) {
        sh.candidate[offset] = cand[s];
        sh.candidate_value[offset] = value[s];
        ++offset;
      }
    }
    warp_sync();
    rank_shared_candidates(sh, total, k, lane, id, chosen_value);
    return;
  }
  for (int j = 0; j < k; ++j) {  // rare: more than kCandidateCapacity candidates
    uint64_t best = 0;
    float best_value = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      best_value = cand[s] > best ? value[s] : best_value;
      best = cand[s] > best ? cand[s] : best;
    }
    const uint64_t winner = warp_max(best);
    const int e = rm::candidate_index(winner);
    const float v = warp_shfl(best_value, e % kLanes);
    if (lane == e % kLanes) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) cand[s] = (s == e / kLanes) ? 0 : cand[s];
    }
    if (lane == j) {
      *id = e;
      *chosen_value = v;
    }
  }
}

// Several tokens per warp (kWidth < 32 lanes each) when a token's experts fit
// in one slot of a segment: the k best are ranked by shuffles in the segment,
// and segment lane j receives the j-th.
template <int kWidth>
__device__ __forceinline__ void select_in_segment(uint64_t cand, float value, int k, int lane, int32_t* id,
                                                  float* chosen_value) {
  int rank = 0;  // candidates are distinct; empty lanes (0) rank after every real one
#pragma unroll
  for (int j = 0; j < kWidth; ++j) rank += warp_shfl(cand, j, kWidth) > cand;
  const int segment_base = lane & ~(kWidth - 1);
  const unsigned segment_bits = (kFullWarpMask >> (kLanes - kWidth)) << segment_base;
  for (int j = 0; j < k; ++j) {
    const unsigned holders = warp_ballot(rank == j) & segment_bits;
    const int source = holders ? __ffs(holders) - 1 : segment_base;
    const uint64_t c = warp_shfl(cand, source);
    const float v = warp_shfl(value, source);
    if ((lane & (kWidth - 1)) == j) {
      *id = rm::candidate_index(c);
      *chosen_value = v;
    }
  }
}

// Lane j < k of a token's segment writes the j-th output: `id` and the
// weight from its numerator, over the renormalisation (the canonical sum of
// the k numerators) or else the given denominator.
template <int kWidth>
__device__ __forceinline__ void store_route(const RouteConfig& cfg, int64_t token, bool active, int lane, int32_t id,
                                            float numerator, double denominator, float* weights, int32_t* ids) {
  if (cfg.renormalize) denominator = segment_sum<kWidth>(lane < cfg.k ? double(numerator) : 0.0);
  if (active && lane < cfg.k) {
    weights[token * cfg.k + lane] = rm::weight(numerator, denominator, cfg.scale);
    ids[token * cfg.k + lane] = id;
  }
}

// Whether a route's tokens are routed by route_token_by_bounds (a whole warp
// per token, kSlots > 1): scores read by the selection that are not a
// softmax (whose normaliser needs every exact score), with no groups or
// groups that are slots.
template <int kSlots, int kWidth, bool kGroupsAreSlots>
__host__ __device__ inline bool routes_by_bounds(const RouteConfig& cfg) {
  return route_bounds::kHaveBoundedFastScores && kSlots > 1 && kWidth == kLanes && cfg.selects_by_score() &&
         cfg.score != RouteScore::kSoftmax && (cfg.n_groups == 0 || kGroupsAreSlots);
}

// A token's route with exact scores for a few experts only
// (route_bounds.cuh). Each expert's c = score + bias is bounded by the fast
// score: c in [lo, lo + 2 delta_max], lo = c_hat - delta, delta_max the
// token's largest delta. Then:
// - groups (slots): a group's score (best c + second best) lies within
//   [L, L + 4 delta_max], L the same sum of lo (taken as 6 delta_max: the
//   sums' roundings); when every kept group's lower bound is above every
//   dropped group's upper bound, the kept groups are those of the exact scores;
// - floor: at most the k-th largest lo among the eligible experts (the k-th
//   largest lane best, kth_lane_best_bound), so at most the exact k-th best
//   c: an expert whose upper bound (taken as lo + 3 delta_max) is below it is
//   not among the k best;
// - the others (at least k) are scored exactly and ranked in shared memory.
// Returns false, having written nothing, where that does not hold (a
// non-finite logit, bias or c_hat, groups too close to call, more than
// kCandidateCapacity candidates): the token is then routed with every exact
// score (route_token, or route_missed_tokens_kernel).
// Only lo and delta_max are kept per expert (the fallback loads the logits
// again).
template <DType D, int kSlots, bool kGroupsAreSlots>
__device__ __forceinline__ bool route_token_by_bounds(const RouteInputs& in, float* weights, int32_t* ids,
                                                      const RouteConfig& cfg, int64_t token, const WarpShared& sh,
                                                      int lane) {
  namespace rb = route_bounds;
  const int experts = cfg.experts;
  const float* b = in.bias ? in.bias + token * cfg.bias_token_stride : nullptr;
  const rb::ScoreErrorBound bound = rb::score_error_bound(cfg.score);
  float lo[kSlots];
  bool usable = true;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int e = s * kLanes + lane;
    lo[s] = e < experts ? load_logit<D>(in.logits, token * experts + e) : 0.0f;
    usable &= fabsf(lo[s]) <= 0x1.fffffep127f;  // (a NaN fails the comparison)
  }
  // One branch on the score's kind for all slots.
  if (cfg.score == RouteScore::kSigmoid) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) lo[s] = rb::fast_sigmoid(lo[s]);
  } else {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) lo[s] = rb::fast_sqrt_softplus(lo[s]);
  }
  float delta_max = 0.0f;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int e = s * kLanes + lane;
    const float fast = lo[s];
    const float c_hat = (b && e < experts) ? fast + __ldg(b + e) : fast;
    const float delta = rb::selection_delta(fast, c_hat, bound);
    usable &= fabsf(c_hat) < 0x1p100f;
    delta_max = fmaxf(delta_max, delta);
    lo[s] = c_hat - delta;
  }
  if (warp_any(!usable)) return false;
  // Non-negative floats order as their bits.
  delta_max = __uint_as_float(warp_reduce_max(__float_as_uint(delta_max)));

  uint32_t eligible_slots = ~0u;  // bit s: slot s's experts may be chosen
  if constexpr (kGroupsAreSlots) {
    uint32_t lo_key[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) lo_key[s] = rm::selection_key(lo[s]);
    const float lower = group_scores_in_registers<kSlots>(cfg, lo_key, lo, lane);
    eligible_slots = top_groups_of(cfg, lower, lane);
    const bool kept = (eligible_slots >> lane) & 1u, group = lane < cfg.n_groups;
    const uint32_t lowest_kept = warp_reduce_min(group && kept ? rm::selection_key(lower) : ~0u);
    const uint32_t highest_dropped =
        warp_reduce_max(group && !kept ? rm::selection_key(lower + 6.0f * delta_max) : 0u);
    if (lowest_kept <= highest_dropped) return false;  // uniform
  }

  uint32_t lane_best = 0;  // the lane's largest lo key among eligible experts (0: none)
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if (((eligible_slots >> s) & 1u) && s * kLanes + lane < experts) {
      const uint32_t key = rm::selection_key(lo[s]);
      lane_best = key > lane_best ? key : lane_best;
    }
  }
  const uint32_t floor_key = uint32_t(kth_lane_best_bound(uint64_t(lane_best) << 32, cfg.k) >> 32);
  uint32_t candidate_slots = 0;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const bool reaches = rm::selection_key(lo[s] + 3.0f * delta_max) >= floor_key;
    if (((eligible_slots >> s) & 1u) && s * kLanes + lane < experts && reaches) candidate_slots |= 1u << s;
  }
  int total;
  int offset = warp_exclusive_sum(__popc(candidate_slots), lane, &total);
  if (total > kCandidateCapacity) return false;  // uniform
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if ((candidate_slots >> s) & 1u) sh.candidate[offset++] = uint64_t(s * kLanes + lane);
  }
  warp_sync();
  // The candidates' exact scores, a lane each.
  for (int i = lane; i < total; i += kLanes) {
    const int e = int(sh.candidate[i]);
    const float score = score_of(cfg.score, load_logit<D>(in.logits, token * experts + e));
    const float c = b ? rm::add(score, __ldg(b + e)) : score;
    sh.candidate[i] = rm::pack_candidate(true, rm::selection_key(c), e);
    sh.candidate_value[i] = score;
  }
  warp_sync();
  int32_t id = 0;
  float numerator = 0.0f;
  rank_shared_candidates(sh, total, cfg.k, lane, &id, &numerator);
  store_route<kLanes>(cfg, token, true, lane, id, numerator, 1.0, weights, ids);
  return true;
}

// Routes one token with every expert's exact score: `lane` is the lane
// within the token's segment of kWidth lanes; `active` is false for a segment
// past the last token (it computes along, for the shuffles, and stores
// nothing). kGroupsAreSlots: the route has groups and groups_are_slots()
// (its groups are ranked in registers).
template <DType D, int kSlots, int kWidth, bool kGroupsAreSlots>
__device__ __forceinline__ void route_token_exact(const RouteInputs& in, float* weights, int32_t* ids,
                                                  const RouteConfig& cfg, int64_t token, bool active,
                                                  const WarpShared& sh, int lane) {
  const void* logits = in.logits;
  static_assert(kWidth == kLanes || kSlots == 1, "segments of a warp hold one slot per lane");
  static_assert(kWidth == kLanes || !kGroupsAreSlots, "groups take whole warps");
  const int experts = cfg.experts;
  const bool softmax = cfg.score == RouteScore::kSoftmax;
  const int warp_lane = threadIdx.x % kLanes;
  float z[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int e = s * kWidth + lane;
    z[s] = (active && e < experts) ? load_logit<D>(logits, token * experts + e) : 0.0f;
  }

  // A normaliser given per token (the route's expert axis split over
  // devices) replaces the row's shift and sum.
  float m = 0.0f;
  if (softmax && cfg.normaliser_parts) {
    m = active ? rm::given_shift(in.normaliser + token * normaliser_words(cfg.normaliser_parts)) : 0.0f;
  } else if (softmax) {
    m = -__int_as_float(0x7F800000);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (s * kWidth + lane < experts) m = rm::max_propagating(m, z[s]);
    }
    m = segment_max_propagating<kWidth>(m);
  }
  // value[s]: what the weight of expert s needs (routing.h, weight()): the
  // numerator when computed here, else the logit (numerator computed for the
  // k chosen only).
  float value[kSlots];
  double softmax_sum = 1.0;
  if (cfg.needs_softmax_sum()) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) value[s] = rm::softmax_exp(z[s], m);
    if (cfg.normaliser_parts) {
      softmax_sum = given_normaliser_of(in, cfg, token, active);
    } else {
      rm::ExactSum partial;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (s * kWidth + lane < experts) partial.add(value[s]);
      }
      softmax_sum = segment_exact_total<kWidth>(partial);
    }
  }

  uint64_t cand[kSlots];
  if (cfg.selects_by_score()) {
    const float* b = in.bias ? in.bias + token * cfg.bias_token_stride : nullptr;
    uint32_t key[kSlots];
    float c_of[kSlots];  // (read only where the groups are slots)
    // The scores, one branch on their kind for all slots (a branch per slot
    // cost ~5 instructions each).
    if (cfg.score == RouteScore::kSigmoid) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) value[s] = rm::sigmoid(z[s]);
    } else if (cfg.score == RouteScore::kSqrtSoftplus) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) value[s] = rm::sqrt_softplus(z[s]);
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = s * kWidth + lane;
      const float sv = softmax ? float(rm::div(double(value[s]), softmax_sum)) : value[s];
      const float c = (b && active && e < experts) ? rm::add(sv, __ldg(b + e)) : sv;
      key[s] = rm::selection_key(c);
      c_of[s] = c;
      if constexpr (kWidth == kLanes && !kGroupsAreSlots) {
        if (cfg.n_groups > 0 && e < experts) {
          sh.c[e] = c;
          sh.key[e] = key[s];
        }
      }
    }
    uint32_t kept_slots = 0;  // (groups that are slots) bit s: group s is kept
    if constexpr (kGroupsAreSlots) {
      kept_slots = top_groups_of(cfg, group_scores_in_registers<kSlots>(cfg, key, c_of, lane), lane);
    } else if constexpr (kWidth == kLanes) {  // the launcher keeps groups on whole warps
      if (cfg.n_groups > 0) {
        warp_sync();
        mark_kept_groups(cfg, sh, lane);
      }
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = s * kWidth + lane;
      bool eligible = true;
      if constexpr (kGroupsAreSlots) {
        eligible = (kept_slots >> s) & 1u;
      } else if constexpr (kWidth == kLanes) {
        eligible = cfg.n_groups == 0 || (e < experts && sh.kept[e]);
      }
      cand[s] = e < experts ? rm::pack_candidate(eligible, key[s], e) : 0;
    }
  } else {
    const bool degenerate = softmax && !(m - m == 0.0f);  // every softmax score is NaN
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = s * kWidth + lane;
      cand[s] = e < experts ? rm::pack_candidate(true, rm::selection_key(degenerate ? m - m : z[s]), e) : 0;
      if (!cfg.needs_softmax_sum()) value[s] = z[s];
    }
  }

  int32_t my_id = 0;
  float my_value = 0.0f;
  if constexpr (kSlots == 1) {
    select_in_segment<kWidth>(cand[0], value[0], cfg.k, warp_lane, &my_id, &my_value);
  } else {
    select_top_k<kSlots>(cand, value, cfg.k, sh, lane, &my_id, &my_value);
  }
  const bool have_numerators = cfg.needs_softmax_sum() || cfg.selects_by_score();
  const float numerator = have_numerators ? my_value
                          : softmax       ? rm::softmax_exp(my_value, m)
                                          : score_of(cfg.score, my_value);
  store_route<kWidth>(cfg, token, active, lane, my_id, numerator, softmax ? softmax_sum : 1.0, weights, ids);
}

// Where routes_by_bounds(): route_tokens_kernel tries route_token_by_bounds
// for each token and routes those it cannot take with every exact score; or,
// where kBoundsInTwoKernels, route_by_bounds_kernel routes each token by
// route_token_by_bounds alone and marks those it cannot take (first id -1,
// which no expert has), and route_missed_tokens_kernel, next on the stream,
// routes those with every exact score. In one kernel the exact route's code
// sets the registers of the whole (DeepSeek-V4's 12 slots: ~115, against 56
// for the bounds route alone, so 4 blocks per SM instead of 8), whether
// inlined, called, or in a second loop. The second launch costs ~1 us, and
// its warps each route their few missed tokens serially. Measured on an H200
// (benchmarks/results/NOTES.md, seventeenth session; CUDA events, 16384
// tokens, one kernel / two): DeepSeek-V4 (384 experts, no groups) 32.2 / 29.1
// us; DeepSeek-V3 (groups that are slots, where close groups send a few
// percent of the tokens to the exact route) 30.9 / 38.1; 128 experts with a
// bias, k = 8 (4 slots) 16.3 / 17.5. Hence two kernels for routes without
// groups and at least kBoundsTwoKernelsMinSlots slots (a route without
// groups never takes a kernel of groups that are slots, and its bounds are
// compiled out of the single kernel).
constexpr int kBoundsTwoKernelsMinSlots = 12;
template <int kSlots, bool kGroupsAreSlots>
inline constexpr bool kBoundsInTwoKernels = !kGroupsAreSlots && kSlots >= kBoundsTwoKernelsMinSlots;

// Routes one token: by bounds where routes_by_bounds() (unless
// kBoundsInTwoKernels), falling back on every expert's exact score where the
// bounds cannot decide; else with exact scores. The token is real (active)
// wherever routes_by_bounds().
template <DType D, int kSlots, int kWidth, bool kGroupsAreSlots>
__device__ __forceinline__ void route_token(const RouteInputs& in, float* weights, int32_t* ids,
                                            const RouteConfig& cfg, int64_t token, bool active, const WarpShared& sh,
                                            int lane) {
  if constexpr (kSlots > 1 && kWidth == kLanes && !kBoundsInTwoKernels<kSlots, kGroupsAreSlots>) {
    if (routes_by_bounds<kSlots, kWidth, kGroupsAreSlots>(cfg) &&
        route_token_by_bounds<D, kSlots, kGroupsAreSlots>(in, weights, ids, cfg, token, sh, lane)) {
      return;
    }
  }
  route_token_exact<D, kSlots, kWidth, kGroupsAreSlots>(in, weights, ids, cfg, token, active, sh, lane);
}

template <DType D, int kSlots, int kWidth, bool kGroupsAreSlots>
__global__ void __launch_bounds__(kWarpsPerBlock * kLanes)
    route_tokens_kernel(RouteInputs in, float* __restrict__ weights, int32_t* __restrict__ ids, RouteConfig cfg) {
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  constexpr int kTokensPerWarp = kLanes / kWidth;
  const int lane = threadIdx.x % kWidth;
  const int segment = (threadIdx.x % kLanes) / kWidth;
  const int warp = threadIdx.x / kLanes;
  const bool shared_groups = groups_in_shared<kGroupsAreSlots>(cfg);
  const WarpShared sh =
      carve_warp_shared(dynamic_shared + warp * warp_shared_bytes(cfg, shared_groups), cfg, shared_groups);
  const int64_t stride = int64_t(gridDim.x) * kWarpsPerBlock * kTokensPerWarp;
  // The loop bound is the same for the whole warp (its shuffles need every lane).
  for (int64_t first = (int64_t(blockIdx.x) * kWarpsPerBlock + warp) * kTokensPerWarp; first < cfg.tokens;
       first += stride) {
    const int64_t token = first + segment;
    route_token<D, kSlots, kWidth, kGroupsAreSlots>(in, weights, ids, cfg, token, token < cfg.tokens, sh, lane);
    if (cfg.n_groups > 0 && !kGroupsAreSlots) warp_sync();  // sh.c, sh.key and sh.kept are rewritten by the next token
  }
}

// ---- Routes by bounds in two kernels (kBoundsInTwoKernels) ------------------
template <DType D, int kSlots, bool kGroupsAreSlots>
__global__ void __launch_bounds__(kWarpsPerBlock * kLanes)
    route_by_bounds_kernel(RouteInputs in, float* __restrict__ weights, int32_t* __restrict__ ids, RouteConfig cfg) {
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  const int lane = threadIdx.x % kLanes;
  const int warp = threadIdx.x / kLanes;
  const WarpShared sh = carve_warp_shared(dynamic_shared + warp * warp_shared_bytes(cfg, false), cfg, false);
  let_next_grid_start();  // route_missed_tokens_kernel (launch_dependent) waits for this grid's marks
  const int64_t stride = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t token = int64_t(blockIdx.x) * kWarpsPerBlock + warp; token < cfg.tokens; token += stride) {
    if (!route_token_by_bounds<D, kSlots, kGroupsAreSlots>(in, weights, ids, cfg, token, sh, lane) &&
        lane == 0) {
      ids[token * cfg.k] = -1;
    }
  }
}

template <DType D, int kSlots, bool kGroupsAreSlots>
__global__ void __launch_bounds__(kWarpsPerBlock * kLanes)
    route_missed_tokens_kernel(RouteInputs in, float* __restrict__ weights, int32_t* __restrict__ ids,
                               RouteConfig cfg) {
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  const int lane = threadIdx.x % kLanes;
  const int warp = threadIdx.x / kLanes;
  const WarpShared sh = carve_warp_shared(dynamic_shared + warp * warp_shared_bytes(cfg, false), cfg, false);
  const int64_t stride = int64_t(gridDim.x) * kWarpsPerBlock * kLanes;
  wait_for_previous_grid();  // route_by_bounds_kernel's marks
  // A warp looks at 32 tokens' marks at a time, then routes the marked ones.
  for (int64_t base = (int64_t(blockIdx.x) * kWarpsPerBlock + warp) * kLanes; base < cfg.tokens; base += stride) {
    const int64_t mine = base + lane;
    uint32_t missed = warp_ballot(mine < cfg.tokens && ids[mine * cfg.k] == -1);
    for (; missed; missed &= missed - 1) {
      const int64_t token = base + __ffs(int(missed)) - 1;
      route_token_exact<D, kSlots, kLanes, kGroupsAreSlots>(in, weights, ids, cfg, token, true, sh, lane);
    }
  }
}

// ---- Routes that rank the logits themselves: top_k's warp-select kernel -----
// No bias, no groups and no softmax normaliser (a renormalised softmax, or a
// sigmoid / sqrt(softplus) score): the selection is the k best logits, and
// only the k chosen need a score. These routes run top_k's threshold-filter
// kernel (topk_warp_select.cuh: L lanes per token, the row in registers, a
// guaranteed threshold, the few candidates ranked) with RouteByLogitsOutput
// as its policy: its keys are rm::selection_key (every NaN as +NaN, so a NaN
// logit ranks first), the ranked k wait in shared memory, and finish() makes
// them weights: lane j of the token's lanes decodes the j-th chosen logit
// from its key, scores it, and the lanes sum the k numerators in the
// canonical butterfly. (It replaced a kernel of 4 lanes per token with sorted
// register lists: Qwen3-MoE 13.9 -> 9.2 us on an H200; NOTES, routing v9.)
constexpr int kByLogitsMaxExperts = 256;
constexpr int kByLogitsMaxK = 16;
// Slots per lane warp_select gives a row of at most kByLogitsMaxExperts
// (ws_lanes keeps <= kWarpSelectElemsPerLane elements per lane).
constexpr int kByLogitsMaxSlots = 24;
static_assert(kByLogitsMaxExperts <= 32 * kWarpSelectElemsPerLane && kWarpSelectElemsPerLane <= kByLogitsMaxSlots,
              "rows of kByLogitsMaxExperts take at most kByLogitsMaxSlots slots per lane");

template <DType D>
struct RouteByLogitsOutput {
  using Bits = typename DTypeTraits<D>::Bits;
  static constexpr int kRowSlots = kByLogitsMaxK;
  const void* logits;
  float* weights;
  int32_t* ids;
  int experts;
  int k;
  RouteScore score;
  bool renormalize;
  float scale;

  __device__ __forceinline__ uint32_t key(Bits bits) const { return rm::selection_key(logit_from_bits<D>(bits)); }
  // The dtype's lowest value (-inf), whose key is the lowest selection_key
  // gives (it has no key 0); a fill tied with a -inf logit can only lower
  // the threshold.
  __device__ __forceinline__ Bits fill_bits() const { return DTypeTraits<D>::kLowestBits; }
  __device__ __forceinline__ void put(uint64_t p, int64_t, int rank, uint64_t* row_out) const { row_out[rank] = p; }

  // The logit a selection key came from (a NaN key: NaN; every NaN the
  // scores and weights make from it is the GPU's canonical NaN either way).
  __device__ __forceinline__ static float logit_of_key(uint64_t packed) {
    return __uint_as_float(bits_from_key<KeyKind::kFloat>(uint32_t(packed >> 32)));
  }

  __device__ __forceinline__ void finish(int64_t token, bool active, int log2_lanes, uint64_t* row_out) const {
    warp_sync();  // row_out was put by the ranking lanes
    const int j = lane_id() & ((1 << log2_lanes) - 1);
    const bool softmax = score == RouteScore::kSoftmax;
    // The softmax shift, max_propagating over the row: the first chosen
    // logit, NaN if the row has one. A softmax with a NaN or infinite shift
    // has every score NaN, and NaN scores tie, so the k lowest experts win.
    const float m = active ? logit_of_key(row_out[0]) : 0.0f;
    const bool degenerate = softmax && !(m - m == 0.0f);
    const bool mine = active && j < k;
    const uint64_t chosen = mine ? row_out[j] : 0;
    const int32_t id = degenerate ? j : int32_t(~uint32_t(chosen));
    double numerator = 0.0;
    if (mine) {
      const float z = degenerate ? load_logit<D>(logits, token * experts + j) : logit_of_key(chosen);
      numerator = softmax ? rm::softmax_exp(z, m) : score_of(score, z);
    }
    double denominator = 1.0;
    if (renormalize) {  // the canonical butterfly; lanes j >= k add +0 (k <= lanes)
      denominator = numerator;
      for (int offset = rm::butterfly_width(k) / 2; offset > 0; offset /= 2) {
        denominator = rm::add(denominator, warp_shfl_xor(denominator, offset));
      }
    }
    if (mine) {
      weights[token * k + j] = rm::weight(float(numerator), denominator, scale);
      ids[token * k + j] = id;
    }
  }
};

bool routes_by_logits(const RouteConfig& cfg) {
  return !cfg.selects_by_score() && !cfg.needs_softmax_sum() && cfg.experts > 16 &&
         cfg.experts <= kByLogitsMaxExperts && cfg.k <= kByLogitsMaxK;
}

// Blocks for `tokens` at `tokens_per_block`: enough warps for every SM to
// hide load latency; past 16 blocks per SM the kernels loop over tokens.
unsigned grid_blocks(int64_t tokens, int64_t tokens_per_block, const DeviceInfo& dev) {
  const int64_t needed = (tokens + tokens_per_block - 1) / tokens_per_block;
  return unsigned(std::min<int64_t>(needed, int64_t(dev.sm_count) * 16));
}

template <DType D, int kSlots, int kWidth = kLanes, bool kGroupsAreSlots = false>
gpuError_t launch_kernel(const RouteInputs& in, float* weights, int32_t* ids, const RouteConfig& cfg,
                         gpuStream_t stream) {
  DeviceInfo dev;
  gpuError_t err = query_device(&dev);
  if (err != gpuSuccess) return err;
  const size_t smem = kWarpsPerBlock * warp_shared_bytes(cfg, groups_in_shared<kGroupsAreSlots>(cfg));
  if (smem > size_t(dev.max_shared_optin)) return gpuErrorInvalidValue;
  if (smem > 48 * 1024) {  // one opt-in per kernel, at the device maximum (the attribute is per kernel)
    static bool opted_in = false;
    if (!opted_in) {
      err = gpu_set_max_dynamic_smem(route_tokens_kernel<D, kSlots, kWidth, kGroupsAreSlots>, dev.max_shared_optin);
      if (err != gpuSuccess) return err;
      opted_in = true;
    }
  }
  const unsigned blocks = grid_blocks(cfg.tokens, kWarpsPerBlock * (kLanes / kWidth), dev);
  if constexpr (kWidth == kLanes && kBoundsInTwoKernels<kSlots, kGroupsAreSlots>) {
    if (routes_by_bounds<kSlots, kWidth, kGroupsAreSlots>(cfg)) {  // (no groups: smem is the candidates')
      route_by_bounds_kernel<D, kSlots, kGroupsAreSlots><<<blocks, kWarpsPerBlock * kLanes, smem, stream>>>(
          in, weights, ids, cfg);
      err = gpuGetLastError();
      if (err != gpuSuccess) return err;
      const unsigned check_blocks = grid_blocks(cfg.tokens, kWarpsPerBlock * kLanes, dev);
      return launch_dependent(dev, route_missed_tokens_kernel<D, kSlots, kGroupsAreSlots>, dim3(check_blocks),
                              dim3(kWarpsPerBlock * kLanes), smem, stream, in, weights, ids, cfg);
    }
  }
  route_tokens_kernel<D, kSlots, kWidth, kGroupsAreSlots>
      <<<blocks, kWarpsPerBlock * kLanes, smem, stream>>>(in, weights, ids, cfg);
  return gpuGetLastError();
}

// A warp per token with kSlots slots per lane (or, kWidth < 32, several
// tokens per warp); groups that are slots take the kernel that ranks them in
// registers.
template <DType D, int kSlots, int kWidth = kLanes>
gpuError_t launch(const RouteInputs& in, float* weights, int32_t* ids, const RouteConfig& cfg, gpuStream_t stream) {
  if constexpr (kWidth == kLanes) {
    if (groups_are_slots(cfg)) return launch_kernel<D, kSlots, kLanes, true>(in, weights, ids, cfg, stream);
  }
  return launch_kernel<D, kSlots, kWidth>(in, weights, ids, cfg, stream);
}

template <DType D>
gpuError_t launch_by_logits(const void* logits, float* weights, int32_t* ids, const RouteConfig& cfg,
                            gpuStream_t stream) {
  using Out = RouteByLogitsOutput<D>;
  using Bits = typename Out::Bits;
  const Out out{logits, weights, ids, cfg.experts, cfg.k, cfg.score, cfg.renormalize, cfg.scale};
  const Bits* rows = static_cast<const Bits*>(logits);
  const RowLengths<Bits> whole_rows{nullptr, Bits(0)};
  DeviceInfo dev;
  if (gpuError_t err = query_device(&dev); err != gpuSuccess) return err;
  return launch_warp_select_rows<Bits, Out, kByLogitsMaxSlots>(
      dev, rows, cfg.tokens, cfg.experts, cfg.k, warp_rows_vectorised(rows, cfg.experts, whole_rows), out, whole_rows,
      stream);
}

// Routes that rank the logits: top_k's warp-select kernel (launch_by_logits).
// Otherwise slots per lane: the smallest of these holding experts / 32. Up to
// 16 experts without groups: several tokens per warp, one lane per expert.
template <DType D>
gpuError_t launch_for_experts(const RouteInputs& in, float* weights, int32_t* ids, const RouteConfig& cfg,
                               gpuStream_t stream) {
  if (routes_by_logits(cfg)) return launch_by_logits<D>(in.logits, weights, ids, cfg, stream);
  if (cfg.n_groups == 0 && cfg.experts <= 4) return launch<D, 1, 4>(in, weights, ids, cfg, stream);
  if (cfg.n_groups == 0 && cfg.experts <= 8) return launch<D, 1, 8>(in, weights, ids, cfg, stream);
  if (cfg.n_groups == 0 && cfg.experts <= 16) return launch<D, 1, 16>(in, weights, ids, cfg, stream);
  const int slots = (cfg.experts + kLanes - 1) / kLanes;
  if (slots <= 1) return launch<D, 1>(in, weights, ids, cfg, stream);
  if (slots <= 2) return launch<D, 2>(in, weights, ids, cfg, stream);
  if (slots <= 4) return launch<D, 4>(in, weights, ids, cfg, stream);
  if (slots <= 8) return launch<D, 8>(in, weights, ids, cfg, stream);
  if (slots <= 12) return launch<D, 12>(in, weights, ids, cfg, stream);
  if (slots <= 16) return launch<D, 16>(in, weights, ids, cfg, stream);
  if (slots <= 24) return launch<D, 24>(in, weights, ids, cfg, stream);
  static_assert(kRouteMaxExperts == 32 * kLanes, "the largest variant holds kRouteMaxExperts");
  return launch<D, 32>(in, weights, ids, cfg, stream);
}

// Per token (a warp each): the exact sum of exp(z - shift) over its row, as
// kExactSumWords words.
template <DType D>
__global__ void __launch_bounds__(kWarpsPerBlock * kLanes)
    softmax_partial_sums_kernel(const void* __restrict__ logits, const float* __restrict__ shift,
                                uint32_t* __restrict__ sums, int64_t tokens, int32_t experts) {
  const int lane = threadIdx.x % kLanes;
  const int64_t stride = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t token = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kLanes; token < tokens; token += stride) {
    const float m = shift[token];
    rm::ExactSum sum;
    for (int e = lane; e < experts; e += kLanes) sum.add(rm::softmax_exp(load_logit<D>(logits, token * experts + e), m));
    sum = segment_exact_sum<kLanes>(sum);
    if (lane == 0) sum.to_words(sums + token * kExactSumWords);
  }
}

template <DType D>
gpuError_t launch_partial_sums(const void* logits, const float* shift, uint32_t* sums, int64_t tokens,
                               int32_t experts, gpuStream_t stream) {
  DeviceInfo dev;
  gpuError_t err = query_device(&dev);
  if (err != gpuSuccess) return err;
  const unsigned blocks = grid_blocks(tokens, kWarpsPerBlock, dev);
  softmax_partial_sums_kernel<D><<<blocks, kWarpsPerBlock * kLanes, 0, stream>>>(logits, shift, sums, tokens, experts);
  return gpuGetLastError();
}

}  // namespace

gpuError_t route_tokens(DType dtype, const RouteInputs& in, float* weights, int32_t* ids, const RouteConfig& cfg,
                         gpuStream_t stream) {
  if (cfg.tokens == 0) return gpuSuccess;
  if (cfg.experts < 1 || cfg.experts > kRouteMaxExperts || cfg.k < 1 || cfg.k > cfg.experts || cfg.k > kRouteMaxK ||
      (cfg.normaliser_parts && !cfg.needs_softmax_sum())) {
    return gpuErrorInvalidValue;
  }
  switch (dtype) {
#define JAX_TOPK_ROUTE_CASE(name) \
  case DType::name:               \
    return launch_for_experts<DType::name>(in, weights, ids, cfg, stream);
    JAX_TOPK_FOR_EACH_ROUTE_DTYPE(JAX_TOPK_ROUTE_CASE)
#undef JAX_TOPK_ROUTE_CASE
    default:
      return gpuErrorInvalidValue;
  }
}

gpuError_t softmax_partial_sums(DType dtype, const void* logits, const float* shift, uint32_t* sums, int64_t tokens,
                                int32_t experts, gpuStream_t stream) {
  if (tokens == 0) return gpuSuccess;
  switch (dtype) {
#define JAX_TOPK_PARTIAL_CASE(name) \
  case DType::name:                 \
    return launch_partial_sums<DType::name>(logits, shift, sums, tokens, experts, stream);
    JAX_TOPK_FOR_EACH_ROUTE_DTYPE(JAX_TOPK_PARTIAL_CASE)
#undef JAX_TOPK_PARTIAL_CASE
    default:
      return gpuErrorInvalidValue;
  }
}

}  // namespace jax_topk::cuda
