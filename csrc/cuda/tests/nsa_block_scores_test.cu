// Standalone check of NSA's block-score kernels (csrc/cuda/nsa.cu) against a
// float64 host reference of jax_topk/nsa.h's formula, without JAX, so that
// compute-sanitizer (memcheck, racecheck, synccheck) sees only this kernel:
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//     -DJAX_TOPK_BUILD_HAS_WGMMA -Icsrc/include -Icsrc \
//     csrc/cuda/nsa.cu csrc/cuda/tests/nsa_block_scores_test.cu -o /tmp/nsa_block_scores_test
//   compute-sanitizer --tool memcheck /tmp/nsa_block_scores_test
//   /tmp/nsa_block_scores_test --bench   # kernel time at benchmarks/nsa.py's shapes, CUDA events
// Cases: one and two head tiles (G = 1, 4, 9, 12, 16), D = 64 and 128,
// bfloat16 and float16, halos of 0 to 3 compression blocks, 8, 16 and 32
// selection blocks per step, chunks that start past 0 and end past T, k_cmp
// with padding rows; where the build has sm_90a code (-gencode
// arch=compute_90a,code=sm_90a -DJAX_TOPK_BUILD_HAS_WGMMA), the warpgroup
// kernel (G > 8) and then the mma.sync kernel alone.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/nsa_cuda.h"

using jax_topk::DType;
using jax_topk::NsaScoreShape;

namespace {

uint16_t to_bits(float x, DType d, float* rounded) {
  uint16_t bits;
  if (d == DType::float16) {
    const __half h = __float2half_rn(x);
    memcpy(&bits, &h, 2);
    *rounded = __half2float(h);
  } else {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    memcpy(&bits, &h, 2);
    *rounded = __bfloat162float(h);
  }
  return bits;
}

#define CHECK(call)                                                                   \
  do {                                                                                \
    const cudaError_t e = (call);                                                     \
    if (e != cudaSuccess) {                                                           \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e)); \
      return false;                                                                   \
    }                                                                                 \
  } while (0)

