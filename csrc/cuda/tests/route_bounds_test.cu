// The error bounds of the fast route scores (csrc/cuda/route_bounds.cuh),
// checked over every finite float32 logit on the GPU: for each z,
//   |exact(z) - fast(z)| <= relative * |fast(z)| + absolute
// with exact the IEEE-only score of jax_topk/routing.h. The routing kernel's
// bounds path is exact only while this holds. Build from the repository root:
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90 -Icsrc/include -Icsrc csrc/cuda/tests/route_bounds_test.cu -o route_bounds_test
//
// Prints, per score, the largest |exact - fast| as a fraction of the bound
// (must be <= 1; ~0.25 on an H200), the largest relative error where the
// exact score is normal, and the logit where each occurs. Exit code 1 on a
// failure (or when not every finite logit was checked).

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "cuda/route_bounds.cuh"
#include "jax_topk/routing.h"

namespace rb = jax_topk::cuda::route_bounds;
namespace rm = jax_topk::route_math;
using jax_topk::RouteScore;

struct Worst {
  unsigned long long ratio;     // (float bits of the largest fraction of the bound) << 32 | z bits
  unsigned long long relative;  // the same for the largest relative error (normal exact scores)
  unsigned long long checked;
};

__device__ void record(unsigned long long* slot, float value, uint32_t z_bits) {
  // Non-negative floats order as their bits; the logit rides in the low word.
  atomicMax(slot, (static_cast<unsigned long long>(__float_as_uint(value)) << 32) | z_bits);
}

template <RouteScore kScore>
__global__ void check_all_logits(Worst* worst) {
  const rb::ScoreErrorBound bound = rb::score_error_bound(kScore);
  float worst_ratio = 0.0f, worst_relative = 0.0f;
  uint32_t ratio_at = 0, relative_at = 0;
  unsigned long long checked = 0;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t(1) << 32); i += stride) {
    const uint32_t bits = uint32_t(i);
    const float z = __uint_as_float(bits);
    if (!isfinite(z)) continue;
    const float exact = kScore == RouteScore::kSigmoid ? rm::sigmoid(z) : rm::sqrt_softplus(z);
    const float fast = rb::fast_score(kScore, z);
    const double error = fabs(double(exact) - double(fast));
    const double allowed = double(bound.relative) * fabs(double(fast)) + double(bound.absolute);
    const float ratio = float(error / allowed);
    // A NaN (either score) fails: the ratio is then set to infinity.
    const float r = ratio == ratio ? ratio : INFINITY;
    if (r > worst_ratio) worst_ratio = r, ratio_at = bits;
    if (fabsf(exact) >= 0x1p-126f) {
      const float relative = float(error / fabs(double(exact)));
      if (relative > worst_relative) worst_relative = relative, relative_at = bits;
    }
    ++checked;
  }
  record(&worst->ratio, worst_ratio, ratio_at);
  record(&worst->relative, worst_relative, relative_at);
  atomicAdd(&worst->checked, checked);
}

template <RouteScore kScore>
bool run(const char* name) {
  Worst* worst = nullptr;
  cudaMallocManaged(&worst, sizeof(Worst));
  *worst = Worst{0, 0, 0};
  check_all_logits<kScore><<<132 * 16, 256>>>(worst);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("%s: CUDA error %s\n", name, cudaGetErrorString(err));
    return false;
  }
  const auto split = [](unsigned long long v, float* value, float* z) {
    const uint32_t hi = uint32_t(v >> 32), lo = uint32_t(v);
    std::memcpy(value, &hi, 4);
    std::memcpy(z, &lo, 4);
  };
  float ratio, ratio_z, relative, relative_z;
  split(worst->ratio, &ratio, &ratio_z);
  split(worst->relative, &relative, &relative_z);
  const bool ok = ratio <= 1.0f && worst->checked == 4278190080ull;  // 2^32 - 2^24 non-finite patterns
  std::printf("%s: %llu finite logits; largest error %.4f of the bound (z = %.9g); largest relative error "
              "2^%.2f (z = %.9g): %s\n",
              name, worst->checked, double(ratio), double(ratio_z), std::log2(double(relative)),
              double(relative_z), ok ? "ok" : "FAILED");
  cudaFree(worst);
  return ok;
}

int main() {
  const bool sigmoid = run<RouteScore::kSigmoid>("sigmoid");
  const bool sqrt_softplus = run<RouteScore::kSqrtSoftplus>("sqrt_softplus");
  return sigmoid && sqrt_softplus ? 0 : 1;
}
