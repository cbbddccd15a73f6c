// CPU top-k: a guaranteed threshold, one branch-free filter pass, then an
// exact selection among the few survivors.
//
// 1. Split the row into g >= k strided groups (element i is in group i mod g)
//    and take each group's maximum key; the loop is a vertical max over
//    contiguous chunks, so it vectorises. The k-th largest group maximum is a
//    lower bound T on the row's k-th largest key: the k group maxima above it
//    are k distinct elements. g is 16 or 32 for small k (a compile-time count
//    that unrolls into whole vector registers) and 2k otherwise; T comes from
//    nth_element on the g maxima.
// 2. One pass packs every element as (key, ~index) into a buffer and advances
//    the write position only when key >= T (no branch to mispredict). For
//    random rows about k to 2k candidates survive; adversarial rows (all equal)
//    keep everything, which stays O(n).
// 3. nth_element keeps the k best candidates and a sort orders them; packing
//    makes both plain integer comparisons in the contract's order (larger key
//    first, then lower index).
//
// Rows are spread over the runner's workers; when there are fewer rows than
// workers, long rows are cut into segments selected in parallel and merged.

#include "cpu/topk_cpu.h"

#include <algorithm>
#include <functional>
#include <type_traits>
#include <vector>

#include "jax_topk/keys.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace jax_topk::cpu {
namespace {

// One unsigned integer per candidate whose integer order is the whole order:
// larger key first, then lower index first. 64-bit keys need 128 bits.
template <typename Bits>
struct Candidate {
  using Packed = std::conditional_t<(sizeof(Bits) <= 4), uint64_t, unsigned __int128>;
  static constexpr int kIndexBits = sizeof(Packed) * 4;
  static constexpr Packed kIndexMask = (Packed(1) << kIndexBits) - 1;

  static Packed pack(Bits key, int64_t index) {
    return (Packed(key) << kIndexBits) | (~Packed(uint64_t(index)) & kIndexMask);
  }
  static int64_t index(Packed c) { return int64_t(uint64_t(~c & kIndexMask)); }
};

// Fills m[0:groups) with the maximum key of each strided group of x[0:n)
// (element i is in group i mod groups). Groups is a compile-time constant for
// small k so the loop unrolls into whole vector registers.
template <typename Bits, KeyKind Kind, int64_t kGroups>
void group_maxima_fixed(const Bits* x, int64_t n, Bits* m) {
  Bits acc[kGroups] = {};
  int64_t i = 0;
  for (; i + kGroups <= n; i += kGroups) {
    for (int64_t j = 0; j < kGroups; ++j) acc[j] = std::max(acc[j], ordered_key<Kind>(x[i + j]));
  }
  for (int64_t j = 0; i + j < n; ++j) acc[j] = std::max(acc[j], ordered_key<Kind>(x[i + j]));
  std::copy(acc, acc + kGroups, m);
}

template <typename Bits, KeyKind Kind>
void group_maxima(const Bits* x, int64_t n, int64_t groups, Bits* m) {
  std::fill(m, m + groups, Bits(0));
  int64_t i = 0;
  for (; i + groups <= n; i += groups) {
    for (int64_t j = 0; j < groups; ++j) m[j] = std::max(m[j], ordered_key<Kind>(x[i + j]));
  }
  for (int64_t j = 0; i + j < n; ++j) m[j] = std::max(m[j], ordered_key<Kind>(x[i + j]));
}

// Group counts: a fixed 16 or 32 for small k, else 2k (tighter than k for
// the price of a selection among the maxima).
constexpr int64_t group_count(int64_t k) { return k <= 16 ? 16 : k <= 32 ? 32 : 2 * k; }

// A lower bound on the k-th largest key of x[0:n) (step 1 above); 0, which
// filters nothing, when the row is too short for groups of two or more.
template <typename Bits, KeyKind Kind>
Bits threshold_from_group_maxima(const Bits* x, int64_t n, int64_t k, std::vector<Bits>& maxima) {
  const int64_t groups = group_count(k);
  if (n < 2 * groups) return Bits(0);
  maxima.resize(groups);
  Bits* m = maxima.data();
  if (groups == 16) {
    group_maxima_fixed<Bits, Kind, 16>(x, n, m);
  } else if (groups == 32) {
    group_maxima_fixed<Bits, Kind, 32>(x, n, m);
  } else {
    group_maxima<Bits, Kind>(x, n, groups, m);
  }
  std::nth_element(m, m + (k - 1), m + groups, std::greater<Bits>());
  return m[k - 1];
}

// Packs every element of x[0:n) whose key is >= threshold into out (in index
// order) and returns how many; out must hold n entries. Portable version:
// branch-free, each element is written and the write position advances only
// for kept ones.
template <typename Bits, KeyKind Kind>
int64_t pack_at_least_portable(const Bits* x, int64_t n, Bits threshold, int64_t index_base,
                               typename Candidate<Bits>::Packed* out) {
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Bits key = ordered_key<Kind>(x[i]);
    out[kept] = Candidate<Bits>::pack(key, index_base + i);
    kept += key >= threshold;
  }
  return kept;
}

