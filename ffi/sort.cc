// XLA FFI handlers of the sort op family: stable sort (and argsort) along the
// last axis, with or without per-row lengths. Compiled once per platform
// module (JAX_TOPK_PLATFORM_CPU or JAX_TOPK_PLATFORM_CUDA).

#include "ffi/common.h"
#include "ffi/handlers.h"

#if defined(JAX_TOPK_PLATFORM_CPU)
#include "cpu/sort_cpu.h"
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

ffi::Error sort_cpu(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> values,
                    ffi::Result<ffi::Buffer<ffi::S32>> indices, bool descending) {
  return sort_cpu_rows(pool, x, nullptr, *values, *indices, descending);
}

ffi::Error sort_lengths_cpu(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> lengths,
                            ffi::Result<ffi::AnyBuffer> values,
                            ffi::Result<ffi::Buffer<ffi::S32>> indices, bool descending) {
  return sort_cpu_rows(pool, x, &lengths, *values, *indices, descending);
}
#endif

}  // namespace
}  // namespace jax_topk

#if defined(JAX_TOPK_PLATFORM_CPU)
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkSortCpu, jax_topk::sort_cpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<bool>("descending"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkSortLengthsCpu, jax_topk::sort_lengths_cpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<bool>("descending"));
#endif
