// Standalone GPU self-test and micro-benchmark of jax_topk::cuda::topk_rows
// and jax_topk::cuda::sort_rows (plain CUDA runtime, no JAX). Build from the
// repository root:
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -Icsrc/include -Icsrc -gencode arch=compute_90,code=sm_90 csrc/cuda/topk.cu csrc/cuda/sort.cu csrc/cuda/tests/topk_selftest.cu -o topk_selftest
//
// (add -gencode arch=compute_80,code=sm_80 / compute_100,code=sm_100 for other chips)
//
// Run:   ./topk_selftest            correctness suite (bit-exact vs a CPU oracle)
//        ./topk_selftest --quick    a smaller suite
//        ./topk_selftest --big      also rows*n > 2^31 (uint8, slow oracle)
//        ./topk_selftest --bench    timings of the benchmark grid (float32; --only 1024x8192
//                                   keeps the shapes whose "RxN kK" contains it;
//                                   --regimes also times every other regime that
//                                   holds the shape; the ragged batch of the sort
//                                   issue is timed last, by CUDA events and in a
//                                   CUDA graph of 32 launches, with --regimes also
//                                   its first rows and each row alone)
//        ./topk_selftest --dry-run  count the cases (no GPU needed)
//        ./topk_selftest --lengths  only the per-row lengths cases (with --quick: fewer)
//        ./topk_selftest --max-elements N   only cases of at most N elements (sanitizers)
//        ./topk_selftest --min-elements N   only cases of at least N elements (with
//                                   --max-elements: one band, e.g. the narrow threshold
//                                   blocks' cases, which start at hundreds of rows)
//        ./topk_selftest --no-clusters  no cluster kernel: the cases forced onto it
//                                   are skipped, and those the dispatcher sends to it
//                                   run in the regime it picks without clusters
//                                   (compute-sanitizer's racecheck faults on a cluster
//                                   launch that its kernel filter leaves out)
//        ./topk_selftest --sort     the sort suite instead (both directions; with --big
//                                   also several chunks of the tile regime; with
//                                   --bench the sort timings in every regime)
//
// Built with -DJAX_TOPK_PHASE_TIMING (topk.cu too), --bench also prints each
// shape's block us per phase and the timeline of one launch in a CUDA graph
// (when its blocks began and ended, how long they took); with
// JAX_TOPK_TIMELINE_DUMP=FILE every block's line (SM, begin, end, phases) is
// appended to FILE.
//
// Sort cases use the same inputs and lengths; their oracle is the stable sort
// of the ordered keys, ascending or descending, ties by lower index.
//
// Correctness: every case runs twice (different output poison, different
// scratch garbage) and must match the oracle (ordered keys from keys.h,
// sorted by key descending then index ascending) bit for bit, leave the guard
// words after the outputs untouched, and give identical bits both times.
// Cases marked lengths=... pass per-row lengths (a device array of user
// values: 0, 1, k-1, k, k+1, n-1, n, n+1, negative, INT32_MIN/MAX, random):
// the oracle clamps them to [0, n] as the FFI does for cpu::topk_rows and
// pads slots past min(k, length) with the dtype's lowest value and index -1.
// Prints one line per failure and ends with "N passed, M failed"; exit code
// 1 on any failure.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cuda/primitives.cuh"
#include "cuda/sort_cuda.h"
#include "cuda/topk_cuda.h"
#include "cuda/topk_cluster.cuh"    // the cluster kernel's occupancy (--bench)
#include "cuda/topk_threshold.cuh"  // threshold_slots: the sampled-threshold cases
#include "jax_topk/dtypes.h"
#include "jax_topk/keys.h"
#include "jax_topk/sort_dispatch.h"
#include "jax_topk/topk_dispatch.h"

using namespace jax_topk;

namespace {

#define CHECK_CUDA(expr)                                                                   \
  do {                                                                                     \
    cudaError_t err_ = (expr);                                                             \
    if (err_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(err_),       \
                   __FILE__, __LINE__, #expr);                                             \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

int g_sm_count = 0;
bool g_has_clusters = false;  // compute capability 9.0+: the cluster regime exists
bool g_no_clusters = false;   // --no-clusters on a device that has them
bool g_compare_regimes = false;  // --bench --regimes: also time the other regimes
double g_clock_khz = 1.0;  // SM clock (phase timing)
size_t g_l2_bytes = 0;
int g_passed = 0;
int g_failed = 0;

enum class Pattern { kRandomBits, kGaussian, kFewValues, kAllEqual, kSpecials, kAscending, kDescending,
                     kSampleHigh, kSampleLow };

// The sample the kSampleHigh / kSampleLow rows are made against, set with
// the cases that use them: the threshold kernel's (g_sample_slots group
// slots, in chunks) or, with g_sample_slots == 0, the cluster kernel's bins
// (kClusterBinSamples single elements).
int64_t g_sample_slots = 0;

const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::kRandomBits: return "random_bits";
    case Pattern::kGaussian: return "gaussian";
    case Pattern::kFewValues: return "few_values";
    case Pattern::kAllEqual: return "all_equal";
    case Pattern::kSpecials: return "specials";
    case Pattern::kAscending: return "ascending";
    case Pattern::kDescending: return "descending";
    case Pattern::kSampleHigh: return "sample_high";
    case Pattern::kSampleLow: return "sample_low";
  }
  return "?";
}

// What a case runs: top-k, or a sort (k = n outputs) in one direction.
enum class Op { kTopK, kSortAscending, kSortDescending };

const char* op_name(Op op) {
  switch (op) {
    case Op::kTopK: return "top_k";
    case Op::kSortAscending: return "sort_ascending";
    case Op::kSortDescending: return "sort_descending";
  }
  return "?";
}

const std::vector<Pattern> kAllPatterns = {Pattern::kRandomBits, Pattern::kGaussian,
                                           Pattern::kFewValues,  Pattern::kAllEqual,
                                           Pattern::kSpecials,   Pattern::kAscending,
                                           Pattern::kDescending};

// Special bit patterns per dtype: signed zeros, infinities, NaNs of both signs
// with several payloads (quiet and signalling), denormals, extremes.
template <typename U>
std::vector<U> special_values(DType d) {
  std::vector<uint64_t> v;
  switch (d) {
    case DType::float32:
      v = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7fc00001,
           0xffc00001, 0x7f800001, 0xff800001, 0x7fffffff, 0xffffffff, 0x00000001, 0x80000001,
           0x007fffff, 0x807fffff, 0x3f800000, 0xbf800000, 0x7f7fffff, 0xff7fffff};
      break;
    case DType::float64:
      v = {0x0ull, 0x8000000000000000ull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
           0x7ff8000000000000ull, 0xfff8000000000000ull, 0x7ff8000000000001ull,
           0xfff8000000000001ull, 0x7ff0000000000001ull, 0xfff0000000000001ull,
           0x7fffffffffffffffull, 0xffffffffffffffffull, 0x1ull, 0x8000000000000001ull,
           0x000fffffffffffffull, 0x800fffffffffffffull, 0x3ff0000000000000ull,
           0xbff0000000000000ull, 0x7fefffffffffffffull, 0xffefffffffffffffull};
      break;
    case DType::bfloat16:
      v = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7fc1, 0xffc1, 0x7f81, 0xff81,
           0x7fff, 0xffff, 0x0001, 0x8001, 0x007f, 0x807f, 0x3f80, 0xbf80, 0x7f7f, 0xff7f};
      break;
    case DType::float16:
      v = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7e01, 0xfe01, 0x7c01, 0xfc01,
           0x7fff, 0xffff, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x3c00, 0xbc00, 0x7bff, 0xfbff};
      break;
    default: {  // integers: 0, 1, all ones (-1 / max), sign bit (min), max positive
      const uint64_t ones = sizeof(U) == 8 ? ~0ull : ((1ull << (8 * sizeof(U))) - 1);
      const uint64_t sign = 1ull << (8 * sizeof(U) - 1);
      v = {0, 1, ones, sign, sign - 1, 2, ones - 1};
    }
  }
  std::vector<U> out;
  for (uint64_t x : v) out.push_back(U(x));
  return out;
}

template <KeyKind Kind, typename U>
void fill_row_pattern(DType d, Pattern p, std::mt19937_64& rng, U* row, int64_t n) {
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random_bits = [&]() { return U(rng()); };
  switch (p) {
    case Pattern::kRandomBits:
      for (int64_t i = 0; i < n; ++i) row[i] = random_bits();
      break;
    case Pattern::kGaussian:
      for (int64_t i = 0; i < n; ++i) {
        const double g = normal(rng);
        U bits;
        if (d == DType::float32) {
          const float f = float(g);
          uint32_t b;
          std::memcpy(&b, &f, 4);
          bits = U(b);
        } else if (d == DType::float64) {
          uint64_t b;
          std::memcpy(&b, &g, 8);
          bits = U(b);
        } else if (d == DType::bfloat16) {
          const float f = float(g);
          uint32_t b;
          std::memcpy(&b, &f, 4);
          bits = U(b >> 16);
        } else if (d == DType::float16) {
          const __half h = __float2half(float(g));
          uint16_t b;
          std::memcpy(&b, &h, 2);
          bits = U(b);
        } else {  // integers: a bell around 0 in the integer's units
          const int64_t iv = int64_t(std::llround(g * 40.0));
          bits = U(uint64_t(iv));
        }
        row[i] = bits;
      }
      break;
    case Pattern::kFewValues: {
      const U vals[3] = {random_bits(), random_bits(), random_bits()};
      for (int64_t i = 0; i < n; ++i) row[i] = vals[rng() % 3];
      break;
    }
    case Pattern::kAllEqual: {
      const U v = random_bits();
      for (int64_t i = 0; i < n; ++i) row[i] = v;
      break;
    }
    case Pattern::kSpecials: {
      const std::vector<U> sp = special_values<U>(d);
      for (int64_t i = 0; i < n; ++i) row[i] = (rng() & 1) ? sp[rng() % sp.size()] : random_bits();
      break;
    }
    case Pattern::kAscending:
      for (int64_t i = 0; i < n; ++i) row[i] = bits_from_key<Kind>(U(uint64_t(i) * 7 + 3));
      break;
    case Pattern::kDescending:
      for (int64_t i = 0; i < n; ++i) row[i] = bits_from_key<Kind>(U(uint64_t(n - i) * 5 + 1));
      break;
    case Pattern::kSampleHigh:
    case Pattern::kSampleLow: {
      // The sampled elements of a whole row high and the rest low (the
      // sampled T leaves fewer than k candidates; the bins reach k at no
      // threshold: both kernels' radix select takes the row), or the
      // reverse (more candidates than the threshold kernel's G: its radix
      // select; the bins above the sample may still take it). The threshold
      // kernel's sample
      // (g_sample_slots slots) is in chunks (threshold_sample_chunk_start);
      // the cluster kernel's bins take element i * n / kClusterBinSamples.
      std::vector<char> sampled(size_t(n), 0);
      if (g_sample_slots == 0) {
        for (int64_t i = 0; i < kClusterBinSamples; ++i) sampled[size_t(i * n / kClusterBinSamples)] = 1;
      }
      const int64_t chunks = g_sample_slots / kThresholdSampleChunk;
      const uint64_t step = chunks >= 2 ? threshold_sample_step(chunks, n) : 0;
      for (int64_t c = 0; chunks >= 2 && c < chunks; ++c) {
        const int64_t start = threshold_sample_chunk_start(c, step);
        for (int64_t l = 0; l < kThresholdSampleChunk && start + l < n; ++l) sampled[size_t(start + l)] = 1;
      }
      constexpr U kTop = U(U(1) << (sizeof(U) * 8 - 1));
      for (int64_t i = 0; i < n; ++i) {
        const U low = U(random_bits() & U(kTop - 1));
        const bool high = (sampled[size_t(i)] != 0) == (p == Pattern::kSampleHigh);
        row[i] = bits_from_key<Kind>(high ? U(kTop | low) : low);
      }
      break;
    }
  }
}

