// Threshold top-k, one block per row (regime kThresholdRowPerBlock): keys of
// at most 32 bits, k <= kThresholdMaxK, any n. Two reads of the row instead
// of the 4-6 scans of radix select, or one and a sample on long rows (a
// variant reading it once, regime kThresholdStream, is at the end of the
// file):
//
// Blocks of kThreads threads (threshold_block_threads in topk_dispatch.h:
// wide blocks for few rows or large k, narrow ones for many rows).
//
// 1. Group maxima. The row is split into G = kThreads * kR groups
//    (group = (thread, slot), slot = position in the thread's unrolled load
//    step mod kR); each thread keeps its kR group maxima of PACKED values
//    (key << 32 | ~index) in registers. The G maxima are distinct elements
//    (or 0 for an empty group), so T = the k-th largest maximum has at least
//    k elements >= T: the k best elements of the row are all >= T. Any
//    partition into groups gives this guarantee; empty groups (0) only lower T.
// 2. T: block radix select (8-bit digits over the 64-bit packed value) of the
//    G maxima in shared memory; typically 3-4 passes over G values.
// 3. Candidates: a second read of the row (from L2: rows in flight are capped)
//    keeps the packed elements >= T in shared memory (warp-aggregated slots,
//    scheduling-dependent ORDER, exact SET). Expected count for G groups:
//    c ~ G * -ln(1 - k/G): 1.15k at G = 4k, 1.39k at G = 2k; for all-equal
//    rows the packed maxima make c ~ k (ties broken by index).
// 4. Each candidate's rank among the c is its output slot (block_rank.cuh:
//    counting for c <= 256, bucketed counting above); the candidates are
//    put in rank order in shared memory and the first k written in order.
//    Deterministic: packed values are distinct, so the ranks are.
//    A bucket too full to rank (clustered values) falls back to a bitonic
//    sort of next_pow2(c), padded with 0, which is below every element.
// Sampled T (whole rows long enough: threshold_sample in topk_dispatch.h):
// steps 1-2 take G packed elements in 32-element chunks spread over the row
// instead of the whole row's group maxima, and T = a value with between
// rank and most of them at or above it. The row is then read once, its
// first walk group copied into shared memory (cp.async) while T is selected
// (RowWalkStage in primitives.cuh), the HBM idling otherwise, and on sm_90
// its later groups streamed through two shared-memory slots by bulk copies,
// each group's load under the walk of the one before (the walk's ring). Unlike the
// maxima's T, a sample's does not guarantee k candidates: the compaction's
// count is checked, and a row with fewer than k takes the fallback below.
// Fallback: c > G (capacity) -- only when many groups are empty or, with
// G < the number of elements, heavy ties beyond the groups' reach, or a
// sample unlike its row -- runs the radix select of topk_radix.cuh for that
// row, in the same block and the same shared memory. Always correct, slower.
//
// Per-row lengths: both reads walk the row's first len elements only. A row
// shorter than k has fewer than k non-empty groups, so T = 0 and all of its
// len elements are candidates; slots [len, k) are written as padding.
#pragma once

#include <algorithm>

#include "cuda/block_rank.cuh"
#include "cuda/primitives.cuh"
#include "cuda/topk_bitonic.cuh"
#include "cuda/topk_radix.cuh"
#include "jax_topk/topk_dispatch.h"

