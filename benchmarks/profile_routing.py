"""Runs each routing benchmark config a few times, for a profiler to time the
fused kernel alone (e.g. `ncu -k regex:route_ --metrics gpu__time_duration.sum`).

    python benchmarks/profile_routing.py [--tokens 16384] [--calls 3]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from routing import CONFIGS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for name, preset, experts in CONFIGS:
        z = jnp.asarray(rng.standard_normal((args.tokens, experts)).astype(np.float32))
        bias = jnp.asarray(rng.standard_normal(experts).astype(np.float32) * 0.1) if preset.uses_bias else None
        fn = jax.jit(lambda z, p=preset, b=bias: p(z, b))
        for _ in range(args.calls):
            jax.block_until_ready(fn(z))
        print(name, "done", flush=True)


if __name__ == "__main__":
    main()
