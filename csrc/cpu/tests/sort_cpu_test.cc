// Standalone test and benchmark of cpu::sort_rows against a std::stable_sort oracle.
//
// Build and run from the repository root:
//   g++ -std=c++17 -O3 -Icsrc/include -Icsrc csrc/cpu/sort_cpu.cc csrc/cpu/tests/sort_cpu_test.cc -pthread -o /tmp/sort_cpu_test && /tmp/sort_cpu_test
// `/tmp/sort_cpu_test --bench` times the benchmark shapes instead (1 and 2 threads).
//
// The oracle orders raw bits by its own statement of the contract (sign and
// magnitude for floats, not keys.h), sorts indices with std::stable_sort and
// must match sort_rows bit for bit, padding included.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "cpu/sort_cpu.h"

namespace jax_topk::cpu {
namespace {

// ---- runners ----------------------------------------------------------------

// A fixed set of threads running queued jobs: the shape of XLA's intra-op pool.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void schedule(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    wake_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::vector<std::thread> threads_;
  std::deque<std::function<void()>> jobs_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
};

// The FFI layer's runner protocol (HelpingTaskRunner) on a pool of our own:
// `threads` counts the caller, so the pool holds threads - 1 helpers (held in
// a base so that it is built before the runner that schedules on it).
struct PoolSchedule {
  ThreadPool* pool;
  void operator()(std::function<void()> job) const { pool->schedule(std::move(job)); }
};
struct PoolHolder {
  explicit PoolHolder(int helpers) : pool(helpers) {}
  ThreadPool pool;
};
class PoolRunner final : private PoolHolder, public HelpingTaskRunner<PoolSchedule> {
 public:
  explicit PoolRunner(int threads) : PoolHolder(threads - 1), HelpingTaskRunner(threads, PoolSchedule{&pool}) {}
};

// ---- the oracle -------------------------------------------------------------

// a < b in the contract's order, stated directly on the bits.
template <typename Traits>
bool contract_less(typename Traits::Bits a, typename Traits::Bits b) {
  using Bits = typename Traits::Bits;
  if constexpr (Traits::kKeyKind == KeyKind::kFloat) {
    constexpr Bits kSign = Bits(Bits(1) << (8 * sizeof(Bits) - 1));
    const bool neg_a = a & kSign, neg_b = b & kSign;
    const Bits mag_a = a & Bits(~kSign), mag_b = b & Bits(~kSign);
    if (neg_a != neg_b) return neg_a;          // every negative (-0, -NaN too) below every positive
    return neg_a ? mag_a > mag_b : mag_a < mag_b;  // NaN payloads order by magnitude bits too
  } else if constexpr (Traits::kKeyKind == KeyKind::kSigned) {
    using Signed = std::make_signed_t<Bits>;
    return Signed(a) < Signed(b);
  } else {
    return a < b;
  }
}

template <typename Traits>
void oracle_sort(const typename Traits::Bits* x, int64_t rows, int64_t n, bool descending,
                 const int32_t* lengths, typename Traits::Bits* values, int32_t* indices) {
  using Bits = typename Traits::Bits;
  std::vector<int32_t> order;
  for (int64_t r = 0; r < rows; ++r) {
    const Bits* row = x + r * n;
    const int64_t len = lengths ? lengths[r] : n;
    order.resize(len);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t i, int32_t j) {
      return descending ? contract_less<Traits>(row[j], row[i]) : contract_less<Traits>(row[i], row[j]);
    });
    for (int64_t j = 0; j < n; ++j) {
      values[r * n + j] = j < len ? row[order[j]] : Traits::kLowestBits;
      indices[r * n + j] = j < len ? order[j] : -1;
    }
  }
}

// ---- inputs -----------------------------------------------------------------

enum class Pattern { kRandomBits, kTies, kAllEqual, kSpecials, kNarrow };
const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::kRandomBits: return "random";
    case Pattern::kTies: return "ties";
    case Pattern::kAllEqual: return "all_equal";
    case Pattern::kSpecials: return "specials";
    case Pattern::kNarrow: return "narrow";
  }
  return "?";
}

