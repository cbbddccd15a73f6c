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
//   cub::BlockRadixSort of (sort key, index) pairs, written back striped
//   (coalesced).
// - kDeviceRadix: rows in chunks; each element becomes one u64
//   (row in chunk | sort key | index), sorted by cub::DeviceRadixSort
//   (onesweep, the whole chip on one sort) over the row and key bits only;
//   the index bits ride along and the sort's stability orders ties. A last
//   kernel unpacks. Three launches plus CUB's per chunk.
// Deterministic: radix sorts are stable, and the packing leaves no choice.

#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cstdint>

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
cudaError_t launch_rows_in_warp(int slots, const U* x, U* values, int32_t* indices, int64_t rows, int64_t n,
                                SortKeyMap<U> map, RowLengths<U> lengths, cudaStream_t stream) {
  if constexpr (E <= kSortWarpMaxN / kWarpSize) {
    if (slots != E) {
      return launch_rows_in_warp<U, 2 * E>(slots, x, values, indices, rows, n, map, lengths, stream);
    }
    constexpr int64_t kRowsPerBlock = kSortWarpThreads / kWarpSize;
    int64_t grid = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    if (grid > INT_MAX) grid = INT_MAX;
    sort_rows_in_warp_kernel<U, E><<<unsigned(grid), kSortWarpThreads, 0, stream>>>(
        x, values, indices, rows, int(n), map, lengths);
    return cudaGetLastError();
  } else {
    return cudaErrorInvalidValue;  // n > kSortWarpMaxN: not this regime
  }
}

// ---------------------------------------------------------------------------
// kRowInBlock
template <typename U, int kThreads, int kItems>
__global__ void __launch_bounds__(kThreads)
    sort_rows_in_block_kernel(const U* __restrict__ x, U* __restrict__ values,
                              int32_t* __restrict__ indices, int64_t rows, int n,
                              SortKeyMap<U> map, RowLengths<U> lengths) {
  using BlockSort = cub::BlockRadixSort<U, kThreads, kItems, int32_t, kSortBlockRadixBits>;
  __shared__ typename BlockSort::TempStorage temp;
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
    BlockSort(temp).SortBlockedToStriped(key, index);
JAX_TOPK_UNROLL
    for (int i = 0; i < kItems; ++i) {
      const int j = i * kThreads + tid;
      if (j < n) write_sorted_slot(j < len, key[i], index[i], map, lengths.pad_bits, values, indices, row * n + j);
    }
    __syncthreads();  // `temp` is reused by the block's next row
  }
}

template <typename U, int kShape>
cudaError_t launch_rows_in_block(const U* x, U* values, int32_t* indices, int64_t rows, int64_t n,
                                 SortKeyMap<U> map, RowLengths<U> lengths, cudaStream_t stream) {
  constexpr SortBlockShape kS = kSortBlockShapes[kShape];
  const int64_t grid = rows < INT_MAX ? rows : INT_MAX;
  sort_rows_in_block_kernel<U, kS.threads, kS.items><<<unsigned(grid), kS.threads, 0, stream>>>(
      x, values, indices, rows, int(n), map, lengths);
  return cudaGetLastError();
}

template <typename U, int kShape = 0>
cudaError_t dispatch_rows_in_block(int shape, const U* x, U* values, int32_t* indices, int64_t rows,
                                   int64_t n, SortKeyMap<U> map, RowLengths<U> lengths,
                                   cudaStream_t stream) {
  if constexpr (kShape < kSortBlockShapeCount) {
    if (shape == kShape) return launch_rows_in_block<U, kShape>(x, values, indices, rows, n, map, lengths, stream);
    return dispatch_rows_in_block<U, kShape + 1>(shape, x, values, indices, rows, n, map, lengths, stream);
  } else {
    return cudaErrorInvalidValue;  // n > kSortBlockMaxN: not this regime
  }
}

// ---------------------------------------------------------------------------
// kDeviceRadix
struct DevicePacking {
  int index_bits;  // bits_for_count(n)
  int key_bits;    // sizeof(U) * 8
  int row_bits;    // bits_for_count(rows in the chunk)
  int begin_bit() const { return index_bits; }
  int end_bit() const { return index_bits + key_bits + row_bits; }
};

// One u64 per element of rows [row0, row0 + chunk_rows): row in chunk, sort
// key, index. count = chunk_rows * n < 2^31 (the chunking keeps it so).
template <typename U>
__global__ void pack_sort_keys_kernel(const U* __restrict__ x, uint64_t* __restrict__ packed,
                                      int64_t row0, uint32_t count, uint32_t n, int index_bits,
                                      SortKeyMap<U> map, RowLengths<U> lengths) {
  const U* chunk = x + row0 * int64_t(n);
  for (uint32_t g = blockIdx.x * blockDim.x + threadIdx.x; g < count; g += gridDim.x * blockDim.x) {
    const uint32_t r = g / n, i = g - r * n;
    const uint32_t len = uint32_t(lengths.of_loaded(row0 + r, n));
    const U key = i < len ? map.sort_key(chunk[g]) : SortKeyMap<U>::kPastLength;
    packed[g] = (uint64_t(r) << (8 * sizeof(U) + index_bits)) | (uint64_t(key) << index_bits) | uint64_t(i);
  }
}

