"""Runs indexer_top_k on a batch of bfloat16 keys a few times per k, for a
profiler to time each kernel alone (the score kernel, then the top-k's), e.g.

    ncu --metrics gpu__time_duration.sum python benchmarks/profile_indexer.py \
        [--batch 31 --lo 32768 --hi 65536] [--ks 64,2048] [--calls 1] [--top-k]

--top-k also runs jax_topk.top_k on a random float32 [B, N] matrix with the
same lengths, per k: the top-k of the indexer's scores alone.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import jax_topk


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=31)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--lo", type=int, default=32768)
    parser.add_argument("--hi", type=int, default=65536)
    parser.add_argument("--ks", default="64,2048")
    parser.add_argument("--top-k", action="store_true")
    parser.add_argument("--calls", type=int, default=2)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lengths = rng.integers(args.lo, args.hi + 1, size=args.batch).astype(np.int32)
    n = int(lengths.max())
    bf16 = ml_dtypes.bfloat16
    q = jnp.asarray(rng.standard_normal((args.batch, args.heads, args.dim)).astype(bf16))
    keys = jax.random.normal(jax.random.key(0), (args.batch, n, args.dim), jnp.bfloat16)
    w = jnp.asarray(rng.random((args.batch, args.heads)).astype(np.float32))
    for k in map(int, args.ks.split(",")):
        fn = jax.jit(lambda q, keys, w, k=k: jax_topk.indexer_top_k(q, keys, w, k, lengths=jnp.asarray(lengths)))
        for _ in range(args.calls):
            jax.block_until_ready(fn(q, keys, w))
        print(f"k={k} done", flush=True)
        if args.top_k:
            scores = jnp.asarray(rng.standard_normal((args.batch, n)).astype(np.float32))
            top = jax.jit(lambda s, k=k: jax_topk.top_k(s, k, lengths=jnp.asarray(lengths)))
            for _ in range(args.calls):
                jax.block_until_ready(top(scores))


if __name__ == "__main__":
    main()
