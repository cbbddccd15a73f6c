// The sparse-attention indexer's score, defined once for every platform:
//
//   score[b, s] = sum_h weights[b, h] * relu(q[b, h] . keys[b, s])
//
// with float32 arithmetic in ONE fixed order, which is what makes the result
// batch-invariant: it depends on the row's own q, keys and weights only, never
// on the batch size, the padded key count or a launch configuration.
//   dot = ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)), where lane
//         p_j = sum over d = j, j + 8, j + 16, ... (increasing d) of q[d] * k[d]
//   score = sum over h = 0, 1, ... (increasing) of weights[h] * relu(dot_h)
// Every product and every sum is rounded on its own (no fused multiply-add),
// and inputs (bfloat16 or float32) are widened to float32 exactly first.
// relu(x) = x > 0 ? x : 0 (a NaN dot gives 0; -0.0 gives 0).
#pragma once

#include <cstdint>
#include <cstring>

#include "jax_topk/dtypes.h"
#include "jax_topk/gpu_compat.h"

namespace jax_topk {

inline constexpr int kIndexerLanes = 8;

// The element types of q and keys the kernels read (weights are float32).
constexpr bool is_indexer_dtype(DType d) { return d == DType::float32 || d == DType::bfloat16; }

JAX_TOPK_HOST_DEVICE inline float indexer_widen(float x) { return x; }
JAX_TOPK_HOST_DEVICE inline float indexer_widen(uint16_t bf16_bits) {
  const uint32_t bits = uint32_t(bf16_bits) << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

JAX_TOPK_HOST_DEVICE inline float indexer_relu(float x) { return x > 0.0f ? x : 0.0f; }

// The lane sums combined in the fixed tree above.
JAX_TOPK_HOST_DEVICE inline float indexer_combine_lanes(const float* p) {
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

// --- GPU: where the scores go (csrc/cuda/indexer.cu) ------------------------
// Unfused, the score kernels write every score to a [B, N] float32 scratch
// that the top-k kernels read back. Fused, a block scores a chunk of a row's
// keys and keeps the chunk's k best as it goes (a threshold that rises), so
// only B x chunks x k candidates reach memory, not B x N scores; a top-k over
// each row's candidates finishes. Both give the same bits: the same scores and
// an exact selection. The GPU handler's "fusion" attribute chooses:
enum class IndexerFusion : int64_t {
  kAuto = 0,     // fused where k << N and the unfused scratch would be large
  kUnfused = 1,  // always through the [B, N] scores
  kFused = 2,    // fused wherever the fused kernels hold the shape
};
// Fused is the slower of the two wherever it was measured (an H200,
// benchmarks/results/NOTES.md, indexer v8: 0.71-0.90x the unfused time at
// H = 64, D = 128 and H = 32, D = 64, B = 31 and 256, k = 64 and 256): the
// scores are a few percent of the bytes the call reads (the keys), and the
// blocks' selections cost more than their round trip. What it saves is
// memory (8 MB of scores against 0.25 MB of candidates at B = 31, N = 64K,
// k = 64). So kAuto fuses only where k << N (N >= kIndexerFuseMinNOverK * k)
// and the [B, N] scores would take at least kIndexerFuseMinScoresBytes.
inline constexpr int64_t kIndexerFuseMinNOverK = 32;
inline constexpr int64_t kIndexerFuseMinScoresBytes = int64_t(256) << 20;
// A fused block's chunk: at most kIndexerMaxChunk keys, halved (down to
// kIndexerMinChunk) while the batch would give fewer than
// kIndexerFusedBlocksPerSm blocks per SM, and at least kIndexerChunkOverK * k
// (so a chunk's k candidates are at most 1/16 of its scores). Measured (same
// NOTES): B = 31, N = 32K..64K, k = 64: chunks of 1024 / 2048 / 4096 keys
// 178 / 193 / 207 us (1488 / 744 / 372 blocks); B = 256, N = 16K..32K: 1024 /
// 4096 619 / 599 us (6000 / 1536 blocks).
inline constexpr int64_t kIndexerMaxChunk = 4096;
inline constexpr int64_t kIndexerMinChunk = 512;
inline constexpr int64_t kIndexerFusedBlocksPerSm = 10;
inline constexpr int64_t kIndexerChunkOverK = 16;

// Keys per fused block: a multiple of step_keys (the kernel's keys per step).
constexpr int64_t indexer_fused_chunk(int64_t batch, int64_t n, int64_t k, int64_t step_keys, int sm_count) {
  int64_t chunk = kIndexerMaxChunk;
  while (chunk > kIndexerMinChunk && batch * ((n + chunk - 1) / chunk) < kIndexerFusedBlocksPerSm * sm_count) {
    chunk /= 2;
  }
  if (chunk < kIndexerChunkOverK * k) chunk = kIndexerChunkOverK * k;
  return (chunk + step_keys - 1) / step_keys * step_keys;
}

// Whether kAuto fuses a shape the fused kernels hold.
constexpr bool indexer_auto_fuses(int64_t batch, int64_t n, int64_t k) {
  return n >= kIndexerFuseMinNOverK * k && batch * n * int64_t(sizeof(float)) >= kIndexerFuseMinScoresBytes;
}

}  // namespace jax_topk
