// The L2 gather roof: how fast an H100/H200 gathers random 16 KB blocks (NSA's selected-branch
// access: 64 keys x 128 dims bf16, one K or V block) from a region of R MB, against the HBM copy
// bandwidth. It tells an L2-bandwidth-bound kernel from a latency-bound one. Each block of 256
// threads reads `kChunks` random 16 KB blocks per round (all loads issued before any use),
// xor-folds them and writes one word. Standalone (no JAX):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 benchmarks/l2_gather_roof.cu -o /tmp/l2_gather_roof
//   /tmp/l2_gather_roof
// H200 figures: benchmarks/results/nvidia-h200-l2-gather-roof.txt.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

__device__ __forceinline__ uint32_t hash(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16; return x;
}

template <int kChunks, bool kCg>
__global__ void __launch_bounds__(256) gather(const uint4* __restrict__ src, uint32_t blocks, int rounds, uint32_t* out) {
  uint32_t acc = 0;
  for (int r = 0; r < rounds; ++r) {
    uint4 v[kChunks][4];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const uint32_t b = hash(blockIdx.x * 7919u + r * 104729u + c * 31u) % blocks;
      const uint4* p = src + size_t(b) * 1024 + threadIdx.x;  // 16 KB = 1024 uint4
#pragma unroll
      for (int i = 0; i < 4; ++i) v[c][i] = kCg ? __ldcg(p + 256 * i) : p[256 * i];
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc ^= v[c][i].x ^ v[c][i].y ^ v[c][i].z ^ v[c][i].w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

template <int kChunks, bool kCg>
void run(const uint4* src, size_t region_mb, int sms, int per_sm, uint32_t* out, cudaEvent_t a, cudaEvent_t b) {
  const uint32_t blocks = uint32_t(region_mb * 64);  // 16 KB blocks in the region
  const int grid = sms * per_sm, rounds = 64;
  gather<kChunks, kCg><<<grid, 256>>>(src, blocks, rounds, out);
  cudaEventRecord(a);
  const int reps = 5;
  for (int i = 0; i < reps; ++i) gather<kChunks, kCg><<<grid, 256>>>(src, blocks, rounds, out);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  const double bytes = double(reps) * grid * rounds * kChunks * 16384.0;
  printf("region %4zu MB  chunks in flight/block %d  %s  blocks/SM %2d : %6.2f TB/s\n", region_mb, kChunks,
         kCg ? "ld.cg" : "ld   ", per_sm, bytes / (ms * 1e-3) / 1e12);
}

__global__ void copy(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) d[i] = s[i];
}

int main() {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("%s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const size_t max_mb = 1024;
  uint4* src; uint4* dst; uint32_t* out;
  cudaMalloc(&src, max_mb << 20); cudaMalloc(&dst, max_mb << 20); cudaMalloc(&out, 1 << 20);
  cudaMemset(src, 1, max_mb << 20);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  {  // HBM copy bandwidth, 1 GB
    const size_t n = (max_mb << 20) / 16;
    copy<<<prop.multiProcessorCount * 8, 512>>>(src, dst, n);
    cudaEventRecord(a); for (int i = 0; i < 5; ++i) copy<<<prop.multiProcessorCount * 8, 512>>>(src, dst, n);
    cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b);
    printf("copy 1 GB: %.2f TB/s (read + write)\n", 5.0 * 2 * (max_mb << 20) / (ms * 1e-3) / 1e12);
  }
  const int sms = prop.multiProcessorCount;
  for (size_t mb : {8, 32, 128, 1024}) {
    run<1, false>(src, mb, sms, 8, out, a, b);
    run<2, false>(src, mb, sms, 8, out, a, b);
    run<2, true>(src, mb, sms, 8, out, a, b);
    run<4, true>(src, mb, sms, 4, out, a, b);
    run<2, true>(src, mb, sms, 4, out, a, b);
  }
  cudaError_t e = cudaGetLastError();
  printf("%s\n", cudaGetErrorString(e));
  return 0;
}
