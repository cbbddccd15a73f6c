"""Runs NSA's selected-branch kernels a few times at one length, for a
profiler to see each alone: the forced-block pass (``_forced_kernel``), then
the whole selected kernel (the pass again, then the walk, ``_selected_kernel``),
on select-like block ids (the forced blocks first, as ``select`` puts them,
then random blocks at or before each token's own). E.g. on the GPU:

    ncu --kernel-name regex:"forced|selected" --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python benchmarks/profile_nsa.py [--seqlen 65536] [--calls 2]

(the launch order is pass, pass, walk per call: skipping 2 profiles the first
call's walk and the second call's pass). B=1, Hq=64, Hkv=4, D=128, bfloat16,
the inputs of ``benchmarks/nsa.py`` and its forced pass alone; off the GPU the kernels run in Pallas's interpreter
(small --seqlen only).
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

from jax_topk import _nsa_pallas as kernels
from jax_topk import nsa

sys.path.insert(0, os.path.dirname(__file__))
import nsa as nsa_benchmark  # noqa: E402  (benchmarks/nsa.py: its shapes, inputs and forced pass alone)


def select_like_ids(cfg: nsa.NSAConfig, length: int, kv_heads: int, key) -> jax.Array:
    """``[1, length, kv_heads, n]`` int32: each token's forced blocks in
    ``select``'s order, then random blocks no later than its own."""
    own = jnp.arange(length, dtype=jnp.int32) // cfg.select_size
    num_forced = cfg.initial_blocks + cfg.local_blocks
    forced = jnp.stack([kernels._forced_slot(cfg, slot, own) for slot in range(num_forced)], -1)
    free = jax.random.randint(key, (length, kv_heads, cfg.num_selected - num_forced), 0, 1 << 30)
    free = free % (own[:, None, None] + 1)
    ids = jnp.concatenate([jnp.broadcast_to(forced[:, None, :], (length, kv_heads, num_forced)), free], -1)
    return ids[None].astype(jnp.int32)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=65536)
    nsa_benchmark.add_shape_arguments(parser)
    parser.add_argument("--calls", type=int, default=2)
    args = parser.parse_args()
    cfg = nsa.NSAConfig()
    interpret = jax.default_backend() != "gpu"
    q, k, v, _, _ = nsa_benchmark.inputs_for(args.seqlen, args)
    ids = select_like_ids(cfg, args.seqlen, args.kv_heads, jax.random.key(0))
    forced_pass = jax.jit(lambda q, k, v, ids: nsa_benchmark.forced_pass(q, k, v, ids, cfg, interpret))
    selected = jax.jit(lambda q, k, v, ids: kernels.selected_attention(q, k, v, ids, cfg=cfg, interpret=interpret))
    for _ in range(args.calls):
        jax.block_until_ready(forced_pass(q, k, v, ids))
        jax.block_until_ready(selected(q, k, v, ids))
    print(f"T={args.seqlen}: {args.calls} calls of the forced pass and of the selected kernel done", flush=True)


if __name__ == "__main__":
    main()
