"""The ragged case of the sort-and-ragged issue, side by side in one process.

    python benchmarks/ragged.py [--rows 31] [--k 512] [--out benchmarks/results]
                                [--only "lax.top_k padded"] [--width 8000]

A batch of rows of different lengths (uniform in 2000..8000, seed 0), top-k of
each: a per-row loop of ``lax.top_k`` (one op per row, all in one jitted
executable), one ``lax.top_k`` over the rows padded with -inf, and one
``jax_topk.top_k(..., lengths=)`` call (and ``jax_topk.ragged_top_k`` on the
list, which pads too). All give the same values and indices. Writes
``<out>/<device>-ragged.json``. ``--width`` pads the batch wider than its
longest row (the issue's case is padded to the longest, 7825 at seed 0, so
three rows in four start off a 16-byte boundary; 7828 or 8000 aligns them).
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_topk
from jax_topk import _bench

OURS = "jax_topk.top_k lengths"  # always timed: every ratio is against it
# The ratios: result key, the contender it compares with, and how it is printed.
SPEEDUPS = (
    ("speedup_vs_per_row_loop", "lax.top_k per row", "{:.0f}x faster than the per-row loop"),
    ("speedup_vs_padded_lax", "lax.top_k padded", "{:.1f}x faster than one padded lax.top_k"),
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=_bench.RAGGED_ROWS)
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="time only these contenders (default: all; the lengths= call is always timed)")
    parser.add_argument("--width", type=int, help="columns of the padded batch (default: its longest row)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)
    # Replicas for the longest possible row (the same count as for the drawn one here).
    replicas = _bench.replicas_for(_bench.Shape(args.rows, _bench.RAGGED_LENGTHS[1], args.k), jax.default_backend())
    batch = _bench.make_ragged_batch(args.rows, replicas, width=args.width)
    lengths, inputs = batch.lengths, batch.inputs
    lengths_dev = jnp.asarray(lengths)
    k = args.k
    contenders = {
        "lax.top_k per row": lambda x: [lax.top_k(x[r, : int(lengths[r])], k) for r in range(args.rows)],
        "lax.top_k padded": lambda x: lax.top_k(x, k),
        OURS: lambda x: jax_topk.top_k(x, k, lengths=lengths_dev),
        "jax_topk.ragged_top_k": lambda x: jax_topk.ragged_top_k([x[r, : int(lengths[r])] for r in range(args.rows)], k),
    }
    if args.only:
        unknown = sorted(set(args.only) - set(contenders))
        if unknown:
            parser.error(f"--only: unknown contenders {unknown}; known: {sorted(contenders)}")
        contenders = {name: op for name, op in contenders.items()
                      if name in args.only or name == OURS}
    # Same answer from each (on the first input).
    want_v, want_i = lax.top_k(inputs[0], k)
    got_v, got_i = contenders[OURS](inputs[0])
    assert np.array_equal(np.asarray(want_i), np.asarray(got_i)) and np.array_equal(np.asarray(want_v), np.asarray(got_v))
    # The per-row contenders are 31 ops per input: a few replicas keep their
    # executables small enough to compile (each one is milliseconds anyway).
    per_row = ("lax.top_k per row", "jax_topk.ragged_top_k")
    bar = _bench.Progress(len(contenders))
    times, wall, clocks = {}, {}, {}
    for name, op in contenders.items():
        bar.step(name)
        t = _bench.measure(op, inputs[:4] if name in per_row else inputs, args.repeats)
        times[name], wall[name], clocks[name] = t.seconds * 1e6, t.wall_seconds * 1e6, t.clock
    bar.close()
    ours = times[OURS]
    result = {
        "device": _bench.device_name(), "backend": jax.default_backend(), "jax": jax.__version__,
        "rows": args.rows, "width": int(inputs[0].shape[1]), "k": k, "lengths": lengths.tolist(),
        "replicas": replicas, "repeats": args.repeats,
        "times_us": times, "wall_us": wall, "clock": clocks,
    }
    for key, name, _ in SPEEDUPS:
        if name in times:
            result[key] = times[name] / ours
    for name, t in times.items():
        print(f"{name:>24}: {t:9.1f} us {clocks[name]}, {wall[name]:9.1f} us wall   ({t / ours:6.1f}x the lengths= call)")
    for key, _, said in SPEEDUPS:
        if key in result:
            print("one top_k(..., lengths=) call: " + said.format(result[key]))
    print(f"wrote {_bench.write_result(result, args.out, '-ragged')}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
