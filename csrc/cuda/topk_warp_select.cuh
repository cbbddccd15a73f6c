// Threshold-filter top-k for short rows and small k (regimes kTinyRows and
// kSmallK with n <= kWarpSelectMaxN): the fast path of the warp regimes.
//
// A group of L lanes (4..32, a power of two) owns one row; a warp holds 32/L
// rows. Every lane loads its E slots of the row once into registers as 32-bit
// ordered keys (16-byte loads when the row is aligned), then:
//
//  1. Guaranteed threshold (the CPU kernel's trick). The lane's slots are
//     split into R (1 or 2) disjoint groups (even / odd slots); the L*R group
//     maxima are distinct elements of the row, so with T = the k-th largest
//     group maximum at least k elements have key >= T and every top-k element
//     has key >= T. Empty groups count as key 0, which only lowers T (safe).
//     A bitonic sort of the L*R maxima across the group's lanes gives T.
//  2. Candidates = valid slots with key >= T: a bit mask per lane, a prefix sum
//     of the counts over the group, and each candidate's packed value
//     (key << 32 | ~index, so one integer compare is the whole order) written
//     to the row's shared-memory segment (capacity C).
//  3. Every candidate's rank among the candidates is its rank in the row for
//     the top k (everything better than a top-k element is a candidate), so
//     candidates with rank < k write themselves to output position rank.
//
// Overflow (more than C candidates, or more than both 4k and 64: heavy ties
// at T, e.g. all-equal or mostly -inf rows): the whole warp redoes step 1-3
// with PACKED group maxima (distinct values, so ties are broken by index and
// typically ~k..4k candidates survive); if that still overflows, k rounds of
// a group-wide argmax (always correct, slow).
// Every decision is warp-uniform, so all shuffles use the full mask.
//
// Deterministic: candidate order in shared memory depends only on the layout,
// and ranks of distinct packed values are unique.
//
// What happens to the ranked k is the kernel's policy `Out` (keys, put,
// finish; see WsTopkOutput): top_k writes values and indices, and fused
// routing by logits (routing.cu, RouteByLogitsOutput) turns them into weights.
//
// Per-row lengths: the row's length `len` replaces n as the bound of the valid
// slots (the slot layout still follows n). A row shorter than k has fewer than
// k candidates (T is an empty group's 0, so all its elements are), and the
// slots past them are written as padding. With lengths the host picks the
// scalar layout: a 16-byte vector straddling `len` would need a per-element
// mask on the whole-row path.
#pragma once

#include <climits>
#include <type_traits>

#include "cuda/dependent_launch.cuh"
#include "cuda/primitives.cuh"
#include "jax_topk/topk_dispatch.h"

