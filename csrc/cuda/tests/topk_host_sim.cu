// Host-only simulation of the GPU top-k algorithms, for machines without a
// GPU. It runs the same host-callable pieces the kernels use (key codec,
// packing, load_packed_chunk, absorb_chunk, the bitonic networks, the radix
// field schedule and state machine, the cluster kernel's bin thresholds and
// its rank split over blocks) in a
// sequential emulation of the lanes / threads / blocks, and compares with a
// plain oracle. It does NOT exercise warp
// collectives, atomics, barriers or memory traffic: topk_selftest does that
// on a GPU. Every algorithm also runs with a per-row length `len` < n (the
// row's first len elements take part; output slots past min(k, len) are
// padding, written by write_packed_output as the kernels do). Build and run
// from the repository root:
//
//   nvcc -std=c++17 -O2 --expt-relaxed-constexpr -Icsrc/include -Icsrc csrc/cuda/tests/topk_host_sim.cu -o topk_host_sim && ./topk_host_sim

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "cuda/topk_cluster.cuh"
#include "cuda/topk_radix.cuh"
#include "cuda/topk_threshold.cuh"
#include "cuda/topk_warp.cuh"
#include "cuda/topk_warp_select.cuh"
#include "jax_topk/topk_dispatch.h"

using namespace jax_topk;
using namespace jax_topk::cuda;

namespace {

int g_failed = 0, g_passed = 0;

using Outputs = std::vector<std::pair<uint64_t, int32_t>>;  // (value bits, index) per slot

// The value output slots past a row's length hold: the lowest value of a
// dtype of this key kind and width (any marker would do for the simulation).
template <KeyKind Kind, typename U>
constexpr U sim_pad_bits() {
  if constexpr (Kind == KeyKind::kFloat) {
    return sizeof(U) == 8 ? U(DTypeTraits<DType::float64>::kLowestBits)
           : sizeof(U) == 4 ? U(DTypeTraits<DType::float32>::kLowestBits)
                            : U(DTypeTraits<DType::bfloat16>::kLowestBits);
  } else if constexpr (Kind == KeyKind::kSigned) {
    return kSignBit<U>;
  } else {
    return U(0);
  }
}

// The best min(k, len) of row[0, len), then (pad, -1) up to k.
template <KeyKind Kind, typename U>
Outputs oracle(const std::vector<U>& row, int64_t len, int64_t k) {
  std::vector<int32_t> order(static_cast<size_t>(len));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return ordered_key<Kind>(row[size_t(a)]) > ordered_key<Kind>(row[size_t(b)]);
  });
  Outputs out;
  for (int64_t j = 0; j < k; ++j) {
    if (j < len) {
      out.push_back({uint64_t(row[size_t(order[size_t(j)])]), order[size_t(j)]});
    } else {
      out.push_back({uint64_t(sim_pad_bits<Kind, U>()), -1});
    }
  }
  return out;
}

// Output slots [0, k) as the kernels write them from packed values.
template <KeyKind Kind, typename U, typename P>
Outputs write_outputs(const std::vector<P>& slots, int64_t k) {
  const KeyCodec<U> codec = make_key_codec<Kind, U>();
  std::vector<U> values(size_t(k) + 1);
  std::vector<int32_t> indices(size_t(k) + 1);
  for (int64_t j = 0; j < k; ++j) {
    write_packed_output(slots[size_t(j)], codec, sim_pad_bits<Kind, U>(), values.data(), indices.data(), j);
  }
  Outputs out;
  for (int64_t j = 0; j < k; ++j) out.push_back({uint64_t(values[size_t(j)]), indices[size_t(j)]});
  return out;
}

// Row patterns make_row knows: random, few values, all equal, ascending, top bits, masked.
inline constexpr int kRowPatterns = 6;

template <typename U>
std::vector<U> make_row(std::mt19937_64& rng, int64_t n, int pattern) {
  std::vector<U> row(static_cast<size_t>(n));
  const U few[3] = {U(rng()), U(rng()), U(rng())};
  for (int64_t i = 0; i < n; ++i) {
    switch (pattern) {
      case 0: row[size_t(i)] = U(rng()); break;
      case 1: row[size_t(i)] = few[rng() % 3]; break;
      case 2: row[size_t(i)] = few[0]; break;
      case 3: row[size_t(i)] = U(i * 3 + 1); break;          // ascending bits
      case 4: row[size_t(i)] = U((rng() % 8) << (sizeof(U) * 8 - 4)); break;  // top bits only
      default: row[size_t(i)] = i % 16 == 5 ? U(rng()) : few[0]; break;  // one tied value but a few (a masked row)
    }
  }
  return row;
}

// A row made against a sample: the elements where sampled[i] is set high and
// the rest low (sampled_high), or the reverse; random bits below the top one.
template <KeyKind Kind, typename U>
std::vector<U> make_row_against_sample(std::mt19937_64& rng, const std::vector<char>& sampled, bool sampled_high) {
  constexpr U kTop = U(U(1) << (sizeof(U) * 8 - 1));
  std::vector<U> row(sampled.size());
  for (size_t i = 0; i < row.size(); ++i) {
    const U low = U(U(rng()) & U(kTop - 1));
    const bool high = (sampled[i] != 0) == sampled_high;
    // The sign bit: set ranks high for unsigned keys, low for the others.
    row[i] = high == (Kind == KeyKind::kUnsigned) ? U(kTop | low) : low;
  }
  return row;
}

template <typename U>
void report(bool ok, const char* what, int64_t n, int64_t k, int pattern, int extra,
            int64_t len = -1) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAIL %s bytes=%d n=%lld k=%lld pattern=%d extra=%d len=%lld\n", what,
                int(sizeof(U)), (long long)n, (long long)k, pattern, extra,
                (long long)(len < 0 ? n : len));
  }
}

// ---- warp sort: lanes emulated one after another --------------------------
template <KeyKind Kind, typename U, int K>
bool sim_warp_sort(const std::vector<U>& row, int64_t len, int64_t k, bool vectorised) {
  using P = typename WarpSortPacked<U>::type;
  constexpr int kVec = int(16 / sizeof(U));
  constexpr int kElems = K > kVec ? K : kVec;
  const KeyCodec<U> codec = make_key_codec<Kind, U>();
  const int n = int(row.size());
  const int lanes = warp_sort_lanes_per_row(n);
  std::vector<std::vector<P>> lists(size_t(lanes), std::vector<P>(K, P(0)));
  P prune = 0;
  const int per_iteration = lanes * kElems;
  const int iterations = (n + per_iteration - 1) / per_iteration;
  if (lanes == kWarpSize && iterations > 1) {  // lane-maxima pre-pass
    std::vector<P> maxima(size_t(lanes), P(0));
    for (int it = 0; it < iterations; ++it) {
      for (int lane = 0; lane < lanes; ++lane) {
        P chunk[kElems];
        load_packed_chunk<U, P, kElems>(row.data(), int(len), vectorised, it, lane, lanes, true, codec, chunk);
        for (int i = 0; i < kElems; ++i) maxima[size_t(lane)] = std::max(maxima[size_t(lane)], chunk[i]);
      }
    }
    std::sort(maxima.begin(), maxima.end(), [](P a, P b) { return a > b; });
    const P m = maxima[size_t(k - 1)];
    prune = m > 0 ? P(m - 1) : P(0);
  }
  for (int it = 0; it < iterations; ++it) {
    for (int lane = 0; lane < lanes; ++lane) {
      P chunk[kElems];
      load_packed_chunk<U, P, kElems>(row.data(), int(len), vectorised, it, lane, lanes, true, codec, chunk);
      P list[K];
      std::copy(lists[size_t(lane)].begin(), lists[size_t(lane)].end(), list);
      absorb_chunk<K, kElems>(list, chunk, prune);
      std::copy(list, list + K, lists[size_t(lane)].begin());
    }
    if (iterations > 1) {
      P m = 0;
      for (int lane = 0; lane < lanes; ++lane) {
        P list[K];
        std::copy(lists[size_t(lane)].begin(), lists[size_t(lane)].end(), list);
        m = std::max(m, select_at(list, int(k - 1)));
      }
      prune = std::max(prune, m);
    }
  }
  for (int m = 1; m < lanes; m *= 2) {
    auto next = lists;
    for (int lane = 0; lane < lanes; ++lane) {
      P a[K], b[K];
      std::copy(lists[size_t(lane)].begin(), lists[size_t(lane)].end(), a);
      std::copy(lists[size_t(lane ^ m)].begin(), lists[size_t(lane ^ m)].end(), b);
      merge_top_desc(a, b);
      std::copy(a, a + K, next[size_t(lane)].begin());
    }
    lists = next;
  }
  for (int lane = 1; lane < lanes; ++lane) {
    if (lists[size_t(lane)] != lists[0]) return false;
  }
  return write_outputs<Kind, U>(lists[0], k) == oracle<Kind>(row, len, k);
}

