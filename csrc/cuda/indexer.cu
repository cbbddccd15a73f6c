// CUDA sparse-attention indexer: the score of every key, then each row's k
// best of its first length keys.
//
// Two score kernels; which one runs depends on (dtype, heads, dim) only:
// - indexer_scores_mma_kernel (bfloat16, heads a multiple of 16 up to 128,
//   dim 16, 32, 64 or 128): a block takes one item's queries and scores a
//   chunk of its keys, 64 at a time, double-buffered in shared memory by
//   cp.async. Two warps per head tile t hold heads 16t..16t+15 as mma.sync A
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
//
// Where the scores go (IndexerFusion in indexer.h; plan_indexer decides):
// both kernels hand each finished score to an epilogue. ScoresToMemory
// writes it to a [batch, n] float32 scratch, and the top-k kernels select
// from it. ChunkTopK (fused, for k << n) keeps the chunk's k best as the
// block goes: scores above a threshold T are appended to a buffer in shared
// memory, and whenever the buffer outgrows its capacity G the block keeps its
// k best and T becomes the k-th of them (T only rises to the k-th best of a
// subset of the chunk, so the chunk's k best are never dropped). At the end
// the block writes its chunk's k best, best first, to slots [chunk * k,
// chunk * k + k) of its row's candidates. A top-k over each row's candidates
// and a gather of their key indices finish: ties in the top-k go to the lower
// slot, and slot order is key order among equal scores (chunks in key order,
// each best first with lower keys first among equals), so the result is the
// unfused one bit for bit.

#include <climits>
#include <cstdint>
#include <type_traits>

#include "cuda/device_info.h"
#include "cuda/indexer_cuda.h"
#include "cuda/mma.cuh"
#include "cuda/scratch.h"
#include "cuda/topk_cuda.h"
#include "cuda/topk_threshold.cuh"
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
// Unfused, 512 keys per block: the queries are loaded once per 512 keys.
// (256 for short batches, to spread 31 items of 2000..8000 keys over more
// blocks, measured no faster: 49.8 -> 51.5 us.)
constexpr int kMmaStepsPerBlock = 8;
constexpr int kMmaMaxDim = 128;
// Shared-memory rows of q and keys are padded by 16 bytes: the 8 rows an
// ldmatrix reads then start in 8 different bank quads (rows of 256 bytes
// would all start in bank 0).
constexpr int kMmaRowPad = 8;
constexpr int kExactThreads = 128;
// The fused epilogue's histogram (block_keep_k_largest's select passes, then
// block_rank_desc's buckets: both fit kRadixBins words).
constexpr size_t kChunkHistBytes = size_t(kRadixBins) * sizeof(uint32_t);
static_assert(kThresholdSelectWords <= kRadixBins && kRankBuckets <= kRadixBins,
              "the chunk histogram holds the select's and the rank's bins");
// The exact kernel's fused buffer: G = 1024 candidates (k <= G / 4).
constexpr int64_t kExactFusedCapacity = 1024;

// What a fused kernel takes: its block's threads, its buffer's capacity G
// (past it the block keeps its k best), the largest k (0: no fused kernel).
struct FusedShape {
  int threads = 0;
  int64_t capacity = 0;
  int64_t max_k = 0;
};

// ---------------------------------------------------------------------------
// Epilogues: where a score kernel's scores go. Every thread of the block calls
// begin() first, then, at the start of each step, step_barrier(idle): a block
// barrier (the previous step's offers are visible after it) at which the
// epilogue may reorganise its buffer, in `idle`: shared memory the kernel
// does not touch until after the barrier. In the step, one thread per key
// (whole warps: ChunkTopK uses warp collectives) calls offer(valid, score, key
// index). After the last step every thread calls finish(idle, idle_values),
// idle then holding kChunkHistBytes and idle_values u64.

