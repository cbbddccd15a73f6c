"""Side-by-side benchmark harness (DESIGN section 8), shared by ``python -m
jax_topk`` and ``benchmarks/run.py``.

Per-op device time: one jitted executable applies the op to R distinct inputs
(R large on GPU; 1 on CPU, where an op takes milliseconds), the median of
several replays divided by R. Every contender runs in the same process on the
same inputs. Each row reports the memory floor (input read once, outputs
written once, at the copy bandwidth measured in the same run) and the fraction
of it reached.

Two clocks (``OpTime``). On a GPU, with torch importable, the headline is the
executable's GPU span (first kernel start to last kernel end, recorded by
CUPTI through ``torch.profiler``) over R: what the device spent, as torch's
own contenders are timed (CUDA graph + events). The host wall clock over R is
kept beside it: on an H200 it carried ~17 us per op of PJRT host work for an
executable of 32 ops with 64 outputs (``benchmarks/trace_calls.py``), which is
launch overhead, not the op. On CPU, and wherever CUPTI is unavailable, the
wall clock is the headline.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Shape:
    rows: int
    n: int
    k: int
    dtype: str = "float32"

    def __str__(self) -> str:
        return f"{self.rows}x{self.n} k={self.k}"

    @property
    def input_bytes(self) -> int:
        return self.rows * self.n * np.dtype(jnp.dtype(self.dtype)).itemsize

    @property
    def floor_bytes(self) -> int:
        """Input read once; k values and k int32 indices per row written once."""
        return self.input_bytes + self.rows * self.k * (np.dtype(jnp.dtype(self.dtype)).itemsize + 4)


@dataclasses.dataclass(frozen=True)
class PrecomputedTime:
    """What a contender factory returns when it timed itself by other means
    (e.g. torch through a CUDA graph): seconds per op."""

    seconds: float
    clock: str = "device"


_SHAPE_RE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*[:k=]+\s*(\d+)\s*(?::\s*(\w+))?\s*$")


def parse_shapes(spec: str, default_dtype: str = "float32") -> list[Shape]:
    """Parses ``"16384x256:8,4096x2048:16:bfloat16"`` (rows x n : k [: dtype])."""
    shapes = []
    for part in spec.split(","):
        m = _SHAPE_RE.match(part)
        if not m:
            raise ValueError(f"bad shape {part!r}: expected ROWSxN:K or ROWSxN:K:DTYPE, e.g. 4096x2048:16")
        rows, n, k = (int(g) for g in m.groups()[:3])
        if not 0 <= k <= n:
            raise ValueError(f"bad shape {part!r}: k={k} must be in [0, {n}]")
        shapes.append(Shape(rows, n, k, m.group(4) or default_dtype))
    return shapes


class Progress:
    """A one-line progress bar on stderr (no dependency, no output when piped)."""

    def __init__(self, total: int, width: int = 28, stream=sys.stderr):
        self.total, self.width, self.stream, self.done = total, width, stream, 0
        self.enabled = total > 0 and hasattr(stream, "isatty") and stream.isatty()

    def step(self, label: str) -> None:
        if self.enabled:
            filled = self.width * self.done // self.total
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(f"\r[{bar}] {self.done}/{self.total} {label:<40.40}")
            self.stream.flush()
        self.done += 1

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * (self.width + 50) + "\r")
            self.stream.flush()


def replicas_for(shape: Shape, backend: str) -> int:
    """How many distinct inputs one timed executable processes."""
    if backend == "cpu":
        return 1
    # Enough work per replay that the executable's launch and sync are
    # amortised (small shapes take a few microseconds each), within 1 GiB.
    return int(max(1, min(128, (1 << 30) // max(1, shape.input_bytes))))


def make_inputs(shape: Shape, replicas: int, seed: int = 0) -> list[jax.Array]:
    """Distinct random inputs (never zeros: they hide unwritten outputs)."""
    key = jax.random.key(seed)
    out = []
    for r in range(replicas):
        x = jax.random.normal(jax.random.fold_in(key, r), (shape.rows, shape.n), jnp.float32)
        out.append(jax.block_until_ready(x.astype(shape.dtype)))
    return out


@dataclasses.dataclass(frozen=True)
class RaggedBatch:
    """The ragged case of the sort-and-ragged issue: rows of lengths uniform
    in [low, high] padded with -inf to the longest, ``replicas`` distinct
    batches of the same lengths (``benchmarks/ragged.py``,
    ``benchmarks/trace_calls.py --op ragged``)."""

    lengths: np.ndarray  # int32, one per row
    inputs: list  # jax.Array [rows, max(lengths)] float32, one per replica

    @property
    def n(self) -> int:
        return int(self.lengths.max())


RAGGED_ROWS = 31  # the ragged case: 31 rows
RAGGED_LENGTHS = (2000, 8000)  # of lengths uniform in [2000, 8000]


def make_ragged_batch(rows: int, replicas: int, low: int = RAGGED_LENGTHS[0], high: int = RAGGED_LENGTHS[1],
                      seed: int = 0, width: int | None = None) -> RaggedBatch:
    """``rows`` lengths drawn uniformly from [low, high] (seed ``seed``), then
    ``replicas`` float32 batches of standard normals padded with -inf to
    ``width`` columns (default: the longest drawn length; a wider one, e.g. a
    multiple of 4, starts every row on a 16-byte boundary)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(low, high + 1, size=rows).astype(np.int32)
    longest = int(lengths.max())
    n = longest if width is None else width
    if n < longest:
        raise ValueError(f"width={width} is less than the longest drawn length {longest}")
    inputs = []
    for _ in range(replicas):
        x = rng.standard_normal((rows, n)).astype(np.float32)
        x[np.arange(n)[None, :] >= lengths[:, None]] = -np.inf
        inputs.append(jax.device_put(x))
    return RaggedBatch(lengths, inputs)


