// Radix select top-k (regimes kRadixRowPerBlock and kRadixSplitRow): any n,
// any k, any key width. The correct-for-everything path.
//
// Every element is the packed integer e = (ordered_key << 32) | ~index (u64
// for keys up to 32 bits, u128 for 64-bit keys). Packed values are distinct,
// so there is exactly one threshold T with exactly k elements e >= T: the
// answer, with ties already broken by index. Radix select finds T from the
// top, kRadixDigitBits at a time: a histogram of the next digit field over
// the elements still tied with T's prefix, then the digit where the count
// from the top reaches k. Fields cover the key bits, then the index bits
// [0, ceil(log2 n)) (the bits of ~index above those are all ones in a row);
// the index fields are only reached when keys tie at the boundary.
//
// Scans are fused: the scan after choosing a digit emits the elements above
// it (certainly selected) into the survivor buffer and histograms the next
// field of the elements equal to it, optionally copying those into a
// candidate buffer when they fit, so later scans read the candidates instead
// of the row. When the chosen digit's bucket is exactly what is still needed,
// a last scan (gather) emits everything at or above it. Survivor order in the
// buffer depends on scheduling but the SET does not; the survivors are then
// sorted by their packed value (block bitonic sort, or CUB radix sort for
// large k), which is deterministic because values are distinct.
//
// kRadixRowPerBlock: one block per row (grid-stride over rows), all state in
// shared memory, the row re-read from L2 between scans. kRadixSplitRow: a row
// split over several blocks, one launch per digit field; block histograms are
// summed into a global histogram with atomics (order-free integer sums) and
// the last block to finish chooses the digit for everyone.
//
// Per-row lengths: a row of length len < n is selected as a row of len
// elements, taking min(k, len): the state's source_count holds len while the
// scans read the row (one place, not a register live through the loop), and
// index_bits still follow n (more index bits than needed is harmless). The
// survivor slots past those are set to 0, which sorts below every element and
// is written out as padding.
#pragma once

#include "cuda/dependent_launch.cuh"
#include "cuda/primitives.cuh"
#include "cuda/topk_bitonic.cuh"