// Per-row lengths of a case: none (nullptr), a mix of every interesting
// user value, every row whole (values >= n), or every row empty (values <= 0).
enum class Lengths { kNone, kMixed, kWhole, kEmpty };

const char* lengths_name(Lengths l) {
  switch (l) {
    case Lengths::kNone: return "";
    case Lengths::kMixed: return " lengths=mixed";
    case Lengths::kWhole: return " lengths=whole";
    case Lengths::kEmpty: return " lengths=empty";
  }
  return "?";
}

// Distinct kinds of user length kMixed cycles through (row r gets kind
// (r + salt) % kMixedLengthKinds).
constexpr int64_t kMixedLengthKinds = 13;

std::vector<int32_t> make_lengths(Lengths mode, int64_t rows, int64_t n, int64_t k, int64_t salt,
                                  std::mt19937_64& rng) {
  std::vector<int32_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t kind = r + salt;
    int64_t v = 0;
    if (mode == Lengths::kWhole) {
      const int64_t whole[3] = {n, n + 1, INT32_MAX};
      v = whole[kind % 3];
    } else if (mode == Lengths::kEmpty) {
      const int64_t empty[3] = {0, -1, INT32_MIN};
      v = empty[kind % 3];
    } else {
      const int64_t mixed[kMixedLengthKinds] = {
          0, 1, k - 1, k, k + 1, n - 1, n, n + 1, -1, INT32_MIN, INT32_MAX,
          int64_t(rng() % uint64_t(n + 1)),                  // anywhere
          k + int64_t(rng() % uint64_t(n - k + 1))};         // at least k
      v = mixed[kind % kMixedLengthKinds];
    }
    out[size_t(r)] = int32_t(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX));
  }
  return out;
}

// The oracle: ordered keys, key descending (ascending: the sort's other
// direction), index ascending, over the first min(max(lengths[r], 0), n)
// elements of row r (all of it without lengths); slots past that many hold
// `lowest` and index -1.
template <KeyKind Kind, typename U>
void oracle_topk(const U* x, int64_t rows, int64_t n, int64_t k, const int32_t* lengths, U lowest,
                 std::vector<U>* values, std::vector<int32_t>* indices, bool ascending = false) {
  values->assign(size_t(rows * k), lowest);
  indices->assign(size_t(rows * k), -1);
  std::vector<U> keys(static_cast<size_t>(n));
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const U* row = x + r * n;
    const int64_t len = lengths == nullptr ? n : std::clamp<int64_t>(lengths[r], 0, n);
    const int64_t take = std::min(k, len);
    for (int64_t i = 0; i < len; ++i) keys[size_t(i)] = ordered_key<Kind>(row[i]);
    std::iota(order.begin(), order.begin() + len, 0);
    auto better = [&](int32_t a, int32_t b) {
      if (keys[size_t(a)] == keys[size_t(b)]) return a < b;
      return ascending ? keys[size_t(a)] < keys[size_t(b)] : keys[size_t(a)] > keys[size_t(b)];
    };
    if (take < len) {
      std::nth_element(order.begin(), order.begin() + take, order.begin() + len, better);
    }
    std::sort(order.begin(), order.begin() + take, better);
    for (int64_t j = 0; j < take; ++j) {
      (*values)[size_t(r * k + j)] = row[order[size_t(j)]];
      (*indices)[size_t(r * k + j)] = order[size_t(j)];
    }
  }
}

constexpr int kGuardWords = 64;

// Sorts run in this regime when set and it holds the row (the sort suite's
// tile cases below the dispatcher's threshold), else in the dispatcher's.
std::optional<SortRegime> g_sort_regime;

SortRegime sort_regime_for(int64_t rows, int64_t n) {
  if (g_sort_regime && sort_regime_holds(*g_sort_regime, n) && rows > 0) return *g_sort_regime;
  return choose_sort_regime(rows, n);
}

// Top-k cases run in this regime when set and it holds the problem (the
// cluster suite's shapes the dispatcher sends elsewhere), else in the
// dispatcher's.
std::optional<TopkRegime> g_topk_regime;

std::optional<TopkRegime> forced_topk_regime(int64_t rows, int64_t n, int64_t k, int elem_bytes) {
  if (rows <= 0 || k <= 0) return std::nullopt;
  if (g_topk_regime && topk_regime_holds(*g_topk_regime, n, k, elem_bytes, g_has_clusters)) {
    return g_topk_regime;
  }
  // topk_rows dispatches by the device, which has clusters: the regime the
  // dispatcher picks without them is forced instead.
  if (g_no_clusters) return choose_topk_regime(rows, n, k, elem_bytes, g_sm_count, false);
  return std::nullopt;
}

