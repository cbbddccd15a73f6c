// XLA FFI handler of NSA's selection scores (jax_topk/nsa.h), GPU only:
// start int32 (its first element: the first query), q [..., T, Hkv, G, D],
// k_cmp [..., Nk, Hkv, D] (bfloat16 or float16, the same), lse [..., T, Hkv,
// G] float32 -> scores [..., Hkv, chunk, W] float32 (or, `ranked`, the ranks
// _nsa_tiled.select gives them: nsa_selection_rank); the leading dims (the
// batch, and any vmapped axes before it) are items.

#include <string>

#include "ffi/common.h"
#include "ffi/handlers.h"
#include "jax_topk/nsa.h"

#if defined(JAX_TOPK_PLATFORM_GPU)
#include "cuda/nsa_cuda.h"

namespace ffi = ::xla::ffi;

namespace jax_topk {
namespace {

constexpr const char* kOp = "jax_topk.nsa_block_scores";

ffi::Error nsa_error(const std::string& what) { return ffi::Error::InvalidArgument(std::string(kOp) + ": " + what); }

// The product of dims[0 .. dims.size() - trailing), or -1 when the rank is below `trailing`.
int64_t leading_items(ffi::AnyBuffer::Dimensions dims, size_t trailing) {
  if (dims.size() < trailing) return -1;
  int64_t items = 1;
  for (size_t i = 0; i + trailing < dims.size(); ++i) items *= dims[i];
  return items;
}

ffi::Error nsa_block_scores_gpu(gpuStream_t stream, ffi::Buffer<ffi::S32> start, ffi::AnyBuffer q,
                                ffi::AnyBuffer k_cmp, ffi::Buffer<ffi::F32> lse,
                                ffi::Result<ffi::Buffer<ffi::F32>> scores, int64_t num_blocks, int64_t block_size,
                                int64_t stride, int64_t select_size, float scale, bool ranked,
                                int64_t initial_blocks, int64_t local_blocks) {
  const auto qd = q.dimensions(), kd = k_cmp.dimensions(), ld = lse.dimensions(), sd = scores->dimensions();
  const int64_t batch = leading_items(qd, 4);
  if (batch < 0) return nsa_error("q " + ffi_util::shape_string(qd) + " must be [..., T, Hkv, G, D]");
  NsaScoreShape s;
  s.batch = batch;
  s.q_rows = qd[qd.size() - 4];
  s.kv_heads = qd[qd.size() - 3];
  s.groups = qd[qd.size() - 2];
  s.dim = qd[qd.size() - 1];
  if (leading_items(kd, 3) != batch || kd[kd.size() - 2] != s.kv_heads || kd[kd.size() - 1] != s.dim) {
    return nsa_error("k_cmp " + ffi_util::shape_string(kd) + " must be [..., Nk, Hkv, D] for q " +
                     ffi_util::shape_string(qd));
  }
  s.key_rows = kd[kd.size() - 3];
  if (leading_items(ld, 3) != batch || ld[ld.size() - 3] != s.q_rows || ld[ld.size() - 2] != s.kv_heads ||
      ld[ld.size() - 1] != s.groups) {
    return nsa_error("lse " + ffi_util::shape_string(ld) + " must be [..., T, Hkv, G] for q " +
                     ffi_util::shape_string(qd));
  }
  if (leading_items(sd, 3) != batch || sd[sd.size() - 3] != s.kv_heads) {
    return nsa_error("scores " + ffi_util::shape_string(sd) + " must be [..., Hkv, chunk, W] for q " +
                     ffi_util::shape_string(qd));
  }
  s.chunk = sd[sd.size() - 2];
  s.width = sd[sd.size() - 1];
  if (s.chunk % 16 != 0 || s.chunk > s.q_rows) {
    return nsa_error("chunk=" + std::to_string(s.chunk) + " must be a multiple of 16 of at most T=" +
                     std::to_string(s.q_rows));
  }
  if (start.element_count() < 1) return nsa_error("start must hold the chunk's first query");
  if (batch > 65535 || s.kv_heads > 65535) {
    return nsa_error("q " + ffi_util::shape_string(qd) + ": at most 65535 items and KV heads (the launch grid)");
  }
  if (num_blocks < 0 || num_blocks > s.key_rows) {
    return nsa_error("num_blocks=" + std::to_string(num_blocks) + " must be in [0, " + std::to_string(s.key_rows) +
                     "] for k_cmp " + ffi_util::shape_string(kd));
  }
  if (const char* why = nsa_block_scores_unsupported(s.groups, s.dim, block_size, stride, select_size)) {
    return nsa_error(why);
  }
  const auto dtype = ffi_util::to_dtype(q.element_type());
  if (!dtype || !nsa_score_dtype(*dtype) || k_cmp.element_type() != q.element_type()) {
    return nsa_error("q and k_cmp must both be bfloat16 or float16");
  }
  s.num_blocks = num_blocks;
  s.block_size = block_size;
  s.stride = stride;
  s.select_size = select_size;
  s.scale = scale;
  if (ranked && (initial_blocks < 0 || local_blocks < 0)) {
    return nsa_error("initial_blocks=" + std::to_string(initial_blocks) + " and local_blocks=" +
                     std::to_string(local_blocks) + " must be >= 0");
  }
  s.ranked = ranked;
  s.initial_blocks = initial_blocks;
  s.local_blocks = local_blocks;
  return ffi_util::gpu_status(kOp, cuda::nsa_block_scores(*dtype, q.untyped_data(), k_cmp.untyped_data(),
                                                          lse.typed_data(), start.typed_data(), s,
                                                          scores->typed_data(), stream));
}

}  // namespace
}  // namespace jax_topk

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkNsaBlockScoresGpu, jax_topk::nsa_block_scores_gpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<gpuStream_t>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("num_blocks")
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("stride")
                                  .Attr<int64_t>("select_size")
                                  .Attr<float>("scale")
                                  .Attr<bool>("ranked")
                                  .Attr<int64_t>("initial_blocks")
                                  .Attr<int64_t>("local_blocks"),
                              {ffi::Traits::kCmdBufferCompatible});
#endif  // JAX_TOPK_PLATFORM_GPU
