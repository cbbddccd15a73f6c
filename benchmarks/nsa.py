"""The NSA issue's benchmark, side by side in one process.

    python benchmarks/nsa.py [--seqlens 8192,16384,32768,65536] [--heads 64] [--kv-heads 4]
                             [--dim 128] [--no-backward] [--plain] [--branches | --tune [--kernels ...]]
                             [--out benchmarks/results]

B=1 sequence of T tokens, bfloat16 q [1, T, Hq, D], k and v [1, T, Hkv, D],
gates from a sigmoid, the default ``NSAConfig`` (l=32, d=16, l'=64, n=16,
w=512). Contenders, each one jitted executable:
  - dense causal attention, ``jax.nn.dot_product_attention(is_causal=True)``
    (cuDNN on a GPU, XLA elsewhere),
  - ``jax_topk.nsa.nsa_attention``,
forward, and forward + backward (the gradient of <out, cotangent> with respect
to q, k and v); ``--plain`` adds ``nsa_attention`` on the plain-JAX path.
``--branches`` instead times each NSA piece alone (forward) as
``nsa_attention`` runs it (the kernels on a GPU), with ``--plain`` the
plain-JAX branches beside them. ``--tune`` (GPU) instead sweeps the Pallas
kernels' Triton launches (``_nsa_pallas.LAUNCH``) and writes
``<device>-nsa-tune-<T>.json``. Memory: the compiled executable's temporaries
(``memory_analysis().temp_size_in_bytes``), which must grow linearly in T for
NSA. Writes ``<out>/<device>-nsa.json`` and a plot beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys

import jax
import jax.numpy as jnp

from jax_topk import _bench, _nsa_cudnn, _nsa_dispatch, _nsa_pallas, nsa


def dense(q, k, v, gates):
    del gates
    implementation = "cudnn" if jax.default_backend() == "gpu" else None
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)


def sparse(cfg):
    return lambda q, k, v, gates: nsa.nsa_attention(q, k, v, gates, cfg)


def forward_backward(attention):
    """The gradient of <attention(q, k, v), cotangent> with respect to q, k, v."""

    def run(q, k, v, gates, cotangent):
        loss = lambda q, k, v: jnp.vdot(attention(q, k, v, gates).astype(jnp.float32), cotangent)
        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    return run


def temp_bytes(fn, args) -> int | None:
    """Bytes of temporaries the compiled executable allocates (None if unknown)."""
    analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
    return None if analysis is None else int(analysis.temp_size_in_bytes)


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's shape options (``inputs_for`` reads them), shared with
    ``profile_nsa.py`` and ``triton_registers.py``."""
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)


def inputs_for(t: int, args) -> tuple:
    key = jax.random.key(t)
    kq, kk, kv, kg, kc = jax.random.split(key, 5)
    dt = jnp.bfloat16
    q = jax.random.normal(kq, (1, t, args.heads, args.dim), dt)
    k = jax.random.normal(kk, (1, t, args.kv_heads, args.dim), dt)
    v = jax.random.normal(kv, (1, t, args.kv_heads, args.dim), dt)
    gates = jax.nn.sigmoid(jax.random.normal(kg, (1, t, args.heads, 3), jnp.float32)).astype(dt)
    cotangent = jax.random.normal(kc, (1, t, args.heads, args.dim), jnp.float32)
    return jax.block_until_ready((q, k, v, gates, cotangent))


def run_length(t: int, args, bar: _bench.Progress) -> dict:
    cfg = nsa.NSAConfig()
    x = inputs_for(t, args)
    contenders = {"dense causal": dense, "nsa_attention": sparse(cfg)}
    if args.plain:
        contenders["nsa_attention (plain JAX)"] = sparse(dataclasses.replace(cfg, implementation="xla"))
    row = {"T": t, "forward_us": {}, "forward_backward_us": {}, "temp_bytes": {}, "temp_bytes_backward": {},
           "clock": {}}
    for label, attention in contenders.items():
        bar.step(f"T={t}: {label}")
        fwd_args = x[:4]
        timed = _bench.measure(lambda a: attention(*a), [fwd_args], args.repeats)
        row["forward_us"][label], row["clock"][label] = timed.seconds * 1e6, timed.clock
        row["temp_bytes"][label] = temp_bytes(attention, fwd_args)
        if args.backward:
            step = forward_backward(attention)
            row["forward_backward_us"][label] = _bench.measure(lambda a: step(*a), [x], args.repeats).seconds * 1e6
            row["temp_bytes_backward"][label] = temp_bytes(step, x)
    row["speedup_forward"] = row["forward_us"]["dense causal"] / row["forward_us"]["nsa_attention"]
    if args.backward:
        row["speedup_forward_backward"] = (row["forward_backward_us"]["dense causal"]
                                           / row["forward_backward_us"]["nsa_attention"])
    return row