// Runs one case; returns true when it passed.
template <typename Traits>
bool run_case(Op op, DType d, int64_t rows, int64_t n, int64_t k, Pattern pattern, bool misaligned,
              Lengths lengths_mode, int64_t salt, uint64_t seed) {
  using U = typename Traits::Bits;
  constexpr KeyKind Kind = Traits::kKeyKind;
  const bool sort = op != Op::kTopK;
  const int64_t lengths_k = k;  // sorts: the k of the case still shapes its mixed lengths
  if (sort) k = n;              // every element is output
  const SortRegime sort_regime = sort_regime_for(rows, n);
  const std::optional<TopkRegime> topk_forced = forced_topk_regime(rows, n, k, int(sizeof(U)));
  const char* regime =
      sort ? sort_regime_name(sort_regime)
           : topk_regime_name(topk_forced ? *topk_forced
                                          : choose_topk_regime(rows, n, k, int(sizeof(U)), g_sm_count,
                                                               g_has_clusters));
  char label[320];
  std::snprintf(label, sizeof label,
                "%s dtype=%s rows=%lld n=%lld k=%lld pattern=%s%s%s salt=%lld regime=%s", op_name(op),
                Traits::kName, (long long)rows, (long long)n, (long long)k, pattern_name(pattern),
                misaligned ? " misaligned" : "", lengths_name(lengths_mode), (long long)salt, regime);

  std::mt19937_64 rng(seed);
  const int64_t elems = rows * n;
  std::vector<U> host_x(static_cast<size_t>(elems));
  for (int64_t r = 0; r < rows; ++r) fill_row_pattern<Kind, U>(d, pattern, rng, host_x.data() + r * n, n);
  std::vector<int32_t> host_lengths;
  if (lengths_mode != Lengths::kNone) host_lengths = make_lengths(lengths_mode, rows, n, lengths_k, salt, rng);
  const int32_t* lengths = host_lengths.empty() ? nullptr : host_lengths.data();

  std::vector<U> want_v;
  std::vector<int32_t> want_i;
  oracle_topk<Kind, U>(host_x.data(), rows, n, k, lengths, Traits::kLowestBits, &want_v, &want_i,
                       op == Op::kSortAscending);

  const int64_t offset = misaligned ? 1 : 0;
  U* d_x_base = nullptr;
  U* d_v = nullptr;
  int32_t* d_i = nullptr;
  void* d_scratch = nullptr;
  const size_t out_count = size_t(rows * k) + kGuardWords;
  CHECK_CUDA(cudaMalloc(&d_x_base, size_t(elems + offset + 1) * sizeof(U)));
  CHECK_CUDA(cudaMalloc(&d_v, out_count * sizeof(U)));
  CHECK_CUDA(cudaMalloc(&d_i, out_count * sizeof(int32_t)));
  U* d_x = d_x_base + offset;
  if (elems > 0) CHECK_CUDA(cudaMemcpy(d_x, host_x.data(), size_t(elems) * sizeof(U), cudaMemcpyHostToDevice));
  int32_t* d_lengths = nullptr;
  if (lengths != nullptr && rows > 0) {
    CHECK_CUDA(cudaMalloc(&d_lengths, size_t(rows) * sizeof(int32_t)));
    CHECK_CUDA(cudaMemcpy(d_lengths, lengths, size_t(rows) * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  const size_t scratch_bytes = sort ? jax_topk::cuda::sort_scratch_bytes(d, rows, n, sort_regime)
                               : topk_forced ? jax_topk::cuda::topk_scratch_bytes(d, rows, n, k, *topk_forced)
                                             : jax_topk::cuda::topk_scratch_bytes(d, rows, n, k);
  if (scratch_bytes > 0) CHECK_CUDA(cudaMalloc(&d_scratch, scratch_bytes));

  bool ok = true;
  std::vector<U> got_v[2];
  std::vector<int32_t> got_i[2];
  const unsigned char poison[2] = {0xA5, 0x5A};
  const unsigned char scratch_garbage[2] = {0xFF, 0x00};
  for (int run = 0; run < 2 && ok; ++run) {
    CHECK_CUDA(cudaMemset(d_v, poison[run], out_count * sizeof(U)));
    CHECK_CUDA(cudaMemset(d_i, poison[run], out_count * sizeof(int32_t)));
    if (scratch_bytes > 0) CHECK_CUDA(cudaMemset(d_scratch, scratch_garbage[run], scratch_bytes));
    cudaError_t err =
        sort ? jax_topk::cuda::sort_rows(d, d_x, d_v, d_i, rows, n, op == Op::kSortDescending, d_lengths,
                                         d_scratch, scratch_bytes, /*stream=*/0, sort_regime)
             : topk_forced ? jax_topk::cuda::topk_rows(d, d_x, d_v, d_i, rows, n, k, d_lengths, d_scratch,
                                                       scratch_bytes, /*stream=*/0, *topk_forced)
                           : jax_topk::cuda::topk_rows(d, d_x, d_v, d_i, rows, n, k, d_lengths, d_scratch,
                                                       scratch_bytes, /*stream=*/0);
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      std::printf("FAIL %s: the kernel returned %s\n", label, cudaGetErrorString(err));
      ok = false;
      if (err != cudaErrorInvalidValue) {
        std::printf("sticky CUDA error, stopping\n");
        std::exit(3);
      }
      break;
    }
    got_v[run].resize(out_count);
    got_i[run].resize(out_count);
    CHECK_CUDA(cudaMemcpy(got_v[run].data(), d_v, out_count * sizeof(U), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(got_i[run].data(), d_i, out_count * sizeof(int32_t), cudaMemcpyDeviceToHost));
    for (size_t j = 0; j < size_t(rows * k); ++j) {
      if (got_v[run][j] != want_v[j] || got_i[run][j] != want_i[j]) {
        const size_t r = j / size_t(k);
        std::printf(
            "FAIL %s run=%d: first mismatch at row %lld pos %lld (length %lld): want (bits 0x%llx, "
            "index %d) got (bits 0x%llx, index %d)\n",
            label, run, (long long)r, (long long)(j % size_t(k)),
            (long long)(lengths ? lengths[r] : n), (unsigned long long)want_v[j], want_i[j],
            (unsigned long long)got_v[run][j], got_i[run][j]);
        ok = false;
        break;
      }
    }
    if (!ok) break;
    // Guard words after the outputs must keep the poison.
    for (size_t j = size_t(rows * k); j < out_count && ok; ++j) {
      U pv;
      std::memset(&pv, poison[run], sizeof(U));
      int32_t pi;
      std::memset(&pi, poison[run], sizeof(int32_t));
      if (got_v[run][j] != pv || got_i[run][j] != pi) {
        std::printf("FAIL %s run=%d: write past the outputs at element %lld\n", label, run,
                    (long long)j);
        ok = false;
      }
    }
    if (ok && run == 1) {
      const size_t count = size_t(rows * k);
      if (std::memcmp(got_v[0].data(), got_v[1].data(), count * sizeof(U)) != 0 ||
          std::memcmp(got_i[0].data(), got_i[1].data(), count * sizeof(int32_t)) != 0) {
        std::printf("FAIL %s: the two runs differ (nondeterminism)\n", label);
        ok = false;
      }
    }
  }
  CHECK_CUDA(cudaFree(d_x_base));
  if (d_lengths) CHECK_CUDA(cudaFree(d_lengths));
  CHECK_CUDA(cudaFree(d_v));
  CHECK_CUDA(cudaFree(d_i));
  if (d_scratch) CHECK_CUDA(cudaFree(d_scratch));
  return ok;
}

bool g_dry_run = false;  // count cases and elements only (no GPU needed)
bool g_lengths_only = false;  // --lengths: only the cases with per-row lengths
bool g_quick = false;         // --quick: lengths cases for one dtype per key width only
int64_t g_max_elements = INT64_MAX;  // --max-elements N: skip larger cases (sanitizer runs)
int64_t g_min_elements = 0;          // --min-elements N: skip smaller cases
int64_t g_dry_cases = 0, g_dry_elements = 0;

Op g_op = Op::kTopK;  // what run_one runs (the sort suite sets it per direction)

void run_one(DType d, int64_t rows, int64_t n, int64_t k, Pattern p, bool misaligned = false,
             Lengths lengths = Lengths::kNone, int64_t salt = 0) {
  static uint64_t seed = 12345;
  ++seed;  // before the filter: a case has the same seed with and without --lengths
  if (g_lengths_only && lengths == Lengths::kNone) return;
  if (rows * n > g_max_elements || rows * n < g_min_elements) return;
  // Kernels are per key width; --quick (also the sanitizer runs) keeps the
  // lengths cases to one dtype per width.
  if (g_quick && lengths != Lengths::kNone && d != DType::float32 && d != DType::bfloat16 &&
      d != DType::float64 && d != DType::uint8) {
    return;
  }
  if (g_dry_run) {
    ++g_dry_cases;
    g_dry_elements += rows * n;
    return;
  }
  bool ok = false;
  visit_dtype(d, [&](auto traits) {
    ok = run_case<decltype(traits)>(g_op, d, rows, n, k, p, misaligned, lengths, salt, seed);
  });
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
  }
}

// The case with mixed per-row lengths, repeated with shifted kinds until every
// kind of length has landed on some row (once when rows >= kMixedLengthKinds).
void run_lengths(DType d, int64_t rows, int64_t n, int64_t k, Pattern p, bool misaligned = false) {
  for (int64_t salt = 0; salt < kMixedLengthKinds; salt += rows) {
    run_one(d, rows, n, k, p, misaligned, Lengths::kMixed, salt);
  }
}

// Mixed lengths, then every row whole, then every row empty.
void run_all_lengths(DType d, int64_t rows, int64_t n, int64_t k, Pattern p) {
  run_lengths(d, rows, n, k, p);
  run_one(d, rows, n, k, p, /*misaligned=*/false, Lengths::kWhole);
  run_one(d, rows, n, k, p, /*misaligned=*/false, Lengths::kEmpty);
}

// The key codec (per-width kernels) must reproduce keys.h for every dtype.
void check_codecs() {
  if (g_dry_run) return;
  for (int di = 0; di < 12; ++di) {
    const DType d = DType(di);
    visit_dtype(d, [&](auto traits) {
      using Tr = decltype(traits);
      using U = typename Tr::Bits;
      const auto codec = jax_topk::cuda::make_key_codec<Tr::kKeyKind, U>();
      std::mt19937_64 rng(7);
      bool ok = true;
      std::vector<U> probes = special_values<U>(d);
      for (int i = 0; i < 20000; ++i) probes.push_back(U(rng()));
      for (U b : probes) {
        const U key = ordered_key<Tr::kKeyKind>(b);
        if (codec.key(b) != key || codec.bits(key) != b) {
          std::printf("FAIL codec dtype=%s bits=0x%llx\n", Tr::kName, (unsigned long long)b);
          ok = false;
          break;
        }
      }
      if (ok) {
        ++g_passed;
      } else {
        ++g_failed;
      }
    });
  }
}

const std::vector<DType> kMainDtypes = {DType::float32, DType::bfloat16, DType::float16,
                                        DType::float64, DType::int32, DType::uint8};
const std::vector<DType> kAllDtypes = {
    DType::float32, DType::bfloat16, DType::float16, DType::float64, DType::int32, DType::int64,
    DType::int16,   DType::int8,     DType::uint32,  DType::uint64,  DType::uint16, DType::uint8};

void run_suite(bool quick, bool big) {
  check_codecs();
  const int sm = g_sm_count;

  // Degenerate shapes, every dtype.
  for (DType d : kAllDtypes) {
    run_one(d, 0, 5, 3, Pattern::kRandomBits);
    run_one(d, 3, 7, 0, Pattern::kRandomBits);
    run_one(d, 1, 1, 1, Pattern::kRandomBits);
    run_one(d, 17, 1, 1, Pattern::kSpecials);
    run_one(d, 5, 2, 2, Pattern::kFewValues);
    run_one(d, 5, 3, 1, Pattern::kSpecials);
    for (Pattern p : kAllPatterns) {
      run_one(d, 9, 100, 7, p);      // warp sort (tiny rows)
      run_one(d, 3, 1000, 40, p);    // radix, row per block, whole row cached
      run_one(d, 2, 5000, 5000, p);  // radix, k == n, device-wide sort
    }
    // Per-row lengths on the same shapes. Rows >= kMixedLengthKinds where
    // the regime does not depend on the row count: one case each.
    run_lengths(d, 17, 1, 1, Pattern::kSpecials);
    run_lengths(d, 13, 2, 2, Pattern::kFewValues);
    run_one(d, 5, 3, 1, Pattern::kSpecials, /*misaligned=*/false, Lengths::kEmpty);
    for (Pattern p : kAllPatterns) {
      if (quick && p != Pattern::kRandomBits) continue;
      run_all_lengths(d, 13, 100, 7, p);
      run_all_lengths(d, 13, 1000, 40, p);
      run_all_lengths(d, 13, 5000, 5000, p);
    }
  }

  // Warp-sort regime boundaries (n around group-size steps, k around list sizes).
  const std::vector<int64_t> warp_ns = quick ? std::vector<int64_t>{33, 256, 257, 1025, 2049}
                                             : std::vector<int64_t>{2,   3,   31,  32,   33,  64,
                                                                    65,  127, 128, 129,  255, 256,
                                                                    257, 384, 1000, 1024, 1025,
                                                                    2047, 2048, 2049};
  const std::vector<int64_t> warp_ks = {1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 32, 33};
  for (DType d : kMainDtypes) {
    for (int64_t n : warp_ns) {
      for (int64_t k : warp_ks) {
        if (k > n) continue;
        const Pattern p = (k + n) % 3 == 0 ? Pattern::kFewValues
                          : (k + n) % 3 == 1 ? Pattern::kRandomBits : Pattern::kSpecials;
        run_one(d, 37, n, k, p);
        if (!quick || k == 1 || k == 8 || k == 32) run_lengths(d, 37, n, k, p);
        if (k == 8) {  // whole rows through lengths: the scalar layout on vector-friendly rows
          run_one(d, 37, n, k, Pattern::kAscending, /*misaligned=*/false, Lengths::kWhole);
        }
        if (!quick && k == 8) {
          run_one(d, 37, n, k, Pattern::kAscending);
          run_one(d, 5, n, k, Pattern::kAllEqual, /*misaligned=*/true);
          run_lengths(d, 5, n, k, Pattern::kAllEqual, /*misaligned=*/true);
        }
      }
      if (!quick) run_one(d, 1, n, std::min<int64_t>(n, 32), Pattern::kGaussian);
    }
  }

  // warp_select fallback tiers (heavy ties at the threshold): tier 2 (packed
  // threshold) for all-equal / few-value rows longer than the 256-candidate
  // capacity, tier 3 (argmax rounds) for 8-bit few-value rows.
  for (DType d : {DType::float32, DType::bfloat16, DType::uint8, DType::int32}) {
    for (int64_t n : {int64_t(257), int64_t(1000), int64_t(2048)}) {
      for (int64_t k : {int64_t(1), int64_t(16), int64_t(17), int64_t(32)}) {
        run_one(d, 37, n, k, Pattern::kAllEqual);
        run_one(d, 37, n, k, Pattern::kFewValues);
        if (!quick || k == 17) {
          run_lengths(d, 37, n, k, Pattern::kAllEqual);
          run_lengths(d, 37, n, k, Pattern::kFewValues);
        }
        if (!quick) run_one(d, 37, n, k, Pattern::kFewValues, /*misaligned=*/true);
      }
    }
  }

  // Long rows on the warp kernel need many rows; the same n with few rows is radix.
  const int64_t warp_rows = kWarpSortMinRowsPerSm * sm + 1;
  for (DType d : {DType::float32, DType::bfloat16, DType::uint8}) {
    for (int64_t n : {int64_t(4097), int64_t(16384)}) {
      for (int64_t k : {int64_t(16), int64_t(32)}) {
        run_one(d, warp_rows, n, k, k == 16 ? Pattern::kGaussian : Pattern::kFewValues);
        run_one(d, 3, n, k, Pattern::kAscending);
        if (!quick || n == 4097) {
          run_lengths(d, warp_rows, n, k, k == 16 ? Pattern::kGaussian : Pattern::kFewValues);
        }
      }
    }
    // Whole rows through lengths on a vector-friendly n: the scalar layout.
    run_one(d, warp_rows, 4096, 32, Pattern::kSpecials, /*misaligned=*/false, Lengths::kWhole);
    if (!quick) {
      run_one(d, warp_rows, 16383, 7, Pattern::kAscending, /*misaligned=*/true);
      run_one(d, warp_rows, 16385, 16, Pattern::kRandomBits);  // just past: radix
      run_one(d, warp_rows, 8192, 32, Pattern::kSpecials);
    }
  }

  // Radix, one block per row: candidate-buffer and block-sort boundaries.
  const std::vector<int64_t> radix_ns = quick ? std::vector<int64_t>{2049, 8192}
                                              : std::vector<int64_t>{100, 2047, 2048, 2049, 4097, 8191, 12289};
  for (DType d : kMainDtypes) {
    for (int64_t n : radix_ns) {
      for (int64_t k : {int64_t(33), int64_t(64), int64_t(255), int64_t(256), int64_t(1000),
                        int64_t(4095), int64_t(4096), int64_t(4097), n - 1, n}) {
        if (k > n || k < 1) continue;
        for (Pattern p : {Pattern::kGaussian, Pattern::kFewValues, Pattern::kSpecials}) {
          run_one(d, 5, n, k, p);
        }
        run_lengths(d, 13, n, k, Pattern::kGaussian);
        if (!quick) {
          run_one(d, 1, n, k, Pattern::kAllEqual);
          run_one(d, 3, n, k, Pattern::kAscending, /*misaligned=*/true);
          run_one(d, 2, n, k, Pattern::kRandomBits);
          run_lengths(d, 13, n, k, Pattern::kFewValues);
          run_lengths(d, 13, n, k, Pattern::kAscending, /*misaligned=*/true);
        }
      }
    }
    // More rows than resident blocks: the grid-stride loop over rows.
    run_one(d, 16 * sm + 5, 1000, 100, Pattern::kGaussian);
    run_one(d, 16 * sm + 5, 3000, 40, Pattern::kFewValues);
    run_lengths(d, 16 * sm + 5, 1000, 100, Pattern::kGaussian);
    if (!quick) run_lengths(d, 16 * sm + 5, 3000, 40, Pattern::kFewValues);
  }

  // Threshold row per block (keys <= 32 bits, k <= kThresholdMaxK): the group
  // slot boundaries (threshold_slots), kThresholdMaxK, the radix fallback
  // (n = 513, k = 128: too few groups, every element is a candidate; 8-bit
  // all-equal rows at large k), and few long rows up to
  // kThresholdFewRowsMaxRowBytes (131072 f32) and just past it (split row);
  // with clusters, the cluster kernel takes them (its sampled threshold where
  // a sample has a window, else up to kClusterMaxRows rows on its radix select).
  for (DType d : {DType::float32, DType::bfloat16, DType::uint8, DType::int32}) {
    for (int64_t n : {int64_t(513), int64_t(8192), int64_t(65536)}) {
      for (int64_t k : {int64_t(32), int64_t(33), int64_t(64), int64_t(65), int64_t(128),
                        int64_t(129), int64_t(256), int64_t(257), int64_t(2047), int64_t(2048),
                        int64_t(2049)}) {
        if (k > n) continue;
        if (quick && n == 65536 && k != 2048) continue;
        run_one(d, 7, n, k, Pattern::kGaussian);
        run_one(d, 3, n, k, Pattern::kAllEqual);
        run_one(d, 3, n, k, Pattern::kFewValues, /*misaligned=*/true);
        run_lengths(d, 13, n, k, Pattern::kGaussian);
        if (!quick) {
          run_one(d, 3, n, k, Pattern::kSpecials);
          run_one(d, 2, n, k, Pattern::kDescending);
          run_lengths(d, 13, n, k, Pattern::kAllEqual);
          run_lengths(d, 13, n, k, Pattern::kFewValues, /*misaligned=*/true);
        }
      }
    }
    run_one(d, 2 * sm + 3, 8192, 64, Pattern::kGaussian);    // more rows than the grid
    run_one(d, 2 * sm + 3, 65536, 2048, Pattern::kFewValues);
    run_lengths(d, 2 * sm + 3, 8192, 64, Pattern::kGaussian);
    if (!quick) run_lengths(d, 2 * sm + 3, 65536, 2048, Pattern::kFewValues);
    // Narrow blocks (threshold_block_threads: kThresholdNarrowMinRowsPerSm
    // rows per SM, k <= kThresholdNarrowMaxK): their slot boundaries (k = 32,
    // 64 on 128 threads), the k limit, and a row too short for its groups.
    // The regime is forced: the warp kernels take these rows otherwise.
    g_topk_regime = TopkRegime::kThresholdRowPerBlock;
    const int64_t narrow_rows = kThresholdNarrowMinRowsPerSm * sm;
    for (int64_t n : {int64_t(200), int64_t(8192)}) {
      for (int64_t k : {int64_t(1), int64_t(32), int64_t(33), int64_t(64), int64_t(65),
                        kThresholdNarrowMaxK, kThresholdNarrowMaxK + 1}) {
        if (k > n) continue;
        run_one(d, narrow_rows, n, k, Pattern::kGaussian);
        run_one(d, narrow_rows, n, k, Pattern::kAllEqual);
        run_one(d, narrow_rows, n, k, Pattern::kFewValues, /*misaligned=*/true);
        run_lengths(d, narrow_rows, n, k, Pattern::kGaussian);
        if (!quick) {
          run_one(d, narrow_rows, n, k, Pattern::kSpecials);
          run_one(d, narrow_rows, n, k, Pattern::kDescending);
          run_lengths(d, narrow_rows, n, k, Pattern::kAllEqual);
        }
      }
    }
    run_one(d, narrow_rows - 1, 8192, 64, Pattern::kGaussian);  // just below: wide blocks
    // Sampled thresholds (whole rows of at least threshold_sample's
    // length; rows with lengths take the group maxima): random, tied,
    // sorted and special rows, and rows made against the sample, whose T
    // leaves too few or too many candidates (the radix select takes them).
    // Wide blocks with doubled loads (5 rows), plain loads (more rows than
    // SMs, no L2 cap on the grid) and narrow blocks.
    for (const auto& [rows, n, k] : {std::tuple<int64_t, int64_t, int64_t>{5, 65536, 2048}, {5, 65536, 1024},
                                     {5, 131072, 1024}, {5, 32768, 600}, {5, 8192, 129}, {5, 8192, 256},
                                     {2 * sm + 3, 65536, 2048}, {2 * sm + 3, 32768, 1024},
                                     {kThresholdSampledNarrowMinRowsPerSm * sm, 8192, 64},
                                     {narrow_rows, 8192, kThresholdNarrowMaxK}}) {
      const int threads = threshold_block_threads(rows, k, sm);
      g_sample_slots = int64_t(threads) * jax_topk::cuda::threshold_row_slots(rows, n, k, dtype_bytes(d), threads,
                                                                              /*whole_rows=*/true, sm);
      if (threshold_sample(n, k, g_sample_slots).rank == 0) {  // narrower keys: more slots
        if (d != DType::float32) continue;
        std::printf("FAIL the sampled-threshold case %lldx%lld k%lld (%d-byte keys) takes no sample\n",
                    (long long)rows, (long long)n, (long long)k, dtype_bytes(d));
        ++g_failed;
        continue;
      }
      for (Pattern p : {Pattern::kGaussian, Pattern::kSampleHigh, Pattern::kSampleLow, Pattern::kAllEqual,
                        Pattern::kAscending, Pattern::kDescending, Pattern::kFewValues, Pattern::kSpecials}) {
        if (quick && rows != 5 && p != Pattern::kGaussian && p != Pattern::kSampleLow) continue;
        run_one(d, rows, n, k, p, /*misaligned=*/p == Pattern::kFewValues);
      }
      run_lengths(d, rows, n, k, Pattern::kGaussian);
    }
    g_topk_regime.reset();
    // Streamed threshold (forced on every length): rows within the first
    // step (narrow: 2048 float32, wide: 8192 or 16384), just past it, and
    // many steps; ascending rows raise the threshold at every step; wide
    // blocks with doubled loads (few rows), plain loads (more rows than SMs)
    // and narrow blocks.
    g_topk_regime = TopkRegime::kThresholdStream;
    for (int64_t rows : {int64_t(5), int64_t(2 * sm + 3), narrow_rows}) {
      for (int64_t n : {int64_t(1), int64_t(200), int64_t(2049), int64_t(16387), int64_t(65536)}) {
        for (int64_t k : {int64_t(1), int64_t(33), int64_t(64), int64_t(129), int64_t(256), int64_t(257),
                          int64_t(1024), kThresholdMaxK}) {
          if (k > n || (rows != 5 && n > 16387)) continue;
          if (quick && (rows != 5 || n == 200) && k != 1 && k != 256 && k != kThresholdMaxK) continue;
          run_one(d, rows, n, k, Pattern::kGaussian);
          run_one(d, rows, n, k, Pattern::kAscending, /*misaligned=*/true);
          run_lengths(d, rows, n, k, Pattern::kGaussian);
          if (!quick || rows == 5) {
            run_one(d, rows, n, k, Pattern::kAllEqual);
            run_one(d, rows, n, k, Pattern::kFewValues, /*misaligned=*/true);
            run_one(d, rows, n, k, Pattern::kDescending);
            run_one(d, rows, n, k, Pattern::kSpecials);
            run_lengths(d, rows, n, k, Pattern::kAscending);
          }
        }
      }
    }
    g_topk_regime.reset();
    // Few long rows: more than the cluster kernel's radix select takes; the
    // threshold kernel where no sample has a window (k = 2048), else the
    // cluster kernel's sampled threshold.
    const int64_t few_threshold_rows = kClusterMaxRows + 1;
    for (int64_t n : {int64_t(131072), int64_t(131073)}) {
      for (int64_t k : {int64_t(50), int64_t(1024), int64_t(2048)}) {
        run_one(d, 1, n, k, Pattern::kGaussian);
        run_one(d, 3, n, k, Pattern::kAllEqual, /*misaligned=*/true);
        if (!quick) run_one(d, 2, n, k, Pattern::kFewValues);
        if (!quick || (n == 131072 && k == 2048)) {
          run_lengths(d, few_threshold_rows, n, k, Pattern::kGaussian);
        }
      }
    }
  }

  // Cluster rows (sm_90+): the regime forced onto every cluster size (n
  // around multiples of kClusterMinChunk up to kClusterMaxN), chunks shorter
  // than a vector, k boundaries, ties across blocks (all-equal and few-value
  // rows: the k-th key's ties go by index over the blocks); then shapes the
  // dispatcher sends there (few rows, a ragged batch).
  if (g_has_clusters || g_dry_run) {
    const std::vector<int64_t> cluster_ns =
        quick ? std::vector<int64_t>{17, 1025, 5000, kClusterMaxN}
              : std::vector<int64_t>{1, 2, 17, 1000, 1025, 2049, 3000, 5000, 7169, 8192, 65536,
                                     kClusterMaxN - 1, kClusterMaxN};
    const std::vector<int64_t> cluster_ks =
        quick ? std::vector<int64_t>{1, 257, kClusterMaxK}
              : std::vector<int64_t>{1, 2, 33, 256, 257, 1000, kClusterMaxK - 1, kClusterMaxK};
    for (DType d : {DType::float32, DType::bfloat16, DType::uint8, DType::int32}) {
      g_topk_regime = TopkRegime::kClusterRows;
      for (int64_t n : cluster_ns) {
        for (int64_t k : cluster_ks) {
          if (k > n) continue;
          const int64_t rows = n > 10000 ? 2 : 5;
          run_one(d, rows, n, k, Pattern::kGaussian);
          run_one(d, rows, n, k, Pattern::kAllEqual);
          run_one(d, rows, n, k, Pattern::kFewValues, /*misaligned=*/true);
          run_lengths(d, 13, n, k, Pattern::kGaussian);
          if (!quick) {
            run_one(d, rows, n, k, Pattern::kSpecials);
            run_one(d, rows, n, k, Pattern::kAscending);
            run_one(d, rows, n, k, Pattern::kDescending, /*misaligned=*/true);
            run_one(d, rows, n, k, Pattern::kRandomBits);
            run_lengths(d, 13, n, k, Pattern::kFewValues);
            run_lengths(d, 13, n, k, Pattern::kAllEqual, /*misaligned=*/true);
          }
        }
      }
      run_one(d, 2 * sm + 1, 3000, 100, Pattern::kGaussian);  // more clusters than fit at once
      // The sampled bins (rows of kClusterBinsMinLen..kClusterBinsMaxLen):
      // every pattern, lengths either side of the bins' bounds; rows made
      // against the bins' sample, all-equal and few-value rows take the
      // radix select after the bins.
      g_sample_slots = 0;
      const std::vector<int64_t> bins_ns =
          quick ? std::vector<int64_t>{kClusterBinsMinLen, 8000, kClusterBinsMaxLen}
                : std::vector<int64_t>{kClusterBinsMinLen - 1, kClusterBinsMinLen, kClusterBinsMinLen + 1, 4097,
                                       8000, kClusterBinsMaxLen, kClusterBinsMaxLen + 1};
      const std::vector<int64_t> bins_ks =
          quick ? std::vector<int64_t>{1, 64, 512, kClusterMaxK}
                : std::vector<int64_t>{1, 2, 33, 64, 255, 512, 1000, 1023, kClusterMaxK};
      for (int64_t n : bins_ns) {
        for (int64_t k : bins_ks) {
          if (k > n) continue;
          for (Pattern p : {Pattern::kGaussian, Pattern::kSpecials, Pattern::kAscending, Pattern::kSampleHigh,
                            Pattern::kSampleLow, Pattern::kAllEqual, Pattern::kRandomBits, Pattern::kDescending,
                            Pattern::kFewValues}) {
            if (quick && (p == Pattern::kRandomBits || p == Pattern::kDescending || p == Pattern::kFewValues)) {
              continue;
            }
            run_one(d, 3, n, k, p, /*misaligned=*/p == Pattern::kSpecials);
          }
          run_lengths(d, 13, n, k, Pattern::kGaussian);
        }
      }
      run_one(d, 2 * sm + 1, 8000, 512, Pattern::kGaussian);  // more clusters than fit at once
      g_topk_regime.reset();
      // The sampled threshold (whole rows with a sample window, the
      // dispatcher's choice: one row on clusters of eight, 17 on five): every
      // pattern; rows made against the sample (its chunks high: too few
      // candidates; low: too many), all-equal and sorted rows take the radix
      // select over the chunks the blocks hold; rows of an odd length start
      // misaligned (the copies' scalar path); lengths (each row's own sample,
      // or the radix select); the most clusters that fit the SMs once.
      g_sample_slots = kClusterSampleSlots;
      for (const auto& [n, k] : {std::pair<int64_t, int64_t>{65536, 2048}, {131072, 1024}, {32768, 100},
                                 {40001, 333}, {65536, 64}}) {
        for (int64_t rows : {int64_t(1), int64_t(17)}) {
          if (!cluster_sampled_dispatch(rows, n, k, dtype_bytes(d), sm)) {
            std::printf("FAIL the cluster's sampled case %lldx%lld k%lld (%d-byte keys) is not dispatched there\n",
                        (long long)rows, (long long)n, (long long)k, dtype_bytes(d));
            ++g_failed;
            continue;
          }
          for (Pattern p : {Pattern::kGaussian, Pattern::kSampleHigh, Pattern::kSampleLow, Pattern::kAllEqual,
                            Pattern::kAscending, Pattern::kDescending, Pattern::kFewValues, Pattern::kSpecials,
                            Pattern::kRandomBits}) {
            if (quick && n == 131072 && p != Pattern::kGaussian && p != Pattern::kSampleLow) continue;
            run_one(d, rows, n, k, p, /*misaligned=*/p == Pattern::kSpecials);
          }
          run_lengths(d, rows == 1 ? 13 : rows, n, k, Pattern::kGaussian);
        }
      }
      run_one(d, sm / 2, 65536, 2048, Pattern::kGaussian);  // the most clusters of two
      run_one(d, sm - 1, 8192, 512, Pattern::kGaussian);
      run_lengths(d, 31, 8000, 512, Pattern::kGaussian);
      run_one(d, 3, kClusterMaxN, kClusterMaxK, Pattern::kFewValues);
    }
  }

  // Register rows: the regime forced onto every elements-per-thread size
  // (n around 1024 * {4, 8, 16}), k at the sort's one/two values per thread
  // and its capacity, ties at the k-th key across threads (all-equal and
  // few-value rows), misaligned rows (scalar loads); then shapes the
  // dispatcher sends there (few rows, the ragged batch, the indexer's rows).
  {
    const std::vector<int64_t> register_ns =
        quick ? std::vector<int64_t>{17, 4097, kRegisterRowsMaxN}
              : std::vector<int64_t>{1, 2, 17, 1000, 4095, 4096, 4097, 8000, 8192, 8193, 12345,
                                     kRegisterRowsMaxN - 1, kRegisterRowsMaxN};
    const std::vector<int64_t> register_ks =
        quick ? std::vector<int64_t>{1, 512, 1025, kRegisterRowsMaxK}
              : std::vector<int64_t>{1, 2, 31, 33, 512, 1000, 1024, 1025, kRegisterRowsMaxK - 1, kRegisterRowsMaxK};
    for (DType d : {DType::float32, DType::bfloat16, DType::uint8, DType::int32}) {
      g_topk_regime = TopkRegime::kRegisterRows;
      for (int64_t n : register_ns) {
        for (int64_t k : register_ks) {
          if (k > n) continue;
          run_one(d, 3, n, k, Pattern::kGaussian);
          run_one(d, 3, n, k, Pattern::kAllEqual);
          run_one(d, 3, n, k, Pattern::kFewValues, /*misaligned=*/true);
          run_lengths(d, 13, n, k, Pattern::kGaussian);
          if (!quick) {
            run_one(d, 3, n, k, Pattern::kSpecials);
            run_one(d, 3, n, k, Pattern::kAscending);
            run_one(d, 3, n, k, Pattern::kDescending, /*misaligned=*/true);
            run_one(d, 3, n, k, Pattern::kRandomBits);
            run_lengths(d, 13, n, k, Pattern::kFewValues);
            run_lengths(d, 13, n, k, Pattern::kAllEqual, /*misaligned=*/true);
          }
        }
      }
      run_one(d, 2 * sm + 1, 3000, 100, Pattern::kGaussian);  // more rows than blocks at once
      run_lengths(d, 31, 8000, 512, Pattern::kGaussian);       // the ragged batch, on its buckets
      run_lengths(d, 31, 8000, 512, Pattern::kFewValues);
      g_topk_regime.reset();
      run_one(d, sm, 8192, 512, Pattern::kGaussian);      // the most rows the dispatcher gives them
      run_one(d, sm + 1, 8192, 512, Pattern::kGaussian);  // one more: the threshold kernel
      run_lengths(d, 31, 8000, 2048, Pattern::kGaussian);
      run_lengths(d, 31, 8000, 2048, Pattern::kFewValues);
    }
  }

  // Radix, rows split over blocks (few rows, long rows), forced: the
  // dispatcher sends rows of up to 512 KB with k <= kThresholdMaxK to the
  // threshold and cluster kernels.
  g_topk_regime = TopkRegime::kRadixSplitRow;
  const std::vector<int64_t> split_ns = quick ? std::vector<int64_t>{16384, 131075}
                                              : std::vector<int64_t>{16384, 16385, 65539, 300007};
  // Lengths cases: at most one row per kind of length.
  const int64_t split_rows = std::min<int64_t>(sm - 1, kMixedLengthKinds);
  for (DType d : kMainDtypes) {
    for (int64_t n : split_ns) {
      for (int64_t k : {int64_t(1), int64_t(16), int64_t(33), int64_t(2048), int64_t(4096),
                        int64_t(4097), n / 2 + 1, n}) {
        run_one(d, 1, n, k, Pattern::kGaussian);
        run_one(d, 3, n, k, Pattern::kFewValues);
        if (!quick || k == 16 || k == 4097 || k == n) {
          run_lengths(d, split_rows, n, k, Pattern::kGaussian);
        }
        if (!quick) {
          run_one(d, 2, n, k, Pattern::kAllEqual, /*misaligned=*/true);
          run_one(d, 2, n, k, Pattern::kSpecials);
          run_one(d, 2, n, k, Pattern::kAscending);
          run_one(d, 2, n, k, Pattern::kDescending);
          if (k == 16 || k == 4097) {
            run_lengths(d, split_rows, n, k, Pattern::kAllEqual, /*misaligned=*/true);
          }
        }
      }
    }
    if (!quick) run_all_lengths(d, split_rows, 65539, 4097, Pattern::kFewValues);  // device-wide sort
    // Just under one row per SM: the widest split-row grid.
    run_one(d, sm - 1, 16385, 100, Pattern::kGaussian);
    run_lengths(d, sm - 1, 16385, 100, Pattern::kGaussian);
    if (!quick) run_one(d, sm - 1, 16385, 5000, Pattern::kFewValues);
  }
  g_topk_regime.reset();

  // A single row of 2^20 (and one just past it).
  for (DType d : kMainDtypes) {
    for (int64_t n : {int64_t(1) << 20, (int64_t(1) << 20) + 7}) {
      for (int64_t k : {int64_t(16), int64_t(2048), n}) {
        run_one(d, 1, n, k, Pattern::kGaussian);
        // Lengths on 3 rows: k-1, k, k+1 (salt 2) and random, random >= k,
        // 0 (salt 11); the other kinds have their split-row cases above.
        for (int64_t salt : {int64_t(2), int64_t(11)}) {
          if (!quick || (salt == 11 && k == 2048 && n == (int64_t(1) << 20))) {
            run_one(d, 3, n, k, Pattern::kGaussian, /*misaligned=*/false, Lengths::kMixed, salt);
          }
        }
        if (!quick) {
          run_one(d, 1, n, k, Pattern::kFewValues);
          run_one(d, 1, n, k, Pattern::kSpecials, /*misaligned=*/true);
        }
      }
    }
  }

  if (big) {
    // rows * n > 2^31: 64-bit offsets everywhere.
    const int64_t n = 4096;
    const int64_t rows = (int64_t(1) << 31) / n + 3;
    run_one(DType::uint8, rows, n, 8, Pattern::kRandomBits);   // warp sort
    run_one(DType::uint8, rows, n, 40, Pattern::kRandomBits);  // radix
  }
}

// ---------------------------------------------------------------------------
struct BenchShape {
  int64_t rows, n, k;
  double torch_h200_us;  // anchor from DESIGN.md / the brief (0: unknown)
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median time of `timed` calls of launch(i), each between two CUDA events,
// after `warmup` untimed ones; microseconds.
template <typename Launch>
double median_launch_us(Launch launch, int warmup, int timed) {
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  for (int i = 0; i < warmup; ++i) launch(i);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> times;
  for (int i = 0; i < timed; ++i) {
    CHECK_CUDA(cudaEventRecord(e0));
    launch(i);
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(double(ms) * 1e3);
  }
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  return median(times);
}

// Per-launch time of `reps` launches captured in one CUDA graph and replayed
// (launch(i, stream)): no host launch cost, as in a jitted JAX executable
// (XLA's command buffers), where the kernel's own span is what counts.
template <typename Launch>
double graph_launch_us(Launch launch, int reps) {
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < 3; ++i) launch(i, stream);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) launch(i, stream);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  constexpr int kReplays = 5;
  CHECK_CUDA(cudaEventRecord(e0, stream));
  for (int r = 0; r < kReplays; ++r) CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaEventRecord(e1, stream));
  CHECK_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return double(ms) * 1e3 / double(kReplays * reps);
}

