// CUDA fused MoE routing: one warp per token. Lane l holds experts l, l + 32,
// l + 64, ... in registers (coalesced loads, any expert count), scores them
// with the IEEE-only math of jax_topk/routing.h, and the warp picks the k
// best by k rounds of a packed-candidate argmax. Sums run in the canonical
// order (strided partial sums, xor butterfly) that cpu/routing_cpu.cc
// emulates, so both produce the same bits.

#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/routing_cuda.h"

namespace jax_topk::cuda {
namespace {

namespace rm = route_math;

constexpr int kLanes = kRouteLanes;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kWarpsPerBlock = 4;

template <DType D>
__device__ __forceinline__ float load_logit(const void* logits, int64_t i) {
  if constexpr (D == DType::float32) {
    return __ldg(static_cast<const float*>(logits) + i);
  } else if constexpr (D == DType::bfloat16) {
    return __uint_as_float(uint32_t(__ldg(static_cast<const unsigned short*>(logits) + i)) << 16);
  } else {
    return __half2float(__ushort_as_half(__ldg(static_cast<const unsigned short*>(logits) + i)));
  }
}

__device__ __forceinline__ uint64_t warp_max(uint64_t v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    const uint64_t other = __shfl_xor_sync(kFullMask, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

__device__ __forceinline__ float warp_max_propagating(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    v = rm::max_propagating(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// The canonical butterfly of rm::butterfly_sum, with shuffles.
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v = rm::add(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

__device__ __forceinline__ float score_of(RouteScore score, float z) {
  return score == RouteScore::kSigmoid ? rm::sigmoid(z) : rm::sqrt_softplus(z);
}

// Groups: `c` (this warp's [experts] in shared memory) -> marks each group
// kept or not in `group` (this warp's [n_groups]): a group's score is its best
// c plus its second best; the top_groups best groups (ties: lower index) are
// kept. Afterwards group[g] == 0 exactly for the kept groups.
__device__ void keep_top_groups(const RouteConfig& cfg, const float* c, uint64_t* group, int lane) {
  const int per_group = cfg.experts / cfg.n_groups;
  for (int g = lane; g < cfg.n_groups; g += kLanes) {
    uint64_t first = 0, second = 0;
    for (int i = g * per_group; i < (g + 1) * per_group; ++i) {
      const uint64_t cand = rm::pack_candidate(true, rm::selection_key(c[i]), i);
      if (cand > first) {
        second = first;
        first = cand;
      } else if (cand > second) {
        second = cand;
      }
    }
    float score = c[rm::candidate_index(first)];
    if (per_group > 1) score = rm::add(score, c[rm::candidate_index(second)]);
    group[g] = rm::pack_candidate(true, rm::selection_key(score), g);
  }
  __syncwarp();
  for (int round = 0; round < cfg.top_groups; ++round) {
    uint64_t best = 0;
    for (int g = lane; g < cfg.n_groups; g += kLanes) best = group[g] > best ? group[g] : best;
    best = warp_max(best);
    const int g = rm::candidate_index(best);
    if (lane == (g % kLanes)) group[g] = 0;
    __syncwarp();
  }
}

template <DType D, int kSlots>
__device__ __forceinline__ void route_token(const void* logits, const float* bias, float* weights, int32_t* ids,
                                            const RouteConfig& cfg, int64_t token, float* c_shared,
                                            uint64_t* group_shared, int lane) {
  const int experts = cfg.experts;
  const bool softmax = cfg.score == RouteScore::kSoftmax;
  float z[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int e = s * kLanes + lane;
    z[s] = e < experts ? load_logit<D>(logits, token * experts + e) : 0.0f;
  }

  float m = 0.0f;
  if (softmax) {
    m = -__int_as_float(0x7F800000);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (s * kLanes + lane < experts) m = rm::max_propagating(m, z[s]);
    }
    m = warp_max_propagating(m);
  }
  // score[s]: exp(z - m) for a softmax (its numerator), else the score.
  float score[kSlots];
  double softmax_sum = 1.0;
  if (cfg.needs_softmax_sum()) {
    double partial = 0.0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      score[s] = rm::softmax_exp(z[s], m);
      if (s * kLanes + lane < experts) partial = rm::add(partial, double(score[s]));
    }
    softmax_sum = warp_sum(partial);
  }

  uint64_t cand[kSlots];
  if (cfg.selects_by_score()) {
    const float* b = bias ? bias + token * cfg.bias_token_stride : nullptr;
    float c[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = s * kLanes + lane;
      if (!softmax) score[s] = score_of(cfg.score, z[s]);
      const float sv = softmax ? float(rm::div(double(score[s]), softmax_sum)) : score[s];
      c[s] = (b && e < experts) ? rm::add(sv, __ldg(b + e)) : sv;
    }
    if (cfg.n_groups > 0) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (s * kLanes + lane < experts) c_shared[s * kLanes + lane] = c[s];
      }
      __syncwarp();
      keep_top_groups(cfg, c_shared, group_shared, lane);
    }
    const int per_group = cfg.n_groups > 0 ? experts / cfg.n_groups : 1;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = s * kLanes + lane;
      const bool eligible = cfg.n_groups == 0 || (e < experts && group_shared[e / per_group] == 0);
      cand[s] = e < experts ? rm::pack_candidate(eligible, rm::selection_key(c[s]), e) : 0;
    }
    if (cfg.n_groups > 0) __syncwarp();  // group_shared is reused by the next token
  } else {
    const bool degenerate = softmax && !(m - m == 0.0f);  // every softmax score is NaN
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = s * kLanes + lane;
      cand[s] = e < experts ? rm::pack_candidate(true, rm::selection_key(degenerate ? m - m : z[s]), e) : 0;
    }
  }

