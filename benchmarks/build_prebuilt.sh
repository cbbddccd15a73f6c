#!/usr/bin/env bash
# Builds the package's compiled modules HERE, on the CPU machine, for the GPU machine's Python
# (3.12), and packs them the way a device call's JAX_TOPK_SAVE_BUILD=1 does (gzipped modules and
# the hash of the C++/CUDA sources they came from). A device call that carries the folder and sets
# JAX_TOPK_PREBUILT=<it> skips its ~3.5-minute package build (benchmarks/gpu_session.sh):
#
#   bash benchmarks/build_prebuilt.sh                    # -> benchmarks/.bin/prebuilt (sm_90)
#   JAX_TOPK_PREBUILT=benchmarks/.bin/prebuilt bash benchmarks/gpu_session.sh ragged tests
#
# (device tool: carry ["benchmarks/.bin"]). First used in the fifty-first session: modules built by
# nvcc 13.0 and g++ 12 here against jaxlib 0.10.2's FFI headers loaded and ran under jax 0.11.2 on
# the H100 machine. The build takes ~9 minutes of the two cores; the working tree must not change
# its C++/CUDA sources afterwards (the device call refuses modules of other sources).
# Needs a Python 3.12 with scikit-build-core, nanobind and jaxlib==0.10.2:
#   $PYTHON312 -m pip install scikit-build-core nanobind jaxlib==0.10.2
set -euo pipefail
cd "$(dirname "$0")/.."
# The first Python 3.12 that runs (a pyenv shim on PATH may exist and still fail).
PY=${PYTHON312:-}
if [[ -z $PY ]]; then
  for candidate in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then PY=$candidate; break; fi
  done
fi
ARCHS=${JAX_TOPK_CUDA_ARCHS:-90-real}
OUT_DIR=${1:-benchmarks/.bin/prebuilt}
[[ -n $PY ]] || { echo "no Python 3.12 that runs (set PYTHON312)"; exit 1; }
wheel_dir=$(mktemp -d)
JAX_TOPK_CUDA=ON "$PY" -m pip wheel --no-build-isolation --no-deps -w "$wheel_dir" \
  -C "cmake.define.JAX_TOPK_CUDA_ARCHITECTURES=$ARCHS" .
unpacked=$(mktemp -d)
(cd "$unpacked" && unzip -q "$wheel_dir"/*.whl)
rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR"
for f in "$unpacked"/jax_topk/_jax_topk_*.so; do gzip -c "$f" >"$OUT_DIR/$(basename "$f").gz"; done
bash benchmarks/native_sources_hash.sh >"$OUT_DIR/sources.txt"
rm -rf "$wheel_dir" "$unpacked"
ls -l "$OUT_DIR"
