// XLA FFI handlers of the sparse-attention indexer (jax_topk/indexer.h):
// q [B, H, D], keys [G, N, D] (float32 or bfloat16; G divides B, and item b
// reads key set b / (B / G): G = B for keys per item, 1 for keys they all
// share), weights [B, H] float32, lengths [B] int32 -> scores [B, k] float32,
// ids [B, k] int32. Scores the first lengths[b] keys of each item (the
// sequence-mask rule), then takes the top k of each row of scores.

#include <string>
#include <vector>

#include "ffi/common.h"
#include "ffi/handlers.h"
#include "jax_topk/indexer.h"

#if defined(JAX_TOPK_PLATFORM_CPU)
#include "cpu/indexer_cpu.h"
#include "cpu/topk_cpu.h"
#endif
#if defined(JAX_TOPK_PLATFORM_GPU)
#include "cuda/indexer_cuda.h"
#endif

namespace ffi = ::xla::ffi;

namespace jax_topk {
namespace {

constexpr const char* kOp = "jax_topk.indexer_top_k";

struct IndexerGeometry {
  int64_t batch = 0, heads = 0, n = 0, dim = 0;
  int64_t items_per_keys = 1;
  DType dtype = DType::float32;
};

ffi::Error indexer_error(const std::string& what) { return ffi::Error::InvalidArgument(std::string(kOp) + ": " + what); }

// Checks every operand's and result's shape against q [B, H, D].
ffi::Error decode_indexer(const ffi::AnyBuffer& q, const ffi::AnyBuffer& keys, const ffi::Buffer<ffi::F32>& weights,
                          const ffi::Buffer<ffi::S32>& lengths, const ffi::Buffer<ffi::F32>& scores,
                          const ffi::Buffer<ffi::S32>& ids, int64_t k, IndexerGeometry* g) {
  using ffi_util::shape_string;
  const auto qd = q.dimensions(), kd = keys.dimensions();
  const bool groups_fit = qd.size() == 3 && kd.size() == 3 &&
                          (kd[0] == qd[0] || (kd[0] >= 1 && qd[0] % kd[0] == 0));
  if (!groups_fit || kd[2] != qd[2]) {
    return indexer_error("q " + shape_string(qd) + " and keys " + shape_string(kd) +
                         " must be [B, H, D] and [G, N, D], G dividing B");
  }
  g->batch = qd[0];
  g->items_per_keys = kd[0] >= 1 && qd[0] > 0 ? qd[0] / kd[0] : 1;
  g->heads = qd[1];
  g->dim = qd[2];
  g->n = kd[1];
  const auto wd = weights.dimensions();
  if (wd.size() != 2 || wd[0] != g->batch || wd[1] != g->heads) {
    return indexer_error("weights " + shape_string(wd) + " must be [B, H] for q " + shape_string(qd));
  }
  if (int64_t(lengths.element_count()) != g->batch) {
    return indexer_error("lengths has " + std::to_string(lengths.element_count()) + " elements, expected B = " +
                         std::to_string(g->batch));
  }
  if (k < 0 || k > g->n || g->n >= (int64_t(1) << 31)) {
    return indexer_error("k=" + std::to_string(k) + " must be in [0, N] for keys " + shape_string(kd));
  }
  for (const auto& out : {scores.dimensions(), ids.dimensions()}) {
    if (out.size() != 2 || out[0] != g->batch || out[1] != k) {
      return indexer_error("result " + shape_string(out) + " must be [B, k] = (" + std::to_string(g->batch) +
                           ", " + std::to_string(k) + ")");
    }
  }
  const auto dtype = ffi_util::to_dtype(q.element_type());
  if (!dtype || !is_indexer_dtype(*dtype) || keys.element_type() != q.element_type()) {
    return ffi_util::unsupported_dtype(kOp, q.element_type());
  }
  g->dtype = *dtype;
  return ffi::Error::Success();
}

#if defined(JAX_TOPK_PLATFORM_CPU)
ffi::Error indexer_cpu(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer keys, ffi::Buffer<ffi::F32> weights,
                       ffi::Buffer<ffi::S32> lengths, ffi::Result<ffi::Buffer<ffi::F32>> scores,
                       ffi::Result<ffi::Buffer<ffi::S32>> ids, int64_t k) {
  IndexerGeometry g;
  if (auto err = decode_indexer(q, keys, weights, lengths, *scores, *ids, k, &g); err.failure()) return err;
  const std::vector<int32_t> clamped = ffi_util::clamped_lengths(lengths, g.batch, g.n);
  std::vector<float> all_scores(size_t(g.batch * g.n), 0.0f);
  ffi_util::XlaThreadPoolRunner runner(pool);
  cpu::indexer_scores(g.dtype, q.untyped_data(), keys.untyped_data(), weights.typed_data(), g.batch, g.heads, g.n,
                      g.dim, g.items_per_keys, clamped.data(), all_scores.data(), runner);
  cpu::topk_rows(DType::float32, all_scores.data(), scores->typed_data(), ids->typed_data(), g.batch, g.n, k,
                 clamped.data(), runner);
  return ffi::Error::Success();
}
#endif

#if defined(JAX_TOPK_PLATFORM_GPU)
// Temporaries (the [B, N] scores, or fused the rows' candidates, and the
// top-k's scratch) come in `workspace`, an extra result sized at lowering
// time (indexer_plan).
// `fusion`: an IndexerFusion (indexer.h), where the scores go.
ffi::Error indexer_gpu(gpuStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer keys, ffi::Buffer<ffi::F32> weights,
                        ffi::Buffer<ffi::S32> lengths, ffi::Result<ffi::Buffer<ffi::F32>> scores,
                        ffi::Result<ffi::Buffer<ffi::S32>> ids, ffi::Result<ffi::Buffer<ffi::U8>> workspace,
                        int64_t k, int64_t fusion) {
  IndexerGeometry g;
  if (auto err = decode_indexer(q, keys, weights, lengths, *scores, *ids, k, &g); err.failure()) return err;
  if (fusion < int64_t(IndexerFusion::kAuto) || fusion > int64_t(IndexerFusion::kFused)) {
    return indexer_error("fusion=" + std::to_string(fusion) + " is not an IndexerFusion (0, 1 or 2)");
  }
  const auto how = IndexerFusion(fusion);
  const size_t given = workspace->element_count();
  const size_t needed = cuda::indexer_scratch_bytes(g.dtype, g.batch, g.heads, g.n, g.dim, k, how);
  if (auto err = ffi_util::check_workspace(kOp, given, needed); err.failure()) return err;
  return ffi_util::gpu_status(
      kOp, cuda::indexer_top_k(g.dtype, q.untyped_data(), keys.untyped_data(), weights.typed_data(),
                               lengths.typed_data(), g.batch, g.heads, g.n, g.dim, k, g.items_per_keys, how,
                               scores->typed_data(), ids->typed_data(), workspace->untyped_data(), given, stream));
}
#endif

// The signature both platforms share, before the GPU workspace and the
// attribute: q, keys, weights f32, lengths s32 -> scores f32, ids s32. (One
// expression: Binding has no public move, so the chain is returned as a
// prvalue.)
template <typename Context>
auto indexer_binding() {
  return ffi::Ffi::Bind().Ctx<Context>().template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::F32>>().template Arg<ffi::Buffer<ffi::S32>>()
      .template Ret<ffi::Buffer<ffi::F32>>().template Ret<ffi::Buffer<ffi::S32>>();
}

}  // namespace
}  // namespace jax_topk

#if defined(JAX_TOPK_PLATFORM_CPU)
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkIndexerCpu, jax_topk::indexer_cpu,
                              jax_topk::indexer_binding<ffi::ThreadPool>().Attr<int64_t>("k"));
#endif

#if defined(JAX_TOPK_PLATFORM_GPU)
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkIndexerGpu, jax_topk::indexer_gpu,
                              jax_topk::indexer_binding<ffi::PlatformStream<gpuStream_t>>()
                                  .Ret<ffi::Buffer<ffi::U8>>()
                                  .Attr<int64_t>("k")
                                  .Attr<int64_t>("fusion"),
                              {ffi::Traits::kCmdBufferCompatible});
#endif