  // k rounds of argmax; lane j keeps the j-th choice and its numerator.
  const bool have_numerators = cfg.needs_softmax_sum() || cfg.selects_by_score();
  int32_t my_id = 0;
  float my_numerator = 0.0f;
  for (int j = 0; j < cfg.k; ++j) {
    uint64_t best = 0;
    float best_z = 0.0f, best_score = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const bool better = cand[s] > best;
      best = better ? cand[s] : best;
      best_z = better ? z[s] : best_z;
      best_score = better ? (have_numerators ? score[s] : 0.0f) : best_score;
    }
    const uint64_t winner = warp_max(best);
    const int e = rm::candidate_index(winner);
    const int owner = e % kLanes;
    const float wz = __shfl_sync(kFullMask, best_z, owner);
    const float wscore = __shfl_sync(kFullMask, best_score, owner);
    if (lane == owner) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) cand[s] = (s == e / kLanes) ? 0 : cand[s];
    }
    if (lane == j) {
      my_id = e;
      my_numerator = have_numerators ? wscore : (softmax ? rm::softmax_exp(wz, m) : score_of(cfg.score, wz));
    }
  }

  double denominator = 1.0;
  if (cfg.renormalize) {
    denominator = warp_sum(lane < cfg.k ? double(my_numerator) : 0.0);
  } else if (softmax) {
    denominator = softmax_sum;
  }
  if (lane < cfg.k) {
    weights[token * cfg.k + lane] = rm::weight(my_numerator, denominator, cfg.scale);
    ids[token * cfg.k + lane] = my_id;
  }
}

template <DType D, int kSlots>
__global__ void __launch_bounds__(kWarpsPerBlock * kLanes)
    route_tokens_kernel(const void* __restrict__ logits, const float* __restrict__ bias, float* __restrict__ weights,
                        int32_t* __restrict__ ids, RouteConfig cfg) {
  // Groups only: per warp, the experts' c and the group candidates.
  extern __shared__ uint64_t dynamic_shared[];
  const int lane = threadIdx.x % kLanes;
  const int warp = threadIdx.x / kLanes;
  uint64_t* group_shared = dynamic_shared + warp * (cfg.n_groups + cfg.experts / 2 + 1);
  float* c_shared = reinterpret_cast<float*>(group_shared + cfg.n_groups);
  const int64_t stride = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t token = int64_t(blockIdx.x) * kWarpsPerBlock + warp; token < cfg.tokens; token += stride) {
    route_token<D, kSlots>(logits, bias, weights, ids, cfg, token, c_shared, group_shared, lane);
  }
}

template <DType D, int kSlots>
cudaError_t launch(const void* logits, const float* bias, float* weights, int32_t* ids, const RouteConfig& cfg,
                   cudaStream_t stream) {
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const size_t smem = cfg.n_groups > 0
                          ? size_t(kWarpsPerBlock) * (cfg.n_groups + cfg.experts / 2 + 1) * sizeof(uint64_t)
                          : 0;
  // Enough warps for every SM to hide load latency; more tokens loop.
  const int64_t blocks_needed = (cfg.tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t blocks = std::min<int64_t>(blocks_needed, int64_t(sms) * 16);
  route_tokens_kernel<D, kSlots><<<unsigned(blocks), kWarpsPerBlock * kLanes, smem, stream>>>(logits, bias, weights,
                                                                                              ids, cfg);
  return cudaGetLastError();
}

// Slots per lane: the smallest of these holding experts / 32.
template <DType D>
cudaError_t launch_for_experts(const void* logits, const float* bias, float* weights, int32_t* ids,
                               const RouteConfig& cfg, cudaStream_t stream) {
  const int slots = (cfg.experts + kLanes - 1) / kLanes;
  if (slots <= 1) return launch<D, 1>(logits, bias, weights, ids, cfg, stream);
  if (slots <= 2) return launch<D, 2>(logits, bias, weights, ids, cfg, stream);
  if (slots <= 4) return launch<D, 4>(logits, bias, weights, ids, cfg, stream);
  if (slots <= 8) return launch<D, 8>(logits, bias, weights, ids, cfg, stream);
  if (slots <= 12) return launch<D, 12>(logits, bias, weights, ids, cfg, stream);
  if (slots <= 16) return launch<D, 16>(logits, bias, weights, ids, cfg, stream);
  if (slots <= 24) return launch<D, 24>(logits, bias, weights, ids, cfg, stream);
  static_assert(kRouteMaxExperts == 32 * kLanes, "the largest variant holds kRouteMaxExperts");
  return launch<D, 32>(logits, bias, weights, ids, cfg, stream);
}

}  // namespace

cudaError_t route_tokens(DType dtype, const void* logits, const float* bias, float* weights, int32_t* ids,
                         const RouteConfig& cfg, cudaStream_t stream) {
  if (cfg.tokens == 0) return cudaSuccess;
  if (cfg.experts < 1 || cfg.experts > kRouteMaxExperts || cfg.k < 1 || cfg.k > cfg.experts || cfg.k > kRouteMaxK) {
    return cudaErrorInvalidValue;
  }
  switch (dtype) {
#define JAX_TOPK_ROUTE_CASE(name) \
  case DType::name:               \
    return launch_for_experts<DType::name>(logits, bias, weights, ids, cfg, stream);
    JAX_TOPK_FOR_EACH_ROUTE_DTYPE(JAX_TOPK_ROUTE_CASE)
#undef JAX_TOPK_ROUTE_CASE
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace jax_topk::cuda