// The bits of +1.0 for a float dtype: the exponent bias, read off -inf.
template <typename Traits>
typename Traits::Bits float_one() {
  using Bits = typename Traits::Bits;
  const Bits inf = Bits(Traits::kLowestBits << 1 >> 1);  // exponent all ones, mantissa 0
  const int mantissa = __builtin_ctzll(uint64_t(inf));
  return Bits(Bits(inf >> mantissa >> 1) << mantissa);
}

// Bit patterns that break sorts: ±0, ±inf, NaNs of both signs with several
// payloads (quiet and signalling), denormals, the extremes, ±1.
template <typename Traits>
std::vector<typename Traits::Bits> special_values() {
  using Bits = typename Traits::Bits;
  constexpr int kBits = 8 * sizeof(Bits);
  const Bits sign = Bits(Bits(1) << (kBits - 1));
  if constexpr (Traits::kKeyKind == KeyKind::kFloat) {
    const Bits inf = Bits(Traits::kLowestBits & Bits(~sign));  // exponent all ones, mantissa 0
    const int mantissa = __builtin_ctzll(uint64_t(inf));
    const Bits quiet = Bits(Bits(1) << (mantissa - 1));
    std::vector<Bits> v = {0, inf, Bits(inf | quiet), Bits(inf | 1), Bits(inf | quiet | 5),
                           Bits(~sign), 1, 2, Bits(quiet - 1), Bits(quiet), Bits(Bits(1) << mantissa),
                           Bits(inf - 1), float_one<Traits>()};
    const size_t positives = v.size();
    for (size_t i = 0; i < positives; ++i) v.push_back(Bits(v[i] | sign));
    return v;
  } else {
    return {0, 1, Bits(~Bits(0)), sign, Bits(sign - 1), Bits(sign + 1), 2};
  }
}

template <typename Traits>
std::vector<typename Traits::Bits> make_input(Pattern pattern, int64_t count, std::mt19937_64& rng) {
  using Bits = typename Traits::Bits;
  std::vector<Bits> x(count);
  auto random_bits = [&] { return Bits(rng()); };
  auto from_pool = [&](const std::vector<Bits>& pool) {
    for (auto& v : x) v = pool[rng() % pool.size()];
  };
  switch (pattern) {
    case Pattern::kRandomBits:
      for (auto& v : x) v = random_bits();
      break;
    case Pattern::kTies:
      from_pool({random_bits(), random_bits(), random_bits(), random_bits()});
      break;
    case Pattern::kAllEqual:
      from_pool({random_bits()});
      break;
    case Pattern::kSpecials:
      from_pool(special_values<Traits>());
      break;
    case Pattern::kNarrow: {
      // Few distinct high bits, so most radix digits are skipped: small
      // integers, or floats near 1.0 (the "one" of special_values) of either sign.
      Bits base = 0;
      if constexpr (Traits::kKeyKind == KeyKind::kFloat) base = float_one<Traits>();
      const Bits sign = Bits(Bits(1) << (8 * sizeof(Bits) - 1));
      for (auto& v : x) v = Bits(base | (rng() & 0x1F) | ((rng() & 7) == 0 ? sign : 0));
      break;
    }
  }
  return x;
}

enum class Lengths { kNone, kZero, kFull, kMixed };
const char* lengths_name(Lengths l) {
  switch (l) {
    case Lengths::kNone: return "none";
    case Lengths::kZero: return "zero";
    case Lengths::kFull: return "full";
    case Lengths::kMixed: return "mixed";
  }
  return "?";
}

std::vector<int32_t> make_lengths(Lengths mode, int64_t rows, int64_t n, std::mt19937_64& rng) {
  std::vector<int32_t> lengths(rows);
  for (int64_t r = 0; r < rows; ++r) {
    switch (mode) {
      case Lengths::kNone:
      case Lengths::kFull: lengths[r] = int32_t(n); break;
      case Lengths::kZero: lengths[r] = 0; break;
      case Lengths::kMixed: {
        // Mostly random, with the edges 0, 1, n-1, n and the regime edges of
        // sort_cpu.cc: comparison sort up to 32, 11-bit digits from 2^14,
        // rows split over threads from 2^15.
        const int64_t edges[] = {0, 1, n - 1, n, 32, 33, 1 << 14, 1 << 15};
        const int64_t pick = rng() % 12;
        const int64_t len = pick < 8 ? edges[pick] : int64_t(rng() % (n + 1));
        lengths[r] = int32_t(std::clamp<int64_t>(len, 0, n));
      }
    }
  }
  return lengths;
}

