"""Registers, spills and shared memory of NSA's Pallas (Triton) kernels, on a
machine without a GPU.

Lowers the kernels for CUDA here (as ``tests/test_nsa.py``'s verifier test
does), compiles each Triton module with the ``triton`` package for sm_90 at
the launch the lowering names (``_nsa_pallas.LAUNCH``: num_warps,
num_stages), and reads ``ptxas -v``. The ``triton`` package is not the Triton
inside jaxlib's CUDA plugin, so the figures are not the GPU's: compare
variants with it, then measure the one worth it on the GPU. Against ncu on an
H200 (jax 0.11.2, forty-fourth session) at 64K: the forced-block pass 255
registers here (76 bytes spilled) against 246 there, the walk 80 against 96;
shared memory the same (71680 bytes for the walk).

    pip install --target /tmp/triton triton==3.5.0     # once (no GPU needed)
    python benchmarks/triton_registers.py --triton-path /tmp/triton \\
        [--seqlen 1024] [--launch selected_forced=8,2] [--backward]

``--launch KEY=WARPS,STAGES`` overrides a ``LAUNCH`` entry first.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
from jax._src.pallas.triton import lowering

from jax_topk import _nsa_pallas, nsa

sys.path.insert(0, os.path.dirname(__file__))
import nsa as nsa_benchmark  # noqa: E402  (benchmarks/nsa.py: its shape options)


def lowered_kernels(fn, *arguments) -> list[tuple[str, str, int, int]]:
    """``(name, Triton module text, num_warps, num_stages)`` of each Pallas
    kernel that lowering ``fn`` for CUDA produces, in launch order."""
    modules = []
    lower_module = lowering.lower_jaxpr_to_triton_module

    def keep(*args, **kwargs):
        result = lower_module(*args, **kwargs)
        modules.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    lowering.lower_jaxpr_to_triton_module = keep
    jax.clear_caches()  # lower anew: jit-decorated kernels reuse earlier lowerings (and LAUNCH as it was)
    try:
        with jax.enable_x64(False):
            text = jax.jit(fn).trace(*arguments).lower(lowering_platforms=("cuda",)).as_text()
    finally:
        lowering.lower_jaxpr_to_triton_module = lower_module
    # The custom calls' backend configs name each kernel and its launch, in the modules' order.
    launches = re.findall(r'name = "([^"]*)", num_stages = (\d+) : i32, num_warps = (\d+) : i32', text)
    if len(launches) != len(modules):
        raise RuntimeError(f"{len(modules)} Triton modules but {len(launches)} launches in the lowered text")
    return [(name, module, int(warps), int(stages)) for module, (name, stages, warps) in zip(modules, launches)]


def registers(module: str, num_warps: int, num_stages: int) -> dict:
    """What ptxas reports for ``module`` compiled by the ``triton`` package for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget

    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "kernel.ttir"
        source.write_text(module)
        compiled = triton.compile(str(source), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": num_warps, "num_stages": num_stages})
        ptx = Path(scratch) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
        report = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(ptx), "-o", str(Path(scratch) / "k.o")],
                                capture_output=True, text=True, check=True).stderr
    found = lambda pattern: int(re.search(pattern, report).group(1))
    return {"registers": found(r"Used (\d+) registers"), "spill_bytes": found(r"(\d+) bytes spill stores"),
            "shared_bytes": compiled.metadata.shared}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=1024)
    nsa_benchmark.add_shape_arguments(parser)
    parser.add_argument("--launch", action="append", default=[], help="KEY=WARPS,STAGES over _nsa_pallas.LAUNCH")
    parser.add_argument("--backward", action="store_true", help="the selected branch's backward kernels too")
    parser.add_argument("--triton-path", help="where the triton package is installed (pip install --target)")
    args = parser.parse_args()
    if args.triton_path:
        sys.path.insert(0, args.triton_path)
    for override in args.launch:
        key, launch = override.split("=")
        if key not in _nsa_pallas.LAUNCH:
            parser.error(f"--launch {override}: {key!r} is not one of {sorted(_nsa_pallas.LAUNCH)}")
        _nsa_pallas.LAUNCH[key] = tuple(int(x) for x in launch.split(","))

    cfg = nsa.NSAConfig()
    shape = lambda *s, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(s, dtype)
    q = shape(1, args.seqlen, args.heads, args.dim)
    k = shape(1, args.seqlen, args.kv_heads, args.dim)
    ids = shape(1, args.seqlen, args.kv_heads, cfg.num_selected, dtype=jnp.int32)
    calls = [(lambda q, k, ids: _nsa_pallas.selected_attention(q, k, k, ids, cfg=cfg), (q, k, ids))]
    if args.backward:
        rows = max(args.heads // args.kv_heads, _nsa_pallas._MIN_DOT)
        lse = shape(1, args.seqlen, args.kv_heads, rows, dtype=jnp.float32)
        calls.append((lambda q, k, ids, lse: _nsa_pallas.selected_attention_bwd(q, k, k, ids, q, lse, q, cfg=cfg),
                      (q, k, ids, lse)))
    for fn, arguments in calls:
        for name, module, warps, stages in lowered_kernels(fn, *arguments):
            print(f"{name}: {warps} warps, {stages} stages: {registers(module, warps, stages)}", flush=True)


if __name__ == "__main__":
    main()