template <KeyKind Kind, typename U>
bool sim_warp_sort_any(const std::vector<U>& row, int64_t len, int64_t k, bool vectorised) {
  switch (next_pow2(k)) {
    case 1: return sim_warp_sort<Kind, U, 1>(row, len, k, vectorised);
    case 2: return sim_warp_sort<Kind, U, 2>(row, len, k, vectorised);
    case 4: return sim_warp_sort<Kind, U, 4>(row, len, k, vectorised);
    case 8: return sim_warp_sort<Kind, U, 8>(row, len, k, vectorised);
    case 16: return sim_warp_sort<Kind, U, 16>(row, len, k, vectorised);
    case 32: return sim_warp_sort<Kind, U, 32>(row, len, k, vectorised);
  }
  return false;
}

// ---- warp select (threshold filter): lanes of one row group emulated ------
// Mirrors warp_select_topk_kernel: the same slot layout, loads, group maxima,
// candidate masks, tiers and ranking; `capacity` forces the fallback tiers.
// tier_out: 1, 2 or 3, the tier that produced the answer.
template <KeyKind Kind, typename U, int E>
bool sim_warp_select_e(const std::vector<U>& row, int64_t len, int64_t k, bool vectorised,
                       int capacity, int64_t elems_per_lane, int* tier_out) {
  using M = WsMask<E>;
  constexpr int kVec = int(16 / sizeof(U));
  const KeyCodec<U> codec = make_key_codec<Kind, U>();
  const int n = int(row.size());
  const int L = ws_lanes(n, k, elems_per_lane);
  const int log2_lanes = bit_width(uint64_t(L)) - 1;  // L is a power of two
  const bool two = ws_two_groups(L, k);
  if (ws_slots(n, L, kVec) != E) return false;
  std::vector<std::array<uint32_t, E>> keys(static_cast<size_t>(L));
  std::vector<int> nvalid(size_t(L), 0);
  std::vector<M> vmask(static_cast<size_t>(L));
  for (int gl = 0; gl < L; ++gl) {
    uint32_t key[E];
    ws_load_keys<U, E>(row.data(), int(len), vectorised, gl, L, true, WsTotalOrderKeys<U>{codec}, key);
    std::copy(key, key + E, keys[size_t(gl)].begin());
    nvalid[size_t(gl)] = ws_valid_slots(int(len), gl, log2_lanes, kVec, vectorised, E);
    vmask[size_t(gl)] = ws_prefix_mask<E>(nvalid[size_t(gl)]);
    // Valid slots are exactly the lane's indices below len; invalid slots hold key 0.
    for (int s = 0; s < E; ++s) {
      const int i = ws_slot_index(s, gl, L, kVec, vectorised);
      if ((s < nvalid[size_t(gl)]) != (i < len)) return false;
      if (s < nvalid[size_t(gl)]) {
        if (key[s] != uint32_t(codec.key(row[size_t(i)]))) return false;
      } else if (key[s] != 0) {
        return false;
      }
    }
  }
  auto threshold = [&](auto maxima_of) {
    using T = decltype(maxima_of(0).first);
    std::vector<T> all;
    for (int gl = 0; gl < L; ++gl) {
      const auto m = maxima_of(gl);
      if (two) {
        all.push_back(m.first);
        all.push_back(m.second);
      } else {
        all.push_back(std::max(m.first, m.second));
      }
    }
    if (sizeof(T) == 4 && ws_threshold_by_warp_maxima(log2_lanes, two, k)) {
      // ws_warp_kth_or_lower: k - 1 rounds drop every lane at the maximum.
      for (int64_t r = 1; r < k; ++r) {
        const T m = *std::max_element(all.begin(), all.end());
        for (T& v : all) v = v == m ? T(0) : v;
      }
      return *std::max_element(all.begin(), all.end());
    }
    std::sort(all.begin(), all.end(), [](T a, T b) { return a > b; });
    return all[size_t(k - 1)];
  };
  std::vector<M> cand(static_cast<size_t>(L));
  auto count = [&]() {
    int total = 0;
    for (int gl = 0; gl < L; ++gl) total += ws_popc(cand[size_t(gl)]);
    return total;
  };
  int tier = 1;
  {
    const uint32_t t = threshold([&](int gl) {
      uint32_t key[E];
      std::copy(keys[size_t(gl)].begin(), keys[size_t(gl)].end(), key);
      uint32_t m0, m1;
      ws_key_maxima(key, m0, m1);
      return std::make_pair(m0, m1);
    });
    for (int gl = 0; gl < L; ++gl) {
      uint32_t key[E];
      std::copy(keys[size_t(gl)].begin(), keys[size_t(gl)].end(), key);
      cand[size_t(gl)] = ws_key_candidates(key, t) & vmask[size_t(gl)];
    }
  }
  if (ws_redo_with_packed_threshold(count(), k, capacity)) {
    tier = 2;
    const uint64_t t = threshold([&](int gl) {
      uint32_t key[E];
      std::copy(keys[size_t(gl)].begin(), keys[size_t(gl)].end(), key);
      uint64_t m0, m1;
      ws_packed_maxima(key, gl, L, kVec, vectorised, nvalid[size_t(gl)], m0, m1);
      return std::make_pair(m0, m1);
    });
    for (int gl = 0; gl < L; ++gl) {
      uint32_t key[E];
      std::copy(keys[size_t(gl)].begin(), keys[size_t(gl)].end(), key);
      cand[size_t(gl)] = ws_packed_candidates(key, gl, L, kVec, vectorised, t) & vmask[size_t(gl)];
    }
  }
  std::vector<uint64_t> result(size_t(k), 0);
  if (count() > capacity) {
    tier = 3;
    uint64_t prev = 0;
    for (int64_t r = 0; r < k; ++r) {
      uint64_t best = 0;
      for (int gl = 0; gl < L; ++gl) {
        const auto key_of = [&](int s) { return keys[size_t(gl)][size_t(s)]; };
        best = std::max(best, ws_best_below<E>(key_of, gl, L, kVec, vectorised, nvalid[size_t(gl)], prev, r == 0));
      }
      result[size_t(r)] = best;
      prev = best;
    }
  } else {
    std::vector<uint64_t> seg;  // lane-major compaction, as the prefix sum orders it
    for (int gl = 0; gl < L; ++gl) {
      M c = cand[size_t(gl)];
      while (c != 0) {
        const int s = ws_lowest_bit(c);
        c &= c - M(1);
        const uint32_t i = uint32_t(ws_slot_index(s, gl, L, kVec, vectorised));
        seg.push_back(ws_pack(uint32_t(codec.key(row[i])), i));
      }
    }
    // Fewer candidates than k only when the row is shorter than k, and
    // then every element of it is one.
    const int64_t total = int64_t(seg.size());
    if (total < std::min(k, len) || (total < k && total != len)) return false;
    // The kernel's loop: candidate j writes itself at its rank, slots
    // [total, k) are padding; every output slot written exactly once.
    std::vector<int> hits(size_t(k), 0);
    for (int64_t j = 0; j < std::max(total, k); ++j) {
      uint64_t p = 0;
      int64_t rank = j;
      if (j < total) {
        p = seg[size_t(j)];
        rank = 0;
        for (uint64_t q : seg) rank += q > p ? 1 : 0;
      }
      if (rank < k) {
        result[size_t(rank)] = p;
        ++hits[size_t(rank)];
      }
    }
    for (int h : hits) if (h != 1) return false;
  }
  *tier_out = tier;
  return write_outputs<Kind, U>(result, k) == oracle<Kind>(row, len, k);
}

