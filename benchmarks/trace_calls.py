"""Where the time of one jitted executable of R top-k (or sort) calls goes, on the GPU.

`benchmarks/run.py` divides the wall time of an executable of R calls by R.
This script records the same executable's GPU activity (CUPTI, through
torch.profiler) and splits that time into kernel time and the gaps between
kernels, per op:

    span/R   first kernel start to last kernel end, per op
    busy/R   summed kernel (and memset/memcpy) durations, per op
    gap/R    span - busy: the GPU idle between this executable's kernels
    kernels  kernels per op, and the top kernel names by total time

A large gap with a short kernel means launches (host work per call) set the
pace; a kernel far slower here than in the self-test's --bench means the
kernel itself behaves differently inside XLA (cold L2, other streams).

    python benchmarks/trace_calls.py [--shapes 16384x64:2,...] [--replicas 32] [--op sort]
    python benchmarks/trace_calls.py --op ragged [--k 512]

--op ragged traces the ragged case instead (``benchmarks/ragged.py``: 31 rows
of 2000..8000 padded with -inf): one ``top_k(..., lengths=)`` call per batch
against one padded ``lax.top_k``. Its kernel time inside XLA's executable,
against the self-test's CUDA-graph time (where the next launch overlaps the
kernel before it), says how much of the call is the kernel's own latency.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics

import jax

import jax_topk
from jax_topk import _bench


def trace(op, inputs, replays: int = 5) -> dict:
    run = jax.jit(lambda *xs: [op(x) for x in xs])
    jax.block_until_ready(run(*inputs))
    spans, busies, counts = [], [], []
    names: collections.Counter = collections.Counter()
    for _ in range(replays):
        activity = _bench.gpu_activity(run, inputs)
        if activity is None:
            return {"error": "no CUDA activity recorded (no torch, or CUPTI unavailable?)"}
        spans.append(activity.span_us)
        busies.append(activity.busy_us)
        counts.append(len(activity.events))
        for name, start, end in activity.events:
            names[name[:60]] += end - start
    r = len(inputs)
    span, busy = statistics.median(spans), statistics.median(busies)
    return {
        "span_us_per_op": span / r,
        "busy_us_per_op": busy / r,
        "gap_us_per_op": (span - busy) / r,
        "kernels_per_op": statistics.median(counts) / r,
        "top_kernels_us_per_op": {k: v / replays / r for k, v in names.most_common(6)},
    }


def shape_cases(args) -> list:
    """(label, inputs, contenders) for each shape of --shapes."""
    cases = []
    for shape in _bench.parse_shapes(args.shapes):
        inputs = _bench.make_inputs(shape, args.replicas)
        if args.op == "sort":
            ops = (("jax_topk", lambda x: jax_topk.sort(x, descending=True)),
                   ("argsort", lambda x: jax.numpy.argsort(x, axis=-1, stable=True, descending=True)))
        else:
            ops = (("jax_topk", lambda x, k=shape.k: jax_topk.top_k(x, k)),
                   ("lax", lambda x, k=shape.k: jax.lax.top_k(x, k)))
        cases.append((str(shape), inputs, ops))
    return cases


def ragged_cases(k: int, replicas: int) -> list:
    """The ragged batch of benchmarks/ragged.py: one lengths= call against one padded lax.top_k."""
    batch = _bench.make_ragged_batch(_bench.RAGGED_ROWS, replicas)
    lengths = jax.numpy.asarray(batch.lengths)
    ops = (("jax_topk", lambda x: jax_topk.top_k(x, k, lengths=lengths)), ("lax", lambda x: jax.lax.top_k(x, k)))
    return [(f"ragged {_bench.RAGGED_ROWS}x{batch.n} k{k}", batch.inputs, ops)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="16384x64:2,16384x256:8,4096x2048:16,1024x8192:256,1x131072:2048")
    parser.add_argument("--replicas", type=int, default=32)
    parser.add_argument("--op", choices=("top_k", "sort", "ragged"), default="top_k")
    parser.add_argument("--k", type=int, default=512, help="k of --op ragged")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    flags = os.environ.get("XLA_FLAGS", "")
    print(f"XLA_FLAGS={flags!r}  device={_bench.device_name()}")
    out = []
    cases = ragged_cases(args.k, args.replicas) if args.op == "ragged" else shape_cases(args)
    for label, inputs, ops in cases:
        for name, op in ops:
            wall = _bench.measure(op, inputs, repeats=10, device_clock=False).wall_seconds * 1e6
            t = trace(op, inputs)
            t.update(shape=label, op=name, wall_us_per_op=wall, xla_flags=flags)
            out.append(t)
            if "error" in t:
                print(f"{label:<18} {name:<9} {t['error']}")
                continue
            print(f"{label:<18} {name:<9} wall {wall:8.1f}  span {t['span_us_per_op']:8.1f}  "
                  f"busy {t['busy_us_per_op']:8.1f}  gap {t['gap_us_per_op']:7.1f}  "
                  f"kernels/op {t['kernels_per_op']:.1f}  top {json.dumps({k: round(v, 1) for k, v in t['top_kernels_us_per_op'].items()})}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