def kernel_inputs(q, k, v, cfg, interpret: bool) -> tuple:
    """What the kernels after the first read: ``(k_cmp, v_cmp, lse, block ids)``."""
    k_cmp, v_cmp = (x.astype(q.dtype) for x in nsa.compress_kv(k, v, cfg))
    _, lse = _nsa_pallas.compressed_attention(q, k_cmp, v_cmp, cfg=cfg, interpret=interpret)
    ids = _nsa_pallas.selection_ids(q, k_cmp, lse, cfg=cfg, interpret=interpret)
    return jax.block_until_ready((k_cmp, v_cmp, lse, ids))


def launch_sweep(t: int, args) -> list:
    """Microseconds of each Pallas kernel alone per Triton launch (``_nsa_pallas.LAUNCH``:
    num_warps, num_stages; for the compressed kernel also the rows per program, for the
    forced pass the tokens per program)."""
    cfg = nsa.NSAConfig()
    q, k, v, _, _ = inputs_for(t, args)
    k_cmp, v_cmp, lse, ids = kernel_inputs(q, k, v, cfg, interpret=False)
    _, selected, selected_lse = _nsa_pallas.selected_attention(q, k, v, ids, cfg=cfg, residuals=True)
    backward = (lambda a: _nsa_pallas.selected_attention_bwd(*a, cfg=cfg),
                (q, k, v, ids, selected, selected_lse, jnp.ones_like(selected)))
    forward = (lambda a: _nsa_pallas.selected_attention(*a, cfg=cfg), (q, k, v, ids))
    calls = {  # a branch's launches are swept one at a time, each timing the whole branch
        "compressed": (lambda a: _nsa_pallas.compressed_attention(*a, cfg=cfg), (q, k_cmp, v_cmp)),
        "block_scores": (lambda a: _nsa_pallas.selection_ids(*a, cfg=cfg), (q, k_cmp, lse)),
        "selected": forward,
        "selected_forced": forward,
        "selected_dq": backward,
        "selected_dkv": backward,
        "sum_segments": backward,
    }
    assert set(calls) == set(_nsa_pallas.LAUNCH), "every Triton launch has its sweep"
    if args.kernels:
        calls = {name: calls[name] for name in args.kernels.split(",")}
    # Each kernel's program size, swept beside its launch: the compressed kernel's query rows and
    # the forced pass's tokens (module constants of _nsa_pallas, read when a call is traced).
    sizes = {"compressed": ("_COMPRESSED_ROWS", (64, 128)), "selected_forced": ("_FORCED_TOKENS", (2, 4, 8))}
    # (num_warps, num_stages) options: the walk's wide; every other kernel's from 1 stage (the forced
    # pass's slots in a loop hold one K and V tile at a time, so a stage more costs shared memory).
    options, other_options = {"selected": ((2, 4, 8), (2, 3, 4))}, ((4, 8), (1, 2, 3))
    default_launch = dict(_nsa_pallas.LAUNCH)
    defaults = {name: getattr(_nsa_pallas, name) for name, _ in sizes.values()}
    rows = []
    for kernel, (op, x) in calls.items():
        size_name, size_options = sizes.get(kernel, (None, (None,)))
        warp_options, stage_options = options.get(kernel, other_options)
        for warps, stages, size in itertools.product(warp_options, stage_options, size_options):
            _nsa_pallas.LAUNCH[kernel] = (warps, stages)
            if size_name:
                setattr(_nsa_pallas, size_name, size)
            jax.clear_caches()  # the launch is read when a call is traced
            try:
                us = _bench.measure(op, [x], args.repeats).seconds * 1e6
            except Exception as e:  # a launch Triton cannot compile (shared memory, registers)
                us = f"failed: {type(e).__name__}: {str(e)[:160]}"
            rows.append({"kernel": kernel, "num_warps": warps, "num_stages": stages,
                         "rows": _nsa_pallas._COMPRESSED_ROWS, "tokens": _nsa_pallas._FORCED_TOKENS, "us": us})
            print(rows[-1], flush=True)
        _nsa_pallas.LAUNCH.update(default_launch)
        for name, value in defaults.items():
            setattr(_nsa_pallas, name, value)
    jax.clear_caches()
    return rows