// Unfused: every score to the [batch, n] scratch.
struct ScoresToMemory {
  float* scores;  // [batch, n]
  struct Block {
    float* row;
    __device__ JAX_TOPK_FORCE_INLINE void begin() {}
    __device__ JAX_TOPK_FORCE_INLINE void step_barrier(void*) { __syncthreads(); }
    __device__ JAX_TOPK_FORCE_INLINE void offer(bool valid, float score, uint32_t s) {
      if (valid) row[s] = score;
    }
    __device__ JAX_TOPK_FORCE_INLINE void finish(void*, int) {}
  };
  __device__ JAX_TOPK_FORCE_INLINE void row_start(int64_t, int64_t) const {}
  __device__ JAX_TOPK_FORCE_INLINE Block block(int64_t b, int64_t n, int64_t, uint64_t*) const {
    return Block{scores + b * n};
  }
};

// A fused block's shared state (static shared memory of the kernels that
// instantiate ChunkTopK only).
template <int kThreads>
struct ChunkShared {
  ThresholdShared ts;  // ts.candidates: the buffer's count
  BlockRankShared<kThreads> rank;
};
template <int kThreads>
__device__ JAX_TOPK_FORCE_INLINE ChunkShared<kThreads>& chunk_shared() {
  __shared__ ChunkShared<kThreads> shared;
  return shared;
}

// Fused (k << n): each block keeps its chunk's k best; kThreads: the block's
// threads. Candidates of row b: scores[b, c * k + j] and ids[b, c * k + j] for
// chunk c, j < k, best first (score -inf and id -1 past the chunk's keys);
// counts[b] of them are real, all in front (every chunk but the row's last
// holds at least k keys).
template <int kThreads>
struct ChunkTopK {
  float* scores;      // [batch, cand_n]
  int32_t* ids;       // [batch, cand_n]
  int32_t* counts;    // [batch]
  int64_t cand_n;     // chunks * k
  int64_t chunk_keys;
  uint32_t k;
  uint32_t capacity;  // G: past G buffered candidates the block keeps its k best
  KeyCodec<uint32_t> codec;

  struct Block {
    uint64_t* buffer;  // capacity + one step's keys, packed (key, ~index)
    uint32_t* out_scores;
    int32_t* out_ids;
    uint32_t k, capacity;
    KeyCodec<uint32_t> codec;
    uint64_t t;             // every buffered candidate is >= t; the chunk's k best are > t or = t
    uint32_t reserved_end;  // the buffer's count after this warp's last reservation

    __device__ JAX_TOPK_FORCE_INLINE void begin() {
      if (threadIdx.x == 0) chunk_shared<kThreads>().ts.candidates = 0;
    }
    // The warp that reserved last saw the count: past the capacity (the next
    // step could overflow the buffer), keep the k best.
    __device__ JAX_TOPK_FORCE_INLINE void step_barrier(void* idle) {
      const bool over = reserved_end > capacity;
      reserved_end = 0;
      if (__syncthreads_or(over)) t = keep_k_best(idle);  // uniform
    }
    __device__ JAX_TOPK_FORCE_INLINE void offer(bool valid, float score, uint32_t s) {
      const uint64_t p = KeyIndexPacking<uint32_t, uint64_t>::pack(codec.key(__float_as_uint(score)), s);
      const bool take = valid && p > t;  // p != t: packed values are distinct
      uint32_t end = 0;
      const uint32_t slot = reserve_slot(&chunk_shared<kThreads>().ts.candidates, take, &end);
      if (take) buffer[slot] = p;
      reserved_end = max(reserved_end, end);
    }
    // The buffer's k best stay (in no order); returns the k-th of them.
    __device__ JAX_TOPK_FORCE_INLINE uint64_t keep_k_best(void* idle) {
      ChunkShared<kThreads>& cs = chunk_shared<kThreads>();
      uint32_t* hist = static_cast<uint32_t*>(idle);
      uint64_t* tmp = reinterpret_cast<uint64_t*>(hist + kRadixBins);
      return block_keep_k_largest<kThreads>(buffer, &cs.ts.candidates, k, tmp, hist, cs.ts);
    }
    // The chunk's k best (fewer only in a chunk of fewer keys), best first:
    // each candidate's rank among all c is its slot when below k, without a
    // select first where the c fit the scratch (block_rank_desc); else, or
    // where ranking falls back to a sort, keep the k best and order those.
    __device__ JAX_TOPK_FORCE_INLINE void finish(void* idle, int idle_values) {
      ChunkShared<kThreads>& cs = chunk_shared<kThreads>();
      uint32_t* hist = static_cast<uint32_t*>(idle);
      uint64_t* spans = reinterpret_cast<uint64_t*>(hist + kRadixBins);
      __syncthreads();  // the last step's candidates are visible
      uint32_t c = cs.ts.candidates;
      const uint32_t pad_bits = DTypeTraits<DType::float32>::kLowestBits;
      if (c <= uint32_t(idle_values) &&  // uniform
          try_write_candidates_by_rank<uint32_t, kThreads>(buffer, int(c), k, spans, hist, cs.rank, codec,
                                                           pad_bits, out_scores, out_ids)) {
        return;
      }
      if (c > k) {  // uniform
        block_keep_k_largest<kThreads>(buffer, &cs.ts.candidates, k, spans, hist, cs.ts);
        c = k;
      }
      write_candidates_by_rank<uint32_t, kThreads>(buffer, int(c), k, spans, hist, cs.rank, codec, pad_bits,
                                                   out_scores, out_ids);
    }
  };

