// Host side of the CUDA top-k: picks the regime (topk_dispatch.h), lays out
// scratch, launches. Kernels are instantiated per key WIDTH (8/16/32/64 bits),
// not per dtype: the dtype only selects a KeyCodec (primitives.cuh).


#include <climits>
#include <cstdint>
#include <mutex>
#include <optional>

#include "cuda/device_info.h"
#include "cuda/primitives.cuh"
#include "cuda/scratch.h"
#include "cuda/topk_cluster.cuh"
#include "cuda/topk_cuda.h"
#include "cuda/topk_radix.cuh"
#include "cuda/topk_register.cuh"
#include "cuda/topk_threshold.cuh"
#include "cuda/topk_warp.cuh"
#include "cuda/topk_warp_select.cuh"
#include "jax_topk/topk_dispatch.h"

namespace jax_topk::cuda {
namespace {

// The segments of the library sort of rows * k survivors: offsets[i] = i * k.
__global__ void segment_offsets_kernel(int* offsets, int64_t rows, int64_t k) {
  wait_for_previous_grid();  // launched dependent (dependent_launch.cuh): the kernel before may still run
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i <= rows;
       i += int64_t(gridDim.x) * blockDim.x) {
    offsets[i] = int(i * k);
  }
}

// Everything topk_rows decides about a problem; topk_scratch_bytes runs the
// same planning, so the two always agree.
struct Plan {
  TopkRegime regime = TopkRegime::kEmpty;
  // Radix regimes.
  bool sort_in_block = true;          // k <= kRadixBlockSortMaxK
  int64_t blocks_per_row = 1;         // kRadixSplitRow
  int64_t candidate_capacity = 0;     // per candidate buffer
  // Scratch offsets (bytes from the scratch base).
  size_t state = 0, hist = 0, arrivals = 0, survivor_count = 0, candidate_count = 0;
  size_t survivors = 0, candidates = 0, sorted = 0, offsets = 0, library_sort_temp = 0;
  size_t library_sort_temp_bytes = 0;
  size_t total_bytes = 0;
};

// Candidate buffers of the split-row kernel: about n/16 (one radix bucket of
// a smooth distribution is far smaller), within fixed bounds. Rows that
// overflow it are re-read instead (correct, slower).
int64_t split_candidate_capacity(int64_t n) {
  int64_t c = n / 16;
  if (c < 4096) c = 4096;
  if (c > 32768) c = 32768;
  return c < n ? c : n;
}

template <typename U>
gpuError_t query_library_sort_temp_bytes(int64_t rows, int64_t k, size_t* bytes) {
  using P = typename RadixPacked<U>::type;
  const int end_bit = kRadixIndexBase + int(sizeof(U) * 8);
  if (rows == 1) {
    return device_sort_keys_descending(nullptr, *bytes, static_cast<const P*>(nullptr), static_cast<P*>(nullptr),
                                       int(k), 0, end_bit, gpuStream_t{});
  }
  return segmented_sort_keys_descending(nullptr, *bytes, static_cast<const P*>(nullptr), static_cast<P*>(nullptr),
                                        int(rows * k), int(rows), static_cast<const int*>(nullptr),
                                        static_cast<const int*>(nullptr) + 1, 0, end_bit, gpuStream_t{});
}

// The dispatcher's regime, or `forced` where that one holds the problem.
template <typename U>
TopkRegime regime_for(int64_t rows, int64_t n, int64_t k, const DeviceInfo& dev,
                      std::optional<TopkRegime> forced) {
  const TopkRegime chosen = choose_topk_regime(rows, n, k, int(sizeof(U)), dev.sm_count, dev.clusters);
  if (!forced || chosen == TopkRegime::kEmpty) return chosen;
  return topk_regime_holds(*forced, n, k, int(sizeof(U)), dev.clusters) ? *forced : TopkRegime::kEmpty;
}

template <typename U>
gpuError_t make_plan(int64_t rows, int64_t n, int64_t k, const DeviceInfo& dev,
                      std::optional<TopkRegime> forced, Plan* plan) {
  using P = typename RadixPacked<U>::type;
  Plan p;
  p.regime = regime_for<U>(rows, n, k, dev, forced);
  if (forced && p.regime == TopkRegime::kEmpty && rows > 0 && k > 0) return gpuErrorInvalidValue;
  if (p.regime == TopkRegime::kEmpty || p.regime == TopkRegime::kTinyRows ||
      p.regime == TopkRegime::kSmallK || p.regime == TopkRegime::kThresholdRowPerBlock ||
      p.regime == TopkRegime::kThresholdStream ||
      p.regime == TopkRegime::kClusterRows || p.regime == TopkRegime::kRegisterRows) {
    *plan = p;
    return gpuSuccess;
  }
  p.sort_in_block = k <= kRadixBlockSortMaxK;
  ScratchCursor cur;
  if (p.regime == TopkRegime::kRadixRowPerBlock) {
    p.candidate_capacity = n < kRadixBlockCandidates ? n : kRadixBlockCandidates;
    if (!p.sort_in_block) p.survivors = cur.take(size_t(rows * k) * sizeof(P));
  } else {
    p.blocks_per_row = radix_blocks_per_row(rows, n, dev.sm_count);
    p.candidate_capacity = split_candidate_capacity(n);
    p.state = cur.take(size_t(rows) * sizeof(RadixState<P>));
    p.hist = cur.take(size_t(rows) * kRadixBins * sizeof(uint32_t));
    p.arrivals = cur.take(size_t(rows) * sizeof(uint32_t));
    p.survivor_count = cur.take(size_t(rows) * sizeof(uint32_t));
    p.candidate_count = cur.take(size_t(rows) * 2 * sizeof(uint32_t));
    p.survivors = cur.take(size_t(rows * k) * sizeof(P));
    p.candidates = cur.take(size_t(rows) * 2 * size_t(p.candidate_capacity) * sizeof(P));
  }
  if (!p.sort_in_block) {
    if (rows * k > INT_MAX) return gpuErrorInvalidValue;  // CUB's item count is an int
    p.sorted = cur.take(size_t(rows * k) * sizeof(P));
    p.offsets = cur.take(size_t(rows + 1) * sizeof(int));
    const gpuError_t err = query_library_sort_temp_bytes<U>(rows, k, &p.library_sort_temp_bytes);
    if (err != gpuSuccess) return err;
    p.library_sort_temp = cur.take(p.library_sort_temp_bytes);
  }
  p.total_bytes = cur.used;
  *plan = p;
  return gpuSuccess;
}

// ---------------------------------------------------------------------------
template <typename U>
gpuError_t launch_warp_sort(const DeviceInfo& dev, const U* x, U* values, int32_t* indices, int64_t rows,
                             int64_t n, int64_t k, KeyCodec<U> codec, RowLengths<U> lengths,
                             gpuStream_t stream) {
  const int lanes = warp_sort_lanes_per_row(n);
  const int log2_lanes = bit_width(uint64_t(lanes)) - 1;  // lanes is a power of two
  const bool vectorised = warp_rows_vectorised(x, n, lengths);
  const int64_t blocks = (rows * lanes + kWarpSortThreads - 1) / kWarpSortThreads;
  if (blocks > INT_MAX) return gpuErrorInvalidValue;
  const dim3 grid{unsigned(blocks)};
  const int list = int(next_pow2(k));
#define JAX_TOPK_WARP_SORT_CASE(K)                                                              \
  case K:                                                                                       \
    return launch_dependent(dev, warp_sort_topk_kernel<U, K>, grid, dim3(kWarpSortThreads), 0, stream, x, \
                            values, indices, rows, int(n), int(k), log2_lanes, vectorised, codec, lengths);
  switch (list) {
    JAX_TOPK_WARP_SORT_CASE(1)
    JAX_TOPK_WARP_SORT_CASE(2)
    JAX_TOPK_WARP_SORT_CASE(4)
    JAX_TOPK_WARP_SORT_CASE(8)
    JAX_TOPK_WARP_SORT_CASE(16)
    JAX_TOPK_WARP_SORT_CASE(32)
    default:
      return gpuErrorInvalidValue;  // the dispatcher never sends k > kWarpSortMaxK here
  }
#undef JAX_TOPK_WARP_SORT_CASE
}

template <typename U>
gpuError_t launch_warp_select(const DeviceInfo& dev, const U* x, U* values, int32_t* indices, int64_t rows,
                               int64_t n, int64_t k, KeyCodec<U> codec, RowLengths<U> lengths,
                               gpuStream_t stream) {
  WsTopkOutput<U> out;
  out.codec = codec;
  out.pad_bits = lengths.pad_bits;
  out.values = values;
  out.indices = indices;
  out.k = int(k);
  return launch_warp_select_rows<U>(dev, x, rows, n, k, warp_rows_vectorised(x, n, lengths), out, lengths,
                                    stream);
}

// Sorts the unsorted survivors [rows][k] with the library radix sort (CUB, rocPRIM) and writes the outputs.
template <typename U>
gpuError_t sort_survivors_device_wide(const DeviceInfo& dev, const Plan& plan, void* scratch, int64_t rows,
                                       int64_t k, KeyCodec<U> codec, U pad_bits, U* values, int32_t* indices,
                                       gpuStream_t stream) {
  using P = typename RadixPacked<U>::type;
  const int end_bit = kRadixIndexBase + int(sizeof(U) * 8);
  P* survivors = at<P>(scratch, plan.survivors);
  P* sorted = at<P>(scratch, plan.sorted);
  int* offsets = at<int>(scratch, plan.offsets);
  void* temp = at<void>(scratch, plan.library_sort_temp);
  size_t temp_bytes = plan.library_sort_temp_bytes;
  gpuError_t err;
  if (rows == 1) {
    err = device_sort_keys_descending(temp, temp_bytes, survivors, sorted, int(k), 0, end_bit, stream);
  } else {
    err = launch_dependent(dev, segment_offsets_kernel, dim3(unsigned((rows + 256) / 256)), dim3(256), 0, stream,
                           offsets, rows, k);
    if (err != gpuSuccess) return err;
    err = segmented_sort_keys_descending(temp, temp_bytes, survivors, sorted, int(rows * k), int(rows), offsets,
                                         offsets + 1, 0, end_bit, stream);
  }
  if (err != gpuSuccess) return err;
  const int64_t count = rows * k;
  int64_t blocks = (count + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  return launch_dependent(dev, write_sorted_kernel<U>, dim3(unsigned(blocks)), dim3(256), 0, stream, sorted, count,
                          codec, pad_bits, values, indices);
}

// Per-kernel launch preparation, cached: raising the dynamic shared memory
// limit (a block may use 48 KB, static and dynamic together, unless the
// kernel opts in to more) and the occupancy query are host work on every
// call otherwise. Keyed by (device, kernel, dynamic smem, threads).
struct KernelPrep {
  int device;
  const void* fn;
  size_t smem;
  int threads;
  int per_sm;
};

gpuError_t prepare_kernel_uncached(int device, const void* fn, int threads, size_t smem,
                                    int* per_sm) {
  gpuFuncAttributes attributes;
  gpuError_t err = gpuFuncGetAttributes(&attributes, fn);
  if (err != gpuSuccess) return err;
  if (smem + attributes.sharedSizeBytes > 48 * 1024) {
    // Opt in to the device's whole per-block maximum, never to `smem`: the
    // attribute is one value per kernel, and lowering it for a small launch
    // would break a larger launch whose preparation is already cached.
    int optin = 0;
    err = gpuDeviceGetAttribute(&optin, gpuDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != gpuSuccess) return err;
    const int most = optin - int(attributes.sharedSizeBytes);
    if (int64_t(smem) > most) return gpuErrorInvalidValue;
    err = gpu_set_max_dynamic_smem(fn, most);
    if (err != gpuSuccess) return err;
  }
  *per_sm = 0;
  if (threads > 0) {
    err = gpuOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, fn, threads, smem);
    if (err != gpuSuccess) return err;
  }
  if (*per_sm < 1) *per_sm = 1;
  return gpuSuccess;
}

// threads == 0: only the shared-memory opt-in (per_sm may be null).
gpuError_t prepare_kernel(int device, const void* fn, int threads, size_t smem, int* per_sm) {
  constexpr int kEntries = 256;
  static std::mutex mutex;
  static KernelPrep cache[kEntries];
  static int used = 0;
  int dummy = 0;
  if (per_sm == nullptr) per_sm = &dummy;
  std::lock_guard<std::mutex> lock(mutex);
  for (int i = 0; i < used; ++i) {
    const KernelPrep& e = cache[i];
    if (e.device == device && e.fn == fn && e.smem == smem && e.threads == threads) {
      *per_sm = e.per_sm;
      return gpuSuccess;
    }
  }
  const gpuError_t err = prepare_kernel_uncached(device, fn, threads, smem, per_sm);
  if (err != gpuSuccess) return err;
  if (used < kEntries) cache[used++] = KernelPrep{device, fn, smem, threads, *per_sm};
  return gpuSuccess;
}

template <typename Kernel>
gpuError_t allow_dynamic_smem(const DeviceInfo& dev, Kernel kernel, size_t bytes) {
  return prepare_kernel(dev.device, reinterpret_cast<const void*>(kernel), 0, bytes, nullptr);
}

// A persistent grid of one-row blocks: as many as the SMs hold, but no more
// than the rows in flight that fit in L2 (each taking `l2_bytes_per_row`;
// never fewer than one per SM) and no more than there are rows.
int64_t persistent_row_grid(int per_sm, const DeviceInfo& dev, int64_t rows,
                            int64_t l2_bytes_per_row) {
  int64_t grid = int64_t(per_sm) * dev.sm_count;
  int64_t l2_rows = l2_bytes_per_row > 0 ? dev.l2_bytes / l2_bytes_per_row : grid;
  if (l2_rows < dev.sm_count) l2_rows = dev.sm_count;
  if (grid > l2_rows) grid = l2_rows;
  return grid < rows ? grid : rows;
}

template <typename U, bool kSortInBlock>
gpuError_t launch_radix_row_per_block(const Plan& plan, const DeviceInfo& dev, const U* x,
                                       U* values, int32_t* indices, int64_t rows, int64_t n,
                                       int64_t k, KeyCodec<U> codec, RowLengths<U> lengths,
                                       void* scratch, gpuStream_t stream) {
  using P = typename RadixPacked<U>::type;
  auto kernel = radix_topk_row_per_block_kernel<U, kSortInBlock>;
  const size_t smem = kRadixBins * sizeof(uint32_t) + 2 * size_t(plan.candidate_capacity) * sizeof(P) +
                      (kSortInBlock ? size_t(next_pow2(k)) * sizeof(P) : 0);
  int per_sm = 0;
  gpuError_t err = prepare_kernel(dev.device, reinterpret_cast<const void*>(kernel), kRadixThreads,
                                   smem, &per_sm);
  if (err != gpuSuccess) return err;
  // Rows in flight stay in L2 for the re-reads of later scans (two copies'
  // worth of room per row: the row and what the scans touch).
  const int64_t grid = persistent_row_grid(per_sm, dev, rows, 2 * n * int64_t(sizeof(U)));
  P* survivors_global = kSortInBlock ? nullptr : at<P>(scratch, plan.survivors);
  return launch_dependent(dev, kernel, dim3(unsigned(grid)), dim3(kRadixThreads), smem, stream, x, rows, n, k,
                          radix_index_bits(n), int(plan.candidate_capacity), codec, lengths, values, indices,
                          survivors_global);
}

// kThresholdRowPerBlock / kThresholdStream (kStream): a persistent grid of
// one-row blocks of kThreads threads. The two-read kernel caps the rows in
// flight by L2, so that the second read of a row (the compaction) hits L2;
// the streamed kernel reads each row once and fills the chip.
template <typename U, int kThreads, int kR, int kUnroll, bool kStream>
gpuError_t launch_threshold_ru(const DeviceInfo& dev, const U* x, U* values, int32_t* indices, int64_t rows,
                               int64_t n, int64_t k, KeyCodec<U> codec, RowLengths<U> lengths,
                               gpuStream_t stream) {
  const void* kernel = reinterpret_cast<const void*>(threshold_topk_row_per_block_kernel<U, kThreads, kR, kUnroll>);
  if constexpr (kStream) kernel = reinterpret_cast<const void*>(threshold_stream_topk_kernel<U, kThreads, kR, kUnroll>);
  size_t smem = kStream ? threshold_stream_smem_bytes(kR, kThreads, kThresholdStreamStep<U, kThreads, kUnroll>)
                        : threshold_smem_bytes(kR, kThreads);
  int per_sm = 0;
  gpuError_t err = prepare_kernel(dev.device, kernel, kThreads, smem, &per_sm);
  if (err != gpuSuccess) return err;
  // Whole rows long enough for a sampled threshold are read once (plus the
  // sample); otherwise two reads: a block holds one row between them, so
  // rows in flight * row bytes <= L2 (part of each block's time is the
  // candidate ranking, with its row no longer needed).
  const ThresholdSample sample = kStream || lengths.lengths != nullptr ? ThresholdSample{0, 0}
                                                                       : threshold_sample(n, k, kThreads * kR);
  const bool two_reads = !kStream && sample.rank == 0;
  // A sampled row stages the most walk groups whose shared memory keeps the
  // blocks per SM.
  int staged_groups = 0;
  for (int g = !kStream && sample.rank > 0 ? kThresholdMaxStagedGroups : 0; g > 0; --g) {
    const size_t staged_smem =
        threshold_smem_bytes(kR, kThreads, threshold_stage_overflow_bytes(kR, kThreads, kUnroll, g));
    int staged_per_sm = 0;
    if ((err = prepare_kernel(dev.device, kernel, kThreads, staged_smem, &staged_per_sm)) != gpuSuccess) return err;
    if (staged_per_sm >= per_sm) {
      staged_groups = g;
      smem = staged_smem;
      break;
    }
  }
  // With one group staged and more whole groups to the row, the walk streams
  // them through two slots (RowWalkStage's ring, sm_90) where their room also
  // keeps the blocks per SM. (A row of one group has nothing to stream, and
  // the larger shared-memory carve-out alone cost 264 x 8192 k = 64 / 256 on
  // wide blocks 4-5%: benchmarks/results/NOTES.md v23.)
  bool walk_ring = false;
  const int64_t group_elems = int64_t(kThreads) * kUnroll * int64_t(16 / sizeof(U));
  if (staged_groups == 1 && dev.bulk_copies && n >= 2 * group_elems) {
    const size_t ring_smem =
        threshold_smem_bytes(kR, kThreads, threshold_stage_overflow_bytes(kR, kThreads, kUnroll, kWalkRingSlots));
    int ring_per_sm = 0;
    if ((err = prepare_kernel(dev.device, kernel, kThreads, ring_smem, &ring_per_sm)) != gpuSuccess) return err;
    if (ring_per_sm >= per_sm) {
      walk_ring = true;
      smem = ring_smem;
    }
  }
  const int64_t grid = persistent_row_grid(per_sm, dev, rows, two_reads ? n * int64_t(sizeof(U)) : 0);
  if constexpr (kStream) {
    return launch_dependent(dev, threshold_stream_topk_kernel<U, kThreads, kR, kUnroll>, dim3(unsigned(grid)),
                            dim3(kThreads), smem, stream, x, rows, n, k, codec, lengths, values, indices);
  } else {
    return launch_dependent(dev, threshold_topk_row_per_block_kernel<U, kThreads, kR, kUnroll>,
                            dim3(unsigned(grid)), dim3(kThreads), smem, stream, x, rows, n, k,
                            radix_index_bits(n), sample, staged_groups, walk_ring, codec, lengths, values,
                            indices);
  }
}

// Loads in flight: with no more rows than SMs (one block per SM either way),
// wide blocks keep twice as many (threshold_unroll).
template <typename U, int kThreads, int kR, bool kStream>
gpuError_t launch_threshold_r(const DeviceInfo& dev, const U* x, U* values, int32_t* indices, int64_t rows,
                              int64_t n, int64_t k, KeyCodec<U> codec, RowLengths<U> lengths,
                              gpuStream_t stream) {
  constexpr int kPlainLoads = threshold_unroll<U>(false), kDoubleLoads = threshold_unroll<U>(true);
  if constexpr (kThreads == kThresholdWideThreads && kDoubleLoads != kPlainLoads) {
    if (rows <= dev.sm_count) {
      return launch_threshold_ru<U, kThreads, kR, kDoubleLoads, kStream>(dev, x, values, indices, rows, n, k,
                                                                        codec, lengths, stream);
    }
  }
  return launch_threshold_ru<U, kThreads, kR, kPlainLoads, kStream>(dev, x, values, indices, rows, n, k, codec,
                                                                   lengths, stream);
}

template <typename U, int kThreads, bool kStream>
gpuError_t launch_threshold_t(const DeviceInfo& dev, const U* x, U* values, int32_t* indices, int64_t rows,
                              int64_t n, int64_t k, KeyCodec<U> codec, RowLengths<U> lengths,
                              gpuStream_t stream) {
  const bool whole_rows = !kStream && lengths.lengths == nullptr;
  switch (threshold_row_slots(rows, n, k, int(sizeof(U)), kThreads, whole_rows, dev.sm_count)) {
    case 1:
      return launch_threshold_r<U, kThreads, 1, kStream>(dev, x, values, indices, rows, n, k, codec, lengths,
                                                         stream);
    case 2:
      return launch_threshold_r<U, kThreads, 2, kStream>(dev, x, values, indices, rows, n, k, codec, lengths,
                                                         stream);
    case 8:
      return launch_threshold_r<U, kThreads, 8, kStream>(dev, x, values, indices, rows, n, k, codec, lengths,
                                                         stream);
    default:
      return gpuErrorInvalidValue;
  }
}

template <typename U, bool kStream>
gpuError_t launch_threshold(const DeviceInfo& dev, const U* x, U* values, int32_t* indices, int64_t rows,
                            int64_t n, int64_t k, KeyCodec<U> codec, RowLengths<U> lengths,
                            gpuStream_t stream) {
  if constexpr (sizeof(U) <= 4) {
    if (threshold_block_threads(rows, k, dev.sm_count) == kThresholdNarrowThreads) {
      return launch_threshold_t<U, kThresholdNarrowThreads, kStream>(dev, x, values, indices, rows, n, k, codec,
                                                                     lengths, stream);
    }
    return launch_threshold_t<U, kThresholdWideThreads, kStream>(dev, x, values, indices, rows, n, k, codec,
                                                                 lengths, stream);
  } else {
    return gpuErrorInvalidValue;  // the dispatcher keeps 64-bit keys on radix
  }
}

// kClusterRows: a cluster of cluster_row_plan's blocks per row; the sampled
// threshold's instantiation where the plan is sampled.
template <typename U, bool kSampled>
gpuError_t launch_cluster_rows_s(const DeviceInfo& dev, const U* x, U* values, int32_t* indices, int64_t rows,
                                 int64_t n, int64_t k, int blocks, KeyCodec<U> codec, RowLengths<U> lengths,
                                 gpuStream_t stream) {
#if defined(JAX_TOPK_HAS_CLUSTERS)
  if constexpr (sizeof(U) <= 4) {
    if (rows * blocks > INT_MAX) return gpuErrorInvalidValue;
    auto kernel = cluster_topk_rows_kernel<U, kSampled>;
    const size_t smem = cluster_smem_bytes<U>(cluster_chunk<U>(n, blocks), k, kSampled);
    gpuError_t err = allow_dynamic_smem(dev, kernel, smem);
    if (err != gpuSuccess) return err;
    const ThresholdSample sample = kSampled ? threshold_sample(n, k, kClusterSampleSlots) : ThresholdSample{0, 0};
    cudaLaunchAttribute attributes[2];
    cudaLaunchConfig_t config = cluster_launch_config(rows, blocks, smem, stream, attributes);
    allow_dependent_launch(dev, &config, attributes);
    return cudaLaunchKernelEx(&config, kernel, x, n, k, sample, codec, lengths, values, indices);
  }
#endif
  return gpuErrorInvalidValue;  // the dispatcher keeps 64-bit keys, and GPUs without clusters, off this regime
}

template <typename U>
gpuError_t launch_cluster_rows(const DeviceInfo& dev, const U* x, U* values, int32_t* indices,
                                int64_t rows, int64_t n, int64_t k, KeyCodec<U> codec,
                                RowLengths<U> lengths, gpuStream_t stream) {
  const ClusterRowPlan plan = cluster_row_plan(rows, n, k, int(sizeof(U)), dev.sm_count);
  if (plan.sampled) {
    return launch_cluster_rows_s<U, true>(dev, x, values, indices, rows, n, k, plan.blocks, codec, lengths, stream);
  }
  return launch_cluster_rows_s<U, false>(dev, x, values, indices, rows, n, k, plan.blocks, codec, lengths, stream);
}

// kRegisterRows: one block per row (a grid-stride loop when the rows
// outnumber the blocks that fit at once), register_rows_per_thread(n)
// elements per thread.
template <typename U, int kE>
gpuError_t launch_register_rows_e(const DeviceInfo& dev, const U* x, U* values, int32_t* indices, int64_t rows,
                                  int64_t n, int64_t k, KeyCodec<U> codec, RowLengths<U> lengths,
                                  gpuStream_t stream) {
  auto kernel = register_topk_rows_kernel<U, kE>;
  int per_sm = 0;
  gpuError_t err = prepare_kernel(dev.device, reinterpret_cast<const void*>(kernel), kRegisterThreads, 0,
                                  &per_sm);
  if (err != gpuSuccess) return err;
  // At most one block per row: each block loads its first row before the loop tests it.
  const int64_t grid = persistent_row_grid(per_sm, dev, rows, 0);
  return launch_dependent(dev, kernel, dim3(unsigned(grid)), dim3(kRegisterThreads), 0, stream, x, rows, n, k,
                          codec, lengths, values, indices);
}

template <typename U>
gpuError_t launch_register_rows(const DeviceInfo& dev, const U* x, U* values, int32_t* indices, int64_t rows,
                                int64_t n, int64_t k, KeyCodec<U> codec, RowLengths<U> lengths,
                                gpuStream_t stream) {
  if constexpr (sizeof(U) <= 4) {
    switch (register_rows_per_thread(n)) {
      case 4: return launch_register_rows_e<U, 4>(dev, x, values, indices, rows, n, k, codec, lengths, stream);
      case 8: return launch_register_rows_e<U, 8>(dev, x, values, indices, rows, n, k, codec, lengths, stream);
      case 16: return launch_register_rows_e<U, 16>(dev, x, values, indices, rows, n, k, codec, lengths, stream);
      default: return gpuErrorInvalidValue;
    }
  }
  return gpuErrorInvalidValue;  // the dispatcher keeps 64-bit keys off this regime
}

template <typename U>
gpuError_t launch_radix_split_row(const Plan& plan, const DeviceInfo& dev, const U* x, U* values, int32_t* indices,
                                   int64_t rows, int64_t n, int64_t k, KeyCodec<U> codec,
                                   RowLengths<U> lengths, void* scratch, gpuStream_t stream) {
  using P = typename RadixPacked<U>::type;
  RadixSplitScratch<P> s;
  s.state = at<RadixState<P>>(scratch, plan.state);
  s.hist = at<uint32_t>(scratch, plan.hist);
  s.arrivals = at<uint32_t>(scratch, plan.arrivals);
  s.survivor_count = at<uint32_t>(scratch, plan.survivor_count);
  s.candidate_count = at<uint32_t>(scratch, plan.candidate_count);
  s.survivors = at<P>(scratch, plan.survivors);
  s.candidates = at<P>(scratch, plan.candidates);
  s.candidate_capacity = plan.candidate_capacity;

  gpuError_t err = launch_dependent(dev, radix_split_init_kernel<U>, dim3(unsigned(rows)), dim3(256), 0, stream, s,
                                    n, k, lengths);
  if (err != gpuSuccess) return err;
  const int index_bits = radix_index_bits(n);
  const int passes = radix_field_count(int(sizeof(U) * 8), index_bits);
  const dim3 grid(unsigned(plan.blocks_per_row), unsigned(rows));
  // Passes after a row is done return at once; the host cannot know when
  // that happens without a sync. Each pass is a dependent launch
  // (dependent_launch.cuh): its setup overlaps the tail of the one before.
  for (int pass = 0; pass <= passes; ++pass) {
    const bool gather = pass == passes;
    err = launch_dependent(dev, radix_split_scan_kernel<U>, grid, dim3(kRadixThreads), 0, stream, x, n, k, index_bits,
                           codec, s, gather);
    if (err != gpuSuccess) return err;
  }
  if (!plan.sort_in_block) return gpuSuccess;  // the caller sorts device-wide
  const size_t smem = size_t(next_pow2(k)) * sizeof(P);
  if ((err = allow_dynamic_smem(dev, sort_survivors_kernel<U>, smem)) != gpuSuccess) return err;
  return launch_dependent(dev, sort_survivors_kernel<U>, dim3(unsigned(rows)), dim3(kRadixThreads), smem, stream,
                          s.survivors, k, codec, lengths.pad_bits, values, indices);
}

template <typename U>
gpuError_t run_topk(KeyCodec<U> codec, RowLengths<U> lengths, const U* x, U* values,
                     int32_t* indices, int64_t rows, int64_t n, int64_t k, void* scratch,
                     size_t scratch_bytes, gpuStream_t stream, std::optional<TopkRegime> forced) {
  DeviceInfo dev;
  gpuError_t err = query_device(&dev);
  if (err != gpuSuccess) return err;
  Plan plan;
  if ((err = make_plan<U>(rows, n, k, dev, forced, &plan)) != gpuSuccess) return err;
  if (plan.total_bytes > scratch_bytes || (plan.total_bytes > 0 && scratch == nullptr)) {
    return gpuErrorInvalidValue;
  }
  switch (plan.regime) {
    case TopkRegime::kEmpty:
      return gpuSuccess;
    case TopkRegime::kTinyRows:
    case TopkRegime::kSmallK:
      if constexpr (sizeof(U) <= 4) {
        if (n <= kWarpSelectMaxN) {
          return launch_warp_select<U>(dev, x, values, indices, rows, n, k, codec, lengths, stream);
        }
        return launch_warp_sort<U>(dev, x, values, indices, rows, n, k, codec, lengths, stream);
      } else {
        return gpuErrorInvalidValue;  // the dispatcher keeps 64-bit keys on radix
      }
    case TopkRegime::kRadixRowPerBlock:
      if (plan.sort_in_block) {
        return launch_radix_row_per_block<U, true>(plan, dev, x, values, indices, rows, n, k, codec,
                                                   lengths, scratch, stream);
      }
      err = launch_radix_row_per_block<U, false>(plan, dev, x, values, indices, rows, n, k, codec,
                                                 lengths, scratch, stream);
      if (err != gpuSuccess) return err;
      return sort_survivors_device_wide<U>(dev, plan, scratch, rows, k, codec, lengths.pad_bits, values,
                                           indices, stream);
    case TopkRegime::kThresholdRowPerBlock:
      return launch_threshold<U, false>(dev, x, values, indices, rows, n, k, codec, lengths, stream);
    case TopkRegime::kThresholdStream:
      return launch_threshold<U, true>(dev, x, values, indices, rows, n, k, codec, lengths, stream);
    case TopkRegime::kClusterRows:
      return launch_cluster_rows<U>(dev, x, values, indices, rows, n, k, codec, lengths, stream);
    case TopkRegime::kRegisterRows:
      return launch_register_rows<U>(dev, x, values, indices, rows, n, k, codec, lengths, stream);
    case TopkRegime::kRadixSplitRow:
      err = launch_radix_split_row<U>(plan, dev, x, values, indices, rows, n, k, codec, lengths,
                                      scratch, stream);
      if (err != gpuSuccess || plan.sort_in_block) return err;
      return sort_survivors_device_wide<U>(dev, plan, scratch, rows, k, codec, lengths.pad_bits, values,
                                           indices, stream);
  }
  return gpuErrorInvalidValue;
}

bool valid_problem(int64_t rows, int64_t n, int64_t k) {
  return rows >= 0 && n >= 0 && k >= 0 && k <= n && n <= int64_t(INT32_MAX);
}

size_t scratch_bytes_in(DType dtype, int64_t rows, int64_t n, int64_t k,
                        std::optional<TopkRegime> forced) {
  if (!valid_problem(rows, n, k)) return 0;
  DeviceInfo dev;
  if (query_device(&dev) != gpuSuccess) return 0;
  size_t bytes = 0;
  visit_dtype(dtype, [&](auto traits) {
    using U = typename decltype(traits)::Bits;
    Plan plan;
    if (make_plan<U>(rows, n, k, dev, forced, &plan) == gpuSuccess) bytes = plan.total_bytes;
  });
  return bytes;
}

gpuError_t topk_rows_in(DType dtype, const void* x, void* values, int32_t* indices, int64_t rows,
                         int64_t n, int64_t k, const int32_t* lengths, void* scratch,
                         size_t scratch_bytes, gpuStream_t stream,
                         std::optional<TopkRegime> forced) {
  if (!valid_problem(rows, n, k)) return gpuErrorInvalidValue;
  if (rows == 0 || k == 0) return gpuSuccess;
  gpuError_t err = gpuErrorInvalidValue;  // stays so for a dtype outside the table
  visit_dtype(dtype, [&](auto traits) {
    using Traits = decltype(traits);
    using U = typename Traits::Bits;
    err = run_topk<U>(make_key_codec<Traits::kKeyKind, U>(), RowLengths<U>{lengths, Traits::kLowestBits},
                      static_cast<const U*>(x), static_cast<U*>(values), indices, rows, n, k,
                      scratch, scratch_bytes, stream, forced);
  });
  return err;
}

}  // namespace

