// Which GPU sort kernel runs for a problem: the one table of the sort family.
//
// Plain C++ (no CUDA headers), so the host planning, the FFI module and tests
// read the same thresholds. Correctness never depends on them: both regimes
// sort any row; moving a threshold only moves time.
#pragma once

#include <cstdint>

#include "jax_topk/dtypes.h"

namespace jax_topk {

enum class SortRegime : int {
  kEmpty = 0,        // no element to write
  kRowInWarp = 1,    // one warp per row: packed (key, ~index) in registers, a
                     // bitonic network (in-register and shuffle stages)
  kRowInBlock = 2,   // one block per row: the row in registers, a CUB block radix sort
  kRowTiles = 3,     // rows cut into tiles of kSortTileElements: an LSD radix sort,
                     // one stable counting sort of every row per 8-bit digit (one
                     // block per tile; a decoupled look-back over the row's tiles)
};

inline const char* sort_regime_name(SortRegime r) {
  switch (r) {
    case SortRegime::kEmpty: return "empty";
    case SortRegime::kRowInWarp: return "row_in_warp";
    case SortRegime::kRowInBlock: return "row_in_block";
    case SortRegime::kRowTiles: return "row_tiles";
  }
  return "?";
}

// Keys of at most 32 bits (the tile regime carries a 32-bit index beside each
// key through its passes). Wider keys (float64, int64, uint64) are not sorted
// by the CUDA kernels (the op lowers to the pure-JAX sort there).
constexpr bool sort_gpu_dtype(DType d) { return dtype_bytes(d) <= 4; }

// Longest row sorted by one warp. A row of n takes sort_warp_slots(n) = next
// power of two >= n / 32 packed u64 per lane. On an H200 (float32, 16384 or
// 8192 rows; benchmarks/results/NOTES.md) the warp network against the block
// radix sort: n = 128 43 against 94 us, 256 107 against 99, 512 318 against
// 174, 1024 525 against 168: its 64-bit compare-exchanges grow as n log^2 n.
inline constexpr int64_t kSortWarpMaxN = 128;
inline constexpr int64_t kWarpSizeForSort = 32;  // cuda::kWarpSize, for host code without CUDA headers

constexpr int sort_warp_slots(int64_t n) {
  int e = 1;
  while (int64_t(e) * kWarpSizeForSort < n) e *= 2;
  return e;
}

// Block shapes of the row-in-block regime (kSortWarpMaxN < n <= kSortBlockMaxN),
// smallest first: a row of n takes the first shape holding threads * items >= n
// elements. On an H200 the largest block shapes beat the tile regime at their
// capacity: 1024x8192 float32 221 against 333 us, 512x16384 245 against 355.
struct SortBlockShape {
  int threads;
  int items;
  constexpr int64_t capacity() const { return int64_t(threads) * items; }
};
inline constexpr SortBlockShape kSortBlockShapes[] = {
    {32, 8}, {64, 8}, {128, 8}, {256, 8}, {512, 8}, {1024, 8}, {1024, 16},
};
inline constexpr int kSortBlockShapeCount = int(sizeof(kSortBlockShapes) / sizeof(kSortBlockShapes[0]));
// Longest row sorted in one block.
inline constexpr int64_t kSortBlockMaxN = kSortBlockShapes[kSortBlockShapeCount - 1].capacity();
// Digit width of the block radix sort: CUB keeps (2^bits / 2 + 1) packed
// counters per thread in shared memory, 68 KB at 5 bits and 1024 threads
// (dynamic shared memory; two such blocks fill an SM's threads).
inline constexpr int kSortBlockRadixBits = 5;

// kRowTiles. A block of kSortTileThreads threads ranks kSortTileItems
// elements each; one thread per digit value does the look-back.
inline constexpr int kSortDigitBits = 8;
inline constexpr int kSortDigitValues = 1 << kSortDigitBits;
inline constexpr int kSortTileThreads = kSortDigitValues;
inline constexpr int kSortTileItems = 16;
inline constexpr int64_t kSortTileElements = int64_t(kSortTileThreads) * kSortTileItems;
// Elements sorted per chunk of rows: bounds the scratch (the keys and indices
// between passes, 8 bytes per element of 32-bit keys: 512 MiB at 2^26) for
// very large arrays, which then take several chunks.
inline constexpr int64_t kSortChunkMaxElements = int64_t(1) << 26;

constexpr int64_t sort_tiles_per_row(int64_t n) { return (n + kSortTileElements - 1) / kSortTileElements; }

// Rows per chunk of the tile regime: at most kSortChunkMaxElements elements
// (at least one row).
constexpr int64_t sort_chunk_rows(int64_t rows, int64_t n) {
  int64_t chunk = kSortChunkMaxElements / (n > 0 ? n : 1);
  if (chunk > rows) chunk = rows;
  return chunk < 1 ? 1 : chunk;
}

constexpr int sort_block_shape(int64_t n) {
  for (int i = 0; i < kSortBlockShapeCount; ++i) {
    if (n <= kSortBlockShapes[i].capacity()) return i;
  }
  return -1;
}

// Whether `regime` can sort rows of n (every regime but kEmpty sorts any row
// its capacity holds: tests and benchmarks run them past their thresholds).
constexpr bool sort_regime_holds(SortRegime regime, int64_t n) {
  switch (regime) {
    case SortRegime::kEmpty: return false;
    case SortRegime::kRowInWarp: return n <= kSortWarpMaxN;
    case SortRegime::kRowInBlock: return n <= kSortBlockMaxN;
    case SortRegime::kRowTiles: return true;
  }
  return false;
}

constexpr SortRegime choose_sort_regime(int64_t rows, int64_t n) {
  if (rows <= 0 || n <= 0) return SortRegime::kEmpty;
  if (n <= kSortWarpMaxN) return SortRegime::kRowInWarp;
  return n <= kSortBlockMaxN ? SortRegime::kRowInBlock : SortRegime::kRowTiles;
}

}  // namespace jax_topk
