// NSA's selection scores (jax_topk/nsa.h) on tensor cores: two kernels,
// mma.sync (sm_80+) and warpgroup products (wgmma, sm_90a: Hopper, groups of
// more than 8 heads), which pool their per-key sums alike.
//
// The mma.sync kernel: a block of 8 warps takes 16 consecutive queries of one (item, KV head),
// and all warps share the compressed keys, 64 per step, double-buffered in
// shared memory by cp.async. Each warp holds two queries' G <= 16 heads as
// mma.sync B fragments (one or two tiles of 8 heads; heads past G zero) for
// the whole kernel and forms keys x heads products, 16 keys at a time (A from
// shared memory by ldmatrix; m16n8k16, float32 accumulators): a lane then
// holds two keys (rows g, g + 8) of two heads (columns 2c, 2c + 1) per tile,
// turns them into probabilities exp2(s * dot - lse) (zero for keys the query
// does not see), adds its heads, and the 4 lanes of a key add theirs (lane
// bits 1, 2). The 64 per-key sums of a step go to shared memory behind the
// last l/d - 1 of the step before (a selection block takes compression
// blocks that start before it); then one lane per (query, selection block)
// adds its compression blocks times their overlap and writes the score. Warps
// synchronise with each other only for the keys.
//
// Why not the Pallas kernel: Triton gave it 215 registers for its [256 rows,
// 64 keys] float32 scores, two programs per SM and the group sum as a
// layout change; here a warp's accumulators are 16 floats and an SM runs 16
// warps (benchmarks/results/NOTES.md, twenty-fifth session).

#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "cuda/device_info.h"
#include "cuda/mma.cuh"
#include "cuda/nsa_cuda.h"
#include "cuda/primitives.cuh"
#include "cuda/wgmma.cuh"

