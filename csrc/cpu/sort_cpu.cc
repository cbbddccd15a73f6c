// CPU stable sort: an LSD radix sort of packed (key, index) integers.
//
// Every element becomes one unsigned integer, (sort key << 32) | index, where
// the sort key is the ordered key (keys.h) for an ascending sort and its
// complement for a descending one. Sorting these integers ascending is the
// whole contract in both directions: best key first, equal keys by lower
// index. Distinct elements never compare equal, so any sort of them is stable.
// 64-bit dtypes pack into 128 bits.
//
// - Short rows (up to 32 elements): std::sort of the packed integers; a radix
//   pass would spend more on its histogram than on the elements.
// - Longer rows: LSD radix sort on the key digits only, carrying the index in
//   the low half. LSD passes are stable and the items start in index order, so
//   ties stay by lower index. One read of the row counts every digit's
//   histogram; a digit whose elements all fall in one bucket needs no pass
//   (common for floats' sign/exponent bits, and for small integers). The first
//   pass reads the input directly and the last writes the outputs directly
//   (values rebuilt from the key, which is a bijection of the bits), so no
//   separate pack or unpack pass touches memory. Digits are 8 bits, or 11 bits
//   for long rows of 32/64-bit keys (three passes instead of four for 32-bit
//   keys, once the larger histogram is cheap next to the row).
//
// Rows are spread over the runner's workers. When there are fewer rows than
// workers and a row is long, the row itself is cut into chunks: each radix
// pass counts and scatters the chunks in parallel, every chunk writing to its
// own precomputed offsets, so the result is the same as the serial sort.

#include "cpu/sort_cpu.h"

#include <algorithm>
#include <memory>
#include <type_traits>

#include "jax_topk/keys.h"

namespace jax_topk::cpu {
namespace {

// The packed item of one element and the direction of the sort.
template <typename Bits, KeyKind Kind>
class RowOrder {
 public:
  using Packed = std::conditional_t<(sizeof(Bits) <= 4), uint64_t, unsigned __int128>;
  static constexpr int kIndexBits = sizeof(Packed) * 4;

  explicit RowOrder(bool descending) : flip_(descending ? Bits(~Bits(0)) : Bits(0)) {}

  Packed pack(Bits bits, int64_t index) const {
    const Bits sort_key = Bits(ordered_key<Kind>(bits) ^ flip_);
    return (Packed(sort_key) << kIndexBits) | Packed(uint32_t(index));
  }
  static Bits sort_key(Packed p) { return Bits(p >> kIndexBits); }
  Bits bits(Packed p) const { return bits_from_key<Kind>(Bits(sort_key(p) ^ flip_)); }
  static int32_t index(Packed p) { return int32_t(uint32_t(p)); }

