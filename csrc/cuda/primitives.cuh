// Small warp/block building blocks shared by the top-k kernels: key codecs,
// packed (key, index) integers, shuffles of wide integers, warp-aggregated
// slot reservation, a block scan and a vectorised row walk.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "jax_topk/dtypes.h"
#include "jax_topk/gpu_compat.h"
#include "jax_topk/keys.h"
#include "cuda/mma.cuh"  // cp.async (RowWalkStage; CUDA only)

// `#pragma unroll` for loops in host-callable code: host compilers warn on it.
// JAX_TOPK_UNROLL_BY(n): unroll by a constant expression (1 keeps the loop).
#define JAX_TOPK_PRAGMA(x) _Pragma(#x)
#if defined(JAX_TOPK_DEVICE_PASS)
#define JAX_TOPK_UNROLL _Pragma("unroll")
#define JAX_TOPK_UNROLL_BY(n) JAX_TOPK_PRAGMA(unroll n)
#else
#define JAX_TOPK_UNROLL
#define JAX_TOPK_UNROLL_BY(n)
#endif

namespace jax_topk::cuda {

// kWarpSize, kFullWarpMask and the warp collectives: jax_topk/gpu_compat.h.

using u128 = unsigned __int128;

// ---------------------------------------------------------------------------
// Key codec: ordered_key / bits_from_key as run-time masks.
//
// For every KeyKind, ordered_key(bits) is `bits ^ mask` where the mask only
// depends on the sign bit of `bits` (and bits_from_key(key) likewise on the
// top bit of `key`). Capturing the two masks on the host from keys.h lets one
// kernel instantiation per bit width serve every dtype of that width (int32,
// uint32 and float32 share code) while keys.h stays the single definition of
// the order. The self-test checks the codec against keys.h for every dtype.
template <typename U>
struct KeyCodec {
  U key_xor_if_sign;      // ordered_key(bits) = bits ^ this   when bits has its top bit set
  U key_xor_if_no_sign;   //                   = bits ^ this   otherwise
  U bits_xor_if_sign;     // bits_from_key(key) = key ^ this   when key has its top bit set
  U bits_xor_if_no_sign;  //                    = key ^ this   otherwise

  JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE U key(U bits) const {
    return bits ^ ((bits & kSignBit<U>) ? key_xor_if_sign : key_xor_if_no_sign);
  }
  JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE U bits(U key) const {
    return key ^ ((key & kSignBit<U>) ? bits_xor_if_sign : bits_xor_if_no_sign);
  }
};

template <KeyKind Kind, typename U>
KeyCodec<U> make_key_codec() {
  KeyCodec<U> c;
  c.key_xor_if_sign = U(ordered_key<Kind>(kSignBit<U>) ^ kSignBit<U>);
  c.key_xor_if_no_sign = ordered_key<Kind>(U(0));
  c.bits_xor_if_sign = U(bits_from_key<Kind>(kSignBit<U>) ^ kSignBit<U>);
  c.bits_xor_if_no_sign = bits_from_key<Kind>(U(0));
  return c;
}

// ---------------------------------------------------------------------------
// Packed (key, index): one unsigned integer P whose integer order is the
// whole contract -- larger key first, then LOWER index first -- because the
// low bits hold the complemented index. Distinct elements of a row give
// distinct packed values, so any correct selection or sort of them is
// deterministic. 0 is below every packed element (the complemented index is
// never 0: index < 2^31 with 32 index bits, index < 65535 with 16), which
// makes 0 the padding value.
template <typename U, typename P>
struct KeyIndexPacking {
  static_assert(std::is_unsigned_v<U>, "raw bits");
  static constexpr int kKeyBits = int(sizeof(U) * 8);
  static constexpr int kIndexBits = int(sizeof(P) * 8) - kKeyBits >= 32 ? 32 : 16;
  static_assert(kKeyBits + kIndexBits <= int(sizeof(P) * 8), "packed type too narrow");
  static constexpr uint32_t kIndexMask =
      kIndexBits == 32 ? 0xffffffffu : ((1u << kIndexBits) - 1u);

  JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE static P pack(U key, uint32_t index) {
    return (P(key) << kIndexBits) | P((~index) & kIndexMask);
  }
  JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE static U key(P p) { return U(p >> kIndexBits); }
  JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE static uint32_t index(P p) {
    return (~uint32_t(p)) & kIndexMask;
  }
};

// ---------------------------------------------------------------------------
// Per-row lengths (topk_cuda.h): row r takes part with its first length(r)
// elements only, and its output slots past min(k, length(r)) hold the dtype's
// lowest value and index -1. The user's values are clamped here, on the
// device: the host never sees them.
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE int64_t clamp_row_length(int32_t length, int64_t n) {
  const int64_t len = length;
  return len < 0 ? 0 : len > n ? n : len;
}

template <typename U>
struct RowLengths {
  const int32_t* lengths;  // device, one int32 per row, any value; nullptr: whole rows
  U pad_bits;              // DTypeTraits<D>::kLowestBits

  // The row's length; no memory access without lengths. For the warp
  // kernels: they gate their row loads on it, so a load here would sit on
  // the critical path of every (short-lived) thread.
  __device__ JAX_TOPK_FORCE_INLINE int64_t of(int64_t row, int64_t n) const {
    return lengths == nullptr ? n : clamp_row_length(__ldg(lengths + row), n);
  }
  // The same as one predicated load (without lengths it reads nothing and
  // clamps INT32_MAX to n). For the block kernels' row loops, where the
  // branch of `of` upsets ptxas's register allocation (sm_90: up to +27
  // registers, or spills).
  __device__ JAX_TOPK_FORCE_INLINE int64_t of_loaded(int64_t row, int64_t n) const {
    return clamp_row_length(load_readonly_or(lengths, row, 0x7fffffff), n);
  }
};

// The warp kernels' 16-byte layout (warp sort, warp select: top_k's and the
// route's): rows 16-byte aligned, and whole rows (a vector straddling a row's
// length would need a per-element test on the whole-row path; with lengths
// the scalar layout bounds every element).
template <typename U>
bool warp_rows_vectorised(const U* x, int64_t n, const RowLengths<U>& lengths) {
  return lengths.lengths == nullptr && (reinterpret_cast<uintptr_t>(x) % 16 == 0) &&
         ((n * int64_t(sizeof(U))) % 16 == 0);
}

// Writes output slot `at` from a packed (key, ~index) value. Packed 0 is below
// every element, so it is what a slot holds when the row had fewer than k
// elements (pad entries of sorts, empty lists): it writes the pad value and
// index -1. Every kernel's output goes through here.
template <typename U, typename P>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void write_packed_output(P p, KeyCodec<U> codec,
                                                                   U pad_bits, U* values,
                                                                   int32_t* indices, int64_t at) {
  using Pack = KeyIndexPacking<U, P>;
  const bool real = p != P(0);
  values[at] = real ? codec.bits(Pack::key(p)) : pad_bits;
  indices[at] = real ? int32_t(Pack::index(p)) : int32_t(-1);
}

// ---------------------------------------------------------------------------
// Shuffles of 32/64/128-bit unsigned integers (as 32-bit words).
template <typename T, typename WordShuffle>
__device__ JAX_TOPK_FORCE_INLINE T shuffle_words(T v, WordShuffle shuffle) {
  static_assert(sizeof(T) % 4 == 0, "whole words");
  constexpr int kWords = int(sizeof(T) / 4);
  uint32_t w[kWords];
  memcpy(w, &v, sizeof(T));
JAX_TOPK_UNROLL
  for (int i = 0; i < kWords; ++i) w[i] = shuffle(w[i]);
  memcpy(&v, w, sizeof(T));
  return v;
}

template <typename T>
__device__ JAX_TOPK_FORCE_INLINE T shfl_xor_wide(T v, int lane_mask) {
  return shuffle_words(v, [=](uint32_t w) { return warp_shfl_xor(w, lane_mask); });
}

// Lane src_lane's value, in every lane.
template <typename T>
__device__ JAX_TOPK_FORCE_INLINE T shfl_wide(T v, int src_lane) {
  return shuffle_words(v, [=](uint32_t w) { return warp_shfl(w, src_lane); });
}

template <typename T>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE T max_of(T a, T b) { return a < b ? b : a; }
template <typename T>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE T min_of(T a, T b) { return a < b ? a : b; }

// ---------------------------------------------------------------------------
// Phase timing, for kernel work only (build with -DJAX_TOPK_PHASE_TIMING; the
// self-test's --bench then prints where a block's time goes). Thread 0 adds
// the clock cycles since its previous mark to a per-phase counter; marks sit
// right after barriers, so they time the whole block. Compiled out otherwise.
// The same timer records when each block began and ended (the global timer,
// ns, comparable across SMs), on which SM, and when each phase was last
// marked, for the first kBlockTimelineBlocks blocks of a grid: where a
// launch's span goes beyond the blocks' own time (their starts, their spread
// of ends).
inline constexpr int kPhaseTimerSlots = 8;
inline constexpr int kBlockTimelineBlocks = 4096;
#if defined(JAX_TOPK_PHASE_TIMING)
static __device__ unsigned long long g_phase_cycles[kPhaseTimerSlots];  // one per translation unit
// Per block: begin and end (global timer ns), the SM, the clock at its
// start and the clock at the last mark of each phase (plain stores: a
// read-modify-write per mark held thread 0 up, +1.4 us a block on 1024x8192);
// the last launch's.
inline constexpr int kBlockTimelineWords = 4 + kPhaseTimerSlots;
static __device__ unsigned long long g_block_timeline[kBlockTimelineBlocks][kBlockTimelineWords];
struct PhaseTimer {
  long long last = 0;
  // clock64 and the global timer exist in the device pass only.
#if defined(JAX_TOPK_DEVICE_PASS)
  // 0 on HIP (the timeline is CUDA's; the phases are both).
  static __device__ JAX_TOPK_FORCE_INLINE unsigned long long global_ns() {
    unsigned long long t = 0;
#if !defined(JAX_TOPK_HIP)
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
#endif
    return t;
  }
  __device__ PhaseTimer() : last(clock64()) {
    if (threadIdx.x == 0 && blockIdx.x < kBlockTimelineBlocks) {
      g_block_timeline[blockIdx.x][0] = global_ns();
      g_block_timeline[blockIdx.x][3] = (unsigned long long)last;
      for (int i = 0; i < kPhaseTimerSlots; ++i) g_block_timeline[blockIdx.x][4 + i] = 0;
    }
  }
  // At the block's exit, whichever path it leaves by.
  __device__ ~PhaseTimer() {
    if (threadIdx.x == 0 && blockIdx.x < kBlockTimelineBlocks) {
      unsigned int sm = 0;
#if !defined(JAX_TOPK_HIP)
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
#endif
      g_block_timeline[blockIdx.x][1] = global_ns();
      g_block_timeline[blockIdx.x][2] = sm;
    }
  }
  __device__ JAX_TOPK_FORCE_INLINE void mark(int phase) {
    if (threadIdx.x == 0) {
      const long long now = clock64();
      atomicAdd(&g_phase_cycles[phase], (unsigned long long)(now - last));
      if (blockIdx.x < kBlockTimelineBlocks) g_block_timeline[blockIdx.x][4 + phase] = (unsigned long long)now;
      last = now;
    }
  }
#else
  __device__ void mark(int) {}
#endif
};
#else
struct PhaseTimer {
  __device__ JAX_TOPK_FORCE_INLINE void mark(int) {}
};
#endif

__device__ JAX_TOPK_FORCE_INLINE int lane_id() { return int(threadIdx.x) & (kWarpSize - 1); }

// Reserves `want ? 1 : 0` consecutive slots from `*counter` with one atomic per
// warp. Every lane of the warp must call it (converged); each wanting lane
// gets its own slot. The slots' ORDER depends on scheduling, so callers only
// use it to build sets (later sorted by the unique packed key). warp_end,
// when given, receives in every lane *counter just after this warp's
// reservation (left as it is when no lane wants a slot).
__device__ JAX_TOPK_FORCE_INLINE uint32_t reserve_slot(uint32_t* counter, bool want,
                                                        uint32_t* warp_end = nullptr) {
  const unsigned mask = warp_ballot(want);
  if (mask == 0) return 0;
  const int leader = __ffs(mask) - 1;
  const int lane = lane_id();
  uint32_t base = 0;
  if (lane == leader) base = atomicAdd(counter, uint32_t(__popc(mask)));
  base = warp_shfl(base, leader);
  if (warp_end != nullptr) *warp_end = base + uint32_t(__popc(mask));
  return base + uint32_t(__popc(mask & ((1u << lane) - 1u)));
}

// Inclusive prefix sum of v over the lanes of each segment of `width` lanes
// (a power of two <= kWarpSize); `lane` is the lane's index in its segment.
// Every lane of the warp must call it.
template <typename T>
__device__ JAX_TOPK_FORCE_INLINE T warp_inclusive_sum(T v, int lane, int width = kWarpSize) {
JAX_TOPK_UNROLL
  for (int d = 1; d < width; d *= 2) {
    const T other = warp_shfl_up(v, d, width);
    if (lane >= d) v += other;
  }
  return v;
}

// Block-wide exclusive prefix sum of one value per thread, in thread order.
// All threads must call it. `warp_totals` is shared memory for
// kThreads / kWarpSize words; the call ends with a barrier so it can be
// reused right away.
template <int kThreads>
__device__ uint32_t block_exclusive_sum(uint32_t v, uint32_t* warp_totals) {
  static_assert(kThreads % kWarpSize == 0 && kThreads / kWarpSize <= kWarpSize, "one scan warp");
  constexpr int kWarps = kThreads / kWarpSize;
  const int lane = lane_id();
  const int warp = int(threadIdx.x) / kWarpSize;
  const uint32_t inclusive = warp_inclusive_sum(v, lane);
  if (lane == kWarpSize - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const uint32_t total = lane < kWarps ? warp_totals[lane] : 0;
    const uint32_t incl = warp_inclusive_sum(total, lane);
    if (lane < kWarps) warp_totals[lane] = incl - total;  // exclusive warp offsets
  }
  __syncthreads();
  const uint32_t result = warp_totals[warp] + inclusive - v;
  __syncthreads();
  return result;
}

// The bucket of a radix-select pass: from a histogram walked from the top
// bin, the bin holding the k_left-th largest element.
struct DigitPick {
  uint32_t digit;  // the bin
  uint32_t above;  // elements in the bins above it
  uint32_t count;  // elements in it
};

// The lanes of `among` whose kBits-wide digit equals this lane's: one ballot
// per digit bit. Every lane of the warp calls it. (__match_any_sync instead:
// 412 against 371 us for the sort of 1024x8192 float32 on an H200.)
template <int kBits>
__device__ JAX_TOPK_FORCE_INLINE unsigned lanes_with_same_digit(int d, unsigned among) {
  unsigned peers = among;
JAX_TOPK_UNROLL
  for (int b = 0; b < kBits; ++b) {
    const bool bit = ((d >> b) & 1) != 0;
    const unsigned set = warp_ballot(bit);
    peers &= bit ? set : ~set;
  }
  return peers;
}

// One step of a stable per-warp counting sort: the rank of this lane's item
// among the warp's items of digit d, after the ones `counter` (the warp's
// counter for d) already holds and before higher lanes' (position order
// within the step); the leader of each digit advances its counter. real:
// the lane holds an item (others get a meaningless rank and count nothing).
// Every lane of the warp calls it; it ends with warp_sync, so the next
// step's leaders read what this one's wrote.
template <int kBits, typename Count>
__device__ JAX_TOPK_FORCE_INLINE uint32_t warp_digit_rank(int d, bool real, Count* counter) {
  const int lane = lane_id();
  const unsigned peers = lanes_with_same_digit<kBits>(d, warp_ballot(real));
  const int leader = __ffs(peers) - 1;
  uint32_t base = 0;
  if (real && lane == leader) {
    base = *counter;
    *counter = Count(base + uint32_t(__popc(peers)));
  }
  const uint32_t rank = warp_shfl(base, leader) + uint32_t(__popc(peers & ((1u << lane) - 1u)));
  warp_sync();
  return rank;
}

// Whether key's bits at and above `shift` equal prefix's (shift == the key
// width of U: no bits fixed yet). For radix selects on ordered keys held as
// 32-bit words.
template <typename U>
__device__ JAX_TOPK_FORCE_INLINE bool key_matches_prefix(uint32_t key, uint32_t prefix, int shift) {
  return shift >= int(sizeof(U) * 8) || (key >> shift) == (prefix >> shift);
}

// One warp (every lane calls it, lane = lane_id()) picks the bin of the
// k_left-th largest element of hist[0:kBins) (1 <= k_left <= the total)
// and writes it to *pick: lane l sums kBins / 32 bins from the top, a warp
// scan finds the lane holding it, that lane walks its bins.
template <int kBins>
__device__ JAX_TOPK_FORCE_INLINE void warp_pick_digit(const uint32_t* hist, uint32_t k_left, DigitPick* pick) {
  static_assert(kBins % kWarpSize == 0, "whole bins per lane");
  constexpr int kPer = kBins / kWarpSize;
  const int lane = lane_id();
  const int top = kBins - 1 - lane * kPer;
  uint32_t mine = 0;
JAX_TOPK_UNROLL
  for (int j = 0; j < kPer; ++j) mine += hist[top - j];
  const uint32_t incl = warp_inclusive_sum(mine, lane);
  const uint32_t above = incl - mine;
  if (above < k_left && k_left <= incl) {
    uint32_t acc = above;
    for (int j = 0; j < kPer; ++j) {
      const uint32_t c = hist[top - j];
      if (acc + c >= k_left) {
        *pick = DigitPick{uint32_t(top - j), acc, c};
        break;
      }
      acc += c;
    }
  }
}

// ---------------------------------------------------------------------------
template <typename U>
union Vec16 {
  uint4 raw;
  U elems[16 / sizeof(U)];
};

// Elements of row[0, n) before its first 16-byte boundary: walk_row_steps'
// scalar head.
template <typename U>
__device__ JAX_TOPK_FORCE_INLINE int row_head_elems(const U* row, int n) {
  const int to_aligned = int((16 - (reinterpret_cast<uintptr_t>(row) & 15)) & 15) / int(sizeof(U));
  return to_aligned < n ? to_aligned : n;
}

// No groups staged: walk_row_steps' default.
struct NoRowWalkStage {};

// Shared memory for staged vectors: [0, vecs) in `first`, the rest from
// `overflow` on (two pieces, so that a kernel can lend what it does not use
// meanwhile without moving its other arrays).
struct RowWalkStageRoom {
  uint4* first;
  int vecs;
  uint4* overflow;
  __device__ JAX_TOPK_FORCE_INLINE uint4* at(int v) const { return v < vecs ? first + v : overflow + (v - vecs); }
};

// The first whole groups of walk_row_steps' walk of a row (kUnroll 16-byte
// vectors a thread each), copied into shared memory by cp.async before the
// walk, while the block works out what the walk needs (the threshold
// kernel's sampled T): the HBM otherwise idles then, and reads the whole row
// after it. Each thread copies and later reads only its own vectors, so the
// stage needs no barrier, only the thread's wait for its own copies (in the
// walk). Only whole groups are staged, so `groups` is the same in every
// thread. CUDA only (cp.async); elsewhere nothing is staged. (A group held in
// registers instead was slower: ptxas spilled the threshold kernel, whose
// waits for the spilled loads doubled its sample phase.)
// With ring (one group staged, room for two; sm_90's bulk copies): the walk
// then streams every later whole group through the two group slots, one
// thread copying group j + 1 into one slot (cp.async.bulk, completing on that
// slot's mbarrier) while the block walks group j from the other, so that a
// group's load overlaps the walk of the one before it instead of following
// it. A barrier before each copy keeps a slot from being overwritten while a
// thread still reads it. Bulk copies rather than each thread's cp.async: the
// walk's shared-memory stores (the candidates) would queue behind a thread's
// copies in flight (benchmarks/results/NOTES.md v20, v23).
inline constexpr int kWalkRingSlots = 2;  // the ring's slots (walk_row_steps takes group j's as j & 1)

template <typename U, int kUnroll, int kMaxGroups>
struct RowWalkStage {
  static constexpr int kMostGroups = kMaxGroups;
  RowWalkStageRoom room;
  int groups = 0;  // none until issue() stages some
  // issue()'s: the walk streams its later whole groups through two slots by
  // bulk copies completing on bars[slot]; bit s of parity is bars[s]'s next
  // phase, carried from row to row by the caller.
  bool ring = false;
  uint64_t* bars = nullptr;
  mutable uint32_t parity = 0;
  // room: most_groups (<= kMaxGroups) * nthreads * kUnroll vectors that
  // nothing else touches until the walk has read them (two groups' worth
  // with ring). With ring, ring_bars: two mbarriers initialised for one
  // arrival (before any thread waits on them).
  __device__ JAX_TOPK_FORCE_INLINE void issue(const U* __restrict__ row, int n, int tid, int nthreads,
                                              RowWalkStageRoom stage_room, int most_groups, bool with_ring = false,
                                              uint64_t* ring_bars = nullptr, uint32_t ring_parity = 0) {
    room = stage_room;
    bars = ring_bars;
    parity = ring_parity;
#if defined(JAX_TOPK_HAS_MMA)
    constexpr int kVec = int(16 / sizeof(U));
    const int head = row_head_elems(row, n);
    const int whole_groups = n > 0 ? (n - head) / kVec / (nthreads * kUnroll) : 0;
    groups = whole_groups < most_groups ? whole_groups : most_groups;
#if defined(JAX_TOPK_HAS_BULK_COPY)
    ring = with_ring && groups == 1;
#endif
    const uint4* vecs = reinterpret_cast<const uint4*>(row + head);
    // Unrolled: the copies issued back to back (a loop of them slowed the
    // sample's loads before them by 0.7 us a row).
JAX_TOPK_UNROLL
    for (int g = 0; g < kMaxGroups; ++g) {
      if (g < groups) copy_group(vecs, g, g, tid, nthreads);
    }
    copy_async_commit();
#endif
  }
  // The shared-memory slot of this thread's vector u of a group in slot s.
  __device__ JAX_TOPK_FORCE_INLINE uint4* slot_vector(int s, int u, int tid, int nthreads) const {
    return room.at((s * kUnroll + u) * nthreads + tid);
  }
#if defined(JAX_TOPK_HAS_MMA)
  // This thread's vectors of whole group g (of vecs, the row's aligned part) into slot s; not committed.
  __device__ JAX_TOPK_FORCE_INLINE void copy_group(const uint4* vecs, int g, int s, int tid, int nthreads) const {
JAX_TOPK_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      copy_async_16(shared_address(slot_vector(s, u, tid, nthreads)), vecs + (g * kUnroll + u) * nthreads + tid,
                    true);
    }
  }
#endif
#if defined(JAX_TOPK_HAS_BULK_COPY)
  // Whole group g into slot s by bulk copies (one thread; the slot may span the room's two pieces).
  __device__ JAX_TOPK_FORCE_INLINE void bulk_group(const uint4* vecs, int g, int s, int nthreads) const {
    const int per_group = kUnroll * nthreads, first = s * per_group;
    mbarrier_arrive_expect_tx(&bars[s], uint32_t(per_group) * 16u);
    const int in_first = first >= room.vecs ? 0 : (room.vecs - first < per_group ? room.vecs - first : per_group);
    const uint4* src = vecs + g * per_group;
    if (in_first > 0) bulk_copy_to_shared(room.first + first, src, uint32_t(in_first) * 16u, &bars[s]);
    if (in_first < per_group) {
      bulk_copy_to_shared(room.at(first + in_first), src + in_first, uint32_t(per_group - in_first) * 16u, &bars[s]);
    }
  }
  __device__ JAX_TOPK_FORCE_INLINE void wait_bulk(int s) const {
    mbarrier_wait_parity(&bars[s], (parity >> s) & 1u);
    parity ^= 1u << s;
  }
#endif
};