  // Row b's count of real candidates: every chunk but the last gives k.
  __device__ JAX_TOPK_FORCE_INLINE void row_start(int64_t b, int64_t len) const {
    const int64_t full = len / chunk_keys, rest = len % chunk_keys;
    counts[b] = int32_t(full * k + min(rest, int64_t(k)));
  }
  __device__ JAX_TOPK_FORCE_INLINE Block block(int64_t b, int64_t, int64_t chunk, uint64_t* buffer) const {
    const int64_t at = b * cand_n + chunk * k;
    return Block{buffer, reinterpret_cast<uint32_t*>(scores + at), ids + at, k, capacity, codec, 0, 0};
  }
};

#if defined(JAX_TOPK_HAS_MMA)
// Dynamic shared memory of the MMA kernel: the item's queries [heads][dim +
// pad] and two steps of keys [2][64][dim + pad] (bfloat16), each warp's key
// sums [warps][64] and the weights (float32). Once every warp holds its A
// fragments, the fused epilogue's buffer takes the queries' place; its
// scratch is the half of the keys the block is not loading into
// (step_barrier) or both halves (finish).
constexpr size_t mma_query_bytes(int64_t heads, int64_t dim) { return size_t(heads * (dim + kMmaRowPad)) * 2; }
constexpr size_t mma_key_half_bytes(int64_t dim) { return size_t(kMmaStepKeys * (dim + kMmaRowPad)) * 2; }
size_t mma_smem_bytes(int64_t heads, int64_t dim) {
  return mma_query_bytes(heads, dim) + 2 * mma_key_half_bytes(dim) +
         size_t(heads / kMmaHeadTile * kMmaStepKeys + heads) * 4;
}