// One call: returns whether every score is within tolerance of the reference.
bool run_case(DType dtype, int64_t batch, int64_t q_rows, int64_t length, int64_t heads, int64_t groups, int64_t dim,
              int64_t l, int64_t d, int64_t lp, int64_t start, int64_t chunk, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const int64_t num_blocks = length < l ? 0 : (length - l) / d + 1;
  const int64_t key_rows = num_blocks + 5;  // padding rows the kernel must not score
  const int64_t num_select = (q_rows + lp - 1) / lp;
  const int64_t width = (num_select + 15) / 16 * 16;
  std::vector<uint16_t> q_bits(batch * q_rows * heads * groups * dim), k_bits(batch * key_rows * heads * dim);
  std::vector<float> qf(q_bits.size()), kf(k_bits.size()), lse(batch * q_rows * heads * groups);
  for (size_t i = 0; i < q_bits.size(); ++i) q_bits[i] = to_bits(normal(rng), dtype, &qf[i]);
  for (size_t i = 0; i < k_bits.size(); ++i) k_bits[i] = to_bits(normal(rng), dtype, &kf[i]);
  const double scale = 1.4426950408889634 / std::sqrt(double(dim));
  const float scale_f = float(scale);
  const auto visible = [&](int64_t t) { return t + 1 < l ? int64_t(0) : std::min((t + 1 - l) / d + 1, num_blocks); };
  const auto dot = [&](int64_t b, int64_t t, int64_t h, int64_t g, int64_t i) {
    double s = 0;
    for (int64_t e = 0; e < dim; ++e) {
      s += double(qf[(((b * q_rows + t) * heads + h) * groups + g) * dim + e]) *
           double(kf[((b * key_rows + i) * heads + h) * dim + e]);
    }
    return s * double(scale_f);
  };
  for (int64_t b = 0; b < batch; ++b)  // lse: the log2-sum-exp2 of each row's visible scores
    for (int64_t t = 0; t < q_rows; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t g = 0; g < groups; ++g) {
          double m = -INFINITY, sum = 0;
          for (int64_t i = 0; i < visible(t); ++i) m = std::max(m, dot(b, t, h, g, i));
          for (int64_t i = 0; i < visible(t); ++i) sum += std::exp2(dot(b, t, h, g, i) - m);
          lse[((b * q_rows + t) * heads + h) * groups + g] = visible(t) ? float(m + std::log2(sum)) : INFINITY;
        }
  uint16_t *q_d, *k_d;
  float *lse_d, *out_d;
  int32_t* start_d;
  const size_t out_count = size_t(batch * heads * chunk * width);
  CHECK(cudaMalloc(&q_d, q_bits.size() * 2));
  CHECK(cudaMalloc(&k_d, k_bits.size() * 2));
  CHECK(cudaMalloc(&lse_d, lse.size() * 4));
  CHECK(cudaMalloc(&out_d, out_count * 4));
  CHECK(cudaMalloc(&start_d, 4));
  const int32_t start32 = int32_t(start);
  CHECK(cudaMemcpy(q_d, q_bits.data(), q_bits.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(k_d, k_bits.data(), k_bits.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(lse_d, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(start_d, &start32, 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(out_d, 0xff, out_count * 4));  // NaN: every slot must be written
  NsaScoreShape s;
  s.batch = batch, s.q_rows = q_rows, s.kv_heads = heads, s.groups = groups, s.dim = dim;
  s.key_rows = key_rows, s.num_blocks = num_blocks, s.chunk = chunk, s.width = width;
  s.block_size = l, s.stride = d, s.select_size = lp, s.scale = scale_f;
  CHECK(jax_topk::cuda::nsa_block_scores(dtype, q_d, k_d, lse_d, start_d, s, out_d, 0));
  CHECK(cudaDeviceSynchronize());
  std::vector<float> out(out_count);
  CHECK(cudaMemcpy(out.data(), out_d, out_count * 4, cudaMemcpyDeviceToHost));
  cudaFree(q_d), cudaFree(k_d), cudaFree(lse_d), cudaFree(out_d), cudaFree(start_d);
  int64_t bad = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < chunk; ++r) {
        const int64_t t = start + r;
        std::vector<double> p(std::max(num_blocks, int64_t(1)), 0.0);
        for (int64_t i = 0; i < visible(t); ++i)
          for (int64_t g = 0; g < groups; ++g)
            p[i] += std::exp2(dot(b, t, h, g, i) - double(lse[((b * q_rows + t) * heads + h) * groups + g]));
        for (int64_t j = 0; j < width; ++j) {
          double want = 0;
          for (int64_t i = 0; i < num_blocks; ++i) {
            const int64_t shared = std::min(i * d + l, (j + 1) * lp) - std::max(i * d, j * lp);
            if (shared > 0) want += double(shared / d) * p[i];
          }
          const float got = out[((b * heads + h) * chunk + r) * width + j];
          if (!(std::fabs(got - want) <= 1e-5 * std::fabs(want) + 1e-6)) {
            if (bad++ < 5) std::printf("  b %ld h %ld t %ld block %ld: got %g, want %g\n", long(b), long(h),
                                       long(t), long(j), got, want);
          }
        }
      }
  std::printf("%s %s G=%ld D=%ld l=%ld d=%ld l'=%ld T=%ld start=%ld chunk=%ld: %ld bad\n", bad ? "FAIL" : "ok  ",
              dtype == DType::float16 ? "float16 " : "bfloat16", long(groups), long(dim), long(l), long(d), long(lp),
              long(length), long(start), long(chunk), long(bad));
  return bad == 0;
}

// Kernel time of the selection scores of a T-token sequence (B = 1, Hkv = 4,
// G = 16, D = 128, bfloat16, l = 32, d = 16, l' = 64: benchmarks/nsa.py),
// in chunks of 4096 queries as _nsa_pallas.selection_ids calls it.
bool bench(int64_t length) {
  const int64_t heads = 4, groups = 16, dim = 128, chunk = 4096, l = 32, d = 16, lp = 64;
  const int64_t num_blocks = (length - l) / d + 1, width = ((length + lp - 1) / lp + 15) / 16 * 16;
  std::vector<uint16_t> q_bits(length * heads * groups * dim), k_bits(num_blocks * heads * dim);
  std::vector<float> lse(length * heads * groups, 8.0f);
  // Normal values drawn once into a pool and read at a stride prime to its
  // size: drawing each of 537M values at 64K took most of a minute.
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  float rounded;
  std::vector<uint16_t> pool(1 << 20);
  for (auto& x : pool) x = to_bits(normal(rng), DType::bfloat16, &rounded);
  size_t at = 0;
  for (auto& x : q_bits) x = pool[at = (at + 7919) & (pool.size() - 1)];
  for (auto& x : k_bits) x = pool[at = (at + 7919) & (pool.size() - 1)];
  uint16_t *q_d, *k_d;
  float *lse_d, *out_d;
  int32_t* starts_d;
  const int64_t chunks = length / chunk;
  std::vector<int32_t> starts(chunks);
  for (int64_t c = 0; c < chunks; ++c) starts[c] = int32_t(c * chunk);
  CHECK(cudaMalloc(&q_d, q_bits.size() * 2));
  CHECK(cudaMalloc(&k_d, k_bits.size() * 2));
  CHECK(cudaMalloc(&lse_d, lse.size() * 4));
  CHECK(cudaMalloc(&out_d, size_t(heads * chunk * width) * 4));
  CHECK(cudaMalloc(&starts_d, chunks * 4));
  CHECK(cudaMemcpy(q_d, q_bits.data(), q_bits.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(k_d, k_bits.data(), k_bits.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(lse_d, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(starts_d, starts.data(), chunks * 4, cudaMemcpyHostToDevice));
  NsaScoreShape s;
  s.batch = 1, s.q_rows = length, s.kv_heads = heads, s.groups = groups, s.dim = dim;
  s.key_rows = num_blocks, s.num_blocks = num_blocks, s.chunk = chunk, s.width = width;
  s.block_size = l, s.stride = d, s.select_size = lp, s.scale = float(1.4426950408889634 / std::sqrt(128.0));
  cudaEvent_t begin, end;
  CHECK(cudaEventCreate(&begin));
  CHECK(cudaEventCreate(&end));
  std::vector<float> times;
  for (int rep = 0; rep < 6; ++rep) {
    CHECK(cudaEventRecord(begin));
    for (int64_t c = 0; c < chunks; ++c) {
      CHECK(jax_topk::cuda::nsa_block_scores(DType::bfloat16, q_d, k_d, lse_d, starts_d + c, s, out_d, 0));
    }
    CHECK(cudaEventRecord(end));
    CHECK(cudaEventSynchronize(end));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, begin, end));
    if (rep > 0) times.push_back(ms);  // the first is warm-up
  }
  std::sort(times.begin(), times.end());
  std::printf("bench T=%ld: %.3f ms (median of %zu; %ld chunks of %ld queries)\n", long(length),
              times[times.size() / 2], times.size(), long(chunks), long(chunk));
  cudaFree(q_d), cudaFree(k_d), cudaFree(lse_d), cudaFree(out_d), cudaFree(starts_d);
  return true;
}

}  // namespace

// Both kernels where the build has the warpgroup one (sm_90a): first as
// dispatched, then the mma.sync kernel alone (JAX_TOPK_NSA_NO_WGMMA).
int main(int argc, char** argv) {
  bool ok = true;
  for (const bool fallback : {false, true}) {
    if (fallback) setenv("JAX_TOPK_NSA_NO_WGMMA", "1", 1);
    std::printf("%s\n", fallback ? "mma.sync kernel (JAX_TOPK_NSA_NO_WGMMA):" : "kernel as dispatched:");
    if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) {
      ok &= bench(16384) && bench(65536);
      continue;
    }
    //                  dtype          B  rows  T    Hkv G   D   l   d   l'  start chunk seed
    ok &= run_case(DType::bfloat16, 1, 1280, 1201, 2, 16, 128, 32, 16, 64, 0, 1280, 1);
    ok &= run_case(DType::bfloat16, 2, 640, 600, 1, 16, 128, 32, 16, 64, 320, 320, 2);
    ok &= run_case(DType::float16, 1, 512, 500, 2, 4, 64, 16, 16, 64, 0, 512, 3);
    ok &= run_case(DType::bfloat16, 1, 768, 700, 1, 1, 64, 64, 16, 64, 256, 512, 4);
    ok &= run_case(DType::float16, 1, 768, 768, 2, 8, 128, 24, 8, 64, 0, 768, 5);
    ok &= run_case(DType::bfloat16, 1, 256, 100, 1, 12, 64, 32, 8, 64, 0, 256, 6);
    ok &= run_case(DType::float16, 1, 1024, 1000, 2, 16, 128, 32, 16, 64, 0, 1024, 7);
    ok &= run_case(DType::bfloat16, 1, 4096, 4000, 1, 9, 128, 32, 16, 64, 1024, 2048, 8);
    ok &= run_case(DType::bfloat16, 1, 512, 512, 1, 16, 64, 16, 8, 16, 0, 512, 9);
  }
  std::printf(ok ? "all passed\n" : "FAILED\n");
  return ok ? 0 : 1;
}
