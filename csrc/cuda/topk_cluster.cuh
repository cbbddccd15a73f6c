// Cluster top-k (regime kClusterRows, sm_90 and newer): one thread-block
// cluster of C <= 8 blocks per row. The row is read from global memory ONCE:
// block b of the cluster keeps elements [b * chunk, (b + 1) * chunk) as
// ordered keys in its shared memory, and everything after the read works on
// shared memory and on the other blocks' shared memory (DSMEM):
//
// 1. Exact radix select of the k-th largest KEY, 8-bit digits from the top:
//    each block counts the digits of its keys that match the prefix chosen
//    so far; after one cluster barrier every block reads all C histograms
//    (C loads per bin) and makes the same choice of digit. A pass whose
//    chosen bucket is taken whole ends the select (random rows: after 2-3 of
//    the 4 passes of float32). Per block it also keeps how many of its keys
//    lie above the chosen buckets, so every block knows every block's number
//    of selected elements, hence where its own go, without another barrier.
// 2. Ties at the k-th key (the last pass's bucket has more elements than
//    still needed) go by lower index: block b takes its first ties, in
//    position order, after the sum of the earlier blocks' ties.
// 3. Each block writes its selected elements, packed (key, ~index), into
//    EVERY block's candidate array (exactly min(k, length) candidates, no
//    capacity to overflow); one more cluster barrier.
// 4. Each block ranks a 1/C slice of the candidates against all of them
//    (block_rank.cuh) and writes those outputs.
// Two cluster barriers plus one per select pass, instead of the threshold
// kernel's second read of the row and the split-row kernel's launch per pass.
//
// Rows of kClusterBinsMinLen..kClusterBinsMaxLen (k < len) try sampled
// bins first (cluster_topk_by_bins; the method is in topk_dispatch.h): one
// count over bins cut by a sample of the row, two cluster barriers in all,
// each candidate ranked within its bin. A row the sample does not fit takes
// the radix select above.
//
// Whole rows that cluster_sampled_dispatch sends here (rows whose sample has
// a window, as many as the clusters fit; the method is in topk_dispatch.h)
// take a sampled threshold instead (kernel instantiation kSampled): every block
// issues the loads of the same sample of the whole row, then copies its chunk
// into shared memory asynchronously (cp.async) and, while the copies fly,
// selects T from the sample as the threshold kernel does; it then compacts
// its chunk's elements >= T, and two cluster barriers exchange the counts
// and the candidates, which each block ranks in a 1/C slice. A row whose
// count misses [k, kClusterSampleSlots] takes the radix select above.
//
// Per-row lengths: the row's first len elements are split over the C blocks
// (chunk = ceil(len / C), rounded up to a 16-byte vector), so short rows of a
// ragged batch still use the whole cluster. Rows with len <= k select all.
#pragma once

#include "cuda/primitives.cuh"  // gpu_compat.h: JAX_TOPK_HAS_CLUSTERS

#if defined(JAX_TOPK_HAS_CLUSTERS)
#include <cooperative_groups.h>
#endif

#include "cuda/block_rank.cuh"
#include "cuda/mma.cuh"  // cp.async (the sampled threshold's chunk copies)
#include "cuda/topk_bitonic.cuh"
#include "cuda/topk_threshold.cuh"
#include "jax_topk/topk_dispatch.h"

