#!/usr/bin/env bash
# HIP compile check: builds every GPU kernel and the _jax_topk_rocm FFI module
# with ROCm's HIP (Debian's hipcc 5.x and rocPRIM) for gfx90a and each newer
# AMD target the compiler has device libraries for, then imports the module
# and reads its targets. No AMD GPU is available: nothing runs on one.
#
#   .ci/hip_check.sh             skips (exit 0, saying why) when hipcc cannot be installed
#   .ci/hip_check.sh --require   fails instead
#
# Environment: PYTHON (default python3) with jaxlib installed (its FFI headers);
# nanobind is installed with pip when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

require=0
[[ "${1:-}" == "--require" ]] && require=1
python=${PYTHON:-python3}
build=build/hip-check
log=$(mktemp)
export HIP_PLATFORM=amd  # hipcc otherwise picks nvcc when it finds CUDA

skip() {
  echo "HIP compile check SKIPPED: $1"
  if ((require)); then exit 1; fi
  exit 0
}

have_hip() { command -v hipcc >/dev/null && [[ -f /usr/include/rocprim/rocprim.hpp || -f /opt/rocm/include/rocprim/rocprim.hpp ]]; }

if ! have_hip; then
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    echo "HIP check: installing Debian's hipcc and librocprim-dev (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q hipcc librocprim-dev >"$log" 2>&1 ||
      { apt-get update -q >>"$log" 2>&1 && apt-get install -y -q hipcc librocprim-dev >>"$log" 2>&1; } ||
      skip "apt-get could not install hipcc librocprim-dev: $(tail -n 2 "$log" | tr '\n' ' ')"
  else
    skip "hipcc and rocPRIM are not installed, and apt-get is unavailable or this is not root"
  fi
fi
have_hip || skip "hipcc or rocprim/rocprim.hpp still missing after the install"

# The clang behind hipcc and the ROCm paths it passes, for CMake's HIP language.
probe_dir=$(mktemp -d)
printf '#include <hip/hip_runtime.h>\n__global__ void probe(int* x) { x[threadIdx.x] = 1; }\n' >"$probe_dir/probe.hip"
hipcc_cmd=$(HIPCC_VERBOSE=1 hipcc --offload-arch=gfx90a -c "$probe_dir/probe.hip" -o "$probe_dir/probe.o" 2>&1 |
  sed -n 's/^hipcc-cmd: //p' | head -n 1) || true
[[ -f "$probe_dir/probe.o" ]] || skip "hipcc cannot compile for gfx90a: $hipcc_cmd"
hip_clang=$(awk '{print $1}' <<<"$hipcc_cmd")
hip_flags=$(grep -oE -- '--(rocm-path|hip-device-lib-path)=("[^"]*"|[^ ]*)' <<<"$hipcc_cmd" | tr -d '"' | tr '\n' ' ')

# gfx90a (MI200) and the newer targets this compiler can build for.
archs=""
for arch in gfx90a gfx940 gfx941 gfx942 gfx950 gfx1030 gfx1100 gfx1200; do
  if hipcc --offload-arch="$arch" -c "$probe_dir/probe.hip" -o "$probe_dir/probe.o" >/dev/null 2>&1; then
    archs+="${archs:+;}$arch"
  fi
done
echo "HIP check: $("$hip_clang" --version | head -n 1); targets $archs"

"$python" -c "import nanobind" 2>/dev/null || "$python" -m pip install -q nanobind
multiarch=$(gcc -print-multiarch 2>/dev/null || true)
export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-}${CMAKE_PREFIX_PATH:+:}/usr/lib/$multiarch/cmake:/opt/rocm"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DJAX_TOPK_HIP=ON -DJAX_TOPK_CUDA=OFF -DJAX_TOPK_HIP_ARCHITECTURES="$archs" \
  -DCMAKE_HIP_PLATFORM=amd -DCMAKE_HIP_COMPILER="$hip_clang" -DCMAKE_HIP_FLAGS="$hip_flags -Werror" \
  -DPython_EXECUTABLE="$(command -v "$python")" >"$log" 2>&1 || { cat "$log"; echo "HIP compile check FAILED (configure)"; exit 1; }
start=$SECONDS
cmake --build "$build" --target _jax_topk_rocm -j "$(nproc)" || { echo "HIP compile check FAILED (build)"; exit 1; }

# The module loads (libamdhip64 needs no GPU to load) and exports the ROCm targets.
"$python" - "$build" <<'EOF' || { echo "HIP compile check FAILED (import)"; exit 1; }
import sys
sys.path.insert(0, sys.argv[1])
import _jax_topk_rocm as m
assert m.platform() == "ROCM", m.platform()
targets = m.targets()
assert {"top_k", "top_k_lengths", "sort", "sort_lengths", "route", "indexer"} <= set(targets), sorted(targets)
print("HIP check: _jax_topk_rocm loads; targets", sorted(targets), "for", m.build_info()["gpu_architectures"])
print("HIP check: top_k dtypes", m.op_dtypes()["top_k"])
EOF
echo "HIP compile check passed ($((SECONDS - start)) s to build, targets $archs)"
