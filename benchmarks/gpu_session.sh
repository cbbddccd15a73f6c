#!/usr/bin/env bash
# One call on a GPU machine: build, then the steps named as arguments, each
# logged under $OUT (which the device tool brings back). Steps:
#   selftest   the standalone CUDA self-test (csrc/cuda/tests), no JAX
#   tests      pytest on CPU, then the whole suite on the GPU (+ GPU == CPU)
#   sanitize   compute-sanitizer memcheck, synccheck, and racecheck per kernel family,
#              over the self-test's --quick cases
#   bench      benchmarks/run.py over the top_k issue grid (JSON + plot)
#   bench_sort benchmarks/run.py --op sort
#   trace_sort the GPU timeline of the sort's kernels (benchmarks/trace_calls.py --op sort)
#   sort       the CUDA sort: self-test --sort (with --big: several chunks of the tile regime),
#              memcheck and racecheck over its --quick cases, the GPU pytest of sort
#   kbench     the self-test's --bench: kernel time alone (CUDA events)
#   kregimes   the same with every regime that holds each shape (--regimes)
#   phases     the self-test built with the phase timer, on the ragged batches (every block's
#              timeline in $OUT/timeline.txt)
#   overhead   per-call cost inside a jitted executable (benchmarks/call_overhead.py)
#   trace      GPU timeline of those executables: kernel time against gaps
#              (benchmarks/trace_calls.py), with and without XLA command buffers
#   lengths    the self-test's per-row lengths cases, plain and under memcheck
#   ragged     benchmarks/ragged.py: the ragged top-k case (lengths= against lax.top_k)
#   trace_ragged  the same case's kernel time against the gaps inside XLA's executable
#              (benchmarks/trace_calls.py --op ragged)
#   routing    the fast route scores' error bounds over every float32 logit
#              (csrc/cuda/tests/route_bounds_test.cu), then the routing tests on the GPU,
#              including GPU == CPU (tests/test_routing_gpu.py)
#   bench_routing  benchmarks/routing.py: fused route against the lax.top_k composition
#   profile_routing  ncu over the routing kernel alone (time, instructions, occupancy)
#   profile_nsa  ncu over NSA's selected branch at 64K: the forced-block pass and the walk
#              (benchmarks/profile_nsa.py; throughput, occupancy, warp stalls)
#   sharded    (2+ GPUs) tests/test_sharding.py on the GPUs, and benchmarks/sharded.py: row- and
#              axis-sharded top_k and routing over every GPU against one
#   indexer    tests/test_indexer.py on the GPU (GPU == CPU, batch invariance), and
#              benchmarks/indexer.py: one indexer_top_k call against the jnp compositions
#   sanitize_indexer  compute-sanitizer memcheck, racecheck and synccheck over the indexer
#              kernels (the GPU tests of one tensor-core shape, and the fused kernels on
#              random scores: tensor cores and the exact order)
#   nsa        the GPU tests of tests/test_nsa.py (-k gpu_), and benchmarks/nsa.py: nsa_attention against
#              dense causal attention (cuDNN), forward and forward + backward, T = 8K..64K,
#              then each NSA piece alone (--branches); benchmarks/nsa.py --tune sweeps the kernels' launches
#   tests_nsa  tests/test_nsa.py on the GPU alone
#   nsa_kernel the CUDA block-score kernels alone (warpgroup and mma.sync) against a float64 host reference
#              (csrc/cuda/tests/nsa_block_scores_test.cu), its time at 16K and 64K tokens
#              (--bench), and compute-sanitizer memcheck, racecheck and synccheck over it
#   tests_indexer  tests/test_indexer.py on the GPU alone (GPU == CPU, fused == unfused, batch invariance)
#   bench_indexer  benchmarks/indexer.py alone
# At the end every log is gathered into $OUT/logs.txt (the device tool brings
# back few files). JAX_TOPK_CUDA_ARCHS (e.g. 90-real) builds those
# architectures only: a quicker build for a development call.
# JAX_TOPK_SAVE_BUILD=1 also brings the compiled modules back ($OUT/prebuilt: gzipped, with
# the hash of the C++/CUDA sources they came from); a later call that carries that folder
# and sets JAX_TOPK_PREBUILT=<it> skips the build (~3 minutes of device time) and runs the
# checkout's Python against those modules, refusing if the C++/CUDA sources changed since.
# benchmarks/build_prebuilt.sh builds such a folder on the CPU machine instead (no device time).
# The package is built first unless every step runs standalone CUDA programs only
# (selftest, sanitize, kbench, kregimes, phases, lengths, nsa_kernel).
# Example: OUT=/tmp/out bash benchmarks/gpu_session.sh selftest tests bench
set -uo pipefail
OUT=${OUT:-/tmp/jax_topk_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# Never import the unbuilt source tree from the working directory (python -m,
# python -c): always the installed package.
export PYTHONSAFEPATH=1
# A self-test built beforehand (benchmarks/build_selftests.sh, carried to the GPU machine) saves
# the call its compile: JAX_TOPK_SELFTEST=benchmarks/.bin/NAME/selftest.
SELFTEST=${JAX_TOPK_SELFTEST:-/tmp/topk_selftest}
# The standalone CUDA programs' compiler line (self-test, phase timer, route bounds).
NVCC=(nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90 -Icsrc/include -Icsrc)
status=0

step() {  # step NAME TIMEOUT_S COMMAND...: run, log to $OUT/NAME.log, record the verdict
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  tail -n 4 "$OUT/$name.log"
  [[ $rc -eq 0 ]] || status=1
  return $rc
}

build_selftest() {  # the standalone CUDA self-test (no JAX), used by several steps
  if [[ -n ${JAX_TOPK_SELFTEST:-} ]]; then
    [[ -x $SELFTEST ]] || { echo "JAX_TOPK_SELFTEST=$SELFTEST is not an executable" | tee -a "$OUT/summary.txt"; return 1; }
    return 0
  fi
  step selftest_build 300 "${NVCC[@]}" csrc/cuda/topk.cu csrc/cuda/sort.cu csrc/cuda/tests/topk_selftest.cu \
    -o "$SELFTEST"
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv >"$OUT/summary.txt" 2>&1
python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())" >>"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"

build_args=()
[[ -n ${JAX_TOPK_CUDA_ARCHS:-} ]] && build_args=(-C "cmake.define.JAX_TOPK_CUDA_ARCHITECTURES=$JAX_TOPK_CUDA_ARCHS")
# Steps that run standalone CUDA programs only need no package (a cold build of every
# architecture takes ~7 minutes of device time).
needs_package=0
for s in "$@"; do
  case $s in selftest|sanitize|kbench|kregimes|phases|lengths|nsa_kernel) ;; *) needs_package=1 ;; esac
