// What one kernel launch costs in a CUDA graph, by the kernel's shape and by
// how the graph holds it: the floor under every one-kernel top_k call inside
// a jitted JAX executable (XLA's command buffers).
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90 -Icsrc/include -Icsrc \
//        benchmarks/launch_probe.cu csrc/cuda/topk.cu csrc/cuda/sort.cu -o launch_probe
//   ./launch_probe            (JAX_TOPK_NO_DEPENDENT_LAUNCH=1: the top_k calls without PDL)
//
// Each line is us per launch of 32 launches replayed in one graph (median of
// 9 replays), in three forms:
//   flat   the launches captured into one graph, one kernel node each (the
//          self-test's `graph` column);
//   pdl    the same with programmatic stream serialization on every launch
//          (the next grid is set up while the one before runs);
//   child  each launch captured into its own graph and added to one parent
//          graph as a child-graph node, chained: how XLA records an FFI
//          custom call in a command buffer (a traced command buffer).
// Kernels: empty grids of 31 blocks of 32 / 256 / 1024 threads, with and
// without 41 KB of dynamic shared memory (the register rows' shape is 31 x
// 1024 with 41 KB); a grid that reads a 32 KB row a block and writes one word;
// and the package's top_k on the ragged batch (31 rows of 2000..8000, k 512).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "cuda/dependent_launch.cuh"
#include "cuda/topk_cuda.h"

#define CHECK(x)                                                                             \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

