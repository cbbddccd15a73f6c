"""Row-sharded and axis-sharded top_k and routing over the local GPUs against one GPU.

Usage: python benchmarks/sharded.py [--out DIR] [--devices N] [--repeats R] [--copies C]

Each case runs as one jitted call on GPU 0, then with its input sharded over
N GPUs (rows, or the last axis: local top-k / local candidates, all-gather of
the candidates, merge). Results must equal the one-GPU results bit for bit.
Times are the host wall clock per call: one executable applies the op to C
copies of the input, median of R of its calls divided by C (several devices
have no single device clock; a lone call's dispatch made single-call medians
swing by 2x between runs). Writes <gpu>-x<N>-sharded.json.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_topk
from jax_topk import _bench, routing

# (op, rows, n, k or preset, how the input is sharded over the mesh axis "d")
CASES = [
    ("top_k", 32768, 1024, 8, "rows"),
    ("top_k", 16384, 4096, 16, "rows"),
    ("top_k", 2048, 65536, 2048, "rows"),
    ("top_k", 256, 262144, 50, "axis"),
    ("top_k", 64, 1048576, 2048, "axis"),
    ("route", 65536, 256, "deepseek_v3", "rows"),
    ("route", 65536, 256, "deepseek_v3", "axis"),
    ("route", 65536, 128, "qwen3_moe", "axis"),
    ("route", 65536, 64, "qwen2_moe", "axis"),  # reads the softmax normaliser: shared as partial sums
]


def make_op(op: str, n: int, k):
    """The jitted function of one case: top_k of k, or a routing preset
    (with a fixed per-expert bias where the preset selects with one)."""
    if op == "top_k":
        return lambda a: jax_topk.top_k(a, k)
    preset = routing.PRESETS[k]
    bias = jnp.linspace(-0.1, 0.1, n, dtype=jnp.float32)
    return (lambda a: preset(a, bias)) if preset.uses_bias else preset


def wall_us(op, x, repeats: int, copies: int) -> float:
    """Host wall clock per application of ``op`` to ``x``, ``copies`` of them
    per jitted call (_bench.measure)."""
    return _bench.measure(op, [x] * copies, repeats, device_clock=False).wall_seconds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--devices", type=int, default=len(jax.devices()))
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--copies", type=int, default=8)
    args = parser.parse_args()
    devices = jax.devices()[: args.devices]
    if len(devices) < 2:
        raise SystemExit(f"needs at least 2 devices, found {len(jax.devices())}")
    mesh = Mesh(np.array(devices), ("d",))
    rows_out = []
    for op_name, rows, n, k, how in CASES:
        x = jax.random.normal(jax.random.key(0), (rows, n), jnp.float32)
        op = make_op(op_name, n, k)
        single = jax.jit(op)
        x1 = jax.device_put(x, devices[0])
        spec = P("d", None) if how == "rows" else P(None, "d")
        xs = jax.device_put(x, NamedSharding(mesh, spec))
        want = single(x1)
        got = single(xs)
        same = all(np.array_equal(np.asarray(g).view(np.uint32), np.asarray(w).view(np.uint32))
                   for g, w in zip(got, want))
        t1 = wall_us(op, x1, args.repeats, args.copies)
        tn = wall_us(op, xs, args.repeats, args.copies)
        row = dict(op=op_name, rows=rows, n=n, k=k, sharded=how, one_gpu_us=t1, sharded_us=tn,
                   speedup=t1 / tn, bit_identical=bool(same))
        note = ""
        if how == "axis":  # the alternative to the candidate merge: gather the axis first
            whole = NamedSharding(mesh, P(None, None))
            gather_first = lambda a, op=op: op(jax.lax.with_sharding_constraint(a, whole))  # noqa: E731
            row["gather_first_us"] = wall_us(gather_first, xs, args.repeats, args.copies)
            note = f", gathering the axis first {row['gather_first_us']:.1f} us"
        rows_out.append(row)
        print(f"{op_name} {rows}x{n} {k} sharded by {how}: 1 GPU {t1:.1f} us, {len(devices)} GPUs {tn:.1f} us "
              f"({t1 / tn:.2f}x){note}, identical={same}", flush=True)
    result = dict(device=_bench.device_name(), devices=len(devices), jax=jax.__version__,
                  clock=f"host wall clock per call ({args.copies} calls per executable, median)",
                  repeats=args.repeats, copies=args.copies, rows=rows_out)
    path = _bench.write_result(result, args.out, f"-x{len(devices)}-sharded") + ".json"
    print("wrote", path)
    if not all(r["bit_identical"] for r in rows_out):
        raise SystemExit("sharded results differ from one GPU")


if __name__ == "__main__":
    main()