namespace jax_topk::cuda {
namespace {

#if defined(JAX_TOPK_HAS_MMA)
constexpr int kWarps = 8;
constexpr int kQueriesPerWarp = 2;  // share each ldmatrix of the keys
constexpr int kQueriesPerBlock = kWarps * kQueriesPerWarp;
constexpr int kStepKeys = int(kNsaStepKeys);
constexpr int kHalo = int(kNsaMaxHalo);
constexpr int kProbRow = kHalo + kStepKeys;  // a query's per-key sums: the halo, then the step's keys
// Shared rows of keys padded by 16 bytes, so the 8 rows an ldmatrix reads
// start in 8 different bank quads.
constexpr int kRowPad = 8;
static_assert(kQueriesPerWarp * kHalo == 32, "one lane per halo slot of the warp's queries");

template <int kDim>
constexpr size_t block_score_smem_bytes() {
  return size_t(2 * kStepKeys * (kDim + kRowPad)) * 2 + size_t(kQueriesPerBlock * kProbRow) * sizeof(float);
}

__device__ __forceinline__ float exp2_approx(float x) {  // ex2.approx, as Triton's exp2 (-inf -> 0)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two consecutive 16-bit elements as one fragment register (0 for a head past the group).
__device__ __forceinline__ uint32_t load_pair(const uint16_t* p, bool valid) {
  return valid ? __ldg(reinterpret_cast<const uint32_t*>(p)) : 0u;
}

// The compressed blocks query t sees (both kernels): i with i*d + l - 1 <= t.
__device__ __forceinline__ int compressed_blocks_seen(const NsaScoreShape& s, int64_t t) {
  if (t >= s.q_rows || t + 1 < s.block_size) return 0;
  return int(min((t + 1 - s.block_size) / s.stride + 1, s.num_blocks));
}

template <typename T, int kDim, int kHeadTiles>
__global__ void __launch_bounds__(kWarps * 32, 2)
    nsa_block_scores_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k_cmp,
                            const float* __restrict__ lse, const int32_t* __restrict__ start_at, float* __restrict__ out,
                            NsaScoreShape s) {
  constexpr int kStride = kDim + kRowPad;  // elements per shared row
  constexpr int kVecs = kDim / 8;          // 16-byte vectors per row
  constexpr int kSteps = kDim / 16;        // MMA k-steps over dim
  extern __shared__ uint4 nsa_smem[];
  uint16_t* keys_s = reinterpret_cast<uint16_t*>(nsa_smem);
  float* probs_s = reinterpret_cast<float*>(keys_s + 2 * kStepKeys * kStride);

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int g = lane >> 2, c = lane & 3;  // accumulator rows (keys) g, g + 8; columns (heads) 2c, 2c + 1
  const int64_t b = blockIdx.z, h = blockIdx.y, heads = s.kv_heads, groups = s.groups;
  const int64_t start = __ldg(start_at);
  const int64_t row0 = int64_t(blockIdx.x) * kQueriesPerBlock;
  // The config as int (nsa_block_scores checks that it fits), in units of d.
  const int per_block = int(s.block_size / s.stride), per_select = int(s.select_size / s.stride);
  const int width = int(s.width);
  const int blocks_per_step = kStepKeys / per_select;
  const int halo = per_block - 1;
  const auto seen_keys = [&](int64_t t) { return compressed_blocks_seen(s, t); };
  // Steps with a key some query of the block sees (its last query sees most).
  const int steps_seen = (seen_keys(min(start + row0 + kQueriesPerBlock, s.q_rows) - 1) + kStepKeys - 1) / kStepKeys;
  const int steps_out = (width + blocks_per_step - 1) / blocks_per_step;

  const uint16_t* keys_bh = k_cmp + (b * s.key_rows * heads + h) * kDim;  // key i at + i * heads * kDim
  auto load_step = [&](int step) {  // the step's 64 keys (zeros past key_rows) into buffer step % 2
    const int64_t first = int64_t(step) * kStepKeys;
    uint16_t* dst = keys_s + (step & 1) * kStepKeys * kStride;
    for (int i = int(threadIdx.x); i < kStepKeys * kVecs; i += kWarps * 32) {
      const int key = i / kVecs, vec = i % kVecs;
      const bool valid = first + key < s.key_rows;
      copy_async_16(shared_address(dst + key * kStride + vec * 8),
                    keys_bh + (valid ? first + key : 0) * heads * kDim + vec * 8, valid);
    }
    copy_async_commit();
  };
  if (steps_seen > 0) load_step(0);

  // The warp's queries as B fragments of keys x heads products (column n =
  // head 8 * tile + g: register 0 its dims 2c, 2c + 1 of the k-step, register
  // 1 dims 2c + 8, 2c + 9; heads past G zero), the lse of this lane's
  // accumulator columns (heads 8 * tile + 2c, + 1; +inf past G), the keys seen.
  uint32_t qb[kQueriesPerWarp][kHeadTiles][kSteps][2];
  float lse_of[kQueriesPerWarp][kHeadTiles][2];
  int seen[kQueriesPerWarp];
#pragma unroll
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int64_t t = start + row0 + warp * kQueriesPerWarp + i;
    const bool query = t < s.q_rows;
    const int64_t at = ((b * s.q_rows + (query ? t : 0)) * heads + h) * groups;
#pragma unroll
    for (int tile = 0; tile < kHeadTiles; ++tile) {
      const int head = 8 * tile + g;
      const bool valid = query && head < groups;
      const uint16_t* row = q + (at + (valid ? head : 0)) * kDim + 2 * c;
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        qb[i][tile][ks][0] = load_pair(row + ks * 16, valid);
        qb[i][tile][ks][1] = load_pair(row + ks * 16 + 8, valid);
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int column = 8 * tile + 2 * c + e;
        lse_of[i][tile][e] = query && column < groups ? __ldg(lse + at + column) : INFINITY;
      }
    }
    seen[i] = seen_keys(t);
  }

  float* probs = probs_s + warp * kQueriesPerWarp * kProbRow;  // the warp's queries' rows
  probs[(lane / kHalo) * kProbRow + lane % kHalo] = 0.0f;       // no keys before the first
  // Pooling: lane (i, j) scores the warp's query i = lane / 16 in selection
  // blocks j, j + 16, ... of each step.
  const int pool_query = lane / 16;
  const int64_t pool_row = row0 + warp * kQueriesPerWarp + pool_query;  // the output row (chunk-local)
  float* out_row = out + ((b * heads + h) * s.chunk + pool_row) * s.width;
  const int64_t own = (start + pool_row) / s.select_size;  // the query's selection block
  const float* pool_probs = probs + pool_query * kProbRow + kHalo;