// ---- the test ---------------------------------------------------------------

struct Tally {
  int64_t passed = 0, failed = 0;
};

struct NamedRunner {
  const char* name;
  TaskRunner* runner;
};

template <typename Traits>
void check_case(DType dtype, Pattern pattern, int64_t rows, int64_t n, Lengths lengths_mode,
                const std::vector<NamedRunner>& runners, std::mt19937_64& rng, Tally& tally) {
  using Bits = typename Traits::Bits;
  const std::vector<Bits> x = make_input<Traits>(pattern, rows * n, rng);
  const std::vector<int32_t> lengths = make_lengths(lengths_mode, rows, n, rng);
  const int32_t* lengths_ptr = lengths_mode == Lengths::kNone ? nullptr : lengths.data();
  std::vector<Bits> want_values(rows * n), got_values(rows * n);
  std::vector<int32_t> want_indices(rows * n), got_indices(rows * n);
  for (bool descending : {true, false}) {
    oracle_sort<Traits>(x.data(), rows, n, descending, lengths_ptr, want_values.data(), want_indices.data());
    for (const NamedRunner& runner : runners) {
      std::fill(got_values.begin(), got_values.end(), Bits(0x5A));
      std::fill(got_indices.begin(), got_indices.end(), 0x5A5A5A5A);
      const bool known = sort_rows(dtype, x.data(), got_values.data(), got_indices.data(), rows, n, descending,
                                   lengths_ptr, *runner.runner);
      const bool same = known && got_values == want_values && got_indices == want_indices;
      if (same) {
        ++tally.passed;
        continue;
      }
      ++tally.failed;
      int64_t at = 0;
      while (at < rows * n && got_values[at] == want_values[at] && got_indices[at] == want_indices[at]) ++at;
      std::printf("FAIL %s %s rows=%lld n=%lld lengths=%s %s runner=%s", Traits::kName, pattern_name(pattern),
                  (long long)rows, (long long)n, lengths_name(lengths_mode),
                  descending ? "descending" : "ascending", runner.name);
      if (at < rows * n) {
        std::printf(": first difference at row %lld col %lld: got (0x%llx, %d) want (0x%llx, %d)",
                    (long long)(at / n), (long long)(at % n), (unsigned long long)got_values[at],
                    got_indices[at], (unsigned long long)want_values[at], want_indices[at]);
      }
      std::printf("\n");
    }
  }
}

#define JAX_TOPK_COUNT_DTYPE(...) +1
constexpr int kNumDTypes = 0 JAX_TOPK_FOR_EACH_DTYPE(JAX_TOPK_COUNT_DTYPE);
#undef JAX_TOPK_COUNT_DTYPE

// The oracle's order itself, on float32 values whose order is known.
void check_oracle(Tally& tally) {
  using F32 = DTypeTraits<DType::float32>;
  const uint32_t ascending[] = {0xFFFFFFFFu, 0xFFC00001u, 0xFFC00000u, 0xFF800001u,  // -NaNs, larger payload first
                                0xFF800000u, 0xBF800000u, 0x80000001u, 0x80000000u,  // -inf, -1, -denormal, -0
                                0x00000000u, 0x00000001u, 0x3F800000u, 0x7F800000u,  // +0, +denormal, 1, +inf
                                0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu};              // +NaNs
  bool ok = true;
  for (size_t i = 0; i + 1 < std::size(ascending); ++i) {
    ok = ok && contract_less<F32>(ascending[i], ascending[i + 1]) && !contract_less<F32>(ascending[i + 1], ascending[i]);
  }
  ok ? ++tally.passed : ++tally.failed;
  if (!ok) std::printf("FAIL the oracle's float32 order\n");
}

