// The sm_80+ tensor-core building blocks the score kernels share (the
// indexer's and NSA's block scores): shared-memory addresses, ldmatrix,
// mma.sync m16n8k16 with float32 accumulators, and cp.async copies. CUDA only
// (JAX_TOPK_HAS_MMA); callers keep a portable path or none on ROCm.
#pragma once

#include "jax_topk/gpu_compat.h"

#if defined(JAX_TOPK_HAS_MMA) && defined(JAX_TOPK_GPU_COMPILER)
#include <cstdint>
#include <type_traits>

namespace jax_topk::cuda {

// The 16-bit input types of mma.sync, as tags (the kernels move raw bits).
struct MmaBf16 {};
struct MmaF16 {};

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit elements from shared memory: lanes 8i..8i+7
// give the row addresses of matrix i; register i holds matrix i's fragment.
__device__ __forceinline__ void load_matrices_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

// d += a (16x16, row-major) * b (16x8, column-major), 16-bit in, float32 out.
template <typename T = MmaBf16>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, MmaF16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// 16 bytes global -> shared without registers; zeros when !valid (no read).
__device__ __forceinline__ void copy_async_16(uint32_t shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Bulk copies (sm_90's TMA unit): one thread moves a contiguous piece global
// -> shared, completing it on an mbarrier that the readers wait on; the other
// threads' shared-memory traffic is not queued behind the copy.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define JAX_TOPK_HAS_BULK_COPY 1
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(arrivals) : "memory");
}
// The barriers' initialisation visible to the async proxy (the copies' completions).
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(bar))
               : "memory");
}
// This thread's generic-proxy accesses to shared memory ordered before later async-proxy ones.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
#endif

}  // namespace jax_topk::cuda

#endif  // JAX_TOPK_HAS_MMA && JAX_TOPK_GPU_COMPILER
