// XLA FFI handlers of fused MoE routing: decode the logits ([..., experts]),
// the optional bias (none, [experts], or one row per token), the optional
// normaliser (none, or per token the softmax shift and partial sums of a row
// split over devices) and the attributes, check them, and call the platform's
// kernel. Also the partial sums themselves (route_softmax_partial). Compiled once per
// platform module (JAX_TOPK_PLATFORM_CPU or JAX_TOPK_PLATFORM_GPU).

#include <string>

#include "ffi/common.h"
#include "ffi/handlers.h"
#include "jax_topk/routing.h"

#if defined(JAX_TOPK_PLATFORM_CPU)
#include "cpu/routing_cpu.h"
#endif
#if defined(JAX_TOPK_PLATFORM_GPU)
#include "cuda/routing_cuda.h"
#endif

namespace ffi = ::xla::ffi;

namespace jax_topk {
namespace {

constexpr const char* kOp = "jax_topk.routing.route";

ffi::Error invalid(const std::string& what) { return ffi::Error::InvalidArgument(std::string(kOp) + ": " + what); }

// Checks the buffers and attributes against each other and fills `cfg`.
ffi::Error decode_route(const ffi::AnyBuffer& logits, const ffi::Buffer<ffi::F32>& bias,
                        const ffi::Buffer<ffi::U32>& normaliser, const ffi::Buffer<ffi::F32>& weights,
                        const ffi::Buffer<ffi::S32>& ids,
                        int64_t k, int64_t score, int64_t n_groups, int64_t top_groups,
                        bool renormalize, float scale, RouteConfig* cfg) {
  const auto dims = logits.dimensions();
  if (dims.size() == 0) return invalid("logits must have shape [..., experts], got a scalar");
  const int64_t experts = dims.back();
  if (experts < 1 || experts > kRouteMaxExperts) {
    return invalid("the fused kernel takes 1 to " + std::to_string(kRouteMaxExperts) + " experts, logits are " +
                   ffi_util::shape_string(dims));
  }
  if (k < 1 || k > experts || k > kRouteMaxK) {
    return invalid("k=" + std::to_string(k) + " must be in [1, min(experts, " + std::to_string(kRouteMaxK) +
                   ")] for logits " + ffi_util::shape_string(dims));
  }
  const int64_t tokens = logits.element_count() / experts;
  if (weights.element_count() != size_t(tokens * k) || ids.element_count() != size_t(tokens * k)) {
    return invalid("weights " + ffi_util::shape_string(weights.dimensions()) + " and ids " +
                   ffi_util::shape_string(ids.dimensions()) + " must be logits " + ffi_util::shape_string(dims) +
                   " with the last axis k=" + std::to_string(k));
  }
  if (score < 0 || score > int64_t(RouteScore::kSqrtSoftplus)) return invalid("unknown score " + std::to_string(score));
  if (n_groups < 0 || (n_groups > 0 && (experts % n_groups != 0 || top_groups < 1 || top_groups > n_groups ||
                                        top_groups * (experts / n_groups) < k))) {
    return invalid("n_groups=" + std::to_string(n_groups) + ", top_groups=" + std::to_string(top_groups) +
                   " do not fit " + std::to_string(experts) + " experts and k=" + std::to_string(k));
  }
  const int64_t bias_count = bias.element_count();
  if (bias_count != 0 && bias_count != experts && bias_count != tokens * experts) {
    return invalid("bias " + ffi_util::shape_string(bias.dimensions()) + " must be empty, [experts] or one row per token of logits " +
                   ffi_util::shape_string(dims));
  }
  cfg->tokens = tokens;
  cfg->experts = int32_t(experts);
  cfg->k = int32_t(k);
  cfg->score = RouteScore(score);
  cfg->has_bias = bias_count != 0;
  cfg->bias_token_stride = bias_count == tokens * experts && bias_count != experts ? experts : 0;
  cfg->n_groups = int32_t(n_groups);
  cfg->top_groups = int32_t(n_groups > 0 ? top_groups : 0);
  cfg->renormalize = renormalize;
  cfg->scale = scale;
  if (normaliser.element_count() != 0) {
    const auto words = normaliser.dimensions();
    const int64_t width = words.size() ? words.back() : 0;
    if (width < normaliser_words(1) || (width - 1) % kExactSumWords != 0 ||
        normaliser.element_count() != size_t(tokens * width)) {
      return invalid("normaliser " + ffi_util::shape_string(words) + " must be one row of 1 + " +
                     std::to_string(kExactSumWords) + " * parts words per token of logits " +
                     ffi_util::shape_string(dims));
    }
    cfg->normaliser_parts = int32_t((width - 1) / kExactSumWords);
    if (!cfg->needs_softmax_sum()) {
      return invalid("a normaliser is only taken by a softmax route that needs its normaliser (a bias, groups, "
                     "or no renormalisation)");
    }
  }
  return ffi::Error::Success();
}

// Checks the partial sums' buffers: shift one float per row of logits, sums
// kExactSumWords words per row.
ffi::Error decode_partial(const ffi::AnyBuffer& logits, const ffi::Buffer<ffi::F32>& shift,
                          const ffi::Buffer<ffi::U32>& sums, int64_t* tokens, int32_t* experts) {
  const auto dims = logits.dimensions();
  if (dims.size() == 0 || dims.back() < 1 || dims.back() > kRouteMaxExperts) {
    return invalid("softmax partial sums take logits [..., 1 to " + std::to_string(kRouteMaxExperts) +
                   " experts], got " + ffi_util::shape_string(dims));
  }
  *experts = int32_t(dims.back());
  *tokens = int64_t(logits.element_count()) / *experts;
  if (shift.element_count() != size_t(*tokens) || sums.element_count() != size_t(*tokens * kExactSumWords)) {
    return invalid("shift " + ffi_util::shape_string(shift.dimensions()) + " and sums " +
                   ffi_util::shape_string(sums.dimensions()) + " must be one float and " +
                   std::to_string(kExactSumWords) + " words per row of logits " + ffi_util::shape_string(dims));
  }
  return ffi::Error::Success();
}

RouteInputs inputs(const ffi::AnyBuffer& logits, const ffi::Buffer<ffi::F32>& bias,
                   const ffi::Buffer<ffi::U32>& normaliser, const RouteConfig& cfg) {
  RouteInputs in;
  in.logits = logits.untyped_data();
  in.bias = cfg.has_bias ? bias.typed_data() : nullptr;
  in.normaliser = cfg.normaliser_parts ? normaliser.typed_data() : nullptr;
  return in;
}

#if defined(JAX_TOPK_PLATFORM_CPU)
ffi::Error route_cpu(ffi::ThreadPool pool, ffi::AnyBuffer logits, ffi::Buffer<ffi::F32> bias,
                     ffi::Buffer<ffi::U32> normaliser, ffi::Result<ffi::Buffer<ffi::F32>> weights,
                     ffi::Result<ffi::Buffer<ffi::S32>> ids,
                     int64_t k, int64_t score, int64_t n_groups, int64_t top_groups, bool renormalize,
                     float scale) {
  RouteConfig cfg;
  if (auto err = decode_route(logits, bias, normaliser, *weights, *ids, k, score, n_groups, top_groups, renormalize,
                              scale, &cfg);
      err.failure()) {
    return err;
  }
  const RouteInputs in = inputs(logits, bias, normaliser, cfg);
  return ffi_util::run_cpu_kernel(kOp, pool, logits, [&](DType dtype, cpu::TaskRunner& runner) {
    cpu::route_tokens(dtype, in, weights->typed_data(), ids->typed_data(), cfg, runner);
  });
}

ffi::Error route_softmax_partial_cpu(ffi::ThreadPool pool, ffi::AnyBuffer logits, ffi::Buffer<ffi::F32> shift,
                                     ffi::Result<ffi::Buffer<ffi::U32>> sums) {
  int64_t tokens = 0;
  int32_t experts = 0;
  if (auto err = decode_partial(logits, shift, *sums, &tokens, &experts); err.failure()) return err;
  return ffi_util::run_cpu_kernel(kOp, pool, logits, [&](DType dtype, cpu::TaskRunner& runner) {
    cpu::softmax_partial_sums(dtype, logits.untyped_data(), shift.typed_data(), sums->typed_data(), tokens, experts,
                              runner);
  });
}
#endif

#if defined(JAX_TOPK_PLATFORM_GPU)
ffi::Error route_gpu(gpuStream_t stream, ffi::AnyBuffer logits, ffi::Buffer<ffi::F32> bias,
                      ffi::Buffer<ffi::U32> normaliser, ffi::Result<ffi::Buffer<ffi::F32>> weights,
                      ffi::Result<ffi::Buffer<ffi::S32>> ids,
                      int64_t k, int64_t score, int64_t n_groups, int64_t top_groups, bool renormalize,
                      float scale) {
  RouteConfig cfg;
  if (auto err = decode_route(logits, bias, normaliser, *weights, *ids, k, score, n_groups, top_groups, renormalize,
                              scale, &cfg);
      err.failure()) {
    return err;
  }
  const auto dtype = ffi_util::to_dtype(logits.element_type());
  if (!dtype) return ffi_util::unsupported_dtype(kOp, logits.element_type());
  return ffi_util::gpu_status(kOp, cuda::route_tokens(*dtype, inputs(logits, bias, normaliser, cfg),
                                                       weights->typed_data(), ids->typed_data(), cfg, stream));
}

ffi::Error route_softmax_partial_gpu(gpuStream_t stream, ffi::AnyBuffer logits, ffi::Buffer<ffi::F32> shift,
                                     ffi::Result<ffi::Buffer<ffi::U32>> sums) {
  int64_t tokens = 0;
  int32_t experts = 0;
  if (auto err = decode_partial(logits, shift, *sums, &tokens, &experts); err.failure()) return err;
  const auto dtype = ffi_util::to_dtype(logits.element_type());
  if (!dtype) return ffi_util::unsupported_dtype(kOp, logits.element_type());
  return ffi_util::gpu_status(kOp, cuda::softmax_partial_sums(*dtype, logits.untyped_data(), shift.typed_data(),
                                                                sums->typed_data(), tokens, experts, stream));
}
#endif

}  // namespace
}  // namespace jax_topk

