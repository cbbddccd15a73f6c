"""The indexer issue's benchmark, side by side in one process.

    python benchmarks/indexer.py [--batch 31] [--heads 64] [--dim 128] [--k 2048] [--out benchmarks/results]

B items of bfloat16 queries [H, D] and keys [N_b, D] (N_b uniform in 2000..8000,
then in 32768..65536; seed 0), float32 weights [H]; the top k of
``sum_h w[h] * relu(q[h] . keys[s])`` per item. Contenders, each one jitted
executable:
  - the per-item loop of jnp ops + ``lax.top_k`` (B einsums, B top-ks),
  - single jnp compositions on the padded batch (einsum, relu, weighted sum,
    mask, ``lax.top_k``), with float32 dots and with bfloat16 dots (the best
    one is the baseline),
  - one ``jax_topk.indexer_top_k(..., lengths=)`` call.
Then k << N (``--small-k``, default 64 and 256, keys 32768..65536): the padded
compositions against the call as by default (there: unfused) and fused
(``fusion="fused"``: each block keeps the k best of its keys, and the [B, N]
scores never reach memory), with each path's workspace; the per-item loop is
left out.
Then causal prefill (``--prefill T``, default 8192; 0: none): T queries against
the sequence's own T keys (shared, ``causal=True``), k = ``--k``, against the
masked jnp composition (bfloat16 dots) run over chunks of 1024 queries under
``lax.map`` (all T at once would hold [T, H, T] dots).
Writes ``<out>/<device>-indexer.json``.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

import jax_topk
from jax_topk import _bench


def contenders(lengths: np.ndarray, k: int, *, small_k: bool) -> dict:
    batch = len(lengths)
    lengths_dev = jnp.asarray(lengths)

    def per_item(args):
        q, keys, w = args
        out = []
        for b in range(batch):
            dots = jnp.einsum("hd,nd->hn", q[b], keys[b, : int(lengths[b])], preferred_element_type=jnp.float32)
            s = (w[b][:, None] * jnp.maximum(dots, 0.0)).sum(0)
            out.append(lax.top_k(s, min(k, int(lengths[b]))))
        return out

    def padded(dot_dtype):
        def run(args):
            q, keys, w = args
            dots = jnp.einsum("bhd,bnd->bhn", q, keys, preferred_element_type=dot_dtype)
            s = jnp.einsum("bh,bhn->bn", w, jnp.maximum(dots, 0).astype(jnp.float32))
            s = jnp.where(jnp.arange(keys.shape[1])[None, :] < lengths_dev[:, None], s, -jnp.inf)
            return lax.top_k(s, k)
        return run

    ops = {} if small_k else {"per-item loop (jnp + lax.top_k)": per_item}
    ops.update({
        "padded composition, float32 dots": padded(jnp.float32),
        "padded composition, bfloat16 dots": padded(jnp.bfloat16),
        "jax_topk.indexer_top_k": lambda a: jax_topk.indexer_top_k(*a, k, lengths=lengths_dev),
    })
    if small_k:
        ops["jax_topk.indexer_top_k fused"] = lambda a: jax_topk.indexer_top_k(
            *a, k, lengths=lengths_dev, fusion="fused")
    return ops


def time_contenders(name: str, ops: dict, inputs, repeats: int) -> tuple[dict, dict, dict]:
    """Each contender over the same inputs: us per op (device clock where there
    is one), us per op by the host's wall clock, and which clock the first is."""
    bar = _bench.Progress(len(ops))
    times, wall, clocks = {}, {}, {}
    for label, op in ops.items():
        bar.step(f"{name}: {label}")
        m = _bench.measure(op, inputs, repeats)
        times[label], wall[label], clocks[label] = m.seconds * 1e6, m.wall_seconds * 1e6, m.clock
    bar.close()
    return times, wall, clocks


def path_of(batch: int, args, n: int, k: int, fusion: str = "auto") -> dict | None:
    """How a call of ``batch`` items (``args``: heads, dim) runs on the GPU (None elsewhere)."""
    if jax.default_backend() != "gpu":
        return None
    from jax_topk import _registry
    return _registry.indexer_plan("cuda", "bfloat16", batch, args.heads, n, args.dim, k, fusion)


