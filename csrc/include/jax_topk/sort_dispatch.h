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
  kDeviceRadix = 3,  // rows in chunks: (row, key, index) packed into 64 bits, one
                     // device-wide CUB radix sort (onesweep) per chunk over the
                     // row and key bits
};

inline const char* sort_regime_name(SortRegime r) {
  switch (r) {
    case SortRegime::kEmpty: return "empty";
    case SortRegime::kRowInWarp: return "row_in_warp";
    case SortRegime::kRowInBlock: return "row_in_block";
    case SortRegime::kDeviceRadix: return "device_radix";
  }
  return "?";
}

// The device-wide path packs (row, key, index) into one u64: keys of at most
// 32 bits. Wider keys (float64, int64, uint64) are not sorted by the CUDA
// kernels (the op lowers to the pure-JAX sort there).
constexpr bool sort_cuda_dtype(DType d) { return dtype_bytes(d) <= 4; }

// Longest row sorted by one warp: 32 lanes x 32 packed u64 (64 registers per
// lane). A row of n takes sort_warp_slots(n) = next power of two >= n / 32
// slots per lane. On an H200 the block radix sort spent ~121 us on 16384 rows
// of 256 (its 7 digit passes, each a chain of block barriers).
inline constexpr int64_t kSortWarpMaxN = 1024;
inline constexpr int64_t kWarpSizeForSort = 32;  // cuda::kWarpSize, for host code without CUDA headers

constexpr int sort_warp_slots(int64_t n) {
  int e = 1;
  while (int64_t(e) * kWarpSizeForSort < n) e *= 2;
  return e;
}

// Block shapes of the row-in-block regime (kSortWarpMaxN < n <= kSortBlockMaxN),
// smallest first: a row of n takes the first shape holding threads * items >= n
// elements.
struct SortBlockShape {
  int threads;
  int items;
  constexpr int64_t capacity() const { return int64_t(threads) * items; }
};
inline constexpr SortBlockShape kSortBlockShapes[] = {
    {256, 8}, {512, 8},
};
inline constexpr int kSortBlockShapeCount = int(sizeof(kSortBlockShapes) / sizeof(kSortBlockShapes[0]));
// Longest row sorted in one block.
inline constexpr int64_t kSortBlockMaxN = kSortBlockShapes[kSortBlockShapeCount - 1].capacity();
// Digit width of the block radix sort: CUB keeps (2^bits / 2 + 1) packed
// counters per thread in shared memory, 34 KB at 5 bits and 512 threads,
// under the 48 KB of static shared memory.
inline constexpr int kSortBlockRadixBits = 5;

// Elements per device-wide sort: bounds the scratch (two u64 buffers per
// element, 1 GiB at 2^26) for very large arrays, which then take several.
inline constexpr int64_t kSortDeviceMaxChunkElements = int64_t(1) << 26;

constexpr int sort_block_shape(int64_t n) {
  for (int i = 0; i < kSortBlockShapeCount; ++i) {
    if (n <= kSortBlockShapes[i].capacity()) return i;
  }
  return -1;
}

constexpr SortRegime choose_sort_regime(int64_t rows, int64_t n) {
  if (rows <= 0 || n <= 0) return SortRegime::kEmpty;
  if (n <= kSortWarpMaxN) return SortRegime::kRowInWarp;
  return n <= kSortBlockMaxN ? SortRegime::kRowInBlock : SortRegime::kDeviceRadix;
}

// Bits that hold 0 .. v-1 (0 for v <= 1).
constexpr int bits_for_count(int64_t v) {
  int b = 0;
  while (b < 63 && (int64_t(1) << b) < v) ++b;
  return b;
}

// Rows per device-wide sort: the packed row number, key and index fit in 64
// bits, and at most kSortDeviceMaxChunkElements elements (at least one row).
constexpr int64_t sort_device_chunk_rows(int64_t rows, int64_t n, int key_bits) {
  const int free_bits = 64 - key_bits - bits_for_count(n);
  int64_t chunk = free_bits >= 62 ? rows : (int64_t(1) << free_bits);
  const int64_t by_size = kSortDeviceMaxChunkElements / (n > 0 ? n : 1);
  if (chunk > by_size) chunk = by_size;
  if (chunk > rows) chunk = rows;
  return chunk < 1 ? 1 : chunk;
}

}  // namespace jax_topk