namespace jax_topk::cuda {

inline constexpr int kClusterThreads = 512;
inline constexpr int kClusterDigitBits = 8;
inline constexpr int kClusterBins = 1 << kClusterDigitBits;
static_assert(kClusterThreads >= kClusterBins, "a thread per bin gathers the histograms");

// Elements per block for a row of len elements over C blocks: ceil(len / C)
// rounded up to whole 16-byte vectors (chunks then start aligned whenever
// the row does).
template <typename U>
JAX_TOPK_HOST_DEVICE constexpr int64_t cluster_chunk(int64_t len, int blocks) {
  constexpr int64_t kVec = 16 / int64_t(sizeof(U));
  const int64_t per = (len + blocks - 1) / blocks;
  return (per + kVec - 1) / kVec * kVec;
}

// Candidate slots of a block: the radix select's candidates (next_pow2(k):
// the fallback sort pads them to a power of two) and the rank's bucket spans
// (k) after them; the sampled bins' candidates (fewer than k plus one bin)
// in the same words.
JAX_TOPK_HOST_DEVICE constexpr int64_t cluster_candidate_slots(int64_t k) {
  const int64_t radix = next_pow2(k) + k, bins = k + kClusterBinMaxMembers;
  return radix > bins ? radix : bins;
}

// The sampled threshold's slots: kClusterSampleSlots for the sample, then
// for every candidate of the row (at most that many), and as many again for
// the block's own candidates, then for the rank's bucket spans.
inline constexpr int64_t kClusterSampledSlots = 2 * kClusterSampleSlots;

// Dynamic shared memory: the two histogram buffers (read by the other
// blocks), the rank's buckets, the keys of the chunk (chunk_capacity
// elements) and the candidate slots.
template <typename U>
JAX_TOPK_HOST_DEVICE constexpr size_t cluster_smem_bytes(int64_t chunk_capacity, int64_t k, bool sampled) {
  const size_t words = size_t(2 * kClusterBins + kRankBuckets) * sizeof(uint32_t);
  const size_t keys = (size_t(chunk_capacity) * sizeof(U) + 15) / 16 * 16;
  const int64_t slots = sampled ? max_of(cluster_candidate_slots(k), kClusterSampledSlots) : cluster_candidate_slots(k);
  return words + keys + size_t(slots) * sizeof(uint64_t);
}
static_assert(kThresholdSelectWords <= 2 * kClusterBins + kRankBuckets,
              "the sample's select histograms live in the words");

#if defined(JAX_TOPK_HAS_CLUSTERS)
// The launch of cluster_topk_rows_kernel for `rows` rows on clusters of
// `blocks` (the launcher's, and the self-test's occupancy query).
// `attribute` is the cluster dimension the config points to.
inline cudaLaunchConfig_t cluster_launch_config(int64_t rows, int blocks, size_t smem, cudaStream_t stream,
                                                cudaLaunchAttribute* attribute) {
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = unsigned(blocks);
  attribute->val.clusterDim.y = 1;
  attribute->val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(rows * blocks));
  config.blockDim = dim3(kClusterThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  return config;
}
#endif

// Phases of the kernel, as PhaseTimer slots (-DJAX_TOPK_PHASE_TIMING; the
// self-test prints the sum over a row's C blocks).
enum ClusterPhase : int {
  kClusterPhaseLoad = 0,       // the chunk (and the bins' sample) into shared memory
  kClusterPhaseSelect = 1,     // the radix passes' digit choices; the bins' sums; T from the sample
  kClusterPhaseBroadcast = 2,  // candidates to every block, the last barrier; the sampled counts' reads
  kClusterPhaseRank = 3,       // rank the slice (the owned bins), write
  kClusterPhaseCount = 4,      // the histogram loops (passes or bins)
  kClusterPhaseWait = 5,       // the passes' cluster barriers; the bins' first
  kClusterPhaseRemote = 6,     // the candidates' copies (scatter) and the last barrier
  kClusterPhaseBins = 7,       // the bins' sample ranks and thresholds; the sampled T
};

struct ClusterTopkShared {
  DigitPick pick;  // the pass's bucket over the cluster's histogram
  uint32_t above_of[kClusterMaxBlocks];   // per block: elements above the chosen buckets
  uint32_t bucket_of[kClusterMaxBlocks];  // per block: elements in the last chosen bucket
  BlockRankShared<kClusterThreads> rank;
};

// Loads src[0:count) as ordered keys into keys[]: 16-byte vectors (8 in
// flight per thread) when src is 16-byte aligned, else element by element.
template <typename U>
__device__ JAX_TOPK_FORCE_INLINE void load_chunk_keys(const U* __restrict__ src, int count,
                                                      U* keys, KeyCodec<U> codec) {
  constexpr int kVec = int(16 / sizeof(U));
  constexpr int kUnroll = 4;
  const int tid = int(threadIdx.x);
  int done = 0;
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    const int nvec = count / kVec;
    const uint4* vecs = reinterpret_cast<const uint4*>(src);
    uint4* out = reinterpret_cast<uint4*>(keys);
    for (int v0 = 0; v0 < nvec; v0 += kUnroll * kClusterThreads) {
      Vec16<U> data[kUnroll];
JAX_TOPK_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        const int v = v0 + u * kClusterThreads + tid;
        if (v < nvec) data[u].raw = __ldg(vecs + v);
      }
JAX_TOPK_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        const int v = v0 + u * kClusterThreads + tid;
JAX_TOPK_UNROLL
        for (int e = 0; e < kVec; ++e) data[u].elems[e] = codec.key(data[u].elems[e]);
        if (v < nvec) out[v] = data[u].raw;
      }
    }
    done = nvec * kVec;
  }
  for (int i = done + tid; i < count; i += kClusterThreads) keys[i] = codec.key(src[i]);
}

// Calls f(key, i) for every key of keys[0:count), thread by thread in
// 16-byte vectors (keys[] is padded to whole vectors; the padding is skipped).
template <typename U, typename F>
__device__ JAX_TOPK_FORCE_INLINE void for_each_chunk_key(const U* keys, int count, F&& f) {
  constexpr int kVec = int(16 / sizeof(U));
  const uint4* vecs = reinterpret_cast<const uint4*>(keys);
  const int nvec = (count + kVec - 1) / kVec;
#pragma unroll 2
  for (int v = int(threadIdx.x); v < nvec; v += kClusterThreads) {
    Vec16<U> data;
    data.raw = vecs[v];
JAX_TOPK_UNROLL
    for (int e = 0; e < kVec; ++e) {
      if (v * kVec + e < count) f(uint32_t(data.elems[e]), v * kVec + e);
    }
  }
}

// --- Sampled bins (rows that cluster_bins_fit; the method is described in
// topk_dispatch.h) ---------------------------------------------------------
static_assert(kClusterThreads == 4 * kClusterBinSamples, "four threads rank each sample");
static_assert(kClusterBinSamples % 64 == 0, "a quarter of the sample is whole 16-byte vectors");
static_assert(kClusterBinThresholds == 4 * kWarpSize, "one warp sums the bins, four a lane");
static_assert(kClusterThreads >= kClusterBinThresholds, "a thread per threshold");

struct ClusterBinShared {
  alignas(16) uint64_t sample[kClusterBinSamples];  // the sample: key << 32 | ~(sample index)
  alignas(16) uint32_t hist[kClusterBinThresholds];  // this block's elements per bin (read by the others)
  uint32_t sorted[kClusterBinSamples];               // the sample's keys by rank (0: the largest)
  uint32_t thresholds[kClusterBinThresholds];        // keys, descending
  uint32_t cursor[kClusterBinThresholds];            // this block's candidates placed, per bin
  uint32_t before[kClusterBinThresholds];            // the bin's elements in the blocks before this one
  uint32_t base[kClusterBinThresholds + 1];          // the bin's first slot: the candidates above it
  ClusterBinLayout layout;                           // where the thresholds come from
  uint32_t last_bin;                                 // the bin where the count reaches k
  uint32_t ok;                                       // the bins select this row
};