template <typename U>
__global__ void unpack_sorted_kernel(const uint64_t* __restrict__ sorted, U* __restrict__ values,
                                     int32_t* __restrict__ indices, int64_t row0, uint32_t count,
                                     uint32_t n, int index_bits, SortKeyMap<U> map,
                                     RowLengths<U> lengths) {
  const uint64_t index_mask = (uint64_t(1) << index_bits) - 1;
  const int64_t base = row0 * int64_t(n);
  for (uint32_t g = blockIdx.x * blockDim.x + threadIdx.x; g < count; g += gridDim.x * blockDim.x) {
    const uint32_t r = g / n, j = g - r * n;
    const uint32_t len = uint32_t(lengths.of_loaded(row0 + r, n));
    const uint64_t p = sorted[g];
    write_sorted_slot(j < len, U(p >> index_bits), int32_t(p & index_mask), map, lengths.pad_bits,
                      values, indices, base + g);
  }
}

struct DevicePlan {
  int64_t chunk_rows = 0;
  size_t keys0 = 0, keys1 = 0, cub_temp = 0, cub_temp_bytes = 0, total_bytes = 0;
};

template <typename U>
cudaError_t plan_device_radix(int64_t rows, int64_t n, DevicePlan* plan) {
  DevicePlan p;
  constexpr int kKeyBits = int(sizeof(U) * 8);
  p.chunk_rows = sort_device_chunk_rows(rows, n, kKeyBits);
  const int64_t count = p.chunk_rows * n;
  if (count > INT_MAX) return cudaErrorInvalidValue;
  ScratchCursor cur;
  p.keys0 = cur.take(size_t(count) * sizeof(uint64_t));
  p.keys1 = cur.take(size_t(count) * sizeof(uint64_t));
  const DevicePacking bits{bits_for_count(n), kKeyBits, bits_for_count(p.chunk_rows)};
  cub::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
  const cudaError_t err = cub::DeviceRadixSort::SortKeys(nullptr, p.cub_temp_bytes, keys, int(count),
                                                         bits.begin_bit(), bits.end_bit());
  if (err != cudaSuccess) return err;
  p.cub_temp = cur.take(p.cub_temp_bytes);
  p.total_bytes = cur.used;
  *plan = p;
  return cudaSuccess;
}

unsigned elementwise_grid(int64_t count) {
  const int64_t blocks = (count + 255) / 256;
  return unsigned(blocks < 65536 ? blocks : 65536);
}

template <typename U>
cudaError_t run_device_radix(const U* x, U* values, int32_t* indices, int64_t rows, int64_t n,
                             SortKeyMap<U> map, RowLengths<U> lengths, void* scratch,
                             size_t scratch_bytes, cudaStream_t stream) {
  DevicePlan plan;
  cudaError_t err = plan_device_radix<U>(rows, n, &plan);
  if (err != cudaSuccess) return err;
  if (plan.total_bytes > scratch_bytes || scratch == nullptr) return cudaErrorInvalidValue;
  uint64_t* keys0 = at<uint64_t>(scratch, plan.keys0);
  uint64_t* keys1 = at<uint64_t>(scratch, plan.keys1);
  void* temp = at<void>(scratch, plan.cub_temp);
  for (int64_t row0 = 0; row0 < rows; row0 += plan.chunk_rows) {
    const int64_t chunk_rows = rows - row0 < plan.chunk_rows ? rows - row0 : plan.chunk_rows;
    const uint32_t count = uint32_t(chunk_rows * n);
    const DevicePacking bits{bits_for_count(n), int(sizeof(U) * 8), bits_for_count(chunk_rows)};
    pack_sort_keys_kernel<U><<<elementwise_grid(count), 256, 0, stream>>>(
        x, keys0, row0, count, uint32_t(n), bits.index_bits, map, lengths);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    cub::DoubleBuffer<uint64_t> keys(keys0, keys1);
    size_t temp_bytes = plan.cub_temp_bytes;
    err = cub::DeviceRadixSort::SortKeys(temp, temp_bytes, keys, int(count), bits.begin_bit(),
                                         bits.end_bit(), stream);
    if (err != cudaSuccess) return err;
    unpack_sorted_kernel<U><<<elementwise_grid(count), 256, 0, stream>>>(
        keys.Current(), values, indices, row0, count, uint32_t(n), bits.index_bits, map, lengths);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  return cudaSuccess;
}

bool valid_problem(DType dtype, int64_t rows, int64_t n) {
  return sort_cuda_dtype(dtype) && rows >= 0 && n >= 0 && n <= int64_t(INT32_MAX);
}

}  // namespace

size_t sort_scratch_bytes(DType dtype, int64_t rows, int64_t n) {
  if (!valid_problem(dtype, rows, n) || choose_sort_regime(rows, n) != SortRegime::kDeviceRadix) return 0;
  size_t bytes = 0;
  visit_dtype(dtype, [&](auto traits) {
    using U = typename decltype(traits)::Bits;
    if constexpr (sizeof(U) <= 4) {
      DevicePlan plan;
      if (plan_device_radix<U>(rows, n, &plan) == cudaSuccess) bytes = plan.total_bytes;
    }
  });
  return bytes;
}

cudaError_t sort_rows(DType dtype, const void* x, void* values, int32_t* indices, int64_t rows,
                      int64_t n, bool descending, const int32_t* lengths, void* scratch,
                      size_t scratch_bytes, cudaStream_t stream) {
  if (!valid_problem(dtype, rows, n)) return cudaErrorInvalidValue;
  const SortRegime regime = choose_sort_regime(rows, n);
  if (regime == SortRegime::kEmpty) return cudaSuccess;
  cudaError_t err = cudaErrorInvalidValue;
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
          err = run_device_radix<U>(in, out, indices, rows, n, map, row_lengths, scratch, scratch_bytes,
                                    stream);
      }
    }
  });
  return err;
}

}  // namespace jax_topk::cuda