// The MMA kernels' body, for either epilogue.
template <int kDim, typename Out>
__device__ JAX_TOPK_FORCE_INLINE void mma_scores(const uint16_t* __restrict__ q, const uint16_t* __restrict__ keys,
                                                 const float* __restrict__ weights,
                                                 const int32_t* __restrict__ lengths, int heads, int64_t n,
                                                 int64_t items_per_keys, int steps_per_block, const Out& out) {
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
  if (blockIdx.x == 0 && threadIdx.x == 0) out.row_start(b, len);
  const int64_t first = int64_t(blockIdx.x) * kMmaStepKeys * steps_per_block;
  if (first >= len) return;  // uniform: keys past the length are never read
  const int steps = int(min(int64_t(steps_per_block), (len - first + kMmaStepKeys - 1) / kMmaStepKeys));
  const uint16_t* keys_b = keys + b / items_per_keys * n * kDim;
  auto epilogue = out.block(b, n, blockIdx.x, reinterpret_cast<uint64_t*>(q_s));

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
  epilogue.begin();
  __syncthreads();

  const int head_tile = int(threadIdx.x) / 32 % tiles, part = int(threadIdx.x) / 32 / tiles;
  const int lane = int(threadIdx.x) % 32;
  // This warp's 16 heads over all of dim, as A fragments (matrices: rows
  // 0-7 / 8-15 by lane bit 3, dims 0-7 / 8-15 by lane bit 4). From the first
  // step's barrier on, the queries' shared memory is the epilogue's.
  uint32_t a[kSteps][4];
  const uint16_t* a_row = q_s + (head_tile * kMmaHeadTile + ((lane >> 3) & 1) * 8 + (lane & 7)) * kStride + (lane >> 4) * 8;
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) load_matrices_x4(a[ks], shared_address(a_row + ks * 16));
  // Accumulator rows: heads g and g + 8 of the warp's tile; columns: keys 2c, 2c + 1 of each n-tile.
  const int g = lane >> 2, c = lane & 3;
  const float w_low = w_s[head_tile * kMmaHeadTile + g], w_high = w_s[head_tile * kMmaHeadTile + g + 8];

  for (int step = 0; step < steps; ++step) {
    uint16_t* keys_read = keys_s + (step & 1) * kMmaStepKeys * kStride;
    uint16_t* keys_next = keys_s + ((step + 1) & 1) * kMmaStepKeys * kStride;
    copy_async_wait<0>();
    // This step's keys are in shared memory for every warp; the previous
    // step's are read and its offers made: the other half is idle until the
    // next step's keys are asked for, after the barrier.
    epilogue.step_barrier(keys_next);
    if (step + 1 < steps) load_step(step + 1);  // uniform; in flight during this step's MMA
    const uint16_t* keys_step = keys_read + part * kPartKeys * kStride;
    float acc[kPartKeys / 8][4] = {};
    // B matrices of a pair of n-tiles: keys 0-7 / 8-15 by lane bit 4, dims 0-7 / 8-15 by lane bit 3.
    const uint16_t* b_row = keys_step + ((lane >> 4) * 8 + (lane & 7)) * kStride + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
#pragma unroll
      for (int pair = 0; pair < kPartKeys / 16; ++pair) {
        uint32_t bm[4];
        load_matrices_x4(bm, shared_address(b_row + pair * 16 * kStride + ks * 16));
        mma_m16n8k16(acc[2 * pair], a[ks], bm[0], bm[1]);
        mma_m16n8k16(acc[2 * pair + 1], a[ks], bm[2], bm[3]);
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
    __syncthreads();  // the step's sums are complete
    const int64_t s0 = first + int64_t(step) * kMmaStepKeys;
    // Threads 0..63 (whole warps: threads >= 64), one key each.
    for (int key = int(threadIdx.x); key < kMmaStepKeys; key += threads) {
      float score = sums_s[key];
      for (int w = 1; w < tiles; ++w) score = __fadd_rn(score, sums_s[w * kMmaStepKeys + key]);
      epilogue.offer(s0 + key < len, score, uint32_t(s0 + key));
    }
  }
  // Both halves of the keys are idle (after finish's first barrier).
  epilogue.finish(keys_s, int((2 * mma_key_half_bytes(kDim) - kChunkHistBytes) / 8));
}

// Unfused: any head count (up to 512 threads).
template <int kDim>
__global__ void __launch_bounds__(kMmaMaxHeadTiles * 32 * kMmaKeySplit)
    indexer_scores_mma_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ keys,
                              const float* __restrict__ weights, const int32_t* __restrict__ lengths, int heads,
                              int64_t n, int64_t items_per_keys, int steps_per_block, ScoresToMemory out) {
  mma_scores<kDim>(q, keys, weights, lengths, heads, n, items_per_keys, steps_per_block, out);
}

// Fused: blocks of kThreads (4 * heads) and 64 registers, so that 1024
// threads fit on an SM as unfused (ptxas gave 88 registers unbounded, two
// blocks of 256 threads per SM; bounded, a few bytes spill, in the select and
// rank; out-of-line select and rank calls spilled more).
template <int kDim, int kThreads>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads)
    indexer_fused_mma_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ keys,
                             const float* __restrict__ weights, const int32_t* __restrict__ lengths, int heads,
                             int64_t n, int64_t items_per_keys, int steps_per_block, ChunkTopK<kThreads> out) {
  mma_scores<kDim>(q, keys, weights, lengths, heads, n, items_per_keys, steps_per_block, out);
}