  for (int step = 0; step < steps_out; ++step) {
    if (step > steps_seen) {  // nothing seen here nor in the step before: zeros
      for (int j = lane % 16; j < blocks_per_step; j += 16) {
        const int block = step * blocks_per_step + j;
        if (block < width) out_row[block] = nsa_selection_rank(s, 0.0f, block, own);
      }
      continue;
    }
    if (step < steps_seen) {  // uniform in the block
      copy_async_wait<0>();
      __syncthreads();  // the step's keys are in; every warp is done with the other buffer
      if (step + 1 < steps_seen) load_step(step + 1);
      const uint16_t* keys_read = keys_s + (step & 1) * kStepKeys * kStride;
      // A matrices of 16 keys: keys 0-7 / 8-15 by lane bit 3, dims 0-7 / 8-15 by lane bit 4.
      const uint16_t* a_row = keys_read + (((lane >> 3) & 1) * 8 + (lane & 7)) * kStride + (lane >> 4) * 8;
      const int first = step * kStepKeys;
#pragma unroll
      for (int part = 0; part < kStepKeys / 16; ++part) {
        float acc[kQueriesPerWarp][kHeadTiles][4] = {};
#pragma unroll
        for (int ks = 0; ks < kSteps; ++ks) {
          uint32_t ka[4];
          load_matrices_x4(ka, shared_address(a_row + part * 16 * kStride + ks * 16));
#pragma unroll
          for (int i = 0; i < kQueriesPerWarp; ++i) {
#pragma unroll
            for (int tile = 0; tile < kHeadTiles; ++tile) {
              mma_m16n8k16<T>(acc[i][tile], ka, qb[i][tile][ks][0], qb[i][tile][ks][1]);
            }
          }
        }
        // Keys g and g + 8 of the part: this lane's heads' probabilities
        // (branch-free, so the exponentials of all four sums issue together),
        // then the group's sum over the 4 lanes of the key (lane bits 1, 2).
        float p[kQueriesPerWarp][2];
#pragma unroll
        for (int i = 0; i < kQueriesPerWarp; ++i) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            float sum = 0.0f;
#pragma unroll
            for (int tile = 0; tile < kHeadTiles; ++tile) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                sum += exp2_approx(__fmaf_rn(acc[i][tile][2 * half + e], s.scale, -lse_of[i][tile][e]));
              }
            }
            p[i][half] = first + part * 16 + half * 8 + g < seen[i] ? sum : 0.0f;
          }
        }
#pragma unroll
        for (int bit = 1; bit <= 2; bit *= 2) {
#pragma unroll
          for (int i = 0; i < kQueriesPerWarp; ++i) {
            p[i][0] += warp_shfl_xor(p[i][0], bit);
            p[i][1] += warp_shfl_xor(p[i][1], bit);
          }
        }
        if (c == 0) {
#pragma unroll
          for (int i = 0; i < kQueriesPerWarp; ++i) {
            probs[i * kProbRow + kHalo + part * 16 + g] = p[i][0];
            probs[i * kProbRow + kHalo + part * 16 + 8 + g] = p[i][1];
          }
        }
      }
    } else {  // step == steps_seen: no key seen, but the halo of the step before
      for (int i = lane; i < kQueriesPerWarp * kStepKeys; i += 32) {
        probs[(i / kStepKeys) * kProbRow + kHalo + i % kStepKeys] = 0.0f;
      }
    }
    __syncwarp();
    // Selection block j of the step covers units [j*l'/d, (j+1)*l'/d) of d
    // tokens from the step's first; compression block i covers [i, i + l/d):
    // blocks from j*l'/d - l/d + 1 (the halo when negative), weighted by the
    // units they share.
    for (int j = lane % 16; j < blocks_per_step; j += 16) {
      const int block = step * blocks_per_step + j;
      if (block >= width) break;
      const int from = j * per_select, to = from + per_select;
      float score = 0.0f;
      for (int i = from - halo; i < to; ++i) {
        score = __fadd_rn(score, __fmul_rn(float(min(i + per_block, to) - max(i, from)), pool_probs[i]));
      }
      out_row[block] = nsa_selection_rank(s, score, block, own);
    }
    __syncwarp();
    // The step's last l/d - 1 sums become the next step's halo.
    const int halo_query = lane / kHalo, m = lane % kHalo;
    float carried = 0.0f;
    if (m < halo) carried = probs[halo_query * kProbRow + kHalo + kStepKeys - halo + m];
    __syncwarp();
    if (m < halo) probs[halo_query * kProbRow + kHalo - halo + m] = carried;
    __syncwarp();
  }
}

