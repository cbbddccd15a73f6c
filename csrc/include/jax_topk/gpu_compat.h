// CUDA/HIP portability: the one place where CUDA and HIP names meet.
//
// Four layers, each visible only where it can compile:
//  1. host/device decorations, for every translation unit (plain C++ sees
//     empty ones);
//  2. the runtime API as `gpu*` names (streams, errors, attributes), for the
//     GPU kernels and the GPU FFI module (JAX_TOPK_PLATFORM_GPU);
//  3. warp collectives over the kernels' 32-lane logical warp, for device
//     code;
//  4. block and device radix sorts, for device code.
//
// The warp: every kernel is written for warps of kWarpSize = 32 lanes (their
// bitonic networks, 32-bit ballot masks and per-warp shared-memory slots all
// assume it). NVIDIA warps are 32 lanes. AMD CDNA wavefronts are 64 lanes:
// there each wavefront holds two logical warps, shuffles stay within a warp
// by their `width` argument, a ballot returns the caller's half of the
// 64-bit wavefront mask, and a warp barrier is a wavefront barrier (the
// lanes of a wavefront run in lockstep). RDNA wave32 needs no translation.
// Code paths that depend on the hardware width read kHardwareWarpSize.
//
// The library sorts (section 4) come from CUB on CUDA and rocPRIM on ROCm
// (Debian's ROCm has no hipCUB), behind one small interface.
//
// CUDA-only features are flagged for the callers that have a portable path:
// JAX_TOPK_HAS_CLUSTERS (thread-block clusters and distributed shared
// memory, sm_90+) and JAX_TOPK_HAS_MMA (the sm_80+ tensor-core PTX: mma.sync,
// ldmatrix, cp.async).
#pragma once

// The GPU FFI modules (compiled by the host compiler) name their platform.
#if defined(JAX_TOPK_PLATFORM_CUDA) || defined(JAX_TOPK_PLATFORM_ROCM)
#define JAX_TOPK_PLATFORM_GPU 1
#endif
#if defined(JAX_TOPK_PLATFORM_ROCM) && !defined(__HIP_PLATFORM_AMD__)
#define __HIP_PLATFORM_AMD__ 1  // what hipcc defines, for the host compiler's view of the HIP headers
#endif
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIP__)
#define JAX_TOPK_HIP 1
#endif

// ---- 1. decorations --------------------------------------------------------
// A GPU compiler (nvcc, or clang in HIP mode) is compiling this translation unit.
#if defined(__CUDACC__) || defined(__HIP__)
#define JAX_TOPK_GPU_COMPILER 1
#endif

#if defined(JAX_TOPK_GPU_COMPILER)
#define JAX_TOPK_HOST_DEVICE __host__ __device__
#define JAX_TOPK_DEVICE __device__
#define JAX_TOPK_FORCE_INLINE __forceinline__
#else
#define JAX_TOPK_HOST_DEVICE
#define JAX_TOPK_DEVICE
#define JAX_TOPK_FORCE_INLINE inline __attribute__((always_inline))
#endif

// True in the device compilation pass (host-callable code picks intrinsics or
// portable builtins with it).
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define JAX_TOPK_DEVICE_PASS 1
#endif

#if !defined(JAX_TOPK_HIP)
#define JAX_TOPK_HAS_CLUSTERS 1
#define JAX_TOPK_HAS_MMA 1
#endif

// ---- 2. runtime API --------------------------------------------------------
#if defined(JAX_TOPK_GPU_COMPILER) || defined(JAX_TOPK_PLATFORM_GPU)
#if defined(JAX_TOPK_HIP)
#if defined(__HIP__)
#include <hip/hip_runtime.h>
#else
#include <hip/hip_runtime_api.h>
#endif
#define JAX_TOPK_GPU_RUNTIME_NAME "HIP"
#define JAX_TOPK_GPU_NAME(name) hip##name
#else
#include <cuda_runtime_api.h>
#define JAX_TOPK_GPU_RUNTIME_NAME "CUDA"
#define JAX_TOPK_GPU_NAME(name) cuda##name
#endif