namespace jax_topk::cuda {

inline constexpr int kThresholdSelectBits = 8;
inline constexpr int kThresholdSelectBins = 1 << kThresholdSelectBits;
inline constexpr int kThresholdSelectPasses = 64 / kThresholdSelectBits;
// The select's histogram words: two tables, passes alternating between them
// (each pass zeroes the table of the next while it counts into its own), so
// that the rest of the kernel's histogram is free during the select (the
// threshold kernel stages row data there). One table per pass measured the
// same without staging (1024 x 8192, H100).
inline constexpr int kThresholdSelectWords = 2 * kThresholdSelectBins;
static_assert(kThresholdSelectWords <= kRadixBins, "the selection histograms live in the radix histogram");

// Groups per thread (G = threads * R), the smallest R in {1, 2, 8} with
// (a) G >= 4k (random rows: ~1.15k candidates) and (b) all-equal rows still
// fit: there a group's maximum is its first element, a thread's groups start
// within its first 16-byte vector (16/bytes elements), so the k-th smallest
// group start is ~ (16/bytes)/R * k and that many candidates must fit in G:
// (16/bytes) * k <= threads * R^2. Past both, 8 (wide blocks: G = 2k at
// kThresholdMaxK; narrow blocks are only dispatched while G >= 4k).
JAX_TOPK_HOST_DEVICE constexpr int threshold_slots(int64_t k, int elem_bytes, int threads) {
  const int64_t vec = 16 / elem_bytes;
  if (k <= threads / 4 && vec * k <= threads) return 1;
  if (k <= threads / 2 && vec * k <= 4 * threads) return 2;
  return 8;
}
static_assert(kThresholdNarrowMaxK * 4 <= kThresholdNarrowThreads * 8,
              "narrow blocks keep G >= 4k");

// Slots for `rows` rows of n on a device of sm_count SMs (whole_rows: no
// per-row lengths, so a sampled threshold may apply): threshold_slots, or 8
// where only 8 slots give a sample that stands for the row
// (threshold_sample): a sample and one read of the row instead of two. Wide
// blocks: always (32 rows of 131072, k = 64: 28.0 -> 27.2 us on an H100);
// narrow blocks from kThresholdSampledNarrowMinRowsPerSm rows per SM.
JAX_TOPK_HOST_DEVICE constexpr int threshold_row_slots(int64_t rows, int64_t n, int64_t k, int elem_bytes,
                                                       int threads, bool whole_rows, int sm_count) {
  const int slots = threshold_slots(k, elem_bytes, threads);
  if (!whole_rows || slots == 8) return slots;
  if (threads == kThresholdNarrowThreads && rows < kThresholdSampledNarrowMinRowsPerSm * sm_count) return slots;
  const bool sampled = threshold_sample(n, k, int64_t(threads) * slots).rank > 0;
  return !sampled && threshold_sample(n, k, int64_t(threads) * 8).rank > 0 ? 8 : slots;
}

// Walk groups a sampled row stages while its T is selected: one (a quarter
// of a row of 8192 float32 on narrow blocks: 1024 x 8192 k = 64 25.7 -> 24.8
// us on an H100). Two were slower on every shape (28.0 there): the sample's
// loads and the select waited behind the copies (benchmarks/results/NOTES.md
// v18). Bulk copies (cp.async.bulk) once the sample is in moved no shape past
// 2% either way: the read then waits for the queued copies (v19).
inline constexpr int kThresholdMaxStagedGroups = 1;

// Dynamic shared memory of threshold_topk_row_per_block_kernel for kR =
// slots: the histogram bins, G = threads * slots packed values (the rank's
// bucket spans), G more (the sample or maxima, then the candidates), and
// `overflow` bytes. A sampled row's first walk groups (RowWalkStage) go
// where the select leaves the shared memory untouched: the histogram past
// the select's words and the spans (threshold_stage_room_bytes), then the
// overflow; so do the walk ring's two slots, which the rank (spans, bins)
// only reuses after the walk. (The candidates first and the histogram after
// them spilled.)
JAX_TOPK_HOST_DEVICE constexpr size_t threshold_stage_room_bytes(int slots, int threads) {
  return size_t(kRadixBins - kThresholdSelectWords) * sizeof(uint32_t) +
         size_t(threads) * size_t(slots) * sizeof(uint64_t);
}
JAX_TOPK_HOST_DEVICE constexpr size_t threshold_smem_bytes(int slots, int threads, size_t overflow = 0) {
  static_assert(kRankBuckets <= kRadixBins, "the rank's buckets live in the histogram");
  return size_t(kRadixBins) * sizeof(uint32_t) + 2 * size_t(threads) * size_t(slots) * sizeof(uint64_t) + overflow;
}
// The overflow bytes for `groups` staged walk groups of `unroll` vectors a thread.
JAX_TOPK_HOST_DEVICE constexpr size_t threshold_stage_overflow_bytes(int slots, int threads, int unroll, int groups) {
  const size_t staged = size_t(groups) * size_t(threads) * size_t(unroll) * 16;
  const size_t room = threshold_stage_room_bytes(slots, threads);
  return staged > room ? staged - room : 0;
}

// 16-byte loads in flight per thread in each step of the two reads. One
// block per row streams at (bytes in flight) / latency: 4 loads of 16 bytes
// per thread were ~30 GB/s per block (128 x 131072: 19 us per read). With
// no more rows than SMs (one block per SM either way) 32-bit keys take 8,
// whose registers (up to 128) would halve the blocks per SM otherwise. The
// step's mask of candidates (CompactAtLeast) holds up to 32 positions.
template <typename U>
JAX_TOPK_HOST_DEVICE constexpr int threshold_unroll(bool one_block_per_sm) {
  return sizeof(U) >= 4 && one_block_per_sm ? 2 * kRadixUnroll<U> : kRadixUnroll<U>;
}

// Phases of the kernel, as PhaseTimer slots (-DJAX_TOPK_PHASE_TIMING).
enum ThresholdPhase : int {
  kThresholdPhaseMaxima = 0,  // first read: group maxima
  kThresholdPhaseSelect = 1,  // T from the maxima
  kThresholdPhaseCompact = 2, // second read: candidates >= T
  kThresholdPhaseOrder = 3,   // write the k slots (and the sort, where ranking falls back)
  kThresholdPhaseFallback = 4,
  kThresholdPhaseRank = 5,    // candidates put in order by rank
};

// The select's digit schedule (host-callable: the host simulation mirrors
// it). lo < hi: the lowest and highest value. Returns hs, the lowest bit of
// the bits common to every value (64 if none are).
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE int threshold_select_top(uint64_t lo, uint64_t hi) {
  return bit_width_u64(lo ^ hi);
}
// The digit below common bit hs: bits [shift, hs), 8 wide until the bottom.
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE int threshold_select_shift(int hs) {
  return hs > kThresholdSelectBits ? hs - kThresholdSelectBits : 0;
}

struct ThresholdShared {
  unsigned long long lo, hi, t_min;
  DigitPick pick;
  uint32_t candidates;
  uint32_t kept;  // block_keep_k_largest's slots
  unsigned long long candidates_hi;  // the largest candidate (CompactAtLeast::publish_largest)
  // Before a row's compaction (one thread, then a barrier).
  __device__ JAX_TOPK_FORCE_INLINE void reset_candidates() {
    candidates = 0;
    candidates_hi = 0;
  }
  // After it: the candidates' bounds for the rank, [lower, the largest],
  // where lower is the T every candidate is at or above. T = 0 (a row
  // shorter than k: all its elements) is no bound worth having; the rank
  // then finds the smallest itself.
  __device__ JAX_TOPK_FORCE_INLINE RankRange candidates_range(uint64_t lower) const {
    return lower != 0 ? RankRange{lower, candidates_hi} : RankRange{};
  }
};

// Step of the first read: each thread's kR group maxima of packed values
// (group = pos mod kR; 0 for empty groups).
template <typename U, int kR>
struct GroupMaxima {
  using P = uint64_t;
  KeyCodec<U> codec;
  P m[kR];
  __device__ JAX_TOPK_FORCE_INLINE void scan(U bits, int i, bool valid, int pos) {
    const P e = valid ? KeyIndexPacking<U, P>::pack(codec.key(bits), uint32_t(i)) : P(0);
    m[pos % kR] = max_of(m[pos % kR], e);
  }
  __device__ JAX_TOPK_FORCE_INLINE void between() {}
  __device__ JAX_TOPK_FORCE_INLINE uint32_t emit_mask() const { return 0; }
  __device__ JAX_TOPK_FORCE_INLINE void emit(U, int) {}
  __device__ JAX_TOPK_FORCE_INLINE void after_step() {}
};

// Step of the second read: appends the packed elements >= t to out[] (slots
// from *counter; those past capacity are counted, not written). One shared
// atomic per warp and step (a warp scan of the per-thread counts) instead of
// reserve_slot's one per 32 elements (with dense candidates, k = 2048 of
// 65536, the read went from 25.5 to 21.9 us per row), and a store per
// candidate only (walk_row_steps walks the mask's set bits).
template <typename U>
struct CompactAtLeast {
  using P = uint64_t;
  static_assert(KeyIndexPacking<U, P>::kIndexBits == 32, "scan compares the halves");
  KeyCodec<U> codec;
  P t;
  uint32_t* counter;
  P* out;
  uint32_t capacity;
  uint32_t mask = 0;     // this step's candidates, by pos (scan)
  uint32_t pending = 0;  // ... handed to emit by between()
  uint32_t slot = 0;
  uint32_t reserved_end = 0;  // *counter after this warp's reservation in the step (0: none)
  P largest = 0;              // of this thread's candidates
  __device__ JAX_TOPK_FORCE_INLINE P packed(U bits, int i) const {
    return KeyIndexPacking<U, P>::pack(codec.key(bits), uint32_t(i));
  }
  // packed(bits, i) >= t, on 32-bit halves (keys at bit 32 of the packing).
  __device__ JAX_TOPK_FORCE_INLINE void scan(U bits, int i, bool valid, int pos) {
    const uint32_t key = codec.key(bits), t_key = uint32_t(t >> 32);
    const bool take = key > t_key || (key == t_key && ~uint32_t(i) >= uint32_t(t));
    if (valid && take) mask |= 1u << pos;
  }
  __device__ JAX_TOPK_FORCE_INLINE uint32_t emit_mask() const { return pending; }
  __device__ JAX_TOPK_FORCE_INLINE void between() {
    pending = mask;
    mask = 0;
    reserved_end = 0;
    if (!warp_any(pending != 0)) return;  // uniform: sparse candidates
    const uint32_t count = uint32_t(__popc(pending));
    const int lane = lane_id();
    const uint32_t inclusive = warp_inclusive_sum(count, lane);
    uint32_t base = 0;
    if (lane == kWarpSize - 1) {
      base = atomicAdd(counter, inclusive);
      reserved_end = base + inclusive;
    }
    slot = warp_shfl(base, kWarpSize - 1) + inclusive - count;
  }
  __device__ JAX_TOPK_FORCE_INLINE void emit(U bits, int i) {
    const P p = packed(bits, i);
    if (slot < capacity) out[slot] = p;
    largest = max_of(largest, p);
    ++slot;
  }
  __device__ JAX_TOPK_FORCE_INLINE void after_step() {}
  // After the walk, before the barrier that ends it: the block's largest
  // candidate into *hi (zeroed before the walk), so that the rank needs no
  // pass of its own to find its range. Every lane of every warp calls it.
  __device__ JAX_TOPK_FORCE_INLINE void publish_largest(unsigned long long* hi) const {
    unsigned long long m = largest;
JAX_TOPK_UNROLL
    for (int d = kWarpSize / 2; d > 0; d /= 2) m = max_of(m, shfl_xor_wide(m, d));
    if (lane_id() == 0) atomicMax(hi, m);
  }
};

// CompactAtLeast with no branch per element: the packed value against T as
// one 64-bit compare (two chained ISETPs). The short-circuit form cost ~23
// instructions an element: in the cluster kernel's chunk walk 6 us a block of
// 32768 at one block of 16 warps per SM (3.8 branch-free); in the
// row-per-block kernel (H100, graph us, short-circuit -> the halves' bitwise
// form) 2048x65536 k2048 275.5 -> 269.7, 1024x8192 k256 25.5 -> 25.1; the
// one compare replaced the halves' three compares (measured together with
// the emit addresses and the walk's ring: benchmarks/results/NOTES.md v22, v23). The streamed kernel keeps the
// short-circuit form: with the halves' bitwise form it spilled in its walk
// (128x131072 k50 34.6 -> 39.2 us); the one compare there is unmeasured.
template <typename U>
struct CompactAtLeastBranchFree : CompactAtLeast<U> {
  __device__ JAX_TOPK_FORCE_INLINE void scan(U bits, int i, bool valid, int pos) {
    const bool take = this->packed(bits, i) >= this->t;
    this->mask |= uint32_t(valid & take) << pos;
  }
};

// The k-th largest of a[0:count) (1 <= k <= count; values may repeat, e.g.
// zeros) with the whole block: radix select on 8-bit digits from the highest
// bit where the values differ (the bits above it are common), stopping when
// the chosen bucket is exactly what is still needed; the answer is then the
// bucket's minimum. Starting below the common bits saves passes when the
// values share leading bits (candidates close to T) and spreads the first
// pass's shared-memory atomics; group maxima of floats that straddle a power
// of two share none (the select phase measured the same, 3-6 us per row).
// hist: kThresholdSelectWords u32. a[] must be written and visible (a
// barrier before the call); ends with a barrier.
// k_most > k asks for any value v with k <= #(a >= v) <= k_most instead (a
// sampled threshold's window): the select stops at the first bucket holding
// the k-th largest with at most k_most values at or above its floor, and
// returns that floor (its digits, zeros below): fewer passes, no minimum.
template <int kThreads>
__device__ uint64_t block_kth_largest(const uint64_t* a, int count, uint32_t k, uint32_t* hist,
                                      ThresholdShared& ts, uint32_t k_most = 0) {
  const int tid = int(threadIdx.x);
  for (int i = tid; i < kThresholdSelectWords; i += kThreads) hist[i] = 0;
  if (tid == 0) ts.t_min = ~0ull;
  uint64_t lo, hi;
  block_min_max<kThreads>(a, count, &ts.lo, &ts.hi, &lo, &hi);  // ends with a barrier
  if (lo == hi) return hi;  // uniform: every value equal
  int hs = threshold_select_top(lo, hi);  // bits at and above hs are fixed by prefix
  uint64_t prefix = hs == 64 ? 0 : (hi >> hs) << hs;
  uint32_t k_left = k;
  int shift = hs;
  for (int pass = 0;; ++pass) {
    shift = threshold_select_shift(hs);
    uint32_t* h = hist + (pass & 1) * kThresholdSelectBins;
    if (pass > 0) {  // the next pass's table: the last pass's pick read it before the barrier that ended it
      uint32_t* next = hist + ((pass + 1) & 1) * kThresholdSelectBins;
      for (int i = tid; i < kThresholdSelectBins; i += kThreads) next[i] = 0;
    }
    for (int i = tid; i < count; i += kThreads) {
      const uint64_t e = a[i];
      if (hs == 64 || (e >> hs) == (prefix >> hs)) {
        atomicAdd(&h[uint32_t(e >> shift) & (kThresholdSelectBins - 1)], 1u);
      }
    }
    __syncthreads();
    if (tid < kWarpSize) warp_pick_digit<kThresholdSelectBins>(h, k_left, &ts.pick);
    __syncthreads();
    // Everybody reads ts before the next pass's first barrier; the next write
    // to it comes after that barrier. (With shift == 0 and hs < 8 the digit
    // also holds common bits, already in prefix.)
    prefix |= uint64_t(ts.pick.digit) << shift;
    k_left -= ts.pick.above;
    hs = shift;
    // (k - k_left values lie above the bucket.) Nothing writes ts before
    // the next call's barriers, so returning here is safe.
    if (k_most > k && k - k_left + ts.pick.count <= k_most) return prefix;  // uniform
    if (ts.pick.count == k_left || shift == 0) break;  // uniform
  }
  // Every element of the chosen bucket is among the k largest: the k-th
  // largest is its minimum.
  unsigned long long m = ~0ull;
  for (int i = tid; i < count; i += kThreads) {
    const uint64_t e = a[i];
    if ((e >> shift) == (prefix >> shift) && e < m) m = e;
  }
JAX_TOPK_UNROLL
  for (int d = kWarpSize / 2; d > 0; d /= 2) m = min_of(m, shfl_xor_wide(m, d));
  if ((tid & (kWarpSize - 1)) == 0) atomicMin(&ts.t_min, m);
  __syncthreads();
  const uint64_t t = ts.t_min;
  __syncthreads();
  return t;
}

// Steps 1-2 of both threshold kernels: the G = kThreads * kR group maxima of
// in[0:len) (packed; 0 for empty groups) into a[0:G), and T = the k-th
// largest of them; zeroes ts.candidates. Ends with a barrier.
template <typename U, int kThreads, int kR, int kUnroll>
__device__ uint64_t threshold_from_group_maxima(const U* in, int len, int64_t k, KeyCodec<U> codec, uint64_t* a,
                                                uint32_t* hist, ThresholdShared& ts, PhaseTimer& timer) {
  const int tid = int(threadIdx.x);
  GroupMaxima<U, kR> maxima{codec, {}};
JAX_TOPK_UNROLL
  for (int r = 0; r < kR; ++r) maxima.m[r] = 0;
  walk_row_steps<U, kUnroll>(in, len, tid, kThreads, maxima);
JAX_TOPK_UNROLL
  for (int r = 0; r < kR; ++r) a[r * kThreads + tid] = maxima.m[r];
  if (tid == 0) ts.reset_candidates();
  __syncthreads();
  timer.mark(kThresholdPhaseMaxima);
  const uint64_t t = block_kth_largest<kThreads>(a, kThreads * kR, uint32_t(k), hist, ts);
  timer.mark(kThresholdPhaseSelect);
  return t;
}

// Steps 1-2 with a sample (threshold_sample in topk_dispatch.h), in two
// halves so that a caller may issue other loads between them (the cluster
// kernel's chunk copies): issue() loads the G = kThreads * kR elements of G /
// 32 chunks of 32 consecutive elements spread evenly over in[0:len) (chunk q
// * warps + w is warp w's q-th load, a lane per element; len >= G, the
// dispatch's ratio) into registers, keeping the chunks' step for select(),
// which puts them packed into a[0:G)
// and returns T, with between rank and most of them at or above it, and
// zeroes ts.candidates. select() ends with a barrier.
template <typename U, int kThreads, int kR>
struct ThresholdSampleLoads {
  static_assert(kThreads % kWarpSize == 0 && kThresholdSampleChunk == kWarpSize, "a warp loads a chunk");
  static constexpr int kWarps = kThreads / kWarpSize;
  U bits[kR];
  uint64_t step;  // threshold_sample_step of the row
  __device__ JAX_TOPK_FORCE_INLINE int index(int q) const {
    return int(threshold_sample_chunk_start(q * kWarps + int(threadIdx.x) / kWarpSize, step)) + lane_id();
  }
  __device__ JAX_TOPK_FORCE_INLINE void issue(const U* in, int len) {
    step = threshold_sample_step(kWarps * kR, len);
JAX_TOPK_UNROLL
    for (int q = 0; q < kR; ++q) bits[q] = __ldg(in + index(q));  // every load issued before the first is used
  }
  __device__ JAX_TOPK_FORCE_INLINE uint64_t select(uint32_t rank, uint32_t most, KeyCodec<U> codec, uint64_t* a,
                                                   uint32_t* hist, ThresholdShared& ts, PhaseTimer& timer,
                                                   int sample_phase, int select_phase) const {
    const int tid = int(threadIdx.x);
JAX_TOPK_UNROLL
    for (int q = 0; q < kR; ++q) {
      a[q * kThreads + tid] = KeyIndexPacking<U, uint64_t>::pack(codec.key(bits[q]), uint32_t(index(q)));
    }
    if (tid == 0) ts.reset_candidates();
    __syncthreads();
    timer.mark(sample_phase);
    const uint64_t t = block_kth_largest<kThreads>(a, kThreads * kR, rank, hist, ts, most);
    timer.mark(select_phase);
    return t;
  }
};

// Keeps the k largest of a[0:c) (c = *count > k, the values distinct and
// visible to every thread: the caller's barrier) in a[0:k), in no particular
// order, and sets *count = k; returns the k-th largest. tmp: k values.
// Starts and ends with a barrier.
template <int kThreads>
__device__ uint64_t block_keep_k_largest(uint64_t* a, uint32_t* count, uint32_t k, uint64_t* tmp,
                                         uint32_t* hist, ThresholdShared& ts) {
  const int tid = int(threadIdx.x);
  const int c = int(*count);
  if (tid == 0) ts.kept = 0;  // read after block_kth_largest's barriers
  const uint64_t t = block_kth_largest<kThreads>(a, c, k, hist, ts);
  for (int base = 0; base < c; base += kThreads) {  // uniform trips: reserve_slot's ballot
    const int i = base + tid;
    const uint64_t e = i < c ? a[i] : 0;
    const bool keep = i < c && e >= t;
    const uint32_t slot = reserve_slot(&ts.kept, keep);
    if (keep) tmp[slot] = e;
  }
  __syncthreads();
  for (int i = tid; i < int(k); i += kThreads) a[i] = tmp[i];
  if (tid == 0) *count = k;
  __syncthreads();
  return t;
}

// Step 4 of both threshold kernels: each candidate of a[0:c) (distinct
// packed values, all >= the row's k-th largest) goes to the output slot of
// its rank; c < k only in a row shorter than k, whose slots [c, k) are
// padding. The candidates are put in order in shared memory first and the k
// slots written in order (block_order_by_rank_desc). spans: c values for the
// rank's buckets; a[] holds at least next_pow2(max(c, k)) values for the
// sort fallback. range: bounds of the candidates where the caller knows them
// (block_rank_buckets); timer: marks kThresholdPhaseRank once they are in order.
// The ranking half of write_candidates_by_rank (any c: ranks past k are not
// written): false, having written nothing and left a[] as it was, where a
// bucket is too full to rank.
template <typename U, int kThreads>
__device__ bool try_write_candidates_by_rank(uint64_t* a, int c, int64_t k, uint64_t* spans, uint32_t* hist,
                                             BlockRankShared<kThreads>& rank_shared, KeyCodec<U> codec,
                                             U pad_bits, U* values_row, int32_t* indices_row,
                                             PhaseTimer* timer = nullptr, RankRange range = RankRange{}) {
  using P = uint64_t;
  const P* ordered = block_order_by_rank_desc<kThreads>(a, c, spans, hist, rank_shared, range, int(k));
  if (ordered == nullptr) return false;  // uniform
  if (timer != nullptr) timer->mark(kThresholdPhaseRank);
  for (int j = int(threadIdx.x); j < k; j += kThreads) {
    write_packed_output(j < c ? ordered[j] : P(0), codec, pad_bits, values_row, indices_row, j);
  }
  return true;
}

template <typename U, int kThreads>
__device__ void write_candidates_by_rank(uint64_t* a, int c, int64_t k, uint64_t* spans, uint32_t* hist,
                                         BlockRankShared<kThreads>& rank_shared, KeyCodec<U> codec,
                                         U pad_bits, U* values_row, int32_t* indices_row,
                                         PhaseTimer* timer = nullptr, RankRange range = RankRange{}) {
  using P = uint64_t;
  const int tid = int(threadIdx.x);
  if (try_write_candidates_by_rank<U, kThreads>(a, c, k, spans, hist, rank_shared, codec, pad_bits, values_row,
                                                indices_row, timer, range)) {
    return;
  }
  // A bucket too full to rank (values clustered far below a few outliers):
  // sort them all, write the first k.
  const int count = int(next_pow2(int64_t(c < k ? k : c)));
  for (int i = c + tid; i < count; i += kThreads) a[i] = 0;
  block_bitonic_sort_desc(a, count);
  for (int j = tid; j < k; j += kThreads) {
    write_packed_output(a[j], codec, pad_bits, values_row, indices_row, j);
  }
}

// Dynamic shared memory: threshold_smem_bytes(kR, kThreads, overflow) =
// hist[kRadixBins] u32, G = kThreads * kR u64 for the rank's bucket spans,
// G more (the maxima, then the candidates, then for the fallback:
// next_pow2(k) survivors + two candidate buffers), then the overflow of a
// sampled row's staged_groups walk groups (the rest from hist +
// kThresholdSelectWords on); with walk_ring, of two groups (the ring's two
// slots: RowWalkStage).
// Blocks per SM the registers must allow: doubled loads hold 128 registers
// a thread (one block); otherwise 64, so that 1024 threads fill the register
// file (two wide blocks, eight narrow ones).
template <typename U, int kThreads, int kUnroll>
inline constexpr int kThresholdMinBlocksPerSm = kUnroll > kRadixUnroll<U> ? 1 : 1024 / kThreads;

template <typename U, int kThreads, int kR, int kUnroll>
__global__ void __launch_bounds__(kThreads, (kThresholdMinBlocksPerSm<U, kThreads, kUnroll>))
    threshold_topk_row_per_block_kernel(const U* __restrict__ x, int64_t rows, int64_t n,
                                        int64_t k, int index_bits, ThresholdSample sample, int staged_groups,
                                        bool walk_ring, KeyCodec<U> codec, RowLengths<U> lengths,
                                        U* __restrict__ values, int32_t* __restrict__ indices) {
  wait_for_previous_grid();  // launched dependent (dependent_launch.cuh): the kernel before may still run
  static_assert(sizeof(U) <= 4, "packed values are u64");
  using P = uint64_t;
  constexpr int kG = kThreads * kR;
  static_assert(kG <= kBlockSortPerThread * kThreads, "the candidate sort's capacity");
  static_assert(kUnroll * int(16 / sizeof(U)) % kR == 0, "slots cover the step evenly");
  extern __shared__ uint4 threshold_smem[];
  uint32_t* hist = reinterpret_cast<uint32_t*>(threshold_smem);
  P* spans = reinterpret_cast<P*>(hist + kRadixBins);
  P* a = spans + kG;
  const RowWalkStageRoom room{reinterpret_cast<uint4*>(hist + kThresholdSelectWords),
                              int(threshold_stage_room_bytes(kR, kThreads) / sizeof(uint4)),
                              reinterpret_cast<uint4*>(a + kG)};
  __shared__ ThresholdShared ts;
  __shared__ RadixBlockShared<P> rs;
  __shared__ BlockRankShared<kThreads> rank_shared;
  __shared__ uint64_t ring_bars[kWalkRingSlots];  // RowWalkStage's bulk ring
  uint32_t ring_parity = 0;
  const int tid = int(threadIdx.x);
  PhaseTimer timer;
#if defined(JAX_TOPK_HAS_BULK_COPY)
  if (walk_ring && tid == 0) {  // visible to the other threads by the select's barriers
    for (int s = 0; s < kWalkRingSlots; ++s) mbarrier_init(&ring_bars[s], 1);
    mbarrier_init_fence();
  }
#endif

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const U* in = x + row * n;
    // 32 bits (n < 2^31): one register less through both walks (sm_100
    // spilled with a 64-bit length).
    const int len = int(lengths.of_loaded(row, n));
    // 1-2. T from a sample of the row (sample.rank > 0: whole rows only, the
    // host's choice; the row is then read once) or from its group maxima.
    // A sampled row's first groups are copied into shared memory while T is
    // selected (the HBM would idle); the select uses only its own words.
    const bool sampled = sample.rank > 0;
    RowWalkStage<U, kUnroll, kThresholdMaxStagedGroups> staged;
    P t;
    if (sampled) {
      ThresholdSampleLoads<U, kThreads, kR> loads;
      loads.issue(in, len);  // ahead of the copies in the memory queues
      staged.issue(in, len, tid, kThreads, room, staged_groups, walk_ring, ring_bars, ring_parity);
      t = loads.select(uint32_t(sample.rank), uint32_t(sample.most), codec, a, hist, ts, timer,
                       kThresholdPhaseMaxima, kThresholdPhaseSelect);
    } else {
      t = threshold_from_group_maxima<U, kThreads, kR, kUnroll>(in, len, k, codec, a, hist, ts, timer);
    }
    // 3. Candidates >= T: at least k of them from group maxima; from a
    // sample, if not, the row goes to the radix select below, as it does
    // with more than G. (A retry with group maxima, a loop around this walk,
    // cost ptxas 140 bytes of spills.)
    CompactAtLeastBranchFree<U> compact{{codec, t, &ts.candidates, a, uint32_t(kG)}};
    walk_row_steps<U, kUnroll>(in, len, tid, kThreads, compact, &staged);
    if (sampled) ring_parity = staged.parity;  // the ring's phases, for the block's next row
    compact.publish_largest(&ts.candidates_hi);
    __syncthreads();
    timer.mark(kThresholdPhaseCompact);
    const int c = int(ts.candidates);
    if (c <= kG && (!sampled || c >= k)) {  // uniform
      // 4. Each candidate's rank is its output slot; every candidate lies in
      // [T, the largest].
      write_candidates_by_rank<U, kThreads>(a, c, k, spans, hist, rank_shared, codec, lengths.pad_bits,
                                            values + row * k, indices + row * k, &timer, ts.candidates_range(t));
      timer.mark(kThresholdPhaseOrder);
    } else {
      // Too many candidates (or a sample's too few): radix select of the row in this block. Room:
      // next_pow2(k) <= kG survivors, the rest split into two candidate buffers.
      const int survivors = int(next_pow2(k));
      const int capacity = (kG - survivors) / 2;
      radix_select_row_in_block<U, true, kThreads>(in, len, k, index_bits, capacity, codec,
                                         lengths.pad_bits, hist, a + survivors, a, rs,
                                         values + row * k, indices + row * k);
      timer.mark(kThresholdPhaseFallback);
    }
    __syncthreads();  // shared memory is reused by the next row
  }
}

