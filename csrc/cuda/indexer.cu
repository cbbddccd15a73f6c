// CUDA sparse-attention indexer: the scores of every key into a [batch, n]
// float32 scratch, then the top-k kernels over each row's first length keys.
//
// Two score kernels; which one runs depends on (dtype, heads, dim) only:
// - indexer_scores_mma_kernel (bfloat16, heads a multiple of 16 up to 128,
//   dim 16, 32, 64 or 128): a block takes one item's queries and scores 512
//   of its keys, 64 at a time, double-buffered in shared memory by cp.async.
//   Two warps per head tile t hold heads 16t..16t+15 as mma.sync A
//   fragments in registers for the whole block; each forms their dots with
//   half of each step's 64 keys on tensor cores (m16n8k16, float32
//   accumulators, dim in steps of 16 in increasing order). Each thread then
//   has two heads (g, g + 8) of two keys: it adds
//   w[g] relu(dot_g) + w[g+8] relu(dot_g+8), the 8 lanes of a key combine
//   theirs by an xor butterfly (lane bits 4, 8, 16), and one thread per key
//   adds the head tiles' sums in tile order. Every step of that order is fixed
//   and the MMA's rounding is the hardware's: a key's score depends on its
//   item's q, weights and its own key only (batch-invariant), not bit-equal
//   to the CPU's order.
// - indexer_scores_exact_kernel (any shape, float32 or bfloat16): one thread
//   per key, the order of indexer.h with explicitly rounded products and sums
//   (no FMA contraction): bit-identical to the CPU kernel.

#include <climits>
#include <cstdint>

#include "cuda/indexer_cuda.h"
#include "cuda/scratch.h"
#include "cuda/topk_cuda.h"
#include "jax_topk/indexer.h"