// The runtime names the library uses, each aliased once.
using gpuError_t = JAX_TOPK_GPU_NAME(Error_t);
using gpuStream_t = JAX_TOPK_GPU_NAME(Stream_t);
using gpuFuncAttributes = JAX_TOPK_GPU_NAME(FuncAttributes);
#define gpuSuccess JAX_TOPK_GPU_NAME(Success)
#define gpuErrorInvalidValue JAX_TOPK_GPU_NAME(ErrorInvalidValue)
#define gpuErrorInvalidDevice JAX_TOPK_GPU_NAME(ErrorInvalidDevice)
#define gpuGetLastError JAX_TOPK_GPU_NAME(GetLastError)
#define gpuGetErrorString JAX_TOPK_GPU_NAME(GetErrorString)
#define gpuGetDevice JAX_TOPK_GPU_NAME(GetDevice)
#define gpuDeviceGetAttribute JAX_TOPK_GPU_NAME(DeviceGetAttribute)
#define gpuFuncGetAttributes JAX_TOPK_GPU_NAME(FuncGetAttributes)
#define gpuOccupancyMaxActiveBlocksPerMultiprocessor JAX_TOPK_GPU_NAME(OccupancyMaxActiveBlocksPerMultiprocessor)
#define gpuMemsetAsync JAX_TOPK_GPU_NAME(MemsetAsync)
#define gpuMemcpyToSymbol JAX_TOPK_GPU_NAME(MemcpyToSymbol)
#define gpuMemcpyFromSymbol JAX_TOPK_GPU_NAME(MemcpyFromSymbol)
#if defined(JAX_TOPK_HIP)
#define gpuDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define gpuDevAttrMaxSharedMemoryPerBlockOptin hipDeviceAttributeSharedMemPerBlockOptin
#define gpuDevAttrComputeCapabilityMajor hipDeviceAttributeComputeCapabilityMajor
#define gpuDevAttrComputeCapabilityMinor hipDeviceAttributeComputeCapabilityMinor
#define gpuDevAttrL2CacheSize hipDeviceAttributeL2CacheSize
#else
#define gpuDevAttrMultiProcessorCount cudaDevAttrMultiProcessorCount
#define gpuDevAttrMaxSharedMemoryPerBlockOptin cudaDevAttrMaxSharedMemoryPerBlockOptin
#define gpuDevAttrComputeCapabilityMajor cudaDevAttrComputeCapabilityMajor
#define gpuDevAttrComputeCapabilityMinor cudaDevAttrComputeCapabilityMinor
#define gpuDevAttrL2CacheSize cudaDevAttrL2CacheSize
#endif

