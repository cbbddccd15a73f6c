// Declarations of the FFI handler symbols: one per row of ffi/targets.h that
// this platform's module has (defined in ffi/<op family>.cc).
#pragma once

#include "ffi/targets.h"
#include "xla/ffi/api/c_api.h"

#if defined(JAX_TOPK_PLATFORM_CPU)
#define JAX_TOPK_HANDLER(stem) stem##Cpu
#elif defined(JAX_TOPK_PLATFORM_GPU)
#define JAX_TOPK_HANDLER(stem) stem##Gpu
#else
#error "define JAX_TOPK_PLATFORM_CPU, JAX_TOPK_PLATFORM_CUDA or JAX_TOPK_PLATFORM_ROCM"
#endif

#define JAX_TOPK_DECLARE_HANDLER(op, name, stem, cpu, gpu, dtypes) \
  JAX_TOPK_ON_THIS_PLATFORM(cpu, gpu,                       \
                            extern "C" XLA_FFI_Error* JAX_TOPK_HANDLER(stem)(XLA_FFI_CallFrame*);)
JAX_TOPK_FOR_EACH_TARGET(JAX_TOPK_DECLARE_HANDLER)
#undef JAX_TOPK_DECLARE_HANDLER
