"""Per-call cost of jax_topk.top_k inside one jitted executable: times
executables that apply the op to R = 1, 4, 16 distinct inputs and fits
time = fixed + R * per_op. A large intercept or a per-op time far above the
kernel's own (csrc/cuda/tests/topk_selftest --bench) means host-side launch
cost, e.g. a custom call that is not captured into XLA's command buffers.

    python benchmarks/call_overhead.py [--shape 16384x64:2]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

import jax_topk
from jax_topk import _bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default="16384x64:2,16384x256:8,4096x2048:16,1024x8192:256")
    args = parser.parse_args()
    for shape in _bench.parse_shapes(args.shapes):
        for name, op in (("jax_topk", lambda x, k=shape.k: jax_topk.top_k(x, k)),
                         ("lax", lambda x, k=shape.k: jax.lax.top_k(x, k))):
            rs, ts = [1, 4, 16], []
            for r in rs:
                inputs = _bench.make_inputs(shape, r)
                ts.append(_bench.measure(op, inputs, repeats=20, device_clock=False).wall_seconds * r * 1e6)
            per_op, fixed = np.polyfit(rs, ts, 1)
            print(f"{str(shape):<18} {name:<9} total us for R=1,4,16: {', '.join(f'{t:.1f}' for t in ts)}"
                  f"  -> per op {per_op:.1f} us, fixed {fixed:.1f} us", flush=True)


if __name__ == "__main__":
    main()