// ---------------------------------------------------------------------------
// Streamed threshold top-k (regime kThresholdStream): the row is read ONCE.
// The two-read kernel above reads a row twice, and where the rows in flight
// do not fit in L2 (128 x 131072 float32: 64 MB) both reads come from HBM.
// Here:
// 1. Group maxima of the row's first step only (the first kThreads * kUnroll
//    16-byte vectors, plus the scalar head): T = the k-th largest of those G
//    maxima. The first step's candidates (>= T) are at most k groups' worth.
// 2. The row streams through StreamCompact from its first element: each step
//    appends its elements >= T to the buffer, and T rises whenever the buffer
//    could overflow in the next step (more than G held: the block keeps the
//    buffer's k largest and T becomes the k-th of them). T only ever rises
//    to the k-th largest of a subset of the row, never above the row's k-th
//    largest, so every element of the top k is kept.
// 3. At the end the buffer holds at most G candidates (else one more keep);
//    they are ranked and written as in the two-read kernel.
// For a random row each later step adds about as many candidates as the
// first had (G * -ln(1 - k/G): ~53 at k = 50 and G = 512, ~1.15k at G = 4k),
// fewer once T has risen, so the buffer is kept once per G / that many steps:
// never for k = 50 on rows of 131072, about every other step for k = 1024
// (benchmarks/results/NOTES.md, v9). An ascending row keeps at every step.
// Shared memory: hist, the buffer of kStep + G values (a step adds at most
// kStep), the rank's spans of G values.
template <typename U, int kThreads, int kUnroll>
inline constexpr int kThresholdStreamStep = kThreads * kUnroll * int(16 / sizeof(U));