// ---- sm_90a: the same scores by warpgroup products (wgmma) ----------------
//
// A block of two warpgroups takes 16 consecutive queries of one (item, KV
// head), 8 per warpgroup; the keys, 64 per step, are shared and double-
// buffered by cp.async as above. A warpgroup keeps its 8 queries' 16 head
// rows (N = 128 columns, heads past G zero) in shared memory for the whole
// kernel, head major (column 8 * head + query), and forms the step's 64
// keys x 128 columns in one chain of m64n128k16 products (K = dim). Thread
// (warp w, lane g * 4 + c) then holds keys 16w + g and 16w + g + 8 of
// queries 2c and 2c + 1 in every head (column tile j = head j): the group's
// sum of each of its four (query, key) pairs is its own 16 adds, with no
// shuffles (a query-major tile spread a query's heads over the 4 lanes of a
// key and took a reduce-scatter of 12 shuffles and 24 selects per step). The
// pooling into selection blocks and the halo are the mma.sync kernel's, per
// warpgroup. Why: the mma.sync kernel's warps wait on their own products and
// exponentials (twenty-fifth session: tensor pipe 30% busy); a warpgroup's
// product runs from shared memory while the other warpgroups of the SM turn
// theirs into probabilities. H200, 64K tokens of benchmarks/nsa.py: 5.25 ms
// against the mma.sync kernel's 8.2 (benchmarks/results/NOTES.md, thirty-
// ninth to forty-fourth sessions, with what was measured and not kept).
constexpr int kWgQueries = 8;                       // queries per warpgroup (128 columns / 16 heads)
// A query's row of per-key sums, padded by 4 floats: lanes c = 0..3 store
// queries 2c apart, whose rows then start in banks 8c apart (80 would put
// all four on one bank).
constexpr int kWgProbRow = kProbRow + 4;
constexpr int kWgWarpgroups = 2;
constexpr int kWgThreads = kWgWarpgroups * 128;
constexpr int kWgBlockQueries = kWgWarpgroups * kWgQueries;
constexpr uint32_t kKeyBuffers = 2;  // the step in the tensor cores, the step loading
static_assert(kWgBlockQueries == kQueriesPerBlock, "both kernels take the chunk in blocks of 16 queries");
static_assert(kNsaMaxGroup == 16, "a query's heads are 16 columns");

template <int kDim>
struct WgmmaSmem {  // byte offsets; the tiles 1024-byte aligned
  static constexpr uint32_t kQueryTile = 128u * kDim * 2;  // a warpgroup's 128 rows of dim
  static constexpr uint32_t kKeyTile = uint32_t(kStepKeys) * kDim * 2;
  static constexpr uint32_t kKeys = kWgWarpgroups * kQueryTile;
  static constexpr uint32_t kProbs = kKeys + kKeyBuffers * kKeyTile;
  static constexpr uint32_t kLse = kProbs + uint32_t(kWgBlockQueries * kWgProbRow) * 4;
  static constexpr uint32_t kBytes = kLse + uint32_t(kWgBlockQueries * 16) * 4 + 1024;  // + alignment
};

