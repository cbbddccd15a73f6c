// Register-rows top-k (regime kRegisterRows): one block of
// kRegisterRowsThreads threads per row, keys of at most 32 bits, n <=
// kRegisterRowsMaxN, k <= kRegisterRowsMaxK. It is for few short rows (the
// ragged batch, the indexer's scores), where a one-block-per-row kernel's
// time is the latency of its phases, not bandwidth; so it has as few phases
// as the problem allows:
//
// 1. Thread t loads E consecutive elements of the row (16-byte loads, issued
//    first: before the row length's load and the row-start barrier) and
//    keeps them as ordered keys in registers: the row is read once and never
//    stored (the threshold kernel reads it twice). The runs start on 16-byte
//    boundaries even where the row does not (register_run): a row of n not
//    a multiple of 16 bytes still loads as vectors.
//    The row's smallest and largest keys, and the first pass's histogram
//    (the keys' top digit), come with the load's barrier.
// 2. Exact radix select of the k-th largest KEY, 11-bit digits from the top:
//    a shared-memory histogram of the keys matching the prefix so far, then
//    the whole block finds the bin of the k_left-th largest (two bins per
//    thread, one block scan; the first pass's, where k is at most a quarter
//    of the row and the bin lies within 64 of the largest key's, by every
//    warp on its own, with no barrier). A pass whose bin is taken whole ends
//    the select (random float32 rows: after 2 passes). After the first pass
//    the bits where the smallest and largest keys agree are skipped: a row
//    whose keys share their top digit (scores of one magnitude share their
//    exponent) spends the first pass, which costs no barrier of its own.
// 3. Exactly min(k, len) packed (key, ~index) values go to shared memory in
//    index order, placed by one block scan of per-thread counts (outright
//    picks and ties packed in one word): those above the k-th key, then the
//    first ties at it. Thread order is index order (each thread's elements
//    are consecutive).
// 4. block_radix_sort.cuh orders them by key, stably (ties keep index
//    order), over the key bits that differ between the k-th key and the
//    largest, and writes each to its output slot.
// Where the first pass's candidates (the keys at or above its bin) fit in
// shared memory (kRegisterBucketCapacity), steps 2-4 give way to
// rank_candidates_by_buckets after that pass: ~5 us a row instead of ~12
// (benchmarks/results/NOTES.md, forty-seventh session).
// Deterministic: the selected set and its order follow from the values
// alone, never from the order of atomics.
//
// Per-row lengths: elements at or past len are never counted; a row with
// len <= k selects all of them; slots [len, k) get the pad value and index -1.
#pragma once

#include "cuda/block_radix_sort.cuh"
#include "cuda/dependent_launch.cuh"
#include "cuda/primitives.cuh"
#include "jax_topk/topk_dispatch.h"