void run_tests(Tally& tally) {
  SerialRunner serial;
  PoolRunner two(2), three(3);  // three threads: chunk counts that do not divide rows
  const std::vector<NamedRunner> runners = {{"serial", &serial}, {"2 threads", &two}, {"3 threads", &three}};
  const Pattern all_patterns[] = {Pattern::kRandomBits, Pattern::kTies, Pattern::kAllEqual,
                                  Pattern::kSpecials, Pattern::kNarrow};
  const Lengths all_lengths[] = {Lengths::kNone, Lengths::kZero, Lengths::kFull, Lengths::kMixed};
  std::mt19937_64 rng(20240607);
  check_oracle(tally);

  for (int d = 0; d < kNumDTypes; ++d) {
    const DType dtype = DType(d);
    visit_dtype(dtype, [&](auto traits) {
      using Traits = decltype(traits);
      const int64_t before = tally.failed;
      for (int64_t n : {0, 1, 2, 3, 17, 32, 33, 64, 65, 255, 256, 257, 1000, 4096}) {
        for (int64_t rows : {0, 1, 3, 100}) {
          if (rows * n > 100 * 1000) continue;
          for (Pattern p : all_patterns) {
            for (Lengths l : all_lengths) check_case<Traits>(dtype, p, rows, n, l, runners, rng, tally);
          }
        }
      }
      // Long rows: 11-bit digits, and rows split over threads (fewer rows than threads).
      // Mixed lengths put some rows on either side of those edges.
      for (int64_t rows : {1, 2, 3}) {
        for (Pattern p : {Pattern::kRandomBits, Pattern::kTies, Pattern::kNarrow}) {
          for (Lengths l : {Lengths::kNone, Lengths::kMixed}) {
            check_case<Traits>(dtype, p, rows, 65536, l, runners, rng, tally);
          }
        }
      }
      for (Pattern p : {Pattern::kRandomBits, Pattern::kSpecials}) {
        for (Lengths l : {Lengths::kNone, Lengths::kMixed}) {
          check_case<Traits>(dtype, p, 1, int64_t(1) << 20, l, runners, rng, tally);
        }
      }
      std::printf("%-9s %s\n", Traits::kName, tally.failed == before ? "ok" : "FAILED");
      std::fflush(stdout);
    });
  }
}

// ---- the benchmark ----------------------------------------------------------

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Timing {
  double median, best;  // ns per element
};

// ns per element of sort_rows over float32 N(0, 1) rows: the median, and the
// fastest run (the better estimate when other work shares the machine).
Timing time_sort(int64_t rows, int64_t n, bool descending, TaskRunner& runner) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * n);
  for (auto& v : x) v = normal(rng);
  std::vector<float> values(rows * n);
  std::vector<int32_t> indices(rows * n);
  auto once = [&] {
    const double start = seconds_now();
    sort_rows(DType::float32, x.data(), values.data(), indices.data(), rows, n, descending, nullptr, runner);
    return seconds_now() - start;
  };
  once();  // warm up: page in the outputs
  std::vector<double> times;
  const double deadline = seconds_now() + 0.5;
  while (times.size() < 5 || (times.size() < 200 && seconds_now() < deadline)) times.push_back(once());
  std::sort(times.begin(), times.end());
  const double per_element = 1e9 / double(rows * n);
  return {times[times.size() / 2] * per_element, times[0] * per_element};
}

void run_bench() {
  SerialRunner serial;
  PoolRunner two(2);
  const int64_t shapes[][2] = {{1024, 256}, {256, 2048}, {64, 8192}, {8, 131072}, {4, 65536}, {1, 1 << 20}};
  std::printf("float32 N(0,1), ns per element: median / fastest run\n");
  std::printf("%-12s %14s %14s %14s %14s\n", "rows x n", "desc 1 thread", "desc 2 threads", "asc 1 thread",
              "asc 2 threads");
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], n = shape[1];
    const std::string name = std::to_string(rows) + "x" + std::to_string(n);
    std::printf("%-12s", name.c_str());
    for (bool descending : {true, false}) {
      for (TaskRunner* runner : {static_cast<TaskRunner*>(&serial), static_cast<TaskRunner*>(&two)}) {
        const Timing t = time_sort(rows, n, descending, *runner);
        std::printf(" %7.2f /%5.2f", t.median, t.best);
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace jax_topk::cpu

int main(int argc, char** argv) {
  using namespace jax_topk::cpu;
  if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) {
    run_bench();
    return 0;
  }
  Tally tally;
  run_tests(tally);
  std::printf("%lld passed, %lld failed\n", (long long)tally.passed, (long long)tally.failed);
  return tally.failed == 0 ? 0 : 1;
}