// Walks row[0, n) with the threads [0, nthreads) of a block: a scalar head up
// to the first 16-byte boundary, then groups of kUnroll 16-byte loads per
// thread, then a scalar tail. For each step (the head, each group, the tail) it
// calls step.scan(bits, i, valid, pos) for every element of the step, then
// step.between(), then step.emit(bits, i) for each position set in
// step.emit_mask(), then step.after_step(). pos is the element's position in
// the step (0 for the head and tail): a compile-time constant once the loops
// are unrolled, so it may index a register array or a bit mask. Every thread
// of the block makes the same calls to scan, between and after_step (between()
// may use warp collectives, after_step() block barriers); emit is per thread.
// Invalid calls carry bits = 0 and must be ignored. Indices are 32-bit
// (n < 2^31): 64-bit index arithmetic cost a few instructions per element.
// staged: the first groups, copied by RowWalkStage::issue of the same row.
//
// Two things keep the per-element cost down (threshold kernel, ncu on an
// H200): the groups every thread loads whole (all but the last) are walked
// with valid a constant, without a predicate and a zeroed register per
// element; and emit re-reads each emitted element (an L1 hit: the step just
// loaded it) in a loop over the mask's set bits, where a branch per position
// cost ~9 instructions per element whether it was emitted or not. (A staged
// group's emits read the stage.)
template <typename U, int kUnroll, typename Step, typename Stage = NoRowWalkStage>
__device__ JAX_TOPK_FORCE_INLINE void walk_row_steps(const U* __restrict__ row, int n, int tid,
                                                     int nthreads, Step& step, const Stage* staged = nullptr) {
  constexpr int kVec = int(16 / sizeof(U));
  constexpr bool kHasStage = !std::is_same_v<Stage, NoRowWalkStage>;
  if (n <= 0) return;
  const int head = row_head_elems(row, n);
  auto scalar_step = [&](int i, bool valid) {
    const U bits = valid ? row[i] : U(0);
    step.scan(bits, i, valid, 0);
    step.between();
    if (step.emit_mask() & 1u) step.emit(bits, i);
    step.after_step();
  };
  scalar_step(tid, tid < head);
  const int nvec = (n - head) / kVec;
  const uint4* vecs = reinterpret_cast<const uint4*>(row + head);
  const int stride = nthreads * kUnroll;
  // slot >= 0: the group is in that slot of the stage (walked from shared memory).
  auto group = [&](int v0, auto whole, int slot) {
    constexpr bool kWhole = decltype(whole)::value;  // every v < nvec
    Vec16<U> data[kUnroll];
JAX_TOPK_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * nthreads + tid;
      if constexpr (kHasStage) {
        if (slot >= 0) {
          data[u].raw = *staged->slot_vector(slot, u, tid, nthreads);
          continue;
        }
      }
      data[u].raw = kWhole || v < nvec ? __ldg(vecs + v) : make_uint4(0, 0, 0, 0);
    }
JAX_TOPK_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * nthreads + tid;
JAX_TOPK_UNROLL
      for (int e = 0; e < kVec; ++e) step.scan(data[u].elems[e], head + v * kVec + e, kWhole || v < nvec, u * kVec + e);
    }
    step.between();
    // This thread's first element of the step; pos is unsigned, so / and %
    // by kVec are shifts, and an emit's address is one 32-bit offset from it.
    const int i0 = head + (v0 + tid) * kVec;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    // sm_80: the step's own base pointer, live across the loop, spilled the
    // streamed kernel (ptxas: 8 bytes stored, 36 loaded); the row's does not.
    const U* step_row = row;
    const uint32_t step_first = uint32_t(i0);