#define JAX_TOPK_ROUTE_BINDING(context)                  \
  ffi::Ffi::Bind()                                       \
      .Ctx<context>()                                    \
      .Arg<ffi::AnyBuffer>()                             \
      .Arg<ffi::Buffer<ffi::F32>>()                      \
      .Arg<ffi::Buffer<ffi::U32>>()                      \
      .Ret<ffi::Buffer<ffi::F32>>()                      \
      .Ret<ffi::Buffer<ffi::S32>>()                      \
      .Attr<int64_t>("k")                                \
      .Attr<int64_t>("score")                            \
      .Attr<int64_t>("n_groups")                         \
      .Attr<int64_t>("top_groups")                       \
      .Attr<bool>("renormalize")                         \
      .Attr<float>("scale")

#define JAX_TOPK_PARTIAL_BINDING(context) \
  ffi::Ffi::Bind()                        \
      .Ctx<context>()                     \
      .Arg<ffi::AnyBuffer>()              \
      .Arg<ffi::Buffer<ffi::F32>>()       \
      .Ret<ffi::Buffer<ffi::U32>>()

#if defined(JAX_TOPK_PLATFORM_CPU)
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkRouteCpu, jax_topk::route_cpu, JAX_TOPK_ROUTE_BINDING(ffi::ThreadPool));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkRouteSoftmaxPartialCpu, jax_topk::route_softmax_partial_cpu,
                              JAX_TOPK_PARTIAL_BINDING(ffi::ThreadPool));
#endif
#if defined(JAX_TOPK_PLATFORM_GPU)
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkRouteGpu, jax_topk::route_gpu,
                              JAX_TOPK_ROUTE_BINDING(ffi::PlatformStream<gpuStream_t>),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTopkRouteSoftmaxPartialGpu, jax_topk::route_softmax_partial_gpu,
                              JAX_TOPK_PARTIAL_BINDING(ffi::PlatformStream<gpuStream_t>),
                              {ffi::Traits::kCmdBufferCompatible});
#endif