// kPerBlock, kPerSelect: l / d and l' / d when known at compile time (the
// default NSAConfig's 2 and 4: the pooling's weights become constants), else 0.
template <typename T, int kDim, int kPerBlock, int kPerSelect>
__global__ void __launch_bounds__(kWgThreads, 2)
    nsa_block_scores_wgmma_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k_cmp,
                                  const float* __restrict__ lse, const int32_t* __restrict__ start_at,
                                  float* __restrict__ out, NsaScoreShape s) {
#if defined(JAX_TOPK_DEVICE_HAS_WGMMA)
  using Smem = WgmmaSmem<kDim>;
  constexpr int kChunks = kDim / 8;  // 16-byte chunks per row
  extern __shared__ uint4 nsa_smem[];
  const uint32_t base = (shared_address(nsa_smem) + 1023u) & ~1023u;
  unsigned char* const base_ptr = reinterpret_cast<unsigned char*>(nsa_smem) + (base - shared_address(nsa_smem));
  float* const probs_s = reinterpret_cast<float*>(base_ptr + Smem::kProbs);
  float* const lse_s = probs_s + kWgBlockQueries * kWgProbRow;

  const int tid = int(threadIdx.x), wg = tid / 128, wt = tid % 128;
  const int warp = wt / 32, lane = tid % 32, g = lane >> 2, c = lane & 3;
  const int64_t b = blockIdx.z, h = blockIdx.y, heads = s.kv_heads, groups = s.groups;
  const int64_t start = __ldg(start_at);
  const int64_t row0 = int64_t(blockIdx.x) * kWgBlockQueries;
  const int per_block = kPerBlock ? kPerBlock : int(s.block_size / s.stride);
  const int per_select = kPerSelect ? kPerSelect : int(s.select_size / s.stride);
  const int width = int(s.width);
  const int blocks_per_step = kStepKeys / per_select;
  const int halo = per_block - 1;
  const auto seen_keys = [&](int64_t t) { return compressed_blocks_seen(s, t); };
  const int steps_seen = (seen_keys(min(start + row0 + kWgBlockQueries, s.q_rows) - 1) + kStepKeys - 1) / kStepKeys;
  const int steps_out = (width + blocks_per_step - 1) / blocks_per_step;

  // Every warpgroup's queries into its tile, head major: row n = 8 * head + query.
  for (int i = tid; i < kWgThreads * kChunks; i += kWgThreads) {
    const int row = i / kChunks % 128, chunk = i % kChunks, group = i / (128 * kChunks);
    const int head = row / kWgQueries;
    const int64_t t = start + row0 + group * kWgQueries + row % kWgQueries;
    const bool valid = t < s.q_rows && head < groups;
    const int64_t at = (((b * s.q_rows + (valid ? t : 0)) * heads + h) * groups + (valid ? head : 0)) * kDim;
    copy_async_16(base + group * Smem::kQueryTile + swizzle_128b_offset(128, row, chunk), q + at + chunk * 8, valid);
  }
  const uint16_t* keys_bh = k_cmp + (b * s.key_rows * heads + h) * kDim;  // key i at + i * heads * kDim
  // This thread's key copies, the same every step but for the step's first
  // key: chunk tid % kChunks of keys tid / kChunks + r * kKeysPerPass. (A
  // multiple of 8 rows apart, so their swizzled offsets differ by rows * 128.)
  constexpr int kKeysPerPass = kWgThreads / kChunks;
  static_assert(kKeysPerPass % 8 == 0 && kStepKeys % kKeysPerPass == 0, "copies a swizzle period apart");
  const int copy_key = tid / kChunks;
  const uint32_t copy_offset = swizzle_128b_offset(kStepKeys, copy_key, tid % kChunks);
  const int64_t key_stride = heads * kDim;
  const uint16_t* const copy_src = keys_bh + copy_key * key_stride + (tid % kChunks) * 8;
  auto load_step = [&](int step) {  // the step's 64 keys (zeros past key_rows) into its buffer
    const int64_t first = int64_t(step) * kStepKeys;
    const uint32_t dst = base + Smem::kKeys + uint32_t(step % kKeyBuffers) * Smem::kKeyTile + copy_offset;
    const uint16_t* src = copy_src + first * key_stride;
#pragma unroll
    for (int r = 0; r < kStepKeys / kKeysPerPass; ++r) {
      const bool valid = first + copy_key + r * kKeysPerPass < s.key_rows;
      copy_async_16(dst + uint32_t(r * kKeysPerPass * 128), valid ? src + r * kKeysPerPass * key_stride : keys_bh,
                    valid);
    }
  };
  if (steps_seen > 0) load_step(0);
  copy_async_commit();  // the queries, with the first keys

  // The block's lse as the tiles order it, [warpgroup][head][query] (+inf
  // past G or past the rows), read from global memory query major. The keys
  // a query sees: key i iff i * d + l - 1 <= t, i < num_blocks and t < q_rows.
  {
    const int query = tid / 16, head = tid % 16;
    const int64_t t = start + row0 + query;
    const bool valid = t < s.q_rows && head < groups;
    lse_s[(query / kWgQueries * 16 + head) * kWgQueries + query % kWgQueries] =
        valid ? __ldg(lse + ((b * s.q_rows + t) * heads + h) * groups + head) : INFINITY;
  }
  static_assert(kWgThreads == kWgBlockQueries * 16, "one thread per (query, head) of the block's lse");
  const int64_t first_query = start + row0 + wg * kWgQueries;
  const int rows_left = int(min(int64_t(kWgQueries), max(int64_t(0), s.q_rows - first_query)));
  // This lane's queries 2c, 2c + 1 of head j at lse_pair[4 * j] (after the barrier of the first step).
  const float2* lse_pair = reinterpret_cast<const float2*>(lse_s + wg * kWgQueries * 16) + c;

  float* probs = probs_s + wg * kWgQueries * kWgProbRow;  // the warpgroup's queries' rows
  probs[(wt / kHalo) * kWgProbRow + wt % kHalo] = 0.0f;   // no keys before the first
  static_assert(kWgQueries * kHalo == 128, "one thread per halo slot of the warpgroup's queries");
  const auto warpgroup_sync = [&] { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory"); };
  const int pool_query = wt / 16;
  const int64_t pool_row = row0 + wg * kWgQueries + pool_query;  // the output row (chunk-local)
  float* out_row = out + ((b * heads + h) * s.chunk + pool_row) * s.width;
  const int64_t own = (start + pool_row) / s.select_size;  // the query's selection block
  const float* pool_probs = probs + pool_query * kWgProbRow + kHalo;
  const uint32_t query_tile = base + wg * Smem::kQueryTile;

  // Scores of the step's keys (this lane's four (query, key) pairs summed
  // over the group's heads) into shared memory, then the selection blocks.
  const auto score_step = [&](int step, const float(&acc)[64], bool seen_any) {
    // fin[r]: key 16 * warp + g + 8 (r / 2), query 2c + r % 2 (acc[4j + r] in head j).
    float fin[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (seen_any) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float2 l2 = lse_pair[4 * j];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          fin[r] += exp2_approx(__fmaf_rn(acc[4 * j + r], s.scale, -(r % 2 ? l2.y : l2.x)));
        }
      }
      // A key counts for query qi iff key * d + l - 1 - first_query <= qi;
      // a warp whose last key the warpgroup's first query sees needs no test.
      const int64_t warp_last = int64_t(step) * kStepKeys + 16 * warp + 15;
      const bool all_seen = rows_left == kWgQueries && warp_last < s.num_blocks &&
                            warp_last * s.stride + s.block_size - 1 <= first_query;
      if (!all_seen) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int64_t k = int64_t(step) * kStepKeys + 16 * warp + g + 8 * (r / 2);
          const int qi = 2 * c + r % 2;
          const bool seen = qi < rows_left && k < s.num_blocks && k * s.stride + s.block_size - 1 - first_query <= qi;
          fin[r] = seen ? fin[r] : 0.0f;
        }
      }
    }
    // (Zeros when no key of the step is seen: the halo of the step before still scores.)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      probs[(2 * c + r % 2) * kWgProbRow + kHalo + 16 * warp + g + 8 * (r / 2)] = fin[r];
    }
    warpgroup_sync();
    for (int j = wt % 16; j < blocks_per_step; j += 16) {  // the mma.sync kernel's pooling, from offsets
      const int block = step * blocks_per_step + j;
      if (block >= width) break;
      const float* from = pool_probs + j * per_select;
      float score = 0.0f;
#pragma unroll
      for (int o = -halo; o < per_select; ++o) {  // compression block from + o shares this many units
        score = __fadd_rn(score, __fmul_rn(float(min(o + per_block, per_select) - max(o, 0)), from[o]));
      }
      out_row[block] = nsa_selection_rank(s, score, block, own);
    }
    warpgroup_sync();
    // The step's last l/d - 1 sums become the next step's halo (ordered
    // before the next step's sums by its barrier).
    const int halo_query = wt / kHalo, m = wt % kHalo;
    if (m < halo) {
      probs[halo_query * kWgProbRow + kHalo - halo + m] = probs[halo_query * kWgProbRow + kHalo + kStepKeys - halo + m];
    }
  };
  // The product of the step's keys (buffer step % kKeyBuffers) and the
  // warpgroup's queries, issued asynchronously into acc.
  const auto issue_product = [&](int step, float(&acc)[64]) {
    const uint32_t key_tile = base + Smem::kKeys + uint32_t(step % kKeyBuffers) * Smem::kKeyTile;
    wgmma_fence_operands(acc);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks) {  // 16 dims a product: slab ks / 4, bytes 32 (ks % 4) into it
      const uint32_t slab = (ks / 4) * 128u, within = (ks % 4) * 32u;
      wgmma_m64n128k16<T>(acc, wgmma_descriptor(key_tile + slab * kStepKeys + within),
                          wgmma_descriptor(query_tile + slab * 128 + within), ks > 0);
    }
    wgmma_commit();
    wgmma_fence_operands(acc);
  };
  // The step's keys in and visible to the tensor cores; every warpgroup past
  // the product of step - 1 (whose buffer the keys of step + 1 take next) and
  // the halo copy of step - 1.
  const auto keys_ready = [&] {
    copy_async_wait<0>();
    fence_proxy_async_shared();
    __syncthreads();
  };

  // Step by step: the other warpgroups of the SM (two blocks of two) fill the
  // tensor cores while this one scores. (Two accumulator sets, the product of
  // step + 1 in flight while step's scores: 239 registers, one block per SM,
  // 10.0 ms at 64K tokens against 6.9: the scoring, issue-bound on integer and
  // select work, wants the warps. Warpgroup 1 passing each step's barrier
  // between its product and its scores, so that the two alternate on the
  // tensor cores: 5.35 ms against 5.25; the product split in N, heads 0..7
  // summed while 8..15 form: 5.49; forty-fourth session.)
  float acc[64];
  for (int step = 0; step < steps_seen; ++step) {
    keys_ready();
    if (step + 1 < steps_seen) {
      load_step(step + 1);
      copy_async_commit();
    }
    issue_product(step, acc);
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
    score_step(step, acc, true);
  }
  if (steps_seen < steps_out) {  // no key seen, but the halo of the step before
    __syncthreads();  // (orders the halo writes before these sums, as keys_ready does)
    score_step(steps_seen, acc, false);
  }
  for (int step = steps_seen + 1; step < steps_out; ++step) {  // nothing seen here nor in the step before
    for (int j = wt % 16; j < blocks_per_step; j += 16) {
      const int block = step * blocks_per_step + j;
      if (block < width) out_row[block] = nsa_selection_rank(s, 0.0f, block, own);
    }
  }
  copy_async_wait<0>();  // (a chunk whose queries see nothing still loaded its query tiles)