#else
    const U* step_row = row + i0;  // the form measured on sm_90 (NOTES.md v23)
    constexpr uint32_t step_first = 0;
#endif
    for (uint32_t m = step.emit_mask(); m != 0; m &= m - 1) {
      const uint32_t pos = uint32_t(__ffs(int(m))) - 1u;
      const uint32_t u = pos / kVec, e = pos % kVec;
      const uint32_t offset = u * uint32_t(nthreads * kVec) + e;
      if constexpr (kHasStage) {
        if (slot >= 0) {
          step.emit(reinterpret_cast<const U*>(staged->slot_vector(slot, int(u), tid, nthreads))[e], i0 + int(offset));
          continue;
        }
      }
      step.emit(step_row[step_first + offset], i0 + int(offset));
    }
    step.after_step();
  };
  int v0 = 0;
  if constexpr (kHasStage) {
#if defined(JAX_TOPK_HAS_MMA)
    bool streamed = false;  // uniform
#if defined(JAX_TOPK_HAS_BULK_COPY)
    if (staged->ring) {  // group 0 staged in slot 0 (cp.async); group j in slot j % 2
      static_assert(kWalkRingSlots == 2, "slots by j & 1");
      const int whole = nvec / stride;
      // The room's earlier generic accesses (a previous row's rank) before the copies.
      fence_proxy_async_shared();
      __syncthreads();
      if (whole > 1 && tid == 0) staged->bulk_group(vecs, 1, 1, nthreads);
      for (int j = 0; j < whole; ++j, v0 += stride) {
        if (j + 1 < whole && j > 0) {
          __syncthreads();  // every thread has walked group j - 1 (emits too), in slot (j + 1) % 2
          if (tid == 0) staged->bulk_group(vecs, j + 1, (j + 1) & 1, nthreads);
        }
        if (j == 0) {
          copy_async_wait<0>();  // this thread's own copies
        } else {
          staged->wait_bulk(j & 1);
        }
        group(v0, std::true_type{}, j & 1);
      }
      streamed = true;
    }
#endif
    if (!streamed) {
      if (staged->groups > 0) copy_async_wait<0>();  // this thread's own copies: no barrier
JAX_TOPK_UNROLL
      for (int g = 0; g < Stage::kMostGroups; ++g) {
        if (g < staged->groups) {  // uniform
          group(v0, std::true_type{}, g);
          v0 += stride;
        }
      }
    }
#endif
  }
  for (; v0 + stride <= nvec; v0 += stride) group(v0, std::true_type{}, -1);
  if (v0 < nvec) group(v0, std::false_type{}, -1);
  const int tail = head + nvec * kVec + tid;  // fewer than kVec left
  scalar_step(tail, tail < n);
}

// Number of bits of x (0 for 0): the position above its highest set bit.
// Host-callable; used once per block, so a plain loop.
JAX_TOPK_HOST_DEVICE constexpr int bit_width_u64(uint64_t x) {
  int width = 0;
  for (; x != 0; x >>= 1) ++width;
  return width;
}

// Smallest power of two >= v (v >= 1).
JAX_TOPK_HOST_DEVICE constexpr int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// Bits needed to write v (0 for v == 0).
JAX_TOPK_HOST_DEVICE constexpr int bit_width(uint64_t v) {
  int b = 0;
  while (v) {
    ++b;
    v >>= 1;
  }
  return b;
}

}  // namespace jax_topk::cuda