namespace jax_topk::cuda {

inline constexpr int kRegisterThreads = kRegisterRowsThreads;
inline constexpr int kRegisterDigitBits = 11;
inline constexpr int kRegisterBins = 1 << kRegisterDigitBits;
static_assert(kRegisterBins == 2 * kRegisterThreads, "the digit pick scans two bins per thread");
static_assert(kRegisterThreads == kWarpSize * kWarpSize, "one warp scans the warps' totals");
// The sort's capacity: k <= this, at most two values per thread.
inline constexpr int kRegisterSortCapacity = int(kRegisterRowsMaxK);
static_assert(kRegisterSortCapacity <= 2 * kRegisterThreads, "at most two sorted values per thread");

// Phases of the kernel, as PhaseTimer slots (-DJAX_TOPK_PHASE_TIMING).
enum RegisterPhase : int {
  kRegisterPhaseLoad = 0,     // the row into registers, its smallest and largest keys
  kRegisterPhaseSelect = 1,   // the radix passes
  kRegisterPhaseCompact = 2,  // the k selected into shared memory
  kRegisterPhaseSort = 3,     // the sort and the writes (the buckets' ranks and writes)
  // The bucket ranking's steps before its ranks (rank_candidates_by_buckets):
  kRegisterPhaseBucketCount = 4,    // the candidates' count per bucket and its barrier
  kRegisterPhaseBucketStarts = 5,   // the scan from the top bucket down, the starts and their barrier
  kRegisterPhaseBucketScatter = 6,  // each candidate to its bucket's span, and the barrier
};
static_assert(kRegisterPhaseBucketScatter < kPhaseTimerSlots, "a PhaseTimer slot each");

// The bucket ranking's capacity: the first pass's candidates of a row at k =
// kRegisterRowsMaxK are k plus part of the pick's bin (random float32 rows of
// 8192: ~2300-2700), packed in 24 KB (the most the 48 KB of static shared
// memory holds beside the histograms). The sort path's k selected share it.
inline constexpr int kRegisterBucketCapacity = 3 * kRegisterBins / 2;
static_assert(kRegisterSortCapacity <= kRegisterBucketCapacity, "the sort's k selected fit the buffer");

struct RegisterRowsShared {
  union alignas(16) {  // 16: cleared by one 16-byte store a thread
    uint32_t hist[2][kRegisterBins];  // the select's histograms; the buckets' counts and starts
    BlockRadixSortShared<kRegisterThreads> sort;
  } u;
  uint64_t selected[kRegisterBucketCapacity];  // packed values: the candidates by bucket, or the k selected
  uint32_t warp_totals[kRegisterThreads / kWarpSize];
  DigitPick pick;
  uint32_t lo, hi;  // the row's smallest and largest keys
};

// Keys of elements [first, first + kE) of a row of n elements: 16-byte loads
// where the thread's run is whole and aligned, else element by element (0
// past n). Elements at and past the row's length are loaded too (the caller
// counts only its valid ones): gated on the length, they would wait for
// its load, one more memory round trip on a row's critical path (small
// while the lengths sit in L2, as in a benchmark's loop; a cold row's
// whole round trip otherwise). kConvert false: the elements' raw bits
// instead (the caller converts them later with codec.key, so that the loads
// are still in flight while it waits at a barrier).
template <typename U, int kE, bool kConvert = true>
__device__ JAX_TOPK_FORCE_INLINE void load_row_keys(const U* __restrict__ row, int n, int first, KeyCodec<U> codec,
                                                    uint32_t (&key)[kE]) {
  const auto to_key = [&](U bits) { return kConvert ? uint32_t(codec.key(bits)) : uint32_t(bits); };
  constexpr int kVec = int(16 / sizeof(U));
  if constexpr (kE % kVec == 0) {
    if (first + kE <= n && reinterpret_cast<uintptr_t>(row + first) % 16 == 0) {
      const uint4* src = reinterpret_cast<const uint4*>(row + first);
      Vec16<U> data[kE / kVec];
JAX_TOPK_UNROLL
      for (int v = 0; v < kE / kVec; ++v) data[v].raw = __ldg(src + v);
JAX_TOPK_UNROLL
      for (int v = 0; v < kE / kVec; ++v) {
JAX_TOPK_UNROLL
        for (int j = 0; j < kVec; ++j) key[v * kVec + j] = to_key(data[v].elems[j]);
      }
      return;
    }
  }
JAX_TOPK_UNROLL
  for (int e = 0; e < kE; ++e) key[e] = first + e < n ? to_key(__ldg(row + first + e)) : 0u;
}

// A thread's run of a row: elements [first, first + kE) are loaded, the
// first `held` of them are the thread's own (counted). Thread t > 0 runs
// from t * kE - lead, where lead (the elements by which the row starts past
// a 16-byte boundary) puts every such run on a boundary, so it loads as
// vectors; thread 0 runs from 0 and holds kE - lead (it loads element by
// element where lead > 0). Without this a row of 7825 float32 (31300 bytes:
// three rows in four start off a boundary) loads element by element in
// every thread: 6.5 us against 5.6 at 7828 through XLA (H100, session 53).
// lead is 0 where the shifted runs would not reach the row's end (n + lead
// > kRegisterThreads * kE) or runs are never whole vectors.
struct RegisterRun {
  int first;
  int held;
};
template <typename U, int kE>
__device__ JAX_TOPK_FORCE_INLINE RegisterRun register_run(const U* row, int64_t n) {
  constexpr int kVec = int(16 / sizeof(U));
  int lead = 0;
  if constexpr (kE % kVec == 0) {
    lead = int(reinterpret_cast<uintptr_t>(row) / sizeof(U)) & (kVec - 1);
    if (n + lead > int64_t(kRegisterThreads) * kE) lead = 0;
  }
  const int tid = int(threadIdx.x);
  return tid == 0 ? RegisterRun{0, kE - lead} : RegisterRun{tid * kE - lead, kE};
}

// Thread t's two bins of a kRegisterBins histogram walked from the top
// (2047 - 2t and 2046 - 2t) and the count in every bin above them: one block
// scan of the pairs. Every thread calls it after the barrier that completes
// the histogram; it has a barrier inside (warp_totals), none at its end.
struct BinsFromTop {
  int top;         // the upper bin; the lower one is top - 1
  uint32_t upper;  // their counts
  uint32_t lower;
  uint32_t above;  // the count in the bins above `top`
};
__device__ JAX_TOPK_FORCE_INLINE BinsFromTop block_scan_bins_from_top(const uint32_t* hist, uint32_t* warp_totals) {
  const int tid = int(threadIdx.x), lane = lane_id(), warp = tid / kWarpSize;
  const int top = kRegisterBins - 1 - 2 * tid;
  const uint32_t upper = hist[top], lower = hist[top - 1];
  const uint32_t mine = upper + lower;
  const uint32_t inclusive = warp_inclusive_sum(mine, lane);
  if (lane == kWarpSize - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  const uint32_t total = warp_totals[lane];
  const uint32_t warps_inclusive = warp_inclusive_sum(total, lane);
  return BinsFromTop{top, upper, lower, warp_shfl(warps_inclusive - total, warp) + inclusive - mine};
}

// The bin of hist[0:kRegisterBins) holding the k_left-th largest counted key
// (1 <= k_left <= the total), written to *pick: the thread whose pair of
// bins from the top holds it. Every thread calls it after the barrier that
// completes the histogram; it ends with a barrier (*pick visible).
__device__ JAX_TOPK_FORCE_INLINE void block_pick_digit(const uint32_t* hist, uint32_t k_left,
                                                       uint32_t* warp_totals, DigitPick* pick) {
  const BinsFromTop b = block_scan_bins_from_top(hist, warp_totals);
  if (b.above < k_left && k_left <= b.above + b.upper + b.lower) {
    *pick = b.above + b.upper >= k_left ? DigitPick{uint32_t(b.top), b.above, b.upper}
                                        : DigitPick{uint32_t(b.top - 1), b.above + b.upper, b.lower};
  }
  __syncthreads();
}

// The first pass's pick without a barrier: every warp finds the bin of
// hist[0:kRegisterBins) holding the k_left-th largest counted key (1 <=
// k_left <= the total) on its own, from bin `top` (the largest key's) down,
// 32 bins a step. A random row's k-th largest lies a few bins below its
// largest (one step); a pick farther down than kRegisterWarpPickSteps steps
// returns false (every warp the same), and the caller takes block_pick_digit.
// hist must not change until every warp has returned.
inline constexpr int kRegisterWarpPickSteps = 2;
inline constexpr uint32_t kRegisterWarpPickMaxShare = 4;  // tried when 4 * k_eff <= len
__device__ JAX_TOPK_FORCE_INLINE bool warp_pick_digit_from(const uint32_t* hist, int top, uint32_t k_left,
                                                           DigitPick& pick) {
  const int lane = lane_id();
  uint32_t above = 0;  // the count in the bins above this step's
JAX_TOPK_UNROLL
  for (int step = 0; step < kRegisterWarpPickSteps; ++step) {
    const int from = top - step * kWarpSize;
    const int bin = from - lane;
    const uint32_t count = bin >= 0 ? hist[bin] : 0u;
    const uint32_t inclusive = above + warp_inclusive_sum(count, lane);
    const uint32_t hit = warp_ballot(inclusive >= k_left);
    if (hit != 0) {
      const int l = __ffs(int(hit)) - 1;
      pick = DigitPick{uint32_t(from - l), warp_shfl(inclusive - count, l), warp_shfl(count, l)};
      return true;
    }
    above = warp_shfl(inclusive, kWarpSize - 1);
  }
  return false;
}

// Sorts ss.selected[0:count) by key (stably, key bits [0, key_bits)) and
// writes each value to its output slot.
template <int kItems, typename U>
__device__ JAX_TOPK_FORCE_INLINE void sort_and_write_selected(RegisterRowsShared& ss, int count, int key_bits,
                                                              KeyCodec<U> codec, U pad_bits, U* values_row,
                                                              int32_t* indices_row) {
  block_radix_sort_desc<kRegisterThreads, kItems>(ss.selected, count, key_bits, ss.u.sort, [&](uint64_t v, int slot) {
    write_packed_output(v, codec, pad_bits, values_row, indices_row, slot);
  });
}

// The first pass's candidates ordered by buckets (taken when they fit in
// ss.selected): every key >= floor (the count `total` is the first pick's
// above + count, at most kRegisterBucketCapacity) holds every element of the
// row's top k_eff, and every other element lies below all of them, so a
// candidate's rank among the candidates is its rank in the row. [floor, hi]
// is cut into kRegisterBins equal key buckets (bucket 0 at floor): a shared
// histogram, one block scan from the top bucket down (a bucket's start = the
// candidates in the buckets above it), each candidate to a slot of its
// bucket's span, and each candidate's rank = its bucket's start + the members
// of its bucket whose packed (key, ~index) is above its own (distinct, so
// the ranks are a permutation; ties go by index). Ranks below k_eff are
// written. No second radix pass and no sort: a random row's bucket holds
// about one candidate, so the count is a few compares; clustered keys only
// lengthen it (a bucket of m costs each member m compares). No barrier at
// the end.
template <typename U, int kE>
__device__ JAX_TOPK_FORCE_INLINE void rank_candidates_by_buckets(RegisterRowsShared& ss, const uint32_t (&key)[kE],
                                                                int valid, int first, uint32_t floor, uint32_t hi,
                                                                uint32_t total, uint32_t k_eff, KeyCodec<U> codec,
                                                                U pad_bits, U* values_row, int32_t* indices_row,
                                                                PhaseTimer& timer) {
  using P = uint64_t;
  using Pack = KeyIndexPacking<U, P>;
  const int tid = int(threadIdx.x);
  const uint32_t span = hi - floor;
  const int width = span == 0 ? 0 : 32 - __clz(int(span));
  const int bucket_shift = width > kRegisterDigitBits ? width - kRegisterDigitBits : 0;
  uint32_t* start = ss.u.hist[0];   // the pick's; free once every warp has passed the count's barrier
  uint32_t* cursor = ss.u.hist[1];  // zero since the row began
  const auto bucket_of = [&](uint32_t kv) { return (kv - floor) >> bucket_shift; };
JAX_TOPK_UNROLL
  for (int e = 0; e < kE; ++e) {
    if (e < valid && key[e] >= floor) atomicAdd(&cursor[bucket_of(key[e])], 1u);
  }
  __syncthreads();
  timer.mark(kRegisterPhaseBucketCount);
  // A bucket's start: the candidates in the buckets above it.
  const BinsFromTop b = block_scan_bins_from_top(cursor, ss.warp_totals);
  start[b.top] = cursor[b.top] = b.above;  // (only this thread touches its two buckets)
  start[b.top - 1] = cursor[b.top - 1] = b.above + b.upper;
  __syncthreads();
  timer.mark(kRegisterPhaseBucketStarts);
JAX_TOPK_UNROLL
  for (int e = 0; e < kE; ++e) {
    if (e < valid && key[e] >= floor) {
      ss.selected[atomicAdd(&cursor[bucket_of(key[e])], 1u)] = Pack::pack(U(key[e]), uint32_t(first + e));
    }
  }
  __syncthreads();  // each bucket's span is [start, cursor)
  timer.mark(kRegisterPhaseBucketScatter);
  for (uint32_t j = uint32_t(tid); j < total; j += kRegisterThreads) {
    const P p = ss.selected[j];
    const uint32_t b = bucket_of(uint32_t(Pack::key(p)));
    uint32_t rank = start[b];
    const uint32_t end = cursor[b];
    for (uint32_t i = start[b]; i < end; ++i) rank += ss.selected[i] > p ? 1u : 0u;
    if (rank < k_eff) write_packed_output(p, codec, pad_bits, values_row, indices_row, rank);
  }
}

// One block per row (grid-stride over rows); kE elements per thread, n <=
// kE * kRegisterThreads.
template <typename U, int kE>
__global__ void __launch_bounds__(kRegisterThreads, 1)
    register_topk_rows_kernel(const U* __restrict__ x, int64_t rows, int64_t n, int64_t k, KeyCodec<U> codec,
                              RowLengths<U> lengths, U* __restrict__ values, int32_t* __restrict__ indices) {
  wait_for_previous_grid();  // launched dependent (dependent_launch.cuh): the kernel before may still run
  static_assert(sizeof(U) <= 4, "keys of at most 32 bits (packed with the index in 64)");
  using P = uint64_t;
  using Pack = KeyIndexPacking<U, P>;
  constexpr int kKeyBits = int(sizeof(U) * 8);
  __shared__ RegisterRowsShared ss;
  const int tid = int(threadIdx.x), lane = lane_id();
  // A row's shared state, set before it begins. The select's first pass
  // counts into hist[0] before the load's barrier, so both histograms are
  // cleared (hist[1]: the second pass's, or the buckets' counts): one
  // 16-byte store a thread. (As a loop over the bins, ptxas kept the loop's
  // index arithmetic: ~145 instructions a warp, issued between the row
  // length's arrival and the row's first barrier; ncu, session 51.)
  static_assert(sizeof(ss.u.hist) == kRegisterThreads * sizeof(uint4), "one 16-byte store a thread");
  const auto clear_row_state = [&] {
    reinterpret_cast<uint4*>(&ss.u.hist[0][0])[tid] = make_uint4(0u, 0u, 0u, 0u);
    if (tid == 0) {
      ss.lo = ~0u;
      ss.hi = 0;
    }
  };
  PhaseTimer timer;
  // 1. The row, its smallest and largest keys, and the select's first pass:
  // the top digit of every key, counted before the load's barrier (where
  // the row's keys first differ is known only after it; a row whose keys
  // share the top digit spends this pass).
  constexpr int kTopWidth = kKeyBits < kRegisterDigitBits ? kKeyBits : kRegisterDigitBits;
  constexpr int kTopLow = kKeyBits - kTopWidth;
  // A row's loads are issued before anything else of it (its length's load
  // and the clearing of its state), so that they are in flight across its
  // first barrier: the first row's before the loop, whose preamble would
  // otherwise come first (the loop's test, the clearing's addresses: ncu,
  // session 50). The grid has at most one block per row, so blockIdx.x <
  // rows. 32-bit keys of at most 8 a thread are converted after the barrier;
  // narrower ones would have to be unpacked from their words first, which
  // waits for the loads (and at 16 a thread ptxas spills), so they convert
  // at the load.
  constexpr bool kKeysAfterBarrier = sizeof(U) == sizeof(uint32_t) && kE <= 8;
  uint32_t key[kE];
  RegisterRun run;
  const auto load_row = [&](int64_t row) {
    const U* row_x = x + row * n;
    run = register_run<U, kE>(row_x, n);
    load_row_keys<U, kE, !kKeysAfterBarrier>(row_x, int(n), run.first, codec, key);
  };
  load_row(blockIdx.x);

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    if (row != int64_t(blockIdx.x)) {
      load_row(row);
      __syncthreads();  // the row before (no barrier at its end) is done with ss
    }
    const int len = int(lengths.of_loaded(row, n));
    const uint32_t k_eff = uint32_t(min_of<int64_t>(k, len));
    clear_row_state();
    __syncthreads();
    if constexpr (kKeysAfterBarrier) {
JAX_TOPK_UNROLL
      for (int e = 0; e < kE; ++e) key[e] = uint32_t(codec.key(U(key[e])));
    }
    const int first = run.first;
    const int valid = max_of(0, min_of(run.held, len - first));
    uint32_t lo = ~0u, hi = 0;
JAX_TOPK_UNROLL
    for (int e = 0; e < kE; ++e) {
      if (e < valid) {
        lo = min_of(lo, key[e]);
        hi = max_of(hi, key[e]);
      }
    }
    if (k_eff < uint32_t(len)) {  // uniform
JAX_TOPK_UNROLL
      for (int e = 0; e < kE; ++e) {
        if (e < valid) atomicAdd(&ss.u.hist[0][key[e] >> kTopLow], 1u);
      }
    }
    lo = warp_reduce_min(lo);
    hi = warp_reduce_max(hi);
    if (lane == 0) {
      atomicMin(&ss.lo, lo);
      atomicMax(&ss.hi, hi);
    }
    __syncthreads();
    lo = ss.lo;
    hi = ss.hi;
    timer.mark(kRegisterPhaseLoad);

    // 2. The select. whole: the last chosen bin is taken whole, so the
    // selected are the keys whose bits from `shift` up are >= prefix's;
    // otherwise (all bits chosen) those above prefix and the first k_left
    // equal to it. A row of len <= k selects everything (shift 0, prefix 0).
    uint32_t prefix = 0, k_left = k_eff;
    int shift = 0;
    bool whole = true;
    uint32_t candidates = 0;  // > 0: the first pass's candidates fit, ranked by buckets
    if (k_eff < uint32_t(len) && lo == hi) {  // uniform: all equal, the first k_eff by index
      prefix = hi;
      whole = false;
    } else if (k_eff < uint32_t(len)) {  // uniform
      const int common = 32 - __clz(int(lo ^ hi));  // the bits at and above are common to every key
      shift = kKeyBits;  // the first pass (the top digit) was counted with the load
      for (int pass = 0;; ++pass) {
        const int width = shift < kRegisterDigitBits ? shift : kRegisterDigitBits;
        const int low = shift - width;
        const uint32_t digit_mask = (1u << width) - 1u;
        uint32_t* h = ss.u.hist[pass & 1];
        if (pass > 0) {  // uniform
JAX_TOPK_UNROLL
          for (int e = 0; e < kE; ++e) {
            if (e < valid && key_matches_prefix<U>(key[e], prefix, shift)) atomicAdd(&h[(key[e] >> low) & digit_mask], 1u);
          }
          // The other histogram was last read by the previous pass's pick,
          // which ended with a barrier.
          uint32_t* next = ss.u.hist[(pass + 1) & 1];
          next[tid] = 0;  // kRegisterBins = 2 * kRegisterThreads
          next[tid + kRegisterThreads] = 0;
          __syncthreads();
        }
        // Pass 0 counted every key, and the largest's bin is known: the
        // warps pick on their own when the k-th largest is likely near the
        // top, k_eff at most a quarter of the row (uniform). A failed walk
        // costs its steps (ragged k = 2048 rows of 2000..8000, walked
        // always: 9.8 -> 10.1 graph us), so deeper picks take the block's.
        DigitPick pick;
        const bool warp_picked = pass == 0 && kRegisterWarpPickMaxShare * k_eff <= uint32_t(len) &&
                                 warp_pick_digit_from(h, int(hi >> kTopLow), k_left, pick);
        if (!warp_picked) {
          block_pick_digit(h, k_left, ss.warp_totals, &ss.pick);
          // Read by everybody before the next pass's first barrier; rewritten
          // only after its second.
          pick = ss.pick;
        }
        prefix |= pick.digit << low;
        k_left -= pick.above;
        shift = low;
        whole = pick.count == k_left;
        if (pass == 0 && pick.above + pick.count <= uint32_t(kRegisterBucketCapacity)) {  // uniform
          candidates = pick.above + pick.count;
          break;
        }
        if (whole || shift == 0) break;  // uniform (the compaction's barrier comes before the sort reuses hist)
        if (warp_picked) __syncthreads();  // the warps' picks read hist[0], which the next pass clears
        if (shift > common) {  // bits [common, shift) are every key's: the next pass starts below them
          shift = common;
          prefix = (hi >> common) << common;
        }
      }
    }
    timer.mark(kRegisterPhaseSelect);
    U* values_row = values + row * k;
    int32_t* indices_row = indices + row * k;
    // Both orderings end here: slots [k_eff, k) get the pad.
    const auto pad_and_mark = [&] {
      for (int64_t j = int64_t(k_eff) + tid; j < k; j += kRegisterThreads) {
        write_packed_output(P(0), codec, lengths.pad_bits, values_row, indices_row, j);
      }
      timer.mark(kRegisterPhaseSort);
    };
    if (candidates > 0) {  // uniform: the first pass's keys >= prefix, ordered by buckets
      rank_candidates_by_buckets<U, kE>(ss, key, valid, first, prefix, hi, candidates, k_eff, codec,
                                        lengths.pad_bits, values_row, indices_row, timer);
      pad_and_mark();
      continue;
    }

    // 3. The k_eff selected into ss.selected in index order: those taken
    // outright at [0, k_eff - ties), the ties (key == prefix, !whole) after
    // them. Outright keys are above every tie, so a stable sort by key keeps
    // equal keys in index order.
    auto outright = [&](uint32_t kv) { return whole ? (kv >> shift) >= (prefix >> shift) : kv > prefix; };
    uint32_t mine_outright = 0, mine_tied = 0;
JAX_TOPK_UNROLL
    for (int e = 0; e < kE; ++e) {
      if (e < valid) {
        mine_outright += outright(key[e]) ? 1u : 0u;
        mine_tied += !whole && key[e] == prefix ? 1u : 0u;
      }
    }
    // One scan of both counts: outright ones total at most k_eff <= 2048,
    // so the low half never carries into the high one.
    static_assert(kRegisterRowsMaxK < (1 << 16) && kRegisterRowsMaxN < (1 << 16), "two 16-bit counts per word");
    const uint32_t before = block_exclusive_sum<kRegisterThreads>(mine_outright | (mine_tied << 16), ss.warp_totals);
    uint32_t slot = before & 0xffffu, ordinal = before >> 16;
    const uint32_t first_tie_slot = k_eff - (whole ? 0u : k_left);
JAX_TOPK_UNROLL
    for (int e = 0; e < kE; ++e) {
      if (e >= valid) continue;
      const P packed = Pack::pack(U(key[e]), uint32_t(first + e));
      if (outright(key[e])) {
        ss.selected[slot++] = packed;
      } else if (!whole && key[e] == prefix) {
        if (ordinal < k_left) ss.selected[first_tie_slot + ordinal] = packed;
        ++ordinal;
      }
    }
    // The selected keys lie in [floor, hi]: only the bits below the highest
    // where floor and hi differ order them.
    const uint32_t floor = k_eff == uint32_t(len) ? lo : whole ? (prefix >> shift) << shift : prefix;
    const int sort_bits = k_eff <= 1 || floor == hi ? 0 : 32 - __clz(int(floor ^ hi));
    __syncthreads();
    timer.mark(kRegisterPhaseCompact);

    // 4. Sort, write; pad slots [k_eff, k).
    if (k_eff <= uint32_t(kRegisterThreads)) {  // uniform
      sort_and_write_selected<1, U>(ss, int(k_eff), sort_bits, codec, lengths.pad_bits, values_row, indices_row);
    } else {
      sort_and_write_selected<2, U>(ss, int(k_eff), sort_bits, codec, lengths.pad_bits, values_row, indices_row);
    }
    pad_and_mark();
  }
}

}  // namespace jax_topk::cuda