namespace jax_topk::cuda {
namespace {

constexpr int kMmaHeadTile = 16;        // heads per warp: the m of m16n8k16
constexpr int kMmaMaxHeadTiles = 8;     // heads <= 128
// Warps per head tile: each takes its share of a step's 64 keys. Measured on
// an H200 (ncu, 31 rows of 32K..64K keys, H = 64, D = 128): the score kernel
// 175-179 us with 2 against 186 with 1, which left 16 of 64 warp slots per
// SM busy; the indexer call 163.3-165.7 against 177.6 us.
constexpr int kMmaKeySplit = 2;
constexpr int kMmaStepKeys = 64;        // keys per step: 8 n-tiles of 8
// 512 keys per block: the queries are loaded once per 512 keys. (256 for
// short batches, to spread 31 items of 2000..8000 keys over more blocks,
// measured no faster: 49.8 -> 51.5 us.)
constexpr int kMmaStepsPerBlock = 8;
constexpr int kMmaMaxDim = 128;
// Shared-memory rows of q and keys are padded by 16 bytes: the 8 rows an
// ldmatrix reads then start in 8 different bank quads (rows of 256 bytes
// would all start in bank 0).
constexpr int kMmaRowPad = 8;
constexpr int kExactThreads = 128;

#if defined(JAX_TOPK_HAS_MMA)
// Dynamic shared memory of the MMA kernel: the item's queries [heads][dim +
// pad] and two steps of keys [2][64][dim + pad] (bfloat16), each warp's key
// sums [warps][64] and the weights (float32).
size_t mma_smem_bytes(int64_t heads, int64_t dim) {
  return size_t((heads + 2 * kMmaStepKeys) * (dim + kMmaRowPad)) * 2 +
         size_t(heads / kMmaHeadTile * kMmaStepKeys + heads) * 4;
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit elements from shared memory: lanes 8i..8i+7
// give the row addresses of matrix i; register i holds matrix i's fragment.
__device__ __forceinline__ void load_matrices_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

// d += a (16x16, row-major) * b (16x8, column-major), bfloat16 in, float32 out.
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared without registers; zeros when !valid (no read).
__device__ __forceinline__ void copy_async_16(uint32_t shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

template <int kDim>
__global__ void __launch_bounds__(kMmaMaxHeadTiles * 32 * kMmaKeySplit)
    indexer_scores_mma_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ keys,
                              const float* __restrict__ weights, const int32_t* __restrict__ lengths, int heads,
                              int64_t n, float* __restrict__ scores) {
  constexpr int kStride = kDim + kMmaRowPad;  // elements per shared row
  constexpr int kVecs = kDim / 8;             // 16-byte vectors per row
  constexpr int kSteps = kDim / 16;           // MMA k-steps over dim
  extern __shared__ uint4 indexer_smem[];
  uint16_t* q_s = reinterpret_cast<uint16_t*>(indexer_smem);
  uint16_t* keys_s = q_s + heads * kStride;
  // Warp w: head tile w % tiles, and part w / tiles of each step's 64 keys.
  const int tiles = heads / kMmaHeadTile;
  constexpr int kPartKeys = kMmaStepKeys / kMmaKeySplit;
  float* sums_s = reinterpret_cast<float*>(keys_s + 2 * kMmaStepKeys * kStride);
  float* w_s = sums_s + tiles * kMmaStepKeys;
  const int threads = tiles * kMmaKeySplit * 32;
  const int64_t b = blockIdx.y;
  const int64_t len = min(max(int64_t(__ldg(lengths + b)), int64_t(0)), n);
  const int64_t first = int64_t(blockIdx.x) * kMmaStepKeys * kMmaStepsPerBlock;
  if (first >= len) return;  // uniform: keys past the length are never read
  const int steps = int(min(int64_t(kMmaStepsPerBlock), (len - first + kMmaStepKeys - 1) / kMmaStepKeys));
  const uint16_t* keys_b = keys + b * n * kDim;

  auto load_step = [&](int step) {  // the step's 64 keys (zeros past the length) into buffer step % 2
    const int64_t s0 = first + int64_t(step) * kMmaStepKeys;
    uint16_t* dst = keys_s + (step & 1) * kMmaStepKeys * kStride;
    for (int i = int(threadIdx.x); i < kMmaStepKeys * kVecs; i += threads) {
      const int key = i / kVecs, vec = i % kVecs;
      const bool valid = s0 + key < len;
      copy_async_16(shared_address(dst + key * kStride + vec * 8), keys_b + (valid ? s0 + key : 0) * kDim + vec * 8,
                    valid);
    }
    copy_async_commit();
  };
  load_step(0);
  const uint4* q_src = reinterpret_cast<const uint4*>(q + b * heads * kDim);
  for (int i = int(threadIdx.x); i < heads * kVecs; i += threads) {
    *reinterpret_cast<uint4*>(q_s + (i / kVecs) * kStride + (i % kVecs) * 8) = __ldg(q_src + i);
  }
  for (int h = int(threadIdx.x); h < heads; h += threads) w_s[h] = __ldg(weights + b * heads + h);
  __syncthreads();

  const int head_tile = int(threadIdx.x) / 32 % tiles, part = int(threadIdx.x) / 32 / tiles;
  const int lane = int(threadIdx.x) % 32;
  // This warp's 16 heads over all of dim, as A fragments (matrices: rows
  // 0-7 / 8-15 by lane bit 3, dims 0-7 / 8-15 by lane bit 4).
  uint32_t a[kSteps][4];
  const uint16_t* a_row = q_s + (head_tile * kMmaHeadTile + ((lane >> 3) & 1) * 8 + (lane & 7)) * kStride + (lane >> 4) * 8;
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) load_matrices_x4(a[ks], shared_address(a_row + ks * 16));
  // Accumulator rows: heads g and g + 8 of the warp's tile; columns: keys 2c, 2c + 1 of each n-tile.
  const int g = lane >> 2, c = lane & 3;
  const float w_low = w_s[head_tile * kMmaHeadTile + g], w_high = w_s[head_tile * kMmaHeadTile + g + 8];

  for (int step = 0; step < steps; ++step) {
    if (step + 1 < steps) {  // uniform
      load_step(step + 1);   // into the buffer the previous step read (all warps passed its last barrier)
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();  // this step's keys are in shared memory for every warp
    const uint16_t* keys_step = keys_s + ((step & 1) * kMmaStepKeys + part * kPartKeys) * kStride;
    float acc[kPartKeys / 8][4] = {};
    // B matrices of a pair of n-tiles: keys 0-7 / 8-15 by lane bit 4, dims 0-7 / 8-15 by lane bit 3.
    const uint16_t* b_row = keys_step + ((lane >> 4) * 8 + (lane & 7)) * kStride + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
#pragma unroll
      for (int pair = 0; pair < kPartKeys / 16; ++pair) {
        uint32_t bm[4];
        load_matrices_x4(bm, shared_address(b_row + pair * 16 * kStride + ks * 16));
        mma_bf16_m16n8k16(acc[2 * pair], a[ks], bm[0], bm[1]);
        mma_bf16_m16n8k16(acc[2 * pair + 1], a[ks], bm[2], bm[3]);
      }
    }
    // The warp's 16 heads of each key, in the fixed order above.
#pragma unroll
    for (int tile = 0; tile < kPartKeys / 8; ++tile) {
      float sum[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        sum[j] = __fadd_rn(__fmul_rn(w_low, indexer_relu(acc[tile][j])),
                           __fmul_rn(w_high, indexer_relu(acc[tile][2 + j])));
#pragma unroll
        for (int offset = 4; offset < 32; offset *= 2) sum[j] = __fadd_rn(sum[j], warp_shfl_xor(sum[j], offset));
      }
      if (g == 0) {
        sums_s[head_tile * kMmaStepKeys + part * kPartKeys + tile * 8 + 2 * c] = sum[0];
        sums_s[head_tile * kMmaStepKeys + part * kPartKeys + tile * 8 + 2 * c + 1] = sum[1];
      }
    }
    __syncthreads();
    const int64_t s0 = first + int64_t(step) * kMmaStepKeys;
    for (int key = int(threadIdx.x); key < kMmaStepKeys; key += threads) {
      if (s0 + key < len) {
        float score = sums_s[key];
        for (int w = 1; w < tiles; ++w) score = __fadd_rn(score, sums_s[w * kMmaStepKeys + key]);
        scores[b * n + s0 + key] = score;
      }
    }
  }
}

// The launch for a head count and dim that indexer_uses_tensor_cores accepts.
template <int kDim>
gpuError_t launch_mma_scores(const void* q, const void* keys, const float* weights, const int32_t* lengths,
                             int64_t batch, int64_t heads, int64_t n, float* scores, gpuStream_t stream) {
  const size_t smem = mma_smem_bytes(heads, kDim);
  gpuError_t err = gpu_set_max_dynamic_smem(indexer_scores_mma_kernel<kDim>, int(smem));
  if (err != gpuSuccess) return err;
  const int64_t per_block = int64_t(kMmaStepKeys) * kMmaStepsPerBlock;
  const dim3 grid(unsigned((n + per_block - 1) / per_block), unsigned(batch));
  indexer_scores_mma_kernel<kDim><<<grid, unsigned(heads / kMmaHeadTile * 32 * kMmaKeySplit), smem, stream>>>(
      static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(keys), weights, lengths, int(heads), n, scores);
  return gpuGetLastError();
}

gpuError_t launch_mma_scores_for_dim(const void* q, const void* keys, const float* weights, const int32_t* lengths,
                                     int64_t batch, int64_t heads, int64_t n, int64_t dim, float* scores,
                                     gpuStream_t stream) {
  switch (dim) {
    case 16: return launch_mma_scores<16>(q, keys, weights, lengths, batch, heads, n, scores, stream);
    case 32: return launch_mma_scores<32>(q, keys, weights, lengths, batch, heads, n, scores, stream);
    case 64: return launch_mma_scores<64>(q, keys, weights, lengths, batch, heads, n, scores, stream);
    case kMmaMaxDim: return launch_mma_scores<kMmaMaxDim>(q, keys, weights, lengths, batch, heads, n, scores, stream);
    default: return gpuErrorInvalidValue;  // indexer_uses_tensor_cores admits no other
  }
}

#endif  // JAX_TOPK_HAS_MMA

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
#if defined(JAX_TOPK_HAS_MMA)
  const bool dim_fits = dim == 16 || dim == 32 || dim == 64 || dim == kMmaMaxDim;
  return dtype == DType::bfloat16 && heads % kMmaHeadTile == 0 && heads > 0 &&
         heads <= kMmaHeadTile * kMmaMaxHeadTiles && dim_fits;
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
#if defined(JAX_TOPK_HAS_MMA)
  if (indexer_uses_tensor_cores(dtype, heads, dim)) {
    gpuError_t err = launch_mma_scores_for_dim(q, keys, weights, lengths, batch, heads, n, dim, all_scores, stream);
    if (err != gpuSuccess) return err;
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