namespace {

__global__ void empty_kernel(int* sink) {
  extern __shared__ int smem[];
  (void)smem;
  if (sink != nullptr && threadIdx.x == 0 && blockIdx.x == 0x7fffffff) *sink = 1;
}

// Each block reads its row (float4 loads) and thread 0 writes its partial sum
// (one word a block): a launch that touches DRAM as a row kernel does.
__global__ void read_row_kernel(const float4* x, int n4, float* out) {
  float s = 0.f;
  for (int i = int(threadIdx.x); i < n4; i += int(blockDim.x)) {
    const float4 v = __ldg(x + size_t(blockIdx.x) * n4 + i);
    s += v.x + v.y + v.z + v.w;
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

using Launch = std::function<void(int, cudaStream_t, bool /*pdl*/)>;

// kernel<<<grid, block, smem, stream>>>(args...), launched dependent (PDL) or not: the package's
// launcher (dependent_launch.cuh) with the device's PDL flag set to `pdl`.
template <typename... Params, typename... Args>
void launch_ex(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
               Args... args) {
  jax_topk::cuda::DeviceInfo dev;
  dev.dependent_launches = pdl;
  CHECK(jax_topk::cuda::launch_dependent(dev, kernel, grid, block, smem, stream, args...));
}

enum class Form { kFlat, kPdl, kChild };

// us per launch: `reps` launches in one graph of the given form, median of replays.
double graph_us(const Launch& launch, Form form, int reps = 32) {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const bool pdl = form == Form::kPdl;
  for (int i = 0; i < 3; ++i) launch(i, stream, pdl);
  CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  std::vector<cudaGraph_t> children;
  if (form == Form::kChild) {
    CHECK(cudaGraphCreate(&graph, 0));
    cudaGraphNode_t previous = nullptr;
    for (int i = 0; i < reps; ++i) {
      cudaGraph_t child;
      CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      launch(i, stream, false);
      CHECK(cudaStreamEndCapture(stream, &child));
      cudaGraphNode_t node;
      CHECK(cudaGraphAddChildGraphNode(&node, graph, previous ? &previous : nullptr, previous ? 1 : 0, child));
      previous = node;
      children.push_back(child);
    }
  } else {
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < reps; ++i) launch(i, stream, pdl);
    CHECK(cudaStreamEndCapture(stream, &graph));
  }
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int w = 0; w < 2; ++w) CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<double> times;
  for (int r = 0; r < 9; ++r) {
    CHECK(cudaEventRecord(e0, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(e1, stream));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(double(ms) * 1e3 / reps);
  }
  std::sort(times.begin(), times.end());
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  for (cudaGraph_t c : children) CHECK(cudaGraphDestroy(c));
  CHECK(cudaStreamDestroy(stream));
  return times[times.size() / 2];
}

void report(const char* label, const Launch& launch) {
  std::printf("%-44s flat %6.2f   pdl %6.2f   child %6.2f\n", label, graph_us(launch, Form::kFlat),
              graph_us(launch, Form::kPdl), graph_us(launch, Form::kChild));
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; us per launch, 32 launches a graph, median of 9 replays\n", prop.name,
              prop.multiProcessorCount);
  constexpr int kRows = 31, kN = 8000, kK = 512;
  constexpr size_t kShared = 41 * 1024;
  CHECK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kShared)));
  for (int threads : {32, 256, 1024}) {
    for (size_t smem : {size_t(0), kShared}) {
      char label[64];
      std::snprintf(label, sizeof label, "empty %d x %d, %zu KB shared", kRows, threads, smem / 1024);
      report(label, [=](int, cudaStream_t s, bool pdl) {
        launch_ex(empty_kernel, dim3(kRows), dim3(threads), smem, s, pdl, static_cast<int*>(nullptr));
      });
    }
  }
  for (int grid : {1, 132}) {
    char label[64];
    std::snprintf(label, sizeof label, "empty %d x 1024, 41 KB shared", grid);
    report(label, [=](int, cudaStream_t s, bool pdl) {
      launch_ex(empty_kernel, dim3(grid), dim3(1024), kShared, s, pdl, static_cast<int*>(nullptr));
    });
  }

  // 64 input buffers, so that consecutive launches read different rows (as XLA's replicas do).
  constexpr int kBuffers = 64;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> host(size_t(kRows) * kN);
  std::vector<float*> inputs(kBuffers);
  for (float*& buf : inputs) {
    for (float& v : host) v = normal(rng);
    CHECK(cudaMalloc(&buf, host.size() * sizeof(float)));
    CHECK(cudaMemcpy(buf, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  float* sums = nullptr;
  CHECK(cudaMalloc(&sums, kRows * sizeof(float)));
  for (int threads : {256, 1024}) {
    char label[64];
    std::snprintf(label, sizeof label, "read a 32 KB row, %d x %d", kRows, threads);
    report(label, [&, threads](int i, cudaStream_t s, bool pdl) {
      launch_ex(read_row_kernel, dim3(kRows), dim3(threads), 0, s, pdl,
                reinterpret_cast<const float4*>(inputs[size_t(i % kBuffers)]), kN / 4, sums);
    });
  }

  std::uniform_int_distribution<int32_t> length(2000, 8000);
  std::vector<int32_t> host_lengths(kRows);
  for (int32_t& l : host_lengths) l = length(rng);
  int32_t* lengths = nullptr;
  float* values = nullptr;
  int32_t* indices = nullptr;
  CHECK(cudaMalloc(&lengths, kRows * sizeof(int32_t)));
  CHECK(cudaMemcpy(lengths, host_lengths.data(), kRows * sizeof(int32_t), cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&values, size_t(kRows) * kK * sizeof(float)));
  CHECK(cudaMalloc(&indices, size_t(kRows) * kK * sizeof(int32_t)));
  using jax_topk::DType;
  const size_t scratch_bytes = jax_topk::cuda::topk_scratch_bytes(DType::float32, kRows, kN, kK);
  void* scratch = nullptr;
  if (scratch_bytes) CHECK(cudaMalloc(&scratch, scratch_bytes));
  // The package's launcher decides PDL itself (JAX_TOPK_NO_DEPENDENT_LAUNCH), so its
  // `pdl` column equals its `flat` one.
  report(std::getenv("JAX_TOPK_NO_DEPENDENT_LAUNCH") ? "top_k ragged 31 x 8000 k512 (no PDL)"
                                                     : "top_k ragged 31 x 8000 k512 (PDL)",
         [&](int i, cudaStream_t s, bool) {
           CHECK(jax_topk::cuda::topk_rows(DType::float32, inputs[size_t(i % kBuffers)], values, indices, kRows, kN,
                                           kK, lengths, scratch, scratch_bytes, s));
         });
  CHECK(cudaDeviceSynchronize());
  std::printf("no error\n");
  return 0;
}
