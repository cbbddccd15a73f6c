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
                         // warp-wide pruning threshold. (Rows of at most
                         // kWarpSelectMaxN take the threshold-filter kernel in
                         // both regimes, with its own lanes per row: ws_lanes.)
  kRadixRowPerBlock = 3, // radix select, one block per row, all passes in one kernel
  kRadixSplitRow = 4,    // radix select, several blocks per row, one launch per pass
  kThresholdRowPerBlock = 5,  // one block per row: group-maxima threshold, one
                              // compaction read, sort of the ~k..2k candidates
  kClusterRows = 6,      // sm_90+: a cluster of blocks per row, the row read once
                         // into their shared memory, exact radix select over DSMEM
  kRegisterRows = 7,     // one 1024-thread block per row, the row read once into
                         // registers, exact radix select, radix sort of the k
  kThresholdStream = 8,  // one block per row, the row read once: a threshold from
                         // the first step's group maxima, raised as the row streams
};

inline const char* topk_regime_name(TopkRegime r) {
  switch (r) {
    case TopkRegime::kEmpty: return "empty";
    case TopkRegime::kTinyRows: return "tiny_rows";
    case TopkRegime::kSmallK: return "small_k";
    case TopkRegime::kRadixRowPerBlock: return "radix_row_per_block";
    case TopkRegime::kRadixSplitRow: return "radix_split_row";
    case TopkRegime::kThresholdRowPerBlock: return "threshold_row_per_block";
    case TopkRegime::kClusterRows: return "cluster_rows";
    case TopkRegime::kRegisterRows: return "register_rows";
    case TopkRegime::kThresholdStream: return "threshold_stream";
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
// Most elements per lane the threshold-filter kernel gives a row when it
// chooses how many lanes share it (ws_lanes in topk_warp_select.cuh, which
// then widens the group towards 2k lanes). Measured on an H200
// (benchmarks/results/NOTES.md, fifteenth session; ncu, base clocks)
// against 8, 16 and 32: 24 puts
// 16384x256 k8 on 16 lanes (13.3 us, from 15.6 on 32), 16384x384 k6 on 16
// lanes of 24 slots (14.1 from 16.6), 16384x64 k2 on 4 lanes (6.3-6.7 from
// 6.7), and keeps 16384x128 k8 on 16 lanes of 8 (10.9; 12.1 on 8 lanes).
inline constexpr int64_t kWarpSelectElemsPerLane = 24;
// Largest k whose whole-warp key threshold is found by rounds of a warp
// maximum (topk_warp_select.cuh, ws_threshold_by_warp_maxima).
inline constexpr int64_t kWarpSelectReduxMaxK = 8;

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
// reads of the row by one block plus the candidate rank) while the row is at
// most this many bytes. On an H200 (benchmarks/results/NOTES.md, fifth
// session) it beat the split-row kernel at every row count from 1 to 32 at
// 131072 float32 (1 row, k = 2048: 53 vs 58 us; 16 rows: 58 vs 81) and at
// 64-128 rows. Longer rows (1 x 2^20) stay on the split-row kernel, whose
// parallelism across blocks wins there.
inline constexpr int64_t kThresholdFewRowsMaxRowBytes = int64_t(512) * 1024;
// Threads of a threshold block. Wide blocks (two per SM: 64 registers a
// thread) give each row 4096 group maxima, enough for k up to
// kThresholdMaxK. A row's block spends most of its time in barrier-separated
// steps between its two reads, so with many rows it is rows in flight that
// bound the kernel, not threads per row: narrow blocks (eight per SM) hold
// four times as many rows, at 1024 group maxima (at least 4k candidates'
// worth: k <= kThresholdNarrowMaxK), and are used from
// kThresholdNarrowMinRowsPerSm rows per SM. Measured on an H200
// (benchmarks/results/NOTES.md, sixteenth session; CUDA events, rows of
// 8192 float32, k = 64): wide 17.7 / 27.5 / 46.1 us at 2 / 4 / 8 rows per SM,
// narrow 21.8 / 25.2 / 34.5 (256-thread blocks: 18.1 / 22.1 / 36.5).
inline constexpr int kThresholdWideThreads = 512;
inline constexpr int kThresholdNarrowThreads = 128;
inline constexpr int64_t kThresholdNarrowMaxK = 256;
inline constexpr int64_t kThresholdNarrowMinRowsPerSm = 4;
// Rows per SM from which narrow blocks take 8 slots where their k alone
// would give fewer and no sampled threshold (threshold_row_slots in
// topk_threshold.cuh: a sample and one read of the row instead of two).
// Measured on an H100 (benchmarks/results/NOTES.md, twenty-ninth session;
// CUDA graph, rows of 8192 float32, k = 64, two reads -> sampled): 528 rows
// (4 per SM) 17.3 -> 18.6 us, 792 (6 per SM) 22.3 -> 21.8, 1024 27.6 ->
// 25.3, 1056 28.4 -> 26.0, 2112 49.4 -> 46.7.
#ifndef JAX_TOPK_THRESHOLD_SAMPLED_NARROW_MIN_ROWS_PER_SM  // a build-time override for A/B measurements only
#define JAX_TOPK_THRESHOLD_SAMPLED_NARROW_MIN_ROWS_PER_SM 6
#endif
inline constexpr int64_t kThresholdSampledNarrowMinRowsPerSm = JAX_TOPK_THRESHOLD_SAMPLED_NARROW_MIN_ROWS_PER_SM;

// Sampled threshold (kThresholdRowPerBlock, whole rows only: no lengths).
// The two-read kernel's first read exists only to find T, a key with at
// least k elements at or above it and few more. On long rows a sample does
// that for a fraction of the bytes: the block's G group slots hold G packed
// elements taken in chunks of kThresholdSampleChunk consecutive elements (one
// coalesced load per warp) spread evenly over the row, and T is the r-th
// largest of them, r from threshold_sample. The row is then read once,
// by the compaction, which counts the elements >= T: at least k (the top k
// are all there) and at most G (the rank's capacity) and the row is done;
// otherwise (a sample unlike its row: periodic or clustered values) the row
// takes the kernel's radix select, as rows with too many candidates do.
// Exact either way; only time depends on the sample.
//
// r: for iid values, the count at or above the r-th largest of s samples of
// a row of n has mean ~ r n/s and standard deviation ~ (n/s) sqrt(r (1 +
// s/n)); r is the smallest with mean - z sd >= k, z =
// kThresholdSampleSigmas (4: the radix select for ~3e-5 of random rows).
// Tied values rank by index, where the sample is in chunks: in an all-equal
// row the r-th largest sample is in chunk (r - 1) / 32, with ~ (r - 32) n/s
// elements before it, so r is also at least k s/n + 33. The sample is used
// only where mean + z sd <= G, n >= kThresholdSampleMinRatio s (the sample
// at most 1/8 of the row) and n >= kThresholdSampleMinN.
inline constexpr int kThresholdSampleChunk = 32;
inline constexpr int64_t kThresholdSampleMinRatio = 8;
inline constexpr double kThresholdSampleSigmas = 4.0;
#ifndef JAX_TOPK_THRESHOLD_SAMPLE_MIN_N  // a build-time override for A/B measurements only
#define JAX_TOPK_THRESHOLD_SAMPLE_MIN_N 8192
#endif
inline constexpr int64_t kThresholdSampleMinN = JAX_TOPK_THRESHOLD_SAMPLE_MIN_N;

// sqrt for constant expressions (Newton's method from above; x >= 0).
constexpr double constexpr_sqrt(double x) {
  if (x <= 0) return 0;
  double r = x > 1 ? x : 1;
  for (int i = 0; i < 64; ++i) {
    const double next = 0.5 * (r + x / r);
    if (next >= r) break;
    r = next;
  }
  return r;
}

// Where T may lie among the samples for a whole row of n, k and a block of
// `samples` group slots (also the candidates' capacity): at or below the
// rank-th largest (enough candidates) and at or above the most-th (not too
// many), rank <= most. The block's select stops at the first bucket that
// satisfies both (block_kth_largest's k_most). {0, 0}: no sampled threshold.
struct ThresholdSample {
  int rank;
  int most;
};
constexpr ThresholdSample threshold_sample(int64_t n, int64_t k, int64_t samples) {
  constexpr ThresholdSample kNone{0, 0};
  if (samples < 2 * kThresholdSampleChunk || samples % kThresholdSampleChunk != 0) return kNone;
  if (n < kThresholdSampleMinN || n < kThresholdSampleMinRatio * samples || k <= 0) return kNone;
  const double per = double(n) / double(samples);  // row elements per sample
  const double z = kThresholdSampleSigmas * constexpr_sqrt(1.0 + 1.0 / per);
  // per (r - z sqrt(r)) >= k  <=>  sqrt(r) >= (z + sqrt(z^2 + 4 k / per)) / 2
  const double root = 0.5 * (z + constexpr_sqrt(z * z + 4.0 * double(k) / per));
  const int64_t r_iid = int64_t(root * root) + 1;
  const int64_t r_tied = int64_t(double(k) / per) + kThresholdSampleChunk + 1;
  const int64_t r = r_iid > r_tied ? r_iid : r_tied;
  // per (m + z sqrt(m)) <= samples  <=>  sqrt(m) <= (sqrt(z^2 + 4 samples / per) - z) / 2
  const double most_root = 0.5 * (constexpr_sqrt(z * z + 4.0 * double(samples) / per) - z);
  int64_t most = int64_t(most_root * most_root);
  if (most > samples) most = samples;
  return r <= most ? ThresholdSample{int(r), int(most)} : kNone;
}

// Sample chunks on a row of len >= chunks * kThresholdSampleChunk elements
// (len < 2^31): chunk c of `chunks` starts at (c * step) >> 32, step =
// threshold_sample_step (one division per row, not one per chunk): evenly
// spaced, the first at 0 and the last ending at or before len.
// (constexpr: kernels call them too, under --expt-relaxed-constexpr.)
constexpr uint64_t threshold_sample_step(int64_t chunks, int64_t len) {
  return (uint64_t(len - kThresholdSampleChunk) << 32) / uint64_t(chunks - 1);
}
constexpr int64_t threshold_sample_chunk_start(int64_t c, uint64_t step) {
  return int64_t((uint64_t(c) * step) >> 32);
}

// Streamed threshold kernel (kThresholdStream: the row read once, the
// threshold raised as it streams) for few rows (no more than SMs) whose
// input is at least kThresholdStreamMinBytes, about the L2 of an H100/H200
// (50 / 60 MB): there the two-read kernel's second read comes from memory
// again. Measured on an H200 (benchmarks/results/NOTES.md, eighteenth
// session; CUDA events): 128 x 131072 float32 (64 MB), k = 50: 39.5 us
// against 44.3. Behind the two-read kernel wherever its rows fit in L2 (32 x
// 131072 k64: 35.8 / 33.4), at large k, where the buffer is kept (a block
// select) every few steps (128 x 131072 k1024: 59.8 / 52.3), and with more
// rows than SMs, at fewer blocks per SM (1024 x 8192 k64: 41.2 / 29.4;
// 2048 x 65536 k2048: 779 / 417).
inline constexpr int64_t kThresholdStreamMinBytes = int64_t(48) << 20;
inline constexpr int64_t kThresholdStreamMaxK = 64;

// Cluster kernel (kClusterRows; keys of at most 32 bits, devices with
// thread-block clusters): at most the portable cluster size of blocks per
// row, each holding at most kClusterMaxChunk elements in shared memory (64 KB
// of float32), so rows up to 131072 elements.
inline constexpr int kClusterMaxBlocks = 8;
inline constexpr int64_t kClusterMaxChunk = 16384;
inline constexpr int64_t kClusterMaxN = kClusterMaxBlocks * kClusterMaxChunk;
// Largest k: every block holds all k candidates (and their rank's spans).
inline constexpr int64_t kClusterMaxK = 2048;
// Elements per block the cluster size aims at: fewer blocks per row when the
// row is short (each block's fixed cost: the barriers of every pass).
inline constexpr int64_t kClusterMinChunk = 1024;
// Where the cluster kernel's radix select is dispatched: few rows (up to
// kClusterMaxRows) of at least kClusterMinN elements whose sample has no
// window (cluster_sampled_dispatch below takes the others). Measured on an
// H200 against the threshold kernel (benchmarks/results/NOTES.md, sixth
// session): 1-16 rows of 131072 float32 in 24-36 us against 38-58 (k = 64,
// 2048); even at 32 rows;
// behind from 64 rows on (64x65536 k2048: 66 vs 40 us) and on rows of 16384
// (k = 512: 19-33 vs 18-19 us). Each block's fixed cost (a cluster barrier
// and ~1 us of serial work per select pass) is what the many-row and
// short-row shapes cannot amortise.
inline constexpr int64_t kClusterMaxRows = 16;
inline constexpr int64_t kClusterMinN = 32768;

constexpr bool cluster_rows_fit(int64_t n, int64_t k, int elem_bytes, bool has_clusters) {
  return has_clusters && elem_bytes <= 4 && k <= kClusterMaxK && n <= kClusterMaxN;
}

// Sampled bins (the cluster kernel's select for rows of kClusterBinsMinLen
// ..kClusterBinsMaxLen elements, k < length: since the register rows took
// every problem of rows of at most kRegisterRowsMaxN on at most one row per
// SM (forty-seventh session), the ragged rows of a longer padded width with
// lengths, and the regimes the benchmarks force). The radix select costs a
// cluster barrier and a block-wide digit choice per 8-bit pass; a sample
// replaces the passes with ONE exact count:
// - every block reads the same kClusterBinSamples elements, evenly spaced
//   over the row, and ranks them (the same sorted sample in every block);
// - kClusterBinThresholds keys cut the key range into bins: the sample's
//   values from its largest down to the rank where the row's k-th largest
//   lies with kClusterBinSigmas standard deviations to spare (for iid rows),
//   each gap between them split into equal key steps, and
//   kClusterBinsAboveSample keys above the largest sample at doubling
//   distances (cluster_bin_layout). Each block counts its elements per bin;
// - after one cluster barrier every block sums the C histograms and takes
//   the bins down to the first that reaches k: the candidates, ~k plus part
//   of one bin. Each candidate goes to its bin's slots in the block that
//   owns the bin (bin mod C); after a second barrier a candidate's row rank
//   is the count of the bins above it plus the members of its own bin above
//   it (packed key and index: distinct, so the ranks are a permutation).
// A bin's members each count the others, so the rank's cost is the sum of
// the squared bin sizes: the split gaps and the keys above the sample keep
// bins small. (Without them the top bin, all that lies above the largest
// sample or the window's top rank, held up to 333 elements of a ragged row.)
// Exact for every row. A row whose lowest threshold has fewer than k at or
// above it, whose candidates exceed the block's slots, or whose bins hold
// more than kClusterBinMaxMembers (ties, clustered values) takes the radix
// select after all: only time depends on the sample.
inline constexpr int kClusterBinSamples = 128;
inline constexpr int kClusterBinThresholds = 128;
inline constexpr int kClusterBinsAboveSample = 8;
inline constexpr float kClusterBinSigmas = 4.0f;
inline constexpr int64_t kClusterBinMaxMembers = 512;
inline constexpr int64_t kClusterBinsMinLen = 8 * kClusterBinSamples;
inline constexpr int64_t kClusterBinsMaxLen = 16384;

// Where the thresholds come from. Slots [0, kClusterBinsAboveSample): the
// largest sample key plus g << (kClusterBinsAboveSample - slot), g the mean
// gap between the top per_gap sampled ranks. Then for j < ranks, sample rank
// r_j = min(j * rank_step, lowest) and per_gap keys stepping down from its
// value towards the next rank's (r_{j+1}, or the sample after `lowest` for
// the last); the slots past them repeat the last key (empty bins). lowest:
// the k-th largest of a row of len has sample rank ~ mean = k s / len,
// variance ~ mean (1 - mean / s).
struct ClusterBinLayout {
  int lowest;
  int rank_step;
  int ranks;
  int per_gap;
};
constexpr ClusterBinLayout cluster_bin_layout(int64_t len, int64_t k) {
  constexpr int s = kClusterBinSamples, slots = kClusterBinThresholds - kClusterBinsAboveSample;
  const float mean = float(k) * float(s) / float(len);
  float var = mean * (1.0f - mean / float(s));
  if (var < 1.0f) var = 1.0f;
  // sqrt(var) by Newton's method: var <= s / 4, five steps from (var + 1) / 2
  // are within a few percent, and any layout is exact (only time moves).
  float sd = 0.5f * (var + 1.0f);
  for (int i = 0; i < 5; ++i) sd = 0.5f * (sd + var / sd);
  int lowest = int(mean + kClusterBinSigmas * sd) + 2;
  if (lowest > s - 1) lowest = s - 1;
  const int rank_step = (lowest + slots) / slots;  // ceil((lowest + 1) / slots)
  const int ranks = (lowest + rank_step - 1) / rank_step + 1;
  return ClusterBinLayout{lowest, rank_step, ranks, slots / ranks};
}

constexpr bool cluster_bins_fit(int64_t len, int64_t k) {
  return len >= kClusterBinsMinLen && len <= kClusterBinsMaxLen && k < len;
}

// Cluster size for rows the bins may take: about one block per
// kClusterBinsMinChunk elements (a row's latency falls with its blocks:
// clusters of 8 on an 8000-element row took 23.5 us of CUDA events against
// 18.2 for 4 and 18.3 for 2, but only 30 clusters of 8 are resident on an
// H200), and no more blocks in all than kClusterBinsSmShare of the SMs.
// Measured on the ragged batch of 31 rows (benchmarks/results/NOTES.md,
// twenty-seventh session): clusters of 4 (124 blocks) 11.2 us on an H100
// (CUDA graph) and 12.7 through JAX on an H200, clusters of 3 (93 blocks:
// none shares an SM) 13.3 and 15.2.
#ifndef JAX_TOPK_CLUSTER_BINS_MIN_CHUNK  // a build-time override for A/B measurements only
#define JAX_TOPK_CLUSTER_BINS_MIN_CHUNK 2048
#endif
inline constexpr int64_t kClusterBinsMinChunk = JAX_TOPK_CLUSTER_BINS_MIN_CHUNK;
#ifndef JAX_TOPK_CLUSTER_BINS_SM_SHARE  // a build-time override for A/B measurements only
#define JAX_TOPK_CLUSTER_BINS_SM_SHARE 1.0
#endif
inline constexpr double kClusterBinsSmShare = JAX_TOPK_CLUSTER_BINS_SM_SHARE;

constexpr int64_t cluster_bins_max_blocks(int sm_count) { return int64_t(kClusterBinsSmShare * sm_count); }

// Sampled threshold in the cluster kernel (whole rows with a sample window,
// as many rows as the clusters fit on the SMs at once). The threshold kernel
// gives such a row ONE block: 64 x 65536 float32, k = 2048 read its 16 MB on
// 64 SMs at ~26 GB/s each, then selected and ranked while the HBM idled
// (v15-v16 of benchmarks/results/NOTES.md: 22 us on an H100, 2x its floor is
// 12), and the cluster kernel's radix select paid a cluster barrier per
// digit. Here a cluster of C blocks holds the row in shared memory, at most
// kClusterSampledChunkBytes a block, copied asynchronously (cp.async) while
// every block takes the SAME sample of the whole row (the threshold
// kernel's: kClusterSampleSlots elements in chunks, its loads issued before
// the copies) and selects the same T from it (threshold_sample's window).
// Each block then compacts its chunk's elements >= T from shared memory, the
// blocks exchange counts and candidates over DSMEM (two cluster barriers) and
// each ranks a 1/C share of them. A row whose count misses [k,
// kClusterSampleSlots] (a sample unlike its row) takes the kernel's radix
// select over the chunks it already holds.
// Clusters of more than two blocks must each find their SMs within one GPC:
// up to kClusterSampledWideSmShare of the SMs. C: enough blocks for the
// chunks, at least two, and more while the clusters fit. Measured on an H100
// (benchmarks/results/NOTES.md, thirtieth session; CUDA graph us, against the
// kernel each shape took before):
// - many rows, clusters of two: 48..66 rows of 65536 float32, k = 2048
//   17.5..18.6 against 21.1..22.2 (threshold kernel), k = 256 15.1..16.5
//   against 16.6..18.3; rows of 32768, k = 512, within 0.3 us either way;
// - more blocks where they fit: 17 x 65536 k2048 on clusters of five 14.5
//   (two: 16.8, threshold kernel 21.1), 32 rows on clusters of three 16.3
//   (two: 16.9);
// - few rows (up to 16, the radix select's clusters before): 1..16 x 65536
//   k2048 13.9..14.8 against 19.3..24.4, 1..16 x 131072 k64 13.1..15.0
//   against 20.5..27.3, 1..16 x 32768 k512 12.9..13.5 against 15.8..19.4;
// - clusters of four on all 132 SMs (33 x 131072, k = 1024 and 64) took
//   30.5 / 28.5 against 27.3 / 27.1: not every cluster was resident at once,
//   hence the share.
inline constexpr int64_t kClusterSampledChunkBytes = int64_t(128) << 10;
inline constexpr int64_t kClusterSampleSlots = 4096;  // the cluster kernel's 512 threads x 8
inline constexpr double kClusterSampledWideSmShare = 0.75;
// The SMs that rows x blocks may take: all of them for clusters of two,
// kClusterSampledWideSmShare of them for larger clusters.
constexpr bool cluster_sampled_fits(int64_t rows, int blocks, int sm_count) {
  const double sms = blocks > 2 ? kClusterSampledWideSmShare * sm_count : double(sm_count);
  return blocks <= kClusterMaxBlocks && double(rows * blocks) <= sms;
}
// Blocks per row: enough for the chunks (at least two), and more while the
// clusters still fit (a row's steps after the copies shrink with its chunk).
constexpr int cluster_sampled_blocks(int64_t rows, int64_t n, int elem_bytes, int sm_count) {
  const int64_t least = (n * elem_bytes + kClusterSampledChunkBytes - 1) / kClusterSampledChunkBytes;
  int b = least < 2 ? 2 : int(least);
  while (b < kClusterMaxBlocks && cluster_sampled_fits(rows, b + 1, sm_count)) ++b;
  return b;
}
// A row's cluster in kClusterRows: its blocks, and whether it takes the
// sampled threshold. Sampled: rows whose length has a sample window (keys
// of at most 32 bits, k <= kClusterMaxK) and whose clusters fit, on
// cluster_sampled_blocks. Otherwise enough blocks to hold the row, about one
// per kClusterMinChunk elements up to kClusterMaxBlocks, or for rows the bins
// may take (n <= kClusterBinsMaxLen), as few as the bins' blocks allow.
struct ClusterRowPlan {
  int blocks;
  bool sampled;
};
constexpr ClusterRowPlan cluster_row_plan(int64_t rows, int64_t n, int64_t k, int elem_bytes, int sm_count) {
  if (elem_bytes <= 4 && k <= kClusterMaxK && threshold_sample(n, k, kClusterSampleSlots).rank > 0) {
    const int blocks = cluster_sampled_blocks(rows, n, elem_bytes, sm_count);
    if (cluster_sampled_fits(rows, blocks, sm_count)) return ClusterRowPlan{blocks, true};
  }
  const bool bins = n <= kClusterBinsMaxLen;
  const int64_t chunk = bins ? kClusterBinsMinChunk : kClusterMinChunk;
  int64_t b = (n + chunk - 1) / chunk;
  if (b > kClusterMaxBlocks) b = kClusterMaxBlocks;
  while (bins && b > 1 && rows * b > cluster_bins_max_blocks(sm_count)) --b;
  return ClusterRowPlan{b < 1 ? 1 : int(b), false};
}
constexpr bool cluster_sampled_dispatch(int64_t rows, int64_t n, int64_t k, int elem_bytes, int sm_count) {
  return cluster_row_plan(rows, n, k, elem_bytes, sm_count).sampled;
}
constexpr int cluster_blocks_per_row(int64_t rows, int64_t n, int64_t k, int elem_bytes, int sm_count) {
  return cluster_row_plan(rows, n, k, elem_bytes, sm_count).blocks;
}

// Register-rows kernel (kRegisterRows; keys of at most 32 bits): one block
// of kRegisterRowsThreads threads per row, each thread holding up to
// kRegisterRowsMaxPerThread consecutive elements in registers, so rows of up
// to kRegisterRowsMaxN elements are read once; one radix pass, then its
// candidates ranked by key buckets when they fit (else the exact radix
// select and a stable radix sort of the k selected;
// csrc/cuda/topk_register.cuh). For rows of at most 16384 it is the
// shortest chain of any kernel here, so it takes every such problem of at
// most kRegisterRowsMaxRowsPerSm rows per SM the warp kernels leave. H200,
// CUDA graph us (benchmarks/results/NOTES.md, forty-seventh session), against
// the best other kernel: the ragged batch (31 rows of 2000..8000) k = 512 5.9
// against 9.9 (cluster bins), k = 1024 6.5 against 11.5; 1 / 31 / 132 rows
// of 8192, k = 512: 5.8 / 6.0 / 7.1 against 8.3 / 11.1 / 13.2; 132 x 16384
// k64 9.0 against 10.2; 132 x 4096 k256 5.5 against 10.5. At two rows per SM
// the threshold kernel's two blocks per SM win some shapes (264 x 16384 k64:
// 16.7 against 14.6, 264 x 8192 k256: 12.1 against 10.3) and lose others.
// k = 2048 takes the bucket path too since the forty-eighth session (a
// 3072-candidate buffer; benchmarks/results/nvidia-h200-topk-regimes-
// register-capacity.txt): 1 / 132 x 8192 k2048 6.8 / 8.2 against 12.1 /
// 15.6 (cluster / threshold row per block), 1 / 132 x 16384 k2048 9.2 / 11.3
// against 11.4 / 16.0, the ragged rows k = 2048 9.8 against the threshold
// kernel's 40.5 (its short rows fall back to a bitonic sort). Forty-ninth
// session (loads not gated on the length, the first pick by every warp): the
// ragged batch k = 512 / 1024 5.7 / 6.4 -> 5.4 / 6.1, 1 x 8192 k512 5.6 ->
// 5.2 (benchmarks/results/nvidia-h200-topk-register-session49.txt).
// Fiftieth (a row's loads issued before its length's, which the SASS had
// still waited for): 5.4 / 6.1 -> 5.2-5.3 / 6.0, 132 x 8192 k512 6.7 -> 6.2
// (nvidia-h200-topk-register-session50.txt). Fifty-first: a row's state
// cleared by one store a thread, ~145 instructions a warp fewer; timed in
// the fifty-second (H100): ragged k = 512 / 1024 / 2048 5.3 / 5.8 / 9.6 ->
// 5.0 / 5.5 / 9.3, through JAX 6.44 us, 8.6x padded lax.top_k
// (nvidia-h100-topk-register-session52.txt). Fifty-third: the threads' runs
// start on 16-byte boundaries in rows that do not (register_run): through
// JAX, benchmarks/ragged.py's 31 x 7825 6.44 -> 5.68 us (9.7x), aligned rows
// 5.63 -> 5.69 (nvidia-h100-topk-register-session53.txt).
inline constexpr int kRegisterRowsThreads = 1024;
inline constexpr int kRegisterRowsMaxPerThread = 16;
inline constexpr int64_t kRegisterRowsMaxN = int64_t(kRegisterRowsThreads) * kRegisterRowsMaxPerThread;
// Largest k: the k selected are sorted in shared memory by a block radix
// sort holding at most two packed values per thread (16 KB at 2048).
inline constexpr int64_t kRegisterRowsMaxK = 2048;
inline constexpr int64_t kRegisterRowsMaxRowsPerSm = 1;

// Elements per thread in kRegisterRows: the smallest of 4, 8, 16 that holds n.
constexpr int register_rows_per_thread(int64_t n) {
  int e = 4;
  while (e < kRegisterRowsMaxPerThread && n > int64_t(kRegisterRowsThreads) * e) e *= 2;
  return e;
}

constexpr bool register_rows_fit(int64_t n, int64_t k, int elem_bytes) {
  return elem_bytes <= 4 && k <= kRegisterRowsMaxK && n <= kRegisterRowsMaxN;
}

// Number of lanes (4, 8, 16 or 32) that cooperate on one row in the warp-sort
// kernel: about kTinyRowsElemsPerLane elements per lane for short rows.
constexpr int warp_sort_lanes_per_row(int64_t n) {
  int lanes = 4;
  while (lanes < 32 && n > lanes * kTinyRowsElemsPerLane) lanes *= 2;
  return lanes;
}

constexpr bool warp_sort_fits(int64_t n, int64_t k, int elem_bytes) {
  return elem_bytes <= 4 && k <= kWarpSortMaxK && n <= kWarpSortMaxN;
}

// has_clusters: the device launches thread-block clusters (sm_90 and newer).
constexpr TopkRegime choose_topk_regime(int64_t rows, int64_t n, int64_t k, int elem_bytes,
                                        int sm_count, bool has_clusters) {
  if (rows <= 0 || k <= 0) return TopkRegime::kEmpty;
  const bool warp_sort_fills = n <= kWarpSortAlwaysN || rows >= kWarpSortMinRowsPerSm * sm_count;
  if (warp_sort_fits(n, k, elem_bytes) && warp_sort_fills) {
    return warp_sort_lanes_per_row(n) < 32 ? TopkRegime::kTinyRows : TopkRegime::kSmallK;
  }
  if (register_rows_fit(n, k, elem_bytes) && rows <= kRegisterRowsMaxRowsPerSm * sm_count) {
    return TopkRegime::kRegisterRows;
  }
  const bool threshold_fits = elem_bytes <= 4 && k <= kThresholdMaxK;
  if (rows >= kRadixRowsPerSmForRowPerBlock * sm_count || n < kRadixSplitMinN) {
    return threshold_fits ? TopkRegime::kThresholdRowPerBlock : TopkRegime::kRadixRowPerBlock;
  }
  // Fewer rows than SMs, rows of at least kRadixSplitMinN.
  if (cluster_rows_fit(n, k, elem_bytes, has_clusters) &&
      ((rows <= kClusterMaxRows && n >= kClusterMinN) || cluster_sampled_dispatch(rows, n, k, elem_bytes, sm_count))) {
    return TopkRegime::kClusterRows;
  }
  if (threshold_fits && n * elem_bytes <= kThresholdFewRowsMaxRowBytes) {
    const bool stream = k <= kThresholdStreamMaxK && rows * n * elem_bytes >= kThresholdStreamMinBytes;
    return stream ? TopkRegime::kThresholdStream : TopkRegime::kThresholdRowPerBlock;
  }
  return TopkRegime::kRadixSplitRow;
}

// Whether `regime` handles the problem (the benchmarks and tests force
// regimes; every problem has kRadixRowPerBlock and kRadixSplitRow).
constexpr bool topk_regime_holds(TopkRegime regime, int64_t n, int64_t k, int elem_bytes,
                                 bool has_clusters) {
  switch (regime) {
    case TopkRegime::kEmpty: return false;
    case TopkRegime::kTinyRows:
    case TopkRegime::kSmallK: return warp_sort_fits(n, k, elem_bytes);
    case TopkRegime::kRadixRowPerBlock:
    case TopkRegime::kRadixSplitRow: return true;
    case TopkRegime::kThresholdRowPerBlock:
    case TopkRegime::kThresholdStream: return elem_bytes <= 4 && k <= kThresholdMaxK;
    case TopkRegime::kClusterRows: return cluster_rows_fit(n, k, elem_bytes, has_clusters);
    case TopkRegime::kRegisterRows: return register_rows_fit(n, k, elem_bytes);
  }
  return false;
}

// Threads of a kThresholdRowPerBlock block for `rows` rows and k.
constexpr int threshold_block_threads(int64_t rows, int64_t k, int sm_count) {
  const bool narrow = k <= kThresholdNarrowMaxK && rows >= kThresholdNarrowMinRowsPerSm * sm_count;
  return narrow ? kThresholdNarrowThreads : kThresholdWideThreads;
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
