// CUDA stable sort of rows (regimes in jax_topk/sort_dispatch.h).
//
// Output slot j of a row of length L holds the j-th sorted element when
// j < L, else the dtype's lowest value and index -1; ties keep the lower
// index first in both directions.
//
// The two radix regimes sort "sort keys" ASCENDING with a stable radix sort
// whose input is in index order, which orders ties:
//   sort key = ordered key (ascending) or its complement (descending);
//   slots past a row's length get the largest sort key, and being later in
//   the input than every real element, they land after all of them.
// The warp regime sorts distinct packed (key, ~index) integers instead.
//
// - kRowInWarp (n <= kSortWarpMaxN): one warp per row; each element becomes
//   packed (t, ~index) with t = the key (descending) or its complement
//   (ascending), slots past the length (t = 0, ~index) and past the row (0)
//   fall below every element; a bitonic network sorts the packed values
//   descending (distinct values: one result). Lane l's slot e holds element
//   32e + l on load (coalesced) and network position E*l + e: stages with
//   stride >= E swap across lanes by shuffles, the rest in registers.
// - kRowInBlock (n <= kSortBlockMaxN): one block per row, the row in
//   registers (blocked: thread t holds elements t*items .. t*items+items-1),
//   a block radix sort (CUB, rocPRIM) of (sort key, index) pairs, written back striped
//   (coalesced).
// - kRowTiles: rows in chunks (scratch bound); an LSD radix sort of 8-bit
//   digits where each pass is a stable counting sort WITHIN every row, so the
//   row never becomes part of the key: one kernel counts every row's digits
//   for all passes, then one launch per digit (sizeof(key) of them), one
//   block per tile of kSortTileElements (see sort_tile_pass_kernel). Reads
//   the keys twice and moves (key, index) pairs between passes; the first
//   pass reads the input, the last writes the outputs.
// Deterministic: radix sorts are stable, and the packing leaves no choice;
// the tile passes' look-back only sums counts, in a fixed order.


#include <climits>
#include <cstdint>

#include "cuda/dependent_launch.cuh"
#include "cuda/primitives.cuh"
#include "cuda/scratch.h"
#include "cuda/sort_cuda.h"
#include "jax_topk/sort_dispatch.h"

namespace jax_topk::cuda {
namespace {

// Element bits <-> sort key for one direction.
template <typename U>
struct SortKeyMap {
  KeyCodec<U> codec;
  bool descending;