// Calls f(key, i, bin) for every key of keys[0:count) at or above floor_key
// (one of the thresholds, descending), bin = cluster_bin_of(key) (0 ..
// kClusterBinThresholds - 1). The binary searches of four keys run in
// lockstep: their shared-memory loads overlap.
template <typename U, typename F>
__device__ JAX_TOPK_FORCE_INLINE void for_each_binned_key(const U* keys, int count, uint32_t floor_key,
                                                          const uint32_t* thresholds, F&& f) {
  constexpr int kVec = int(16 / sizeof(U)), kGroup = kVec < 4 ? kVec : 4;
  const uint4* vecs = reinterpret_cast<const uint4*>(keys);
  const int nvec = (count + kVec - 1) / kVec;
  for (int v = int(threadIdx.x); v < nvec; v += kClusterThreads) {
    Vec16<U> data;
    data.raw = vecs[v];
JAX_TOPK_UNROLL
    for (int g = 0; g < kVec; g += kGroup) {
      uint32_t key[kGroup];
      bool in[kGroup];
      bool any = false;
      int bin[kGroup];
JAX_TOPK_UNROLL
      for (int e = 0; e < kGroup; ++e) {
        key[e] = uint32_t(data.elems[g + e]);
        in[e] = v * kVec + g + e < count && key[e] >= floor_key;
        any |= in[e];
        bin[e] = 0;
      }
      if (!any) continue;
JAX_TOPK_UNROLL
      for (int half = kClusterBinThresholds / 2; half > 0; half /= 2) {
JAX_TOPK_UNROLL
        for (int e = 0; e < kGroup; ++e) {
          if (thresholds[bin[e] + half - 1] > key[e]) bin[e] += half;
        }
      }
JAX_TOPK_UNROLL
      for (int e = 0; e < kGroup; ++e) {
        if (in[e]) f(key[e], v * kVec + g + e, bin[e]);
      }
    }
  }
}

// The sample sorted: sample i is ranked by threads 4i..4i+3 (one quarter of
// the sample each); its rank is the number of samples above it in (key,
// lower index first) order, so the ranks are a permutation and each slot of
// bs.sorted has one writer.
__device__ JAX_TOPK_FORCE_INLINE void cluster_sort_sample(ClusterBinShared& bs) {
  constexpr int kQuarter = kClusterBinSamples / 4, kVecs = kQuarter / 2;  // 16-byte vectors of two samples
  const int tid = int(threadIdx.x);
  const int i = tid >> 2, q = tid & 3;
  const uint64_t v = bs.sample[i];
  const uint4* quarter = reinterpret_cast<const uint4*>(bs.sample + q * kQuarter);
  uint32_t rank = 0;
JAX_TOPK_UNROLL
  for (int u = 0; u < kVecs; ++u) {
    // Rotated by quarter: the four quarters' loads of a warp fall in
    // different banks.
    const uint4 c = quarter[(u + 2 * q) % kVecs];
    rank += (uint64_t(c.y) << 32 | c.x) > v ? 1u : 0u;
    rank += (uint64_t(c.w) << 32 | c.z) > v ? 1u : 0u;
  }
  rank += warp_shfl_xor(rank, 1);
  rank += warp_shfl_xor(rank, 2);
  if (q == 0) bs.sorted[rank] = uint32_t(v >> 32);
}

// Threshold `slot` < kClusterBinThresholds from the sorted sample (descending
// keys), as cluster_bin_layout describes (host-callable: the host simulation
// builds the same bins).
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE uint32_t cluster_bin_threshold(const uint32_t* sorted, ClusterBinLayout l,
                                                                         int slot) {
  const uint32_t top = sorted[0];
  if (slot < kClusterBinsAboveSample) {
    // Doubling steps above the largest sample: 2g .. 256g, g the mean gap
    // between the top per_gap sampled ranks.
    const uint32_t below = sorted[min_of(l.per_gap * l.rank_step, kClusterBinSamples - 1)];
    const uint64_t step = max_of((top - below) / uint32_t(l.per_gap), 1u);
    return uint32_t(min_of<uint64_t>(uint64_t(top) + (step << (kClusterBinsAboveSample - slot)), 0xffffffffu));
  }
  const int u = min_of(slot - kClusterBinsAboveSample, l.ranks * l.per_gap - 1);
  const int j = u / l.per_gap, part = u % l.per_gap;
  const int rank = min_of(j * l.rank_step, l.lowest);
  const int next = j + 1 < l.ranks ? min_of((j + 1) * l.rank_step, l.lowest)
                                   : min_of(l.lowest + 1, kClusterBinSamples - 1);
  // a - floor((a - b) part / per_gap) in 32-bit arithmetic.
  const uint32_t a = sorted[rank], gap = a - sorted[next], q = uint32_t(l.per_gap);
  return a - (gap / q * uint32_t(part) + gap % q * uint32_t(part) / q);
}

// The bin of a key at or above the lowest threshold: the number of
// thresholds above it (for_each_binned_key's search, one key at a time;
// host-callable).
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE int cluster_bin_of(uint32_t key, const uint32_t* thresholds) {
  int bin = 0;
  for (int half = kClusterBinThresholds / 2; half > 0; half /= 2) {
    if (thresholds[bin + half - 1] > key) bin += half;
  }
  return bin;
}