template <KeyKind Kind, typename U>
bool sim_warp_select(const std::vector<U>& row, int64_t len, int64_t k, bool vectorised,
                     int capacity, int* tier, int64_t epl = kWarpSelectElemsPerLane) {
  constexpr int kVec = int(16 / sizeof(U));
  const int n = int(row.size());
  switch (ws_slots(n, ws_lanes(n, k, epl), kVec)) {
    case 4: if constexpr (kVec <= 4) return sim_warp_select_e<Kind, U, 4>(row, len, k, vectorised, capacity, epl, tier); break;
    case 8: if constexpr (kVec <= 8) return sim_warp_select_e<Kind, U, 8>(row, len, k, vectorised, capacity, epl, tier); break;
    case 12: if constexpr (kVec <= 4) return sim_warp_select_e<Kind, U, 12>(row, len, k, vectorised, capacity, epl, tier); break;
    case 16: return sim_warp_select_e<Kind, U, 16>(row, len, k, vectorised, capacity, epl, tier);
    case 24: if constexpr (kVec <= 8) return sim_warp_select_e<Kind, U, 24>(row, len, k, vectorised, capacity, epl, tier); break;
    case 32: return sim_warp_select_e<Kind, U, 32>(row, len, k, vectorised, capacity, epl, tier);
    case 48: return sim_warp_select_e<Kind, U, 48>(row, len, k, vectorised, capacity, epl, tier);
    case 64: return sim_warp_select_e<Kind, U, 64>(row, len, k, vectorised, capacity, epl, tier);
  }
  return false;
}

int g_tiers[4] = {0, 0, 0, 0};
int g_natural_tier3 = 0;  // tier 3 at the kernel's own capacity

// ---- radix select: the row-per-block state machine, sequentially ----------
// The digit choice emulates choose_radix_digit's split of bins over threads.
RadixChoice sim_choose(const std::vector<uint32_t>& hist, int bins, uint32_t k_left, int threads) {
  const int per = (bins + threads - 1) / threads;
  uint32_t above = 0;
  RadixChoice found{~0u, 0, 0};
  int finders = 0;
  for (int t = 0; t < threads; ++t) {
    const int top = bins - t * per, bottom = top - per;
    uint32_t mine = 0;
    for (int b = top - 1; b >= bottom && b >= 0; --b) mine += hist[size_t(b)];
    if (above < k_left && k_left <= above + mine) {
      ++finders;
      uint32_t acc = above;
      for (int b = top - 1; b >= bottom && b >= 0; --b) {
        if (acc + hist[size_t(b)] >= k_left) {
          found = RadixChoice{uint32_t(b), acc, hist[size_t(b)]};
          break;
        }
        acc += hist[size_t(b)];
      }
    }
    above += mine;
  }
  if (finders != 1) found.digit = ~0u;
  return found;
}

// Mirrors radix_select_row_in_block on a row whose first len elements take
// part (index_bits from the padded length n, as the kernels do).
template <KeyKind Kind, typename U>
bool sim_radix(const std::vector<U>& row, int64_t len, int64_t k, int64_t capacity, int* scans_out) {
  using P = typename RadixPacked<U>::type;
  using Pack = KeyIndexPacking<U, P>;
  const KeyCodec<U> codec = make_key_codec<Kind, U>();
  const int64_t n = int64_t(row.size());
  const int index_bits = radix_index_bits(n);
  const int64_t take = std::min(k, len);
  RadixState<P> st = radix_initial_state<P>(int(sizeof(U) * 8), len, take, capacity);
  std::vector<P> packed(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) packed[size_t(i)] = Pack::pack(codec.key(row[size_t(i)]), uint32_t(i));
  std::vector<P> cand[2], survivors;
  int scans = 0;
  const int max_scans = radix_field_count(int(sizeof(U) * 8), index_bits) + 1;
  for (;;) {
    if (++scans > max_scans) return false;
    const bool gather = st.done != 0;
    const RadixField next = next_radix_field(st.lo, index_bits);
    const int bins = 1 << (next.hi - next.lo);
    std::vector<uint32_t> hist(size_t(bins), 0);
    std::vector<P> out;
    const std::vector<P>& src = st.source < 0 ? packed : cand[st.source];
    const size_t count = st.source_count;  // the row's length or the buffer's count
    if (st.source < 0 && int64_t(count) != len) return false;
    if (st.source >= 0 && cand[st.source].size() != count) return false;
    for (size_t i = 0; i < count; ++i) {
      const P e = src[i];
      const bool in = prefix_matches(e, st.prefix, st.hi);
      const uint32_t d = field_of(e, st.lo, st.hi);
      if (in && (gather ? d >= st.digit : d > st.digit)) survivors.push_back(e);
      if (gather) continue;
      if (in && d == st.digit) {
        ++hist[field_of(e, next.lo, next.hi)];
        if (st.compact_to >= 0) out.push_back(e);
      }
    }
    if (gather) break;
    if (st.compact_to >= 0) {
      if (int64_t(out.size()) > capacity || out.size() != st.tied) return false;
      cand[st.compact_to] = out;
    }
    const RadixChoice c = sim_choose(hist, bins, st.k_left, kRadixThreads);
    if (c.digit == ~0u) return false;
    st = radix_advance(st, next, c, capacity);
  }
  if (int64_t(survivors.size()) != take) return false;
  survivors.resize(size_t(k), P(0));  // pad_survivors
  std::sort(survivors.begin(), survivors.end(), [](P a, P b) { return a > b; });
  *scans_out = scans;
  return write_outputs<Kind, U>(survivors, k) == oracle<Kind>(row, len, k);
}

// ---- block bitonic sort (topk_bitonic.cuh) ---------------------------------
// Emulates block_bitonic_sort_desc with `threads` threads: registers v[t][e]
// for positions 8t + e, the shuffle stages as reads of lane t ^ (stride / 8)
// within the warp, the exchange stages through a shared array at the
// block_sort_slot positions. s[0:count) is sorted in place.
template <typename P>
void sim_block_bitonic_sort_desc(std::vector<P>& s, int count, int threads) {
  constexpr int kE = kBlockSortPerThread;
  const int n = std::max(count, kBlockSortWarpSpan);
  std::vector<std::array<P, kE>> v(static_cast<size_t>(threads));
  auto active = [&](int t) { return t * kE < n; };
  for (int t = 0; t < threads; ++t) {
    for (int e = 0; e < kE; ++e) v[size_t(t)][size_t(e)] = active(t) && t * kE + e < count ? s[size_t(t * kE + e)] : P(0);
  }
  std::vector<P> shared(s.size());
  for (int size = 2; size <= n; size *= 2) {
    for (int stride = size / 2; stride >= kE; stride /= 2) {
      const auto before = v;  // every thread reads its partner's values of the previous stage
      if (stride >= kBlockSortWarpSpan) {
        for (int t = 0; t < threads; ++t) {
          if (!active(t)) continue;
          for (int e = 0; e < kE; ++e) shared.at(size_t(block_sort_slot(t * kE + e))) = before[size_t(t)][size_t(e)];
        }
      }
      for (int t = 0; t < threads; ++t) {
        if (!active(t)) continue;
        const bool keep_max = bitonic_keeps_max(t * kE, stride, size);
        for (int e = 0; e < kE; ++e) {
          P o;
          if (stride >= kBlockSortWarpSpan) {
            o = shared.at(size_t(block_sort_slot((t * kE + e) ^ stride)));
          } else {
            const int partner = t ^ (stride / kE);
            if (partner / kWarpSize != t / kWarpSize) std::abort();  // a shuffle leaves the warp
            o = before[size_t(partner)][size_t(e)];
          }
          P& x = v[size_t(t)][size_t(e)];
          x = keep_max ? std::max(x, o) : std::min(x, o);
        }
      }
    }
    for (int t = 0; t < threads; ++t) {
      if (!active(t)) continue;
      auto& r = v[size_t(t)];
      for (int stride = kE / 2; stride > 0; stride /= 2) {
        if (stride >= size) continue;
        for (int e = 0; e < kE; ++e) {
          if ((e & stride) != 0) continue;
          const P hi = std::max(r[size_t(e)], r[size_t(e + stride)]), lo = std::min(r[size_t(e)], r[size_t(e + stride)]);
          const bool desc = ((t * kE + e) & size) == 0;
          r[size_t(e)] = desc ? hi : lo;
          r[size_t(e + stride)] = desc ? lo : hi;
        }
      }
    }
  }
  for (int t = 0; t < threads; ++t) {
    for (int e = 0; e < kE; ++e) {
      if (active(t) && t * kE + e < count) s[size_t(t * kE + e)] = v[size_t(t)][size_t(e)];
    }
  }
}

