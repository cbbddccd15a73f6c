// Hopper's warpgroup matrix multiply (wgmma, sm_90a only): the shared-memory
// descriptors of 128-byte-swizzled K-major tiles, the m64n128k16 product with
// float32 accumulators, and its fences. A kernel that uses these compiles its
// body only where JAX_TOPK_DEVICE_HAS_WGMMA is set (the sm_90a pass) and its
// host launches it only on a compute capability 9.0 device of a build that
// has sm_90a code (JAX_TOPK_BUILD_HAS_WGMMA, set by CMakeLists.txt).
//
// The tiles: rows of K-contiguous 16-bit elements, 64 elements (128 bytes)
// per row of a swizzle atom; a tile of R rows and K = 64 * b elements is b
// slabs of R rows x 128 bytes, and the 16-byte chunk c of row r sits at chunk
// c ^ (r % 8) of its row (what swizzle_128b_offset computes). A tile must
// start 1024-byte aligned.
#pragma once

#include "cuda/mma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define JAX_TOPK_DEVICE_HAS_WGMMA 1
#endif

#if defined(JAX_TOPK_HAS_MMA) && defined(JAX_TOPK_GPU_COMPILER)
#include <cstdint>
#include <type_traits>

namespace jax_topk::cuda {

// Byte offset of 16-byte chunk `chunk` (of K / 8 per row) of row `row` in a
// swizzled tile of `rows` rows.
__host__ __device__ constexpr uint32_t swizzle_128b_offset(int rows, int row, int chunk) {
  return uint32_t((chunk / 8) * rows * 128 + row * 128 + (((chunk % 8) ^ (row % 8)) * 16));
}

// The descriptor of a K-major, 128-byte-swizzled operand whose first element
// (row 0, element k0 of a k-step) is at shared address `address`: 8-row groups
// 1024 bytes apart (stride byte offset); the leading byte offset is unused by
// this layout (1 by convention).
__device__ __forceinline__ uint64_t wgmma_descriptor(uint32_t address) {
  return uint64_t((address & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed groups of this warpgroup's products are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins the accumulators between wgmma's asynchronous writes and the code
// around them: the compiler may not move a read of d before the wait, nor
// a write of d after the product is issued.
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The product's asm for input type DTYPE ("bf16" or "f16"): accumulators
// %0..%63, descriptors %64 (a) and %65 (b), %66 nonzero to accumulate.
#define JAX_TOPK_WGMMA_M64N128K16(DTYPE)                                              \
  asm volatile(                                                                       \
    "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"                                   \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32." DTYPE "." DTYPE " {"             \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
    "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                              \
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
    : "l"(a), "l"(b), "r"(accumulate ? 1 : 0))

// d (64 x 128, float32; accumulate: d += a b^T, else d = a b^T) from a
// (64 x 16) and b (128 x 16), both K-major in shared memory (descriptors).
// Thread t of the warpgroup holds, for column tile j = 0..15, d[4j + r] =
// element (16 (t / 32) + (t % 32) / 4 + 8 (r / 2), 8 j + 2 (t % 4) + r % 2).
template <typename T>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t a, uint64_t b, bool accumulate) {
#if defined(JAX_TOPK_DEVICE_HAS_WGMMA)
  if constexpr (std::is_same_v<T, MmaF16>) {
    JAX_TOPK_WGMMA_M64N128K16("f16");
  } else {
    JAX_TOPK_WGMMA_M64N128K16("bf16");
  }
#else
  (void)d, (void)a, (void)b, (void)accumulate;
  __trap();  // launched only where the sm_90a pass compiled it
#endif
}
#undef JAX_TOPK_WGMMA_M64N128K16

}  // namespace jax_topk::cuda

#endif  // JAX_TOPK_HAS_MMA && JAX_TOPK_GPU_COMPILER