// cooperative_groups::cluster_group exists in the host pass and the device
// passes of sm_90 and newer (the kernel calls these from sm_90 code only).
#if defined(JAX_TOPK_HAS_CLUSTERS) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
// Warp 0, after the first cluster barrier: the cluster's count per bin (lane
// l sums bins 4l..4l+3 over the blocks), the bins' first slots, the bin
// where the count reaches k_eff, and whether the bins select the row.
__device__ JAX_TOPK_FORCE_INLINE void cluster_sum_bins(const cooperative_groups::cluster_group& cluster,
                                                       int blocks, int me, uint32_t k_eff, uint32_t slots,
                                                       ClusterBinShared& bs) {
  const int lane = lane_id();
  uint4 of_block[kClusterMaxBlocks];  // all C loads in flight before the first use
JAX_TOPK_UNROLL
  for (int b = 0; b < kClusterMaxBlocks; ++b) {
    of_block[b] = b < blocks ? reinterpret_cast<const uint4*>(cluster.map_shared_rank(bs.hist, b))[lane]
                             : make_uint4(0u, 0u, 0u, 0u);
  }
  uint32_t total[4] = {0, 0, 0, 0}, before[4] = {0, 0, 0, 0};
JAX_TOPK_UNROLL
  for (int b = 0; b < kClusterMaxBlocks; ++b) {
    const uint32_t bins[4] = {of_block[b].x, of_block[b].y, of_block[b].z, of_block[b].w};
JAX_TOPK_UNROLL
    for (int e = 0; e < 4; ++e) {
      total[e] += bins[e];
      before[e] += b < me ? bins[e] : 0u;
    }
  }
  // through[e]: the row's elements at or above threshold 4 lane + e.
  uint32_t through[4];
  const uint32_t quad = total[0] + total[1] + total[2] + total[3];
  through[3] = warp_inclusive_sum(quad, lane);
  through[0] = through[3] - quad + total[0];
  through[1] = through[0] + total[1];
  through[2] = through[1] + total[2];
JAX_TOPK_UNROLL
  for (int e = 0; e < 4; ++e) {
    bs.base[4 * lane + e] = through[e] - total[e];
    bs.before[4 * lane + e] = before[e];
  }
  if (lane == kWarpSize - 1) bs.base[kClusterBinThresholds] = through[3];
  const unsigned reach = warp_ballot(through[3] >= k_eff);
  const int at = reach != 0 ? __ffs(reach) - 1 : kWarpSize - 1;
  uint32_t candidates = 0;  // at or above the last bin's threshold
  int last_bin = 4 * at + 3;
JAX_TOPK_UNROLL
  for (int e = 3; e >= 0; --e) {
    const uint32_t there = warp_shfl(through[e], at);
    if (there >= k_eff) {
      last_bin = 4 * at + e;
      candidates = there;
    }
  }
  uint32_t widest = 0;
JAX_TOPK_UNROLL
  for (int e = 0; e < 4; ++e) widest = max_of(widest, 4 * lane + e <= last_bin ? total[e] : 0u);
  widest = warp_reduce_max(widest);
  if (lane == 0) {
    bs.last_bin = uint32_t(last_bin);
    bs.ok = reach != 0 && widest <= uint32_t(kClusterBinMaxMembers) && candidates <= slots;
  }
}

// The sampled-bins select and rank of one row (every block of the cluster,
// bs.sample and bs.layout set and bs.hist / bs.cursor zeroed before a block
// barrier).
// Returns false, uniformly over the cluster, when the bins do not select the
// row (the caller then runs the radix select; nothing was written but
// shared memory). On true, out(packed, rank) has been called for each of
// the row's top k_eff once, by the block owning its bin.
template <typename U, typename Out>
__device__ bool cluster_topk_by_bins(const cooperative_groups::cluster_group& cluster, int blocks, int me,
                                     const U* keys, int count, int begin, int k_eff,
                                     uint64_t* candidates, int slots, ClusterBinShared& bs, PhaseTimer& timer,
                                     Out&& out) {
  using P = uint64_t;
  using Pack = KeyIndexPacking<U, P>;
  const int tid = int(threadIdx.x);
  cluster_sort_sample(bs);
  __syncthreads();
  if (tid < kClusterBinThresholds) bs.thresholds[tid] = cluster_bin_threshold(bs.sorted, bs.layout, tid);
  __syncthreads();
  timer.mark(kClusterPhaseBins);
  const uint32_t lowest = bs.thresholds[kClusterBinThresholds - 1];
  for_each_binned_key<U>(keys, count, lowest, bs.thresholds,
                         [&](uint32_t, int, int bin) { atomicAdd(&bs.hist[bin], 1u); });
  timer.mark(kClusterPhaseCount);
  cluster.sync();  // every block's histogram complete and visible
  timer.mark(kClusterPhaseWait);
  if (tid < kWarpSize) cluster_sum_bins(cluster, blocks, me, uint32_t(k_eff), uint32_t(slots), bs);
  __syncthreads();
  timer.mark(kClusterPhaseSelect);
  if (!bs.ok) return false;  // uniform: every block summed the same histograms

  // Each candidate into its bin's slots in the bin's owner (bin mod C).
  const int last_bin = int(bs.last_bin);
  const uint32_t floor_key = bs.thresholds[last_bin];
  for_each_binned_key<U>(keys, count, floor_key, bs.thresholds, [&](uint32_t key, int i, int bin) {
    const uint32_t slot = bs.base[bin] + bs.before[bin] + atomicAdd(&bs.cursor[bin], 1u);
    cluster.map_shared_rank(candidates, bin % blocks)[slot] = Pack::pack(U(key), uint32_t(begin + i));
  });
  cluster.sync();  // every candidate in its owner's slots; no remote access after this
  timer.mark(kClusterPhaseRemote);

  // Rank the owned bins' members within their bin.
  const uint32_t total = bs.base[last_bin + 1];
  for (uint32_t m = uint32_t(tid); m < total; m += kClusterThreads) {
    int bin = 0;  // the bin of slot m: the bins b >= 1 with base[b] <= m
JAX_TOPK_UNROLL
    for (int half = kClusterBinThresholds / 2; half > 0; half /= 2) {
      if (bs.base[bin + half] <= m) bin += half;
    }
    if (bin % blocks != me) continue;
    const P e = candidates[m];
    const uint32_t first = bs.base[bin], end = bs.base[bin + 1];
    uint32_t above = 0;
#pragma unroll 8
    for (uint32_t j = first; j < end; ++j) above += candidates[j] > e ? 1u : 0u;
    if (first + above < uint32_t(k_eff)) out(e, int64_t(first + above));
  }
  timer.mark(kClusterPhaseRank);
  return true;
}
#endif  // JAX_TOPK_HAS_CLUSTERS, sm_90