// The bucket counts of a[] over [lo, 2^shift buckets) laid out from the top
// (block_scatter_rank_buckets): start[b] = the values in buckets above b.
// False when a bucket holds more than kRankMaxBucket.
bool sim_rank_bucket_starts(const std::vector<uint64_t>& a, uint64_t lo, int shift, int buckets,
                            std::vector<uint32_t>* start) {
  std::vector<uint32_t> count(size_t(buckets), 0);
  for (uint64_t e : a) {
    const uint32_t b = rank_bucket(e, lo, shift);
    if (b >= uint32_t(buckets)) std::abort();
    ++count[b];
  }
  if (*std::max_element(count.begin(), count.end()) > kRankMaxBucket) return false;
  start->assign(size_t(buckets), 0);
  uint32_t acc = 0;
  for (int b = buckets - 1; b >= 0; --b) {
    (*start)[size_t(b)] = acc;
    acc += count[size_t(b)];
  }
  return true;
}

// Mirrors block_order_by_rank_desc on a block of `threads`: slots[pos] = the
// value of rank pos for every pos below min(c, wanted) (bucketed, the kernel
// fills no others), computed the kernel's way (counting for c <=
// rank_by_counting_max_c; else rank_bucket_bits(threads) buckets from the
// top, each value counting the members of its bucket above it). The buckets
// span [lo, the largest] (the threshold kernel passes T as lo; none: the
// smallest value). False when a bucket is too full (the kernel then sorts).
bool sim_block_rank_desc(const std::vector<uint64_t>& a, int threads, int wanted, std::vector<uint64_t>* slots,
                         std::optional<uint64_t> lo_bound = std::nullopt) {
  const int c = int(a.size());
  slots->assign(size_t(c), 0);
  std::vector<int> filled(size_t(c), 0);
  auto put = [&](uint64_t e, int pos) {
    if (pos < 0 || pos >= c || filled[size_t(pos)]++) std::abort();  // ranks must be a permutation
    (*slots)[size_t(pos)] = e;
  };
  if (c <= rank_by_counting_max_c(threads)) {
    for (uint64_t e : a) put(e, int(std::count_if(a.begin(), a.end(), [&](uint64_t o) { return o > e; })));
    return true;
  }
  const uint64_t smallest = *std::min_element(a.begin(), a.end());
  const uint64_t lo = lo_bound.value_or(smallest), hi = *std::max_element(a.begin(), a.end());
  if (lo > smallest) std::abort();  // T bounds every candidate
  const int bits = rank_bucket_bits(threads), buckets = 1 << bits;
  const int shift = rank_bucket_shift(lo, hi, bits);
  std::vector<uint32_t> start;
  if (!sim_rank_bucket_starts(a, lo, shift, buckets, &start)) return false;
  // The scatter, then each value of spill[0, wanted + kRankMaxBucket) whose
  // bucket's span [end[b + 1], end[b]) begins below wanted ranks within it.
  std::vector<uint32_t> end = start;
  std::vector<uint64_t> spill(size_t(c), 0);
  for (uint64_t e : a) spill[end[rank_bucket(e, lo, shift)]++] = e;
  const int stop = wanted < c - int(kRankMaxBucket) ? wanted + int(kRankMaxBucket) : c;
  for (int p = 0; p < stop; ++p) {
    const uint64_t e = spill[size_t(p)];
    const uint32_t b = rank_bucket(e, lo, shift);
    const int begin = b + 1 < uint32_t(buckets) ? int(end[b + 1]) : 0;
    if (begin >= wanted) continue;
    int rank = begin;
    for (int j = begin; j < int(end[b]); ++j) rank += spill[size_t(j)] > e ? 1 : 0;
    put(e, rank);
  }
  for (int pos = 0; pos < std::min(c, wanted); ++pos) {
    if (!filled[size_t(pos)]) std::abort();  // every slot below wanted filled
  }
  return true;
}

// Mirrors block_rank_desc split over `parts` blocks (the cluster kernel's
// rank): every part holds the same c values but scatters them into its
// buckets in its own order (the kernel's shared-memory atomics), then emits
// the values of the buckets whose span begins in its share of [0, min(c,
// wanted)), scanning spill positions up to kRankMaxBucket past that share.
// out[pos] collects what the parts emit for pos < wanted. False when a
// bucket is too full (the kernel then sorts).
bool sim_block_rank_parts(const std::vector<uint64_t>& a, int wanted, int parts, uint64_t lo, uint64_t hi,
                          std::mt19937_64& rng, std::vector<std::vector<uint64_t>>* out) {
  const int c = int(a.size());
  out->assign(size_t(wanted), {});
  if (c <= rank_by_counting_max_c(kClusterThreads)) {
    for (int part = 0; part < parts; ++part) {
      const int first = int(int64_t(c) * part / parts), last = int(int64_t(c) * (part + 1) / parts);
      for (int i = first; i < last; ++i) {
        const uint64_t e = a[size_t(i)];
        const int pos = int(std::count_if(a.begin(), a.end(), [&](uint64_t o) { return o > e; }));
        if (pos < wanted) (*out)[size_t(pos)].push_back(e);
      }
    }
    return true;
  }
  const int bits = rank_bucket_bits(kClusterThreads), buckets = 1 << bits;
  const int shift = rank_bucket_shift(lo, hi, bits);
  std::vector<uint32_t> start;
  if (!sim_rank_bucket_starts(a, lo, shift, buckets, &start)) return false;
  const int covered = std::min(c, wanted);
  for (int part = 0; part < parts; ++part) {
    std::vector<uint64_t> order = a;  // this part's scatter order
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<uint32_t> end = start;
    std::vector<uint64_t> spill(size_t(c), 0);
    for (uint64_t e : order) spill[end[rank_bucket(e, lo, shift)]++] = e;
    const int first = int(int64_t(covered) * part / parts), last = int(int64_t(covered) * (part + 1) / parts);
    const int stop = std::min(c, last + int(kRankMaxBucket));
    for (int p = first; p < stop; ++p) {
      const uint64_t e = spill[size_t(p)];
      const uint32_t b = rank_bucket(e, lo, shift);
      const int begin = b + 1 < uint32_t(buckets) ? int(end[b + 1]) : 0;
      if (begin < first || begin >= last) continue;
      int pos = begin;
      for (int j = begin; j < int(end[b]); ++j) pos += spill[size_t(j)] > e ? 1 : 0;
      if (pos < wanted) (*out)[size_t(pos)].push_back(e);
    }
  }
  return true;
}

// The split rank against a sort: c distinct values (spread, or dense: a
// few in most buckets), every rank below wanted emitted exactly once with its value,
// for 1..8 parts, wanted = c (the radix select's candidates) and k < c (the
// sampled threshold's), and bounds that are the extremes or only bound them.
void check_rank_parts(std::mt19937_64& rng) {
  int ranked = 0, too_full = 0;
  for (int c : {1, 7, 256, 257, 1000, 2049, 3100, 4096}) {
    for (int spread = 0; spread < 2; ++spread) {
      std::vector<uint64_t> a;
      while (int(a.size()) < c) {
        // Dense values share buckets (a few members each); spread ones rarely.
        const uint64_t e = spread ? (rng() | 1) : (rng() % (uint64_t(c) * 8)) << 1 | 1;
        if (std::find(a.begin(), a.end(), e) == a.end()) a.push_back(e);
      }
      std::vector<uint64_t> sorted = a;
      std::sort(sorted.begin(), sorted.end(), std::greater<uint64_t>());
      const uint64_t lo = sorted.back() - (spread ? sorted.back() / 2 : 0), hi = sorted.front();
      for (int wanted : {c, std::max(1, c * 2 / 3)}) {
        for (int parts = 1; parts <= kClusterMaxBlocks; ++parts) {
          std::vector<std::vector<uint64_t>> out;
          if (!sim_block_rank_parts(a, wanted, parts, lo, hi, rng, &out)) {
            ++too_full;
            continue;
          }
          bool ok = true;
          for (int pos = 0; pos < wanted; ++pos) {
            ok &= out[size_t(pos)].size() == 1 && out[size_t(pos)][0] == sorted[size_t(pos)];
          }
          ++ranked;
          report<uint32_t>(ok, "block_rank_desc(parts)", c, wanted, spread, parts);
        }
      }
    }
  }
  std::printf("split ranks: ranked %d, a bucket too full (the sort) %d\n", ranked, too_full);
}