size_t topk_scratch_bytes(DType dtype, int64_t rows, int64_t n, int64_t k) {
  return scratch_bytes_in(dtype, rows, n, k, std::nullopt);
}

size_t topk_scratch_bytes(DType dtype, int64_t rows, int64_t n, int64_t k, TopkRegime regime) {
  return scratch_bytes_in(dtype, rows, n, k, regime);
}

gpuError_t topk_rows(DType dtype, const void* x, void* values, int32_t* indices, int64_t rows,
                      int64_t n, int64_t k, const int32_t* lengths, void* scratch,
                      size_t scratch_bytes, gpuStream_t stream) {
  return topk_rows_in(dtype, x, values, indices, rows, n, k, lengths, scratch, scratch_bytes, stream,
                      std::nullopt);
}

gpuError_t topk_rows(DType dtype, const void* x, void* values, int32_t* indices, int64_t rows,
                      int64_t n, int64_t k, const int32_t* lengths, void* scratch,
                      size_t scratch_bytes, gpuStream_t stream, TopkRegime regime) {
  return topk_rows_in(dtype, x, values, indices, rows, n, k, lengths, scratch, scratch_bytes, stream,
                      regime);
}

#if defined(JAX_TOPK_PHASE_TIMING)
gpuError_t read_phase_cycles(unsigned long long* out) {
  gpuError_t err = gpuMemcpyFromSymbol(out, g_phase_cycles, sizeof(g_phase_cycles));
  if (err != gpuSuccess) return err;
  const unsigned long long zeros[kPhaseTimerSlots] = {};
  return gpuMemcpyToSymbol(g_phase_cycles, zeros, sizeof(zeros));
}

gpuError_t read_block_timeline(unsigned long long* out) {
  gpuError_t err = gpuMemcpyFromSymbol(out, g_block_timeline, sizeof(g_block_timeline));
  if (err != gpuSuccess) return err;
  static const unsigned long long zeros[kBlockTimelineBlocks][kBlockTimelineWords] = {};
  return gpuMemcpyToSymbol(g_block_timeline, zeros, sizeof(zeros));
}
#endif

}  // namespace jax_topk::cuda
