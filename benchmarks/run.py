"""The top-k and sort benchmarks over the issue grids, side by side in one process.

    python benchmarks/run.py                      # top_k: the grid, float32 + bfloat16 routing rows
    python benchmarks/run.py --op sort            # sort: rows x n (k = n: every element is output)
    python benchmarks/run.py --shapes 4096x2048:16 --repeats 20 --out /tmp/results

Contenders: jax_topk.top_k, lax.top_k, jnp.argsort(stable, descending) and, when
torch with CUDA is importable, torch.topk and torch.sort(stable) through a CUDA
graph timed with events. Writes ``<out>/<device>[-sort].json`` and ``.png``
(time per shape against the memory floor, log scale).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import jax
import jax.numpy as jnp

import jax_topk
from jax_topk import _bench

# The CUDA top_k issue's grid (rows x n : k); float32, plus bfloat16 on the routing rows.
GRID = (
    "16384x64:2,16384x128:8,16384x256:8,16384x384:6,"
    "4096x64:16,4096x256:16,4096x1024:16,4096x2048:16,4096x256:32,4096x2048:32,"
    "8192x1024:16,1024x8192:64,1024x8192:256,128x131072:50,128x131072:1024,"
    "64x65536:2048,2048x65536:2048,1x131072:2048,1x1048576:16,1x1048576:2048,"
    "16384x64:2:bfloat16,16384x128:8:bfloat16,16384x256:8:bfloat16,16384x384:6:bfloat16"
)
# The sort issue's shapes (k = n).
SORT_GRID = "16384x256:256,4096x2048:2048,1024x8192:8192,128x131072:131072,64x65536:65536"


def torch_contenders(op: str, repeats: int):
    """torch.topk / torch.sort factories timed through CUDA graphs, or {} without CUDA torch."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}

    def graph_timer(shape: _bench.Shape, fn):
        replicas = _bench.replicas_for(shape, "gpu")
        dtype = getattr(torch, shape.dtype)
        gen = torch.Generator(device="cuda").manual_seed(0)
        xs = [torch.randn(shape.rows, shape.n, device="cuda", generator=gen).to(dtype) for _ in range(replicas)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for x in xs:  # warm up (allocations, kernels) outside the graph
                fn(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [fn(x) for x in xs]  # noqa: F841 - keeps graph outputs alive
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        del graph, outs, xs
        torch.cuda.empty_cache()
        return statistics.median(times) / replicas

    def factory(fn_for_shape):
        # The harness expects a JAX op; torch contenders return a precomputed time instead,
        # or None (not timed on this shape) where torch fails: on an H200 with torch 2.11,
        # torch.sort(stable=True) under graph capture raised "invalid device ordinal" and
        # ended the whole run.
        def timed(shape):
            try:
                return _bench.PrecomputedTime(graph_timer(shape, fn_for_shape(shape)))
            except RuntimeError as err:  # torch.AcceleratorError is one
                print(f"warning: torch failed on {shape}; not timed: {str(err).splitlines()[0]}", file=sys.stderr)
                return None
        return timed

    torch_sort = {"torch.sort": factory(lambda s: (lambda x: torch.sort(x, dim=-1, descending=True, stable=True)))}
    if op == "sort":
        return torch_sort
    return {"torch.topk": factory(lambda s: (lambda x: torch.topk(x, s.k, dim=-1, sorted=True)))} | torch_sort


def torch_copy_bandwidth(repeats: int = 20) -> float | None:
    """Bytes/s (read + write) of a 1 GiB device-to-device copy timed with CUDA
    events, as the design's anchors measured it; None without CUDA torch."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    src = torch.rand(1 << 28, device="cuda")  # 1 GiB of float32, not zeros
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / statistics.median(times)


def jax_contenders(op: str):
    argsort = {"jnp.argsort": lambda s: (lambda x: jnp.argsort(x, axis=-1, stable=True, descending=True))}
    if op == "sort":
        return {"jax_topk.sort": lambda s: (lambda x: jax_topk.sort(x, descending=True))} | argsort
    return {
        "jax_topk.top_k": lambda s: (lambda x: jax_topk.top_k(x, s.k)),
        "lax.top_k": lambda s: (lambda x: jax.lax.top_k(x, s.k)),
    } | argsort


def plot(result: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = result["rows"]
    names = list(dict.fromkeys(n for r in rows for n in r["times_us"]))
    labels = [r.get("label") or f"{r['rows']}x{r['n']}\nk={r['k']}" + ("\nbf16" if r["dtype"] == "bfloat16" else "") for r in rows]
    fig, ax = plt.subplots(figsize=(max(10, 0.75 * len(rows)), 5.5))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(xs, [r["times_us"].get(name, float("nan")) for r in rows], width, label=name)
    ax.scatter(range(len(rows)), [r["floor_us"] for r in rows], marker="_", s=300, color="black", zorder=5,
               label="memory floor")
    ax.set_yscale("log")
    ax.set_ylabel("microseconds per op (log)")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_title(f"{result.get('op', 'top_k')} on {result['device']} (copy bandwidth {result['copy_bandwidth_GBps']:.0f} GB/s)")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=("top_k", "sort"), default="top_k")
    parser.add_argument("--shapes", help="comma-separated ROWSxN:K[:DTYPE] (default: the op's issue grid)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)

    shapes = _bench.parse_shapes(args.shapes or (SORT_GRID if args.op == "sort" else GRID))
    contenders = jax_contenders(args.op)
    if not args.no_torch:
        contenders.update(torch_contenders(args.op, args.repeats))
    ours = f"jax_topk.{args.op}"
    anchors = ("jnp.argsort", "torch.sort") if args.op == "sort" else ("lax.top_k", "torch.topk")
    bandwidth = None if args.no_torch else torch_copy_bandwidth()
    result = _bench.run_benchmark(shapes, contenders, baseline=anchors[0], ours=ours, repeats=args.repeats,
                                  bandwidth=bandwidth)
    result["op"] = args.op
    result["bandwidth_probe"] = "torch 1 GiB device copy (CUDA events)" if bandwidth else "jax elementwise a + 1"
    result["jax_topk"] = jax_topk.info()
    for anchor in anchors:
        ratios = [r["times_us"][anchor] / r["times_us"][ours] for r in result["rows"] if anchor in r["times_us"]]
        if ratios:
            result[f"geomean_speedup_vs_{anchor}"] = _bench.geomean(ratios)
            result[f"min_speedup_vs_{anchor}"] = min(ratios)
    print(_bench.format_table(result))
    for anchor in anchors:
        if f"geomean_speedup_vs_{anchor}" in result:
            print(f"vs {anchor}: geomean {result[f'geomean_speedup_vs_{anchor}']:.2f}x, "
                  f"min {result[f'min_speedup_vs_{anchor}']:.2f}x")
    stem = _bench.write_result(result, args.out, "-sort" if args.op == "sort" else "")
    print(f"wrote {stem}.json" + (f" and {stem}.png" if plot(result, stem + ".png") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