// The emulated block sort against std::sort: every power-of-two count the
// kernels use (1 .. 8 * 512), random values with repeats and zero padding.
void check_block_sort(std::mt19937_64& rng) {
  for (int count = 1; count <= kBlockSortPerThread * kRadixThreads; count *= 2) {
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<uint64_t> s(static_cast<size_t>(count), 0);
      const int real = trial == 0 ? count : int(rng() % uint64_t(count)) + 1;
      for (int i = 0; i < count; ++i) s[size_t(i)] = i < real ? (trial == 3 ? rng() % 5 + 1 : rng() | 1) : 0;
      std::vector<uint64_t> want = s;
      std::sort(want.begin(), want.end(), std::greater<uint64_t>());
      sim_block_bitonic_sort_desc(s, count, kRadixThreads);
      report<uint32_t>(s == want, "block_sort", count, real, trial, 0);
    }
  }
}

// ---- threshold row per block (topk_threshold.cuh) --------------------------
// The device the simulation's slot choices assume (threshold_row_slots): an
// H100's or H200's SMs, and rows enough for the many-row choice.
constexpr int kSimSms = 132;
constexpr int64_t kSimRows = int64_t(1) << 20;
// Mirror of block_kth_largest: 8-bit digits from the highest bit where the
// values differ, stop when the chosen bucket is exactly what is still needed
// (or the digits run out, for repeated zeros), answer = the bucket's minimum.
uint64_t sim_kth_largest(const std::vector<uint64_t>& a, uint32_t k, int* passes, uint32_t k_most = 0) {
  const uint64_t lo = *std::min_element(a.begin(), a.end());
  const uint64_t hi = *std::max_element(a.begin(), a.end());
  *passes = 0;
  if (lo == hi) return hi;
  int hs = threshold_select_top(lo, hi);
  uint64_t prefix = hs == 64 ? 0 : (hi >> hs) << hs;
  uint32_t k_left = k;
  int shift = hs;
  for (int pass = 0;; ++pass) {
    ++*passes;
    shift = threshold_select_shift(hs);
    std::vector<uint32_t> h(kThresholdSelectBins, 0);
    for (uint64_t e : a) {
      if (hs == 64 || (e >> hs) == (prefix >> hs)) ++h[uint32_t(e >> shift) & (kThresholdSelectBins - 1)];
    }
    // The warp's lanes own 8 bins each from the top; emulate the scan.
    uint32_t digit = ~0u, above_sel = 0, count_sel = 0;
    constexpr int kPer = kThresholdSelectBins / kWarpSize;
    uint32_t incl = 0;
    for (int lane = 0; lane < kWarpSize; ++lane) {
      const int top = kThresholdSelectBins - 1 - lane * kPer;
      uint32_t mine = 0;
      for (int j = 0; j < kPer; ++j) mine += h[size_t(top - j)];
      const uint32_t above = incl;
      incl += mine;
      if (above < k_left && k_left <= incl) {
        uint32_t acc = above;
        for (int j = 0; j < kPer; ++j) {
          const uint32_t c = h[size_t(top - j)];
          if (acc + c >= k_left) {
            if (digit != ~0u) return ~0ull;  // two finders: broken
            digit = uint32_t(top - j);
            above_sel = acc;
            count_sel = c;
            break;
          }
          acc += c;
        }
      }
    }
    if (digit == ~0u || pass >= kThresholdSelectPasses) return ~0ull;
    prefix |= uint64_t(digit) << shift;
    k_left -= above_sel;
    hs = shift;
    if (k_most > k && k - k_left + count_sel <= k_most) return prefix;
    if (count_sel == k_left || shift == 0) break;
  }
  uint64_t m = ~0ull;
  for (uint64_t e : a) {
    if ((e >> shift) == (prefix >> shift) && e < m) m = e;
  }
  return m;
}

int g_threshold_paths[3] = {0, 0, 0};  // 1: candidates sorted, 2: radix fallback
int64_t g_threshold_max_ratio_x100 = 0;
int g_threshold_sampled[2] = {0, 0};  // rows whose sampled T was kept, missed
int64_t g_threshold_sampled_max_c = 0;  // most candidates of a kept sampled T, random rows
int g_threshold_sample_passes[9] = {};  // sampled selects by passes
int g_threshold_sorted = 0;  // rows whose candidates took the bitonic fallback of the rank  // worst candidates / k (x100) on the sorted path, random rows

template <KeyKind Kind, typename U, int kThreads, int kR>
bool sim_threshold_rank(const std::vector<U>& row, int64_t len, int64_t k, uint64_t t, int pattern);

// Emulates threshold_topk_row_per_block_kernel<U, kThreads, kR, kUnroll> on
// one row whose first `head` elements come before the first 16-byte boundary
// and whose first len elements take part.
template <KeyKind Kind, typename U, int kThreads, int kR, int kUnroll>
bool sim_threshold_r(const std::vector<U>& row, int64_t len, int64_t k, int64_t head_in,
                     int pattern) {
  using P = uint64_t;
  using Pack = KeyIndexPacking<U, P>;
  constexpr int kG = kThreads * kR;
  constexpr int kVec = int(16 / sizeof(U));
  const KeyCodec<U> codec = make_key_codec<Kind, U>();
  const int64_t n = int64_t(row.size());
  auto packed = [&](int64_t i) { return Pack::pack(codec.key(row[size_t(i)]), uint32_t(i)); };
  auto count_at_least = [&](P t) {
    int64_t c = 0;
    for (int64_t i = 0; i < len; ++i) c += packed(i) >= t;
    return c;
  };
  // 0. A sampled threshold (whole rows; the host's threshold_sample):
  // kept when it leaves k..G candidates, else the radix select.
  const ThresholdSample window = len == n ? threshold_sample(n, k, kG) : ThresholdSample{0, 0};
  if (window.rank > 0) {
    constexpr int kChunks = kG / kThresholdSampleChunk;
    std::vector<P> sample;
    const uint64_t step = threshold_sample_step(kChunks, len);
    for (int c = 0; c < kChunks; ++c) {
      const int64_t start = threshold_sample_chunk_start(c, step);
      if (start < 0 || start + kThresholdSampleChunk > len) return false;
      for (int l = 0; l < kThresholdSampleChunk; ++l) sample.push_back(packed(start + l));
    }
    int passes = 0;
    const P t = sim_kth_largest(sample, uint32_t(window.rank), &passes, uint32_t(window.most));
    g_threshold_sample_passes[std::min(passes, 8)]++;
    const int64_t at_least_t = std::count_if(sample.begin(), sample.end(), [&](P e) { return e >= t; });
    if (at_least_t < window.rank || at_least_t > window.most) return false;
    const int64_t c = count_at_least(t);
    if (c >= k && c <= kG) {
      ++g_threshold_sampled[0];
      if (pattern == 0) g_threshold_sampled_max_c = std::max(g_threshold_sampled_max_c, c);
      return sim_threshold_rank<Kind, U, kThreads, kR>(row, len, k, t, pattern);
    }
    ++g_threshold_sampled[1];
    if (std::getenv("SIM_VERBOSE")) std::printf("sample missed n=%lld k=%lld c=%lld pattern=%d\n", (long long)n, (long long)k, (long long)c, pattern);
    const int64_t survivors = next_pow2(k);
    if (survivors > kG) return false;
    int scans = 0;
    return sim_radix<Kind, U>(row, len, k, (kG - survivors) / 2, &scans);
  }
  // 1. Group maxima, in the walk order of walk_row_steps.
  std::vector<P> a(size_t(kG), P(0));
  auto visit = [&](int tid, int64_t i, int pos) {
    P& m = a[size_t((pos % kR) * kThreads + tid)];
    m = std::max(m, packed(i));
  };
  const int64_t head = std::min(head_in, len);
  for (int tid = 0; tid < kThreads; ++tid) if (tid < head) visit(tid, tid, 0);
  const int64_t nvec = (len - head) / kVec;
  for (int64_t v0 = 0; v0 < nvec; v0 += int64_t(kThreads) * kUnroll) {
    for (int tid = 0; tid < kThreads; ++tid) {
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = v0 + int64_t(u) * kThreads + tid;
        if (v >= nvec) continue;
        for (int e = 0; e < kVec; ++e) visit(tid, head + v * kVec + e, u * kVec + e);
      }
    }
  }
  for (int tid = 0; tid < kThreads; ++tid) {
    const int64_t i = head + nvec * kVec + tid;
    if (i < len) visit(tid, i, 0);
  }
  // 2. T, checked against a plain selection.
  int passes = 0;
  const P t = sim_kth_largest(a, uint32_t(k), &passes);
  std::vector<P> sorted_a = a;
  std::sort(sorted_a.begin(), sorted_a.end(), std::greater<P>());
  if (t != sorted_a[size_t(k - 1)]) return false;
  return sim_threshold_rank<Kind, U, kThreads, kR>(row, len, k, t, pattern);
}

