#!/usr/bin/env bash
# Checks the Bazel build (//:BUILD): builds //:jax_topk, copies the package's
# .py files and the Bazel-built _jax_topk_cpu module into a temporary package
# directory (never the repository), imports it there and checks that
# jax_topk.info() reports that module as the native CPU one, that top_k lowers
# to its FFI target, and that it matches jax.lax.top_k bit for bit.
#
# usage: bazel/check.sh [--cuda] [--require-bazel]
#   --cuda           also build _jax_topk_cuda (nvcc, --define=cuda=true) and
#                    import it standalone (no GPU needed: build_info() only)
#   --require-bazel  fail, rather than skip with exit 0, when bazel is absent
# env: JAX_TOPK_PYTHON  the Python that configures the build and runs the check
#                       (needs jax, jaxlib, numpy, nanobind; default python3)
#      BAZEL            bazel binary (default: bazel on PATH)
#      BAZEL_JOBS       parallel actions (default 2)
#      BAZEL_FLAGS      more build flags, e.g. --define=cuda_archs=80-real,90-real
set -euo pipefail

cuda=0
require=0
for arg in "$@"; do
  case "$arg" in
    --cuda) cuda=1 ;;
    --require-bazel) require=1 ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "bazel/check.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bazel=${BAZEL:-bazel}
if ! command -v "$bazel" > /dev/null 2>&1; then
  if [ "$require" = 1 ]; then
    echo "bazel/check.sh: bazel is not installed ('$bazel' not found) and --require-bazel was given" >&2
    exit 1
  fi
  echo "bazel/check.sh: bazel is not installed ('$bazel' not found): Bazel build NOT checked (skipped)"
  exit 0
fi

export JAX_TOPK_PYTHON=${JAX_TOPK_PYTHON:-python3}
python=$(command -v "$JAX_TOPK_PYTHON") || {
  echo "bazel/check.sh: Python '$JAX_TOPK_PYTHON' not found (set JAX_TOPK_PYTHON)" >&2
  exit 1
}
# -c opt: CMake's Release (-DNDEBUG). processwrapper-sandbox: Debian's
# linux-sandbox prints debug lines for every action.
flags=(-c opt "--jobs=${BAZEL_JOBS:-2}" --spawn_strategy=processwrapper-sandbox)
# shellcheck disable=SC2206
flags+=(${BAZEL_FLAGS:-})
targets=(//:jax_topk)
if [ "$cuda" = 1 ]; then
  flags+=(--define=cuda=true)
  targets+=(//:_jax_topk_cuda)
fi

cd "$repo"
echo "== $(command -v "$bazel") build ${flags[*]} ${targets[*]} (JAX_TOPK_PYTHON=$python)"
start=$SECONDS
"$bazel" build "${flags[@]}" "${targets[@]}"
echo "== built in $((SECONDS - start)) s"
bin=$("$bazel" info "${flags[@]}" bazel-bin 2> /dev/null)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/jax_topk_bazel_check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/jax_topk"
cp "$repo"/jax_topk/*.py "$tmp/jax_topk/"
cpu_so=$(ls "$bin"/jax_topk/_jax_topk_cpu.*so)
cp "$cpu_so" "$tmp/jax_topk/"
echo "== package copy: $tmp/jax_topk ($(basename "$cpu_so") from $bin/jax_topk)"

# From $tmp, so that `import jax_topk` is the copy (not the checkout, nor an
# installed distribution: the registry falls back to one only when the
# package's own module does not import, and the check below sees that).
cd "$tmp"
PYTHONPATH="$tmp" "$python" - "$tmp" << 'EOF'
import os
import sys

tmp = os.path.realpath(sys.argv[1])
import jax
import jax.numpy as jnp
import numpy as np

import jax_topk

pkg = os.path.realpath(os.path.dirname(jax_topk.__file__))
assert pkg == os.path.join(tmp, "jax_topk"), f"jax_topk imported from {pkg}, not the copy"
info = jax_topk.info()
cpu = info["platforms"]["cpu"]
assert cpu["native"], f"CPU module not native: {cpu.get('reason')}"
build = cpu["build"]
loaded = build["loaded_from"]
assert os.path.realpath(loaded).startswith(pkg + os.sep), f"CPU module loaded from {loaded}, not the Bazel-built copy"
print(f"info(): jax_topk {info['jax_topk']}, jax {info['jax']}, backend {info['backend']}, "
      f"cpu native=True loaded_from={loaded}")
print(f"        build: jaxlib headers {build['ffi_headers_jaxlib']}, FFI API {tuple(build['ffi_api_version'])}, "
      f"compiler {build['compiler']}, architectures {build['gpu_architectures']}; "
      f"targets {sorted(cpu['targets'])}")

x = jax.random.normal(jax.random.PRNGKey(0), (64, 4096), jnp.float32)
x = x.at[3, 7].set(jnp.nan).at[5, :100].set(0.0)  # a NaN and ties
k = 37
hlo = jax.jit(lambda a: jax_topk.top_k(a, k)).lower(x).as_text()
target = cpu["targets"]["top_k"]
assert target in hlo, f"top_k did not lower to the FFI target {target}"
v, i = jax_topk.top_k(x, k)
rv, ri = jax.lax.top_k(x, k)
v, i, rv, ri = map(np.asarray, (v, i, rv, ri))
assert v.dtype == rv.dtype and i.dtype == ri.dtype, (v.dtype, rv.dtype, i.dtype, ri.dtype)
same_v = np.array_equal(v.view(np.uint32), rv.view(np.uint32))
same_i = np.array_equal(i, ri)
print(f"top_k(float32[64,4096], k={k}) via FFI target {target}: "
      f"values bit-identical to jax.lax.top_k: {same_v}, indices identical: {same_i}")
assert same_v and same_i
EOF

if [ "$cuda" = 1 ]; then
  cuda_so=$(ls "$bin"/jax_topk/_jax_topk_cuda.*so)
  echo "== CUDA module: $cuda_so ($(du -h "$cuda_so" | cut -f1))"
  "$python" - "$cuda_so" << 'EOF'
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("_jax_topk_cuda", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
b = m.build_info()
print(f"_jax_topk_cuda imports: platform {m.platform()}, targets {sorted(m.targets())}, "
      f"architectures {b['gpu_architectures']}, jaxlib headers {b['ffi_headers_jaxlib']}, compiler {b['compiler']}")
EOF
fi
echo "bazel/check.sh: OK"
