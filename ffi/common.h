// Shared pieces of the FFI handlers: dtype decoding, shape checks with clear
// messages, and the adapter from XLA's intra-op thread pool to the kernels'
// TaskRunner.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cpu/task_runner.h"
#include "jax_topk/dtypes.h"
#include "jax_topk/gpu_compat.h"
#include "xla/ffi/api/ffi.h"

namespace jax_topk::ffi_util {

namespace ffi = ::xla::ffi;

inline std::optional<DType> to_dtype(ffi::DataType t) {
  switch (t) {
#define JAX_TOPK_FFI_DTYPE_CASE(name, ffi_name, bits, kind, lowest) \
  case ffi::DataType::ffi_name:                             \
    return DType::name;
    JAX_TOPK_FOR_EACH_DTYPE(JAX_TOPK_FFI_DTYPE_CASE)
#undef JAX_TOPK_FFI_DTYPE_CASE
    default:
      return std::nullopt;
  }
}

// The dtype with this numpy name (the names `dtypes()` exports), if any.
inline std::optional<DType> dtype_from_name(const std::string& name) {
#define JAX_TOPK_NAME_CASE(dtype_name, ffi_name, bits, kind, lowest) \
  if (name == #dtype_name) return DType::dtype_name;
  JAX_TOPK_FOR_EACH_DTYPE(JAX_TOPK_NAME_CASE)
#undef JAX_TOPK_NAME_CASE
  return std::nullopt;
}

inline std::string shape_string(ffi::AnyBuffer::Dimensions dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

// A [..., n] operand seen as `rows` rows of length `n`.
struct RowGeometry {
  int64_t rows = 0;
  int64_t n = 0;
};

// Decodes the operand of a last-axis op and checks the outputs ([..., k]).
// Errors name the op, the buffers and their shapes.
inline ffi::Error row_geometry(const char* op, const ffi::AnyBuffer& x,
                               const ffi::AnyBuffer& values, int64_t out_len,
                               RowGeometry* out) {
  const auto dims = x.dimensions();
  if (dims.size() == 0) {
    return ffi::Error::InvalidArgument(std::string(op) + ": operand must have rank >= 1, got a scalar");
  }
  const int64_t n = dims.back();
  if (n >= (int64_t(1) << 31)) {
    return ffi::Error::InvalidArgument(std::string(op) + ": the last axis of operand " +
                                       shape_string(dims) + " must be shorter than 2^31 (int32 indices)");
  }
  if (out_len < 0 || out_len > n) {
    return ffi::Error::InvalidArgument(std::string(op) + ": k=" + std::to_string(out_len) +
                                       " must be in [0, " + std::to_string(n) + "] for operand " +
                                       shape_string(dims));
  }
  const auto vdims = values.dimensions();
  bool same = vdims.size() == dims.size() && vdims.back() == out_len;
  for (size_t i = 0; same && i + 1 < dims.size(); ++i) same = vdims[i] == dims[i];
  if (!same || values.element_type() != x.element_type()) {
    return ffi::Error::InvalidArgument(std::string(op) + ": output " + shape_string(vdims) +
                                       " does not match operand " + shape_string(dims) +
                                       " with k=" + std::to_string(out_len));
  }
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
  out->rows = rows;
  out->n = n;
  return ffi::Error::Success();
}

// Lengths must hold one int32 per row.
inline ffi::Error check_lengths_count(const char* op, const ffi::Buffer<ffi::S32>& lengths, int64_t rows) {
  if (int64_t(lengths.element_count()) == rows) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(std::string(op) + ": lengths has " + std::to_string(lengths.element_count()) +
                                     " elements, expected one per row (" + std::to_string(rows) + ")");
}

// Lengths under the one rule every op follows, the sequence mask
// arange(n) < lengths: each clamped to [0, n] (a length <= 0 selects nothing,
// >= n the whole row). The CPU kernels take them clamped.
inline std::vector<int32_t> clamped_lengths(const ffi::Buffer<ffi::S32>& lengths, int64_t rows, int64_t n) {
  const int32_t* l = lengths.typed_data();
  std::vector<int32_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) out[r] = int32_t(std::clamp<int64_t>(l[r], 0, n));
  return out;
}

// A row op's decoded operands: its geometry and, when given, its lengths under
// the one rule every op follows, the sequence mask arange(n) < lengths (a
// length <= 0 selects nothing, >= n the whole row).
struct RowCall {
  RowGeometry g;
  std::vector<int32_t> lengths;  // empty: every row whole
  const int32_t* lengths_or_null() const { return lengths.empty() ? nullptr : lengths.data(); }
};

// Checks a last-axis op's operands and outputs ([..., out_len]) and the
// optional lengths (one int32 per row). Errors name the op and the shapes.
inline ffi::Error decode_rows(const char* op, const ffi::AnyBuffer& x, const ffi::AnyBuffer& values,
                              int64_t out_len, const ffi::Buffer<ffi::S32>* lengths, RowCall* call) {
  if (auto err = row_geometry(op, x, values, out_len, &call->g); err.failure()) return err;
  if (lengths == nullptr) return ffi::Error::Success();
  if (auto err = check_lengths_count(op, *lengths, call->g.rows); err.failure()) return err;
  call->lengths = clamped_lengths(*lengths, call->g.rows, call->g.n);
  return ffi::Error::Success();
}

inline ffi::Error unsupported_dtype(const char* op, ffi::DataType t) {
  return ffi::Error::InvalidArgument(std::string(op) + ": no native kernel for element type " +
                                     std::to_string(int(t)) + " (the Python side should have used "
                                     "the pure-JAX fallback)");
}

// Runs kernel tasks on XLA's intra-op thread pool and the calling thread
// (cpu::HelpingTaskRunner: a handler running on a pool thread, or a pool of
// one, cannot deadlock).
struct XlaPoolSchedule {
  ffi::ThreadPool* pool;
  void operator()(std::function<void()> job) const { pool->Schedule(std::move(job)); }
};
class XlaThreadPoolRunner final : public cpu::HelpingTaskRunner<XlaPoolSchedule> {
 public:
  explicit XlaThreadPoolRunner(ffi::ThreadPool& pool)
      : HelpingTaskRunner(pool.num_threads(), XlaPoolSchedule{&pool}) {}
};

#if defined(JAX_TOPK_PLATFORM_GPU)
// GPU handlers take their temporaries as an extra result sized at lowering
// time (the module's workspace_bytes); one lowered for another GPU may be short.
inline ffi::Error check_workspace(const char* op, size_t given, size_t needed) {
  if (given >= needed) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                    std::string(op) + ": the workspace holds " + std::to_string(given) +
                        " bytes but this GPU's kernel needs " + std::to_string(needed) +
                        " (lowered for another device?)");
}

// Checks a GPU row op's operands and outputs ([..., out_len]), the count of
// the optional lengths (their values stay on the device: the kernels clamp
// them) and that a kernel takes x's dtype; fills the geometry and the dtype.
inline ffi::Error decode_gpu_rows(const char* op, const ffi::AnyBuffer& x, const ffi::AnyBuffer& values,
                                   int64_t out_len, const ffi::Buffer<ffi::S32>* lengths,
                                   bool (*has_kernel)(DType), RowGeometry* g, DType* dtype) {
  if (auto err = row_geometry(op, x, values, out_len, g); err.failure()) return err;
  if (lengths) {
    if (auto err = check_lengths_count(op, *lengths, g->rows); err.failure()) return err;
  }
  const auto d = to_dtype(x.element_type());
  if (!d || !has_kernel(*d)) return unsupported_dtype(op, x.element_type());
  *dtype = *d;
  return ffi::Error::Success();
}

inline ffi::Error gpu_status(const char* op, gpuError_t status) {
  if (status == gpuSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(op) + ": " JAX_TOPK_GPU_RUNTIME_NAME " error: " + gpuGetErrorString(status));
}

// The body of a GPU row op's handler: decodes x (out_len outputs a row,
// dtypes with has_kernel), checks the workspace against needed(dtype, g) and
// returns the status of launch(dtype, g, lengths or nullptr, workspace,
// workspace bytes).
template <typename Needed, typename Launch>
ffi::Error run_gpu_rows(const char* op, const ffi::AnyBuffer& x, const ffi::Buffer<ffi::S32>* lengths,
                        const ffi::AnyBuffer& values, int64_t out_len, bool (*has_kernel)(DType),
                        ffi::Buffer<ffi::U8>& workspace, Needed&& needed, Launch&& launch) {
  RowGeometry g;
  DType dtype;
  if (auto err = decode_gpu_rows(op, x, values, out_len, lengths, has_kernel, &g, &dtype); err.failure()) {
    return err;
  }
  const size_t given = workspace.element_count();
  if (auto err = check_workspace(op, given, needed(dtype, g)); err.failure()) return err;
  return gpu_status(op, launch(dtype, g, lengths ? lengths->typed_data() : nullptr, workspace.untyped_data(), given));
}
#endif

// Decodes x's dtype and calls kernel(dtype, runner) with XLA's thread pool.
template <typename Kernel>
ffi::Error run_cpu_kernel(const char* op, ffi::ThreadPool& pool, const ffi::AnyBuffer& x, Kernel&& kernel) {
  const auto dtype = to_dtype(x.element_type());
  if (!dtype) return unsupported_dtype(op, x.element_type());
  XlaThreadPoolRunner runner(pool);
  kernel(*dtype, runner);
  return ffi::Error::Success();
}

// The FFI signature every row op (top_k, sort) shares, before its attributes:
// x [, lengths int32] -> values, indices int32 [, workspace u8 on the GPU].
// (One expression per branch: Binding has no public move, so the chain is
// returned as a prvalue.)
template <typename Context, bool kLengths>
auto row_op_binding() {
  if constexpr (kLengths) {
    return ffi::Ffi::Bind().Ctx<Context>().template Arg<ffi::AnyBuffer>().template Arg<ffi::Buffer<ffi::S32>>()
        .template Ret<ffi::AnyBuffer>().template Ret<ffi::Buffer<ffi::S32>>();
  } else {
    return ffi::Ffi::Bind().Ctx<Context>().template Arg<ffi::AnyBuffer>()
        .template Ret<ffi::AnyBuffer>().template Ret<ffi::Buffer<ffi::S32>>();
  }
}

template <bool kLengths>
auto cpu_row_op_binding() {
  return row_op_binding<ffi::ThreadPool, kLengths>();
}

#if defined(JAX_TOPK_PLATFORM_GPU)
template <bool kLengths>
auto gpu_row_op_binding() {
  return row_op_binding<ffi::PlatformStream<gpuStream_t>, kLengths>().template Ret<ffi::Buffer<ffi::U8>>();
}
#endif

// A row op's two handlers on a platform, without and with per-row lengths,
// with the signatures of the bindings above plus the op's one attribute
// (Attr): both forward to the op's rows function (kRows), which takes the
// lengths or nullptr. Bound as, e.g., (cpu_row_op<int64_t, topk_cpu_rows>).
template <typename Attr>
using CpuRowsFn = ffi::Error (*)(ffi::ThreadPool&, const ffi::AnyBuffer&, const ffi::Buffer<ffi::S32>*,
                                 ffi::AnyBuffer&, ffi::Buffer<ffi::S32>&, Attr);

template <typename Attr, CpuRowsFn<Attr> kRows>
ffi::Error cpu_row_op(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> values,
                      ffi::Result<ffi::Buffer<ffi::S32>> indices, Attr attr) {
  return kRows(pool, x, nullptr, *values, *indices, attr);
}

template <typename Attr, CpuRowsFn<Attr> kRows>
ffi::Error cpu_row_op_lengths(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> lengths,
                              ffi::Result<ffi::AnyBuffer> values, ffi::Result<ffi::Buffer<ffi::S32>> indices,
                              Attr attr) {
  return kRows(pool, x, &lengths, *values, *indices, attr);
}

#if defined(JAX_TOPK_PLATFORM_GPU)
template <typename Attr>
using GpuRowsFn = ffi::Error (*)(gpuStream_t, const ffi::AnyBuffer&, const ffi::Buffer<ffi::S32>*, ffi::AnyBuffer&,
                                 ffi::Buffer<ffi::S32>&, ffi::Buffer<ffi::U8>&, Attr);

template <typename Attr, GpuRowsFn<Attr> kRows>
ffi::Error gpu_row_op(gpuStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> values,
                      ffi::Result<ffi::Buffer<ffi::S32>> indices, ffi::Result<ffi::Buffer<ffi::U8>> workspace,
                      Attr attr) {
  return kRows(stream, x, nullptr, *values, *indices, *workspace, attr);
}

template <typename Attr, GpuRowsFn<Attr> kRows>
ffi::Error gpu_row_op_lengths(gpuStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> lengths,
                              ffi::Result<ffi::AnyBuffer> values, ffi::Result<ffi::Buffer<ffi::S32>> indices,
                              ffi::Result<ffi::Buffer<ffi::U8>> workspace, Attr attr) {
  return kRows(stream, x, &lengths, *values, *indices, *workspace, attr);
}
#endif

}  // namespace jax_topk::ffi_util
