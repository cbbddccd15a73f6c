#include "cpu/indexer_cpu.h"

#include <algorithm>
#include <vector>

#include "jax_topk/indexer.h"

namespace jax_topk::cpu {
namespace {

// Keys per task: a block of keys is scored against every head while its rows
// are in cache.
constexpr int64_t kKeysPerTask = 256;

// The row's queries widened to float32 ([heads, dim], lanes padded with 0).
template <typename T>
void widen_queries(const T* q, int64_t heads, int64_t dim, int64_t padded_dim, float* out) {
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t d = 0; d < padded_dim; ++d) out[h * padded_dim + d] = d < dim ? indexer_widen(q[h * dim + d]) : 0.0f;
  }
}

// The dot of one widened query with one key, in the order of indexer.h. The
// dim padding adds +0 (0 * 0) to the last lanes, which changes a lane only
// when it holds -0 (to +0); the dot can then differ only in the sign of a
// zero, which relu maps to +0 either way: the score is unchanged.
float dot(const float* q, const float* k, int64_t padded_dim) {
  float p[kIndexerLanes] = {};
  for (int64_t d = 0; d < padded_dim; d += kIndexerLanes) {
    for (int j = 0; j < kIndexerLanes; ++j) {
      const float prod = q[d + j] * k[d + j];
      p[j] = p[j] + prod;
    }
  }
  return indexer_combine_lanes(p);
}

template <typename T>
void score_keys(const T* keys, const float* qw, const float* w, int64_t heads, int64_t dim,
                int64_t padded_dim, int64_t begin, int64_t end, float* scores) {
  std::vector<float> k(size_t(padded_dim), 0.0f);
  for (int64_t s = begin; s < end; ++s) {
    for (int64_t d = 0; d < dim; ++d) k[d] = indexer_widen(keys[s * dim + d]);
    float score = 0.0f;
    for (int64_t h = 0; h < heads; ++h) {
      const float term = w[h] * indexer_relu(dot(qw + h * padded_dim, k.data(), padded_dim));
      score = score + term;
    }
    scores[s] = score;
  }
}

template <typename T>
void scores_of(const T* q, const T* keys, const float* weights, int64_t batch, int64_t heads,
               int64_t n, int64_t dim, int64_t items_per_keys, const int32_t* lengths, float* scores,
               TaskRunner& runner) {
  const int64_t padded_dim = (dim + kIndexerLanes - 1) / kIndexerLanes * kIndexerLanes;
  std::vector<float> queries(size_t(batch * heads * padded_dim));
  for (int64_t b = 0; b < batch; ++b) {
    widen_queries(q + b * heads * dim, heads, dim, padded_dim, queries.data() + b * heads * padded_dim);
  }
  const int64_t tasks_per_row = (n + kKeysPerTask - 1) / kKeysPerTask;
  runner.run(batch * tasks_per_row, [&](int64_t task) {
    const int64_t b = task / tasks_per_row;
    const int64_t len = lengths ? lengths[b] : n;
    const int64_t begin = (task % tasks_per_row) * kKeysPerTask;
    const int64_t end = std::min(len, begin + kKeysPerTask);
    if (begin >= end) return;
    score_keys(keys + b / items_per_keys * n * dim, queries.data() + b * heads * padded_dim, weights + b * heads, heads, dim,
               padded_dim, begin, end, scores + b * n);
  });
}

}  // namespace

bool indexer_scores(DType dtype, const void* q, const void* keys, const float* weights, int64_t batch,
                    int64_t heads, int64_t n, int64_t dim, int64_t items_per_keys, const int32_t* lengths,
                    float* scores, TaskRunner& runner) {
  switch (dtype) {
    case DType::float32:
      scores_of(static_cast<const float*>(q), static_cast<const float*>(keys), weights, batch, heads, n, dim,
                items_per_keys, lengths, scores, runner);
      return true;
    case DType::bfloat16:
      scores_of(static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(keys), weights, batch, heads, n,
                dim, items_per_keys, lengths, scores, runner);
      return true;
    default:
      return false;
  }
}

}  // namespace jax_topk::cpu