// The fused MMA kernel's shapes (FusedShape): dim 64 or 128 and 32, 64 or 128 heads
// (blocks of 4 * heads threads, a power of two), the buffer in the queries'
// shared memory (G: a power of two, room for G + a step), its scratch in half
// of the keys' (the histogram and k values): k <= G / 4.
constexpr FusedShape fused_mma_shape(int64_t heads, int64_t dim) {
  if ((dim != 64 && dim != 128) || (heads != 32 && heads != 64 && heads != 128)) return {};
  int64_t g = 1;
  while (2 * g + kMmaStepKeys <= int64_t(mma_query_bytes(heads, dim) / 8)) g *= 2;
  const int64_t scratch_k = int64_t((mma_key_half_bytes(dim) - kChunkHistBytes) / 8);
  return {int(heads / kMmaHeadTile * kMmaKeySplit * 32), g, g / 4 < scratch_k ? g / 4 : scratch_k};
}
static_assert(fused_mma_shape(64, 128).capacity == 2048 && fused_mma_shape(64, 128).max_k == 512, "the layout");
static_assert(fused_mma_shape(32, 64).max_k == 128 && fused_mma_shape(128, 128).max_k == 1024, "the layout");
#endif  // JAX_TOPK_HAS_MMA

// One key's score in the order of indexer.h.
template <typename T>
__device__ JAX_TOPK_FORCE_INLINE float exact_score(const T* __restrict__ qb, const T* __restrict__ key,
                                                   const float* __restrict__ wb, int heads, int dim) {
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
    score = __fadd_rn(score, __fmul_rn(__ldg(wb + h), indexer_relu(dot)));
  }
  return score;
}

// A block scores steps_per_block steps of kExactThreads keys of item
// blockIdx.y, one key per thread and step. Fused, its dynamic shared memory
// is the epilogue's buffer (G + a step) and scratch (the histogram, G values).
template <typename T, typename Out>
__global__ void __launch_bounds__(kExactThreads)
    indexer_scores_exact_kernel(const T* __restrict__ q, const T* __restrict__ keys,
                                const float* __restrict__ weights, const int32_t* __restrict__ lengths,
                                int heads, int64_t n, int dim, int64_t items_per_keys, int steps_per_block,
                                int64_t capacity, Out out) {
  extern __shared__ uint4 indexer_smem[];
  uint64_t* buffer = reinterpret_cast<uint64_t*>(indexer_smem);
  void* scratch = buffer + capacity + kExactThreads;
  const int64_t b = blockIdx.y;
  const int64_t len = min(max(int64_t(__ldg(lengths + b)), int64_t(0)), n);
  if (blockIdx.x == 0 && threadIdx.x == 0) out.row_start(b, len);
  const int64_t first = int64_t(blockIdx.x) * kExactThreads * steps_per_block;
  if (first >= len) return;  // uniform
  const int steps = int(min(int64_t(steps_per_block), (len - first + kExactThreads - 1) / kExactThreads));
  auto epilogue = out.block(b, n, blockIdx.x, buffer);
  epilogue.begin();
  const T* qb = q + b * heads * dim;
  for (int step = 0; step < steps; ++step) {
    // Unfused, no thread waits on another: only the fused epilogue syncs.
    if constexpr (!std::is_same_v<Out, ScoresToMemory>) epilogue.step_barrier(scratch);
    const int64_t s = first + int64_t(step) * kExactThreads + threadIdx.x;
    const bool valid = s < len;
    const float score =
        valid ? exact_score(qb, keys + (b / items_per_keys * n + s) * dim, weights + b * heads, heads, dim) : 0.0f;
    epilogue.offer(valid, score, uint32_t(s));
  }
  epilogue.finish(scratch, int(capacity + kExactThreads));
}

