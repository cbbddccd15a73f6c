// CUDA sparse-attention indexer: the scores of every key into a [batch, n]
// float32 scratch, then the top-k kernels over each row's first length keys.
//
// Two score kernels; which one runs depends on (dtype, heads, dim) only:
// - indexer_scores_mma_kernel (bfloat16, heads and dim multiples of 16): a
//   block takes one item's queries into shared memory once and scores a
//   chunk of its keys, 128 at a time (the next 128 prefetched into registers
//   meanwhile); each warp forms [64 heads x 16 keys] dots on tensor cores
//   (WMMA 16x16x16, float32 accumulators, dim in steps of 16 in increasing
//   order), then one lane per key adds those heads to its score, group after
//   group: heads in order. The MMA's rounding is the hardware's, the same
//   for every call. (bfloat16, heads a multiple of 16, dim 16, 32, 64 or 128.)
// - indexer_scores_exact_kernel (any shape, float32 or bfloat16): one thread
//   per key, the order of indexer.h with explicitly rounded products and sums
//   (no FMA contraction): bit-identical to the CPU kernel.

#include <climits>
#include <cstdint>

#include "cuda/indexer_cuda.h"
#include "cuda/scratch.h"
#include "cuda/topk_cuda.h"
#include "jax_topk/indexer.h"

#if defined(JAX_TOPK_HAS_WMMA)  // CUDA only: HIP takes the exact kernel
#include <cuda_bf16.h>
#include <mma.h>
#endif

