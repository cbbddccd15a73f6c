// XLA FFI handlers of the top_k op family: decode the buffers and the `k`
// attribute, check them, and call the platform's kernel. This file is compiled
// once per platform module: JAX_TOPK_PLATFORM_CPU or JAX_TOPK_PLATFORM_GPU.

#include "ffi/handlers.h"

#include <string>

#include "ffi/common.h"

#if defined(JAX_TOPK_PLATFORM_CPU)
#include "cpu/topk_cpu.h"
#endif
#if defined(JAX_TOPK_PLATFORM_GPU)
#include "cuda/topk_cuda.h"
#endif

namespace ffi = ::xla::ffi;

namespace jax_topk {
namespace {

constexpr const char* kOp = "jax_topk.top_k";

#if defined(JAX_TOPK_PLATFORM_CPU)
ffi::Error topk_cpu_rows(ffi::ThreadPool& pool, const ffi::AnyBuffer& x,
                         const ffi::Buffer<ffi::S32>* lengths, ffi::AnyBuffer& values,
                         ffi::Buffer<ffi::S32>& indices, int64_t k) {
  ffi_util::RowCall c;
  if (auto err = ffi_util::decode_rows(kOp, x, values, k, lengths, &c); err.failure()) return err;
  return ffi_util::run_cpu_kernel(kOp, pool, x, [&](DType dtype, cpu::TaskRunner& runner) {
    cpu::topk_rows(dtype, x.untyped_data(), values.untyped_data(), indices.typed_data(), c.g.rows,
                   c.g.n, k, c.lengths_or_null(), runner);
  });
}
#endif

#if defined(JAX_TOPK_PLATFORM_GPU)
// Temporaries come in `workspace`, an extra result sized at lowering time by
// the module's workspace_bytes(): no run-time allocation, so XLA may capture
// the call into a CUDA graph (kCmdBufferCompatible).
ffi::Error topk_gpu_rows(gpuStream_t stream, const ffi::AnyBuffer& x, const ffi::Buffer<ffi::S32>* lengths,
                          ffi::AnyBuffer& values, ffi::Buffer<ffi::S32>& indices,
                          ffi::Buffer<ffi::U8>& workspace, int64_t k) {
  return ffi_util::run_gpu_rows(
      kOp, x, lengths, values, k, topk_dtype, workspace,
      [&](DType dtype, const ffi_util::RowGeometry& g) { return cuda::topk_scratch_bytes(dtype, g.rows, g.n, k); },
      [&](DType dtype, const ffi_util::RowGeometry& g, const int32_t* row_lengths, void* scratch, size_t bytes) {
        return cuda::topk_rows(dtype, x.untyped_data(), values.untyped_data(), indices.typed_data(), g.rows, g.n, k,
                               row_lengths, scratch, bytes, stream);
      });
}
#endif

}  // namespace
}  // namespace jax_topk

#if defined(JAX_TOPK_PLATFORM_CPU)
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkTopKCpu, (jax_topk::ffi_util::cpu_row_op<int64_t, jax_topk::topk_cpu_rows>),
                              jax_topk::ffi_util::cpu_row_op_binding<false>().Attr<int64_t>("k"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkTopKLengthsCpu,
                              (jax_topk::ffi_util::cpu_row_op_lengths<int64_t, jax_topk::topk_cpu_rows>),
                              jax_topk::ffi_util::cpu_row_op_binding<true>().Attr<int64_t>("k"));
#endif

#if defined(JAX_TOPK_PLATFORM_GPU)
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkTopKGpu, (jax_topk::ffi_util::gpu_row_op<int64_t, jax_topk::topk_gpu_rows>),
                              jax_topk::ffi_util::gpu_row_op_binding<false>().Attr<int64_t>("k"),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkTopKLengthsGpu,
                              (jax_topk::ffi_util::gpu_row_op_lengths<int64_t, jax_topk::topk_gpu_rows>),
                              jax_topk::ffi_util::gpu_row_op_binding<true>().Attr<int64_t>("k"),
                              {ffi::Traits::kCmdBufferCompatible});
#endif