// Step 4 of both selects: the c candidates a[0:c) that every block of the
// cluster holds, ranked by the blocks in slices (block_rank_desc), the first
// `wanted` written by out(value, pos). A bucket too full to rank: every block
// sorts all c (a[] has room for next_pow2(c)) and writes its slice.
template <typename Out>
__device__ void cluster_rank_and_write(uint64_t* a, int c, int wanted, int me, int blocks, uint64_t* spill,
                                       uint32_t* bins, BlockRankShared<kClusterThreads>& rs, RankRange range,
                                       Out&& out) {
  if (block_rank_desc<kClusterThreads>(a, c, wanted, me, blocks, spill, bins, rs, range, out)) return;
  const int sorted = int(next_pow2(c));
  for (int i = c + int(threadIdx.x); i < sorted; i += kClusterThreads) a[i] = 0;
  block_bitonic_sort_desc(a, sorted);
  const int64_t first = int64_t(wanted) * me / blocks, last = int64_t(wanted) * (me + 1) / blocks;
  for (int64_t j = first + threadIdx.x; j < last; j += kClusterThreads) out(a[j], j);
}

#if defined(JAX_TOPK_HAS_CLUSTERS) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
// src[0:count) into chunk[] as raw bits: 16-byte cp.async copies (committed
// as one group, not waited for) when src is 16-byte aligned, then the
// elements past the last whole vector (or all of them) by plain loads.
template <typename U>
__device__ JAX_TOPK_FORCE_INLINE void copy_chunk_async(const U* __restrict__ src, int count, U* chunk) {
  constexpr int kVec = int(16 / sizeof(U));
  const int tid = int(threadIdx.x);
  int done = 0;
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    const int nvec = count / kVec;
    for (int v = tid; v < nvec; v += kClusterThreads) {
      copy_async_16(shared_address(chunk + v * kVec), src + v * kVec, true);
    }
    done = nvec * kVec;
  }
  copy_async_commit();
  for (int i = done + tid; i < count; i += kClusterThreads) chunk[i] = src[i];
}

// The raw bits of chunk[0:count) as ordered keys, in place (a sampled row
// that goes to the radix select).
template <typename U>
__device__ JAX_TOPK_FORCE_INLINE void chunk_bits_to_keys(U* chunk, int count, KeyCodec<U> codec) {
  for (int i = int(threadIdx.x); i < count; i += kClusterThreads) chunk[i] = codec.key(chunk[i]);
  __syncthreads();
}

// The sampled threshold's compaction: compact.scan/emit over chunk[0:count)
// (raw bits in shared memory; row positions from begin), in steps of
// 32 / (16 / sizeof(U)) 16-byte vectors a thread, as walk_row_steps walks a
// row in global memory (whose __ldg cannot read shared memory): the steps
// whose elements all lie below count with `valid` a constant.
template <typename U, typename Step>
__device__ JAX_TOPK_FORCE_INLINE void walk_chunk_steps(const U* chunk, int count, int begin, Step& step) {
  constexpr int kVec = int(16 / sizeof(U)), kUnroll = 32 / kVec, kStride = kUnroll * kClusterThreads;
  const int tid = int(threadIdx.x);
  const int nvec = (count + kVec - 1) / kVec;  // the last may be part of one
  const uint4* vecs = reinterpret_cast<const uint4*>(chunk);
  auto group = [&](int v0, auto whole) {
    constexpr bool kWhole = decltype(whole)::value;  // every element of the step lies below count
    Vec16<U> data[kUnroll];
JAX_TOPK_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * kClusterThreads + tid;
      data[u].raw = kWhole || v < nvec ? vecs[v] : make_uint4(0, 0, 0, 0);
    }
JAX_TOPK_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      const int i = (v0 + u * kClusterThreads + tid) * kVec;
JAX_TOPK_UNROLL
      for (int e = 0; e < kVec; ++e) {
        step.scan(data[u].elems[e], begin + i + e, kWhole || i + e < count, u * kVec + e);
      }
    }
    step.between();
    for (uint32_t m = step.emit_mask(); m != 0; m &= m - 1) {
      const int pos = __ffs(m) - 1;
      const int i = (v0 + (pos / kVec) * kClusterThreads + tid) * kVec + pos % kVec;
      step.emit(chunk[i], begin + i);
    }
  };
  const int whole_vecs = count / kVec;  // uniform trips: between() is warp-wide
  int v0 = 0;
  for (; v0 + kStride <= whole_vecs; v0 += kStride) group(v0, std::true_type{});
  if (v0 < nvec) group(v0, std::false_type{});
}