// The exact kernel's fused dynamic shared memory: the buffer (G + a step),
// the histogram, and room for a ranking of every buffered candidate.
size_t exact_fused_smem_bytes(int64_t capacity) {
  return size_t(capacity + kExactThreads) * 8 + kChunkHistBytes + size_t(capacity + kExactThreads) * 8;
}

// ids[b, j] holds a slot of row b's candidates (or -1): its key index.
__global__ void gather_candidate_ids_kernel(int32_t* __restrict__ ids, const int32_t* __restrict__ cand_ids,
                                            int64_t batch, int64_t cand_n, int64_t k) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= batch * k) return;
  const int32_t slot = ids[i];
  ids[i] = slot < 0 ? -1 : __ldg(cand_ids + (i / k) * cand_n + slot);
}

// How one call runs, planned on the host (workspace size and launch agree).
struct IndexerPlan {
  bool tensor_cores = false;
  bool fused = false;
  int threads = 0;          // fused blocks' threads
  int64_t step_keys = 0;    // keys a block scores per step
  int64_t chunk_keys = 0;   // keys per block
  int64_t capacity = 0;     // fused: G
  int64_t select_n = 0;     // the top-k's row length: n, or the candidates (chunks * k)
  int64_t items_per_keys = 1;  // item b reads key set b / items_per_keys
  size_t scores = 0, cand_ids = 0, counts = 0, topk = 0, topk_bytes = 0, total = 0;
};

FusedShape fused_shape(bool tensor_cores, int64_t heads, int64_t dim) {
#if defined(JAX_TOPK_HAS_MMA)
  if (tensor_cores) return fused_mma_shape(heads, dim);
#else
  (void)heads, (void)dim;
#endif
  return tensor_cores ? FusedShape{} : FusedShape{kExactThreads, kExactFusedCapacity, kExactFusedCapacity / 4};
}

IndexerPlan plan_indexer(DType dtype, int64_t batch, int64_t heads, int64_t n, int64_t dim, int64_t k,
                         IndexerFusion fusion) {
  IndexerPlan p;
  p.tensor_cores = indexer_uses_tensor_cores(dtype, heads, dim);
  p.step_keys = p.tensor_cores ? kMmaStepKeys : kExactThreads;
  const FusedShape shape = fused_shape(p.tensor_cores, heads, dim);
  const bool holds = k >= 1 && k <= shape.max_k;
  p.fused = holds && (fusion == IndexerFusion::kFused ||
                      (fusion == IndexerFusion::kAuto && indexer_auto_fuses(batch, n, k)));
  DeviceInfo dev;
  if (p.fused && query_device(&dev) != gpuSuccess) p.fused = false;
  if (p.fused) {
    p.threads = shape.threads;
    p.capacity = shape.capacity;
    p.chunk_keys = indexer_fused_chunk(batch, n, k, p.step_keys, dev.sm_count);
    p.select_n = (n + p.chunk_keys - 1) / p.chunk_keys * k;
  } else {
    p.chunk_keys = p.tensor_cores ? int64_t(kMmaStepKeys) * kMmaStepsPerBlock : kExactThreads;
    p.select_n = n;
  }
  ScratchCursor cur;
  p.scores = cur.take(size_t(batch * p.select_n) * sizeof(float));
  if (p.fused) {
    p.cand_ids = cur.take(size_t(batch * p.select_n) * sizeof(int32_t));
    p.counts = cur.take(size_t(batch) * sizeof(int32_t));
  }
  p.topk_bytes = topk_scratch_bytes(DType::float32, batch, p.select_n, k);
  p.topk = cur.take(p.topk_bytes);
  p.total = cur.used;
  return p;
}

template <int kThreads>
ChunkTopK<kThreads> chunk_top_k(const IndexerPlan& p, void* scratch, int64_t k) {
  return ChunkTopK<kThreads>{at<float>(scratch, p.scores), at<int32_t>(scratch, p.cand_ids),
                             at<int32_t>(scratch, p.counts), p.select_n, p.chunk_keys, uint32_t(k),
                             uint32_t(p.capacity), make_key_codec<KeyKind::kFloat, uint32_t>()};
}