double measure_copy_bandwidth() {
  const size_t bytes = size_t(512) << 20;
  void *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  const double us = median_launch_us(
      [&](int) { CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 2, 10);
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  return 2.0 * double(bytes) / (us * 1e-6);  // bytes read + written per second
}

// Device copies of one float32 N(0, 1) array of `elems`: as many as together
// exceed twice the L2 (at least 2, at most max_copies), so that timed calls
// rotating over them read HBM, not the L2.
std::vector<float*> normal_inputs(size_t elems, size_t max_copies, std::mt19937_64& rng) {
  const size_t bytes = elems * sizeof(float);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> host(elems);
  for (float& f : host) f = normal(rng);
  std::vector<float*> copies(std::min(max_copies, std::max<size_t>(2, (2 * g_l2_bytes + bytes - 1) / bytes)));
  for (float*& p : copies) {
    CHECK_CUDA(cudaMalloc(&p, bytes));
    CHECK_CUDA(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  return copies;
}

#if defined(JAX_TOPK_PHASE_TIMING)
// Block time per row and phase of 5 warm-up + 30 timed launches (summed over
// the blocks of a row where several share it).
void print_phases(const unsigned long long* cycles, int64_t rows) {
  std::printf("    phases (block us per row):");
  for (int i = 0; i < jax_topk::cuda::kPhaseTimerSlots; ++i) {
    if (cycles[i] == 0) continue;
    std::printf(" %d:%.2f", i, double(cycles[i]) / (35.0 * double(rows)) / (g_clock_khz * 1e-3));
  }
  std::printf("\n");
}

// Appends the block timeline t (read_block_timeline's words; times from the
// first block's start at `first`) to `path`: a line naming `what`, then a line
// a block: block, SM, begin and end us, us per phase. A phase's us run from
// the mark before its last mark (or the block's start) to that mark, the marks
// in time order: exact where each phase is marked once (a row per block), the
// last row's otherwise.
void append_block_timeline(const char* path, const char* what, const std::vector<unsigned long long>& t,
                           unsigned long long first) {
  constexpr int kBlocks = jax_topk::cuda::kBlockTimelineBlocks, kWords = jax_topk::cuda::kBlockTimelineWords;
  constexpr int kPhases = jax_topk::cuda::kPhaseTimerSlots;
  auto at = [&](int b, int w) { return t[size_t(kWords * b + w)]; };
  FILE* f = std::fopen(path, "a");
  if (f == nullptr) return;
  std::fprintf(f, "# %s: block sm begin_us end_us, then us per phase 0..%d\n", what, kPhases - 1);
  for (int b = 0; b < kBlocks; ++b) {
    if (at(b, 0) == 0 || at(b, 1) == 0) continue;  // not run
    std::fprintf(f, "%d %d %.3f %.3f", b, int(at(b, 2)), double(at(b, 0) - first) * 1e-3,
                 double(at(b, 1) - first) * 1e-3);
    for (int i = 0; i < kPhases; ++i) {
      const unsigned long long mark = at(b, 4 + i);
      unsigned long long before = at(b, 3);  // the block's start
      for (int j = 0; j < kPhases; ++j) {
        if (at(b, 4 + j) != 0 && at(b, 4 + j) < mark) before = std::max(before, at(b, 4 + j));
      }
      std::fprintf(f, " %.3f", mark == 0 ? 0.0 : double(mark - before) / (g_clock_khz * 1e-3));
    }
    std::fprintf(f, "\n");
  }
  std::fclose(f);
}

// Where one launch's span goes (the last launch of `relaunch`, a CUDA graph
// of launches back to back: a launch in the steady state of a jitted
// executable): when its blocks began and ended, in us from the first block's
// start (the global timer, comparable across SMs), and how long each took.
// With JAX_TOPK_TIMELINE_DUMP set, every block's line is appended to that
// file (append_block_timeline) under a line naming `what`.
template <typename Relaunch>
void print_block_timeline(const char* what, Relaunch&& relaunch) {
  constexpr int kBlocks = jax_topk::cuda::kBlockTimelineBlocks, kWords = jax_topk::cuda::kBlockTimelineWords;
  std::vector<unsigned long long> t(size_t(kWords * kBlocks));
  CHECK_CUDA(jax_topk::cuda::read_block_timeline(t.data()));  // zero it
  relaunch();
  CHECK_CUDA(jax_topk::cuda::read_block_timeline(t.data()));
  auto at = [&](int b, int w) { return t[size_t(kWords * b + w)]; };
  unsigned long long first = ~0ull;
  std::vector<unsigned long long> stamps;
  std::vector<int> sms;
  for (int b = 0; b < kBlocks; ++b) {
    if (at(b, 0) == 0 || at(b, 1) == 0) continue;  // not run
    first = std::min(first, at(b, 0));
    stamps.push_back(at(b, 0));
    stamps.push_back(at(b, 1));
    sms.push_back(int(at(b, 2)));
  }
  if (stamps.empty()) return;
  if (const char* path = std::getenv("JAX_TOPK_TIMELINE_DUMP")) append_block_timeline(path, what, t, first);
  std::vector<double> begins, ends, took;
  for (size_t i = 0; i < stamps.size(); i += 2) {
    begins.push_back(double(stamps[i] - first) * 1e-3);
    ends.push_back(double(stamps[i + 1] - first) * 1e-3);
    took.push_back(double(stamps[i + 1] - stamps[i]) * 1e-3);
  }
  auto pct = [](std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
  };
  // The timer's step: the smallest gap between two distinct stamps.
  std::sort(stamps.begin(), stamps.end());
  unsigned long long step = ~0ull;
  for (size_t i = 1; i < stamps.size(); ++i) {
    if (stamps[i] != stamps[i - 1]) step = std::min(step, stamps[i] - stamps[i - 1]);
  }
  std::sort(sms.begin(), sms.end());
  const size_t sm_count = size_t(std::unique(sms.begin(), sms.end()) - sms.begin());
  std::printf("    timeline (us, %zu blocks on %zu SMs, timer step %.3f): begins p50 %.2f p90 %.2f max %.2f | "
              "ends min %.2f p10 %.2f p50 %.2f p90 %.2f max %.2f | blocks took p10 %.2f p50 %.2f p90 %.2f max %.2f\n",
              took.size(), sm_count, double(step) * 1e-3, pct(begins, 0.5), pct(begins, 0.9), pct(begins, 1.0),
              pct(ends, 0.0), pct(ends, 0.1), pct(ends, 0.5), pct(ends, 0.9), pct(ends, 1.0), pct(took, 0.1),
              pct(took, 0.5), pct(took, 0.9), pct(took, 1.0));
}
#endif

// The regimes the benchmarks time beside the dispatched one, where they hold
// the shape (where the thresholds between them lie).
constexpr TopkRegime kComparedRegimes[] = {TopkRegime::kRegisterRows, TopkRegime::kThresholdRowPerBlock,
                                           TopkRegime::kThresholdStream,
                                           TopkRegime::kClusterRows, TopkRegime::kRadixSplitRow};

// How many clusters of the cluster kernel are resident at once, for rows of
// n and k and each cluster size (the kernel's waves; asked of this
// translation unit's instantiation of the same kernel), and the size `rows`
// rows get.
void print_cluster_occupancy(int64_t rows, int64_t n, int64_t k) {
#if defined(JAX_TOPK_HAS_CLUSTERS)
  if (!g_has_clusters) return;
  auto kernel = jax_topk::cuda::cluster_topk_rows_kernel<uint32_t, false>;  // the radix / bins instantiation
  std::printf("cluster kernel, rows of %lld, k %lld: resident clusters", (long long)n, (long long)k);
  for (int blocks : {1, 2, 3, 4, 8}) {
    const size_t smem =
        jax_topk::cuda::cluster_smem_bytes<uint32_t>(jax_topk::cuda::cluster_chunk<uint32_t>(n, blocks), k, false);
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config = jax_topk::cuda::cluster_launch_config(64, blocks, smem, 0, &attribute);
    int clusters = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    std::printf("  %d of %d blocks", clusters, blocks);
  }
  std::printf(" (%lld rows: %d blocks a row)\n", (long long)rows, cluster_blocks_per_row(rows, n, k, 4, g_sm_count));
#endif
}

// The sort issue's ragged batch: 31 rows of lengths uniform in 2000..8000,
// padded to width = 8000, k = 512 (and 1024, and the indexer's 2048), one call
// with lengths; in every regime that holds. width = 7825 is the width of
// benchmarks/ragged.py's batch (padded to its longest drawn row; the lengths
// here are drawn up to it): rows not a multiple of 16 bytes long.
void run_ragged_bench(int64_t k, int64_t width = 8000) {
  constexpr int64_t kRows = 31;
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int32_t> length(2000, int32_t(width));
  std::vector<int32_t> host_lengths(kRows);
  for (int32_t& l : host_lengths) l = length(rng);
  const std::vector<float*> inputs = normal_inputs(size_t(kRows * width), 64, rng);
  const int nbuf = int(inputs.size());
  float* values = nullptr;
  int32_t* indices = nullptr;
  int32_t* lengths = nullptr;
  CHECK_CUDA(cudaMalloc(&values, size_t(kRows * k) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&indices, size_t(kRows * k) * sizeof(int32_t)));
  CHECK_CUDA(cudaMalloc(&lengths, size_t(kRows) * sizeof(int32_t)));
  CHECK_CUDA(cudaMemcpy(lengths, host_lengths.data(), size_t(kRows) * sizeof(int32_t), cudaMemcpyHostToDevice));
  const TopkRegime dispatched = choose_topk_regime(kRows, width, k, 4, g_sm_count, g_has_clusters);
  print_cluster_occupancy(kRows, width, k);
  std::vector<TopkRegime> regimes = {dispatched};
  for (TopkRegime r : kComparedRegimes) {
    if (g_compare_regimes && r != dispatched) regimes.push_back(r);
  }
  for (TopkRegime r : regimes) {
    if (!topk_regime_holds(r, width, k, 4, g_has_clusters)) continue;
    const size_t bytes = jax_topk::cuda::topk_scratch_bytes(DType::float32, kRows, width, k, r);
    void* scratch = nullptr;
    if (bytes) CHECK_CUDA(cudaMalloc(&scratch, bytes));
    // The launch of rows [first, first + rows) of the batch.
    auto launch_rows = [&](int64_t first, int64_t rows) {
      return [&, first, rows](int i, cudaStream_t stream) {
        CHECK_CUDA(jax_topk::cuda::topk_rows(DType::float32, inputs[size_t(i % nbuf)] + first * width, values, indices,
                                             rows, width, k, lengths + first, scratch, bytes, stream, r));
      };
    };
    const auto launch_on = launch_rows(0, kRows);
    auto launch = [&](int i) { launch_on(i, 0); };
#if defined(JAX_TOPK_PHASE_TIMING)
    unsigned long long cycles[jax_topk::cuda::kPhaseTimerSlots];
    CHECK_CUDA(jax_topk::cuda::read_phase_cycles(cycles));  // zero them
#endif
    char label[40];
    std::snprintf(label, sizeof label, "ragged 31x%lld k%lld", (long long)width, (long long)k);
    const double event_us = median_launch_us(launch, 5, 30);
#if defined(JAX_TOPK_PHASE_TIMING)
    CHECK_CUDA(jax_topk::cuda::read_phase_cycles(cycles));  // the 35 launches above
#endif
    // CUDA events around each launch also time the host's launch; the graph
    // time is the kernel's span, as in a jitted executable.
    // "cold": one launch per input copy (64 of ~1 MB here, more than the L2),
    // so the rows come mostly from DRAM, as in a jitted executable of 128
    // replicas (benchmarks/ragged.py); the 32 launches of "graph" revisit
    // theirs in L2.
    std::printf("%-22s %-20s %10.1f  graph %6.1f  cold %6.1f%s\n", label, topk_regime_name(r), event_us,
                graph_launch_us(launch_on, 32), graph_launch_us(launch_on, nbuf),
                r == dispatched ? "  (dispatched)" : "");
#if defined(JAX_TOPK_PHASE_TIMING)
    print_phases(cycles, kRows);
    print_block_timeline(label, [&] { graph_launch_us(launch_on, 32); });
#endif
    if (g_compare_regimes && k == 512 && (r == TopkRegime::kClusterRows || r == TopkRegime::kThresholdRowPerBlock)) {
      // The batch's first rows alone: how the span grows with the rows
      // (the launch of the blocks or clusters against the work of a row).
      std::printf("    graph us of the first rows:");
      for (int64_t rows : {1, 2, 4, 8, 16, 31}) {
        std::printf("  %lld: %.1f", (long long)rows, graph_launch_us(launch_rows(0, rows), 32));
      }
      std::printf("\n    graph us of each row alone (length):");
      for (int64_t row = 0; row < kRows; ++row) {
        std::printf(" %.1f (%d)", graph_launch_us(launch_rows(row, 1), 32), host_lengths[size_t(row)]);
      }
      std::printf("\n");
    }
    if (scratch) CHECK_CUDA(cudaFree(scratch));
  }
  for (float* p : inputs) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(values));
  CHECK_CUDA(cudaFree(indices));
  CHECK_CUDA(cudaFree(lengths));
}

void run_bench(const std::string& only) {
  const double bw = measure_copy_bandwidth();
  std::printf("copy bandwidth (read+write) %.2f TB/s, L2 %.1f MB, %d SMs\n", bw * 1e-12,
              double(g_l2_bytes) / 1e6, g_sm_count);
  std::vector<BenchShape> shapes = {
      {16384, 64, 2, 0},      {16384, 128, 8, 0},    {16384, 256, 8, 205}, {16384, 384, 6, 320},
      {4096, 64, 16, 0},      {4096, 256, 16, 0},    {4096, 1024, 16, 0},  {4096, 2048, 16, 182},
      {4096, 256, 32, 0},     {4096, 2048, 32, 0},   {8192, 1024, 16, 251}, {1024, 8192, 64, 0},
      {1024, 8192, 256, 164}, {128, 131072, 50, 0},  {128, 131072, 1024, 272},
      {64, 65536, 2048, 0},   {2048, 65536, 2048, 1712}, {1, 131072, 2048, 0},
      {1, 1048576, 16, 0},    {1, 1048576, 2048, 0}};
  if (g_compare_regimes) {
    // Few rows, where the cluster, threshold and split-row regimes cross.
    for (int64_t rows : {1, 4, 8, 16, 32}) {
      for (const auto& [n, k] : {std::pair<int64_t, int64_t>{131072, 2048}, {131072, 64}, {65536, 2048},
                                 {32768, 512}, {16384, 512}}) {
        shapes.push_back({rows, n, k, 0});
      }
    }
    // Rows from kClusterMaxRows + 1 up, where the cluster kernel's sampled
    // threshold shrinks its clusters (to two blocks on rows of 65536 float32
    // or less, four on 131072) and meets the threshold kernel.
    for (int64_t rows : {17, 32, 48, 64, 66}) {
      for (const auto& [n, k] : {std::pair<int64_t, int64_t>{65536, 2048}, {65536, 256}, {32768, 512}}) {
        shapes.push_back({rows, n, k, 0});
      }
    }
    for (int64_t rows : {17, 33}) {
      for (const auto& [n, k] : {std::pair<int64_t, int64_t>{131072, 1024}, {131072, 64}}) {
        shapes.push_back({rows, n, k, 0});
      }
    }
    // Few rows of at most kRegisterRowsMaxN, where the register-rows and
    // threshold kernels cross (rows around the SM count; k small and large).
    for (int64_t rows : {1, 31, 132, 264}) {
      for (const auto& [n, k] : {std::pair<int64_t, int64_t>{8192, 512}, {8192, 2048}, {16384, 64},
                                 {16384, 2048}, {4096, 256}}) {
        shapes.push_back({rows, n, k, 0});
      }
    }
    // Rows per SM around kThresholdNarrowMinRowsPerSm, where the threshold
    // kernel's narrow and wide blocks cross (and, at n <= 2048, where it
    // meets the warp kernels), and kThresholdSampledNarrowMinRowsPerSm, where
    // narrow blocks sample rows of 8192 at k = 64.
    for (int64_t per_sm : {1, 2, 4, 6, 8, 16}) {
      for (const auto& [n, k] : {std::pair<int64_t, int64_t>{8192, 64}, {8192, 256}, {4096, 128}, {2048, 32}}) {
        shapes.push_back({per_sm * g_sm_count, n, k, 0});
      }
    }
  }
  // len_us: the same call with a lengths array of n per row (the lengths
  // path doing the whole-row work: its overhead).
  // us, len_us: CUDA events around each launch (the host's launch included);
  // graph_us: 32 launches in one CUDA graph, the kernel's span as in a jitted
  // executable (what benchmarks/run.py's device clock sees).
  std::printf("%-22s %-20s %10s %10s %10s %8s %12s %9s\n", "shape (f32)", "regime", "us", "len_us",
              "floor_us", "floor/t", "torch_h200", "graph_us");
  std::mt19937_64 rng(1);
  for (const BenchShape& s : shapes) {
    char shape[64];
    std::snprintf(shape, sizeof shape, "%lldx%lld k%lld", (long long)s.rows, (long long)s.n,
                  (long long)s.k);
    if (!only.empty() && std::string(shape).find(only) == std::string::npos) continue;
    const size_t elems = size_t(s.rows * s.n);
    const size_t bytes = elems * sizeof(float);
    const std::vector<float*> inputs = normal_inputs(elems, 64, rng);
    const int nbuf = int(inputs.size());
    float* values = nullptr;
    int32_t* indices = nullptr;
    CHECK_CUDA(cudaMalloc(&values, size_t(s.rows * s.k) * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&indices, size_t(s.rows * s.k) * sizeof(int32_t)));
    const size_t scratch_bytes = jax_topk::cuda::topk_scratch_bytes(DType::float32, s.rows, s.n, s.k);
    void* scratch = nullptr;
    if (scratch_bytes) CHECK_CUDA(cudaMalloc(&scratch, scratch_bytes));
    int32_t* whole_lengths = nullptr;
    {
      const std::vector<int32_t> host_lengths(static_cast<size_t>(s.rows), int32_t(s.n));
      CHECK_CUDA(cudaMalloc(&whole_lengths, size_t(s.rows) * sizeof(int32_t)));
      CHECK_CUDA(cudaMemcpy(whole_lengths, host_lengths.data(), size_t(s.rows) * sizeof(int32_t),
                            cudaMemcpyHostToDevice));
    }
    auto launch_on = [&](int i, cudaStream_t stream, const int32_t* lengths, TopkRegime r, void* scratch_r,
                         size_t bytes_r) {
      CHECK_CUDA(jax_topk::cuda::topk_rows(DType::float32, inputs[size_t(i % nbuf)], values, indices, s.rows, s.n,
                                           s.k, lengths, scratch_r, bytes_r, stream, r));
    };
    const TopkRegime dispatched = choose_topk_regime(s.rows, s.n, s.k, 4, g_sm_count, g_has_clusters);
    auto time_us = [&](const int32_t* lengths) {
      return median_launch_us([&](int i) { launch_on(i, 0, lengths, dispatched, scratch, scratch_bytes); }, 5, 30);
    };
    auto graph_us = [&](TopkRegime r, void* scratch_r, size_t bytes_r) {
      return graph_launch_us(
          [&](int i, cudaStream_t stream) { launch_on(i, stream, nullptr, r, scratch_r, bytes_r); }, 32);
    };
    // The other regimes that hold the shape (where the thresholds lie).
    auto time_other_regimes = [&](double floor_us) {
      for (TopkRegime r : kComparedRegimes) {
        if (r == dispatched || !topk_regime_holds(r, s.n, s.k, 4, g_has_clusters)) continue;
        const size_t bytes_r = jax_topk::cuda::topk_scratch_bytes(DType::float32, s.rows, s.n, s.k, r);
        void* scratch_r = nullptr;
        if (bytes_r) CHECK_CUDA(cudaMalloc(&scratch_r, bytes_r));
        const double t = median_launch_us([&](int i) { launch_on(i, 0, nullptr, r, scratch_r, bytes_r); }, 5, 30);
        std::printf("%-22s %-20s %10.1f %10s %10.1f %8.2f %12s %9.1f\n", "", topk_regime_name(r), t, "", floor_us,
                    floor_us / t, "", graph_us(r, scratch_r, bytes_r));
        if (scratch_r) CHECK_CUDA(cudaFree(scratch_r));
      }
    };
#if defined(JAX_TOPK_PHASE_TIMING)
    unsigned long long cycles[jax_topk::cuda::kPhaseTimerSlots];
    CHECK_CUDA(jax_topk::cuda::read_phase_cycles(cycles));  // zero them
#endif
    const double t = time_us(nullptr);
#if defined(JAX_TOPK_PHASE_TIMING)
    CHECK_CUDA(jax_topk::cuda::read_phase_cycles(cycles));
#endif
    const double t_len = time_us(whole_lengths);
    const double floor_us = (double(bytes) + double(s.rows * s.k) * 8.0) / bw * 1e6;
    char torch[32] = "-";
    if (s.torch_h200_us > 0) std::snprintf(torch, sizeof torch, "%.0f", s.torch_h200_us);
    std::printf("%-22s %-20s %10.1f %10.1f %10.1f %8.2f %12s %9.1f\n", shape, topk_regime_name(dispatched), t,
                t_len, floor_us, floor_us / t, torch, graph_us(dispatched, scratch, scratch_bytes));
    if (g_compare_regimes) time_other_regimes(floor_us);
#if defined(JAX_TOPK_PHASE_TIMING)
    print_phases(cycles, s.rows);
    print_block_timeline(shape, [&] { graph_us(dispatched, scratch, scratch_bytes); });
#endif
    for (float* p : inputs) CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaFree(values));
    CHECK_CUDA(cudaFree(indices));
    CHECK_CUDA(cudaFree(whole_lengths));
    if (scratch) CHECK_CUDA(cudaFree(scratch));
  }
  if (only.empty() || only == "ragged") {
    for (int64_t k : {512, 1024, 2048}) run_ragged_bench(k);
    run_ragged_bench(512, 7825);
  }
}

// The sort suite: every dtype the CUDA sort takes, both directions, row
// lengths around each block capacity and tile multiple, with and without
// per-row lengths (k of a case only shapes its mixed lengths); then the tile
// regime alone on rows the dispatcher gives the warp and block regimes
// (single partial tiles).
void run_sort_suite(bool quick, bool big) {
  std::vector<int64_t> ns = {1, 2, 3, 5000, 70001};
  for (int64_t c = kWarpSizeForSort; c <= kSortWarpMaxN; c *= 2) {
    for (int64_t d : {-1, 0, 1}) ns.push_back(c + d);
  }
  for (const auto& shape : kSortBlockShapes) {
    for (int64_t d : {-1, 0, 1}) ns.push_back(shape.capacity() + d);
  }
  for (int64_t d : {-1, 0, 1}) ns.push_back(2 * kSortTileElements + d);
  std::vector<DType> dtypes;
  for (DType d : kAllDtypes) {
    if (sort_gpu_dtype(d)) dtypes.push_back(d);
  }
  auto run_ns = [&](const std::vector<int64_t>& lengths_of_rows) {
    for (DType d : dtypes) {
      run_one(d, 0, 5, 0, Pattern::kRandomBits);
      run_one(d, 3, 0, 0, Pattern::kRandomBits);
      for (int64_t n : lengths_of_rows) {
        const int64_t rows = n > kSortBlockMaxN ? 3 : 37;
        for (Pattern p : kAllPatterns) {
          if (quick && p != Pattern::kFewValues && p != Pattern::kSpecials) continue;
          if (d != DType::float32 && p != Pattern::kSpecials && p != Pattern::kFewValues) continue;
          run_one(d, rows, n, 0, p);
        }
        run_one(d, rows, n, 0, Pattern::kGaussian, /*misaligned=*/true);
        run_all_lengths(d, rows, n, std::max<int64_t>(1, n / 3), Pattern::kFewValues);
      }
    }
  };
  for (Op op : {Op::kSortAscending, Op::kSortDescending}) {
    g_op = op;
    run_ns(ns);
    run_one(DType::float32, 300, 256, 0, Pattern::kGaussian);  // more rows than one wave of blocks
    run_one(DType::float32, 300, 9000, 0, Pattern::kGaussian);  // tiles of many rows at once
    g_sort_regime = SortRegime::kRowTiles;
    run_ns({1, 2, 31, 1000, kSortTileElements - 1, kSortTileElements});
    g_sort_regime.reset();
    if (big) {
      // Several chunks of the tile regime (kSortChunkMaxElements each).
      const int64_t n = 1 << 20, rows = kSortChunkMaxElements / n + 1;
      run_one(DType::uint8, rows, n, 0, Pattern::kFewValues);
      run_lengths(DType::bfloat16, rows, n, n / 2, Pattern::kSpecials);
    }
  }
  g_op = Op::kTopK;
}

// Sort timings (float32 N(0,1), ascending) of the sort issue's shapes and a
// few more, in every regime that holds the row (where the thresholds lie).
void run_sort_bench(const std::string& only) {
  struct Shape {
    int64_t rows, n;
  };
  const Shape shapes[] = {{16384, 256}, {4096, 2048}, {1024, 8192}, {128, 131072}, {64, 65536},
                          {16384, 128}, {16384, 512}, {8192, 1024}, {2048, 4096}, {512, 16384}, {1, 1048576}, {16, 1048576}};
  const SortRegime regimes[] = {SortRegime::kRowInWarp, SortRegime::kRowInBlock, SortRegime::kRowTiles};
  const double bw = measure_copy_bandwidth();
  std::printf("copy bandwidth (read+write) %.2f TB/s\n", bw * 1e-12);
  std::printf("%-16s %-14s %10s %10s %8s\n", "sort (f32)", "regime", "us", "floor_us", "floor/t");
  std::mt19937_64 rng(2);
  for (const Shape& s : shapes) {
    char shape[64];
    std::snprintf(shape, sizeof shape, "%lldx%lld", (long long)s.rows, (long long)s.n);
    if (!only.empty() && std::string(shape).find(only) == std::string::npos) continue;
    const size_t elems = size_t(s.rows * s.n), bytes = elems * sizeof(float);
    const std::vector<float*> inputs = normal_inputs(elems, 16, rng);
    const int nbuf = int(inputs.size());
    float* values = nullptr;
    int32_t* indices = nullptr;
    CHECK_CUDA(cudaMalloc(&values, bytes));
    CHECK_CUDA(cudaMalloc(&indices, elems * sizeof(int32_t)));
    // Floor: the input read once, values and indices written once.
    const double floor_us = 3.0 * double(bytes) / bw * 1e6;
    for (SortRegime regime : regimes) {
      if (!sort_regime_holds(regime, s.n)) continue;
      const size_t scratch_bytes = jax_topk::cuda::sort_scratch_bytes(DType::float32, s.rows, s.n, regime);
      void* scratch = nullptr;
      if (scratch_bytes) CHECK_CUDA(cudaMalloc(&scratch, scratch_bytes));
      auto launch = [&](int i) {
        CHECK_CUDA(jax_topk::cuda::sort_rows(DType::float32, inputs[size_t(i % nbuf)], values, indices, s.rows,
                                             s.n, false, nullptr, scratch, scratch_bytes, 0, regime));
      };
      const double t = median_launch_us(launch, 3, 15);
      std::printf("%-16s %-14s %10.1f %10.1f %8.2f%s\n", shape, sort_regime_name(regime), t, floor_us,
                  floor_us / t, regime == choose_sort_regime(s.rows, s.n) ? "  (dispatched)" : "");
      if (scratch) CHECK_CUDA(cudaFree(scratch));
    }
    for (float* p : inputs) CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaFree(values));
    CHECK_CUDA(cudaFree(indices));
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool bench = false, quick = false, big = false, dry = false, sort = false, no_clusters = false;
  std::string only;  // --bench: only the shapes whose "RxN kK" contains this
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bench") bench = true;
    else if (a == "--quick") quick = g_quick = true;
    else if (a == "--big") big = true;
    else if (a == "--dry-run") dry = true;
    else if (a == "--lengths") g_lengths_only = true;
    else if (a == "--sort") sort = true;
    else if (a == "--regimes") g_compare_regimes = true;
    else if (a == "--max-elements" && i + 1 < argc) g_max_elements = std::stoll(argv[++i]);
    else if (a == "--min-elements" && i + 1 < argc) g_min_elements = std::stoll(argv[++i]);
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--no-clusters") no_clusters = true;
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--big] [--bench] [--dry-run] [--lengths] [--sort] [--max-elements N] [--min-elements N] [--only SHAPE] [--regimes] [--no-clusters]\n",
                   argv[0]);
      return 2;
    }
  }
  if (dry) {  // what the suite would run, on a 132-SM device
    g_dry_run = true;
    g_sm_count = 132;
    g_has_clusters = true;
    sort ? run_sort_suite(quick, big) : run_suite(quick, big);
    std::printf("%lld cases, %.1f M elements\n", (long long)g_dry_cases, double(g_dry_elements) / 1e6);
    return 0;
  }
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  g_sm_count = prop.multiProcessorCount;
  g_has_clusters = prop.major >= 9 && !no_clusters;
  g_no_clusters = prop.major >= 9 && no_clusters;
  {
    int khz = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
    g_clock_khz = khz > 0 ? double(khz) : 1.0;
  }
  g_l2_bytes = size_t(prop.l2CacheSize);
  std::printf("device: %s, %d SMs\n", prop.name, g_sm_count);
  if (bench) {
    sort ? run_sort_bench(only) : run_bench(only);
    return 0;
  }
  sort ? run_sort_suite(quick, big) : run_suite(quick, big);
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
