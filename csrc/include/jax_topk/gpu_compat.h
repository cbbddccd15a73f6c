// Host/device portability macros: the one place where CUDA and HIP names meet.
// Plain C++ translation units see empty decorations.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define JAX_TOPK_HOST_DEVICE __host__ __device__
#define JAX_TOPK_DEVICE __device__
#define JAX_TOPK_FORCE_INLINE __forceinline__
#else
#define JAX_TOPK_HOST_DEVICE
#define JAX_TOPK_DEVICE
#define JAX_TOPK_FORCE_INLINE inline __attribute__((always_inline))
#endif
