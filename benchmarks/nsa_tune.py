"""Sweeps the Triton launch parameters of the NSA kernels (``_nsa_pallas.LAUNCH``
and the compressed kernel's rows per program) at one length, forward alone.

    python benchmarks/nsa_tune.py [--seqlen 65536] [--out benchmarks/results]

bfloat16, B=1, Hq=64, Hkv=4, D=128, the default NSAConfig (the NSA issue's
shape). Prints and writes ``<out>/<device>-nsa-tune-<T>.json``: microseconds per
(kernel, num_warps, num_stages[, rows]).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import jax
import jax.numpy as jnp

from jax_topk import _bench, _nsa_pallas, nsa


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlen", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)
    cfg, t = nsa.NSAConfig(), args.seqlen
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (1, t, 64, 128), jnp.bfloat16)
    k = jax.random.normal(kk, (1, t, 4, 128), jnp.bfloat16)
    v = jax.random.normal(kv, (1, t, 4, 128), jnp.bfloat16)
    k_cmp, v_cmp = (x.astype(q.dtype) for x in nsa.compress_kv(k, v, cfg))
    _, lse = _nsa_pallas.compressed_attention(q, k_cmp, v_cmp, cfg=cfg)
    ids = jax.block_until_ready(_nsa_pallas.selection_ids(q, k_cmp, lse, cfg=cfg))
    calls = {
        "compressed": (lambda a: _nsa_pallas.compressed_attention(*a, cfg=cfg), (q, k_cmp, v_cmp)),
        "block_scores": (lambda a: _nsa_pallas.selection_ids(*a, cfg=cfg), (q, k_cmp, lse)),
        "selected": (lambda a: _nsa_pallas.selected_attention(*a, cfg=cfg), (q, k, v, ids)),
    }
    default_launch, default_rows = dict(_nsa_pallas.LAUNCH), _nsa_pallas._COMPRESSED_ROWS
    rows = []
    for kernel, (op, x) in calls.items():
        row_options = (64, 128) if kernel == "compressed" else (default_rows,)
        warp_options, stage_options = ((2, 4, 8), (2, 3, 4)) if kernel == "selected" else ((4, 8), (1, 2, 3))
        for warps, stages, per_program in itertools.product(warp_options, stage_options, row_options):
            _nsa_pallas.LAUNCH[kernel] = (warps, stages)
            _nsa_pallas._COMPRESSED_ROWS = per_program
            jax.clear_caches()
            try:
                us = _bench.measure(op, [x], args.repeats).seconds * 1e6
            except Exception as e:  # a launch Triton cannot compile (shared memory, registers)
                us = f"failed: {type(e).__name__}: {str(e)[:160]}"
            rows.append({"kernel": kernel, "num_warps": warps, "num_stages": stages, "rows": per_program, "us": us})
            print(rows[-1], flush=True)
        _nsa_pallas.LAUNCH.update(default_launch)
        _nsa_pallas._COMPRESSED_ROWS = default_rows
    result = {"device": _bench.device_name(), "jax": jax.__version__, "seqlen": t, "rows": rows}
    print(f"wrote {_bench.write_result(result, args.out, f'-nsa-tune-{t}')}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
