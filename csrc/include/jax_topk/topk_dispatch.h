// Which GPU top-k kernel runs for a problem: the one heuristic table.
//
// Every threshold below is a first guess from the design's cost model (see
// csrc/cuda/NOTES.md) and is to be tuned from measurements on H100/H200 with
// the self-test's --bench mode. Correctness never depends on them: every
// regime handles every (n, k) it is given, so moving a threshold only moves
// time.
//
// Plain C++ (no CUDA headers) so host code and tests can ask which regime a
// shape takes.
#pragma once

#include <cstdint>

namespace jax_topk {

enum class TopkRegime : int {
  kEmpty = 0,            // rows == 0 or k == 0: nothing to launch
  kTinyRows = 1,         // a group of 4..16 lanes per row (several rows per warp),
                         // per-lane sorted lists in registers + shuffle merges
  kSmallK = 2,           // the same kernel with a whole warp per row, plus a
                         // warp-wide pruning threshold
  kRadixRowPerBlock = 3, // radix select, one block per row, all passes in one kernel
  kRadixSplitRow = 4,    // radix select, several blocks per row, one launch per pass
  kThresholdRowPerBlock = 5,  // one block per row: group-maxima threshold, one
                              // compaction read, sort of the ~k..2k candidates
};

inline const char* topk_regime_name(TopkRegime r) {
  switch (r) {
    case TopkRegime::kEmpty: return "empty";
    case TopkRegime::kTinyRows: return "tiny_rows";
    case TopkRegime::kSmallK: return "small_k";
    case TopkRegime::kRadixRowPerBlock: return "radix_row_per_block";
    case TopkRegime::kRadixSplitRow: return "radix_split_row";
    case TopkRegime::kThresholdRowPerBlock: return "threshold_row_per_block";
  }
  return "?";
}

// --- Warp-sort regimes (kTinyRows, kSmallK) --------------------------------
// Largest k kept in per-lane register lists (list capacity = next power of two
// >= k; 32 packed u64 per lane already costs ~64 registers).
inline constexpr int64_t kWarpSortMaxK = 32;
// Rows up to this length use fewer than 32 lanes per row.
inline constexpr int64_t kTinyRowsMaxN = 256;
// Elements per lane targeted when choosing the group size for tiny rows.
inline constexpr int64_t kTinyRowsElemsPerLane = 8;
// Longest row a single warp handles. Packed (key, index) for 8/16-bit keys is
// a u32 with a 16-bit index, so this must stay below 65535.
inline constexpr int64_t kWarpSortMaxN = 16384;
// Rows longer than this go to the warp kernel only when there are enough rows
// to fill the chip with warps (a lone warp streaming a long row is latency
// bound; radix select spreads the row over blocks instead).
inline constexpr int64_t kWarpSortAlwaysN = 2048;
inline constexpr int64_t kWarpSortMinRowsPerSm = 4;
// Rows up to this length take the threshold-filter kernel (warp_select: the
// row in registers, at most 64 slots per lane); longer warp-regime rows take
// the register-list kernel (warp_sort).
inline constexpr int64_t kWarpSelectMaxN = 2048;

// --- Radix regimes ---------------------------------------------------------
// With at least this many rows per SM, one block per row fills the chip.
inline constexpr int64_t kRadixRowsPerSmForRowPerBlock = 1;
// A row is split over several blocks only when it is at least this long.
inline constexpr int64_t kRadixSplitMinN = 16384;
// Elements per block when a row is split (smaller chunks: more launch-width
// parallelism, more histogram merging).
inline constexpr int64_t kRadixSplitMinChunk = 8192;
// Blocks per SM the split-row grid aims at.
inline constexpr int64_t kRadixSplitBlocksPerSm = 2;

// Threshold kernel (kThresholdRowPerBlock, keys of at most 32 bits): largest
// k (4096 group maxima per block = 2k; the candidates, ~1.4k, sorted in
// shared memory).
inline constexpr int64_t kThresholdMaxK = 2048;
// With fewer rows than SMs, a row is still given to ONE threshold block (two
// reads of the row by one block, ~45 GB/s each, plus the candidate sort)
// while the row is at most this many bytes: 512 KB reads in ~12 us + ~6 us
// from L2, well under the split-row kernel's 8 launches and 5-6 reads.
// Longer rows (1 x 2^20) stay on the split-row kernel, whose parallelism
// across blocks wins there.
inline constexpr int64_t kThresholdFewRowsMaxRowBytes = int64_t(512) * 1024;
// ... and only while the rows occupy a fair part of the chip: on an H200 one
// block per row beat the split-row kernel at 64 rows (64x65536 k2048: 93.7 vs
// 163.5 us; 128x131072 k1024: 84 vs 233) but lost at 1 row (1x131072 k2048:
// 106 vs 71). The crossover between 1 and 64 rows is not measured yet.
inline constexpr int64_t kThresholdFewRowsMinSmDivisor = 4;  // rows >= sm_count / 4

// Number of lanes (4, 8, 16 or 32) that cooperate on one row in the warp-sort
// kernel: about kTinyRowsElemsPerLane elements per lane for short rows.
constexpr int warp_sort_lanes_per_row(int64_t n) {
  int lanes = 4;
  while (lanes < 32 && n > lanes * kTinyRowsElemsPerLane) lanes *= 2;
  return lanes;
}

constexpr TopkRegime choose_topk_regime(int64_t rows, int64_t n, int64_t k,
                                        int elem_bytes, int sm_count) {
  if (rows <= 0 || k <= 0) return TopkRegime::kEmpty;
  const bool warp_sort_fits = elem_bytes <= 4 && k <= kWarpSortMaxK && n <= kWarpSortMaxN;
  const bool warp_sort_fills = n <= kWarpSortAlwaysN || rows >= kWarpSortMinRowsPerSm * sm_count;
  if (warp_sort_fits && warp_sort_fills) {
    return warp_sort_lanes_per_row(n) < 32 ? TopkRegime::kTinyRows : TopkRegime::kSmallK;
  }
  const bool threshold_fits = elem_bytes <= 4 && k <= kThresholdMaxK;
  if (rows >= kRadixRowsPerSmForRowPerBlock * sm_count || n < kRadixSplitMinN) {
    return threshold_fits ? TopkRegime::kThresholdRowPerBlock : TopkRegime::kRadixRowPerBlock;
  }
  if (threshold_fits && n * elem_bytes <= kThresholdFewRowsMaxRowBytes &&
      rows * kThresholdFewRowsMinSmDivisor >= sm_count) {
    return TopkRegime::kThresholdRowPerBlock;
  }
  return TopkRegime::kRadixSplitRow;
}

// Blocks cooperating on one row in kRadixSplitRow: enough blocks in all to
// give each SM kRadixSplitBlocksPerSm, each with at least kRadixSplitMinChunk
// elements.
constexpr int64_t radix_blocks_per_row(int64_t rows, int64_t n, int sm_count) {
  const int64_t want = (kRadixSplitBlocksPerSm * sm_count + rows - 1) / rows;
  const int64_t most = (n + kRadixSplitMinChunk - 1) / kRadixSplitMinChunk;
  const int64_t b = want < most ? want : most;
  return b < 1 ? 1 : b;
}

}  // namespace jax_topk