// Steps 3-4 of the threshold kernel for T = t: the candidates, their rank (or
// the radix fallback past G).
template <KeyKind Kind, typename U, int kThreads, int kR>
bool sim_threshold_rank(const std::vector<U>& row, int64_t len, int64_t k, uint64_t t, int pattern) {
  using P = uint64_t;
  using Pack = KeyIndexPacking<U, P>;
  constexpr int kG = kThreads * kR;
  const KeyCodec<U> codec = make_key_codec<Kind, U>();
  const int64_t n = int64_t(row.size());
  auto packed = [&](int64_t i) { return Pack::pack(codec.key(row[size_t(i)]), uint32_t(i)); };
  // 3. Candidates.
  std::vector<P> cand;
  for (int64_t i = 0; i < len; ++i) if (packed(i) >= t) cand.push_back(packed(i));
  const int64_t c = int64_t(cand.size());
  if (c < std::min(k, len)) return false;  // the guarantee
  if (c < k && c != len) return false;     // short rows: every element is a candidate
  if (c <= kG) {
    ++g_threshold_paths[1];
    if (pattern == 0 && len >= 4 * kG) {
      g_threshold_max_ratio_x100 = std::max<int64_t>(g_threshold_max_ratio_x100, c * 100 / k);
    }
    std::vector<P> slots;
    // False where a bucket is too full to rank: the kernel then sorts.
    if (!sim_block_rank_desc(cand, kThreads, int(k), &slots, t != 0 ? std::optional<P>(t) : std::nullopt)) {
      ++g_threshold_sorted;
      if (std::getenv("SIM_VERBOSE")) std::printf("rank fallback n=%lld k=%lld c=%lld pattern=%d\n", (long long)n, (long long)k, (long long)c, pattern);
      const int count = int(next_pow2(std::max(c, k)));
      cand.resize(size_t(count), P(0));
      sim_block_bitonic_sort_desc(cand, count, kThreads);
      slots = cand;
    }
    slots.resize(size_t(std::max<int64_t>(k, int64_t(slots.size()))), P(0));  // padding past c
    cand = slots;
    return write_outputs<Kind, U>(cand, k) == oracle<Kind>(row, len, k);
  }
  ++g_threshold_paths[2];
  if (std::getenv("SIM_VERBOSE")) std::printf("fallback bytes=%d n=%lld k=%lld pattern=%d c=%lld\n", int(sizeof(U)), (long long)n, (long long)k, pattern, (long long)c);
  const int64_t survivors = next_pow2(k);
  if (survivors > kG) return false;
  int scans = 0;
  return sim_radix<Kind, U>(row, len, k, (kG - survivors) / 2, &scans);
}

// Every load width the launcher picks for kThreads (threshold_unroll; doubled
// loads in wide blocks only): the groups' element sets depend on it.
template <KeyKind Kind, typename U, int kThreads, int kR>
bool sim_threshold_u(const std::vector<U>& row, int64_t len, int64_t k, int64_t head, int pattern) {
  constexpr int kPlainLoads = threshold_unroll<U>(false), kDoubleLoads = threshold_unroll<U>(true);
  bool ok = sim_threshold_r<Kind, U, kThreads, kR, kPlainLoads>(row, len, k, head, pattern);
  if constexpr (kThreads == kThresholdWideThreads && kDoubleLoads != kPlainLoads) {
    ok = ok && sim_threshold_r<Kind, U, kThreads, kR, kDoubleLoads>(row, len, k, head, pattern);
  }
  return ok;
}

template <KeyKind Kind, typename U, int kThreads>
bool sim_threshold_t(const std::vector<U>& row, int64_t len, int64_t k, int64_t head, int pattern) {
  // As on a device of kSimSms SMs with many rows (narrow blocks' sampled slots).
  switch (threshold_row_slots(kSimRows, int64_t(row.size()), k, int(sizeof(U)), kThreads, len == int64_t(row.size()),
                              kSimSms)) {
    case 1: return sim_threshold_u<Kind, U, kThreads, 1>(row, len, k, head, pattern);
    case 2: return sim_threshold_u<Kind, U, kThreads, 2>(row, len, k, head, pattern);
    case 8: return sim_threshold_u<Kind, U, kThreads, 8>(row, len, k, head, pattern);
  }
  return false;
}

// Both block sizes threshold_block_threads picks from (narrow blocks only
// for the k they are dispatched at).
template <KeyKind Kind, typename U>
bool sim_threshold(const std::vector<U>& row, int64_t len, int64_t k, int64_t head, int pattern) {
  bool ok = sim_threshold_t<Kind, U, kThresholdWideThreads>(row, len, k, head, pattern);
  if (k <= kThresholdNarrowMaxK) ok = ok && sim_threshold_t<Kind, U, kThresholdNarrowThreads>(row, len, k, head, pattern);
  return ok;
}

// ---- cluster kernel's sampled bins (topk_cluster.cuh) ----------------------
// Mirrors cluster_topk_by_bins on one row of len (k < len) over `blocks`
// blocks: the same sample, its ranks, thresholds (cluster_bin_threshold),
// per-block bin counts, the sums and the decision, each candidate's slot
// (base + before + a per-block cursor, in the blocks' element order) and its
// rank within its bin. A row the bins do not select counts as a miss (the
// kernel's radix select, simulated above, takes it).
int g_bins_selected = 0, g_bins_missed = 0;
int64_t g_bins_widest_random = 0, g_bins_most_candidates_random = 0;  // random rows (pattern 0), k >= 64

template <KeyKind Kind, typename U>
bool sim_cluster_bins(const std::vector<U>& row, int64_t len, int64_t k, int blocks, int pattern, bool* missed) {
  constexpr int S = kClusterBinSamples, M = kClusterBinThresholds;
  auto key_of = [&](int64_t i) { return uint32_t(ordered_key<Kind>(row[size_t(i)])); };
  std::vector<uint64_t> sample(S);
  for (int t = 0; t < S; ++t) sample[size_t(t)] = uint64_t(key_of(int64_t(t) * len / S)) << 32 | uint32_t(~t);
  std::sort(sample.begin(), sample.end(), std::greater<>());
  uint32_t sorted[S], thresholds[M];
  for (int r = 0; r < S; ++r) sorted[r] = uint32_t(sample[size_t(r)] >> 32);
  const ClusterBinLayout layout = cluster_bin_layout(len, k);
  for (int slot = 0; slot < M; ++slot) {
    thresholds[slot] = cluster_bin_threshold(sorted, layout, slot);
    if (slot > 0 && thresholds[slot] > thresholds[slot - 1]) return false;  // must descend
  }
  const int64_t chunk = cluster_chunk<U>(len, blocks);
  std::vector<std::vector<uint32_t>> hist(size_t(blocks), std::vector<uint32_t>(M, 0));
  for (int b = 0; b < blocks; ++b) {
    for (int64_t i = b * chunk; i < std::min(len, (b + 1) * chunk); ++i) {
      if (key_of(i) >= thresholds[M - 1]) ++hist[size_t(b)][size_t(cluster_bin_of(key_of(i), thresholds))];
    }
  }
  std::vector<uint32_t> base(M + 1, 0), total(M, 0);
  for (int j = 0; j < M; ++j) {
    for (int b = 0; b < blocks; ++b) total[size_t(j)] += hist[size_t(b)][size_t(j)];
    base[size_t(j) + 1] = base[size_t(j)] + total[size_t(j)];
  }
  int last_bin = -1;
  for (int j = 0; j < M && last_bin < 0; ++j) {
    if (base[size_t(j) + 1] >= uint64_t(k)) last_bin = j;
  }
  uint32_t widest = 0;
  for (int j = 0; j <= last_bin; ++j) widest = std::max(widest, total[size_t(j)]);
  const uint32_t candidates = last_bin < 0 ? 0 : base[size_t(last_bin) + 1];
  *missed = last_bin < 0 || widest > kClusterBinMaxMembers || candidates > cluster_candidate_slots(k);
  if (*missed) {
    ++g_bins_missed;
    return true;
  }
  ++g_bins_selected;
  if (pattern == 0 && k >= 64) {
    g_bins_widest_random = std::max<int64_t>(g_bins_widest_random, widest);
    g_bins_most_candidates_random = std::max<int64_t>(g_bins_most_candidates_random, int64_t(candidates) - k);
  }
  // The scatter: slot = base + (the bin's members in earlier blocks) + cursor.
  using Pack = KeyIndexPacking<U, uint64_t>;
  std::vector<uint64_t> slots(candidates, 0);
  for (int b = 0; b < blocks; ++b) {
    std::vector<uint32_t> cursor(M, 0);
    for (int64_t i = b * chunk; i < std::min(len, (b + 1) * chunk); ++i) {
      if (key_of(i) < thresholds[last_bin]) continue;
      const int bin = cluster_bin_of(key_of(i), thresholds);
      uint32_t before = 0;
      for (int e = 0; e < b; ++e) before += hist[size_t(e)][size_t(bin)];
      const uint32_t slot = base[size_t(bin)] + before + cursor[size_t(bin)]++;
      if (slot >= candidates || slots[slot] != 0) return false;  // each slot written once
      slots[slot] = Pack::pack(U(key_of(i)), uint32_t(i));
    }
  }
  // The rank within each bin.
  std::vector<uint64_t> out(size_t(k), 0);
  for (int bin = 0; bin <= last_bin; ++bin) {
    for (uint32_t m = base[size_t(bin)]; m < base[size_t(bin) + 1]; ++m) {
      uint32_t above = 0;
      for (uint32_t j = base[size_t(bin)]; j < base[size_t(bin) + 1]; ++j) above += slots[j] > slots[m] ? 1u : 0u;
      const uint32_t rank = base[size_t(bin)] + above;
      if (rank < uint64_t(k)) {
        if (out[rank] != 0) return false;  // ranks are a permutation
        out[rank] = slots[m];
      }
    }
  }
  return write_outputs<Kind, U>(out, k) == oracle<Kind, U>(row, len, k);
}