// The sampled threshold of one row (every block of the cluster; the method
// is in topk_dispatch.h): the sample's loads, then the chunk's copies into
// chunk[] (raw bits), T from the sample while they fly, the chunk's
// candidates, their exchange and their rank. a: kClusterSampledSlots;
// words: the kernel's histogram and bucket words. Returns false, uniformly
// over the cluster, when the row takes the radix select instead (no sample
// for its length, or a count outside [k, kClusterSampleSlots]); chunk[] then
// holds the chunk's raw bits, and nothing but shared memory was written. On
// true, out(packed, rank) has been called once for each of the row's top k.
template <typename U, typename Out>
__device__ bool cluster_topk_by_sample(const cooperative_groups::cluster_group& cluster, int blocks, int me,
                                       const U* row, int len, int k, ThresholdSample sample, KeyCodec<U> codec,
                                       U* chunk, int count, int begin, uint64_t* a, uint32_t* words,
                                       ThresholdShared& ts, BlockRankShared<kClusterThreads>& rs,
                                       PhaseTimer& timer, Out&& out) {
  constexpr int kG = int(kClusterSampleSlots), kR = kG / kClusterThreads;
  static_assert(kR * kClusterThreads == kG, "whole slots a thread");
  const int tid = int(threadIdx.x);
  const bool sampled = sample.rank > 0;  // uniform over the cluster: len is the row's
  ThresholdSampleLoads<U, kClusterThreads, kR> loads;
  if (sampled) loads.issue(row, len);  // ahead of the copies in the memory queues
  copy_chunk_async(row + begin, count, chunk);
  if (!sampled) {
    copy_async_wait<0>();
    __syncthreads();
    return false;
  }
  const uint64_t t = loads.select(uint32_t(sample.rank), uint32_t(sample.most), codec, a, words, ts, timer,
                                  kClusterPhaseBins, kClusterPhaseSelect);
  copy_async_wait<0>();
  __syncthreads();
  timer.mark(kClusterPhaseLoad);

  // The chunk's candidates into mine[] (its count and largest in ts: read
  // by the other blocks).
  uint64_t* mine = a + kG;
  CompactAtLeastBranchFree<U> compact{{codec, t, &ts.candidates, mine, uint32_t(kG)}};
  walk_chunk_steps<U>(chunk, count, begin, compact);
  compact.publish_largest(&ts.candidates_hi);
#if defined(JAX_TOPK_PHASE_TIMING)
  __syncthreads();  // the whole block's compaction in the phase
#endif
  timer.mark(kClusterPhaseCount);
  cluster.sync();  // every block's count and largest visible; every sample's select done
  timer.mark(kClusterPhaseWait);
  uint32_t total = 0, offset = 0;
  uint64_t hi = 0;
  for (int b = 0; b < blocks; ++b) {
    const ThresholdShared* of = cluster.map_shared_rank(&ts, b);
    const uint32_t c = of->candidates;
    total += c;
    offset += b < me ? c : 0u;
    hi = max_of(hi, uint64_t(of->candidates_hi));
  }
  if (total < uint32_t(k) || total > uint32_t(kG)) return false;  // uniform: every block read the same counts
  timer.mark(kClusterPhaseBroadcast);

  // Every block's candidates into every block's a[] after the earlier
  // blocks' (a[] held the sample, whose select every block has finished).
  const uint32_t mine_count = ts.candidates;
  for (int b = 0; b < blocks; ++b) {
    uint64_t* to = cluster.map_shared_rank(a, (me + b) % blocks) + offset;
    for (uint32_t j = uint32_t(tid); j < mine_count; j += kClusterThreads) to[j] = mine[j];
  }
  cluster.sync();  // every block holds all candidates; no remote access after this
  timer.mark(kClusterPhaseRemote);
  cluster_rank_and_write(a, int(total), k, me, blocks, mine, words, rs, RankRange{t, hi}, out);
  timer.mark(kClusterPhaseRank);
  return true;
}

// Asks L2 for part `me` of `blocks` of a row's n elements, a 128-byte line a
// thread (prefetch.global.L2: nothing waits on it). A ragged row's loads wait
// for its length (their range depends on it); with the padded row asked for
// while the length is read, they hit L2 instead of DRAM.
template <typename U>
__device__ JAX_TOPK_FORCE_INLINE void prefetch_row_part_to_l2(const U* row, int64_t n, int blocks, int me) {
  constexpr int64_t kLine = 128;
  const int64_t lines = (n * int64_t(sizeof(U)) + kLine - 1) / kLine;
  const int64_t per_block = (lines + blocks - 1) / blocks;
  const int64_t end = min_of(lines, (me + 1) * per_block);
  const char* const base = reinterpret_cast<const char*>(row);
  for (int64_t line = me * per_block + threadIdx.x; line < end; line += blockDim.x) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(base + line * kLine));
  }
}
#endif  // JAX_TOPK_HAS_CLUSTERS, sm_90

