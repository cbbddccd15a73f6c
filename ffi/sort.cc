// XLA FFI handlers of the sort op family: stable sort (and argsort) along the
// last axis, with or without per-row lengths. Compiled once per platform
// module (JAX_TOPK_PLATFORM_CPU or JAX_TOPK_PLATFORM_GPU).

#include "ffi/common.h"
#include "ffi/handlers.h"
#include "jax_topk/sort_dispatch.h"

#if defined(JAX_TOPK_PLATFORM_CPU)
#include "cpu/sort_cpu.h"
#endif
#if defined(JAX_TOPK_PLATFORM_GPU)
#include "cuda/sort_cuda.h"
#endif

namespace ffi = ::xla::ffi;

namespace jax_topk {
namespace {

constexpr const char* kOp = "jax_topk.sort";

#if defined(JAX_TOPK_PLATFORM_CPU)
ffi::Error sort_cpu_rows(ffi::ThreadPool& pool, const ffi::AnyBuffer& x,
                         const ffi::Buffer<ffi::S32>* lengths, ffi::AnyBuffer& values,
                         ffi::Buffer<ffi::S32>& indices, bool descending) {
  ffi_util::RowCall c;
  const int64_t n = x.dimensions().size() ? x.dimensions().back() : 0;
  if (auto err = ffi_util::decode_rows(kOp, x, values, n, lengths, &c); err.failure()) return err;
  return ffi_util::run_cpu_kernel(kOp, pool, x, [&](DType dtype, cpu::TaskRunner& runner) {
    cpu::sort_rows(dtype, x.untyped_data(), values.untyped_data(), indices.typed_data(), c.g.rows,
                   c.g.n, descending, c.lengths_or_null(), runner);
  });
}
#endif

#if defined(JAX_TOPK_PLATFORM_GPU)
// Temporaries come in `workspace`, an extra result sized at lowering time (see
// ffi/topk.cc): capturable into XLA's command buffers.
ffi::Error sort_gpu_rows(gpuStream_t stream, const ffi::AnyBuffer& x, const ffi::Buffer<ffi::S32>* lengths,
                          ffi::AnyBuffer& values, ffi::Buffer<ffi::S32>& indices,
                          ffi::Buffer<ffi::U8>& workspace, bool descending) {
  const int64_t n = x.dimensions().size() ? x.dimensions().back() : 0;
  return ffi_util::run_gpu_rows(
      kOp, x, lengths, values, n, sort_dtype, workspace,
      [&](DType dtype, const ffi_util::RowGeometry& g) { return cuda::sort_scratch_bytes(dtype, g.rows, g.n); },
      [&](DType dtype, const ffi_util::RowGeometry& g, const int32_t* row_lengths, void* scratch, size_t bytes) {
        return cuda::sort_rows(dtype, x.untyped_data(), values.untyped_data(), indices.typed_data(), g.rows, g.n,
                               descending, row_lengths, scratch, bytes, stream);
      });
}
#endif

}  // namespace
}  // namespace jax_topk

#if defined(JAX_TOPK_PLATFORM_CPU)
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkSortCpu, (jax_topk::ffi_util::cpu_row_op<bool, jax_topk::sort_cpu_rows>),
                              jax_topk::ffi_util::cpu_row_op_binding<false>().Attr<bool>("descending"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkSortLengthsCpu,
                              (jax_topk::ffi_util::cpu_row_op_lengths<bool, jax_topk::sort_cpu_rows>),
                              jax_topk::ffi_util::cpu_row_op_binding<true>().Attr<bool>("descending"));
#endif

#if defined(JAX_TOPK_PLATFORM_GPU)
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkSortGpu, (jax_topk::ffi_util::gpu_row_op<bool, jax_topk::sort_gpu_rows>),
                              jax_topk::ffi_util::gpu_row_op_binding<false>().Attr<bool>("descending"),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkSortLengthsGpu,
                              (jax_topk::ffi_util::gpu_row_op_lengths<bool, jax_topk::sort_gpu_rows>),
                              jax_topk::ffi_util::gpu_row_op_binding<true>().Attr<bool>("descending"),
                              {ffi::Traits::kCmdBufferCompatible});
#endif