@dataclasses.dataclass(frozen=True)
class OpTime:
    """Seconds per op: ``seconds`` is the headline (``clock`` says which)."""

    seconds: float
    wall_seconds: float
    clock: str  # "device" (GPU span, CUPTI) or "wall" (host clock)


@dataclasses.dataclass(frozen=True)
class GpuActivity:
    """The GPU work of one call: (name, start us, end us) of every kernel,
    memset and copy, as CUPTI recorded it."""

    events: tuple[tuple[str, float, float], ...]

    @property
    def span_us(self) -> float:
        """First start to last end."""
        return max(e[2] for e in self.events) - min(e[1] for e in self.events)

    @property
    def busy_us(self) -> float:
        """Summed durations."""
        return sum(e[2] - e[1] for e in self.events)


def gpu_activity(run: Callable, inputs: Sequence[jax.Array]) -> GpuActivity | None:
    """Records one ``run(*inputs)`` with CUPTI through torch.profiler; None
    where that is not available (not a GPU backend, no torch, no CUDA, no
    activity recorded)."""
    if jax.default_backend() != "gpu":
        return None
    try:
        import warnings

        import torch
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Profiler clears events at the end of each cycle"
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            jax.block_until_ready(run(*inputs))
        events = tuple((e.name, float(e.time_range.start), float(e.time_range.end))
                       for e in prof.events() if e.device_type == DeviceType.CUDA)
    return GpuActivity(events) if events else None


def _gpu_span_seconds(run: Callable, inputs: Sequence[jax.Array], repeats: int) -> float | None:
    """Median GPU span of ``run(*inputs)`` over ``repeats`` recorded replays,
    or None where ``gpu_activity`` records nothing."""
    spans = []
    for _ in range(repeats):
        activity = gpu_activity(run, inputs)
        if activity is None:
            return None
        spans.append(activity.span_us * 1e-6)
    return statistics.median(spans)


def measure(op: Callable, inputs: Sequence[jax.Array], repeats: int, *, device_clock: bool = True) -> OpTime:
    """Seconds per application of ``op``: one executable applies it to every
    input; medians over ``repeats`` replays of the host wall clock and (on a
    GPU, where CUPTI is reachable, unless ``device_clock`` is False) of the
    GPU span."""
    run = jax.jit(lambda *xs: [op(x) for x in xs])
    jax.block_until_ready(run(*inputs))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(*inputs))
        times.append(time.perf_counter() - start)
    wall = statistics.median(times) / len(inputs)
    span = _gpu_span_seconds(run, inputs, repeats) if device_clock else None
    if span is None:
        return OpTime(wall, wall, "wall")
    return OpTime(span / len(inputs), wall, "device")


def time_per_op(op: Callable, inputs: Sequence[jax.Array], repeats: int) -> float:
    """The headline seconds per op of ``measure``."""
    return measure(op, inputs, repeats).seconds