namespace jax_topk::cuda {

inline constexpr int kRadixDigitBits = 11;
inline constexpr int kRadixBins = 1 << kRadixDigitBits;
inline constexpr int kRadixThreads = 512;
// 16-byte loads in flight per thread: about 16 elements per thread per step
// whatever the width (more unrolling of 16 u8 per load only bloats code).
template <typename U>
inline constexpr int kRadixUnroll = sizeof(U) >= 4 ? 4 : sizeof(U) == 2 ? 2 : 1;
inline constexpr int64_t kRadixBlockSortMaxK = 4096; // survivors sorted in shared memory up to this k
static_assert(kRadixBlockSortMaxK <= int64_t(kBlockSortPerThread) * kRadixThreads,
              "block_bitonic_sort_desc sorts at most 8 values per thread");
inline constexpr int64_t kRadixBlockCandidates = 2048;  // per candidate buffer, row-per-block kernel
inline constexpr int kRadixIndexBase = 32;           // packed bit where the key starts

template <typename U>
struct RadixPacked {
  using type = std::conditional_t<(sizeof(U) == 8), u128, uint64_t>;
};

// ---------------------------------------------------------------------------
// Digit fields [lo, hi) of the packed value, from the top.
struct RadixField {
  int hi, lo;
};

// The field below the one ending at `lo` (an empty field when none is left).
JAX_TOPK_HOST_DEVICE inline RadixField next_radix_field(int lo, int index_bits) {
  if (lo > kRadixIndexBase) {
    const int nlo = lo - kRadixDigitBits;
    return {lo, nlo > kRadixIndexBase ? nlo : kRadixIndexBase};
  }
  // Skip the constant ones of ~index in [index_bits, 32).
  const int top = lo == kRadixIndexBase ? index_bits : lo;
  const int nlo = top - kRadixDigitBits;
  return {top, nlo > 0 ? nlo : 0};
}

// Upper bound on the histogram scans before the threshold is exact.
JAX_TOPK_HOST_DEVICE inline int radix_field_count(int key_bits, int index_bits) {
  int count = 0;
  int lo = kRadixIndexBase + key_bits;
  for (;;) {
    const RadixField f = next_radix_field(lo, index_bits);
    if (f.hi == f.lo) return count;
    ++count;
    lo = f.lo;
  }
}

// Bits of ~index that vary in a row of n elements (at least 1).
JAX_TOPK_HOST_DEVICE inline int radix_index_bits(int64_t n) {
  const int b = bit_width(uint64_t(n > 1 ? n - 1 : 1));
  return b < 1 ? 1 : b;
}

template <typename P>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE uint32_t field_of(P e, int lo, int hi) {
  return hi == lo ? 0u : uint32_t(e >> lo) & ((1u << (hi - lo)) - 1u);
}

// True when e agrees with prefix on every bit at or above `hi`.
template <typename P>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE bool prefix_matches(P e, P prefix, int hi) {
  return hi >= int(sizeof(P) * 8) || (e >> hi) == (prefix >> hi);
}

// Where one row's selection stands. Elements "tied" with the threshold are
// those matching `prefix` above `hi` whose field [lo, hi) equals `digit`.
template <typename P>
struct RadixState {
  P prefix;               // the threshold's bits at and above hi (lower bits 0)
  int hi, lo;             // current field; lo == hi before the first scan
  uint32_t digit;         // the threshold's value in the current field
  uint32_t k_left;        // how many of the tied elements are still to be taken
  uint32_t tied;          // how many tied elements there are (k_left <= tied)
  int done;               // take every tied element: selection = {prefix, field >= digit}
  int source;             // what the next scan reads: -1 the row, 0/1 a candidate buffer
  uint32_t source_count;  // elements it reads: the row's length, or the buffer's count
  int compact_to;         // -1, or the candidate buffer the next scan copies tied elements to
};

template <typename P>
JAX_TOPK_HOST_DEVICE inline RadixState<P> radix_initial_state(int key_bits, int64_t n, int64_t k,
                                                             int64_t candidate_capacity) {
  RadixState<P> s;
  s.prefix = P(0);
  s.hi = s.lo = kRadixIndexBase + key_bits;
  s.digit = 0;
  s.k_left = uint32_t(k);
  s.tied = uint32_t(n);
  s.done = k == n;
  s.source = -1;
  s.source_count = uint32_t(n);  // the row's length: scans read it from here
  s.compact_to = (!s.done && n <= candidate_capacity) ? 0 : -1;
  return s;
}

struct RadixChoice {
  uint32_t digit;  // the bucket holding the k_left-th largest tied element
  uint32_t above;  // tied elements in buckets above it
  uint32_t count;  // tied elements in it
};

// The state after a scan that histogrammed field `next` of the tied elements.
template <typename P>
JAX_TOPK_HOST_DEVICE inline RadixState<P> radix_advance(const RadixState<P>& st, RadixField next,
                                                        RadixChoice c, int64_t candidate_capacity) {
  RadixState<P> ns = st;
  P prefix = st.prefix;
  if (st.lo < st.hi) prefix |= P(st.digit) << st.lo;
  if (next.hi < st.lo) {  // skipped constant ones of ~index (st.lo <= 32 here)
    prefix |= ((P(1) << st.lo) - P(1)) ^ ((P(1) << next.hi) - P(1));
  }
  ns.prefix = prefix;
  ns.hi = next.hi;
  ns.lo = next.lo;
  ns.digit = c.digit;
  ns.k_left = st.k_left - c.above;
  ns.tied = c.count;
  // A bucket of one element always satisfies this, and distinct packed values
  // reach buckets of one before the fields run out: the loop terminates.
  ns.done = ns.k_left == c.count || next.lo == 0;
  if (st.compact_to >= 0) {  // that scan copied its st.tied tied elements
    ns.source = st.compact_to;
    ns.source_count = st.tied;
  }
  ns.compact_to = (!ns.done && int64_t(c.count) <= candidate_capacity) ? (ns.source == 0 ? 1 : 0) : -1;
  return ns;
}

// Picks the digit whose bucket holds the k_left-th largest of the histogrammed
// elements: threads own contiguous bins from the top, a block scan gives each
// thread the count above its bins, the one thread whose bins cross k_left
// walks them. All threads call it; the result is in shared memory.
template <int kThreads>
__device__ RadixChoice choose_radix_digit(const uint32_t* hist, int bins, uint32_t k_left,
                                          uint32_t* scan_tmp, RadixChoice* result) {
  const int per = (bins + kThreads - 1) / kThreads;
  const int top = bins - int(threadIdx.x) * per;  // this thread's bins: [top - per, top)
  const int bottom = top - per;
  uint32_t mine = 0;
  for (int b = top - 1; b >= bottom && b >= 0; --b) mine += hist[b];
  const uint32_t above = block_exclusive_sum<kThreads>(mine, scan_tmp);
  if (above < k_left && k_left <= above + mine) {
    uint32_t acc = above;
    for (int b = top - 1; b >= bottom && b >= 0; --b) {
      if (acc + hist[b] >= k_left) {
        *result = RadixChoice{uint32_t(b), acc, hist[b]};
        break;
      }
      acc += hist[b];
    }
  }
  __syncthreads();
  const RadixChoice c = *result;
  __syncthreads();
  return c;
}

// Where a scan sends elements.
template <typename P>
struct RadixSinks {
  uint32_t* hist;         // shared histogram of the next field
  P* survivors;           // the selected elements (shared or global)
  uint32_t* survivor_count;
  uint32_t survivor_capacity;
  P* candidates;          // nullptr: no compaction in this scan
  uint32_t* candidate_count;
  uint32_t candidate_capacity;
};

// One element of a scan. Called the same number of times by every thread
// (warp collectives inside); invalid calls only join the collectives.
template <typename P>
__device__ JAX_TOPK_FORCE_INLINE void radix_visit(const RadixState<P>& st, RadixField next,
                                                  bool gather, const RadixSinks<P>& sinks, P e,
                                                  bool valid) {
  const bool in = valid && prefix_matches(e, st.prefix, st.hi);
  const uint32_t d = field_of(e, st.lo, st.hi);
  const bool take = in && (gather ? d >= st.digit : d > st.digit);
  const uint32_t slot = reserve_slot(sinks.survivor_count, take);
  if (take && slot < sinks.survivor_capacity) sinks.survivors[slot] = e;
  if (gather) return;  // uniform
  const bool tie = in && d == st.digit;
  if (tie) atomicAdd(&sinks.hist[field_of(e, next.lo, next.hi)], 1u);
  if (sinks.candidates != nullptr) {  // uniform
    const uint32_t c = reserve_slot(sinks.candidate_count, tie);
    if (tie && c < sinks.candidate_capacity) sinks.candidates[c] = e;
  }
}

// Scans x[begin, end) of a row (end - begin < 2^31).
template <typename U, typename P>
__device__ JAX_TOPK_FORCE_INLINE void radix_scan_row(const U* row, int64_t begin, int64_t end,
                                                     KeyCodec<U> codec, const RadixState<P>& st,
                                                     RadixField next, bool gather,
                                                     const RadixSinks<P>& sinks) {
  // Each element is visited in the scan of walk_row_steps; nothing is emitted.
  struct Scan {
    KeyCodec<U> codec;
    const RadixState<P>& st;
    RadixField next;
    bool gather;
    const RadixSinks<P>& sinks;
    uint32_t begin;
    __device__ JAX_TOPK_FORCE_INLINE void scan(U bits, int i, bool valid, int) {
      radix_visit(st, next, gather, sinks,
                  KeyIndexPacking<U, P>::pack(codec.key(bits), begin + uint32_t(i)), valid);
    }
    __device__ JAX_TOPK_FORCE_INLINE void between() {}
    __device__ JAX_TOPK_FORCE_INLINE uint32_t emit_mask() const { return 0; }
    __device__ JAX_TOPK_FORCE_INLINE void emit(U, int) {}
    __device__ JAX_TOPK_FORCE_INLINE void after_step() {}
  } scan{codec, st, next, gather, sinks, uint32_t(begin)};
  walk_row_steps<U, kRadixUnroll<U>>(row + begin, int(end - begin), int(threadIdx.x), int(blockDim.x),
                                     scan);
}

// Scans buf[begin, end) of a candidate buffer.
template <typename P>
__device__ JAX_TOPK_FORCE_INLINE void radix_scan_buffer(const P* buf, int64_t begin, int64_t end,
                                                        const RadixState<P>& st, RadixField next,
                                                        bool gather, const RadixSinks<P>& sinks) {
  for (int64_t i0 = begin; i0 < end; i0 += blockDim.x) {
    const int64_t i = i0 + threadIdx.x;
    const bool valid = i < end;
    radix_visit(st, next, gather, sinks, valid ? buf[i] : P(0), valid);
  }
}

// Sorts the k survivors in shared memory s (room for next_pow2(k); entries
// 0 are padding) and writes them out best first. All threads call it.
template <typename U, typename P>
__device__ void sort_and_write_survivors(P* s, int k, KeyCodec<U> codec, U pad_bits,
                                         U* values_row, int32_t* indices_row) {
  const int count = int(next_pow2(k));
  for (int i = k + int(threadIdx.x); i < count; i += int(blockDim.x)) s[i] = P(0);
  block_bitonic_sort_desc(s, count);
  // A few iterations at most (k <= 4096): unrolling them only adds registers.
#pragma unroll 1
  for (int j = int(threadIdx.x); j < k; j += int(blockDim.x)) {
    write_packed_output(s[j], codec, pad_bits, values_row, indices_row, j);
  }
}

// Survivor slots [taken, k) of a row shorter than k: 0, the padding value
// (below every element, so sorts put it last). All threads call it.
template <typename P>
__device__ JAX_TOPK_FORCE_INLINE void pad_survivors(P* survivors, int64_t taken, int64_t k) {
  for (int64_t i = taken + threadIdx.x; i < k; i += blockDim.x) survivors[i] = P(0);
}

// ---------------------------------------------------------------------------
// kRadixRowPerBlock. Block-shared state of one row's selection.
template <typename P>
struct RadixBlockShared {
  RadixState<P> state;
  uint32_t survivor_count;
  uint32_t candidate_count[2];
  uint32_t scan_tmp[kWarpSize];
  RadixChoice choice_slot;
};

// The whole radix selection of ONE row of length len by one block (all
// threads call it): the best min(k, len) elements, then padding up to k.
// hist has kRadixBins u32, candidates 2 * candidate_capacity P, and the
// survivors go to `survivors` (shared memory with room for next_pow2(k) when
// kSortInBlock, then sorted and written to values_row/indices_row; else a
// global [k] slice sorted device-wide afterwards). Starts and ends with a
// barrier, so the caller may reuse every buffer right after. Also the
// fallback of the threshold kernels (topk_threshold.cuh), whose blocks have
// kThreads threads.
template <typename U, bool kSortInBlock, int kThreads = kRadixThreads>
__device__ void radix_select_row_in_block(const U* in, int64_t len, int64_t k, int index_bits,
                                          int candidate_capacity, KeyCodec<U> codec, U pad_bits,
                                          uint32_t* hist, typename RadixPacked<U>::type* candidates,
                                          typename RadixPacked<U>::type* survivors,
                                          RadixBlockShared<typename RadixPacked<U>::type>& sh,
                                          U* values_row, int32_t* indices_row) {
  using P = typename RadixPacked<U>::type;
  constexpr int kKeyBits = int(sizeof(U) * 8);
  __syncthreads();
  if (threadIdx.x == 0) {
    sh.state = radix_initial_state<P>(kKeyBits, len, len < k ? len : k, candidate_capacity);
    sh.survivor_count = 0;
    sh.candidate_count[0] = sh.candidate_count[1] = 0;
  }
  __syncthreads();
  for (;;) {
    const RadixState<P> st = sh.state;
    const bool gather = st.done != 0;
    const RadixField next = next_radix_field(st.lo, index_bits);
    const int bins = 1 << (next.hi - next.lo);
    if (!gather) {
      for (int b = int(threadIdx.x); b < bins; b += int(blockDim.x)) hist[b] = 0;
    }
    __syncthreads();
    RadixSinks<P> sinks;
    sinks.hist = hist;
    sinks.survivors = survivors;
    sinks.survivor_count = &sh.survivor_count;
    sinks.survivor_capacity = uint32_t(k);
    sinks.candidates = (!gather && st.compact_to >= 0) ? candidates + st.compact_to * candidate_capacity : nullptr;
    sinks.candidate_count = &sh.candidate_count[st.compact_to >= 0 ? st.compact_to : 0];
    sinks.candidate_capacity = uint32_t(candidate_capacity);
    if (st.source < 0) {
      radix_scan_row(in, 0, int64_t(st.source_count), codec, st, next, gather, sinks);
    } else {
      radix_scan_buffer(candidates + st.source * candidate_capacity, 0, st.source_count, st,
                        next, gather, sinks);
    }
    __syncthreads();
    if (gather) break;
    const RadixChoice c = choose_radix_digit<kThreads>(hist, bins, st.k_left, sh.scan_tmp, &sh.choice_slot);
    if (threadIdx.x == 0) {
      const RadixState<P> ns = radix_advance(st, next, c, candidate_capacity);
      if (ns.compact_to >= 0) sh.candidate_count[ns.compact_to] = 0;
      sh.state = ns;
    }
    __syncthreads();
  }
  pad_survivors(survivors, sh.survivor_count, k);  // all taken: min(k, len)
  if constexpr (kSortInBlock) {
    sort_and_write_survivors(survivors, int(k), codec, pad_bits, values_row, indices_row);
  }
  __syncthreads();  // shared state is reused by the caller
}

// Dynamic shared memory: hist[kRadixBins] u32, two candidate buffers of
// candidate_capacity, then (kSortInBlock) room for next_pow2(k) survivors.
// Without kSortInBlock the survivors go to survivors_global[row * k ...] for
// a device-wide sort afterwards.
template <typename U, bool kSortInBlock>
__global__ void __launch_bounds__(kRadixThreads)
    radix_topk_row_per_block_kernel(const U* __restrict__ x, int64_t rows, int64_t n, int64_t k,
                                    int index_bits, int candidate_capacity, KeyCodec<U> codec,
                                    RowLengths<U> lengths, U* __restrict__ values,
                                    int32_t* __restrict__ indices,
                                    typename RadixPacked<U>::type* survivors_global) {
  wait_for_previous_grid();  // launched dependent (dependent_launch.cuh): the kernel before may still run
  using P = typename RadixPacked<U>::type;
  extern __shared__ uint4 radix_smem[];  // uint4: 16-byte alignment for u128
  uint32_t* hist = reinterpret_cast<uint32_t*>(radix_smem);
  P* candidates = reinterpret_cast<P*>(hist + kRadixBins);
  P* survivors_shared = candidates + 2 * candidate_capacity;
  __shared__ RadixBlockShared<P> sh;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    P* survivors = kSortInBlock ? survivors_shared : survivors_global + row * k;
    radix_select_row_in_block<U, kSortInBlock>(x + row * n, lengths.of_loaded(row, n), k, index_bits,
                                               candidate_capacity, codec, lengths.pad_bits, hist,
                                               candidates, survivors, sh, values + row * k,
                                               indices + row * k);
  }
}

