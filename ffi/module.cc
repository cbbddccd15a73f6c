// The nanobind module of one platform (`_jax_topk_cpu`, `_jax_topk_cuda` or `_jax_topk_rocm`):
// exports {op: (target name, handler capsule)} and what the kernels support,
// for jax_topk/_registry.py to register with jax.ffi.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "ffi/targets.h"
#include "ffi/handlers.h"
#include "jax_topk/dtypes.h"
#include "jax_topk/routing.h"
#include "xla/ffi/api/c_api.h"

#if defined(JAX_TOPK_PLATFORM_CPU)
#include "cpu/routing_cpu.h"
#endif

#if defined(JAX_TOPK_PLATFORM_GPU)
#include <stdexcept>

#include "cuda/indexer_cuda.h"
#include "cuda/sort_cuda.h"
#include "cuda/topk_cuda.h"
#include "ffi/common.h"
#include "jax_topk/nsa.h"
#include "jax_topk/sort_dispatch.h"
#include "jax_topk/topk_dispatch.h"
#endif

namespace nb = nanobind;

namespace {
// The numpy names of the table's dtypes that satisfy `supported`.
nb::list dtype_names(bool (*supported)(jax_topk::DType)) {
  nb::list l;
#define JAX_TOPK_APPEND_IF(name, ffi_name, bits, kind, lowest) \
  if (supported(jax_topk::DType::name)) l.append(std::string(#name));
  JAX_TOPK_FOR_EACH_DTYPE(JAX_TOPK_APPEND_IF)
#undef JAX_TOPK_APPEND_IF
  return l;
}
}  // namespace

#if defined(JAX_TOPK_PLATFORM_CPU)
#define JAX_TOPK_PLATFORM_NAME "cpu"
#elif defined(JAX_TOPK_PLATFORM_CUDA)
#define JAX_TOPK_PLATFORM_NAME "CUDA"
#elif defined(JAX_TOPK_PLATFORM_ROCM)
#define JAX_TOPK_PLATFORM_NAME "ROCM"
#endif

// Indirection so that JAX_TOPK_MODULE_NAME is expanded before NB_MODULE pastes it.
#define JAX_TOPK_NB_MODULE(name, m) NB_MODULE(name, m)

JAX_TOPK_NB_MODULE(JAX_TOPK_MODULE_NAME, m) {
  m.doc() = "jax_topk native kernels for one platform (FFI handler capsules).";

  m.def("platform", [] { return std::string(JAX_TOPK_PLATFORM_NAME); },
        "The XLA platform name the handlers are registered for.");

  m.def(
      "targets",
      [] {
        nb::dict d;
#define JAX_TOPK_EXPORT_TARGET(op, name, stem, cpu, gpu, dtypes)                         \
  JAX_TOPK_ON_THIS_PLATFORM(                                                       \
      cpu, gpu,                                                                    \
      d[#op] = nb::make_tuple(std::string(name),                                   \
                              nb::capsule(reinterpret_cast<void*>(JAX_TOPK_HANDLER(stem))));)
        JAX_TOPK_FOR_EACH_TARGET(JAX_TOPK_EXPORT_TARGET)
#undef JAX_TOPK_EXPORT_TARGET
        return d;
      },
      "{op family: (FFI target name, handler capsule)}.");

  m.def(
      "dtypes",
      [] {
        return dtype_names(jax_topk::any_dtype);
      },
      "Element types (numpy names) the native kernels handle.");

  m.def(
      "op_dtypes",
      [] {
        nb::dict d;
#define JAX_TOPK_EXPORT_OP_DTYPES(op, name, stem, cpu, gpu, dtypes) \
  JAX_TOPK_ON_THIS_PLATFORM(cpu, gpu, d[#op] = dtype_names(jax_topk::dtypes);)
        JAX_TOPK_FOR_EACH_TARGET(JAX_TOPK_EXPORT_OP_DTYPES)
#undef JAX_TOPK_EXPORT_OP_DTYPES
        return d;
      },
      "{op family: element types (numpy names) its kernels read}.");

#if defined(JAX_TOPK_PLATFORM_GPU)
  // GPU handlers take their temporaries as an extra result buffer sized at
  // lowering time (not from the FFI ScratchAllocator): a handler that
  // allocates at run time cannot be captured into XLA's command buffers.
  m.def(
      "workspace_bytes",
      [](const std::string& op, const std::string& dtype, int64_t rows, int64_t n, int64_t k) {
        const auto d = jax_topk::ffi_util::dtype_from_name(dtype);
        if (!d) throw std::invalid_argument("no native kernel for dtype " + dtype);
        if (op == "top_k" || op == "top_k_lengths") {
          return int64_t(jax_topk::cuda::topk_scratch_bytes(*d, rows, n, k));
        }
        if (op == "sort" || op == "sort_lengths") return int64_t(jax_topk::cuda::sort_scratch_bytes(*d, rows, n));
        throw std::invalid_argument("no workspace rule for op " + op + " (the indexer's: indexer_plan)");
      },
      "Bytes of device workspace the op's kernel needs on the current GPU.");

  // The indexer's attribute "fusion": {name: IndexerFusion value}.
  m.def("indexer_fusions", [] {
    nb::dict d;
    d["auto"] = int64_t(jax_topk::IndexerFusion::kAuto);
    d["unfused"] = int64_t(jax_topk::IndexerFusion::kUnfused);
    d["fused"] = int64_t(jax_topk::IndexerFusion::kFused);
    return d;
  });
  m.def(
      "indexer_plan",
      [](const std::string& dtype, int64_t batch, int64_t heads, int64_t n, int64_t dim, int64_t k, int64_t fusion) {
        const auto d = jax_topk::ffi_util::dtype_from_name(dtype);
        if (!d) throw std::invalid_argument("no native kernel for dtype " + dtype);
        const auto how = jax_topk::IndexerFusion(fusion);
        const auto path = jax_topk::cuda::indexer_path(*d, batch, heads, n, dim, k, how);
        nb::dict plan;
        plan["workspace_bytes"] = int64_t(jax_topk::cuda::indexer_scratch_bytes(*d, batch, heads, n, dim, k, how));
        plan["tensor_cores"] = path.tensor_cores;
        plan["fused"] = path.fused;
        plan["chunk_keys"] = path.chunk_keys;
        plan["capacity"] = path.capacity;
        plan["fused_max_k"] = path.fused_max_k;
        return plan;
      },
      "How the indexer runs q [batch, heads, dim] against keys [batch, n, dim] on the current GPU: its workspace, "
      "tensor cores or not, fused or not (the keys per fused block, its buffer's capacity), the fused kernel's largest k.");

  m.def(
      "nsa_block_scores_unsupported",
      [](int64_t groups, int64_t dim, int64_t block_size, int64_t stride, int64_t select_size) {
        const char* why = jax_topk::nsa_block_scores_unsupported(groups, dim, block_size, stride, select_size);
        return std::string(why ? why : "");
      },
      "Why NSA's block-score kernel cannot take (G, D, l, d, l') (jax_topk/nsa.h), or '' when it can.");
#endif

  m.def(
      "build_info",
      [] {
        nb::dict d;
        d["ffi_api_version"] = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
        d["ffi_headers_jaxlib"] = std::string(JAX_TOPK_FFI_JAXLIB_VERSION);
        d["compiler"] = std::string(JAX_TOPK_COMPILER);
        d["gpu_architectures"] = std::string(JAX_TOPK_GPU_ARCHITECTURES);
        // Routes past these lower to the pure-JAX composition.
        nb::dict route;
        route["max_experts"] = jax_topk::kRouteMaxExperts;
        route["max_k"] = jax_topk::kRouteMaxK;
        route["exact_sum_words"] = jax_topk::kExactSumWords;  // a partial softmax normaliser
        d["route_limits"] = route;
#if defined(JAX_TOPK_PLATFORM_CPU)
        // The vector ISA of the CPU route's scoring loops on this machine
        // (JAX_TOPK_ROUTE_ISA caps it); every choice computes the same bits.
        d["route_isa"] = std::string(jax_topk::cpu::route_isa());
#endif
#if defined(JAX_TOPK_PLATFORM_GPU)
        // The dispatch thresholds (n or k, by suffix), so tests probe each boundary.
        nb::dict t;
        t["warp_sort_max_k"] = jax_topk::kWarpSortMaxK;
        t["tiny_rows_max_n"] = jax_topk::kTinyRowsMaxN;
        t["warp_sort_max_n"] = jax_topk::kWarpSortMaxN;
        t["warp_sort_always_n"] = jax_topk::kWarpSortAlwaysN;
        t["radix_split_min_n"] = jax_topk::kRadixSplitMinN;
        t["warp_select_max_n"] = jax_topk::kWarpSelectMaxN;
        // Where the warp-select kernel's lanes per row change (4, 8, 16, 32),
        // and its largest k thresholded by rounds of a warp maximum.
        for (int lanes = 4; lanes <= 16; lanes *= 2) {
          t[("warp_select_" + std::to_string(lanes) + "_lanes_max_n").c_str()] =
              lanes * jax_topk::kWarpSelectElemsPerLane;
        }
        t["warp_select_redux_max_k"] = jax_topk::kWarpSelectReduxMaxK;
        t["threshold_max_k"] = jax_topk::kThresholdMaxK;
        t["threshold_few_rows_max_n_f32"] = jax_topk::kThresholdFewRowsMaxRowBytes / 4;
        t["threshold_narrow_max_k"] = jax_topk::kThresholdNarrowMaxK;
        t["threshold_stream_max_k"] = jax_topk::kThresholdStreamMaxK;
        t["cluster_min_n"] = jax_topk::kClusterMinN;
        t["cluster_max_n"] = jax_topk::kClusterMaxN;
        t["cluster_max_k"] = jax_topk::kClusterMaxK;
        t["register_rows_max_n"] = jax_topk::kRegisterRowsMaxN;
        t["register_rows_max_k"] = jax_topk::kRegisterRowsMaxK;
        t["threshold_sample_min_n"] = jax_topk::kThresholdSampleMinN;  // whole rows from here may take a sampled T
        t["cluster_bins_min_n"] = jax_topk::kClusterBinsMinLen;
        t["cluster_bins_max_n"] = jax_topk::kClusterBinsMaxLen;
        d["topk_thresholds"] = t;
        // The cluster kernel's sampled threshold: whole rows whose sample has
        // a window, a cluster of at least ceil(row bytes / chunk_bytes) and
        // two blocks each (more while they fit), while the clusters' blocks
        // fit the SMs once (clusters of more than two: wide_sm_share of them).
        nb::dict sampled;
        sampled["chunk_bytes"] = jax_topk::kClusterSampledChunkBytes;
        sampled["sample_slots"] = jax_topk::kClusterSampleSlots;
        sampled["wide_sm_share"] = jax_topk::kClusterSampledWideSmShare;
        d["topk_cluster_sampled"] = sampled;
        // Thresholds on rows per SM (the tests multiply by the device's SMs).
        nb::dict per_sm;
        per_sm["threshold_narrow_min"] = jax_topk::kThresholdNarrowMinRowsPerSm;
        per_sm["threshold_sampled_narrow_min"] = jax_topk::kThresholdSampledNarrowMinRowsPerSm;
        per_sm["register_rows_max"] = jax_topk::kRegisterRowsMaxRowsPerSm;
        d["topk_rows_per_sm_thresholds"] = per_sm;
        // Thresholds on the input's bytes.
        nb::dict bytes;
        bytes["threshold_stream_min"] = jax_topk::kThresholdStreamMinBytes;
        d["topk_bytes_thresholds"] = bytes;
        // Row lengths at which the sort changes its warp slots, block shape or regime.
        nb::list sort_n;
        for (int64_t c = jax_topk::kWarpSizeForSort; c <= jax_topk::kSortWarpMaxN; c *= 2) sort_n.append(c);
        for (const auto& shape : jax_topk::kSortBlockShapes) sort_n.append(shape.capacity());
        sort_n.append(2 * jax_topk::kSortTileElements);  // whole and partial tiles of the tile regime
        d["sort_thresholds_n"] = sort_n;
        // Where the indexer's fusion="auto" fuses (jax_topk/indexer.h).
        nb::dict fuse;
        fuse["min_n_over_k"] = jax_topk::kIndexerFuseMinNOverK;
        fuse["min_scores_bytes"] = jax_topk::kIndexerFuseMinScoresBytes;
        d["indexer_auto_fusion"] = fuse;
#endif
        return d;
      },
      "How this module was built: FFI API version, the jaxlib whose headers were used, compiler.");
}
