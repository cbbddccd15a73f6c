// XLA FFI handlers of the sort op family: stable sort (and argsort) along the
// last axis, with or without per-row lengths. Compiled once per platform
// module (JAX_TOPK_PLATFORM_CPU or JAX_TOPK_PLATFORM_CUDA).

#include <algorithm>
#include <vector>

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
// `lengths` may be null (every row whole).
ffi::Error sort_cpu_rows(ffi::ThreadPool& pool, const ffi::AnyBuffer& x, const int32_t* lengths,
                         ffi::AnyBuffer& values, ffi::Buffer<ffi::S32>& indices, bool descending,
                         const ffi_util::RowGeometry& g) {
  const auto dtype = ffi_util::to_dtype(x.element_type());
  if (!dtype) return ffi_util::unsupported_dtype(kOp, x.element_type());
  ffi_util::XlaThreadPoolRunner runner(pool);
  cpu::sort_rows(*dtype, x.untyped_data(), values.untyped_data(), indices.typed_data(), g.rows, g.n,
                 descending, lengths, runner);
  return ffi::Error::Success();
}

ffi::Error sort_cpu(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> values,
                    ffi::Result<ffi::Buffer<ffi::S32>> indices, bool descending) {
  ffi_util::RowGeometry g;
  const int64_t n = x.dimensions().size() ? x.dimensions().back() : 0;
  if (auto err = ffi_util::row_geometry(kOp, x, *values, n, &g); err.failure()) return err;
  return sort_cpu_rows(pool, x, nullptr, *values, *indices, descending, g);
}

ffi::Error sort_lengths_cpu(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> lengths,
                            ffi::Result<ffi::AnyBuffer> values,
                            ffi::Result<ffi::Buffer<ffi::S32>> indices, bool descending) {
  ffi_util::RowGeometry g;
  const int64_t n = x.dimensions().size() ? x.dimensions().back() : 0;
  if (auto err = ffi_util::row_geometry(kOp, x, *values, n, &g); err.failure()) return err;
  if (auto err = ffi_util::check_lengths(kOp, lengths, g); err.failure()) return err;
  // Lengths read as a sequence mask (arange(n) < lengths), as for top_k.
  std::vector<int32_t> clamped(lengths.typed_data(), lengths.typed_data() + g.rows);
  for (auto& l : clamped) l = std::clamp<int32_t>(l, 0, int32_t(g.n));
  return sort_cpu_rows(pool, x, clamped.data(), *values, *indices, descending, g);
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