// ---------------------------------------------------------------------------
// kRadixSplitRow: per-row state in global scratch.
template <typename P>
struct RadixSplitScratch {
  RadixState<P>* state;       // [rows]
  uint32_t* hist;             // [rows][kRadixBins], zero between passes
  uint32_t* arrivals;         // [rows], blocks done with the current pass
  uint32_t* survivor_count;   // [rows]
  uint32_t* candidate_count;  // [rows][2]
  P* survivors;               // [rows][k]
  P* candidates;              // [rows][2][candidate_capacity]
  int64_t candidate_capacity;
};

template <typename U>
__global__ void __launch_bounds__(256)
    radix_split_init_kernel(RadixSplitScratch<typename RadixPacked<U>::type> s, int64_t n,
                            int64_t k, RowLengths<U> lengths) {
  using P = typename RadixPacked<U>::type;
  wait_for_previous_grid();  // launched dependent (dependent_launch.cuh): the kernel before may still run
  let_next_grid_start();  // the first pass (launch_dependent) waits for this grid's writes
  const int64_t row = blockIdx.x;
  const int64_t len = lengths.of_loaded(row, n);
  const int64_t take = len < k ? len : k;
  for (int b = int(threadIdx.x); b < kRadixBins; b += int(blockDim.x)) s.hist[row * kRadixBins + b] = 0;
  pad_survivors(s.survivors + row * k, take, k);
  if (threadIdx.x == 0) {
    s.state[row] = radix_initial_state<P>(int(sizeof(U) * 8), len, take, s.candidate_capacity);
    s.arrivals[row] = 0;
    s.survivor_count[row] = 0;
    s.candidate_count[2 * row] = s.candidate_count[2 * row + 1] = 0;
  }
}