JAX_TOPK_HOST_DEVICE constexpr size_t threshold_stream_smem_bytes(int slots, int threads, int step) {
  return size_t(kRadixBins) * sizeof(uint32_t) +
         (size_t(step) + 2 * size_t(threads) * size_t(slots)) * sizeof(uint64_t);
}

// CompactAtLeast whose threshold rises: after every step, if the buffer
// holds more than `limit` candidates (the next step could overflow it), the
// block keeps its k largest and t becomes the k-th of them.
template <typename U, int kThreads>
struct StreamCompact : CompactAtLeast<U> {
  uint32_t limit;
  uint32_t k;
  uint64_t* tmp;
  uint32_t* hist;
  ThresholdShared* ts;
  __device__ JAX_TOPK_FORCE_INLINE void after_step() {
    // The warp whose reservation ended last saw the step's total.
    const bool over = this->reserved_end > limit;
    if (__syncthreads_or(over)) {  // uniform
      this->t = block_keep_k_largest<kThreads>(this->out, this->counter, k, tmp, hist, *ts);
    }
  }
};

// Blocks per SM for the registers: as the two-read kernel, but no more than
// the shared memory of an sm_90 SM (228 KB) holds (one wide block).
template <typename U, int kThreads, int kR, int kUnroll>
inline constexpr int kThresholdStreamMinBlocksPerSm = std::max(
    1, std::min(kThresholdMinBlocksPerSm<U, kThreads, kUnroll>,
                int((228 << 10) / threshold_stream_smem_bytes(kR, kThreads,
                                                              kThresholdStreamStep<U, kThreads, kUnroll>))));

