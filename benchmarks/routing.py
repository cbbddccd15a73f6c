"""The fused routing benchmark of the routing issue, side by side in one process.

    python benchmarks/routing.py                 # 16384 tokens on GPU, 4096 on CPU
    python benchmarks/routing.py --tokens 8192 --dtype bfloat16 --out /tmp/results

For DeepSeek-V3, DeepSeek-V4, Qwen3-MoE, Mixtral and gpt-oss routing: the fused
``jax_topk.routing.route`` against the jitted pure-JAX composition built on
``lax.top_k`` (the way MaxText routes: scores, bias, grouped top-2 sums, group
top-k, mask, top-k, gather, renormalise, scale). The floor is the logits read
once and the weights and ids written once, at the copy bandwidth measured in
the same run. Writes ``<out>/<device>-routing.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_topk
from jax_topk import _bench
from jax_topk.routing import PRESETS, Preset

sys.path.insert(0, os.path.dirname(__file__))
import run  # noqa: E402  (plot, torch_copy_bandwidth)

# (name, preset, experts)
CONFIGS = (
    ("deepseek_v3", PRESETS["deepseek_v3"], 256),
    ("deepseek_v4", PRESETS["deepseek_v4"], 384),
    ("qwen3_moe", PRESETS["qwen3_moe"], 128),
    ("mixtral", PRESETS["mixtral"], 8),
    ("gpt_oss", PRESETS["gpt_oss"], 128),
)


@dataclasses.dataclass(frozen=True)
class RouteShape(_bench.Shape):
    @property
    def floor_bytes(self) -> int:
        """Logits read once; k float32 weights and k int32 ids per token written once."""
        return self.input_bytes + self.rows * self.k * 8


def maxtext_route(logits, bias, p: Preset):
    """The jitted pure-JAX composition over lax.top_k (what MaxText's router does)."""
    z = logits.astype(jnp.float32)
    if p.score == "softmax":
        s = jax.nn.softmax(z, axis=-1)
    elif p.score == "sigmoid":
        s = jax.nn.sigmoid(z)
    else:
        s = jnp.sqrt(jax.nn.softplus(z))
    c = s if bias is None else s + bias
    if p.n_groups:
        grouped = c.reshape(c.shape[:-1] + (p.n_groups, -1))
        group_scores = lax.top_k(grouped, 2)[0].sum(-1)
        _, best = lax.top_k(group_scores, p.top_groups)
        mask = jax.nn.one_hot(best, p.n_groups, dtype=jnp.bool_).any(-2)
        c = jnp.where(jnp.repeat(mask, c.shape[-1] // p.n_groups, axis=-1), c, -jnp.inf)
    _, ids = lax.top_k(c, p.k)
    w = jnp.take_along_axis(s, ids, axis=-1)
    if p.renormalize:
        w = w / w.sum(-1, keepdims=True)
    return w * p.scale, ids


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, help="tokens per call (default: 16384 on GPU, 4096 on CPU)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--configs", help="comma-separated subset of " + ",".join(c[0] for c in CONFIGS))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)
    wanted = set(args.configs.split(",")) if args.configs else {c[0] for c in CONFIGS}
    backend = jax.default_backend()
    tokens = args.tokens or (4096 if backend == "cpu" else 16384)
    bandwidth = run.torch_copy_bandwidth() if backend != "cpu" else None

    rows = []
    for name, preset, experts in CONFIGS:
        if name not in wanted:
            continue
        shape = RouteShape(tokens, experts, preset.k, args.dtype)
        bias = (jnp.asarray(np.random.default_rng(1).standard_normal(experts).astype(np.float32) * 0.1)
                if preset.uses_bias else None)
        contenders = {
            "jax_topk.route": lambda s, p=preset, b=bias: (lambda x: p(x, b)),
            "pure-JAX lax.top_k": lambda s, p=preset, b=bias: (lambda x: maxtext_route(x, b, p)),
        }
        print(f"{name}: {tokens} tokens x {experts} experts, k={preset.k}", file=sys.stderr)
        result = _bench.run_benchmark([shape], contenders, baseline="pure-JAX lax.top_k", ours="jax_topk.route",
                                      repeats=args.repeats, bandwidth=bandwidth)
        bandwidth = result["copy_bandwidth_GBps"] * 1e9
        rows.append(dict(result["rows"][0], config=name, label=f"{name}\n{tokens}x{experts} k={preset.k}"))

    result = dict(result, rows=rows, op="route")
    result["geomean_speedup"] = _bench.geomean([r["speedup"] for r in rows])
    result["min_speedup"] = min(r["speedup"] for r in rows)
    result["jax_topk"] = jax_topk.info()
    print(_bench.format_table(result))
    for r in rows:
        print(f"{r['config']:>12}: {r['speedup']:.1f}x faster than the composition, "
              f"{100 * r['floor_fraction']:.0f}% of the floor")
    stem = _bench.write_result(result, args.out, "-routing")
    print(f"wrote {stem}.json" + (f" and {stem}.png" if run.plot(result, stem + ".png") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