// A kernel's dynamic shared memory limit (HIP takes the kernel as const void*).
template <typename Kernel>
inline gpuError_t gpu_set_max_dynamic_smem(Kernel* kernel, int bytes) {
#if defined(JAX_TOPK_HIP)
  return hipFuncSetAttribute(reinterpret_cast<const void*>(kernel), hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
#else
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
#endif
}
#endif  // runtime API

// ---- 3. warp collectives (and a half-precision conversion) -----------------
#if defined(JAX_TOPK_GPU_COMPILER)
#include <cstdint>
#if defined(JAX_TOPK_HIP)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif

namespace jax_topk::cuda {

// The kernels' warp: 32 lanes on every GPU (see the top of this file).
inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullWarpMask = 0xffffffffu;
#if defined(JAX_TOPK_HIP)
#if defined(__AMDGCN_WAVEFRONT_SIZE)
inline constexpr int kHardwareWarpSize = __AMDGCN_WAVEFRONT_SIZE;
#else
inline constexpr int kHardwareWarpSize = 64;  // host pass: never read there
#endif
#else
inline constexpr int kHardwareWarpSize = 32;
#endif
static_assert(kHardwareWarpSize % kWarpSize == 0, "a hardware warp holds whole logical warps");

// Every collective below must be called by all 32 lanes of the logical warp.
// `width` (a power of two <= 32) splits the warp into independent segments.
template <typename T>
__device__ JAX_TOPK_FORCE_INLINE T warp_shfl(T v, int src_lane, int width = kWarpSize) {
#if defined(JAX_TOPK_HIP)
  return __shfl(v, src_lane, width);
#else
  return __shfl_sync(kFullWarpMask, v, src_lane, width);
#endif
}

template <typename T>
__device__ JAX_TOPK_FORCE_INLINE T warp_shfl_xor(T v, int lane_mask, int width = kWarpSize) {
#if defined(JAX_TOPK_HIP)
  return __shfl_xor(v, lane_mask, width);
#else
  return __shfl_xor_sync(kFullWarpMask, v, lane_mask, width);
#endif
}

template <typename T>
__device__ JAX_TOPK_FORCE_INLINE T warp_shfl_up(T v, unsigned delta, int width = kWarpSize) {
#if defined(JAX_TOPK_HIP)
  return __shfl_up(v, delta, width);
#else
  return __shfl_up_sync(kFullWarpMask, v, delta, width);
#endif
}

// Bit i set when lane i of the caller's logical warp has `pred`.
__device__ JAX_TOPK_FORCE_INLINE uint32_t warp_ballot(bool pred) {
#if defined(JAX_TOPK_HIP)
  const uint64_t wave = __ballot(pred);
  if constexpr (kHardwareWarpSize == kWarpSize) return uint32_t(wave);
  return uint32_t(wave >> (__lane_id() & kWarpSize));  // this logical warp's half
#else
  return __ballot_sync(kFullWarpMask, pred);
#endif
}

__device__ JAX_TOPK_FORCE_INLINE bool warp_any(bool pred) {
#if defined(JAX_TOPK_HIP)
  return warp_ballot(pred) != 0;  // a wavefront-wide __any would mix the two logical warps
#else
  return __any_sync(kFullWarpMask, pred);
#endif
}

// Orders the warp's shared-memory accesses before the barrier against those after.
__device__ JAX_TOPK_FORCE_INLINE void warp_sync() {
#if defined(JAX_TOPK_HIP)
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
  __syncwarp();
#endif
}

// base[offset] where base is not null, else `fallback`: one predicated
// read-only load. The select `base ? base + offset : &some_global` it
// replaces fetches the global's address from the constant bank first, a miss
// at a kernel's start that the load then waits for (the register rows' ncu
// profile, session 50: ~4% of a block's samples, before its row could load).
// volatile keeps it after the kernel's griddepcontrol.wait (dependent
// launches: the kernel before may write the lengths); a plain asm statement
// claims to read no memory and could be hoisted above it (sm_90: the same
// SASS either way today).
__device__ JAX_TOPK_FORCE_INLINE int32_t load_readonly_or(const int32_t* base, int64_t offset, int32_t fallback) {
#if defined(JAX_TOPK_HIP) || !defined(__CUDA_ARCH__)
  return base != nullptr ? __ldg(base + offset) : fallback;
#else
  int32_t v = fallback;
  const uint64_t address = reinterpret_cast<uint64_t>(base) + uint64_t(offset) * sizeof(int32_t);
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u64 p, %1, 0;\n\t@p ld.global.nc.b32 %0, [%2];\n\t}"
      : "+r"(v)
      : "l"(reinterpret_cast<uint64_t>(base)), "l"(address));
  return v;
#endif
}

// Sum / max / min of v over the warp, in every lane (exact: integers).
__device__ JAX_TOPK_FORCE_INLINE uint32_t warp_reduce_add(uint32_t v) {
#if !defined(JAX_TOPK_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_add_sync(kFullWarpMask, v);
#else
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += warp_shfl_xor(v, offset);
  return v;
#endif
}

__device__ JAX_TOPK_FORCE_INLINE uint32_t warp_reduce_max(uint32_t v) {
#if !defined(JAX_TOPK_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFullWarpMask, v);
#else
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const uint32_t other = warp_shfl_xor(v, offset);
    v = v < other ? other : v;
  }
  return v;