// One cluster of C blocks (the launch's cluster dimension) per row:
// gridDim.x = rows * C. Dynamic shared memory: cluster_smem_bytes<U>(
// cluster_chunk<U>(n, C), k, kSampled). kSampled: rows try the sampled
// threshold first (`sample`: threshold_sample(n, k, kClusterSampleSlots)
// for whole rows; with lengths each row's own), one block per SM (its chunk
// takes most of the shared memory).
template <typename U, bool kSampled>
__global__ void __launch_bounds__(kClusterThreads, kSampled ? 1 : 2)
    cluster_topk_rows_kernel(const U* __restrict__ x, int64_t n, int64_t k, ThresholdSample sample,
                             KeyCodec<U> codec, RowLengths<U> lengths, U* __restrict__ values,
                             int32_t* __restrict__ indices) {
  wait_for_previous_grid();  // launched dependent (dependent_launch.cuh): the kernel before may still run
#if defined(JAX_TOPK_HAS_CLUSTERS) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(U) <= 4, "keys of at most 32 bits (packed with the index in 64)");
  using P = uint64_t;
  using Pack = KeyIndexPacking<U, P>;
  constexpr int kKeyBits = int(sizeof(U) * 8);
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int blocks = int(cluster.num_blocks());
  const int me = int(cluster.block_rank());
  const int tid = int(threadIdx.x);

  extern __shared__ uint4 cluster_smem[];
  uint32_t* hist = reinterpret_cast<uint32_t*>(cluster_smem);  // [2][kClusterBins]
  uint32_t* rank_bins = hist + 2 * kClusterBins;                // [kRankBuckets]
  U* keys = reinterpret_cast<U*>(rank_bins + kRankBuckets);
  const int64_t row = int64_t(blockIdx.x) / blocks;
  if (lengths.lengths != nullptr) prefetch_row_part_to_l2(x + row * n, n, blocks, me);
  const int len = int(lengths.of_loaded(row, n));
  const int chunk = int(cluster_chunk<U>(len, blocks));
  P* candidates = reinterpret_cast<P*>(
      reinterpret_cast<unsigned char*>(keys) + (size_t(cluster_chunk<U>(n, blocks)) * sizeof(U) + 15) / 16 * 16);
  P* spill = candidates + next_pow2(k);
  __shared__ ClusterTopkShared ss;
  __shared__ uint32_t totals[kClusterBins];
  PhaseTimer timer;
  U* values_row = values + row * k;
  int32_t* indices_row = indices + row * k;
  auto write_output = [&](P e, int64_t pos) {
    write_packed_output(e, codec, lengths.pad_bits, values_row, indices_row, pos);
  };

  // The chunk of block b: [b * chunk, b * chunk + count_of(b)).
  auto count_of = [&](int b) { return max_of(0, min_of(chunk, len - b * chunk)); };
  const int begin = me * chunk;
  const int count = count_of(me);
  const int k_eff = int(min_of<int64_t>(k, len));
  // The radix select's first histogram and per-block counts, zeroed before
  // the barrier that precedes it (on either path).
  auto zero_radix_state = [&] {
    if (tid < kClusterBins) hist[tid] = 0;
    if (tid < kClusterMaxBlocks) {
      ss.above_of[tid] = 0;
      ss.bucket_of[tid] = 0;
    }
  };
  if constexpr (kSampled) {
    __shared__ ThresholdShared ts;
    if (lengths.lengths != nullptr) sample = threshold_sample(len, k, kClusterSampleSlots);
    if (cluster_topk_by_sample<U>(cluster, blocks, me, x + row * n, len, int(k), sample, codec, keys, count, begin,
                                  candidates, hist, ts, ss.rank, timer, write_output)) {
      return;  // k < len: no padding
    }
    chunk_bits_to_keys<U>(keys, count, codec);  // the radix select's keys
    zero_radix_state();
    __syncthreads();
  } else {
    __shared__ ClusterBinShared bs;
    // The sampled bins' sample (uniform over the cluster: len is the row's),
    // its loads in flight with the chunk's.
    const bool by_bins = cluster_bins_fit(len, k);
    uint32_t sample_key = 0;
    if (by_bins && tid < kClusterBinSamples) {
      sample_key = uint32_t(codec.key(x[row * n + int64_t(tid) * len / kClusterBinSamples]));
    }
    if (by_bins && tid == 0) bs.layout = cluster_bin_layout(len, k);  // while the loads fly
    load_chunk_keys<U>(x + row * n + begin, count, keys, codec);
    zero_radix_state();
    if (tid < kClusterBinThresholds) {
      bs.hist[tid] = 0;
      bs.cursor[tid] = 0;
    }
    if (tid < kClusterBinSamples) bs.sample[tid] = uint64_t(sample_key) << 32 | uint32_t(~tid);
    __syncthreads();
    timer.mark(kClusterPhaseLoad);

    if (by_bins && cluster_topk_by_bins<U>(cluster, blocks, me, keys, count, begin, k_eff, candidates,
                                           int(cluster_candidate_slots(k)), bs, timer, write_output)) {
      return;  // k < len: no padding
    }
  }

  // 1. The select (uniform over the cluster: len is the row's).
  const bool select_all = k_eff == len;
  uint32_t prefix = 0, k_left = uint32_t(k_eff);
  int shift = kKeyBits;
  bool whole_bucket = true;  // the last chosen bucket is taken whole
  if (select_all) {
    cluster.sync();  // every block has started before the first remote store
  } else {
    for (int pass = 0; shift > 0; ++pass) {
      const int low = shift - kClusterDigitBits;
      uint32_t* h = hist + (pass & 1) * kClusterBins;
      for_each_chunk_key<U>(keys, count, [&](uint32_t key, int) {
        if (key_matches_prefix<U>(key, prefix, shift)) atomicAdd(&h[(key >> low) & (kClusterBins - 1)], 1u);
      });
      timer.mark(kClusterPhaseCount);
      // Every block's histogram is complete and visible; the other buffer
      // was last read remotely in the previous pass, by blocks now past
      // this barrier.
      cluster.sync();
      timer.mark(kClusterPhaseWait);
      // Thread t < kClusterBins: bin t of every block (all C loads in
      // flight before the first use).
      uint32_t bin_of[kClusterMaxBlocks];
      if (tid < kClusterBins) {
JAX_TOPK_UNROLL
        for (int b = 0; b < kClusterMaxBlocks; ++b) {
          bin_of[b] = b < blocks ? cluster.map_shared_rank(h, b)[tid] : 0u;
        }
        uint32_t total = 0;
JAX_TOPK_UNROLL
        for (int b = 0; b < kClusterMaxBlocks; ++b) total += bin_of[b];
        totals[tid] = total;
        hist[((pass + 1) & 1) * kClusterBins + tid] = 0;
      }
      __syncthreads();
      if (tid < kWarpSize) warp_pick_digit<kClusterBins>(totals, k_left, &ss.pick);
      __syncthreads();
      const uint32_t digit = ss.pick.digit;
      if (tid < kClusterBins) {
        // Each block's elements above the chosen digit: one sum per warp
        // of bins and block.
        const bool above = uint32_t(tid) > digit;
JAX_TOPK_UNROLL
        for (int b = 0; b < kClusterMaxBlocks; ++b) {
          const uint32_t sum = warp_reduce_add(above ? bin_of[b] : 0u);
          if (lane_id() == 0 && sum != 0) atomicAdd(&ss.above_of[b], sum);
          if (uint32_t(tid) == digit) ss.bucket_of[b] = bin_of[b];
        }
      }
      prefix |= digit << low;
      k_left -= ss.pick.above;
      shift = low;
      whole_bucket = ss.pick.count == k_left;
      timer.mark(kClusterPhaseSelect);
      if (whole_bucket) break;  // uniform
    }
  }
  __syncthreads();  // above_of / bucket_of complete
  timer.mark(kClusterPhaseSelect);

  // 2. This block's selected elements and where they go.
  auto taken_ties = [&](int b, uint32_t ties_before) {  // ties of block b taken
    const uint32_t ties = ss.bucket_of[b];
    if (ties_before >= k_left) return 0u;
    return min_of(ties, k_left - ties_before);
  };
  uint32_t offset = 0, ties_before = 0;
  for (int b = 0; b < me; ++b) {
    offset += select_all     ? uint32_t(count_of(b))
              : whole_bucket ? ss.above_of[b] + ss.bucket_of[b]
                             : ss.above_of[b] + taken_ties(b, ties_before);
    ties_before += ss.bucket_of[b];
  }
  // Keys taken outright: all (select_all), those at or above the chosen
  // bucket (whole_bucket), else those above the k-th key.
  auto takes = [&](uint32_t key) {
    if (select_all) return true;
    if (whole_bucket) return (key >> shift) >= (prefix >> shift);  // shift < kKeyBits here
    return key > prefix;
  };
  // 3. The block's candidates into its own slots [offset, offset + mine):
  // those taken outright in any order (a scan of per-thread counts), then
  // the ties in position order (each thread walks a contiguous run).
  uint32_t mine_outright = 0;
  for_each_chunk_key<U>(keys, count, [&](uint32_t key, int) { mine_outright += takes(key) ? 1u : 0u; });
  uint32_t slot = offset + block_exclusive_sum<kClusterThreads>(mine_outright, ss.rank.warp_totals);
  for_each_chunk_key<U>(keys, count, [&](uint32_t key, int i) {
    if (takes(key)) candidates[slot++] = Pack::pack(U(key), uint32_t(begin + i));
  });
  uint32_t mine = select_all ? uint32_t(count) : ss.above_of[me] + ss.bucket_of[me];
  if (!whole_bucket) {
    const uint32_t take_ties = taken_ties(me, ties_before);
    mine = ss.above_of[me] + take_ties;
    if (take_ties > 0) {  // uniform over the block
      const int per = (count + kClusterThreads - 1) / kClusterThreads;
      const int lo = min_of(count, tid * per), hi = min_of(count, lo + per);
      uint32_t my_ties = 0;
      for (int i = lo; i < hi; ++i) my_ties += uint32_t(keys[i]) == prefix ? 1u : 0u;
      uint32_t ordinal = block_exclusive_sum<kClusterThreads>(my_ties, ss.rank.warp_totals);
      const uint32_t base = offset + ss.above_of[me];
      for (int i = lo; i < hi && ordinal < take_ties; ++i) {
        if (uint32_t(keys[i]) != prefix) continue;
        candidates[base + ordinal] = Pack::pack(U(prefix), uint32_t(begin + i));
        ++ordinal;
      }
    }
  }
  __syncthreads();
  timer.mark(kClusterPhaseBroadcast);
  // ... then copied to the same slots of every other block: coalesced
  // stores, one pass per destination.
  for (int b = 1; b < blocks; ++b) {
    P* remote = cluster.map_shared_rank(candidates, (me + b) % blocks);
    for (uint32_t j = uint32_t(tid); j < mine; j += kClusterThreads) remote[offset + j] = candidates[offset + j];
  }
  cluster.sync();  // every block holds all k_eff candidates; no remote access after this
  timer.mark(kClusterPhaseRemote);

  // 4. Rank this block's slice of the candidates; pad slots [k_eff, k).
  cluster_rank_and_write(candidates, k_eff, k_eff, me, blocks, spill, rank_bins, ss.rank, RankRange{},
                         write_output);
  const int64_t pad_first = k_eff + (k - k_eff) * me / blocks;
  const int64_t pad_last = k_eff + (k - k_eff) * (me + 1) / blocks;
  for (int64_t j = pad_first + tid; j < pad_last; j += kClusterThreads) write_output(P(0), j);
  timer.mark(kClusterPhaseRank);
#else
  gpu_trap();  // the dispatcher sends this regime to CUDA sm_90 and newer only
#endif
}

}  // namespace jax_topk::cuda