def run_case(name: str, lo: int, hi: int, k: int, args, rng, *, small_k: bool = False) -> dict:
    lengths = rng.integers(lo, hi + 1, size=args.batch).astype(np.int32)
    n = int(lengths.max())
    bf16 = ml_dtypes.bfloat16
    replicas = 2
    inputs = []
    for _ in range(replicas):
        q = rng.standard_normal((args.batch, args.heads, args.dim)).astype(bf16)
        keys = rng.standard_normal((args.batch, n, args.dim)).astype(bf16)
        w = rng.random((args.batch, args.heads)).astype(np.float32)
        inputs.append(tuple(jax.device_put(a) for a in (q, keys, w)))
    times, wall, clocks = time_contenders(name, contenders(lengths, k, small_k=small_k), inputs, args.repeats)
    ours = times["jax_topk.indexer_top_k"]
    best = min(v for key, v in times.items() if key.startswith("padded"))
    result = {"case": name, "k": k, "lengths": lengths.tolist(), "n_padded": n, "path": path_of(args.batch, args, n, k),
              "times_us": times, "wall_us": wall, "clock": clocks, "speedup_vs_best_composition": best / ours}
    if not small_k:
        result["speedup_vs_per_item_loop"] = times["per-item loop (jnp + lax.top_k)"] / ours
    else:
        result["fused_path"] = path_of(args.batch, args, n, k, "fused")
        result["fused_time_over_default"] = times["jax_topk.indexer_top_k fused"] / ours
    print(f"-- {name} (B={args.batch}, H={args.heads}, D={args.dim}, k={k}, bfloat16, padded N={n}, "
          f"path {result['path']})")
    for label, t in times.items():
        print(f"{label:>36}: {t:9.1f} us {clocks[label]}, {wall[label]:9.1f} us wall")
    if small_k:
        print(f"indexer_top_k: fused takes {result['fused_time_over_default']:.2f}x the default's time "
              f"(workspace {result['fused_path'] and result['fused_path']['workspace_bytes']} bytes against "
              f"{result['path'] and result['path']['workspace_bytes']})")
    else:
        print(f"indexer_top_k: {result['speedup_vs_per_item_loop']:.1f}x the per-item loop")
    print(f"indexer_top_k: {result['speedup_vs_best_composition']:.2f}x the best single composition")
    return result


def run_prefill(t: int, k: int, args, rng) -> dict:
    """Causal prefill: T queries over their sequence's T keys."""
    bf16 = ml_dtypes.bfloat16
    chunk = min(1024, t)
    inputs = []
    for _ in range(2):
        q = rng.standard_normal((t, args.heads, args.dim)).astype(bf16)
        keys = rng.standard_normal((t, args.dim)).astype(bf16)
        w = rng.random((t, args.heads)).astype(np.float32)
        inputs.append(tuple(jax.device_put(a) for a in (q, keys, w)))

    def composition(a):
        q, keys, w = a

        def one(c):
            qc, wc, first = c
            dots = jnp.einsum("bhd,nd->bhn", qc, keys, preferred_element_type=jnp.bfloat16)
            s = jnp.einsum("bh,bhn->bn", wc, jnp.maximum(dots, 0).astype(jnp.float32))
            pos = first + jnp.arange(chunk)
            s = jnp.where(jnp.arange(t)[None, :] <= pos[:, None], s, -jnp.inf)
            return lax.top_k(s, k)

        firsts = jnp.arange(0, t, chunk)
        vals, ids = lax.map(one, (q.reshape(-1, chunk, *q.shape[1:]), w.reshape(-1, chunk, w.shape[1]), firsts))
        return vals.reshape(t, k), ids.reshape(t, k)

    ops = {"padded composition, bfloat16 dots": composition,
           "jax_topk.indexer_top_k": lambda a: jax_topk.indexer_top_k(*a, k, causal=True)}
    times, wall, clocks = time_contenders(f"prefill {t}", ops, inputs, args.repeats)
    ours = times["jax_topk.indexer_top_k"]
    result = {"case": f"causal prefill, T = N = {t} (keys shared)", "k": k, "lengths": None, "n_padded": t,
              "path": path_of(t, args, t, k), "times_us": times,
              "wall_us": wall, "clock": clocks,
              "speedup_vs_best_composition": times["padded composition, bfloat16 dots"] / ours}
    print(f"-- causal prefill T={t} (H={args.heads}, D={args.dim}, k={k}, bfloat16)")
    for label, v in times.items():
        print(f"{label:>36}: {v:9.1f} us {clocks[label]}, {wall[label]:9.1f} us wall")
    print(f"indexer_top_k: {result['speedup_vs_best_composition']:.2f}x the chunked composition")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=31)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--small-k", default="64,256", help="k of the k << N cases (comma-separated; empty: none)")
    parser.add_argument("--prefill", type=int, default=8192, help="T of the causal prefill case (0: none)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    cases = [run_case("lengths 2000..8000", 2000, 8000, args.k, args, rng),
             run_case("lengths 32768..65536", 32768, 65536, args.k, args, rng)]
    for k in [int(v) for v in args.small_k.split(",") if v]:
        cases.append(run_case(f"lengths 32768..65536, k={k}", 32768, 65536, k, args, rng, small_k=True))
    if args.prefill:
        cases.append(run_prefill(args.prefill, args.k, args, rng))
    result = {"device": _bench.device_name(), "backend": jax.default_backend(), "jax": jax.__version__,
              "batch": args.batch, "heads": args.heads, "dim": args.dim, "k": args.k, "dtype": "bfloat16",
              "repeats": args.repeats, "cases": cases}
    print(f"wrote {_bench.write_result(result, args.out, '-indexer')}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