// Rows for the bins: make_row's patterns, and rows made against the bins'
// sample (its elements high and the rest low, or the reverse).
template <KeyKind Kind, typename U>
void run_cluster_bins(std::mt19937_64& rng) {
  for (int64_t n : {kClusterBinsMinLen, int64_t(2000), int64_t(4097), int64_t(8000), kClusterBinsMaxLen}) {
    for (int64_t k : {int64_t(1), int64_t(2), int64_t(33), int64_t(64), int64_t(512), int64_t(1000), int64_t(1023)}) {
      if (k >= n) continue;
      for (int pattern = 0; pattern < kRowPatterns + 2; ++pattern) {
        std::vector<U> row;
        if (pattern < kRowPatterns) {
          row = make_row<U>(rng, n, pattern);
        } else {
          std::vector<char> sampled(size_t(n), 0);
          for (int64_t t = 0; t < kClusterBinSamples; ++t) sampled[size_t(t * n / kClusterBinSamples)] = 1;
          row = make_row_against_sample<Kind, U>(rng, sampled, pattern == kRowPatterns);
        }
        for (int64_t len : {n, std::max<int64_t>(kClusterBinsMinLen, int64_t(rng() % uint64_t(n + 1)))}) {
          if (k >= len) continue;
          for (int blocks : {1, 2, 3, 4, 8}) {
            bool missed = false;
            report<U>(sim_cluster_bins<Kind, U>(row, len, k, blocks, pattern, &missed), "cluster_bins", n, k, pattern,
                      blocks, len);
            // A whole row whose sampled elements are its largest must miss:
            // no threshold has k at or above it (the radix select takes the
            // row). The reverse row may not: the keys above the sample can
            // cut the rest of the row into bins.
            if (pattern == kRowPatterns && len == n && k > 33) {
              report<U>(missed, "cluster_bins(against the sample)", n, k, pattern, blocks, len);
            }
          }
        }
      }
    }
  }
}

// Row lengths below n worth trying for (n, k): empty, one element, around k,
// one short of the row, and a random one. (The clamping of user values is
// checked separately: clamp_row_length.)
std::vector<int64_t> short_lengths(std::mt19937_64& rng, int64_t n, int64_t k) {
  std::vector<int64_t> lens = {0, 1, k - 1, k, k + 1, n / 2, n - 1, int64_t(rng() % uint64_t(n))};
  std::vector<int64_t> out;
  for (int64_t len : lens) {
    if (len >= 0 && len < n && std::find(out.begin(), out.end(), len) == out.end()) out.push_back(len);
  }
  return out;
}

// Every algorithm on rows shorter than their padded length n. The warp
// kernels take the scalar layout with lengths (launch_warp_*), so only that.
template <KeyKind Kind, typename U>
void run_width_lengths(std::mt19937_64& rng) {
  if constexpr (sizeof(U) <= 4) for (int64_t n : {17, 33, 257, 1000, 2049, 4100, 16384}) {
    for (int64_t k : {1, 5, 8, 17, 32}) {
      if (k > n) continue;
      for (int pattern = 0; pattern < kRowPatterns; ++pattern) {
        const auto row = make_row<U>(rng, n, pattern);
        for (int64_t len : short_lengths(rng, n, k)) {
          report<U>(sim_warp_sort_any<Kind, U>(row, len, k, false), "warp_sort(lengths)", n, k, pattern, 0, len);
        }
      }
    }
  }
  if constexpr (sizeof(U) <= 4) for (int64_t n : {5, 33, 100, 256, 257, 1000, 2048}) {
    for (int64_t k : {1, 3, 8, 16, 17, 32}) {
      if (k > n) continue;
      for (int pattern = 0; pattern < kRowPatterns; ++pattern) {
        const auto row = make_row<U>(rng, n, pattern);
        for (int64_t len : short_lengths(rng, n, k)) {
          for (int capacity : {ws_capacity(n), int(k), 0}) {
            int tier = 0;
            report<U>(sim_warp_select<Kind, U>(row, len, k, false, capacity, &tier), "warp_select(lengths)", n, k, pattern, capacity, len);
            ++g_tiers[tier];
          }
        }
      }
    }
  }
  for (int64_t n : {3, 100, 2049, 5000, 70001}) {
    for (int64_t k : {int64_t(1), int64_t(33), int64_t(1000), n / 2, n}) {
      if (k > n || k < 1) continue;
      for (int pattern = 0; pattern < kRowPatterns; ++pattern) {
        const auto row = make_row<U>(rng, n, pattern);
        for (int64_t len : short_lengths(rng, n, k)) {
          for (int64_t capacity : {int64_t(0), int64_t(64), int64_t(2048), n}) {
            int scans = 0;
            report<U>(sim_radix<Kind, U>(row, len, k, capacity, &scans), "radix(lengths)", n, k, pattern, int(capacity), len);
          }
        }
      }
    }
  }
  if constexpr (sizeof(U) <= 4) for (int64_t n : {17, 513, 2048, 8192, 65536}) {
    for (int64_t k : {int64_t(1), int64_t(16), int64_t(64), int64_t(129), int64_t(257), int64_t(1000), int64_t(2048)}) {
      if (k > n) continue;
      if (n == 65536 && k != 64 && k != 2048) continue;  // keep the run short
      for (int pattern = 0; pattern < kRowPatterns; ++pattern) {
        const auto row = make_row<U>(rng, n, pattern);
        for (int64_t len : short_lengths(rng, n, k)) {
          for (int64_t head : {int64_t(0), int64_t(16 / sizeof(U)) - 1}) {
            report<U>(sim_threshold<Kind, U>(row, len, k, head, pattern), "threshold(lengths)", n, k, pattern, int(head), len);
          }
        }
      }
    }
  }
}

// The kernels' clamp of user lengths: L = min(max(length, 0), n).
void check_clamp() {
  const int64_t n = 1000;
  const std::pair<int32_t, int64_t> cases[] = {{0, 0},       {1, 1},          {999, 999},
                                               {1000, 1000}, {1001, 1000},    {-1, 0},
                                               {INT32_MIN, 0}, {INT32_MAX, 1000}};
  for (const auto& c : cases) {
    const bool ok = clamp_row_length(c.first, n) == c.second;
    if (ok) {
      ++g_passed;
    } else {
      ++g_failed;
      std::printf("FAIL clamp_row_length(%d, %lld)\n", c.first, (long long)n);
    }
  }
}

