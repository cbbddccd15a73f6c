// Declarations of the FFI handler symbols: one per row of ffi/targets.h that
// this platform's module has (defined in ffi/<op family>.cc).
#pragma once

#include "ffi/targets.h"
#include "xla/ffi/api/c_api.h"

#if defined(JAX_TOPK_PLATFORM_CPU)
#define JAX_TOPK_HANDLER(stem) stem##Cpu
#elif defined(JAX_TOPK_PLATFORM_CUDA)
#define JAX_TOPK_HANDLER(stem) stem##Cuda
#else
#error "define JAX_TOPK_PLATFORM_CPU or JAX_TOPK_PLATFORM_CUDA"
#endif

#define JAX_TOPK_DECLARE_HANDLER(op, name, stem, cpu, cuda, dtypes) \
  JAX_TOPK_ON_THIS_PLATFORM(cpu, cuda,                      \
                            extern "C" XLA_FFI_Error* JAX_TOPK_HANDLER(stem)(XLA_FFI_CallFrame*);)
JAX_TOPK_FOR_EACH_TARGET(JAX_TOPK_DECLARE_HANDLER)
#undef JAX_TOPK_DECLARE_HANDLER