 private:
  Bits flip_;  // all ones for descending: ascending order of ~key is descending order of key
};

// A buffer that only grows and is never zero-filled: a pass writes every slot
// it later reads, and zeroing megabytes per row would cost as much as a pass.
template <typename T>
class GrowOnlyBuffer {
 public:
  T* get(int64_t size) {
    if (size > size_) {
      data_.reset(new T[size]);
      size_ = size;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<T[]> data_;
  int64_t size_ = 0;
};

template <typename Packed>
struct RowScratch {
  GrowOnlyBuffer<uint32_t> counts;  // [chunks][digits][buckets]: counts, then heads
  GrowOnlyBuffer<Packed> items;     // up to two ping-pong copies of the row
};

// Runs task(c) for c in [0, count) on the calling thread: the serial executor
// for a row sorted inside one runner task.
struct InlineTasks {
  template <typename F>
  void operator()(int64_t count, const F& task) const {
    for (int64_t c = 0; c < count; ++c) task(c);
  }
};

// Runs the chunks of one row on the runner's workers.
struct RunnerTasks {
  TaskRunner& runner;
  template <typename F>
  void operator()(int64_t count, const F& task) const {
    if (count == 1) {
      task(0);
    } else {
      runner.run(count, task);
    }
  }
};

template <typename Bits, KeyKind Kind, int kDigitBits>
struct RadixSort {
  using Order = RowOrder<Bits, Kind>;
  using Packed = typename Order::Packed;
  static constexpr int kDigits = (8 * int(sizeof(Bits)) + kDigitBits - 1) / kDigitBits;
  static constexpr int64_t kBuckets = int64_t(1) << kDigitBits;
  static constexpr int64_t kCountsPerChunk = kDigits * kBuckets;

  static uint32_t digit(Packed p, int d) {
    return uint32_t(uint64_t(Order::sort_key(p)) >> (d * kDigitBits)) & uint32_t(kBuckets - 1);
  }

  // Adds every digit's histogram of items [begin, end) to counts[d][bucket].
  template <typename Load>
  static void count_all_digits(const Load& load, int64_t begin, int64_t end, uint32_t* counts) {
    for (int64_t i = begin; i < end; ++i) {
      const Packed p = load(i);
      for (int d = 0; d < kDigits; ++d) ++counts[d * kBuckets + digit(p, d)];
    }
  }

  static void count_digit(const Packed* items, int64_t begin, int64_t end, int d, uint32_t* counts) {
    std::fill(counts, counts + kBuckets, 0u);
    for (int64_t i = begin; i < end; ++i) ++counts[digit(items[i], d)];
  }

  // Turns counts[chunk][d][bucket] of digits [first_digit, first_digit +
  // kNumDigits) into heads, in place: where each chunk's first item of a
  // bucket goes, after every item of smaller buckets and after the bucket's
  // items in earlier chunks, which keeps a chunked pass stable. Several digits
  // at once make independent running sums that the CPU overlaps, which
  // matters when the row is as short as the histogram.
  template <int kNumDigits>
  static void heads_from_counts(uint32_t* counts, int64_t chunks, int first_digit) {
    uint32_t next[kNumDigits] = {};
    for (int64_t b = 0; b < kBuckets; ++b) {
      for (int64_t c = 0; c < chunks; ++c) {
        for (int k = 0; k < kNumDigits; ++k) {
          uint32_t& slot = counts[c * kCountsPerChunk + (first_digit + k) * kBuckets + b];
          const uint32_t count = slot;
          slot = next[k];
          next[k] += count;
        }
      }
    }
  }

  // Where a chunk's items of one bucket go during a pass: `head` is the next
  // slot from the front, `tail` one past the next slot from the back. Each
  // pass copies them to the stack: the compiler then knows the output stores
  // cannot change them, and a bucket's two cursors sit side by side, never a
  // multiple of 4 KiB apart (the CPU would take a store to one for a store to
  // the other and stall the load). Both measured, 5-10% on short rows.
  struct Cursor {
    uint32_t head, tail;
  };

  // The cursors of chunk c for digit d. A tail is the head of the same bucket
  // in the next chunk, or of the next bucket in the first chunk, or the end.
  static void cursors_of_chunk(const uint32_t* heads, int64_t chunks, int64_t c, int d, int64_t len,
                               Cursor* cursors) {
    const uint32_t* own = heads + c * kCountsPerChunk + d * kBuckets;
    const bool last_chunk = c + 1 == chunks;
    const uint32_t* next = heads + (last_chunk ? 0 : c + 1) * kCountsPerChunk + d * kBuckets + last_chunk;
    for (int64_t b = 0; b + last_chunk < kBuckets; ++b) cursors[b] = {own[b], next[b]};
    if (last_chunk) cursors[kBuckets - 1] = {own[kBuckets - 1], uint32_t(len)};
  }

  // Moves items [begin, end) to their places by digit d. With 8-bit digits
  // the front half walks forward filling buckets from their heads while the
  // back half walks backward filling them from their tails: the same stable
  // order as one forward walk, but the halves bump different cursors, so a run
  // of equal digits (the sign/exponent byte of floats) is two dependency
  // chains through memory instead of one. With 11-bit digits (long rows) the
  // doubled number of write streams costs more than that saves.
  template <typename Load, typename Store>
  static void scatter(const Load& load, const Store& store, int64_t begin, int64_t end, int d,
                      Cursor* cursors) {
    int64_t front = begin, back = end - 1;
    if (kDigitBits <= 8) {
      for (; front < back; ++front, --back) {
        const Packed a = load(front), b = load(back);
        store(cursors[digit(a, d)].head++, a);
        store(--cursors[digit(b, d)].tail, b);
      }
    }
    for (; front <= back; ++front) {
      const Packed a = load(front);
      store(cursors[digit(a, d)].head++, a);
    }
  }

  // Sorts x[0:len) into values/indices[0:len) in `chunks` chunks run by
  // run_tasks (InlineTasks or RunnerTasks).
  template <typename RunTasks>
  static void sort(const Order& order, const Bits* x, int64_t len, Bits* values, int32_t* indices,
                   int64_t chunks, const RunTasks& run_tasks, RowScratch<Packed>& scratch) {
    uint32_t* counts = scratch.counts.get(chunks * kCountsPerChunk);
    auto chunk_begin = [&](int64_t c) { return len * c / chunks; };
    auto load_x = [&](int64_t i) { return order.pack(x[i], i); };
    auto store_out = [&](int64_t j, Packed p) {
      values[j] = order.bits(p);
      indices[j] = Order::index(p);
    };

    // Every digit's histogram per chunk, in one read of the row.
    run_tasks(chunks, [&](int64_t c) {
      uint32_t* h = counts + c * kCountsPerChunk;
      std::fill(h, h + kCountsPerChunk, 0u);
      count_all_digits(load_x, chunk_begin(c), chunk_begin(c + 1), h);
    });

    // A digit needs a pass unless the bucket of the first item holds them all.
    int active[kDigits];
    int num_active = 0;
    const Packed first = load_x(0);
    for (int d = 0; d < kDigits; ++d) {
      int64_t in_first_bucket = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        in_first_bucket += counts[c * kCountsPerChunk + d * kBuckets + digit(first, d)];
      }
      if (in_first_bucket != len) active[num_active++] = d;
    }
    if (num_active == 0) {  // all keys equal: index order is the answer
      run_tasks(chunks, [&](int64_t c) {
        for (int64_t i = chunk_begin(c); i < chunk_begin(c + 1); ++i) store_out(i, load_x(i));
      });
      return;
    }

    heads_from_counts<kDigits>(counts, chunks, 0);

    // x -> items[0] -> items[1] -> items[0] ... -> outputs.
    Packed* items = scratch.items.get(std::min(num_active - 1, 2) * len);
    const Packed* src = nullptr;  // nullptr: the input row
    for (int k = 0; k < num_active; ++k) {
      const int d = active[k];
      Packed* dst = k + 1 == num_active ? nullptr : items + (k % 2) * len;  // nullptr: the outputs
      // The first pass reads the row in its original order, whose histograms
      // were counted above; later passes read a permutation, so each chunk's
      // histogram is counted again (with one chunk it is the row's, unchanged).
      if (k > 0 && chunks > 1) {
        run_tasks(chunks, [&](int64_t c) {
          count_digit(src, chunk_begin(c), chunk_begin(c + 1), d, counts + c * kCountsPerChunk + d * kBuckets);
        });
        heads_from_counts<1>(counts, chunks, d);
      }
      run_tasks(chunks, [&](int64_t c) {
        Cursor cursors[kBuckets];
        cursors_of_chunk(counts, chunks, c, d, len, cursors);
        const int64_t begin = chunk_begin(c), end = chunk_begin(c + 1);
        auto to = [&](const auto& load) {
          if (dst != nullptr) {
            scatter(load, [dst](int64_t j, Packed p) { dst[j] = p; }, begin, end, d, cursors);
          } else {
            scatter(load, store_out, begin, end, d, cursors);
          }
        };
        if (src != nullptr) {
          to([src](int64_t i) { return src[i]; });
        } else {
          to(load_x);
        }
      });
      src = dst;
    }
  }
};

// Row lengths up to which std::sort of the packed items beats a radix sort,
// and from which 11-bit digits beat 8-bit ones (float32 rows on a Zen 4 core;
// both are within a few percent over a wide range).
constexpr int64_t kMaxComparisonSortLength = 32;
constexpr int64_t kMinWideDigitLength = 1 << 14;
// When rows are too few to occupy the workers, a row is split into chunks of
// at least this many elements, so each chunk's histograms and the barriers
// between passes stay cheap next to its share of the row.
constexpr int64_t kMinChunkLength = 1 << 14;
constexpr int64_t kTasksPerWorker = 4;  // small tasks even out rows of uneven lengths

int64_t chunks_per_row(int64_t len, int64_t workers) {
  return std::clamp<int64_t>(len / kMinChunkLength, 1, workers);
}

template <typename Traits>
struct RowSorter {
  using Bits = typename Traits::Bits;
  static constexpr KeyKind Kind = Traits::kKeyKind;
  using Order = RowOrder<Bits, Kind>;
  using Packed = typename Order::Packed;