  __device__ JAX_TOPK_FORCE_INLINE U sort_key(U bits) const {
    const U key = codec.key(bits);
    return descending ? U(~key) : key;
  }
  __device__ JAX_TOPK_FORCE_INLINE U bits(U sort_key) const {
    return codec.bits(descending ? U(~sort_key) : sort_key);
  }
  // What slots past a row's length sort as: after everything.
  static constexpr U kPastLength = U(~U(0));
};

template <typename U>
__device__ JAX_TOPK_FORCE_INLINE void write_sorted_slot(bool real, U sort_key, int32_t index,
                                                        const SortKeyMap<U>& map, U pad_bits,
                                                        U* values, int32_t* indices, int64_t at) {
  values[at] = real ? map.bits(sort_key) : pad_bits;
  indices[at] = real ? index : int32_t(-1);
}

// ---------------------------------------------------------------------------
// kRowInWarp
static_assert(kWarpSizeForSort == kWarpSize, "sort_dispatch.h's warp width is the kernels' warp width");
inline constexpr int kSortWarpThreads = 128;

// Sorts the warp's 32 * E packed values descending; lane l's v[e] is network
// position E * l + e. Runs (sizes) alternate direction by the position's
// `size` bit; the last run is descending everywhere.
template <int E>
__device__ JAX_TOPK_FORCE_INLINE void warp_bitonic_sort_desc(uint64_t (&v)[E], int lane) {
JAX_TOPK_UNROLL
  for (int size = 2; size <= 32 * E; size *= 2) {
JAX_TOPK_UNROLL
    for (int stride = size / 2; stride > 0; stride /= 2) {
      if (stride >= E) {  // partner: the same slot of lane ^ (stride / E)
        const bool lower = (lane & (stride / E)) == 0;
JAX_TOPK_UNROLL
        for (int e = 0; e < E; ++e) {
          const bool desc = (((lane * E) + e) & size) == 0;
          const uint64_t other = shfl_xor_wide(v[e], stride / E);
          v[e] = (lower == desc) ? max_of(v[e], other) : min_of(v[e], other);
        }
      } else {  // partner: slot e ^ stride of the same lane
JAX_TOPK_UNROLL
        for (int e = 0; e < E; ++e) {
          if ((e & stride) != 0) continue;
          const int f = e | stride;
          const bool desc = (((lane * E) + e) & size) == 0;
          const uint64_t hi = max_of(v[e], v[f]), lo = min_of(v[e], v[f]);
          v[e] = desc ? hi : lo;
          v[f] = desc ? lo : hi;
        }
      }
    }
  }
}

template <typename U, int E>
__global__ void __launch_bounds__(kSortWarpThreads)
    sort_rows_in_warp_kernel(const U* __restrict__ x, U* __restrict__ values,
                             int32_t* __restrict__ indices, int64_t rows, int n,
                             SortKeyMap<U> map, RowLengths<U> lengths) {
  using Pack = KeyIndexPacking<U, uint64_t>;
  const int lane = lane_id();
  const int64_t warps = int64_t(gridDim.x) * (kSortWarpThreads / kWarpSize);
  for (int64_t row = (int64_t(blockIdx.x) * kSortWarpThreads + threadIdx.x) / kWarpSize; row < rows;
       row += warps) {
    const U* in = x + row * n;
    const int len = int(lengths.of_loaded(row, n));
    uint64_t v[E];
JAX_TOPK_UNROLL
    for (int e = 0; e < E; ++e) {
      const int i = e * kWarpSize + lane;
      const U t = i < len ? U(~map.sort_key(in[i])) : U(0);
      v[e] = i < n ? Pack::pack(t, uint32_t(i)) : uint64_t(0);
    }
    warp_bitonic_sort_desc<E>(v, lane);
JAX_TOPK_UNROLL
    for (int e = 0; e < E; ++e) {
      const int j = lane * E + e;
      if (j < n) {
        write_sorted_slot(j < len, U(~Pack::key(v[e])), int32_t(Pack::index(v[e])), map, lengths.pad_bits,
                          values, indices, row * n + j);
      }
    }
  }
}

template <typename U, int E = 1>
gpuError_t launch_rows_in_warp(int slots, const U* x, U* values, int32_t* indices, int64_t rows, int64_t n,
                                SortKeyMap<U> map, RowLengths<U> lengths, gpuStream_t stream) {
  if constexpr (E <= kSortWarpMaxN / kWarpSize) {
    if (slots != E) {
      return launch_rows_in_warp<U, 2 * E>(slots, x, values, indices, rows, n, map, lengths, stream);
    }
    constexpr int64_t kRowsPerBlock = kSortWarpThreads / kWarpSize;
    int64_t grid = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    if (grid > INT_MAX) grid = INT_MAX;
    sort_rows_in_warp_kernel<U, E><<<unsigned(grid), kSortWarpThreads, 0, stream>>>(
        x, values, indices, rows, int(n), map, lengths);
    return gpuGetLastError();
  } else {
    return gpuErrorInvalidValue;  // n > kSortWarpMaxN: not this regime
  }
}

// ---------------------------------------------------------------------------
// kRowInBlock
template <typename U, int kThreads, int kItems>
using RowBlockSort = BlockRadixSortPairs<U, kThreads, kItems, int32_t, kSortBlockRadixBits>;

// CUB's temporaries live in dynamic shared memory: at 1024 threads they
// outgrow the 48 KB a kernel may declare statically.
template <typename U, int kThreads, int kItems>
__global__ void __launch_bounds__(kThreads)
    sort_rows_in_block_kernel(const U* __restrict__ x, U* __restrict__ values,
                              int32_t* __restrict__ indices, int64_t rows, int n,
                              SortKeyMap<U> map, RowLengths<U> lengths) {
  using BlockSort = RowBlockSort<U, kThreads, kItems>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  auto& temp = *reinterpret_cast<typename BlockSort::TempStorage*>(dynamic_smem);
  const int tid = int(threadIdx.x);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const U* in = x + row * n;
    const int len = int(lengths.of_loaded(row, n));
    U key[kItems];
    int32_t index[kItems];
JAX_TOPK_UNROLL
    for (int i = 0; i < kItems; ++i) {
      const int j = tid * kItems + i;
      index[i] = j;
      key[i] = j < len ? map.sort_key(in[j]) : SortKeyMap<U>::kPastLength;
    }
    BlockSort::sort_blocked_to_striped(temp, key, index);
JAX_TOPK_UNROLL
    for (int i = 0; i < kItems; ++i) {
      const int j = i * kThreads + tid;
      if (j < n) write_sorted_slot(j < len, key[i], index[i], map, lengths.pad_bits, values, indices, row * n + j);
    }
    __syncthreads();  // `temp` is reused by the block's next row
  }
}

template <typename U, int kShape>
gpuError_t launch_rows_in_block(const U* x, U* values, int32_t* indices, int64_t rows, int64_t n,
                                 SortKeyMap<U> map, RowLengths<U> lengths, gpuStream_t stream) {
  constexpr SortBlockShape kS = kSortBlockShapes[kShape];
  constexpr size_t kSmem = sizeof(typename RowBlockSort<U, kS.threads, kS.items>::TempStorage);
  auto* kernel = sort_rows_in_block_kernel<U, kS.threads, kS.items>;
  if (kSmem > 48 * 1024) {  // per launch: the attribute is per device (multi-GPU processes)
    const gpuError_t err = gpu_set_max_dynamic_smem(kernel, int(kSmem));
    if (err != gpuSuccess) return err;
  }
  const int64_t grid = rows < INT_MAX ? rows : INT_MAX;
  kernel<<<unsigned(grid), kS.threads, kSmem, stream>>>(x, values, indices, rows, int(n), map, lengths);
  return gpuGetLastError();
}

template <typename U, int kShape = 0>
gpuError_t dispatch_rows_in_block(int shape, const U* x, U* values, int32_t* indices, int64_t rows,
                                   int64_t n, SortKeyMap<U> map, RowLengths<U> lengths,
                                   gpuStream_t stream) {
  if constexpr (kShape < kSortBlockShapeCount) {
    if (shape == kShape) return launch_rows_in_block<U, kShape>(x, values, indices, rows, n, map, lengths, stream);
    return dispatch_rows_in_block<U, kShape + 1>(shape, x, values, indices, rows, n, map, lengths, stream);
  } else {
    return gpuErrorInvalidValue;  // n > kSortBlockMaxN: not this regime
  }
}

// ---------------------------------------------------------------------------
// kRowTiles
//
// Status of one (tile, digit) in a pass's look-back: a flag in the top two
// bits over the count. Zero: not published yet.
inline constexpr uint64_t kTileAggregate = uint64_t(1) << 62;  // count: this tile's elements of the digit
inline constexpr uint64_t kTileInclusive = uint64_t(2) << 62;  // count: the row's tiles up to this one
inline constexpr uint64_t kTileCountMask = (uint64_t(1) << 62) - 1;

static_assert(kSortTileThreads == kSortDigitValues, "thread d of a tile block owns digit d");
static_assert(kSortTileThreads / kWarpSize <= kWarpSize, "block_exclusive_sum scans the warps in one warp");

template <typename U>
__device__ JAX_TOPK_FORCE_INLINE int sort_digit(U key, int shift) {
  return int((uint32_t(key) >> shift) & uint32_t(kSortDigitValues - 1));
}

// One pass's operands. Chunk rows are numbered from 0; `row0` places the chunk
// in the input and the outputs.
template <typename U>
struct TilePass {
  const U* x;                  // first pass: the input rows (raw bits)
  const U* keys_in;            // later passes: sort keys and indices of the
  const uint32_t* indices_in;  //   previous pass, [chunk rows, n]
  U* keys_out;                 // all passes but the last
  uint32_t* indices_out;
  U* values;                   // the last pass: the outputs
  int32_t* indices;
  const uint32_t* row_digit_counts;  // [chunk rows][sizeof(U) passes][digit values]
  uint64_t* status;                  // this pass: [tiles][digit values]
  uint64_t* next_status;             // the next pass's (zeroed here), or null
  uint32_t* tile_counter;            // this pass's; zero before the launch
  int64_t row0;
  int n;
  int tiles_per_row;
  int pass;
  SortKeyMap<U> map;
  RowLengths<U> lengths;
};

// Spins until a tile has published this (tile, digit) status word; returns it.
__device__ JAX_TOPK_FORCE_INLINE uint64_t wait_for_status(const uint64_t* status) {
  uint64_t s;
  do {
    s = *reinterpret_cast<const volatile uint64_t*>(status);
  } while (s == 0);
  return s;
}

__device__ JAX_TOPK_FORCE_INLINE void publish_status(uint64_t* status, uint64_t s) {
  *reinterpret_cast<volatile uint64_t*>(status) = s;
}

// One pass: a stable counting sort of every row of the chunk by the digit at
// bit 8 * pass. One block per tile of kSortTileElements; tiles are numbered by
// an atomic counter in the order blocks start, so a tile only ever waits for
// tiles already running (no deadlock whatever the scheduling). A block:
//  1. loads its tile: item i of lane l in warp w is tile position
//     w * 32 * kItems + 32 * i + l (coalesced; each warp holds a contiguous span);
//  2. ranks every element among the tile's elements of its digit in position
//     order: each warp walks its items in order, __match_any_sync finds the
//     lanes sharing a digit, and per-warp counters add the earlier items;
//  3. publishes its digit counts and sums those of the row's earlier tiles
//     (decoupled look-back: thread d walks back over digit d until a tile
//     with an inclusive count);
//  4. places each element in shared memory in (digit, rank) order and writes
//     position j of that order to row slot j + (elements of smaller digits in
//     the row) + (elements of its digit in earlier tiles) - (elements of
//     smaller digits in the tile): consecutive j of one digit are consecutive
//     slots, so the stores run in coalesced runs.
// Three resident blocks per SM (80 registers; ptxas still spills 8-40 bytes):
// on an H200 four (64 registers) took 13% longer on 128x131072 float32.
inline constexpr int kSortTileMinBlocks = 3;

template <typename U, bool kFirst, bool kLast>
__global__ void __launch_bounds__(kSortTileThreads, kSortTileMinBlocks)
    sort_tile_pass_kernel(TilePass<U> a) {
  constexpr int kItems = kSortTileItems;
  constexpr int kWarps = kSortTileThreads / kWarpSize;
  constexpr int kTile = int(kSortTileElements);
  constexpr int kWarpSpan = kWarpSize * kItems;
  __shared__ uint32_t warp_digit_counts[kWarps][kSortDigitValues];  // then: exclusive over warps
  __shared__ uint32_t tile_digit_start[kSortDigitValues];
  __shared__ int32_t slot_shift[kSortDigitValues];
  __shared__ U staged_keys[kTile];
  __shared__ uint32_t staged_indices[kTile];
  __shared__ uint32_t scan_scratch[kWarps];
  __shared__ uint32_t tile_number;

  const int tid = int(threadIdx.x), lane = lane_id(), warp = tid / kWarpSize;
  wait_for_previous_grid();  // the counts, the look-back status and the keys of the pass before
  if (tid == 0) tile_number = atomicAdd(a.tile_counter, 1u);
JAX_TOPK_UNROLL
  for (int w = 0; w < kWarps; ++w) warp_digit_counts[w][tid] = 0;
  __syncthreads();
  const uint32_t tile = tile_number;
  const int r = int(tile / uint32_t(a.tiles_per_row));
  const int t = int(tile - uint32_t(r) * uint32_t(a.tiles_per_row));
  const int begin = t * kTile;
  const int count = a.n - begin < kTile ? a.n - begin : kTile;
  if (a.next_status != nullptr) a.next_status[size_t(tile) * kSortDigitValues + tid] = 0;
  const int shift = a.pass * kSortDigitBits;
  // Only the first pass (padding keys) and the last (padding outputs) read it.
  const int len = kFirst || kLast ? int(a.lengths.of_loaded(a.row0 + r, a.n)) : 0;
  const int64_t chunk_at = int64_t(r) * a.n + begin;  // the tile in the chunk's buffers

  U key[kItems];
  uint32_t index[kItems];
JAX_TOPK_UNROLL
  for (int i = 0; i < kItems; ++i) {
    const int pos = warp * kWarpSpan + i * kWarpSize + lane;
    key[i] = SortKeyMap<U>::kPastLength;
    index[i] = 0;
    if (pos < count) {
      if constexpr (kFirst) {
        index[i] = uint32_t(begin + pos);
        if (begin + pos < len) key[i] = a.map.sort_key(a.x[(a.row0 + r) * int64_t(a.n) + begin + pos]);
      } else {
        key[i] = a.keys_in[chunk_at + pos];
        index[i] = a.indices_in[chunk_at + pos];
      }
    }
  }

  uint32_t rank[kItems];
JAX_TOPK_UNROLL
  for (int i = 0; i < kItems; ++i) {
    const bool real = warp * kWarpSpan + i * kWarpSize + lane < count;
    const int d = sort_digit(key[i], shift);
    rank[i] = warp_digit_rank<kSortDigitBits>(d, real, &warp_digit_counts[warp][d]);
  }
  __syncthreads();

  // Thread d: digit d.
  uint32_t tile_count = 0;
JAX_TOPK_UNROLL
  for (int w = 0; w < kWarps; ++w) {
    const uint32_t c = warp_digit_counts[w][tid];
    warp_digit_counts[w][tid] = tile_count;
    tile_count += c;
  }
  uint64_t* status = a.status + size_t(tile) * kSortDigitValues + tid;
  publish_status(status, (t == 0 ? kTileInclusive : kTileAggregate) | tile_count);
  const uint32_t row_count = a.row_digit_counts[(size_t(r) * sizeof(U) + a.pass) * kSortDigitValues + tid];
  const uint32_t tile_start = block_exclusive_sum<kSortTileThreads>(tile_count, scan_scratch);
  const uint32_t row_start = block_exclusive_sum<kSortTileThreads>(row_count, scan_scratch);
  uint64_t earlier = 0;
  if (t > 0) {
    for (const uint64_t* back = status - kSortDigitValues;; back -= kSortDigitValues) {
      const uint64_t s = wait_for_status(back);
      earlier += s & kTileCountMask;
      if ((s & ~kTileCountMask) == kTileInclusive) break;
    }
    publish_status(status, kTileInclusive | (earlier + tile_count));
  }
  tile_digit_start[tid] = tile_start;
  slot_shift[tid] = int32_t(row_start + uint32_t(earlier)) - int32_t(tile_start);
  __syncthreads();

JAX_TOPK_UNROLL
  for (int i = 0; i < kItems; ++i) {
    if (warp * kWarpSpan + i * kWarpSize + lane < count) {
      const int d = sort_digit(key[i], shift);
      const uint32_t at = tile_digit_start[d] + warp_digit_counts[warp][d] + rank[i];
      staged_keys[at] = key[i];
      staged_indices[at] = index[i];
    }
  }
  __syncthreads();

  for (int j = tid; j < count; j += kSortTileThreads) {
    const U k = staged_keys[j];
    const uint32_t i = staged_indices[j];
    const int slot = slot_shift[sort_digit(k, shift)] + j;
    if constexpr (kLast) {
      write_sorted_slot(int(i) < len, k, int32_t(i), a.map, a.lengths.pad_bits, a.values, a.indices,
                        (a.row0 + r) * int64_t(a.n) + slot);
    } else {
      a.keys_out[int64_t(r) * a.n + slot] = k;
      a.indices_out[int64_t(r) * a.n + slot] = i;
    }
  }
}

// Counts every row's digits for every pass over one tile (the same tiling as
// the passes) and zeroes the tile's first-pass look-back status.
template <typename U>
__global__ void __launch_bounds__(kSortTileThreads)
    sort_tile_digit_counts_kernel(const U* __restrict__ x, uint32_t* __restrict__ row_digit_counts,
                                  uint64_t* __restrict__ first_status, int64_t row0, int n,
                                  int tiles_per_row, SortKeyMap<U> map, RowLengths<U> lengths) {
  constexpr int kPasses = int(sizeof(U));
  constexpr int kTile = int(kSortTileElements);
  __shared__ uint32_t counts[kPasses][kSortDigitValues];
  const int tid = int(threadIdx.x);
JAX_TOPK_UNROLL
  for (int p = 0; p < kPasses; ++p) counts[p][tid] = 0;
  first_status[size_t(blockIdx.x) * kSortDigitValues + tid] = 0;
  __syncthreads();
  const int r = int(blockIdx.x / unsigned(tiles_per_row));
  const int begin = int(blockIdx.x - unsigned(r) * unsigned(tiles_per_row)) * kTile;
  const int end = n - begin < kTile ? n : begin + kTile;
  const int len = int(lengths.of_loaded(row0 + r, n));
  const U* in = x + (row0 + r) * int64_t(n);
  for (int i = begin + tid; i < end; i += kSortTileThreads) {
    const U key = i < len ? map.sort_key(in[i]) : SortKeyMap<U>::kPastLength;
JAX_TOPK_UNROLL
    for (int p = 0; p < kPasses; ++p) atomicAdd(&counts[p][sort_digit(key, p * kSortDigitBits)], 1u);
  }
  __syncthreads();
JAX_TOPK_UNROLL
  for (int p = 0; p < kPasses; ++p) {
    if (counts[p][tid] != 0) {
      atomicAdd(&row_digit_counts[(size_t(r) * kPasses + p) * kSortDigitValues + tid], counts[p][tid]);
    }
  }
}

// Scratch of the tile regime, reused by every chunk.
struct TilePlan {
  int64_t chunk_rows = 0;
  size_t keys = 0, indices = 0, row_digit_counts = 0, tile_counters = 0, status[2] = {0, 0};
  size_t zeroed_bytes = 0;  // row_digit_counts and tile_counters: one memset per chunk
  size_t total_bytes = 0;
};

template <typename U>
TilePlan plan_row_tiles(int64_t rows, int64_t n) {
  constexpr int kPasses = int(sizeof(U));
  TilePlan p;
  p.chunk_rows = sort_chunk_rows(rows, n);
  const size_t count = size_t(p.chunk_rows * n);
  const size_t tiles = size_t(p.chunk_rows * sort_tiles_per_row(n));
  ScratchCursor cur;
  if (kPasses > 1) {  // between passes (the outputs hold the others)
    p.keys = cur.take(count * sizeof(U));
    p.indices = cur.take(count * sizeof(uint32_t));
  }
  p.row_digit_counts = cur.take(size_t(p.chunk_rows) * kPasses * kSortDigitValues * sizeof(uint32_t));
  p.tile_counters = cur.take(kPasses * sizeof(uint32_t));
  p.zeroed_bytes = cur.used - p.row_digit_counts;
  for (size_t& s : p.status) s = cur.take(tiles * kSortDigitValues * sizeof(uint64_t));
  p.total_bytes = cur.used;
  return p;
}

// Passes run x -> A -> values -> A -> values for 32-bit keys (A: scratch; the
// outputs hold the middle pass), x -> A -> values for 16-bit keys, x -> values
// for 8-bit keys.
template <typename U>
gpuError_t run_row_tiles(const U* x, U* values, int32_t* indices, int64_t rows, int64_t n,
                          SortKeyMap<U> map, RowLengths<U> lengths, void* scratch,
                          size_t scratch_bytes, gpuStream_t stream) {
  constexpr int kPasses = int(sizeof(U));
  const TilePlan plan = plan_row_tiles<U>(rows, n);
  if (plan.total_bytes > scratch_bytes || scratch == nullptr) return gpuErrorInvalidValue;
  DeviceInfo dev;
  if (gpuError_t err = query_device(&dev); err != gpuSuccess) return err;
  const int tiles_per_row = int(sort_tiles_per_row(n));
  for (int64_t row0 = 0; row0 < rows; row0 += plan.chunk_rows) {
    const int64_t chunk_rows = rows - row0 < plan.chunk_rows ? rows - row0 : plan.chunk_rows;
    const unsigned tiles = unsigned(chunk_rows * tiles_per_row);
    gpuError_t err = gpuMemsetAsync(at<char>(scratch, plan.row_digit_counts), 0, plan.zeroed_bytes, stream);
    if (err != gpuSuccess) return err;
    uint64_t* status[2] = {at<uint64_t>(scratch, plan.status[0]), at<uint64_t>(scratch, plan.status[1])};
    sort_tile_digit_counts_kernel<U><<<tiles, kSortTileThreads, 0, stream>>>(
        x, at<uint32_t>(scratch, plan.row_digit_counts), status[0], row0, int(n), tiles_per_row, map,
        lengths);
    if ((err = gpuGetLastError()) != gpuSuccess) return err;
    // Buffers between passes: A (scratch) and the outputs' chunk, alternating.
    U* const buf_keys[2] = {kPasses > 1 ? at<U>(scratch, plan.keys) : nullptr, values + row0 * n};
    uint32_t* const buf_indices[2] = {kPasses > 1 ? at<uint32_t>(scratch, plan.indices) : nullptr,
                                      reinterpret_cast<uint32_t*>(indices + row0 * n)};
    for (int pass = 0; pass < kPasses; ++pass) {
      TilePass<U> a{};
      a.x = x;
      if (pass > 0) {
        a.keys_in = buf_keys[(pass - 1) % 2];
        a.indices_in = buf_indices[(pass - 1) % 2];
      }
      a.keys_out = buf_keys[pass % 2];
      a.indices_out = buf_indices[pass % 2];
      a.values = values;
      a.indices = indices;
      a.row_digit_counts = at<uint32_t>(scratch, plan.row_digit_counts);
      a.status = status[pass % 2];
      a.next_status = pass + 1 < kPasses ? status[(pass + 1) % 2] : nullptr;
      a.tile_counter = at<uint32_t>(scratch, plan.tile_counters) + pass;
      a.row0 = row0;
      a.n = int(n);
      a.tiles_per_row = tiles_per_row;
      a.pass = pass;
      a.map = map;
      a.lengths = lengths;
      const bool first = pass == 0, last = pass + 1 == kPasses;
      auto* kernel = first ? (last ? sort_tile_pass_kernel<U, true, true> : sort_tile_pass_kernel<U, true, false>)
                           : (last ? sort_tile_pass_kernel<U, false, true> : sort_tile_pass_kernel<U, false, false>);
      err = launch_dependent(dev, kernel, dim3(tiles), dim3(kSortTileThreads), 0, stream, a);
      if (err != gpuSuccess) return err;
    }
  }
  return gpuSuccess;
}

bool valid_problem(DType dtype, int64_t rows, int64_t n) {
  return sort_gpu_dtype(dtype) && rows >= 0 && n >= 0 && n <= int64_t(INT32_MAX);
}

}  // namespace

