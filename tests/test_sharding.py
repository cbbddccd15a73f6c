"""The primitives under jit + NamedSharding and inside shard_map, on 8 CPU
devices (conftest.py forces them before jax starts) and, where there are at
least two, on 2 GPUs: results equal the unsharded ones (on the mesh's first
device) bit for bit; row-sharded inputs compile to no collective; a top-k
along a sharded axis all-gathers only shards x k candidates per row."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_topk
import oracle
from conftest import make_input, np_dtype
from jax_topk import _route, routing
from test_lengths import padded_row_reference

CPUS = jax.devices("cpu")
if len(CPUS) < 8:
    pytest.skip("needs 8 CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8 "
                "before jax starts)", allow_module_level=True)

COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")


def _gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def mesh(request):
    if request.param == "cpu":
        return Mesh(np.array(CPUS[:8]).reshape(4, 2), ("rows", "cols"))
    if len(_gpus()) < 2:
        pytest.skip("fewer than 2 GPUs")
    return Mesh(np.array(_gpus()[:2]).reshape(2, 1), ("rows", "cols"))


def compiled_text(fn, *args) -> str:
    return fn.lower(*args).compile().as_text()


def collectives(hlo: str) -> list[str]:
    """The collective instructions of a compiled module."""
    return [line.strip() for line in hlo.splitlines()
            if "=" in line and any(re.search(rf"\b{c}(-start)?\(", line) for c in COLLECTIVES)]


def all_gathered_arrays(hlo: str) -> list[tuple[int, ...]]:
    """The shape of every array the all-gathers of a compiled module produce
    (XLA may combine several into one tuple-shaped all-gather, and may gather
    a transposed layout: compare element counts, not shapes)."""
    arrays = []
    for line in collectives(hlo):
        m = re.search(r"=\s*(.*?)\s+(all-gather(-start)?)\(", line)
        assert m, f"not an all-gather: {line}"
        shapes = [tuple(int(d) for d in dims.split(",") if d)
                  for dims in re.findall(r"[a-z0-9]+\[([0-9,]*)\]", m.group(1))]
        if m.group(3):  # an async start: (operands, results)
            shapes = shapes[len(shapes) // 2:]
        arrays.extend(shapes)
    return arrays


def mesh_size(mesh, entry) -> int:
    """Devices along a spec entry (None, an axis name or a tuple of them)."""
    return int(np.prod([mesh.shape[a] for a in np.atleast_1d(entry)])) if entry else 1


def run_sharded(fn, mesh, spec, *arrays, lengths_spec=None):
    """fn jitted over x placed with `spec` (and lengths with `lengths_spec`),
    and the same fn on one device; returns (sharded results, unsharded
    results, compiled HLO of the sharded call)."""
    placed = [jax.device_put(arrays[0], NamedSharding(mesh, spec))]
    if len(arrays) > 1:
        placed.append(jax.device_put(arrays[1], NamedSharding(mesh, lengths_spec or P())))
    jitted = jax.jit(fn)
    with jax.default_device(mesh.devices.flat[0]):
        want = jax.jit(fn)(*[jnp.asarray(a) for a in arrays])
    return jitted(*placed), want, compiled_text(jitted, *placed)


def assert_same(got, want, what):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        if np.issubdtype(w.dtype, np.integer):
            assert np.array_equal(g, w), what
        else:
            assert oracle.same_bits(g, w), what


ROW_SPECS = [P("rows"), P(("rows", "cols")), P("cols", None)]


@pytest.mark.parametrize("spec", ROW_SPECS, ids=str)
@pytest.mark.parametrize("op", ["top_k", "sort", "argsort"])
def test_row_sharded_no_collective(op, spec, mesh, rng):
    x = make_input("ties", (16, 40), "float32", rng)
    fn = {"top_k": lambda a: jax_topk.top_k(a, 5),
          "sort": lambda a: jax_topk.sort(a, descending=True),
          "argsort": lambda a: jax_topk.argsort(a)}[op]
    got, want, hlo = run_sharded(fn, mesh, spec, x)
    assert_same(got, want, f"{op} {spec}")
    assert collectives(hlo) == [], f"{op} {spec}: {collectives(hlo)}"
    assert f"jax_topk_{'top_k' if op == 'top_k' else 'sort'}" in hlo  # the kernel, per shard
    assert jax.tree.leaves(got)[0].sharding.spec[0] == spec[0]


def test_row_sharded_with_lengths_and_batch_dims(mesh, rng):
    x = make_input("special", (4, 6, 33), "float32", rng)
    lengths = rng.integers(-2, 36, size=(4, 6)).astype(np.int32)
    spec = P("rows", "cols", None)
    for fn in (lambda a, n: jax_topk.top_k(a, 7, lengths=n),
               lambda a, n: jax_topk.sort(a, lengths=n)):
        got, want, hlo = run_sharded(fn, mesh, spec, x, lengths, lengths_spec=P("rows", "cols"))
        assert_same(got, want, "lengths, two sharded batch dims")
        assert collectives(hlo) == []


@pytest.mark.parametrize("spec,k", [(P(None, "cols"), 5), (P("rows", "cols"), 3),
                                    (P(None, ("rows", "cols")), 6), (P(None, ("rows", "cols")), 12)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("kind", ["random", "ties", "special"])
def test_top_k_along_sharded_axis(spec, k, kind, mesh, rng):
    # n = 16: over 8 shards each holds 2 < k, so every shard gives all it has.
    x = make_input(kind, (8, 16), "float32", rng)
    got, want, hlo = run_sharded(lambda a: jax_topk.top_k(a, k), mesh, spec, x)
    assert_same(got, want, f"top_k k={k} {spec} {kind}")
    shards = mesh_size(mesh, spec[1])
    local_rows = 8 // mesh_size(mesh, spec[0])
    per_shard = min(k, 16 // shards)
    # Two gathered arrays (values, indices) of shards x min(k, n_local) per
    # row, nothing else, and never the input.
    gathered = [int(np.prod(a)) for a in all_gathered_arrays(hlo)]
    assert gathered == ([local_rows * shards * per_shard] * 2 if shards > 1 else []), gathered


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "uint8"])
def test_top_k_along_sharded_axis_with_lengths(dtype, mesh, rng):
    x = make_input("ties", (8, 24), dtype, rng)
    lengths = np.array([0, 1, 2, 5, 11, 24, 30, -3], np.int32)
    for k in (1, 4, 9):
        got, want, _ = run_sharded(lambda a, n: jax_topk.top_k(a, k, lengths=n), mesh,
                                   P(None, ("rows", "cols")), x, lengths)
        assert_same(got, want, f"{dtype} k={k} lengths along the sharded axis")
        for b, length in enumerate(lengths):  # and the oracle, row by row
            want_v, want_i = padded_row_reference(x[b], k, int(length))
            assert np.array_equal(np.asarray(got[1][b]), want_i), (dtype, k, b)
            assert oracle.same_bits(np.asarray(got[0][b]), want_v), (dtype, k, b)


def test_top_k_along_sharded_axis_explicit_mesh(rng):
    explicit = jax.make_mesh((4, 2), ("rows", "cols"), axis_types=(jax.sharding.AxisType.Explicit,) * 2,
                             devices=CPUS[:8])
    x = make_input("random", (8, 32), "float32", rng)
    got, want, hlo = run_sharded(lambda a: jax_topk.top_k(a, 4), explicit, P("rows", "cols"), x)
    assert_same(got, want, "explicit mesh")
    assert got[0].sharding.spec == P("rows", None)


@pytest.mark.parametrize("spec", [P(None, "cols"), P("rows", ("cols",))], ids=str)
def test_sort_along_sharded_axis(spec, mesh, rng):
    # The documented strategy: the row is gathered, each device sorts it whole.
    x = make_input("ties", (8, 30), "float32", rng)
    got, want, _ = run_sharded(lambda a: jax_topk.sort(a, descending=True), mesh, spec, x)
    assert_same(got, want, f"sort {spec}")


@pytest.mark.parametrize("preset", ["deepseek_v3", "mixtral", "qwen3_moe"])
@pytest.mark.parametrize("spec", [P("rows"), P(("rows", "cols"), None), P("rows", "cols")], ids=str)
def test_route_sharded(preset, spec, mesh, rng):
    logits = rng.standard_normal((32, 64)).astype(np.float32)
    bias = rng.standard_normal(64).astype(np.float32) * 0.1
    route = routing.PRESETS[preset]
    fn = (lambda a: route(a, jnp.asarray(bias))) if route.uses_bias else route
    got, want, hlo = run_sharded(fn, mesh, spec, logits)
    assert_same(got, want, f"{preset} {spec}")
    if spec[-1] is None or len(spec) == 1:
        assert collectives(hlo) == [], collectives(hlo)


def merged_candidates(experts: int, shards: int, preset) -> int:
    """Experts per row each device contributes to a route along a sharded
    expert axis: its best k; with groups, each of its groups' best max(k, 2)."""
    local = experts // shards
    if not preset.n_groups:
        return min(preset.k, local)
    group = experts // preset.n_groups
    return local // group * min(max(preset.k, 2), group)