template <KeyKind Kind, typename U>
void run_width(std::mt19937_64& rng) {
  // Warp sort (8/16/32-bit keys only, as in the dispatcher).
  if constexpr (sizeof(U) <= 4) for (int64_t n : {1, 2, 3, 17, 31, 32, 33, 64, 100, 128, 255, 256, 257, 384, 1000, 1024, 2048, 4100, 16384}) {
    for (int64_t k : {1, 2, 3, 5, 8, 9, 16, 17, 32}) {
      if (k > n) continue;
      for (int pattern = 0; pattern < kRowPatterns; ++pattern) {
        const auto row = make_row<U>(rng, n, pattern);
        const bool vec_ok = (n * int64_t(sizeof(U))) % 16 == 0;
        report<U>(sim_warp_sort_any<Kind, U>(row, n, k, false), "warp_sort(scalar)", n, k, pattern, 0);
        if (vec_ok) report<U>(sim_warp_sort_any<Kind, U>(row, n, k, true), "warp_sort(vector)", n, k, pattern, 1);
      }
    }
  }
  // Warp select (n <= kWarpSelectMaxN), natural capacity and forced fallbacks.
  if constexpr (sizeof(U) <= 4) for (int64_t n : {1, 2, 3, 4, 5, 8, 17, 31, 32, 33, 64, 65, 100, 128, 129, 255, 256, 257, 384, 1000, 1024, 1025, 2047, 2048}) {
    for (int64_t k : {1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 32}) {
      if (k > n) continue;
      for (int pattern = 0; pattern < kRowPatterns; ++pattern) {
        const auto row = make_row<U>(rng, n, pattern);
        const bool vec_ok = (n * int64_t(sizeof(U))) % 16 == 0;
        for (int capacity : {ws_capacity(n), int(k), 0}) {
          for (int vec = 0; vec < (vec_ok ? 2 : 1); ++vec) {
            int tier = 0;
            report<U>(sim_warp_select<Kind, U>(row, n, k, vec == 1, capacity, &tier), "warp_select", n, k, pattern, capacity * 2 + vec);
            ++g_tiers[tier];
            if (capacity == ws_capacity(n) && tier == 3) ++g_natural_tier3;
          }
        }
        // Other lane counts per row (the slot counts between powers of two).
        for (int64_t epl : {int64_t(4), int64_t(8), int64_t(16), int64_t(32), int64_t(64)}) {
          for (int vec = 0; vec < (vec_ok ? 2 : 1); ++vec) {
            int tier = 0;
            report<U>(sim_warp_select<Kind, U>(row, n, k, vec == 1, ws_capacity(n), &tier, epl), "warp_select(lanes)", n, k, pattern, int(epl) * 2 + vec);
            ++g_tiers[tier];
          }
        }
      }
    }
  }
  // Radix select.
  for (int64_t n : {1, 2, 3, 100, 2047, 2048, 2049, 5000, 70001}) {
    for (int64_t k : {int64_t(1), int64_t(2), int64_t(33), int64_t(1000), n / 2, n - 1, n}) {
      if (k > n || k < 1) continue;
      for (int pattern = 0; pattern < kRowPatterns; ++pattern) {
        const auto row = make_row<U>(rng, n, pattern);
        for (int64_t capacity : {int64_t(0), int64_t(64), int64_t(2048), n}) {
          int scans = 0;
          report<U>(sim_radix<Kind, U>(row, n, k, capacity, &scans), "radix", n, k, pattern, int(capacity));
        }
      }
    }
  }
  // Threshold row per block (keys up to 32 bits, k <= kThresholdMaxK).
  if constexpr (sizeof(U) <= 4) for (int64_t n : {1, 2, 3, 17, 100, 513, 600, 1000, 2047, 2048, 4100, 8192, 12289, 65536}) {
    for (int64_t k : {int64_t(1), int64_t(2), int64_t(16), int64_t(64), int64_t(128), int64_t(129),
                      int64_t(256), int64_t(257), int64_t(1000), int64_t(1024), int64_t(2047),
                      int64_t(2048), n}) {
      if (k > n || k < 1 || k > kThresholdMaxK) continue;
      if (n == 65536 && k != 64 && k != 2048) continue;  // keep the run short
      for (int pattern = 0; pattern < kRowPatterns; ++pattern) {
        const auto row = make_row<U>(rng, n, pattern);
        for (int64_t head : {int64_t(0), int64_t(16 / sizeof(U)) - 1}) {
          report<U>(sim_threshold<Kind, U>(row, n, k, head, pattern), "threshold", n, k, pattern, int(head));
        }
      }
    }
  }
  // Sampled thresholds: longer rows, and rows made against the wide block's
  // sample (its chunks high and the rest low: too few candidates; the
  // reverse: too many), which take the radix select.
  if constexpr (sizeof(U) <= 4) for (const auto& [n, k] : {std::pair<int64_t, int64_t>{131072, 1024}, {32768, 600},
                                                          {65536, 2048}, {8192, 256}, {8192, 64}}) {
    for (int pattern = 0; pattern < kRowPatterns; ++pattern) {
      if (n == 131072 && pattern != 0 && pattern != 3) continue;  // keep the run short
      report<U>(sim_threshold<Kind, U>(make_row<U>(rng, n, pattern), n, k, 0, pattern), "threshold", n, k, pattern, 0);
    }
    const int64_t slots = int64_t(kThresholdWideThreads) * threshold_row_slots(kSimRows, n, k, int(sizeof(U)),
                                                                               kThresholdWideThreads,
                                                                               /*whole_rows=*/true, kSimSms);
    const int64_t chunks = slots / kThresholdSampleChunk;
    if (threshold_sample(n, k, slots).rank == 0) continue;  // narrow keys: more slots, too few per sample
    for (bool chunks_high : {true, false}) {
      std::vector<char> sampled(static_cast<size_t>(n), 0);
      const uint64_t step = threshold_sample_step(chunks, n);
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t start = threshold_sample_chunk_start(c, step);
        for (int l = 0; l < kThresholdSampleChunk; ++l) sampled[size_t(start + l)] = 1;
      }
      const std::vector<U> row = make_row_against_sample<Kind, U>(rng, sampled, chunks_high);
      const int before = g_threshold_sampled[1];
      report<U>(sim_threshold<Kind, U>(row, n, k, 0, 6), "threshold(against the sample)", n, k, 6, chunks_high);
      report<U>(g_threshold_sampled[1] > before, "threshold(the sample missed)", n, k, 6, chunks_high);
    }
  }
  if constexpr (sizeof(U) <= 4) run_cluster_bins<Kind, U>(rng);
  run_width_lengths<Kind, U>(rng);
}

}  // namespace

int main() {
  std::mt19937_64 rng(42);
  check_clamp();
  check_block_sort(rng);
  check_rank_parts(rng);
  run_width<KeyKind::kFloat, uint32_t>(rng);
  run_width<KeyKind::kFloat, uint16_t>(rng);
  run_width<KeyKind::kSigned, uint8_t>(rng);
  run_width<KeyKind::kFloat, uint64_t>(rng);
  run_width<KeyKind::kUnsigned, uint32_t>(rng);
  std::printf("warp_select tiers used: 1:%d 2:%d 3:%d (tier 3 at the real capacity: %d)\n", g_tiers[1],
              g_tiers[2], g_tiers[3], g_natural_tier3);
  std::printf("threshold paths: ranked or sorted %d (sorted: %d), radix fallback %d; "
              "worst candidates/k on random rows: %.2f\n",
              g_threshold_paths[1], g_threshold_sorted, g_threshold_paths[2],
              double(g_threshold_max_ratio_x100) / 100.0);
  std::printf("threshold samples: kept %d, missed (radix select) %d; most candidates of a kept sample on random rows: %lld\n",
              g_threshold_sampled[0], g_threshold_sampled[1], (long long)g_threshold_sampled_max_c);
  std::printf("sampled selects by passes:");
  for (int p = 0; p < 9; ++p) std::printf(" %d:%d", p, g_threshold_sample_passes[p]);
  std::printf("\ncluster bins: selected %d, missed (radix select) %d; on random rows with k >= 64: widest bin %lld, "
              "most candidates past k %lld\n",
              g_bins_selected, g_bins_missed, (long long)g_bins_widest_random, (long long)g_bins_most_candidates_random);
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed ? 1 : 0;
}