namespace jax_topk::cuda {

inline constexpr int kWarpSelectThreads = 128;
// Most packed candidates kept per row in shared memory.
inline constexpr int kWarpSelectMaxCapacity = 256;

// Element index held by slot s of lane gl (lane within its row group of L).
// Vector layout: lane gl's q-th 16-byte vector is vector q*L + gl of the row.
// Scalar layout: slot s is element s*L + gl.
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE int ws_slot_index(int s, int gl, int L, int vec,
                                                            bool vectorised) {
  return vectorised ? ((s / vec) * L + gl) * vec + (s % vec) : s * L + gl;
}

// Valid slots of lane gl for a row of length n (the vector layout needs n a
// multiple of vec): always a prefix [0, result) of its E slots.
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE int ws_valid_slots(int n, int gl, int log2_lanes,
                                                             int vec, bool vectorised, int E) {
  const int L = 1 << log2_lanes;
  int v;
  if (vectorised) {
    const int nvec = n / vec;  // n is a multiple of vec on this path (vec a power of two)
    v = nvec > gl ? ((nvec - gl + L - 1) >> log2_lanes) * vec : 0;
  } else {
    v = n > gl ? (n - gl + L - 1) >> log2_lanes : 0;
  }
  return v < E ? v : E;
}

// Lane count for a row of n with k <= 32: the fewest lanes (4..32) holding
// at most `elems_per_lane` elements each (kWarpSelectElemsPerLane); then
// 2k lanes, so that one group maximum per lane gives the threshold (2k
// maxima keep the candidate count near k), while each lane keeps at least 4
// elements; and never fewer than k lanes. Fewer lanes per row put more rows
// in a warp, which then share the per-row work (threshold sort, scan, rank).
// (2k lanes over 4 elements each: 4096x64 k16 on 32 lanes took 7.3 us on an
// H200 against 5.1 on 16.)
JAX_TOPK_HOST_DEVICE inline int ws_lanes(int64_t n, int64_t k,
                                         int64_t elems_per_lane = kWarpSelectElemsPerLane) {
  int lanes = 4;
  while (lanes < 32 && n > lanes * elems_per_lane) lanes *= 2;
  while (lanes < 32 && lanes < 2 * k && n >= 8 * int64_t(lanes)) lanes *= 2;
  while (lanes < 32 && lanes < k) lanes *= 2;
  return lanes;
}
// Two groups per lane (even and odd slots) when one maximum per lane gives
// fewer than 2k.
JAX_TOPK_HOST_DEVICE inline bool ws_two_groups(int lanes, int64_t k) { return 2 * k > lanes; }

// Whether tier 1's key threshold comes from k - 1 rounds of a warp maximum
// (ws_warp_kth_or_lower) rather than the bitonic sort of the lanes' maxima:
// whole-warp rows, one group per lane, small k. On an H200 (ncu, base
// clocks) the rounds took 16384x256 k8 on 32 lanes from 16.3 to 15.6 us and
// 16384x384 k6 from 17.4 to 16.6, but k = 16 from 12.1 to 12.4 (4096x1024)
// and 18.8 to 19.8 (8192x1024): 15 rounds of a dependent REDUX cost more
// than the 15-stage sort. Host-callable so the host simulation mirrors it.
JAX_TOPK_HOST_DEVICE inline bool ws_threshold_by_warp_maxima(int log2_lanes, bool two_groups,
                                                              int64_t k) {
  return log2_lanes == 5 && !two_groups && k <= kWarpSelectReduxMaxK;
}

// Slots per lane the kernel is instantiated for: 4, 8, 12, 16, 24, 32, 48,
// 64 (powers of two and their midpoints, so that a row of 384 takes 24 slots
// on 16 lanes rather than 32).
JAX_TOPK_HOST_DEVICE constexpr int ws_next_slot_count(int e) {
  return (e & (e - 1)) == 0 ? (e < 8 ? 8 : e + e / 2) : e + e / 3;
}
inline constexpr int kWsMaxSlots = 64;

// Slots per lane: the smallest instantiated count >= ceil(n / lanes) that is
// whole 16-byte vectors of U (vec elements each); 0 when none holds the row.
JAX_TOPK_HOST_DEVICE inline int ws_slots(int64_t n, int lanes, int vec) {
  for (int e = 4; e <= kWsMaxSlots; e = ws_next_slot_count(e)) {
    if (e % vec == 0 && int64_t(e) * lanes >= n) return e;
  }
  return 0;
}

// Shared-memory candidate capacity per row.
JAX_TOPK_HOST_DEVICE inline int ws_capacity(int64_t n) {
  return n < kWarpSelectMaxCapacity ? int(n) : kWarpSelectMaxCapacity;
}

// Whether tier 1's `total` candidates go to tier 2 instead of being ranked:
// more than the row's shared memory holds, or more than both 4k and 64.
// Ranking costs total^2 / L compares per lane, tier 2 a fixed packed-maxima
// sort; random rows give about k..1.5k candidates (at least 2k group maxima),
// ties at the threshold up to the whole row. Rows of 256 with all but a few
// elements -inf (NSA's causal selection scores, 16384 of them, k = 16) ranked
// 256 candidates each: 245 us on an H200 against 13 for random rows.
inline constexpr int kWsRankMaxPerK = 4;
inline constexpr int kWsRankAlways = 64;
JAX_TOPK_HOST_DEVICE inline bool ws_redo_with_packed_threshold(int total, int64_t k, int capacity) {
  return total > capacity || (int64_t(total) > kWsRankMaxPerK * k && total > kWsRankAlways);
}

template <int E>
using WsMask = std::conditional_t<(E > 32), uint64_t, uint32_t>;

template <int E>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE WsMask<E> ws_prefix_mask(int count) {
  using M = WsMask<E>;
  constexpr int kBits = int(sizeof(M) * 8);
  return count >= kBits ? ~M(0) : ((M(1) << count) - M(1));
}

// The kernel's keys are a policy (`Out` below: key(bits), fill_bits()).
// top_k's: the dtype's total order (KeyCodec), with the bits of key 0 as the
// fill of invalid slots.
template <typename U>
struct WsTotalOrderKeys {
  KeyCodec<U> codec;
  JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE uint32_t key(U bits) const { return uint32_t(codec.key(bits)); }
  JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE U fill_bits() const { return codec.bits(U(0)); }
};

// Loads lane gl's E slots of a row of length n (for the vector layout a
// multiple of the vector) as keys. Invalid slots load keys.fill_bits(), whose
// key is at or below every element's (top_k: 0), so they never raise a
// maximum above an element (callers mask them out of the candidates with the
// valid-slot prefix).
template <typename U, int E, typename Keys>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void ws_load_keys(const U* __restrict__ row, int n,
                                                            bool vectorised, int gl, int L,
                                                            bool row_valid, const Keys& keys,
                                                            uint32_t (&key)[E]) {
  constexpr int kVec = int(16 / sizeof(U));
  static_assert(E % kVec == 0, "whole vectors");
  const U fill_bits = keys.fill_bits();
  if (vectorised) {
    constexpr int kVecs = E / kVec;
    Vec16<U> fill;
JAX_TOPK_UNROLL
    for (int e = 0; e < kVec; ++e) fill.elems[e] = fill_bits;
    const uint4* vecs = reinterpret_cast<const uint4*>(row);
    Vec16<U> data[kVecs];
JAX_TOPK_UNROLL
    for (int q = 0; q < kVecs; ++q) {
      const int v = q * L + gl;
      const bool valid = row_valid && v * kVec < n;
      data[q].raw = valid ? vecs[v] : fill.raw;
    }
JAX_TOPK_UNROLL
    for (int q = 0; q < kVecs; ++q) {
JAX_TOPK_UNROLL
      for (int e = 0; e < kVec; ++e) key[q * kVec + e] = keys.key(data[q].elems[e]);
    }
  } else {
JAX_TOPK_UNROLL
    for (int s = 0; s < E; ++s) {
      const int i = s * L + gl;
      const bool valid = row_valid && i < n;
      key[s] = keys.key(valid ? row[i] : fill_bits);
    }
  }
}

JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE uint64_t ws_pack(uint32_t key, uint32_t index) {
  return (uint64_t(key) << 32) | uint64_t(~index);
}

// Group maxima of the keys (even slots -> m0, odd slots -> m1).
template <int E>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void ws_key_maxima(const uint32_t (&key)[E],
                                                             uint32_t& m0, uint32_t& m1) {
  m0 = 0;
  m1 = 0;
JAX_TOPK_UNROLL
  for (int s = 0; s < E; s += 2) {
    m0 = max_of(m0, key[s]);
    m1 = max_of(m1, key[s + 1]);
  }
}

// Candidate bits of the key threshold (invalid slots included: mask them).
template <int E>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE WsMask<E> ws_key_candidates(const uint32_t (&key)[E],
                                                                      uint32_t t) {
  using M = WsMask<E>;
  M m = 0;
JAX_TOPK_UNROLL
  for (int s = 0; s < E; ++s) m |= key[s] >= t ? (M(1) << s) : M(0);
  return m;
}

// Packed group maxima over the valid slots (0 for an empty group).
template <int E>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE void ws_packed_maxima(const uint32_t (&key)[E], int gl,
                                                                int L, int vec, bool vectorised,
                                                                int valid_slots, uint64_t& m0,
                                                                uint64_t& m1) {
  m0 = 0;
  m1 = 0;
JAX_TOPK_UNROLL
  for (int s = 0; s < E; ++s) {
    const uint64_t p = s < valid_slots
                           ? ws_pack(key[s], uint32_t(ws_slot_index(s, gl, L, vec, vectorised)))
                           : uint64_t(0);
    if (s % 2 == 0) {
      m0 = max_of(m0, p);
    } else {
      m1 = max_of(m1, p);
    }
  }
}

template <int E>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE WsMask<E> ws_packed_candidates(
    const uint32_t (&key)[E], int gl, int L, int vec, bool vectorised, uint64_t t) {
  using M = WsMask<E>;
  M m = 0;
JAX_TOPK_UNROLL
  for (int s = 0; s < E; ++s) {
    const uint64_t p = ws_pack(key[s], uint32_t(ws_slot_index(s, gl, L, vec, vectorised)));
    m |= p >= t ? (M(1) << s) : M(0);
  }
  return m;
}

// From this many slots per lane, tier 3 (k rounds of ws_best_below) re-reads
// the row rather than rank the register keys. Over the register keys the
// compiler hoists every slot's packed value (two registers) out of the
// rounds, which holds two registers per slot for the whole kernel: 167
// registers at 64 slots (12 warps per SM) against 88 with the re-read (20
// warps). On an H200 (ncu, the row in L2; benchmarks/results/NOTES.md, v10)
// the re-read took 4096 x 2048 k32 from 20.8 to 18.6 us and k16 from 14.9
// to 14.3, but 8192 x 1024 k16 (32 slots: 80 -> 56 registers) from 14.3 to
// 14.9: there the register keys stay.
inline constexpr int kWsRereadTier3MinSlots = 48;

// Best packed value of the lane's valid slots (the first valid_slots of E)
// strictly below `below` (any when `first`); 0 when none. key_of(s) is slot
// s's key; the loop is unrolled over register keys, rolled for the re-read.
template <int E, typename KeyOf>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE uint64_t ws_best_below(KeyOf key_of, int gl, int L, int vec,
                                                                 bool vectorised, int valid_slots,
                                                                 uint64_t below, bool first) {
  constexpr int kUnroll = E >= kWsRereadTier3MinSlots ? 1 : E;
  uint64_t best = 0;
JAX_TOPK_UNROLL_BY(kUnroll)
  for (int s = 0; s < E; ++s) {
    if (s < valid_slots) {
      const uint64_t p = ws_pack(key_of(s), uint32_t(ws_slot_index(s, gl, L, vec, vectorised)));
      if (first || p < below) best = max_of(best, p);
    }
  }
  return best;
}

template <typename M>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE int ws_popc(M m) {
#if defined(JAX_TOPK_DEVICE_PASS)
  if constexpr (sizeof(M) == 8) {
    return __popcll(m);
  } else {
    return __popc(m);
  }
#else
  return __builtin_popcountll(uint64_t(m));
#endif
}

template <typename M>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE int ws_lowest_bit(M m) {
#if defined(JAX_TOPK_DEVICE_PASS)
  if constexpr (sizeof(M) == 8) {
    return __ffsll((long long)m) - 1;
  } else {
    return __ffs(int(m)) - 1;
  }
#else
  return __builtin_ctzll(uint64_t(m));
#endif
}

#if defined(JAX_TOPK_GPU_COMPILER)
// Sorts the L*R values of each group of L lanes descending (R = 1 or 2 values
// per lane, element i = gl*R + r). All 32 lanes call it with the same L.
// Unrolled per L (a run-time L costs a loop and branches per stage).
template <int R, int L, typename T>
__device__ JAX_TOPK_FORCE_INLINE void ws_group_sort_desc_l(T (&v)[R], int gl) {
  constexpr int kCount = L * R;
JAX_TOPK_UNROLL
  for (int size = 2; size <= kCount; size *= 2) {
JAX_TOPK_UNROLL
    for (int stride = size / 2; stride > 0; stride /= 2) {
      if (stride < R) {  // R == 2, stride == 1: the lane's own pair (i = 2*gl)
        const bool desc = ((2 * gl) & size) == 0;
        const T hi = max_of(v[0], v[R - 1]), lo = min_of(v[0], v[R - 1]);  // (R - 1: 1, spelled so R == 1 compiles cleanly)
        v[0] = desc ? hi : lo;
        v[R - 1] = desc ? lo : hi;
      } else {
        const int lane_stride = stride / R;
        const bool keep_max = ((gl * R) & stride) == 0;
        const bool desc = ((gl * R) & size) == 0;
JAX_TOPK_UNROLL
        for (int r = 0; r < R; ++r) {
          const T other = shfl_xor_wide(v[r], lane_stride);
          v[r] = (keep_max == desc) ? max_of(v[r], other) : min_of(v[r], other);
        }
      }
    }
  }
}

// Calls f(std::integral_constant<int, L>{}) with the group's lane count L =
// 1 << log2_lanes (4..32) as a compile-time constant: shuffle networks over a
// run-time width are loops and per-stage branches. log2_lanes is uniform.
template <typename F>
__device__ JAX_TOPK_FORCE_INLINE void ws_with_lanes(int log2_lanes, F&& f) {
  switch (log2_lanes) {
    case 2: f(std::integral_constant<int, 4>{}); break;
    case 3: f(std::integral_constant<int, 8>{}); break;
    case 4: f(std::integral_constant<int, 16>{}); break;
    default: f(std::integral_constant<int, 32>{}); break;
  }
}

// Exclusive prefix of `v` over the row's group of lanes, and the group's
// total in every lane.
__device__ JAX_TOPK_FORCE_INLINE int ws_group_scan(int v, int gl, int group_base, int log2_lanes,
                                                  int* total) {
  int incl = v;
  ws_with_lanes(log2_lanes, [&](auto lanes) {
    incl = warp_inclusive_sum(v, gl, lanes());
    *total = warp_shfl(incl, group_base + lanes() - 1);
  });
  return incl - v;
}

template <int R, typename T>
__device__ JAX_TOPK_FORCE_INLINE void ws_group_sort_desc(T (&v)[R], int gl, int log2_lanes) {
  ws_with_lanes(log2_lanes, [&](auto lanes) { ws_group_sort_desc_l<R, decltype(lanes)::value>(v, gl); });
}

// The k-th largest of the group's sorted L*R values, in every lane of the group.
template <int R, typename T>
__device__ JAX_TOPK_FORCE_INLINE T ws_kth(const T (&v)[R], int group_base, int k) {
  const int src = group_base + (k - 1) / R;
  const T a = shfl_wide(v[0], src);
  if constexpr (R == 1) {
    return a;
  } else {
    const T b = shfl_wide(v[1], src);
    return ((k - 1) & 1) ? b : a;
  }
}

// The k-th largest of one 32-bit value per lane of a whole warp, or lower:
// k - 1 rounds each drop the warp's maximum (one REDUX), so lanes tied at a
// maximum leave together and the result can only fall below the k-th
// largest, which keeps it a safe threshold (ties are what tier 2 is for).
// Used for the key threshold of whole-warp rows with one group per lane and
// k <= kWarpSelectReduxMaxK (ws_threshold_by_warp_maxima).
__device__ JAX_TOPK_FORCE_INLINE uint32_t ws_warp_kth_or_lower(uint32_t v, int k) {
  for (int r = 1; r < k; ++r) {
    const uint32_t m = warp_reduce_max(v);
    v = v == m ? 0u : v;
  }
  return warp_reduce_max(v);
}

// Threshold from the group maxima m0 (even slots), m1 (odd slots).
template <typename T>
__device__ JAX_TOPK_FORCE_INLINE T ws_threshold(T m0, T m1, bool two_groups, int gl, int log2_lanes,
                                               int group_base, int k) {
  if constexpr (sizeof(T) == 4) {
    if (ws_threshold_by_warp_maxima(log2_lanes, two_groups, k)) {
      return ws_warp_kth_or_lower(max_of(m0, m1), k);
    }
  }
  if (two_groups) {
    T v[2] = {m0, m1};
    ws_group_sort_desc<2>(v, gl, log2_lanes);
    return ws_kth<2>(v, group_base, k);
  }
  T v[1] = {max_of(m0, m1)};
  ws_group_sort_desc<1>(v, gl, log2_lanes);
  return ws_kth<1>(v, group_base, k);
}

// What the kernel does with a row's k best is a policy, `Out`: its keys
// (key(bits), fill_bits()), put(p, row, rank, row_out) for the packed value
// of rank `rank` (0 past a row shorter than k; called by one lane), and
// finish(row, row_valid, log2_lanes, row_out) once the row's k are put
// (called by every lane; the route's epilogue). Out::kRowSlots packed values
// of shared memory per row (row_out) hold what put leaves for finish.
// top_k's policy writes each value and index as it is ranked.
template <typename U>
struct WsTopkOutput : WsTotalOrderKeys<U> {
  static constexpr int kRowSlots = 0;
  U pad_bits;
  U* __restrict__ values;
  int32_t* __restrict__ indices;
  int k;
  __device__ JAX_TOPK_FORCE_INLINE void put(uint64_t p, int64_t row, int rank, uint64_t*) const {
    write_packed_output(p, this->codec, pad_bits, values, indices, row * int64_t(k) + rank);
  }
  __device__ JAX_TOPK_FORCE_INLINE void finish(int64_t, bool, int, uint64_t*) const {}
};

template <typename U, int E, typename Out>
__global__ void __launch_bounds__(kWarpSelectThreads)
    warp_select_topk_kernel(const U* __restrict__ x, int64_t rows, int n, int k, int log2_lanes,
                            bool two_groups, bool vectorised, int capacity, Out out,
                            RowLengths<U> lengths) {
  wait_for_previous_grid();  // launched dependent (dependent_launch.cuh): the kernel before may still run
  using M = WsMask<E>;
  constexpr int kVec = int(16 / sizeof(U));
  extern __shared__ uint64_t ws_smem[];

  const int L = 1 << log2_lanes;
  const int lane = lane_id();
  const int gl = lane & (L - 1);
  const int group_base = lane - gl;
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = thread >> log2_lanes;
  const bool row_valid = row < rows;  // lanes past the last row still join the shuffles
  const U* in = x + (row_valid ? row : 0) * int64_t(n);
  const int row_in_block = int(threadIdx.x >> log2_lanes);
  const int seg_stride = capacity + 1;  // +1: rows of one warp start in different banks
  uint64_t* seg = ws_smem + int64_t(row_in_block) * seg_stride;
  uint64_t* row_out = ws_smem + int64_t(kWarpSelectThreads >> log2_lanes) * seg_stride +
                      int64_t(row_in_block) * Out::kRowSlots;

  const int len = row_valid ? int(lengths.of(row, n)) : 0;  // == n when vectorised

  uint32_t key[E];
  ws_load_keys<U, E>(in, len, vectorised, gl, L, row_valid, out, key);
  const int valid_slots = row_valid ? ws_valid_slots(len, gl, log2_lanes, kVec, vectorised, E) : 0;
  const M valid_mask = ws_prefix_mask<E>(valid_slots);

  // Tier 1: threshold on keys.
  uint32_t km0, km1;
  ws_key_maxima(key, km0, km1);
  const uint32_t t = ws_threshold(km0, km1, two_groups, gl, log2_lanes, group_base, k);
  M cand = ws_key_candidates(key, t) & valid_mask;

  int total = 0;
  int offset = ws_group_scan(ws_popc(cand), gl, group_base, log2_lanes, &total);
  bool overflow = warp_any(ws_redo_with_packed_threshold(total, k, capacity));
  if (overflow) {
    // Tier 2: threshold on packed values (ties broken by index).
    uint64_t pm0, pm1;
    ws_packed_maxima(key, gl, L, kVec, vectorised, valid_slots, pm0, pm1);
    const uint64_t t64 = ws_threshold(pm0, pm1, two_groups, gl, log2_lanes, group_base, k);
    cand = ws_packed_candidates(key, gl, L, kVec, vectorised, t64) & valid_mask;
    offset = ws_group_scan(ws_popc(cand), gl, group_base, log2_lanes, &total);
    overflow = warp_any(total > capacity);
  }
  if (overflow) {
    // Tier 3: k rounds of a group argmax (0 once a short row runs out: padding).
    uint64_t prev = 0;
    for (int r = 0; r < k; ++r) {
      const auto key_of = [&](int s) {
        if constexpr (E >= kWsRereadTier3MinSlots) {
          return out.key(in[ws_slot_index(s, gl, L, kVec, vectorised)]);
        } else {
          return key[s];
        }
      };
      uint64_t best = ws_best_below<E>(key_of, gl, L, kVec, vectorised, valid_slots, prev, r == 0);
      for (int m = 1; m < L; m *= 2) best = max_of(best, shfl_xor_wide(best, m));
      prev = best;
      if (row_valid && gl == 0) out.put(best, row, r, row_out);
    }
  } else {
    // Compaction: re-read each candidate (an L1 hit) rather than index the
    // register array at run time.
    while (cand != 0) {
      const int s = ws_lowest_bit(cand);
      cand &= cand - M(1);
      const uint32_t i = uint32_t(ws_slot_index(s, gl, L, kVec, vectorised));
      seg[offset++] = ws_pack(out.key(in[i]), i);
    }
    warp_sync();
    // Candidate j puts itself at its rank. Fewer candidates than k only in a
    // row shorter than k (all its elements are candidates): the same loop
    // puts its slots [total, k) as padding (packed 0 at slot j), which costs
    // fewer registers than a loop of its own.
    const int slots = total > k ? total : k;
    for (int j = gl; row_valid && j < slots; j += L) {
      uint64_t p = 0;
      int rank = j;
      if (j < total) {
        p = seg[j];
        rank = 0;
#pragma unroll 4
        for (int i = 0; i < total; ++i) rank += seg[i] > p ? 1 : 0;
      }
      if (rank < k) out.put(p, row, rank, row_out);
    }
  }
  out.finish(row, row_valid, log2_lanes, row_out);
}

// Shared memory of warp_select_topk_kernel<..., Out> for rows of n on
// `lanes` lanes: each row's candidate segment, then its Out::kRowSlots.
template <typename Out>
JAX_TOPK_HOST_DEVICE inline size_t ws_smem_bytes(int64_t n, int lanes) {
  return size_t(kWarpSelectThreads / lanes) * size_t(ws_capacity(n) + 1 + Out::kRowSlots) * sizeof(uint64_t);
}

// Launches warp_select_topk_kernel<U, E, Out> over `rows` rows of n (n <=
// kWarpSelectMaxN, k <= 32) with E the slot count the layout needs (callers
// whose rows need fewer than kMaxSlots instantiate no more).
template <typename U, typename Out, int kMaxSlots = kWsMaxSlots>
gpuError_t launch_warp_select_rows(const DeviceInfo& dev, const U* x, int64_t rows, int64_t n, int64_t k,
                                   bool vectorised, const Out& out, RowLengths<U> lengths, gpuStream_t stream) {
  constexpr int kVec = int(16 / sizeof(U));
  const int lanes = ws_lanes(n, k);
  const int log2_lanes = bit_width(uint64_t(lanes)) - 1;  // lanes is a power of two
  const bool two_groups = ws_two_groups(lanes, k);
  const int slots = ws_slots(n, lanes, kVec);
  const int64_t blocks = (rows * lanes + kWarpSelectThreads - 1) / kWarpSelectThreads;
  if (blocks > INT_MAX) return gpuErrorInvalidValue;
  const size_t smem = ws_smem_bytes<Out>(n, lanes);
  const dim3 grid{unsigned(blocks)};
  const auto launch = [&](auto slot_count) -> gpuError_t {
    constexpr int E = decltype(slot_count)::value;
    if constexpr (E % kVec == 0 && E <= kMaxSlots) {
      return launch_dependent(dev, warp_select_topk_kernel<U, E, Out>, grid, dim3(kWarpSelectThreads), smem, stream,
                              x, rows, int(n), int(k), log2_lanes, two_groups, vectorised, ws_capacity(n), out,
                              lengths);
    } else {
      return gpuErrorInvalidValue;
    }
  };
  switch (slots) {
    case 4: return launch(std::integral_constant<int, 4>{});
    case 8: return launch(std::integral_constant<int, 8>{});
    case 12: return launch(std::integral_constant<int, 12>{});
    case 16: return launch(std::integral_constant<int, 16>{});
    case 24: return launch(std::integral_constant<int, 24>{});
    case 32: return launch(std::integral_constant<int, 32>{});
    case 48: return launch(std::integral_constant<int, 48>{});
    case 64: return launch(std::integral_constant<int, 64>{});
    default: return gpuErrorInvalidValue;  // n <= kWarpSelectMaxN keeps slots <= 64
  }
}
#endif  // JAX_TOPK_GPU_COMPILER

}  // namespace jax_topk::cuda