template <typename Bits, KeyKind Kind>
struct PackAtLeast {
  static int64_t run(const Bits* x, int64_t n, Bits threshold, int64_t index_base,
                     typename Candidate<Bits>::Packed* out) {
    return pack_at_least_portable<Bits, Kind>(x, n, threshold, index_base, out);
  }
};

#if defined(__SSE2__)
// 32-bit keys on x86: eight keys per step; most steps hold no candidate and
// cost two compares and two movemasks. SSE2 compares are signed, so keys are
// taken in their signed form (the unsigned key with the sign bit flipped).
template <KeyKind Kind>
struct PackAtLeast<uint32_t, Kind> {
  using C = Candidate<uint32_t>;

  static __m128i signed_key(__m128i bits) {
    if constexpr (Kind == KeyKind::kFloat) {
      // Negative floats: flip the magnitude bits; positive ones stay as they are.
      return _mm_xor_si128(bits, _mm_srli_epi32(_mm_srai_epi32(bits, 31), 1));
    } else if constexpr (Kind == KeyKind::kSigned) {
      return bits;
    } else {
      return _mm_xor_si128(bits, _mm_set1_epi32(int32_t(0x80000000u)));
    }
  }

  static int kept_mask(const uint32_t* x, __m128i bound) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
    return _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(signed_key(bits), bound)));
  }

  static int64_t run(const uint32_t* x, int64_t n, uint32_t threshold, int64_t index_base,
                     typename C::Packed* out) {
    if (threshold == 0) return portable(x, n, threshold, index_base, out);
    // key >= threshold  <=>  signed(key) > signed(threshold - 1)
    const __m128i bound = _mm_set1_epi32(int32_t((threshold - 1) ^ 0x80000000u));
    int64_t kept = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
      int mask = kept_mask(x + i, bound) | (kept_mask(x + i + 4, bound) << 4);
      while (mask != 0) {
        const int j = __builtin_ctz(mask);
        mask &= mask - 1;
        out[kept++] = C::pack(ordered_key<Kind>(x[i + j]), index_base + i + j);
      }
    }
    return kept + portable(x + i, n - i, threshold, index_base + i, out + kept);
  }

  static int64_t portable(const uint32_t* x, int64_t n, uint32_t threshold, int64_t index_base,
                          typename C::Packed* out) {
    return pack_at_least_portable<uint32_t, Kind>(x, n, threshold, index_base, out);
  }
};
#endif

// Reorders c[0:count) so that its best min(k, count) come first (best first
// if `sorted`) and returns how many that is.
template <typename Packed>
int64_t keep_best(Packed* c, int64_t count, int64_t k, bool sorted) {
  if (count > k) {
    std::nth_element(c, c + (k - 1), c + count, std::greater<Packed>());
    count = k;
  }
  if (sorted) std::sort(c, c + count, std::greater<Packed>());
  return count;
}

// Per-worker buffers, reused across the rows a worker handles. They only
// grow: resizing down and up again would zero-fill them on every row.
template <typename Bits>
struct RowScratch {
  std::vector<Bits> maxima;
  std::vector<typename Candidate<Bits>::Packed> candidates;
};

// Selects the best min(k, n) elements of x[0:n) into scratch.candidates[0:m)
// (best first if `sorted`) and returns m; indices are offset by index_base.
template <typename Bits, KeyKind Kind>
int64_t select_row(const Bits* x, int64_t n, int64_t k, int64_t index_base, bool sorted,
                   RowScratch<Bits>& scratch) {
  k = std::min(k, n);
  if (k == 0) return 0;
  const Bits threshold = threshold_from_group_maxima<Bits, Kind>(x, n, k, scratch.maxima);
  if (int64_t(scratch.candidates.size()) < n) scratch.candidates.resize(n);
  auto* c = scratch.candidates.data();
  const int64_t kept = PackAtLeast<Bits, Kind>::run(x, n, threshold, index_base, c);
  return keep_best(c, kept, k, sorted);
}

