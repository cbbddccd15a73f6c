"""``python -m jax_topk``: what is compiled here, then jax_topk.top_k against
lax.top_k side by side on the default backend.

    python -m jax_topk                       # the default shapes
    python -m jax_topk --shapes 4096x2048:16,1x1048576:2048 --repeats 20
    python -m jax_topk --dtype bfloat16 --json results.json
    python -m jax_topk --info                # only what is compiled
"""

from __future__ import annotations

import argparse
import json
import sys

import jax

import jax_topk
from jax_topk import _bench

# The foundation's CPU targets: routing rows, NSA-like blocks, and large k.
DEFAULT_SHAPES = "16384x256:8,16384x384:6,4096x2048:16,1024x8192:256,64x65536:2048"


def describe() -> str:
    info = jax_topk.info()
    lines = [
        f"jax_topk {info['jax_topk']}  (jax {info['jax']}, jaxlib {info['jaxlib']}, backend: {info['backend']})",
    ]
    for platform, p in info["platforms"].items():
        if p["native"]:
            b = p["build"]
            lines.append(
                f"  {platform:<5} native: targets {sorted(p['targets'].values())}, "
                f"dtypes {', '.join(p['dtypes'])}; FFI API {b['ffi_api_version'][0]}.{b['ffi_api_version'][1]} "
                f"(jaxlib {b['ffi_headers_jaxlib']} headers), {b['compiler']}"
                + (f", architectures {b['gpu_architectures']}" if b["gpu_architectures"] != "none" else "")
                + (f", route scoring in {b['route_isa']}" if "route_isa" in b else "")
                + f"\n        from {b['loaded_from']}"
            )
        else:
            lines.append(f"  {platform:<5} pure-JAX fallback: {p['reason']}")
    for op, path in info["paths"].items():
        lines.append(f"  {op} on {info['backend']}: " + "; ".join(f"{k}: {v if isinstance(v, str) else ', '.join(v)}" for k, v in path.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jax_topk", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES,
                        help="comma-separated ROWSxN:K[:DTYPE] (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", help="dtype of shapes that name none (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=10, help="timed replays per measurement (default: %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--info", action="store_true", help="print what is compiled and exit")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    print(describe(), flush=True)
    if args.info:
        return 0
    try:
        shapes = _bench.parse_shapes(args.shapes, args.dtype)
    except ValueError as e:
        parser.error(str(e))
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    print(f"\nBenchmark on {jax.default_backend()} ({_bench.device_name()}):", flush=True)
    result = _bench.run_benchmark(
        shapes,
        {
            "lax.top_k": lambda s: (lambda x: jax.lax.top_k(x, s.k)),
            "jax_topk.top_k": lambda s: (lambda x: jax_topk.top_k(x, s.k)),
        },
        baseline="lax.top_k",
        ours="jax_topk.top_k",
        repeats=args.repeats,
        progress=not args.no_progress,
    )
    print(_bench.format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
