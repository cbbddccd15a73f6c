// Micro-benchmark of the block-level candidate orderings used by the
// threshold kernel: block_bitonic_sort_desc (topk_bitonic.cuh) and ranking by
// counting (and the earlier all-shared-memory network), per count, in clock cycles of one block (clock64 around the call,
// 512 threads, one or two blocks per SM). Checks the order too. Build and run
// from the repository root on a GPU machine:
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90 -Icsrc/include -Icsrc \
//     csrc/cuda/tests/block_sort_bench.cu -o block_sort_bench && ./block_sort_bench
#include <cstdio>
#include <random>
#include <vector>
#include <algorithm>

#include "cuda/topk_bitonic.cuh"
#include "cuda/topk_radix.cuh"

using namespace jax_topk::cuda;

enum Variant { kBitonic = 0, kRank = 1, kSharedOnly = 2 };

// The previous block sort (every stage through shared memory), for reference.
__device__ void shared_only_bitonic_sort_desc(uint64_t* s, int count) {
  const int pairs = count / 2;
  __syncthreads();
  for (int size = 2; size <= count; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int p = int(threadIdx.x); p < pairs; p += int(blockDim.x)) {
        const int i = 2 * stride * (p / stride) + (p % stride);
        const int j = i + stride;
        uint64_t a = s[i], b = s[j];
        if ((i & size) == 0) order_desc(a, b); else order_desc(b, a);
        s[i] = a;
        s[j] = b;
      }
      __syncthreads();
    }
  }
}

template <int kVariant>
__global__ void __launch_bounds__(kRadixThreads) order_kernel(const uint64_t* in, uint64_t* out, int count,
                                                              long long* cycles) {
  extern __shared__ uint64_t s[];
  uint64_t* dst = s + 4096;
  const uint64_t* src = in + size_t(blockIdx.x) * count;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s[i] = src[i];
  __syncthreads();
  const long long t0 = clock64();
  if constexpr (kVariant == kBitonic) {
    block_bitonic_sort_desc(s, count);
  } else if constexpr (kVariant == kSharedOnly) {
    shared_only_bitonic_sort_desc(s, count);
  } else {
    // Thread i ranks candidate i against all: rank = #{j : s[j] > s[i]}.
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      const uint64_t mine = s[i];
      int rank = 0;
#pragma unroll 8
      for (int j = 0; j < count; ++j) rank += s[j] > mine;
      dst[rank] = mine;
    }
    __syncthreads();
  }
  const long long t1 = clock64();
  const uint64_t* res = kVariant == kRank ? dst : s;
  for (int i = threadIdx.x; i < count; i += blockDim.x) out[size_t(blockIdx.x) * count + i] = res[i];
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t smem = 8192 * sizeof(uint64_t);
  cudaFuncSetAttribute(order_kernel<kBitonic>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  cudaFuncSetAttribute(order_kernel<kRank>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  cudaFuncSetAttribute(order_kernel<kSharedOnly>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  std::mt19937_64 rng(3);
  std::printf("%-8s %-6s %12s %12s %s\n", "variant", "count", "cycles(1/SM)", "cycles(2/SM)", "ok");
  const char* names[] = {"bitonic", "rank", "smem_old"};
  for (int variant = 0; variant < 3; ++variant) {
    for (int count = 64; count <= 4096; count *= 2) {
      if (variant == kRank && count > 1024) continue;
      double med[2] = {0, 0};
      bool ok = true;
      for (int per_sm = 1; per_sm <= 2; ++per_sm) {
        const int blocks = sms * per_sm;
        std::vector<uint64_t> host(size_t(blocks) * count);
        for (auto& v : host) v = rng() | 1;
        uint64_t *in, *out;
        long long* cyc;
        cudaMalloc(&in, host.size() * 8);
        cudaMalloc(&out, host.size() * 8);
        cudaMalloc(&cyc, blocks * sizeof(long long));
        cudaMemcpy(in, host.data(), host.size() * 8, cudaMemcpyHostToDevice);
        for (int rep = 0; rep < 3; ++rep) {
          if (variant == kBitonic) order_kernel<kBitonic><<<blocks, kRadixThreads, smem>>>(in, out, count, cyc);
          else if (variant == kRank) order_kernel<kRank><<<blocks, kRadixThreads, smem>>>(in, out, count, cyc);
          else order_kernel<kSharedOnly><<<blocks, kRadixThreads, smem>>>(in, out, count, cyc);
        }
        cudaError_t err = cudaDeviceSynchronize();
        if (err != cudaSuccess) { std::printf("error %s\n", cudaGetErrorString(err)); return 1; }
        std::vector<long long> c(blocks);
        cudaMemcpy(c.data(), cyc, blocks * sizeof(long long), cudaMemcpyDeviceToHost);
        std::sort(c.begin(), c.end());
        med[per_sm - 1] = double(c[c.size() / 2]);
        std::vector<uint64_t> res(host.size());
        cudaMemcpy(res.data(), out, res.size() * 8, cudaMemcpyDeviceToHost);
        for (int b = 0; b < blocks; ++b) {
          std::vector<uint64_t> want(host.begin() + size_t(b) * count, host.begin() + size_t(b + 1) * count);
          std::sort(want.begin(), want.end(), std::greater<uint64_t>());
          ok = ok && std::equal(want.begin(), want.end(), res.begin() + size_t(b) * count);
        }
        cudaFree(in);
        cudaFree(out);
        cudaFree(cyc);
      }
      std::printf("%-8s %-6d %12.0f %12.0f %s\n", names[variant], count, med[0], med[1],
                  ok ? "ok" : "WRONG");
    }
  }
  return 0;
}