// One scan of every row: grid (blocks_per_row, rows). gather == false: a
// histogram pass (no-op once the row is done); gather == true: the final
// emission of everything at or above the threshold.
template <typename U>
__global__ void __launch_bounds__(kRadixThreads)
    radix_split_scan_kernel(const U* __restrict__ x, int64_t n, int64_t k, int index_bits,
                            KeyCodec<U> codec, RadixSplitScratch<typename RadixPacked<U>::type> s,
                            bool gather) {
  using P = typename RadixPacked<U>::type;
  __shared__ uint32_t hist[kRadixBins];
  __shared__ RadixState<P> state;
  __shared__ uint32_t scan_tmp[kWarpSize];
  __shared__ RadixChoice choice_slot;
  __shared__ bool last_block;

  const int64_t row = blockIdx.y;
  const int64_t part = blockIdx.x;
  const int64_t parts = gridDim.x;
  wait_for_previous_grid();  // the state and counts of the pass before
  let_next_grid_start();
  if (threadIdx.x == 0) state = s.state[row];
  __syncthreads();
  const RadixState<P> st = state;
  if (!gather && st.done) return;  // uniform
  const RadixField next = next_radix_field(st.lo, index_bits);
  const int bins = 1 << (next.hi - next.lo);
  if (!gather) {
    for (int b = int(threadIdx.x); b < bins; b += int(blockDim.x)) hist[b] = 0;
  }
  __syncthreads();

  RadixSinks<P> sinks;
  sinks.hist = hist;
  sinks.survivors = s.survivors + row * k;
  sinks.survivor_count = &s.survivor_count[row];
  sinks.survivor_capacity = uint32_t(k);
  sinks.candidates = (!gather && st.compact_to >= 0)
                         ? s.candidates + (2 * row + st.compact_to) * s.candidate_capacity
                         : nullptr;
  sinks.candidate_count = &s.candidate_count[2 * row + (st.compact_to >= 0 ? st.compact_to : 0)];
  sinks.candidate_capacity = uint32_t(s.candidate_capacity);
  const int64_t total = st.source_count;  // the row's length or the candidates
  const int64_t begin = total * part / parts;
  const int64_t end = total * (part + 1) / parts;
  if (st.source < 0) {
    radix_scan_row(x + row * n, begin, end, codec, st, next, gather, sinks);
  } else {
    radix_scan_buffer(s.candidates + (2 * row + st.source) * s.candidate_capacity, begin, end, st,
                      next, gather, sinks);
  }
  if (gather) return;  // uniform
  __syncthreads();

  uint32_t* row_hist = s.hist + row * kRadixBins;
  for (int b = int(threadIdx.x); b < bins; b += int(blockDim.x)) {
    if (hist[b] != 0) atomicAdd(&row_hist[b], hist[b]);
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(&s.arrivals[row], 1u) == uint32_t(parts - 1);
  __syncthreads();
  if (!last_block) return;  // uniform

  // Every block of the row has added its histogram: choose for all of them.
  __threadfence();
  for (int b = int(threadIdx.x); b < bins; b += int(blockDim.x)) hist[b] = atomicExch(&row_hist[b], 0u);
  __syncthreads();
  const RadixChoice c = choose_radix_digit<kRadixThreads>(hist, bins, st.k_left, scan_tmp, &choice_slot);
  if (threadIdx.x == 0) {
    const RadixState<P> ns = radix_advance(st, next, c, s.candidate_capacity);
    if (ns.compact_to >= 0) s.candidate_count[2 * row + ns.compact_to] = 0;
    s.state[row] = ns;
    s.arrivals[row] = 0;
  }
}

// Sorts each row's k survivors (k <= kRadixBlockSortMaxK) in shared memory
// and writes them out. One block per row; dynamic shared memory holds
// next_pow2(k) packed values.
template <typename U>
__global__ void __launch_bounds__(kRadixThreads)
    sort_survivors_kernel(const typename RadixPacked<U>::type* __restrict__ survivors, int64_t k,
                          KeyCodec<U> codec, U pad_bits, U* __restrict__ values,
                          int32_t* __restrict__ indices) {
  using P = typename RadixPacked<U>::type;
  extern __shared__ uint4 sort_smem[];
  P* s = reinterpret_cast<P*>(sort_smem);
  const int64_t row = blockIdx.x;
  wait_for_previous_grid();  // the gather's survivors
  for (int i = int(threadIdx.x); i < k; i += int(blockDim.x)) s[i] = survivors[row * k + i];
  sort_and_write_survivors(s, int(k), codec, pad_bits, values + row * k, indices + row * k);
}

// Writes sorted packed values out as (bits, index), 0 as padding.
template <typename U>
__global__ void write_sorted_kernel(const typename RadixPacked<U>::type* __restrict__ sorted,
                                    int64_t count, KeyCodec<U> codec, U pad_bits,
                                    U* __restrict__ values, int32_t* __restrict__ indices) {
  wait_for_previous_grid();  // launched dependent (dependent_launch.cuh): the kernel before may still run
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    write_packed_output(sorted[i], codec, pad_bits, values, indices, i);
  }
}

}  // namespace jax_topk::cuda