// Writes the `count` selected candidates of a row, then pads the rest of its
// k output slots (a row shorter than k) with the lowest value and index -1.
template <typename Bits, typename Packed>
void write_row(const Packed* best, int64_t count, int64_t k, Bits lowest, const Bits* row,
               Bits* values, int32_t* indices) {
  for (int64_t j = 0; j < count; ++j) {
    const int64_t index = Candidate<Bits>::index(best[j]);
    indices[j] = int32_t(index);
    values[j] = row[index];
  }
  std::fill(values + count, values + k, lowest);
  std::fill(indices + count, indices + k, int32_t(-1));
}

// Elements of row r that take part (lengths already in [0, n]).
inline int64_t row_length(const int32_t* lengths, int64_t r, int64_t n) {
  return lengths == nullptr ? n : lengths[r];
}

// Parallel segments per row: 1 unless rows are too few to occupy the workers
// and rows are long enough that a segment stays well above k.
constexpr int64_t kMinSegmentLength = 1 << 14;
constexpr int64_t kTasksPerWorker = 4;  // small tasks even out uneven rows

int64_t segments_per_row(int64_t rows, int64_t n, int64_t k, int64_t workers) {
  if (rows >= workers) return 1;
  const int64_t wanted = (2 * workers + rows - 1) / rows;
  const int64_t by_length = n / std::max<int64_t>(kMinSegmentLength, 4 * k);
  return std::max<int64_t>(1, std::min(wanted, by_length));
}

template <typename Bits, KeyKind Kind>
void topk_rows_typed(const Bits* x, Bits* values, int32_t* indices, int64_t rows, int64_t n,
                     int64_t k, const int32_t* lengths, Bits lowest, TaskRunner& runner) {
  if (rows == 0 || k == 0) return;
  const int64_t workers = std::max<int64_t>(1, runner.concurrency());
  const int64_t segments = segments_per_row(rows, n, k, workers);

  if (segments == 1) {
    const int64_t tasks = std::min(rows, workers * kTasksPerWorker);
    runner.run(tasks, [&](int64_t t) {
      RowScratch<Bits> scratch;
      for (int64_t r = rows * t / tasks; r < rows * (t + 1) / tasks; ++r) {
        const int64_t len = row_length(lengths, r, n);
        const int64_t m = select_row<Bits, Kind>(x + r * n, len, k, /*index_base=*/0, /*sorted=*/true, scratch);
        write_row(scratch.candidates.data(), m, k, lowest, x + r * n, values + r * k, indices + r * k);
      }
    });
    return;
  }

  // Few long rows: select the best of each segment in parallel, then merge.
  std::vector<std::vector<typename Candidate<Bits>::Packed>> partial(rows * segments);
  runner.run(rows * segments, [&](int64_t t) {
    const int64_t r = t / segments, s = t % segments;
    const int64_t len = row_length(lengths, r, n);
    const int64_t begin = len * s / segments, end = len * (s + 1) / segments;
    RowScratch<Bits> scratch;
    const int64_t m = select_row<Bits, Kind>(x + r * n + begin, end - begin, k, begin, /*sorted=*/false, scratch);
    partial[t].assign(scratch.candidates.begin(), scratch.candidates.begin() + m);
  });
  runner.run(rows, [&](int64_t r) {
    auto& merged = partial[r * segments];
    for (int64_t s = 1; s < segments; ++s) {
      const auto& p = partial[r * segments + s];
      merged.insert(merged.end(), p.begin(), p.end());
    }
    const int64_t m = keep_best(merged.data(), int64_t(merged.size()), k, /*sorted=*/true);
    write_row(merged.data(), m, k, lowest, x + r * n, values + r * k, indices + r * k);
  });
}

}  // namespace

bool topk_rows(DType dtype, const void* x, void* values, int32_t* indices, int64_t rows,
               int64_t n, int64_t k, const int32_t* lengths, TaskRunner& runner) {
  return visit_dtype(dtype, [&](auto traits) {
    using Traits = decltype(traits);
    using Bits = typename Traits::Bits;
    topk_rows_typed<Bits, Traits::kKeyKind>(static_cast<const Bits*>(x), static_cast<Bits*>(values),
                                            indices, rows, n, k, lengths, Traits::kLowestBits, runner);
  });
}

}  // namespace jax_topk::cpu
