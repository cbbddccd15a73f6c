#!/usr/bin/env bash
# Builds the standalone CUDA self-test (csrc/cuda/tests/topk_selftest.cu) of
# several git refs HERE, for a GPU call to run side by side: compiling on the
# GPU machine spends its device time (four variants there took a whole 600 s
# call, thirty-fifth session); here each takes ~4 minutes of the two cores.
#
#   bash benchmarks/build_selftests.sh main=main ring=HEAD phases:ring=HEAD
#
# NAME=REF builds REF's self-test into benchmarks/.bin/NAME/selftest; a
# `phases:` prefix adds -DJAX_TOPK_PHASE_TIMING (the phase timer and block
# timeline). REF may be WORKTREE for the uncommitted tree. benchmarks/.bin is
# git-ignored: pass it to the device tool's `carry`. Then, on the GPU:
#   benchmarks/.bin/main/selftest --bench; benchmarks/.bin/ring/selftest --bench
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${JAX_TOPK_SELFTEST_ARCH:-sm_90}
NVCC=(nvcc -std=c++17 -O3 --expt-relaxed-constexpr "-arch=$ARCH")
for spec in "$@"; do
  name=${spec%%=*} ref=${spec#*=} defs=()
  if [[ $name == phases:* ]]; then
    name=${name#phases:}
    defs=(-DJAX_TOPK_PHASE_TIMING)
  fi
  src=$(mktemp -d)
  if [[ $ref == WORKTREE ]]; then
    cp -r csrc "$src/"
  else
    git archive "$ref" csrc | tar -x -C "$src"
  fi
  out=benchmarks/.bin/$name
  mkdir -p "$out"
  echo "building $name from $ref ${defs[*]:-}"
  pids=()
  for tu in topk sort tests/topk_selftest; do
    "${NVCC[@]}" "${defs[@]}" -I"$src/csrc/include" -I"$src/csrc" -c "$src/csrc/cuda/$tu.cu" \
      -o "$src/$(basename "$tu").o" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done  # set -e: a failed compile stops here
  "${NVCC[@]}" "$src"/*.o -o "$out/selftest"
  git -C . rev-parse --verify -q "$ref^{commit}" > "$out/ref" 2>/dev/null || echo "$ref" > "$out/ref"
  rm -rf "$src"
  echo "  -> $out/selftest"
done