#endif
}

__device__ JAX_TOPK_FORCE_INLINE uint32_t warp_reduce_min(uint32_t v) { return ~warp_reduce_max(~v); }

// The float32 value of float16 bits (exact).
__device__ JAX_TOPK_FORCE_INLINE float half_bits_to_float(unsigned short bits) {
  return __half2float(__ushort_as_half(bits));
}

// Aborts the kernel (a launch the dispatcher should never make).
__device__ JAX_TOPK_FORCE_INLINE void gpu_trap() {
#if defined(JAX_TOPK_HIP)
  __builtin_trap();
#else
  __trap();
#endif
}

}  // namespace jax_topk::cuda
#endif  // warp collectives

// ---- 4. library radix sorts --------------------------------------------------
#if defined(JAX_TOPK_GPU_COMPILER)
#if defined(JAX_TOPK_HIP)
#include <rocprim/rocprim.hpp>  // (5.3's block sort header misses its own includes)
#else
#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#endif

namespace jax_topk::cuda {

// A block's stable radix sort of (key, value) pairs held kItems per thread
// in blocked order, ascending by key; the result comes back striped.
// kRadixBits is CUB's digit width (rocPRIM chooses its own).
template <typename K, int kThreads, int kItems, typename V, int kRadixBits>
struct BlockRadixSortPairs {
#if defined(JAX_TOPK_HIP)
  using Impl = rocprim::block_radix_sort<K, kThreads, kItems, V>;
  using TempStorage = typename Impl::storage_type;
  __device__ static void sort_blocked_to_striped(TempStorage& temp, K (&keys)[kItems], V (&values)[kItems]) {
    Impl().sort_to_striped(keys, values, temp);
  }
#else
  using Impl = cub::BlockRadixSort<K, kThreads, kItems, V, kRadixBits>;
  using TempStorage = typename Impl::TempStorage;
  __device__ static void sort_blocked_to_striped(TempStorage& temp, K (&keys)[kItems], V (&values)[kItems]) {
    Impl(temp).SortBlockedToStriped(keys, values);
  }
#endif
};

// Device-wide descending radix sort of keys over bits [begin_bit, end_bit):
// with temp == nullptr, sets temp_bytes to what the call needs.
template <typename K>
gpuError_t device_sort_keys_descending(void* temp, size_t& temp_bytes, const K* in, K* out, int count,
                                       int begin_bit, int end_bit, gpuStream_t stream) {
#if defined(JAX_TOPK_HIP)
  if constexpr (sizeof(K) > 8) {
    return gpuErrorInvalidValue;  // rocPRIM 5 sorts keys of at most 64 bits (see kLibrarySortMaxKeyBytes)
  } else {
    return rocprim::radix_sort_keys_desc(temp, temp_bytes, in, out, unsigned(count), unsigned(begin_bit),
                                         unsigned(end_bit), stream);
  }
#else
  return cub::DeviceRadixSort::SortKeysDescending(temp, temp_bytes, in, out, count, begin_bit, end_bit, stream);
#endif
}

// The same over `segments` segments [begin[s], end[s]) of `count` keys.
template <typename K>
gpuError_t segmented_sort_keys_descending(void* temp, size_t& temp_bytes, const K* in, K* out, int count,
                                          int segments, const int* begin, const int* end, int begin_bit,
                                          int end_bit, gpuStream_t stream) {
#if defined(JAX_TOPK_HIP)
  if constexpr (sizeof(K) > 8) {
    return gpuErrorInvalidValue;
  } else {
    return rocprim::segmented_radix_sort_keys_desc(temp, temp_bytes, in, out, unsigned(count), unsigned(segments),
                                                   begin, end, unsigned(begin_bit), unsigned(end_bit), stream);
  }
#else
  return cub::DeviceSegmentedRadixSort::SortKeysDescending(temp, temp_bytes, in, out, count, segments, begin, end,
                                                           begin_bit, end_bit, stream);
#endif
}

}  // namespace jax_topk::cuda
#endif  // library radix sorts