def forced_pass(q, k, v, ids, cfg, interpret: bool):
    """The selected branch's forced-block pass alone (``_nsa_pallas._forced_attention``),
    on the operands ``selected_attention`` gives it."""
    _, _, padded_ids, k, v, grouped = _nsa_pallas._selected_layout(q, k, v, ids, cfg.select_size)
    scale = _nsa_pallas._score_scale(cfg.softmax_scale(q.shape[-1]))
    return _nsa_pallas._forced_attention(padded_ids, grouped(q), k, v, cfg=cfg, tokens=_nsa_pallas.forced_tokens(cfg),
                                         scale=scale, interpret=interpret)


def branch_breakdown(t: int, args) -> dict:
    """Forward time of each NSA piece alone at length t (microseconds): what
    ``nsa_attention`` runs here (``_nsa_dispatch.plan``), and with ``--plain``
    the plain-JAX branches beside it."""
    cfg = nsa.NSAConfig()
    plain = dataclasses.replace(cfg, implementation="xla")
    q, k, v, _, _ = inputs_for(t, args)
    interpret = jax.default_backend() != "gpu"
    k_cmp, v_cmp, lse, ids = kernel_inputs(q, k, v, cfg, interpret)
    pieces = {
        "compress_kv": (lambda a: nsa.compress_kv(a[1], a[2], cfg), (q, k, v)),
        "compressed (kernel, + log-sum-exp)": (
            lambda a: _nsa_pallas.compressed_attention(*a, cfg=cfg, interpret=interpret), (q, k_cmp, v_cmp)),
        "compressed (cuDNN, shifted queries, + log-sum-exp)": (  # in cuDNN's layout, as nsa_attention runs it
            lambda a: _nsa_cudnn.compressed_rows(*a, cfg, lse_length=lse.shape[1]), (q, k_cmp, v_cmp)),
        "block scores + select (Pallas kernel + top_k)": (
            lambda a: _nsa_pallas.selection_ids(*a, cfg=cfg, interpret=interpret), (q, k_cmp, lse)),
        "block scores + select (CUDA kernel + top_k)": (  # "unavailable: ..." where the kernel is not
            lambda a: _nsa_pallas.selection_ids(*a, cfg=cfg, native=True), (q, k_cmp, lse)),
        "selected (dispatched)": (lambda a: nsa.selected_attention(*a, cfg), (q, k, v, ids)),
        "selected: its forced-block pass alone": (lambda a: forced_pass(*a, cfg, interpret), (q, k, v, ids)),
        "window (dispatched)": (lambda a: nsa.sliding_window_attention(*a, cfg), (q, k, v)),
    }
    if args.plain:
        pieces.update({
            "compressed_attention (plain)": (lambda a: nsa.compressed_attention(*a, cfg), (q, k_cmp, v_cmp)),
            "block_scores + select_blocks (plain)": (
                lambda a: nsa.select_blocks(nsa.block_scores(a[0], a[1], cfg), cfg), (q, k_cmp)),
            "selected (plain)": (lambda a: nsa.selected_attention(*a, plain), (q, k, v, ids)),
            "window (plain)": (lambda a: nsa.sliding_window_attention(*a, plain), (q, k, v)),
        })
    times = {}
    for label, (op, x) in pieces.items():
        try:
            times[label] = _bench.measure(op, [x], args.repeats).seconds * 1e6
        except Exception as e:  # an implementation this backend lacks: say so, time the rest
            times[label] = f"unavailable: {type(e).__name__}: {str(e)[:200]}"
    return {"T": t, "forward_us": times}