namespace jax_topk::cuda {
namespace {

constexpr int kMmaTile = 16;          // WMMA m = n = k
constexpr int kMmaWarps = 8;          // 16 keys each
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaKeysPerStep = kMmaWarps * kMmaTile;
constexpr int kMmaStepsPerBlock = 4;  // 512 keys per block: the queries are loaded once per 512 keys
constexpr int kMmaHeadTiles = 4;      // heads in groups of 64: one accumulator per 16
constexpr int kMmaMaxDim = 128;
// Shared-memory rows of q and keys are padded by 16 bytes: with rows of
// 256 bytes (dim 128) the 8 rows an 8x8 fragment load reads would share
// their banks (ncu: 18.7M bank conflicts in 244 us); padded, none do.
constexpr int kMmaRowPad = 8;
// 16-byte vectors of one step's keys a thread keeps in flight (prefetched
// into registers while the previous step computes).
constexpr int kMmaMaxVecsPerThread = kMmaKeysPerStep * kMmaMaxDim * 2 / 16 / kMmaThreads;
constexpr int kExactThreads = 128;

// Dynamic shared memory of the MMA kernel: the item's queries [heads][dim +
// pad] and one step's keys [128][dim + pad] (bfloat16), each warp's dots of
// one group of heads [64][16] (float32) and the weights.
size_t mma_smem_bytes(int64_t heads, int64_t dim) {
  return size_t((heads + kMmaKeysPerStep) * (dim + kMmaRowPad)) * 2 +
         size_t(kMmaWarps * kMmaHeadTiles * kMmaTile * kMmaTile + heads) * 4;
}

#if defined(JAX_TOPK_HAS_WMMA)
// One step's keys [128][dim] from global memory into registers (zeros past
// `valid` keys), then into shared memory rows of `stride` elements.
struct KeyStep {
  uint4 v[kMmaMaxVecsPerThread];
  // vecs_per_key = 1 << vec_shift (dim a power of two: no divisions).
  __device__ __forceinline__ void load(const __nv_bfloat16* src, int vec_shift, int valid_keys) {
#pragma unroll
    for (int j = 0; j < kMmaMaxVecsPerThread; ++j) {
      const int i = j * kMmaThreads + int(threadIdx.x);
      const bool in = i < (kMmaKeysPerStep << vec_shift) && (i >> vec_shift) < valid_keys;
      v[j] = in ? __ldg(reinterpret_cast<const uint4*>(src) + i) : make_uint4(0, 0, 0, 0);
    }
  }
  __device__ __forceinline__ void store(__nv_bfloat16* dst, int vec_shift, int stride) const {
#pragma unroll
    for (int j = 0; j < kMmaMaxVecsPerThread; ++j) {
      const int i = j * kMmaThreads + int(threadIdx.x);
      if (i < (kMmaKeysPerStep << vec_shift)) {
        *reinterpret_cast<uint4*>(dst + (i >> vec_shift) * stride + (i & ((1 << vec_shift) - 1)) * 8) = v[j];
      }
    }
  }
};

__global__ void __launch_bounds__(kMmaThreads)
    indexer_scores_mma_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ keys,
                              const float* __restrict__ weights, const int32_t* __restrict__ lengths, int heads,
                              int64_t n, int dim, float* __restrict__ scores) {
  using namespace nvcuda;
  using Acc = wmma::fragment<wmma::accumulator, kMmaTile, kMmaTile, kMmaTile, float>;
  extern __shared__ uint4 indexer_smem[];
  const int stride = dim + kMmaRowPad;
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(indexer_smem);
  __nv_bfloat16* keys_s = q_s + heads * stride;
  float* dots_s = reinterpret_cast<float*>(keys_s + kMmaKeysPerStep * stride);
  float* w_s = dots_s + kMmaWarps * kMmaHeadTiles * kMmaTile * kMmaTile;
  const int64_t b = blockIdx.y;
  const int64_t len = min(max(int64_t(__ldg(lengths + b)), int64_t(0)), n);
  const int64_t first = int64_t(blockIdx.x) * kMmaKeysPerStep * kMmaStepsPerBlock;
  if (first >= len) return;  // uniform: keys past the length are never read
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int vec_shift = __ffs(dim * 2 / 16) - 1;  // 16-byte vectors per key: a power of two
  const __nv_bfloat16* keys_b = keys + b * n * dim;
  auto valid_keys = [&](int64_t s0) { return int(min(int64_t(kMmaKeysPerStep), max(len - s0, int64_t(0)))); };
  KeyStep next;
  next.load(keys_b + first * dim, vec_shift, valid_keys(first));
  const uint4* q_src = reinterpret_cast<const uint4*>(q + b * heads * dim);
  for (int i = int(threadIdx.x); i < (heads << vec_shift); i += kMmaThreads) {
    *reinterpret_cast<uint4*>(q_s + (i >> vec_shift) * stride + (i & ((1 << vec_shift) - 1)) * 8) = __ldg(q_src + i);
  }
  for (int h = int(threadIdx.x); h < heads; h += kMmaThreads) w_s[h] = weights[b * heads + h];
  float* dots = dots_s + warp * kMmaHeadTiles * kMmaTile * kMmaTile;
  const __nv_bfloat16* my_keys = keys_s + warp * kMmaTile * stride;
  for (int step = 0; step < kMmaStepsPerBlock; ++step) {
    const int64_t s0 = first + int64_t(step) * kMmaKeysPerStep;
    if (s0 >= len) break;  // uniform
    __syncthreads();  // the previous step's keys are no longer read
    next.store(keys_s, vec_shift, stride);
    __syncthreads();
    const int64_t s1 = s0 + kMmaKeysPerStep;
    if (step + 1 < kMmaStepsPerBlock && s1 < len) next.load(keys_b + s1 * dim, vec_shift, valid_keys(s1));
    // Per group of 64 heads: the dots [64 heads x this warp's 16 keys] on
    // tensor cores (each key fragment loaded once per 16 of dim), then lane
    // j < 16 adds the group's heads to key j's score, in head order.
    float score = 0.0f;
    for (int g0 = 0; g0 < heads; g0 += kMmaHeadTiles * kMmaTile) {
      const int tiles = min(kMmaHeadTiles, (heads - g0) / kMmaTile);
      Acc acc[kMmaHeadTiles];
#pragma unroll
      for (int t = 0; t < kMmaHeadTiles; ++t) wmma::fill_fragment(acc[t], 0.0f);
      for (int d0 = 0; d0 < dim; d0 += kMmaTile) {
        wmma::fragment<wmma::matrix_b, kMmaTile, kMmaTile, kMmaTile, __nv_bfloat16, wmma::col_major> kb;
        wmma::load_matrix_sync(kb, my_keys + d0, stride);
#pragma unroll
        for (int t = 0; t < kMmaHeadTiles; ++t) {
          if (t < tiles) {
            wmma::fragment<wmma::matrix_a, kMmaTile, kMmaTile, kMmaTile, __nv_bfloat16, wmma::row_major> a;
            wmma::load_matrix_sync(a, q_s + (g0 + t * kMmaTile) * stride + d0, stride);
            wmma::mma_sync(acc[t], a, kb, acc[t]);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kMmaHeadTiles; ++t) {
        if (t < tiles) wmma::store_matrix_sync(dots + t * kMmaTile * kMmaTile, acc[t], kMmaTile, wmma::mem_row_major);
      }
      warp_sync();
      if (lane < kMmaTile) {
        const int count = tiles * kMmaTile;
#pragma unroll 16
        for (int h = 0; h < count; ++h) {
          score = __fadd_rn(score, __fmul_rn(w_s[g0 + h], indexer_relu(dots[h * kMmaTile + lane])));
        }
      }
      warp_sync();  // dots are rewritten by the next group
    }
    const int64_t s = s0 + warp * kMmaTile + lane;
    if (lane < kMmaTile && s < len) scores[b * n + s] = score;
  }
}

#endif  // JAX_TOPK_HAS_WMMA

template <typename T>
__global__ void __launch_bounds__(kExactThreads)
    indexer_scores_exact_kernel(const T* __restrict__ q, const T* __restrict__ keys,
                                const float* __restrict__ weights, const int32_t* __restrict__ lengths,
                                int heads, int64_t n, int dim, float* __restrict__ scores) {
  const int64_t b = blockIdx.y;
  const int64_t len = min(max(int64_t(__ldg(lengths + b)), int64_t(0)), n);
  const int64_t s = int64_t(blockIdx.x) * kExactThreads + threadIdx.x;
  if (s >= len) return;
  const T* key = keys + (b * n + s) * dim;
  const T* qb = q + b * heads * dim;
  float score = 0.0f;
  for (int h = 0; h < heads; ++h) {
    float p[kIndexerLanes] = {};
    for (int d0 = 0; d0 < dim; d0 += kIndexerLanes) {
#pragma unroll
      for (int j = 0; j < kIndexerLanes; ++j) {
        if (d0 + j < dim) {
          p[j] = __fadd_rn(p[j], __fmul_rn(indexer_widen(__ldg(qb + h * dim + d0 + j)), indexer_widen(key[d0 + j])));
        }
      }
    }
    const float dot = __fadd_rn(__fadd_rn(__fadd_rn(p[0], p[1]), __fadd_rn(p[2], p[3])),
                                __fadd_rn(__fadd_rn(p[4], p[5]), __fadd_rn(p[6], p[7])));
    score = __fadd_rn(score, __fmul_rn(__ldg(weights + b * heads + h), indexer_relu(dot)));
  }
  scores[b * n + s] = score;
}

struct IndexerPlan {
  size_t scores = 0, topk = 0, topk_bytes = 0, total = 0;
};

IndexerPlan plan_indexer(int64_t batch, int64_t n, int64_t k) {
  IndexerPlan p;
  ScratchCursor cur;
  p.scores = cur.take(size_t(batch * n) * sizeof(float));
  p.topk_bytes = topk_scratch_bytes(DType::float32, batch, n, k);
  p.topk = cur.take(p.topk_bytes);
  p.total = cur.used;
  return p;
}

}  // namespace

size_t indexer_scratch_bytes(int64_t batch, int64_t n, int64_t k) { return plan_indexer(batch, n, k).total; }

bool indexer_uses_tensor_cores(DType dtype, int64_t heads, int64_t dim) {
#if defined(JAX_TOPK_HAS_WMMA)
  const bool dim_fits = dim >= kMmaTile && dim <= kMmaMaxDim && (dim & (dim - 1)) == 0;  // 16, 32, 64, 128
  return dtype == DType::bfloat16 && heads % kMmaTile == 0 && heads > 0 && dim_fits &&
         mma_smem_bytes(heads, dim) <= 200 * 1024;
#else
  (void)dtype, (void)heads, (void)dim;
  return false;  // HIP: the exact kernel scores every shape
#endif
}

gpuError_t indexer_top_k(DType dtype, const void* q, const void* keys, const float* weights,
                          const int32_t* lengths, int64_t batch, int64_t heads, int64_t n, int64_t dim, int64_t k,
                          float* scores, int32_t* ids, void* scratch, size_t scratch_bytes, gpuStream_t stream) {
  if (!is_indexer_dtype(dtype) || batch < 0 || heads < 0 || dim < 0 || k < 0 || k > n || n > INT32_MAX ||
      batch > 65535 || heads > INT32_MAX || dim > INT32_MAX) {
    return gpuErrorInvalidValue;
  }
  if (batch == 0 || k == 0) return gpuSuccess;
  const IndexerPlan plan = plan_indexer(batch, n, k);
  if (scratch_bytes < plan.total) return gpuErrorInvalidValue;
  float* all_scores = at<float>(scratch, plan.scores);
#if defined(JAX_TOPK_HAS_WMMA)
  if (indexer_uses_tensor_cores(dtype, heads, dim)) {
    const size_t smem = mma_smem_bytes(heads, dim);
    gpuError_t err = gpu_set_max_dynamic_smem(indexer_scores_mma_kernel, int(smem));
    if (err != gpuSuccess) return err;
    const int64_t per_block = int64_t(kMmaKeysPerStep) * kMmaStepsPerBlock;
    const dim3 grid(unsigned((n + per_block - 1) / per_block), unsigned(batch));
    indexer_scores_mma_kernel<<<grid, kMmaThreads, smem, stream>>>(
        static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(keys), weights, lengths, int(heads),
        n, int(dim), all_scores);
  } else
#endif
  {
    const dim3 grid(unsigned((n + kExactThreads - 1) / kExactThreads), unsigned(batch));
    if (dtype == DType::float32) {
      indexer_scores_exact_kernel<float><<<grid, kExactThreads, 0, stream>>>(
          static_cast<const float*>(q), static_cast<const float*>(keys), weights, lengths, int(heads), n, int(dim),
          all_scores);
    } else {
      indexer_scores_exact_kernel<uint16_t><<<grid, kExactThreads, 0, stream>>>(
          static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(keys), weights, lengths, int(heads), n,
          int(dim), all_scores);
    }
  }
  gpuError_t err = gpuGetLastError();
  if (err != gpuSuccess) return err;
  return topk_rows(DType::float32, all_scores, scores, ids, batch, n, k, lengths, at<void>(scratch, plan.topk),
                   plan.topk_bytes, stream);
}

}  // namespace jax_topk::cuda