#if defined(JAX_TOPK_HAS_MMA)
template <typename Kernel, typename Out>
gpuError_t launch_mma(Kernel* kernel, int64_t dim, const void* q, const void* keys, const float* weights,
                      const int32_t* lengths, int64_t batch, int64_t heads, int64_t n, const IndexerPlan& p, Out out,
                      gpuStream_t stream) {
  const size_t smem = mma_smem_bytes(heads, dim);
  gpuError_t err = gpu_set_max_dynamic_smem(kernel, int(smem));
  if (err != gpuSuccess) return err;
  const dim3 grid(unsigned((n + p.chunk_keys - 1) / p.chunk_keys), unsigned(batch));
  kernel<<<grid, unsigned(heads / kMmaHeadTile * 32 * kMmaKeySplit), smem, stream>>>(
      static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(keys), weights, lengths, int(heads), n,
      p.items_per_keys, int(p.chunk_keys / kMmaStepKeys), out);
  return gpuGetLastError();
}

template <int kDim>
gpuError_t launch_mma_scores(const void* q, const void* keys, const float* weights, const int32_t* lengths,
                             int64_t batch, int64_t heads, int64_t n, int64_t k, const IndexerPlan& p,
                             void* scratch, gpuStream_t stream) {
  if constexpr (kDim == 64 || kDim == 128) {
    const auto fused = [&](auto threads) {
      constexpr int kThreads = decltype(threads)::value;
      return launch_mma(indexer_fused_mma_kernel<kDim, kThreads>, kDim, q, keys, weights, lengths, batch, heads, n,
                        p, chunk_top_k<kThreads>(p, scratch, k), stream);
    };
    if (p.fused) {
      switch (p.threads) {
        case 128: return fused(std::integral_constant<int, 128>{});
        case 256: return fused(std::integral_constant<int, 256>{});
        case 512: return fused(std::integral_constant<int, 512>{});
        default: return gpuErrorInvalidValue;  // fused_mma_shape admits no other
      }
    }
  }
  return launch_mma(indexer_scores_mma_kernel<kDim>, kDim, q, keys, weights, lengths, batch, heads, n, p,
                    ScoresToMemory{at<float>(scratch, p.scores)}, stream);
}

gpuError_t launch_mma_scores_for_dim(const void* q, const void* keys, const float* weights, const int32_t* lengths,
                                     int64_t batch, int64_t heads, int64_t n, int64_t dim, int64_t k,
                                     const IndexerPlan& p, void* scratch, gpuStream_t stream) {
  switch (dim) {
    case 16: return launch_mma_scores<16>(q, keys, weights, lengths, batch, heads, n, k, p, scratch, stream);
    case 32: return launch_mma_scores<32>(q, keys, weights, lengths, batch, heads, n, k, p, scratch, stream);
    case 64: return launch_mma_scores<64>(q, keys, weights, lengths, batch, heads, n, k, p, scratch, stream);
    case kMmaMaxDim:
      return launch_mma_scores<kMmaMaxDim>(q, keys, weights, lengths, batch, heads, n, k, p, scratch, stream);
    default: return gpuErrorInvalidValue;  // indexer_uses_tensor_cores admits no other
  }
}
#endif  // JAX_TOPK_HAS_MMA

template <typename T, typename Out>
gpuError_t launch_exact(const T* q, const T* keys, const float* weights, const int32_t* lengths, int64_t batch,
                        int64_t heads, int64_t n, int64_t dim, const IndexerPlan& p, Out out, gpuStream_t stream) {
  const size_t smem = p.fused ? exact_fused_smem_bytes(p.capacity) : 0;
  if (p.fused) {
    gpuError_t err = gpu_set_max_dynamic_smem(indexer_scores_exact_kernel<T, Out>, int(smem));
    if (err != gpuSuccess) return err;
  }
  const dim3 grid(unsigned((n + p.chunk_keys - 1) / p.chunk_keys), unsigned(batch));
  indexer_scores_exact_kernel<T, Out><<<grid, kExactThreads, smem, stream>>>(
      q, keys, weights, lengths, int(heads), n, int(dim), p.items_per_keys, int(p.chunk_keys / kExactThreads),
      p.capacity, out);
  return gpuGetLastError();
}