def describe_run(args, rows: list) -> dict:
    """The result file: device, shapes, configuration and the measured rows."""
    return {"device": _bench.device_name(), "backend": jax.default_backend(), "jax": jax.__version__,
            "heads": args.heads, "kv_heads": args.kv_heads, "dim": args.dim, "dtype": "bfloat16",
            "config": dataclasses.asdict(nsa.NSAConfig()), "repeats": args.repeats,
            "plan": dataclasses.asdict(_nsa_dispatch.plan(nsa.NSAConfig(), (1, 1, args.heads, args.dim), jnp.bfloat16,
                                                         args.kv_heads, "benchmark")),
            "rows": rows}


def plot(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = result["rows"]
    ts = [r["T"] for r in rows]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    for label in rows[0]["forward_us"]:
        ax_t.plot(ts, [r["forward_us"][label] / 1e3 for r in rows], "o-", label=f"{label}, forward")
        if rows[0]["forward_backward_us"]:
            ax_t.plot(ts, [r["forward_backward_us"][label] / 1e3 for r in rows], "s--", label=f"{label}, fwd+bwd")
        mem = [r["temp_bytes"][label] for r in rows]
        if all(m is not None for m in mem):
            ax_m.plot(ts, [m / 2**20 for m in mem], "o-", label=f"{label}, forward")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_ylabel("ms")
    ax_m.set_ylabel("temporaries (MiB)")
    fig.suptitle(f"NSA vs dense causal attention, {result['device']} (Hq={result['heads']}, "
                 f"Hkv={result['kv_heads']}, D={result['dim']}, bfloat16)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlens", default="8192,16384,32768,65536")
    add_shape_arguments(parser)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-backward", dest="backward", action="store_false")
    parser.add_argument("--branches", action="store_true", help="time each NSA branch alone instead")
    parser.add_argument("--plain", action="store_true", help="also time the plain-JAX path (implementation='xla')")
    parser.add_argument("--tune", action="store_true", help="sweep the kernels' Triton launches instead (GPU)")
    parser.add_argument("--kernels", default="", help="--tune only these (comma-separated _nsa_pallas.LAUNCH keys)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)
    seqlens = [int(s) for s in args.seqlens.split(",")]
    if args.tune:
        if jax.default_backend() != "gpu":
            parser.error("--tune sweeps Triton launches: it needs a GPU")
        for t in seqlens:
            result = {"device": _bench.device_name(), "jax": jax.__version__, "seqlen": t,
                      "rows": launch_sweep(t, args)}
            print(f"wrote {_bench.write_result(result, args.out, f'-nsa-tune-{t}')}.json")
        return 0
    if args.branches:
        rows = [branch_breakdown(t, args) for t in seqlens]
        for r in rows:
            print(f"T={r['T']}: " + "; ".join(
                f"{k} {v / 1e3:.2f} ms" if isinstance(v, float) else f"{k} {v}" for k, v in r["forward_us"].items()))
        print(f"wrote {_bench.write_result(describe_run(args, rows), args.out, '-nsa-branches')}.json")
        return 0
    bar = _bench.Progress((3 if args.plain else 2) * len(seqlens))
    rows = []
    for t in seqlens:
        rows.append(run_length(t, args, bar))
        r = rows[-1]
        line = ", ".join(f"{k} {v / 1e3:.2f} ms" for k, v in r["forward_us"].items())
        print(f"T={t}: forward {line}; NSA {r['speedup_forward']:.2f}x"
              + (f"; fwd+bwd NSA {r['speedup_forward_backward']:.2f}x" if args.backward else "")
              + f"; temporaries {', '.join(f'{k} {v / 2**20:.0f} MiB' for k, v in r['temp_bytes'].items() if v)}",
              flush=True)
    bar.close()
    result = describe_run(args, rows)
    path = _bench.write_result(result, args.out, "-nsa")
    plot(result, path + ".png")
    print(f"wrote {path}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
