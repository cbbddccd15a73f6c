"""Row-sharded and axis-sharded top_k over the local GPUs against one GPU.

Usage: python benchmarks/sharded.py [--out DIR] [--devices N] [--repeats R]

Each shape runs as one jitted call on GPU 0, then with its input sharded over
N GPUs (rows, or the top-k axis: local top-k, all-gather of the candidates,
merge). Results must equal the one-GPU results bit for bit. Times are the
host wall clock per call (median of R calls, each waited for): several
devices have no single device clock. Writes <gpu>-x<N>-sharded.json.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_topk
from jax_topk import _bench

# (rows, n, k, how the input is sharded over the mesh axis "d")
CASES = [
    (32768, 1024, 8, "rows"),
    (16384, 4096, 16, "rows"),
    (2048, 65536, 2048, "rows"),
    (256, 262144, 50, "axis"),
    (64, 1048576, 2048, "axis"),
]


def wall_us(op, x, repeats: int) -> float:
    """Host wall clock of one jitted call of ``op`` on ``x`` (_bench.measure)."""
    return _bench.measure(op, [x], repeats, device_clock=False).wall * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--devices", type=int, default=len(jax.devices()))
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    devices = jax.devices()[: args.devices]
    if len(devices) < 2:
        raise SystemExit(f"needs at least 2 devices, found {len(jax.devices())}")
    mesh = Mesh(np.array(devices), ("d",))
    rows_out = []
    for rows, n, k, how in CASES:
        x = jax.random.normal(jax.random.key(0), (rows, n), jax.numpy.float32)
        op = lambda a, k=k: jax_topk.top_k(a, k)  # noqa: E731
        single = jax.jit(op)
        x1 = jax.device_put(x, devices[0])
        spec = P("d", None) if how == "rows" else P(None, "d")
        xs = jax.device_put(x, NamedSharding(mesh, spec))
        want = single(x1)
        got = single(xs)
        same = (np.array_equal(np.asarray(got[1]), np.asarray(want[1]))
                and np.array_equal(np.asarray(got[0]).view(np.uint32), np.asarray(want[0]).view(np.uint32)))
        t1 = wall_us(op, x1, args.repeats)
        tn = wall_us(op, xs, args.repeats)
        row = dict(rows=rows, n=n, k=k, sharded=how, one_gpu_us=t1, sharded_us=tn, speedup=t1 / tn,
                   bit_identical=bool(same))
        rows_out.append(row)
        print(f"{rows}x{n} k={k} sharded by {how}: 1 GPU {t1:.1f} us, {len(devices)} GPUs {tn:.1f} us "
              f"({t1 / tn:.2f}x), identical={same}", flush=True)
    result = dict(device=_bench.device_name(), devices=len(devices), jax=jax.__version__,
                  clock="host wall clock per call (median)", repeats=args.repeats, rows=rows_out)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{_bench.device_name().lower().replace(' ', '-')}-x{len(devices)}-sharded.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", path)
    if not all(r["bit_identical"] for r in rows_out):
        raise SystemExit("sharded results differ from one GPU")


if __name__ == "__main__":
    main()