def normaliser_words(preset) -> int:
    """What a route that reads the softmax normaliser gathers per device and
    row besides its candidates: the max logit, or the exact partial sum's
    uint32 words (0 for the others)."""
    reads = preset.score == "softmax" and (preset.uses_bias or preset.n_groups or not preset.renormalize)
    return _route._exact_sum_words() if reads else 0


def special_logits(rng, tokens: int, experts: int, dtype) -> np.ndarray:
    """Random logits with rows that stress the merge: a NaN, a +inf, all -inf
    (a degenerate softmax), all equal and many ties (order by expert id),
    and distinct logits whose scores tie: sigmoid saturated at 1, and a
    softmax (sigmoid, sqrt-softplus) that underflows to 0."""
    x = rng.standard_normal((tokens, experts)).astype(np.float32)
    x[1, experts - 3] = np.nan
    x[2, experts // 2 + 1] = np.inf
    x[3] = -np.inf
    x[4] = 1.0
    x[5] = rng.integers(-2, 3, size=experts)
    x[6, :experts // 2] = -np.inf
    x[7] = 20.0 + rng.permutation(experts) * 0.125
    x[8] = -110.0 - rng.permutation(experts) * 0.25
    x[8, experts // 3] = 0.0
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("spec", [P("rows", "cols"), P(None, ("rows", "cols")), P(None, "rows")], ids=str)
@pytest.mark.parametrize("preset", sorted(routing.PRESETS))
def test_route_along_sharded_expert_axis(preset, spec, dtype, mesh, rng):
    # Expert-parallel logits: candidates merged (shards x their best per row
    # gathered, and for a softmax normaliser each device's max logit and exact
    # partial sum; never the logits); bit-identical to one device.
    experts = 256
    logits = special_logits(rng, 24, experts, np_dtype(dtype))
    bias = rng.standard_normal(experts).astype(np.float32) * 0.1
    route = routing.PRESETS[preset]
    fn = (lambda a: route(a, jnp.asarray(bias))) if route.uses_bias else route
    got, want, hlo = run_sharded(fn, mesh, spec, logits)
    assert_same(got, want, f"{preset} {spec} {dtype}")
    shards, local_rows = mesh_size(mesh, spec[-1]), 24 // mesh_size(mesh, spec[0])
    per_row = [int(np.prod(a)) // local_rows for a in all_gathered_arrays(hlo)]
    moved = max(merged_candidates(experts, shards, route), normaliser_words(route))
    if shards == 1:
        assert per_row == []
    else:
        assert per_row and max(per_row) <= shards * moved < experts, per_row


def test_route_along_sharded_expert_axis_variants(mesh, rng):
    # A per-token bias (sharded with the logits), groups of one expert, k above
    # the experts per device, 1-D logits, softmax normalisers read through a
    # bias or groups, and groups spanning devices (each device keeps its
    # share's best): all merged, gathering at most each device's candidates
    # (or its normaliser words) per row.
    logits = special_logits(rng, 16, 64, np.float32)
    bias = rng.standard_normal((16, 64)).astype(np.float32)
    words = _route._exact_sum_words()
    cases = {  # name: (fn, k, n_groups, gathers a normaliser)
        "per-token bias": (lambda a: jax.vmap(lambda row, b: routing.route(row, 4, score="sqrt_softplus", bias=b))(
            a, jnp.asarray(bias)), 4, 0, False),
        "groups of one": (lambda a: routing.route(a, 3, score="sigmoid", n_groups=64, top_groups=5), 3, 64, False),
        "k > experts per device": (lambda a: routing.route(a, 12, renormalize=True), 12, 0, False),
        "k = 1 with groups": (lambda a: routing.route(a, 1, score="sigmoid", n_groups=8, top_groups=3), 1, 8, False),
        "1-D logits": (lambda a: routing.route(a[0], 5, score="sigmoid", bias=jnp.asarray(bias[0])), 5, 0, False),
        "groups across devices": (lambda a: routing.route(a, 4, score="sigmoid", n_groups=2, top_groups=1),
                                  4, 2, False),
        "groups across devices, softmax with a bias": (lambda a: routing.route(
            a, 6, bias=jnp.asarray(bias[1]), n_groups=4, top_groups=2, renormalize=False), 6, 4, True),
        "softmax with a bias": (lambda a: routing.route(a, 4, bias=jnp.asarray(bias[0]), renormalize=True),
                                4, 0, True),
        "softmax with a per-token bias": (lambda a: jax.vmap(
            lambda row, b: routing.route(row, 6, bias=b, renormalize=False, scale=2.0))(a, jnp.asarray(bias)),
            6, 0, True),
        "softmax with groups": (lambda a: routing.route(a, 5, n_groups=8, top_groups=3, renormalize=False),
                                5, 8, True),
        "softmax, k > experts per device": (lambda a: routing.route(a, 12, renormalize=False), 12, 0, True),
    }
    spec = P(None, ("rows", "cols"))
    shards = mesh_size(mesh, spec[-1])
    for what, (fn, k, n_groups, normaliser) in cases.items():
        got, want, hlo = run_sharded(fn, mesh, spec, logits)
        assert_same(got, want, what)
        tokens = 1 if what == "1-D logits" else logits.shape[0]
        per_row = [int(np.prod(a)) // tokens for a in all_gathered_arrays(hlo)]
        moved = max(_route.candidates_per_shard(64, shards, k, n_groups), words if normaliser else 0)
        assert shards == 1 or (per_row and max(per_row) <= shards * moved), (what, per_row)
    # Groups of 8 of 96 experts over 8 devices of 12: cut unevenly, so the
    # expert axis is gathered first (the documented fallback), same result.
    uneven = special_logits(rng, 16, 96, np.float32)
    fn = lambda a: routing.route(a, 4, score="sigmoid", n_groups=12, top_groups=3)  # noqa: E731
    got, want, hlo = run_sharded(fn, mesh, spec, uneven)
    assert_same(got, want, "uneven groups")
    if shards > 1 and 96 % shards == 0 and (96 // shards) % 8 and 8 % (96 // shards):
        assert 96 in [int(np.prod(a)) // 16 for a in all_gathered_arrays(hlo)]


def test_vmap_and_grad_under_sharding(mesh, rng):
    x = make_input("random", (4, 8, 20), "float32", rng)

    def loss(a):
        values, _ = jax.vmap(lambda r: jax_topk.top_k(r, 3))(a)
        return jnp.sum(values * values)

    got, want, hlo = run_sharded(jax.grad(loss), mesh, P("rows", "cols"), x)
    assert_same(got, want, "grad of vmapped top_k")
    assert collectives(hlo) == []


def test_inside_shard_map(mesh, rng):
    x = make_input("ties", (16, 24), "float32", rng)
    lengths = rng.integers(0, 25, size=16).astype(np.int32)

    def body(a, n):
        values, indices = jax_topk.top_k(a, 4, lengths=n)
        weights, ids = routing.route(a, 2)
        return values, indices, jax_topk.argsort(a), weights, ids

    specs = (P(("rows", "cols")),) * 5
    fn = jax.shard_map(body, mesh=mesh, in_specs=(P(("rows", "cols")), P(("rows", "cols"))),
                       out_specs=specs)
    got = jax.jit(fn)(x, lengths)
    with jax.default_device(mesh.devices.flat[0]):
        want = jax.jit(body)(jnp.asarray(x), jnp.asarray(lengths))
    assert_same(got, want, "shard_map body")
    assert "jax_topk_top_k_lengths" in compiled_text(jax.jit(fn), x, lengths)


def test_route_with_a_per_token_bias(mesh, rng):
    # vmap over the bias makes it per token: sharded like the logits.
    logits = rng.standard_normal((4, 8, 16)).astype(np.float32)
    bias = rng.standard_normal((4, 16)).astype(np.float32)

    def fn(a, b):
        return jax.vmap(lambda rows, bias_row: routing.route(rows, 3, score="sigmoid", bias=bias_row))(a, b)

    got, want, hlo = run_sharded(fn, mesh, P("rows", "cols"), logits, bias, lengths_spec=P("rows"))
    assert_same(got, want, "per-token bias")
    assert collectives(hlo) == []


def indexer_inputs(rng, b=8, h=4, n=40, d=8):
    q = rng.standard_normal((b, h, d)).astype(np.float32)
    keys = rng.standard_normal((b, n, d)).astype(np.float32)
    w = rng.standard_normal((b, h)).astype(np.float32)
    lengths = rng.integers(0, n + 1, size=b).astype(np.int32)
    return q, keys, w, lengths


@pytest.mark.parametrize("shardy", [True, False])
@pytest.mark.parametrize("batch_spec", ["rows", ("rows", "cols")], ids=str)
def test_indexer_batch_sharded_no_collective(shardy, batch_spec, mesh, rng):
    arrays = indexer_inputs(rng)
    fn = jax.jit(lambda q, keys, w, n: jax_topk.indexer_top_k(q, keys, w, 6, lengths=n))
    placed = [jax.device_put(a, NamedSharding(mesh, P(batch_spec))) for a in arrays]
    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        got = fn(*placed)
        hlo = compiled_text(fn, *placed)
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)
    with jax.default_device(mesh.devices.flat[0]):
        want = fn(*[jnp.asarray(a) for a in arrays])
    assert_same(got, want, f"indexer {batch_spec}")
    assert collectives(hlo) == [], collectives(hlo)
    assert got[0].sharding.is_equivalent_to(NamedSharding(mesh, P(batch_spec)), got[0].ndim)


def test_indexer_with_sharded_keys_axis_and_in_shard_map(mesh, rng):
    # Keys sharded along N (or D): gathered, same result; and inside shard_map.
    q, keys, w, lengths = indexer_inputs(rng)
    fn = lambda q_, k_, w_, n_: jax_topk.indexer_top_k(q_, k_, w_, 6, lengths=n_)  # noqa: E731
    with jax.default_device(mesh.devices.flat[0]):
        want = jax.jit(fn)(*[jnp.asarray(a) for a in (q, keys, w, lengths)])
    for spec in (P("rows", "cols"), P(None, None, "cols")):
        got = jax.jit(fn)(q, jax.device_put(keys, NamedSharding(mesh, spec)), w, lengths)
        assert_same(got, want, f"keys {spec}")
    body = jax.shard_map(fn, mesh=mesh, in_specs=P("rows"), out_specs=P("rows"))
    placed = [jax.device_put(a, NamedSharding(mesh, P("rows"))) for a in (q, keys, w, lengths)]
    assert_same(jax.jit(body)(*placed), want, "shard_map body")


def test_indexer_shared_keys_batch_sharded(mesh, rng):
    # Keys every item shares (causal prefill): replicated, the batch split, no
    # collective; vmapped over sequences with their own keys: the same result.
    q, keys, w, _ = indexer_inputs(rng)
    fn = jax.jit(lambda q_, k_, w_: jax_topk.indexer_top_k(q_, k_, w_, 6, causal=True))
    placed = [jax.device_put(a, NamedSharding(mesh, P(s))) for a, s in ((q, "rows"), (keys[0], None), (w, "rows"))]
    with jax.default_device(mesh.devices.flat[0]):
        want = fn(q, keys[0], w)
    assert_same(fn(*placed), want, "shared keys")
    assert collectives(compiled_text(fn, *placed)) == []
    seqs = jax.jit(jax.vmap(lambda q_, k_, w_: jax_topk.indexer_top_k(q_, k_, w_, 6, causal=True)))
    q2, k2, w2 = q.reshape(4, 2, *q.shape[1:]), keys[:4], w.reshape(4, 2, -1)
    with jax.default_device(mesh.devices.flat[0]):
        want2 = seqs(q2, k2, w2)
    got2 = seqs(*[jax.device_put(a, NamedSharding(mesh, P("rows"))) for a in (q2, k2, w2)])
    assert_same(got2, want2, "sequences of shared keys")


@pytest.mark.parametrize("shardy", [True, False])
def test_both_partitioners(shardy, mesh, rng):
    x = make_input("ties", (8, 32), "float32", rng)
    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        for spec in (P("rows"), P("rows", "cols")):
            got, want, hlo = run_sharded(lambda a: jax_topk.top_k(a, 5), mesh, spec, x)
            assert_same(got, want, f"shardy={shardy} {spec}")
            gathered = all_gathered_arrays(hlo)
            assert len(gathered) == (2 if mesh_size(mesh, spec[-1]) > 1 and len(spec) == 2 else 0), gathered
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)


def test_readme_sharding_example():
    # The README's example, as written (8 devices).
    if len(jax.devices()) < 8:
        pytest.skip("the example takes 8 devices of the default backend")
    readme = (__import__("pathlib").Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("## Sharding", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(code, "README.md#sharding", "exec"), scope)
    assert scope["values"].shape == (64, 50)
    assert np.array_equal(np.asarray(scope["indices"]),
                          np.asarray(jax.lax.top_k(np.asarray(scope["vocab"]), 50)[1]))