def copy_bandwidth(repeats: int = 10) -> float:
    """Bytes per second of a copy (read + write) on the default backend.

    On CPU a NumPy copy into a buffer allocated once: a jitted ``a + 1``
    allocates a fresh output on every call, and its page faults, not memory
    bandwidth, would set the figure."""
    if jax.default_backend() == "cpu":
        src = np.random.default_rng(0).random((256 << 20) // 8)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            np.copyto(dst, src)
            times.append(time.perf_counter() - start)
        return 2 * src.nbytes / statistics.median(times)
    x = jnp.ones((1 << 30) // 4, jnp.float32)
    seconds = measure(lambda a: a + 1.0, [x], repeats).seconds
    return 2 * (1 << 30) / seconds


def run_benchmark(
    shapes: Sequence[Shape],
    contenders: dict[str, Callable[[Shape], Callable | None]],
    *,
    baseline: str,
    ours: str,
    repeats: int,
    progress: bool = True,
    bandwidth: float | None = None,
) -> dict:
    """Times every contender on every shape. ``contenders`` maps a name to a
    factory ``shape -> op`` (or None when it cannot run that shape). The floor
    uses ``bandwidth`` (bytes/s, read + write) if given, else a JAX elementwise
    probe. Returns the device, bandwidth and rows of {shape, floor_us, times_us, ...}."""
    backend = jax.default_backend()
    bar = Progress(len(shapes) * len(contenders) + 1) if progress else Progress(0)
    bar.step("copy bandwidth")
    bandwidth = bandwidth or copy_bandwidth()
    rows = []
    for shape in shapes:
        inputs = make_inputs(shape, replicas_for(shape, backend))
        times, wall, clocks = {}, {}, {}
        for name, factory in contenders.items():
            bar.step(f"{shape} {shape.dtype}: {name}")
            op = factory(shape)
            if isinstance(op, PrecomputedTime):
                times[name] = op.seconds * 1e6
                clocks[name] = op.clock
            elif op is not None:
                t = measure(op, inputs, repeats)
                times[name], wall[name], clocks[name] = t.seconds * 1e6, t.wall_seconds * 1e6, t.clock
        floor_us = shape.floor_bytes / bandwidth * 1e6
        rows.append(
            {
                "rows": shape.rows, "n": shape.n, "k": shape.k, "dtype": shape.dtype,
                "floor_us": floor_us,
                "times_us": times,
                "wall_us": wall,
                "clock": clocks,
                "floor_fraction": floor_us / times[ours] if ours in times else None,
                "speedup": times[baseline] / times[ours] if baseline in times and ours in times else None,
            }
        )
        del inputs
    bar.close()
    speedups = [r["speedup"] for r in rows if r["speedup"]]
    return {
        "device": device_name(),
        "backend": backend,
        "jax": jax.__version__,
        "copy_bandwidth_GBps": bandwidth / 1e9,
        "repeats": repeats,
        "baseline": baseline,
        "ours": ours,
        "rows": rows,
        "geomean_speedup": geomean(speedups) if speedups else None,
    }


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def device_name() -> str:
    d = jax.devices()[0]
    if d.platform == "cpu":
        import os
        import platform

        return f"cpu-{platform.machine()}-{os.cpu_count()}cores"
    return d.device_kind


def write_result(result: dict, out_dir: str, suffix: str = "") -> str:
    """Writes ``result`` as ``<out_dir>/<device><suffix>.json`` (the device
    from ``result["device"]``, lower case, dashes) and returns the path
    without ``.json`` (plots go beside it)."""
    os.makedirs(out_dir, exist_ok=True)
    device = re.sub(r"[^a-z0-9]+", "-", result["device"].lower()).strip("-")
    stem = os.path.join(out_dir, device + suffix)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=2)
    return stem


def format_table(result: dict) -> str:
    """A fixed-width table: one row per shape, one column per contender."""
    names = list(dict.fromkeys(n for r in result["rows"] for n in r["times_us"]))
    ours = result["ours"]
    # The host wall clock of our op, when the headline is the device clock.
    show_wall = any(r.get("clock", {}).get(ours) == "device" for r in result["rows"])
    header = ["shape", "dtype", "floor us"] + [f"{n} us" for n in names]
    header += [f"{ours} wall us"] if show_wall else []
    header += ["floor %", f"x vs {result['baseline']}"]
    lines = []
    for r in result["rows"]:
        cells = [f"{r['rows']}x{r['n']} k={r['k']}", r["dtype"], f"{r['floor_us']:.1f}"]
        cells += [f"{r['times_us'][n]:.1f}" if n in r["times_us"] else "-" for n in names]
        if show_wall:
            cells += [f"{r['wall_us'][ours]:.1f}" if ours in r.get("wall_us", {}) else "-"]
        cells += [f"{100 * r['floor_fraction']:.1f}" if r["floor_fraction"] else "-"]
        cells += [f"{r['speedup']:.2f}" if r["speedup"] else "-"]
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    out = [fmt(header), fmt(["-" * w for w in widths])] + [fmt(c) for c in lines]
    if result.get("geomean_speedup"):
        out.append(f"geomean speedup of {result['ours']} over {result['baseline']}: {result['geomean_speedup']:.2f}x")
    if any((r["floor_fraction"] or 0) > 1 for r in result["rows"]):
        out.append("floor % above 100: the input stayed in cache between replays (the bandwidth probe streams 256 MB+)")
    out.append(
        f"device: {result['device']} ({result['backend']}), copy bandwidth {result['copy_bandwidth_GBps']:.1f} GB/s, "
        f"median of {result['repeats']} replays"
    )
    clocks = sorted({c for r in result["rows"] for c in r.get("clock", {}).values()})
    if "device" in clocks:
        out.append("times: GPU span per op (CUPTI for JAX executables, CUDA graph + events for torch); "
                   "'wall' is the host clock per op of the same executable")
    return "\n".join(out)