size_t sort_scratch_bytes(DType dtype, int64_t rows, int64_t n, SortRegime regime) {
  if (!valid_problem(dtype, rows, n) || rows == 0 || n == 0 || regime != SortRegime::kRowTiles) return 0;
  size_t bytes = 0;
  visit_dtype(dtype, [&](auto traits) {
    using U = typename decltype(traits)::Bits;
    if constexpr (sizeof(U) <= 4) bytes = plan_row_tiles<U>(rows, n).total_bytes;
  });
  return bytes;
}

size_t sort_scratch_bytes(DType dtype, int64_t rows, int64_t n) {
  return sort_scratch_bytes(dtype, rows, n, choose_sort_regime(rows, n));
}

gpuError_t sort_rows(DType dtype, const void* x, void* values, int32_t* indices, int64_t rows,
                      int64_t n, bool descending, const int32_t* lengths, void* scratch,
                      size_t scratch_bytes, gpuStream_t stream, SortRegime regime) {
  if (!valid_problem(dtype, rows, n)) return gpuErrorInvalidValue;
  if (rows == 0 || n == 0) return gpuSuccess;
  if (!sort_regime_holds(regime, n)) return gpuErrorInvalidValue;
  gpuError_t err = gpuErrorInvalidValue;
  visit_dtype(dtype, [&](auto traits) {
    using Traits = decltype(traits);
    using U = typename Traits::Bits;
    if constexpr (sizeof(U) <= 4) {
      const SortKeyMap<U> map{make_key_codec<Traits::kKeyKind, U>(), descending};
      const RowLengths<U> row_lengths{lengths, Traits::kLowestBits};
      const U* in = static_cast<const U*>(x);
      U* out = static_cast<U*>(values);
      switch (regime) {
        case SortRegime::kRowInWarp:
          err = launch_rows_in_warp<U>(sort_warp_slots(n), in, out, indices, rows, n, map, row_lengths, stream);
          break;
        case SortRegime::kRowInBlock:
          err = dispatch_rows_in_block<U>(sort_block_shape(n), in, out, indices, rows, n, map, row_lengths,
                                          stream);
          break;
        default:
          err = run_row_tiles<U>(in, out, indices, rows, n, map, row_lengths, scratch, scratch_bytes, stream);
      }
    }
  });
  return err;
}

gpuError_t sort_rows(DType dtype, const void* x, void* values, int32_t* indices, int64_t rows,
                      int64_t n, bool descending, const int32_t* lengths, void* scratch,
                      size_t scratch_bytes, gpuStream_t stream) {
  return sort_rows(dtype, x, values, indices, rows, n, descending, lengths, scratch, scratch_bytes, stream,
                   choose_sort_regime(rows, n));
}

}  // namespace jax_topk::cuda