#else
  (void)q, (void)k_cmp, (void)lse, (void)start_at, (void)out, (void)s;
  __trap();  // launched only where the sm_90a pass compiled it
#endif
}

// Whether the wgmma kernel runs here: a build with sm_90a code
// (JAX_TOPK_BUILD_HAS_WGMMA) on a device that runs it. JAX_TOPK_NSA_NO_WGMMA
// is read per call (the standalone test sets it between its two passes).
inline bool device_runs_wgmma() {
#if defined(JAX_TOPK_BUILD_HAS_WGMMA)
  DeviceInfo dev;
  return query_device(&dev) == gpuSuccess && dev.sm90a_code && std::getenv("JAX_TOPK_NSA_NO_WGMMA") == nullptr;
#else
  return false;
#endif
}

template <typename T, int kDim>
gpuError_t launch_block_scores(const void* q, const void* k_cmp, const float* lse, const int32_t* start,
                               const NsaScoreShape& s, float* out, gpuStream_t stream) {
  const dim3 grid(unsigned(s.chunk / kQueriesPerBlock), unsigned(s.kv_heads), unsigned(s.batch));
  // The warpgroup kernel's 128 columns hold 8 queries of 16 heads: worth it
  // past one tile of 8 heads.
  if (s.groups > 8 && device_runs_wgmma()) {
    const bool default_config = s.block_size == 2 * s.stride && s.select_size == 4 * s.stride;  // l = 2d, l' = 4d
    auto* kernel = default_config ? nsa_block_scores_wgmma_kernel<T, kDim, 2, 4>
                                  : nsa_block_scores_wgmma_kernel<T, kDim, 0, 0>;
    constexpr uint32_t smem = WgmmaSmem<kDim>::kBytes;
    gpuError_t err = gpu_set_max_dynamic_smem(kernel, int(smem));
    if (err != gpuSuccess) return err;
    kernel<<<grid, kWgThreads, smem, stream>>>(static_cast<const uint16_t*>(q),
                                                static_cast<const uint16_t*>(k_cmp), lse, start, out, s);
    return gpuGetLastError();
  }
  // One tile of 8 heads when the group fits it: half the products.
  auto* kernel = s.groups <= 8 ? nsa_block_scores_kernel<T, kDim, 1> : nsa_block_scores_kernel<T, kDim, 2>;
  constexpr size_t smem = block_score_smem_bytes<kDim>();
  gpuError_t err = gpu_set_max_dynamic_smem(kernel, int(smem));
  if (err != gpuSuccess) return err;
  kernel<<<grid, kWarps * 32, smem, stream>>>(static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k_cmp),
                                               lse, start, out, s);
  return gpuGetLastError();
}

