// Handler symbols of the top_k op family (defined in ffi/topk.cc).
#pragma once

#include "xla/ffi/api/c_api.h"

#if defined(JAX_TOPK_PLATFORM_CPU)
extern "C" XLA_FFI_Error* JaxTopkTopKCpu(XLA_FFI_CallFrame* call_frame);
#endif
#if defined(JAX_TOPK_PLATFORM_CUDA)
extern "C" XLA_FFI_Error* JaxTopkTopKCuda(XLA_FFI_CallFrame* call_frame);
#endif
