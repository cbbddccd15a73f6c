// Programmatic dependent launch (PDL, sm_90 and newer, CUDA only): every
// top_k kernel, and each later link of the chains of kernels that one op
// enqueues on one stream (the split-row radix passes, the row-tile sort
// passes, the two routing kernels).
//
// Between two ordinary launches the GPU drains the first grid, then sets up
// the second, once per link of the chain (benchmarks/results/NOTES.md v26:
// three launches chained this way took 23.5 us in a CUDA graph on an H100
// against 24.7 without). A kernel started by
// launch_dependent may be scheduled while the kernel before it still runs:
//   - it calls wait_for_previous_grid() before its first access to global
//     memory that the previous kernel writes or reads (in practice first
//     thing): that returns once the previous grid has completed and its
//     writes are visible;
//   - the previous kernel may call let_next_grid_start() at its entry: the
//     next grid is then set up once every block of this one has started, and
//     its blocks wait without taking any slot this grid still needs. Without
//     it the next grid starts as this one ends, its launch still overlapped.
//     Measured on an H100 (benchmarks/results/NOTES.md v27): the split-row
//     radix passes gain from it (1x1048576 k16 36.0 -> 31.3 us); the row-tile
//     sort passes do not (1x1048576: 95 -> 101 us with it, 90 without: the
//     waiting blocks slow the pass they wait on), so they leave it out.
// The first kernel of a top_k op is a dependent launch too: in a CUDA graph
// of back-to-back calls it saves 0.2-0.65 us a call (H100); between two
// custom calls of a JAX executable it measured nothing (v27).
// Elsewhere (HIP, chips before sm_90, ordinary launches) both calls do
// nothing and launch_dependent is an ordinary launch, so kernels that use
// them stay correct however they are launched. JAX_TOPK_NO_DEPENDENT_LAUNCH
// (device_info.h) turns the attribute off, for A/B measurements.
#pragma once

#include "cuda/device_info.h"

namespace jax_topk::cuda {

__device__ JAX_TOPK_FORCE_INLINE void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ JAX_TOPK_FORCE_INLINE void let_next_grid_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

#if defined(JAX_TOPK_GPU_COMPILER)
#if !defined(JAX_TOPK_HIP)
// Makes the launch of `config` dependent where the device allows it: appends
// the attribute to config->attrs, which must point into `attributes` with
// room for one more.
inline void allow_dependent_launch(const DeviceInfo& dev, cudaLaunchConfig_t* config,
                                   cudaLaunchAttribute* attributes) {
  if (!dev.dependent_launches) return;
  cudaLaunchAttribute& a = attributes[config->numAttrs];
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  config->attrs = attributes;
  ++config->numAttrs;
}
#endif

// kernel<<<grid, block, smem, stream>>>(args...), which may overlap the
// kernel before it on the stream where the device allows it. Returns the
// launch error.
template <typename... Params, typename... Args>
gpuError_t launch_dependent(const DeviceInfo& dev, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            gpuStream_t stream, Args... args) {
#if !defined(JAX_TOPK_HIP)
  if (dev.dependent_launches) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute;
    allow_dependent_launch(dev, &config, &attribute);
    return cudaLaunchKernelEx(&config, kernel, Params(args)...);
  }
#endif
  kernel<<<grid, block, smem, stream>>>(Params(args)...);
  return gpuGetLastError();
}
#endif

}  // namespace jax_topk::cuda