done
# What the compiled modules are built from: a later call may reuse them only for the same sources.
native_sources_hash() { bash benchmarks/native_sources_hash.sh; }
if [[ $needs_package == 1 || $# == 0 ]]; then
  if [[ -n ${JAX_TOPK_PREBUILT:-} ]]; then
    # A device call's build costs ~3 minutes of device time: reuse the modules an earlier call
    # saved (JAX_TOPK_SAVE_BUILD=1), carried back as JAX_TOPK_PREBUILT=<dir of its prebuilt/>,
    # and import the checkout itself (PYTHONSAFEPATH above keeps the working directory off
    # sys.path; PYTHONPATH puts the checkout back on it on purpose).
    stamp=$(cat "$JAX_TOPK_PREBUILT/sources.txt" 2>/dev/null)
    if [[ $stamp != "$(native_sources_hash)" ]]; then
      echo "JAX_TOPK_PREBUILT=$JAX_TOPK_PREBUILT was built from other C++/CUDA sources ($stamp); build instead" \
        | tee -a "$OUT/summary.txt"; exit 1
    fi
    for f in "$JAX_TOPK_PREBUILT"/*.so.gz; do gunzip -c "$f" >"jax_topk/$(basename "${f%.gz}")"; done
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  else
    step build 420 python3 -m pip install --no-build-isolation --no-deps -v "${build_args[@]}" . || { echo "build failed"; exit 1; }
  fi
  python3 -m jax_topk --info | tee -a "$OUT/summary.txt"
  if [[ ${JAX_TOPK_SAVE_BUILD:-0} == 1 && -z ${JAX_TOPK_PREBUILT:-} ]]; then  # 3 files back: 2 modules, their sources' hash
    mkdir -p "$OUT/prebuilt"
    module_dir=$(cd /tmp && python3 -c "import jax_topk, os; print(os.path.dirname(jax_topk.__file__))")
    for f in "$module_dir"/_jax_topk_*.so; do gzip -c "$f" >"$OUT/prebuilt/$(basename "$f").gz"; done
    native_sources_hash >"$OUT/prebuilt/sources.txt"
  fi
fi

for s in "$@"; do
  case $s in
    selftest)
      build_selftest && step selftest 300 "$SELFTEST" ;;
    tests)
      step tests_cpu 200 pytest -q -x -p no:warnings -p no:cacheprovider tests
      JAX_TOPK_TEST_PLATFORM=gpu step tests_gpu 300 pytest -q --maxfail=10 -p no:warnings -p no:cacheprovider tests ;;
    sanitize)
      [[ -x $SELFTEST ]] || build_selftest
      step memcheck 300 compute-sanitizer --tool memcheck --error-exitcode 1 "$SELFTEST" --quick
      step synccheck 300 compute-sanitizer --tool synccheck --error-exitcode 1 "$SELFTEST" --quick
      # racecheck over every kernel at once outruns a call; one kernel family at a
      # time, over the cases of at most 8192 elements (racecheck instruments every
      # shared-memory access: with 65536 the threshold kernel alone outran 130 s).
      # racecheck faults (an internal sanitizer error) when a cluster launch runs
      # uninstrumented, so the other families run with --no-clusters: no case
      # forced onto the cluster kernel, and those the dispatcher sends to it in
      # the regime it picks without clusters.
      for kernel in warp_select warp_sort threshold cluster_topk register_topk radix_topk_row_per_block radix_split; do
        step "racecheck_$kernel" 300 compute-sanitizer --tool racecheck --error-exitcode 1 \
          --kernel-name "kns=$kernel" "$SELFTEST" --quick --max-elements 8192 \
          $([[ $kernel == cluster_topk ]] || echo --no-clusters)
      done
      # The threshold kernel's narrow blocks start at hundreds of rows (528 x 200
      # on 132 SMs); all cases up to there outrun a call.
      step racecheck_threshold_narrow 300 compute-sanitizer --tool racecheck --error-exitcode 1 \
        --kernel-name kns=threshold "$SELFTEST" --quick --min-elements 100000 --max-elements 110000 --no-clusters
      # The cluster kernel's sampled threshold: its --quick cases of 17 rows of 32768,
      # and of one row of 32768 (clusters of eight; ~2 min on an H100).
      step racecheck_cluster_sampled 300 compute-sanitizer --tool racecheck --error-exitcode 1 \
        --kernel-name kns=cluster_topk "$SELFTEST" --quick --min-elements 550000 --max-elements 560000
      step racecheck_cluster_one_row 300 compute-sanitizer --tool racecheck --error-exitcode 1 \
        --kernel-name kns=cluster_topk "$SELFTEST" --quick --min-elements 32768 --max-elements 32768 ;;
    bench)
      step bench 500 python3 benchmarks/run.py --repeats 10 --out "$OUT" ;;
    tests_gpu_quick)
      JAX_TOPK_TEST_PLATFORM=gpu step tests_gpu_quick 300 pytest -q --maxfail=10 -p no:warnings -p no:cacheprovider \
        tests/test_top_k.py tests/test_top_k_gpu.py tests/test_lengths.py ;;
    kbench)
      [[ -x $SELFTEST ]] || build_selftest
      step kbench 200 "$SELFTEST" --bench ;;
    kregimes)  # every regime that holds each shape, the few-row crossings included
      [[ -x $SELFTEST ]] || build_selftest
      step kregimes 300 "$SELFTEST" --bench --regimes ;;
    phases)  # where a block's time goes (-DJAX_TOPK_PHASE_TIMING), on the ragged batches
      step phases_build 300 "${NVCC[@]}" -DJAX_TOPK_PHASE_TIMING csrc/cuda/topk.cu csrc/cuda/sort.cu \
        csrc/cuda/tests/topk_selftest.cu -o /tmp/topk_phases &&
        JAX_TOPK_TIMELINE_DUMP="$OUT/timeline.txt" step phases 200 /tmp/topk_phases --bench --regimes --only ragged ;;
    overhead)
      step overhead 200 python3 benchmarks/call_overhead.py
      XLA_FLAGS=--xla_gpu_enable_command_buffer= step overhead_no_cmdbuf 200 python3 benchmarks/call_overhead.py ;;
    trace)
      step trace 300 python3 benchmarks/trace_calls.py --json "$OUT/trace.json"
      XLA_FLAGS=--xla_gpu_enable_command_buffer= step trace_no_cmdbuf 300 python3 benchmarks/trace_calls.py \
        --json "$OUT/trace_no_cmdbuf.json" ;;
    sort)
      [[ -x $SELFTEST ]] || build_selftest
      step selftest_sort 300 "$SELFTEST" --sort --big
      step memcheck_sort 300 compute-sanitizer --tool memcheck --error-exitcode 1 "$SELFTEST" --sort --quick \
        --max-elements 300000
      for kernel in sort_rows_in_block sort_tile_pass; do
        step "racecheck_$kernel" 300 compute-sanitizer --tool racecheck --error-exitcode 1 \
          --kernel-name "kns=$kernel" "$SELFTEST" --sort --quick --max-elements 65536
      done
      JAX_TOPK_TEST_PLATFORM=gpu step tests_sort_gpu 300 pytest -q --maxfail=10 -p no:warnings -p no:cacheprovider \
        tests/test_sort.py tests/test_sort_gpu.py tests/test_ragged.py ;;
    trace_sort)
      step trace_sort 300 python3 benchmarks/trace_calls.py --op sort --replicas 8 \
        --shapes 16384x256:256,4096x2048:2048,1024x8192:8192,64x65536:65536 --json "$OUT/trace_sort.json" ;;
    bench_sort)
      step bench_sort 300 python3 benchmarks/run.py --op sort --out "$OUT" ;;
    lengths)
      [[ -x $SELFTEST ]] || build_selftest
      step selftest_lengths 300 "$SELFTEST" --lengths
      step memcheck_lengths 300 compute-sanitizer --tool memcheck --error-exitcode 1 "$SELFTEST" --lengths --quick ;;
    ragged)
      step ragged 300 python3 benchmarks/ragged.py --out "$OUT" ;;
    trace_ragged)
      step trace_ragged 200 python3 benchmarks/trace_calls.py --op ragged --json "$OUT/trace_ragged.json" ;;
    routing)
      step route_bounds_build 200 "${NVCC[@]}" csrc/cuda/tests/route_bounds_test.cu -o /tmp/route_bounds_test &&
        step route_bounds 120 /tmp/route_bounds_test
      JAX_TOPK_TEST_PLATFORM=gpu step routing 300 pytest -q --maxfail=10 -p no:warnings -p no:cacheprovider \
        tests/test_routing.py tests/test_routing_gpu.py ;;
    bench_routing)
      step bench_routing 300 python3 benchmarks/routing.py --out "$OUT" ;;
    profile_nsa)
      step profile_nsa 300 ncu --kernel-name regex:"forced|selected" --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
        --section WarpStateStats python3 benchmarks/profile_nsa.py ;;
    profile_routing)
      step profile_routing 300 ncu -k regex:route_ --metrics gpu__time_duration.sum,smsp__inst_executed.sum,\
sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,\
dram__throughput.avg.pct_of_peak_sustained_elapsed python3 benchmarks/profile_routing.py --calls 2 ;;
    sharded)
      step tests_sharded 300 pytest -q -p no:warnings -p no:cacheprovider tests/test_sharding.py
      step bench_sharded 300 python3 benchmarks/sharded.py --out "$OUT" ;;
    indexer)
      JAX_TOPK_TEST_PLATFORM=gpu step tests_indexer 200 pytest -q -p no:warnings -p no:cacheprovider tests/test_indexer.py
      step bench_indexer 400 python3 benchmarks/indexer.py --out "$OUT" ;;
    tests_indexer)
      JAX_TOPK_TEST_PLATFORM=gpu step tests_indexer 300 pytest -q -p no:warnings -p no:cacheprovider tests/test_indexer.py ;;
    bench_indexer)
      step bench_indexer 400 python3 benchmarks/indexer.py --out "$OUT" ;;
    tests_nsa)
      # The whole file on the GPU outruns 300 s (69 of 120 tests by then, H200, forty-second session).
      JAX_TOPK_TEST_PLATFORM=gpu step tests_nsa 540 pytest -q -p no:warnings -p no:cacheprovider tests/test_nsa.py ;;
    sanitize_indexer)
      for tool in memcheck racecheck synccheck; do
        XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_TOPK_TEST_PLATFORM=gpu step "${tool}_indexer" 400 \
          compute-sanitizer --tool "$tool" --error-exitcode 1 --kernel-name kns=indexer \
          pytest -q -p no:warnings -p no:cacheprovider tests/test_indexer.py \
          -k "(against_cpu and bfloat16-64-128) or (fused_equals_unfused and random and (bfloat16-32-128 or float32))"
      done ;;
    nsa_kernel)
      # sm_90a, so that both kernels run: the warpgroup one, then the mma.sync one.
      step nsa_kernel_build 200 "${NVCC[@]/-arch=sm_90/-gencode=arch=compute_90a,code=sm_90a}" \
        -DJAX_TOPK_BUILD_HAS_WGMMA csrc/cuda/nsa.cu csrc/cuda/tests/nsa_block_scores_test.cu \
        -o /tmp/nsa_block_scores_test && step nsa_kernel 120 /tmp/nsa_block_scores_test &&
        step nsa_kernel_bench 60 /tmp/nsa_block_scores_test --bench &&
        for tool in memcheck racecheck synccheck; do
          step "${tool}_nsa" 300 compute-sanitizer --tool "$tool" --error-exitcode 1 /tmp/nsa_block_scores_test
        done ;;
    nsa)
      # The GPU tests only (~230 s on an H200): the whole file is tests_nsa.
      JAX_TOPK_TEST_PLATFORM=gpu step tests_nsa_gpu 280 pytest -q -p no:warnings -p no:cacheprovider tests/test_nsa.py -k gpu_
      step bench_nsa 500 python3 benchmarks/nsa.py --out "$OUT"
      step bench_nsa_branches 200 python3 benchmarks/nsa.py --branches --seqlens 16384,65536 --out "$OUT" ;;
    *) echo "unknown step $s"; status=1 ;;
  esac
done
cat "$OUT/summary.txt"
for log in "$OUT"/*.log; do
  [[ -e $log ]] || continue
  { echo "===== $(basename "$log")"; cat "$log"; } >>"$OUT/logs.txt"
  rm -f "$log"
done
exit $status