template <typename T>
gpuError_t launch_exact_scores(const T* q, const T* keys, const float* weights, const int32_t* lengths,
                               int64_t batch, int64_t heads, int64_t n, int64_t dim, int64_t k,
                               const IndexerPlan& p, void* scratch, gpuStream_t stream) {
  if (p.fused) {
    return launch_exact(q, keys, weights, lengths, batch, heads, n, dim, p, chunk_top_k<kExactThreads>(p, scratch, k),
                        stream);
  }
  return launch_exact(q, keys, weights, lengths, batch, heads, n, dim, p, ScoresToMemory{at<float>(scratch, p.scores)},
                      stream);
}

}  // namespace

size_t indexer_scratch_bytes(DType dtype, int64_t batch, int64_t heads, int64_t n, int64_t dim, int64_t k,
                             IndexerFusion fusion) {
  return plan_indexer(dtype, batch, heads, n, dim, k, fusion).total;
}

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

IndexerPath indexer_path(DType dtype, int64_t batch, int64_t heads, int64_t n, int64_t dim, int64_t k,
                         IndexerFusion fusion) {
  const IndexerPlan p = plan_indexer(dtype, batch, heads, n, dim, k, fusion);
  return IndexerPath{p.tensor_cores, p.fused, p.fused ? p.chunk_keys : 0, p.capacity,
                     fused_shape(p.tensor_cores, heads, dim).max_k};
}

gpuError_t indexer_top_k(DType dtype, const void* q, const void* keys, const float* weights,
                          const int32_t* lengths, int64_t batch, int64_t heads, int64_t n, int64_t dim, int64_t k,
                          int64_t items_per_keys, IndexerFusion fusion, float* scores, int32_t* ids, void* scratch,
                          size_t scratch_bytes, gpuStream_t stream) {
  if (!is_indexer_dtype(dtype) || batch < 0 || heads < 0 || dim < 0 || k < 0 || k > n || n > INT32_MAX ||
      batch > 65535 || heads > INT32_MAX || dim > INT32_MAX || items_per_keys < 1 ||
      (batch > 0 && batch % items_per_keys != 0)) {
    return gpuErrorInvalidValue;
  }
  if (batch == 0 || k == 0) return gpuSuccess;
  IndexerPlan plan = plan_indexer(dtype, batch, heads, n, dim, k, fusion);
  plan.items_per_keys = items_per_keys;
  if (scratch_bytes < plan.total) return gpuErrorInvalidValue;
  gpuError_t err;
#if defined(JAX_TOPK_HAS_MMA)
  if (plan.tensor_cores) {
    err = launch_mma_scores_for_dim(q, keys, weights, lengths, batch, heads, n, dim, k, plan, scratch, stream);
  } else
#endif
  if (dtype == DType::float32) {
    err = launch_exact_scores(static_cast<const float*>(q), static_cast<const float*>(keys), weights, lengths, batch,
                              heads, n, dim, k, plan, scratch, stream);
  } else {
    err = launch_exact_scores(static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(keys), weights, lengths,
                              batch, heads, n, dim, k, plan, scratch, stream);
  }
  if (err != gpuSuccess) return err;
  // Each row's k best: of its first length scores, or (fused) of its real candidates.
  const int32_t* select_lengths = plan.fused ? at<int32_t>(scratch, plan.counts) : lengths;
  err = topk_rows(DType::float32, at<float>(scratch, plan.scores), scores, ids, batch, plan.select_n, k,
                  select_lengths, at<void>(scratch, plan.topk), plan.topk_bytes, stream);
  if (err != gpuSuccess || !plan.fused) return err;
  constexpr int kGatherThreads = 256;
  gather_candidate_ids_kernel<<<unsigned((batch * k + kGatherThreads - 1) / kGatherThreads), kGatherThreads, 0,
                                stream>>>(ids, at<int32_t>(scratch, plan.cand_ids), batch, plan.select_n, k);
  return gpuGetLastError();
}

}  // namespace jax_topk::cuda