template <typename T>
gpuError_t launch_for_dim(const void* q, const void* k_cmp, const float* lse, const int32_t* start,
                          const NsaScoreShape& s, float* out, gpuStream_t stream) {
  switch (s.dim) {
    case 64: return launch_block_scores<T, 64>(q, k_cmp, lse, start, s, out, stream);
    case 128: return launch_block_scores<T, 128>(q, k_cmp, lse, start, s, out, stream);
    default: return gpuErrorInvalidValue;  // nsa_block_scores_unsupported admits no other
  }
}
#endif  // JAX_TOPK_HAS_MMA

}  // namespace

gpuError_t nsa_block_scores(DType dtype, const void* q, const void* k_cmp, const float* lse, const int32_t* start,
                            const NsaScoreShape& shape, float* out, gpuStream_t stream) {
  if (!nsa_score_dtype(dtype) || shape.chunk % 16 != 0 || shape.width >= (int64_t(1) << 30) ||
      shape.batch > 65535 || shape.kv_heads > 65535 ||
      shape.num_blocks >= (int64_t(1) << 30) || shape.select_size * kNsaStepKeys >= (int64_t(1) << 30) ||
      nsa_block_scores_unsupported(shape.groups, shape.dim, shape.block_size, shape.stride, shape.select_size)) {
    return gpuErrorInvalidValue;
  }
  if (shape.batch == 0 || shape.kv_heads == 0 || shape.chunk == 0 || shape.width == 0) return gpuSuccess;
#if defined(JAX_TOPK_HAS_MMA)
  if (dtype == DType::float16) return launch_for_dim<MmaF16>(q, k_cmp, lse, start, shape, out, stream);
  return launch_for_dim<MmaBf16>(q, k_cmp, lse, start, shape, out, stream);
#else
  (void)q, (void)k_cmp, (void)lse, (void)start, (void)out, (void)stream;
  return gpuErrorInvalidValue;
#endif
}

}  // namespace jax_topk::cuda
