// Native Sparse Attention's selection scores on the GPU (csrc/cuda/nsa.cu):
// what the block-score kernel takes, defined once. The FFI module exports
// nsa_block_scores_unsupported to jax_topk/_nsa_native.py, which falls back
// to the Pallas kernel for any shape it names.
//
// The scores (NSA eq. 8-9, as _nsa_pallas.block_scores computes them): for
// query t and KV head h, compressed block i's probability summed over the
// group's G query heads, p[t, i] = sum_g exp2(s * q_g . k_i - lse_g), for the
// blocks t sees (i*d + l - 1 <= t); selection block j (tokens [j*l',
// (j+1)*l')) scores sum_i p[t, i] * overlap(i, j) / d, overlap counting the
// tokens compression block i (tokens [i*d, i*d + l)) shares with it.
#pragma once

#include <cmath>
#include <cstdint>

#include "jax_topk/dtypes.h"
#include "jax_topk/gpu_compat.h"

namespace jax_topk {

// The kernel's input dtypes: 16-bit floats on tensor cores (mma.sync, CUDA
// only; ROCm and float32 take the Pallas kernel).
#if defined(JAX_TOPK_HAS_MMA)
constexpr bool nsa_score_dtype(DType d) { return d == DType::bfloat16 || d == DType::float16; }
#else
constexpr bool nsa_score_dtype(DType) { return false; }
#endif

constexpr int64_t kNsaMaxGroup = 16;      // query heads per KV head: one m16 tile per token
constexpr int64_t kNsaStepKeys = 64;      // compressed keys per step of the kernel
constexpr int64_t kNsaMaxHalo = 16;       // compressed blocks a selection block takes from the step before

// One call's geometry. q [batch, q_rows, kv_heads, groups, dim], k_cmp
// [batch, key_rows, kv_heads, dim], lse [batch, q_rows, kv_heads, groups]
// (base 2: +inf for a row that sees nothing), out [batch, kv_heads, chunk,
// width] for queries start .. start + chunk - 1.
struct NsaScoreShape {
  int64_t batch = 0, q_rows = 0, kv_heads = 0, groups = 0, dim = 0;
  int64_t key_rows = 0;    // rows of k_cmp (num_blocks and padding)
  int64_t num_blocks = 0;  // compressed blocks that exist
  int64_t chunk = 0, width = 0;
  int64_t block_size = 0, stride = 0, select_size = 0;  // l, d, l'
  float scale = 0;         // the scores' scale, base 2 (softmax scale * log2(e))
  // Selection ranks instead of scores (nsa_selection_rank), for the forced blocks of NSAConfig.
  bool ranked = false;
  int64_t initial_blocks = 0, local_blocks = 0;
};

// What _nsa_tiled.select ranks block `block` by for a query in selection
// block `own`: -inf for a block that starts after the query, +inf for a
// forced one (the first initial_blocks, and the local_blocks ending at own),
// else its score; the score itself when the call is not `ranked`. Written by
// the kernel, the ranks go to top_k with no pass of their own.
JAX_TOPK_HOST_DEVICE inline float nsa_selection_rank(const NsaScoreShape& s, float score, int64_t block,
                                                     int64_t own) {
  if (!s.ranked) return score;
  if (block > own) return -INFINITY;
  if (block < s.initial_blocks || block > own - s.local_blocks) return INFINITY;
  return score;
}

// Why the kernel cannot take (groups, dim, l, d, l'), or nullptr.
inline const char* nsa_block_scores_unsupported(int64_t groups, int64_t dim, int64_t block_size, int64_t stride,
                                                int64_t select_size) {
  if (groups < 1 || groups > kNsaMaxGroup) return "the GQA group (Hq / Hkv) must be 1..16";
  if (dim != 64 && dim != 128) return "the head dim must be 64 or 128";
  if (stride < 1 || block_size % stride != 0 || select_size % stride != 0) return "d must divide l and l'";
  if (block_size / stride - 1 > kNsaMaxHalo) return "l / d must be at most 17";
  const int64_t ratio = select_size / stride;
  if (ratio < 1 || kNsaStepKeys % ratio != 0) return "l' / d must divide 64";
  return nullptr;
}

}  // namespace jax_topk