  // Sorts x[0:len) into values/indices[0:len) and pads [len, n).
  template <typename RunTasks>
  static void sort_row(const Order& order, const Bits* x, int64_t len, int64_t n, Bits* values,
                       int32_t* indices, int64_t chunks, const RunTasks& run_tasks,
                       RowScratch<Packed>& scratch) {
    // 16-bit keys take two 8-bit passes either way.
    constexpr int kWideDigitBits = sizeof(Bits) >= 4 ? 11 : 8;
    if (len <= kMaxComparisonSortLength) {
      comparison_sort(order, x, len, values, indices, scratch);
    } else if (len >= kMinWideDigitLength) {
      RadixSort<Bits, Kind, kWideDigitBits>::sort(order, x, len, values, indices, chunks, run_tasks, scratch);
    } else {
      RadixSort<Bits, Kind, 8>::sort(order, x, len, values, indices, chunks, run_tasks, scratch);
    }
    std::fill(values + len, values + n, Traits::kLowestBits);
    std::fill(indices + len, indices + n, -1);
  }

  static void comparison_sort(const Order& order, const Bits* x, int64_t len, Bits* values,
                              int32_t* indices, RowScratch<Packed>& scratch) {
    Packed* items = scratch.items.get(len);
    for (int64_t i = 0; i < len; ++i) items[i] = order.pack(x[i], i);
    std::sort(items, items + len);
    for (int64_t i = 0; i < len; ++i) {
      values[i] = order.bits(items[i]);
      indices[i] = Order::index(items[i]);
    }
  }
};

template <typename Traits>
void sort_rows_typed(const typename Traits::Bits* x, typename Traits::Bits* values, int32_t* indices,
                     int64_t rows, int64_t n, bool descending, const int32_t* lengths,
                     TaskRunner& runner) {
  using Sorter = RowSorter<Traits>;
  if (rows == 0 || n == 0) return;
  const typename Sorter::Order order(descending);
  auto row_length = [&](int64_t r) { return lengths != nullptr ? int64_t(lengths[r]) : n; };
  auto sort_row = [&](int64_t r, int64_t chunks, const auto& run_tasks, auto& scratch) {
    Sorter::sort_row(order, x + r * n, row_length(r), n, values + r * n, indices + r * n, chunks,
                     run_tasks, scratch);
  };
  const int64_t workers = std::max<int64_t>(1, runner.concurrency());

  if (rows >= workers || n < 2 * kMinChunkLength) {
    const int64_t tasks = std::min(rows, workers * kTasksPerWorker);
    runner.run(tasks, [&](int64_t t) {
      RowScratch<typename Sorter::Packed> scratch;
      for (int64_t r = rows * t / tasks; r < rows * (t + 1) / tasks; ++r) sort_row(r, 1, InlineTasks{}, scratch);
    });
    return;
  }

  // Few long rows: one row at a time, each pass spread over the workers.
  RowScratch<typename Sorter::Packed> scratch;
  for (int64_t r = 0; r < rows; ++r) {
    sort_row(r, chunks_per_row(row_length(r), workers), RunnerTasks{runner}, scratch);
  }
}

}  // namespace

bool sort_rows(DType dtype, const void* x, void* values, int32_t* indices, int64_t rows, int64_t n,
               bool descending, const int32_t* lengths, TaskRunner& runner) {
  return visit_dtype(dtype, [&](auto traits) {
    using Traits = decltype(traits);
    using Bits = typename Traits::Bits;
    sort_rows_typed<Traits>(static_cast<const Bits*>(x), static_cast<Bits*>(values), indices, rows, n,
                            descending, lengths, runner);
  });
}

}  // namespace jax_topk::cpu