template <typename U, int kThreads, int kR, int kUnroll>
__global__ void __launch_bounds__(kThreads, (kThresholdStreamMinBlocksPerSm<U, kThreads, kR, kUnroll>))
    threshold_stream_topk_kernel(const U* __restrict__ x, int64_t rows, int64_t n, int64_t k,
                                 KeyCodec<U> codec, RowLengths<U> lengths, U* __restrict__ values,
                                 int32_t* __restrict__ indices) {
  wait_for_previous_grid();  // launched dependent (dependent_launch.cuh): the kernel before may still run
  static_assert(sizeof(U) <= 4, "packed values are u64");
  using P = uint64_t;
  constexpr int kG = kThreads * kR;
  constexpr int kStep = kThresholdStreamStep<U, kThreads, kUnroll>;
  constexpr int kBuffer = kStep + kG;
  static_assert(kG <= kBlockSortPerThread * kThreads, "the candidate sort's capacity");
  static_assert(kUnroll * int(16 / sizeof(U)) % kR == 0, "slots cover the step evenly");
  extern __shared__ uint4 threshold_smem[];
  uint32_t* hist = reinterpret_cast<uint32_t*>(threshold_smem);
  P* a = reinterpret_cast<P*>(hist + kRadixBins);  // the buffer (first: the maxima)
  P* spans = a + kBuffer;
  __shared__ ThresholdShared ts;
  __shared__ BlockRankShared<kThreads> rank_shared;
  const int tid = int(threadIdx.x);
  PhaseTimer timer;

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const U* in = x + row * n;
    const int len = int(lengths.of_loaded(row, n));
    // The first step: the scalar head and one group of the walk.
    const int head = row_head_elems(in, len);
    const int first = len - head > kStep ? head + kStep : len;
    // 1. T from the first step's group maxima.
    const P t = threshold_from_group_maxima<U, kThreads, kR, kUnroll>(in, first, k, codec, a, hist, ts, timer);
    // 2. The row's candidates: the walk's first group is the first step
    // again (from L1/L2), the rest is read once.
    StreamCompact<U, kThreads> stream{{codec, t, &ts.candidates, a, uint32_t(kBuffer)},
                                      uint32_t(kG), uint32_t(k), spans, hist, &ts};
    walk_row_steps<U, kUnroll>(in, len, tid, kThreads, stream);
    stream.publish_largest(&ts.candidates_hi);
    __syncthreads();
    timer.mark(kThresholdPhaseCompact);
    // 3. At most G candidates, ranked. Every candidate is at or above the
    // last T (each keep drops those below it; later steps add none), and at
    // most the largest the walk saw.
    P last_t = stream.t;
    if (int(ts.candidates) > kG) {  // uniform
      last_t = block_keep_k_largest<kThreads>(a, &ts.candidates, uint32_t(k), spans, hist, ts);
    }
    write_candidates_by_rank<U, kThreads>(a, int(ts.candidates), k, spans, hist, rank_shared, codec,
                                          lengths.pad_bits, values + row * k, indices + row * k, &timer,
                                          ts.candidates_range(last_t));
    timer.mark(kThresholdPhaseOrder);
    __syncthreads();  // shared memory is reused by the next row
  }
}

}  // namespace jax_topk::cuda
