"""jax_topk.nsa: the tiled O(T) path against the dense reference, the NSA
properties (dense limits, causality, packing), transforms, memory and errors."""

from __future__ import annotations

import dataclasses
import functools
import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jex_core
from jax.test_util import check_grads

from conftest import TEST_PLATFORM
from jax_topk import _nsa_core, _nsa_reference, nsa

F32_TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def _float32_matmuls():
    """Comparisons at 1e-5 need float32 matmuls: a GPU's default precision
    rounds dot operands (TF32 on NVIDIA, ~1e-3 relative); the CPU's is full."""
    with jax.default_matmul_precision("highest"):
        yield


# ----------------------------------------------------------------------------- helpers


@dataclasses.dataclass(frozen=True)
class Case:
    cfg: nsa.NSAConfig
    batch: int
    length: int
    q_heads: int
    kv_heads: int
    dim: int


def random_case(seed: int) -> Case:
    """Random block sizes and shapes; T rarely a multiple of any block size."""
    rng = np.random.default_rng(seed)
    stride = int(rng.choice([1, 2, 4]))
    block_size = stride * int(rng.integers(1, 4))
    select_size = block_size * int(rng.integers(1, 3)) + stride * int(rng.integers(0, 2))
    initial, local = int(rng.integers(0, 2)), int(rng.integers(0, 3))
    length = int(rng.integers(block_size + 1, 7 * select_size + 2))
    cfg = nsa.NSAConfig(
        block_size=block_size, stride=stride, select_size=select_size,
        num_selected=initial + local + int(rng.integers(1, 3)), window=int(rng.integers(1, length + 3)),
        compression=str(rng.choice(["mean", "mlp"])), initial_blocks=initial, local_blocks=local,
        scale=None if rng.random() < 0.5 else float(rng.uniform(0.2, 1.0)),
        query_tile=int(rng.choice([5, 8, 16, 64])))
    kv_heads = int(rng.integers(1, 3))
    return Case(cfg, int(rng.integers(1, 3)), length, kv_heads * int(rng.integers(1, 4)), kv_heads,
                int(rng.choice([4, 8])))


def make_inputs(case: Case, dtype=jnp.float32, seed: int = 0):
    """``(q, k, v, gates, params)`` for a case; gates in (0, 1), params None for mean pooling.

    Drawn with numpy: eager jax.random compiles a program per shape (seconds on CPU).
    """
    rng = np.random.default_rng(seed)
    b, t, hq, hkv, d = case.batch, case.length, case.q_heads, case.kv_heads, case.dim

    def normal(shape, std=1.0):
        return jnp.asarray(std * rng.standard_normal(shape), dtype)

    q, k, v = normal((b, t, hq, d)), normal((b, t, hkv, d)), normal((b, t, hkv, d))
    g = jnp.asarray(rng.uniform(size=(b, t, hq, 3)), dtype)
    shapes = jax.eval_shape(lambda: nsa.init_params(jax.random.key(0), case.cfg, d))
    params = jax.tree.map(lambda x: normal(x.shape, 1 / np.sqrt(x.shape[0])), shapes) or None
    return q, k, v, g, params


def output_and_grads(fn, cfg, q, k, v, g, params, cotangent):
    """``fn``'s output and the gradients of ``<output, cotangent>`` in every input (jitted)."""
    def run(q, k, v, g, params):
        out, pullback = jax.vjp(lambda *a: fn(*a[:4], cfg, params=a[4]), q, k, v, g, params)
        return out, pullback(cotangent)
    return jax.jit(run)(q, k, v, g, params)


def dense_causal(q, k, v, scale):
    """Plain causal GQA attention in numpy float64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, k) * scale
    length = q.shape[1]
    scores = np.where(np.tril(np.ones((length, length), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bhts,bshd->bthd", probs / probs.sum(-1, keepdims=True), v)


def assert_trees_close(actual, expected, **tol):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(e, np.float64), **tol)


def largest_intermediate(jaxpr) -> int:
    """Elements of the largest array in a jaxpr and every sub-jaxpr (scan, map, cond, pjit, remat)."""
    largest = 0
    for var in [*jaxpr.invars, *jaxpr.constvars, *(v for e in jaxpr.eqns for v in e.outvars)]:
        largest = max(largest, int(np.prod(getattr(var.aval, "shape", ()), dtype=np.int64)))
    return max([largest, *(largest_intermediate(sub) for sub in jex_core.subjaxprs(jaxpr))])


SMALL = nsa.NSAConfig(block_size=4, stride=2, select_size=8, num_selected=3, window=6, query_tile=8)


# ----------------------------------------------------------------------------- against the reference


# Seeds whose random cases mix GQA groups of 1 to 3, mean and mlp, tiles of 8 to 64,
# l' a multiple of l or not, and lengths that are multiples of no block size.
SEEDS = [6, 7, 8, 9]


@pytest.mark.parametrize("seed", SEEDS)
def test_matches_reference_float32(seed):
    case = random_case(seed)
    q, k, v, g, params = make_inputs(case, seed=seed)
    cotangent = jnp.asarray(np.random.default_rng(99).standard_normal(q.shape), q.dtype)
    out, grads = output_and_grads(nsa.nsa_attention, case.cfg, q, k, v, g, params, cotangent)
    ref_out, ref_grads = output_and_grads(nsa.reference, case.cfg, q, k, v, g, params, cotangent)
    np.testing.assert_allclose(out, ref_out, **F32_TOL, err_msg=str(case))
    assert_trees_close(grads, ref_grads, rtol=1e-5, atol=1e-5)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(grads))


def test_selection_is_exercised_by_the_random_cases():
    # The reference comparison only tests selection where some blocks are left out.
    cases = [random_case(seed) for seed in SEEDS]
    assert all(_nsa_core.num_selection_blocks(c.length, c.cfg.select_size) > c.cfg.num_selected for c in cases)
    assert {c.cfg.compression for c in cases} == {"mean", "mlp"}
    assert all(c.length % c.cfg.stride or c.length % c.cfg.select_size for c in cases)


def test_matches_reference_bfloat16():
    case = Case(dataclasses.replace(SMALL, compression="mlp"), 1, 37, 4, 2, 8)
    q, k, v, g, params = make_inputs(case, jnp.bfloat16, seed=3)
    cotangent = jnp.asarray(np.random.default_rng(5).standard_normal(q.shape), jnp.bfloat16)
    out, grads = output_and_grads(nsa.nsa_attention, case.cfg, q, k, v, g, params, cotangent)
    ref_out, ref_grads = output_and_grads(nsa.reference, case.cfg, q, k, v, g, params, cotangent)
    assert out.dtype == jnp.bfloat16
    for a, e in zip(jax.tree.leaves((out, grads)), jax.tree.leaves((ref_out, ref_grads)), strict=True):
        a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
        assert np.linalg.norm(a - e) <= 2e-2 * np.linalg.norm(e) + 1e-3


def test_check_grads_float64():
    case = Case(dataclasses.replace(SMALL, compression="mlp", num_selected=2, local_blocks=1), 1, 19, 2, 1, 4)
    q, k, v, g, params = make_inputs(case, jnp.float64, seed=1)
    fn = jax.jit(lambda q, k, v, g, p: nsa.nsa_attention(q, k, v, g, case.cfg, params=p))
    check_grads(fn, (q, k, v, g, params), order=1, modes=["rev"])


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize("branch", ["selected", "window"])
def test_dense_limit_is_causal_attention(branch):
    length = 29
    cfg = dataclasses.replace(SMALL, num_selected=4, query_tile=8)  # ceil(29 / 8) = 4 blocks
    if branch == "window":
        cfg = dataclasses.replace(SMALL, window=length)
    case = Case(cfg, 2, length, 4, 2, 8)
    q, k, v, _, _ = make_inputs(case, seed=7)
    gates = jnp.zeros((2, length, 4, 3)).at[..., {"selected": 1, "window": 2}[branch]].set(1.0)
    out = nsa.nsa_attention(q, k, v, gates, cfg)
    np.testing.assert_allclose(out, dense_causal(q, k, v, cfg.softmax_scale(8)), **F32_TOL)


def test_one_selected_block_too_few_is_not_dense():
    # The check above can fail: one block short of all of them differs from dense attention.
    cfg = dataclasses.replace(SMALL, num_selected=3)
    q, k, v, _, _ = make_inputs(Case(cfg, 1, 29, 2, 1, 8), seed=7)
    gates = jnp.zeros((1, 29, 2, 3)).at[..., 1].set(1.0)
    out = nsa.nsa_attention(q, k, v, gates, cfg)
    assert not np.allclose(out, dense_causal(q, k, v, cfg.softmax_scale(8)), atol=1e-3)


@pytest.mark.parametrize("compression", ["mean", "mlp"])
def test_causal(compression, rng):
    case = Case(dataclasses.replace(SMALL, compression=compression), 2, 41, 4, 2, 8)
    inputs = make_inputs(case, seed=2)
    run = jax.jit(lambda q, k, v, g, p: nsa.nsa_attention(q, k, v, g, case.cfg, params=p))
    before = run(*inputs)
    for t in rng.integers(0, case.length - 1, size=3):
        changed = [x.at[:, t + 1:].set(rng.standard_normal(x[:, t + 1:].shape).astype(np.float32))
                   for x in inputs[:4]]
        after = run(*changed, inputs[4])
        np.testing.assert_array_equal(after[:, : t + 1], before[:, : t + 1])
        assert not np.allclose(after[:, t + 1:], before[:, t + 1:])


def test_packed_sequences_equal_one_by_one():
    lengths = [7, 0, 19]
    total = sum(lengths) + 3  # three padding tokens after the last sequence
    cfg = dataclasses.replace(SMALL, compression="mlp")
    q, k, v, g, params = make_inputs(Case(cfg, 1, total, 4, 2, 8), seed=4)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    packed = nsa.nsa_attention(q, k, v, g, cfg, params=params, cu_seqlens=jnp.asarray(cu))
    traced = jax.jit(lambda q, cu: nsa.nsa_attention(q, k, v, g, cfg, params=params, cu_seqlens=cu,
                                                     max_seqlen=24))(q, jnp.asarray(cu))
    for start, end in zip(cu[:-1], cu[1:]):
        if end > start:
            alone = nsa.nsa_attention(q[:, start:end], k[:, start:end], v[:, start:end], g[:, start:end], cfg,
                                      params=params)
            np.testing.assert_allclose(packed[:, start:end], alone, **F32_TOL)
    np.testing.assert_array_equal(packed[:, cu[-1]:], 0)
    np.testing.assert_allclose(traced, packed, **F32_TOL)


def test_vmap_and_jit_equal_a_loop():
    cfg = SMALL
    case = Case(cfg, 2, 21, 2, 1, 4)
    stacked = [jnp.stack(pair) for pair in zip(make_inputs(case, seed=0)[:4], make_inputs(case, seed=1)[:4])]
    batched = jax.jit(jax.vmap(nsa.nsa_attention, in_axes=(0, 0, 0, 0, None)), static_argnums=4)(*stacked, cfg)
    jitted = jax.jit(nsa.nsa_attention, static_argnums=4)
    for i in range(2):
        np.testing.assert_allclose(batched[i], jitted(*(x[i] for x in stacked), cfg), **F32_TOL)
    assert hash(cfg) == hash(dataclasses.replace(cfg)) and cfg == dataclasses.replace(cfg)


# ----------------------------------------------------------------------------- the pieces


@pytest.mark.parametrize("length", [3, 11])
def test_compressed_branch_is_zero_before_the_first_block(length):
    cfg = dataclasses.replace(SMALL, block_size=8, stride=4, select_size=8)
    q, k, v, g, _ = make_inputs(Case(cfg, 1, length, 2, 1, 4), seed=6)
    k_cmp, v_cmp = nsa.compress_kv(k, v, cfg)
    assert k_cmp.shape[1] == _nsa_core.num_compressed_blocks(length, 8, 4) == (0 if length < 8 else 1)
    out = nsa.compressed_attention(q, k_cmp, v_cmp, cfg)
    np.testing.assert_array_equal(out[:, : cfg.block_size - 1], 0)
    assert length < 8 or np.abs(out[:, 7:]).min() > 0
    grads = jax.grad(lambda *a: nsa.nsa_attention(*a, cfg).sum(), argnums=(0, 1, 2, 3))(q, k, v, g)
    assert all(np.isfinite(x).all() for x in grads)


def test_compress_kv_mean_and_mlp():
    cfg = nsa.NSAConfig(block_size=6, stride=2, select_size=6)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 15, 3, 4)), jnp.float32)
    k_cmp, _ = nsa.compress_kv(x, x, cfg)
    expected = np.stack([np.asarray(x)[:, i * 2: i * 2 + 6].mean(1) for i in range(5)], axis=1)
    np.testing.assert_allclose(k_cmp, expected, **F32_TOL)
    mlp_cfg = dataclasses.replace(cfg, compression="mlp")
    params = nsa.init_params(jax.random.key(1), mlp_cfg, 4, hidden_dim=7)
    k_mlp, v_mlp = nsa.compress_kv(x, x, mlp_cfg, params=params)
    p = params["key"]
    block = (np.asarray(x)[0, 4:10, 1] + np.asarray(p["pos"])).reshape(-1)  # block 2 of head 1
    expected = np.asarray(jax.nn.gelu(block @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])
    np.testing.assert_allclose(k_mlp[0, 2, 1], expected, **F32_TOL)
    assert k_mlp.shape == v_mlp.shape == (2, 5, 3, 4) and not np.allclose(k_mlp, v_mlp)


@pytest.mark.parametrize("block_size,stride,select_size", [(4, 2, 8), (6, 2, 10), (4, 4, 4), (3, 1, 3), (8, 2, 8)])
def test_compression_to_selection_is_the_overlap_map(block_size, stride, select_size):
    cfg = nsa.NSAConfig(block_size=block_size, stride=stride, select_size=select_size, num_selected=3)
    for length in (block_size, 23, 40):
        num_compressed = _nsa_core.num_compressed_blocks(length, block_size, stride)
        num_select = _nsa_core.num_selection_blocks(length, select_size)
        probs = np.random.default_rng(length).random((3, num_compressed))
        mapped = _nsa_core.compression_to_selection(jnp.asarray(probs), block_size, stride, select_size, num_select)
        np.testing.assert_allclose(mapped, probs @ _nsa_reference._overlap(num_compressed, num_select, cfg),
                                   rtol=1e-12)
        # every compression block's score is spread over l/d chunks, nothing lost
        np.testing.assert_allclose(np.sum(mapped, -1), probs.sum(-1) * block_size / stride, rtol=1e-12)


def test_block_scores_sum_the_group():
    cfg = nsa.NSAConfig(block_size=4, stride=4, select_size=4, num_selected=2, local_blocks=1)
    q, k, v, _, _ = make_inputs(Case(cfg, 1, 14, 4, 2, 4), seed=8)
    k_cmp, _ = nsa.compress_kv(k, v, cfg)
    scores = nsa.block_scores(q, k_cmp, cfg)
    assert scores.shape == (1, 14, 2, 4)
    # l = l' = d: a selection block's score is its compressed probability, summed over the group
    logits = jnp.einsum("bthd,bchd->bhtc", q, jnp.repeat(k_cmp, 2, axis=2)) * cfg.softmax_scale(4)
    t = 13  # sees blocks 0, 1, 2
    probs = jax.nn.softmax(logits[0, :, t, :3], axis=-1).reshape(2, 2, 3).sum(1)
    np.testing.assert_allclose(scores[0, t, :, :3], probs, **F32_TOL)
    np.testing.assert_array_equal(scores[0, t, :, 3], 0)


def select_oracle(scores: np.ndarray, t: int, cfg: nsa.NSAConfig) -> list[int]:
    """Forced blocks in index order, then the best scores (stable), causal, -1 padded."""
    own = t // cfg.select_size
    forced = [j for j in range(len(scores)) if j <= own and (j < cfg.initial_blocks or j > own - cfg.local_blocks)]
    rest = [j for j in np.argsort(-scores, kind="stable") if j <= own and j not in forced]
    picks = (forced + rest)[: cfg.num_selected]
    return picks + [-1] * (cfg.num_selected - len(picks))


@pytest.mark.parametrize("initial,local", [(1, 2), (0, 0), (2, 1)])
def test_select_blocks(initial, local, rng):
    cfg = nsa.NSAConfig(block_size=4, stride=4, select_size=4, num_selected=4, initial_blocks=initial,
                        local_blocks=local)
    scores = rng.integers(0, 3, size=(30, 9)).astype(np.float32)  # many ties
    positions = rng.integers(0, 36, size=30)
    ids = nsa.select_blocks(jnp.asarray(scores), cfg, positions=jnp.asarray(positions))
    assert ids.dtype == jnp.int32
    assert ids.tolist() == [select_oracle(s, int(t), cfg) for s, t in zip(scores, positions)]
    default = nsa.select_blocks(jnp.asarray(scores[None, :, None, :]), cfg)  # positions arange(T)
    assert default[0, :, 0].tolist() == [select_oracle(s, t, cfg) for t, s in enumerate(scores)]


def test_selected_and_window_branches_alone():
    cfg = nsa.NSAConfig(block_size=2, stride=2, select_size=4, num_selected=2, initial_blocks=0, local_blocks=0,
                        window=3, query_tile=4)
    q, k, v, _, _ = make_inputs(Case(cfg, 1, 10, 2, 1, 4), seed=9)
    # tokens 8, 9 for everyone; -1 and a block past the end (7) add nothing
    ids = jnp.broadcast_to(jnp.array([2, -1], jnp.int32), (1, 10, 1, 2))
    past_end = jnp.broadcast_to(jnp.array([7, 2], jnp.int32), (1, 10, 1, 2))
    np.testing.assert_array_equal(nsa.selected_attention(q, k, v, past_end, cfg),
                                  nsa.selected_attention(q, k, v, ids, cfg))
    out = nsa.selected_attention(q, k, v, ids, cfg)
    np.testing.assert_array_equal(out[:, :8], 0)  # block 2 starts after them
    np.testing.assert_allclose(out[:, 9], dense_causal(q[:, 8:], k[:, 8:], v[:, 8:], 0.5)[:, 1], **F32_TOL)
    window = nsa.sliding_window_attention(q, k, v, cfg)
    np.testing.assert_allclose(window[:, 6], dense_causal(q[:, 4:7], k[:, 4:7], v[:, 4:7], 0.5)[:, 2], **F32_TOL)


@pytest.mark.parametrize("seed", [0, 1])
def test_selected_attention_kernel_in_interpret_mode(seed):
    """The Pallas kernel (jax_topk/_nsa_pallas.py, run by Pallas's interpreter)
    equals the plain-JAX branch on a real selection, and on -1 / past-the-end ids."""
    from jax_topk import _nsa_pallas

    case = random_case(seed)
    q, k, v, _, params = make_inputs(case, seed=seed)
    k_cmp, _ = nsa.compress_kv(k, v, case.cfg, params=params)
    ids = nsa.select_blocks(nsa.block_scores(q, k_cmp, case.cfg), case.cfg)
    for block_ids in (ids, jnp.where(ids % 3 == 0, -1, ids), ids + 1000 * (ids % 2)):
        np.testing.assert_allclose(
            _nsa_pallas.selected_attention(q, k, v, block_ids, cfg=case.cfg, interpret=True),
            nsa.selected_attention(q, k, v, block_ids, case.cfg), **F32_TOL)


@pytest.mark.parametrize("initial,local", [(0, 1), (1, 0), (1, 1), (1, 2), (2, 1), (2, 3), (3, 2)])
def test_forced_slots_are_what_select_puts_first(initial, local):
    """The selected kernel's forced-block pass assumes ``select`` puts a
    token's forced blocks first, ascending, then -1 up to initial + local
    slots (``_nsa_pallas._forced_slot``): checked on random scores for every
    selection block of a sequence, and that ``_forced_first`` accepts those
    ids and refuses them with a NaN score (ranked above the forced blocks)."""
    from jax_topk import _nsa_pallas

    cfg = nsa.NSAConfig(block_size=4, stride=4, select_size=4, num_selected=6, initial_blocks=initial,
                        local_blocks=local)
    slots = initial + local
    positions = jnp.arange(40, dtype=jnp.int32)  # selection blocks 0 .. 9
    scores = jnp.asarray(np.random.default_rng(slots).standard_normal((40, 10)), jnp.float32)
    ids = nsa.select_blocks(scores, cfg, positions=positions)
    own = positions // cfg.select_size
    want = jnp.stack([_nsa_pallas._forced_slot(cfg, slot, own) for slot in range(slots)], axis=-1)
    np.testing.assert_array_equal(ids[:, :slots], want)
    first = lambda ids: _nsa_pallas._forced_first(cfg, lambda slot: ids[:, slot], own)
    assert bool(jnp.all(first(ids)))
    nan_ids = nsa.select_blocks(scores.at[:, 0].set(jnp.nan).at[:, 5].set(jnp.nan), cfg, positions=positions)
    np.testing.assert_array_equal(first(nan_ids), [bool(jnp.all(n[:slots] == w)) for n, w in zip(nan_ids, want)])
    assert not bool(jnp.all(first(nan_ids)))


@pytest.mark.parametrize("length", [37, 64])
def test_selected_kernel_mixes_the_branches(length):
    """With the other branches and the gates, the kernel returns
    nsa_attention's mix of the three (rows padded to the dot's 16, an odd length)."""
    from jax_topk import _nsa_dispatch, _nsa_pallas

    case = Case(KERNEL_CFG, 2, length, 4, 2, 16)
    q, k, v, gates, _ = make_inputs(case, seed=length)
    k_cmp, v_cmp = nsa.compress_kv(k, v, case.cfg)
    ids = nsa.select_blocks(nsa.block_scores(q, k_cmp, case.cfg), case.cfg)
    rng = np.random.default_rng(length)
    compressed, window = (jnp.asarray(rng.standard_normal(q.shape), q.dtype) for _ in range(2))
    got = _nsa_pallas.selected_attention(q, k, v, ids, (compressed, window, gates), cfg=case.cfg, interpret=True)
    want = _nsa_dispatch.mix_branches(compressed, nsa.selected_attention(q, k, v, ids, case.cfg), window, gates,
                                      q.dtype)
    np.testing.assert_allclose(got, want, **F32_TOL)


@pytest.mark.parametrize("length", [5, 61, 70])
def test_selected_kernel_reads_compressed_rows(length):
    """The gate mix reads the compressed branch where ``_nsa_cudnn.compressed_rows``
    leaves it (here with XLA's attention in cuDNN's place): the same output and
    gradients as from the branch's own layout, for sequences shorter than a
    compression block (no rows), with an odd row count (cuDNN's even padding)
    and an even one."""
    from jax_topk import _nsa_cudnn, _nsa_dispatch, _nsa_pallas

    case = Case(KERNEL_CFG, 1, length, 32, 2, 16)
    q, k, v, gates, _ = make_inputs(case, seed=length)
    k_cmp, v_cmp = nsa.compress_kv(k, v, case.cfg)
    ids = nsa.select_blocks(nsa.block_scores(q, k_cmp, case.cfg), case.cfg)
    rows, _ = _nsa_cudnn.compressed_rows(q, k_cmp, v_cmp, case.cfg, lse_length=length,
                                         attention=_xla_causal_attention)
    tokens = _nsa_cudnn.rows_to_tokens(rows, case.cfg, q)
    np.testing.assert_allclose(tokens, nsa.compressed_attention(q, k_cmp, v_cmp, case.cfg), **F32_TOL)
    if rows is None:
        return
    assert _nsa_pallas.takes_compressed_rows(case.q_heads // case.kv_heads)
    window = jnp.asarray(np.random.default_rng(length).standard_normal(q.shape), q.dtype)
    cotangent = jnp.asarray(np.random.default_rng(length + 1).standard_normal(q.shape), q.dtype)
    mixed = lambda compressed, q, g: _nsa_dispatch._selected_mixed_kernel(q, k, v, ids, compressed, window, g,
                                                                          case.cfg, True)
    got, pull = jax.vjp(mixed, rows, q, gates)
    want, want_pull = jax.vjp(lambda rows, q, g: mixed(_nsa_cudnn.rows_to_tokens(rows, case.cfg, q), q, g),
                              rows, q, gates)
    np.testing.assert_allclose(got, want, **F32_TOL)  # not bitwise: XLA may contract the interpreted mix to FMAs
    assert_trees_close(pull(cotangent), want_pull(cotangent), **F32_TOL)


@pytest.mark.parametrize("segment_visits", [3, 1024])
@pytest.mark.parametrize("mixed", [False, True])
def test_selected_kernel_gradients(monkeypatch, request, segment_visits, mixed):
    """The selected branch's backward kernels (dq per token; dk, dv per key
    block over the tokens that chose it, in segments: 3 visits splits every
    block into several) against the plain branch's VJP, on ids with -1,
    repeats and blocks past the end; and through the mixing kernel, the
    gradients of every mixed input."""
    from jax_topk import _nsa_dispatch, _nsa_pallas

    monkeypatch.setattr(_nsa_pallas, "_SEGMENT_VISITS", segment_visits)
    jax.clear_caches()  # the segment size is read when a call is traced
    request.addfinalizer(jax.clear_caches)
    case = Case(KERNEL_CFG, 2, 70, 4, 2, 16)
    q, k, v, gates, _ = make_inputs(case, seed=segment_visits)
    rng = np.random.default_rng(segment_visits)
    num_blocks = _nsa_core.num_selection_blocks(case.length, case.cfg.select_size)
    ids = jnp.asarray(rng.integers(-1, num_blocks + 2, (2, case.length, 2, case.cfg.num_selected)), jnp.int32)
    ids = ids.at[:, :, :, 1].set(ids[:, :, :, 0])  # every token picks a block twice (or -1 twice)
    cotangent = jnp.asarray(rng.standard_normal(q.shape), q.dtype)
    compressed, window = (jnp.asarray(rng.standard_normal(q.shape), q.dtype) for _ in range(2))
    plain = lambda q, k, v: nsa.selected_attention(q, k, v, ids, dataclasses.replace(case.cfg, implementation="xla"))
    if mixed:
        got = jax.vjp(lambda q, k, v, c, w, g: _nsa_dispatch._selected_mixed_kernel(q, k, v, ids, c, w, g, case.cfg,
                                                                                     True),
                      q, k, v, compressed, window, gates)
        want = jax.vjp(lambda q, k, v, c, w, g: _nsa_dispatch.mix_branches(c, plain(q, k, v), w, g, q.dtype),
                       q, k, v, compressed, window, gates)
    else:
        got = jax.vjp(lambda q, k, v: _nsa_dispatch._selected_kernel(q, k, v, ids, case.cfg, True), q, k, v)
        want = jax.vjp(plain, q, k, v)
    np.testing.assert_allclose(got[0], want[0], **F32_TOL)
    assert_trees_close(got[1](cotangent), want[1](cotangent), **F32_TOL)


def test_visit_segments():
    """The (token, block) visits by block, cut into segments of at most S visits,
    against a count in numpy: every visit in exactly one segment of its block."""
    from jax_topk import _nsa_pallas

    rng = np.random.default_rng(0)
    num_blocks, slots, size = 5, 4, _nsa_pallas._SEGMENT_VISITS
    ids = rng.integers(-1, num_blocks, (2, 3 * size // 4, 3, slots)).astype(np.int32)
    ids[0, :, 0, 0] = 0  # a block picked by every token: two segments
    tokens, segments, first = _nsa_pallas._visit_segments(jnp.asarray(ids), num_blocks)
    for b in range(2):
        for h in range(3):
            seen = []
            for block in range(num_blocks):
                for s in range(first[b, h, block], first[b, h, block + 1]):
                    got_block, start, end = map(int, segments[b, h, s])
                    assert got_block == block and 0 < end - start <= size
                    seen += [(int(t), block) for t in tokens[b, h, start:end]]
            want = sorted((t, block) for t in range(ids.shape[1]) for block in ids[b, t, h] if block >= 0)
            assert sorted(seen) == want and len(seen) == len(want)
            assert np.all(segments[b, h, first[b, h, -1]:] == np.array([-1, 0, 0]))


# ----------------------------------------------------------------------------- the kernel path

# Shapes the kernels take (powers of two: D, Hq/Hkv, l', l'/d), small enough for the interpreter.
KERNEL_CFG = nsa.NSAConfig(block_size=8, stride=4, select_size=16, num_selected=4, window=24, local_blocks=1)


@pytest.mark.parametrize("length,batch,compression", [(150, 1, "mean"), (77, 2, "mlp")])
def test_pallas_implementation_matches_reference(length, batch, compression):
    """implementation="pallas" (the kernels, by Pallas's interpreter here) against
    the reference, forward and gradients; its gradients are the plain VJPs."""
    cfg = dataclasses.replace(KERNEL_CFG, compression=compression, implementation="pallas")
    case = Case(cfg, batch, length, 4, 2, 16)
    q, k, v, g, params = make_inputs(case, seed=length)
    cotangent = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), q.dtype)
    got = output_and_grads(nsa.nsa_attention, cfg, q, k, v, g, params, cotangent)
    want = output_and_grads(nsa.reference, cfg, q, k, v, g, params, cotangent)
    assert_trees_close(got, want, **F32_TOL)


@pytest.mark.parametrize("length,chunks,widths", [(300, 3, 2), (1100, 9, 5)])
def test_pallas_selection_runs_in_chunks(monkeypatch, length, chunks, widths):
    """Queries past the first block-score chunk (lax.map over chunks, each
    scoring only the steps of blocks its queries see: runs of chunks of equal
    width): the selection equals the plain path's."""
    from jax_topk import _nsa_pallas, _nsa_tiled

    monkeypatch.setattr(_nsa_pallas, "_SELECTION_CHUNK", 128)
    jax.clear_caches()  # the chunk is read when a call is traced
    q, k, v, _, _ = make_inputs(Case(KERNEL_CFG, 1, length, 2, 1, 16))
    k_cmp, v_cmp = nsa.compress_kv(k, v, KERNEL_CFG)
    _, lse = _nsa_pallas.compressed_attention(q, k_cmp, v_cmp, cfg=KERNEL_CFG, interpret=True)
    assert lse.shape[1] == 128 * chunks
    _, blocks_per_step, steps = _nsa_pallas._block_layout(KERNEL_CFG, lse.shape[1])
    assert len(set(_nsa_pallas._chunk_steps(KERNEL_CFG, range(0, lse.shape[1], 128), 128, blocks_per_step,
                                            steps))) == widths
    got = _nsa_pallas.selection_ids(q, k_cmp, lse, cfg=KERNEL_CFG, interpret=True)
    _, want = _nsa_tiled.compressed_and_selection(q, k_cmp, v_cmp, cfg=KERNEL_CFG)
    np.testing.assert_array_equal(got, want)
    jax.clear_caches()


@pytest.mark.parametrize("cfg", [nsa.NSAConfig(), KERNEL_CFG, nsa.NSAConfig(select_size=32, num_selected=4)])
def test_selection_chunks_score_every_block_their_queries_see(cfg):
    """``_chunk_steps``: each chunk's width holds its last query's own block,
    widths never shrink from chunk to chunk (runs of equal width share a
    lax.map) and take at most ``_WIDTH_RUNS`` values."""
    from jax_topk import _nsa_pallas

    for length in (100, 1000, 4097, 20000, 65536, 300000):
        padded = _nsa_pallas.padded_length(length)
        chunk = min(_nsa_pallas._SELECTION_CHUNK, padded)
        _, blocks_per_step, steps = _nsa_pallas._block_layout(cfg, padded)
        starts = range(0, padded, chunk)
        widths = _nsa_pallas._chunk_steps(cfg, starts, chunk, blocks_per_step, steps)
        for start, width in zip(starts, widths):
            assert (start + chunk - 1) // cfg.select_size < width * blocks_per_step <= steps * blocks_per_step
        assert widths == sorted(widths) and widths[-1] == steps
        assert len(set(widths)) <= _nsa_pallas._WIDTH_RUNS


def _xla_causal_attention(q, k, v, scale):
    """What ``_nsa_cudnn`` asks of cuDNN, by XLA (CPU): top-left causal attention and its lse."""
    out, lse = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, implementation="xla",
                                            return_residual=True)
    return out, lse.astype(jnp.float32)


@pytest.mark.parametrize("block_size, stride, length", [
    (32, 16, 1000), (32, 16, 31), (32, 16, 32), (32, 16, 47), (32, 16, 48),
    (8, 4, 61), (12, 4, 50), (4, 4, 23), (3, 1, 17), (6, 2, 6)])
def test_compressed_attention_by_residue_classes(block_size, stride, length):
    """``_nsa_cudnn.compressed_attention`` (the compressed branch as causal flash
    attention per residue class of the queries, here with XLA's attention in
    place of cuDNN's) against a float64 numpy oracle of the branch and of its
    base-2 log-sum-exp: every (l, d) shape of the split (d = 1, l = d, l = 3d),
    lengths below, at and past l, multiples of d and not, and GQA groups."""
    from jax_topk import _nsa_cudnn

    cfg = nsa.NSAConfig(block_size=block_size, stride=stride, select_size=4 * block_size)
    rng = np.random.default_rng(length)
    batch, q_heads, kv_heads, dim = 2, 6, 2, 8
    num_blocks = _nsa_core.num_compressed_blocks(length, block_size, stride)
    q = jnp.asarray(rng.standard_normal((batch, length, q_heads, dim)), jnp.float32)
    k_cmp, v_cmp = (jnp.asarray(rng.standard_normal((batch, num_blocks, kv_heads, dim)), jnp.float32)
                    for _ in range(2))
    lse_length = length + 5
    out, lse = _nsa_cudnn.compressed_attention(q, k_cmp, v_cmp, cfg, lse_length=lse_length,
                                               attention=_xla_causal_attention)

    group = q_heads // kv_heads
    qn, kn, vn = (np.repeat(np.asarray(x, np.float64), g, axis=2) for x, g in ((q, 1), (k_cmp, group), (v_cmp, group)))
    scores = np.einsum("bthd,bihd->bhti", qn, kn) * cfg.softmax_scale(dim)
    visible = _nsa_core.compressed_visible(np.arange(length), num_blocks, block_size, stride)  # [T, Nc]
    scores = np.where(np.asarray(visible)[None, None], scores, -np.inf)
    top = np.max(scores, axis=-1, initial=-np.inf, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(top), top, 0))
    total = weights.sum(-1, keepdims=True)
    want_out = np.einsum("bhti,bihd->bthd", weights / np.where(total > 0, total, 1), vn)
    want_lse = np.where(total[..., 0] > 0, (np.log(np.where(total[..., 0] > 0, total[..., 0], 1)) + top[..., 0])
                        / np.log(2), np.inf).transpose(0, 2, 1)  # [B, T, Hq]

    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (batch, lse_length, kv_heads, group) and lse.dtype == jnp.float32
    np.testing.assert_allclose(out, want_out, **F32_TOL)
    np.testing.assert_allclose(lse[:, :length].reshape(batch, length, q_heads), want_lse, **F32_TOL)
    assert np.all(np.isinf(lse[:, length:]))


def test_pallas_implementation_refuses_other_shapes():
    q, k, v, g, _ = make_inputs(Case(KERNEL_CFG, 1, 20, 6, 2, 16))
    with pytest.raises(ValueError, match=r"implementation='pallas' cannot run .* Hq/Hkv=3 is not a power of two"):
        nsa.nsa_attention(q, k, v, g, dataclasses.replace(KERNEL_CFG, implementation="pallas"))


gpu_only = pytest.mark.skipif(TEST_PLATFORM == "cpu", reason="the GPU kernels need JAX_TOPK_TEST_PLATFORM=gpu")


def test_pallas_kernels_lower_to_triton_modules_the_verifier_accepts(monkeypatch):
    """Every NSA Pallas kernel, lowered for CUDA here (no GPU), gives Triton
    modules that MLIR's verifier accepts, as XLA's Triton parser demands on
    the GPU. (The forced pass's walk once began at ``jnp.where(forced, 3,
    0)``, which Triton's lowering made an i1 loop bound: it failed only on
    the GPU until this check.)"""
    lowering = pytest.importorskip("jax._src.pallas.triton.lowering")
    from jax_topk import _nsa_cudnn, _nsa_pallas

    if not hasattr(lowering, "lower_jaxpr_to_triton_module"):
        pytest.skip("this jax's Pallas Triton lowering has another entry point")
    checked, failures = [], []
    lower_module = lowering.lower_jaxpr_to_triton_module

    def lower_and_verify(*args, **kwargs):
        result = lower_module(*args, **kwargs)
        checked.append(1)
        try:
            result.module.operation.verify()
        except Exception as error:  # noqa: BLE001 -- the verifier's message is the finding
            failures.append(str(error)[:800])
        return result

    monkeypatch.setattr(lowering, "lower_jaxpr_to_triton_module", lower_and_verify)
    cfg = nsa.NSAConfig()
    batch, length, q_heads, kv_heads, dim = 1, 300, 32, 2, 64
    num_cmp = _nsa_core.num_compressed_blocks(length, cfg.block_size, cfg.stride)
    f = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)
    q, k, k_cmp = f(batch, length, q_heads, dim), f(batch, length, kv_heads, dim), f(batch, num_cmp, kv_heads, dim)
    ids = f(batch, length, kv_heads, cfg.num_selected, dtype=jnp.int32)
    padded = _nsa_pallas.padded_length(length)
    keys_per_step, _, steps = _nsa_pallas._block_layout(cfg, padded)
    lse = f(batch, padded, kv_heads, q_heads // kv_heads, dtype=jnp.float32)
    rows_per_token = max(q_heads // kv_heads, _nsa_pallas._MIN_DOT)  # the selected kernel's rows
    selected_lse = f(batch, length, kv_heads, rows_per_token, dtype=jnp.float32)
    gates = f(batch, length, q_heads, 3)
    rows, _ = jax.eval_shape(lambda q, kc: _nsa_cudnn.compressed_rows(
        q, kc, kc, cfg, lse_length=length, attention=_xla_causal_attention), q, k_cmp)
    kernels = {  # name: (function, its arguments)
        "compressed": (lambda q, kc: _nsa_pallas.compressed_attention(q, kc, kc, cfg=cfg), (q, k_cmp)),
        "block scores": (lambda q, kc, lse: _nsa_pallas._block_scores_chunk(
            0, _nsa_pallas._pad_tokens(_nsa_core.group_queries(q, kv_heads), padded),
            _nsa_pallas._pad_tokens(kc, steps * keys_per_step), lse, cfg=cfg, chunk=padded, num_blocks=num_cmp,
            interpret=False), (q, k_cmp, lse)),
        "selected": (lambda q, k, ids: _nsa_pallas.selected_attention(q, k, k, ids, cfg=cfg), (q, k, ids)),
        "selected, mixed, residuals": (lambda q, k, ids, rows, g: _nsa_pallas.selected_attention(
            q, k, k, ids, (rows, q, g), cfg=cfg, residuals=True), (q, k, ids, rows, gates)),
        "selected backward": (lambda q, k, ids, lse: _nsa_pallas.selected_attention_bwd(
            q, k, k, ids, q, lse, q, cfg=cfg), (q, k, ids, selected_lse)),
    }
    for name, (kernel, arguments) in kernels.items():
        before = len(checked)
        with jax.enable_x64(False):  # as users run (the suite enables x64; there i32 bounds are i64)
            jax.jit(kernel).trace(*arguments).lower(lowering_platforms=("cuda",))
        assert len(checked) > before, f"{name}: no Triton module was lowered"
    assert not failures, "\n\n".join(failures)


def test_triton_registers_tool_pairs_each_kernel_with_its_launch(monkeypatch):
    """benchmarks/triton_registers.py (registers of the Pallas kernels without
    a GPU) takes each lowered Triton module with the launch its custom call
    names: the selected branch's two kernels, in launch order, at
    ``_nsa_pallas.LAUNCH``'s entries, also after one is changed."""
    pytest.importorskip("jax._src.pallas.triton.lowering")
    import importlib.util
    from pathlib import Path

    from jax_topk import _nsa_pallas

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "triton_registers.py"
    spec = importlib.util.spec_from_file_location("triton_registers", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    cfg = nsa.NSAConfig()
    f = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)
    q, k, ids = f(1, 300, 32, 64), f(1, 300, 2, 64), f(1, 300, 2, cfg.num_selected, dtype=jnp.int32)
    selected = lambda q, k, ids: _nsa_pallas.selected_attention(q, k, k, ids, cfg=cfg)
    monkeypatch.setitem(_nsa_pallas.LAUNCH, "selected_forced", (8, 1))
    kernels = tool.lowered_kernels(selected, q, k, ids)
    assert [(name, warps, stages) for name, _, warps, stages in kernels] == [
        ("_forced_kernel", 8, 1), ("_selected_kernel", *_nsa_pallas.LAUNCH["selected"])]
    assert [module.startswith(f"module @{name}") for name, module, _, _ in kernels] == [True, True]


@gpu_only
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("length", [1000, 4500])
def test_gpu_kernels_match_plain_branches(dtype, length):
    """Each GPU kernel against its plain-JAX branch on the same inputs: the
    compressed branch, the selection (block scores + top_k; 4500 > one chunk),
    the selected branch on the same ids, and cuDNN's window (half dtypes)."""
    from jax_topk import _nsa_dispatch, _nsa_pallas, _nsa_tiled

    cfg = nsa.NSAConfig()
    dt = jnp.dtype(dtype)
    q, k, v, _, _ = make_inputs(Case(cfg, 1, length, 8, 2, 64), dtype=dt, seed=length)
    tol = F32_TOL if dt == jnp.float32 else dict(rtol=2e-2, atol=2e-2)
    k_cmp, v_cmp = (x.astype(dt) for x in nsa.compress_kv(k, v, cfg))
    out, lse = _nsa_pallas.compressed_attention(q, k_cmp, v_cmp, cfg=cfg)
    plain_out, plain_ids = _nsa_tiled.compressed_and_selection(q, k_cmp, v_cmp, cfg=cfg)
    assert_trees_close(out, plain_out, **tol)
    ids = _nsa_pallas.selection_ids(q, k_cmp, lse, cfg=cfg)
    # Scores equal up to the order of float sums: a pick differs only at a near-tie.
    assert float(jnp.mean(jnp.all(ids == plain_ids, axis=-1))) > 0.999
    assert_trees_close(_nsa_pallas.selected_attention(q, k, v, plain_ids, cfg=cfg),
                       _nsa_tiled.selected_attention(q, k, v, plain_ids, cfg=cfg), **tol)
    how = _nsa_dispatch.plan(cfg, q.shape, q.dtype, 2, "test")
    assert how.kernels and not how.interpret and how.cudnn_window == (dt != jnp.float32)
    assert how.cudnn_compressed == (dt != jnp.float32) and how.native_scores == (dt != jnp.float32)
    assert_trees_close(nsa.sliding_window_attention(q, k, v, cfg),
                       nsa.sliding_window_attention(q, k, v, dataclasses.replace(cfg, implementation="xla")), **tol)


@gpu_only
@pytest.mark.parametrize("length", [31, 32, 1000, 4500])
def test_gpu_cudnn_compressed_matches_the_kernel(length):
    """cuDNN's compressed branch (per residue class) against the Pallas kernel
    on the same bfloat16 inputs: outputs, base-2 log-sum-exp (+inf where no
    block is seen and past T), and the blocks selected from either."""
    from jax_topk import _nsa_cudnn, _nsa_pallas

    cfg = nsa.NSAConfig()
    q, k, v, _, _ = make_inputs(Case(cfg, 2, length, 8, 2, 64), dtype=jnp.bfloat16, seed=length)
    k_cmp, v_cmp = (x.astype(q.dtype) for x in nsa.compress_kv(k, v, cfg))
    out, lse = _nsa_pallas.compressed_attention(q, k_cmp, v_cmp, cfg=cfg)
    got_out, got_lse = jax.jit(lambda *a: _nsa_cudnn.compressed_attention(*a, cfg, lse_length=lse.shape[1]))(
        q, k_cmp, v_cmp)
    assert got_out.dtype == q.dtype and got_lse.shape == lse.shape
    assert_trees_close(got_out, out, rtol=2e-2, atol=2e-2)
    want, got = np.asarray(lse)[:, :length], np.asarray(got_lse)
    assert np.all(np.isinf(got[:, length:]))  # the kernel's rows past T are padding: any value
    seen = np.isfinite(want)
    assert np.array_equal(np.isfinite(got[:, :length]), seen)
    np.testing.assert_allclose(got[:, :length][seen], want[seen], rtol=1e-4, atol=1e-4)
    if length > cfg.select_size * cfg.num_selected:
        ids = _nsa_pallas.selection_ids(q, k_cmp, lse, cfg=cfg)
        got_ids = _nsa_pallas.selection_ids(q, k_cmp, got_lse, cfg=cfg)
        assert float(jnp.mean(jnp.all(got_ids == ids, axis=-1))) > 0.999


@gpu_only
def test_gpu_selected_kernel_gradients_across_segments():
    """The selected branch's backward kernels on the GPU where a key block's
    visits span several segments (block 0 chosen by all 2500 tokens: segments
    of at most 1024 visits, summed in order by the second kernel), against the
    plain branch's VJP in float32."""
    from jax_topk import _nsa_dispatch, _nsa_pallas

    cfg = nsa.NSAConfig()
    case = Case(cfg, 1, 2500, 8, 2, 64)
    q, k, v, _, _ = make_inputs(case, seed=11)
    rng = np.random.default_rng(11)
    num_blocks = _nsa_core.num_selection_blocks(case.length, cfg.select_size)
    ids = rng.integers(-1, num_blocks, (1, case.length, 2, cfg.num_selected)).astype(np.int32)
    ids[..., 0] = 0
    _, _, first = _nsa_pallas._visit_segments(jnp.asarray(ids), num_blocks)
    assert int(first[0, 0, 1] - first[0, 0, 0]) >= 3  # block 0: at least 2500 visits, three segments or more
    ids = jnp.asarray(ids)
    cotangent = jnp.asarray(rng.standard_normal(q.shape), q.dtype)
    plain = lambda q, k, v: nsa.selected_attention(q, k, v, ids, dataclasses.replace(cfg, implementation="xla"))
    got = jax.vjp(lambda q, k, v: _nsa_dispatch._selected_kernel(q, k, v, ids, cfg, False), q, k, v)
    want = jax.vjp(plain, q, k, v)
    np.testing.assert_allclose(got[0], want[0], **F32_TOL)
    assert_trees_close(got[1](cotangent), want[1](cotangent), rtol=1e-4, atol=1e-4)


def _native_and_pallas_scores(cfg, q, k_cmp, lse, start: int, chunk: int):
    """One chunk's selection scores ``[B, Hkv, chunk, Ns']`` from the CUDA
    kernel and from the Pallas kernel, on the same inputs, and the blocks
    ``select_ranked`` picks from the CUDA kernel's ranks of every block
    (``ranked=True``, checked here to be exactly ``_nsa_tiled.rank_blocks``
    of its scores)."""
    from jax_topk import _nsa_native, _nsa_pallas, _nsa_tiled

    padded, kv_heads, dim = lse.shape[1], k_cmp.shape[2], q.shape[3]
    keys_per_step, blocks_per_step, steps = _nsa_pallas._block_layout(cfg, padded)
    queries = _nsa_pallas._pad_tokens(_nsa_core.group_queries(q, kv_heads), padded)
    start = jnp.int32(start)
    native = functools.partial(_nsa_native.block_scores, start, queries, k_cmp, lse, cfg=cfg,
                               num_blocks=k_cmp.shape[1], chunk=chunk, width=steps * blocks_per_step,
                               scale=_nsa_pallas._score_scale(cfg.softmax_scale(dim)))
    scores, ranked = native(), native(ranked=True)
    positions = start + jnp.arange(chunk, dtype=jnp.int32)
    np.testing.assert_array_equal(ranked, _nsa_tiled.rank_blocks(scores, positions, cfg))
    pallas = _nsa_pallas._block_scores_chunk(start, queries, _nsa_pallas._pad_tokens(k_cmp, steps * keys_per_step),
                                             lse, cfg=cfg, chunk=chunk, num_blocks=k_cmp.shape[1], interpret=False)
    return np.asarray(scores), np.asarray(pallas), _nsa_tiled.select_ranked(ranked, positions, cfg)


@gpu_only
@pytest.mark.parametrize("dtype,dim,q_heads", [("bfloat16", 128, 32), ("float16", 64, 8), ("bfloat16", 64, 2)])
@pytest.mark.parametrize("sizes", [(32, 16, 64), (16, 16, 64), (64, 16, 64), (32, 8, 64), (24, 8, 64)])
def test_gpu_native_block_scores_match_the_pallas_kernel(dtype, dim, q_heads, sizes):
    """The CUDA block-score kernel (tensor cores: on an H100/H200 the warpgroup
    kernel for groups of more than 8 heads, else a warp per two queries)
    against the Pallas kernel on the same inputs: every chunk's scores for the
    real queries (groups of 16, 4 and 1 heads: two head tiles and one;
    selection blocks reaching 0 to 3 compression blocks into the step before;
    16 and 8 selection blocks per step), and the blocks selected from either."""
    from jax_topk import _nsa_native, _nsa_pallas

    block_size, stride, select_size = sizes
    cfg = nsa.NSAConfig(block_size=block_size, stride=stride, select_size=select_size, num_selected=8)
    length = 4500  # two chunks of queries, the second partly past T
    q, k, v, _, _ = make_inputs(Case(cfg, 2, length, q_heads, 2, dim), dtype=jnp.dtype(dtype), seed=sum(sizes))
    assert _nsa_native.unsupported(cfg, q.dtype, q_heads // 2, dim) is None
    k_cmp, v_cmp = (x.astype(q.dtype) for x in nsa.compress_kv(k, v, cfg))
    _, lse = _nsa_pallas.compressed_attention(q, k_cmp, v_cmp, cfg=cfg)
    chunk = _nsa_pallas._SELECTION_CHUNK
    every_block = []  # each chunk's ids from every block's ranks
    for start in range(0, lse.shape[1], chunk):
        native, pallas, chunk_ids = _native_and_pallas_scores(cfg, q, k_cmp, lse, start, chunk)
        real = min(chunk, length - start)
        np.testing.assert_allclose(native[:, :, :real], pallas[:, :, :real], rtol=1e-4, atol=1e-6)
        every_block.append(chunk_ids)
    ids = _nsa_pallas.selection_ids(q, k_cmp, lse, cfg=cfg)
    got = _nsa_pallas.selection_ids(q, k_cmp, lse, cfg=cfg, native=True)
    assert float(jnp.mean(jnp.all(got == ids, axis=-1))) > 0.999
    # Each chunk ranks only the blocks its queries can see (_chunk_steps): the
    # same ids, bit for bit, as ranking every block.
    want = jnp.swapaxes(jnp.concatenate(every_block, axis=2)[:, :, :length], 1, 2)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@gpu_only
def test_gpu_native_block_scores_under_vmap():
    """vmap of the CUDA selection over a leading axis: one call over the
    mapped items (the FFI call's broadcast_all), equal to item by item."""
    from jax_topk import _nsa_pallas

    cfg = nsa.NSAConfig()
    q, k, v, _, _ = make_inputs(Case(cfg, 3, 700, 16, 1, 128), dtype=jnp.bfloat16, seed=9)
    k_cmp, v_cmp = (x.astype(q.dtype) for x in nsa.compress_kv(k, v, cfg))
    _, lse = _nsa_pallas.compressed_attention(q, k_cmp, v_cmp, cfg=cfg)
    one = functools.partial(_nsa_pallas.selection_ids, cfg=cfg, native=True)
    mapped = jax.jit(jax.vmap(lambda *a: one(*(x[None] for x in a))[0]))
    got = mapped(q, k_cmp, lse)
    want = jnp.concatenate([one(q[i:i + 1], k_cmp[i:i + 1], lse[i:i + 1]) for i in range(3)])
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert mapped.lower(q, k_cmp, lse).as_text().count("jax_topk_nsa_block_scores") == 1


@gpu_only
@pytest.mark.parametrize("q_heads", [8, 32])
def test_gpu_nsa_attention_bfloat16_matches_reference(q_heads):
    """The dispatched bfloat16 GPU path (cuDNN's compressed and window branches,
    the Pallas selection and selected kernels) against the reference, forward
    and gradients, T a multiple of no block size; groups of 4 heads (the gate
    mix reads the compressed branch in its own layout) and of 16 (in cuDNN's)."""
    from jax_topk import _nsa_dispatch, _nsa_pallas

    cfg = nsa.NSAConfig(window=100)
    q, k, v, g, params = make_inputs(Case(cfg, 1, 1001, q_heads, 2, 64), jnp.bfloat16, seed=4)
    assert _nsa_dispatch.plan(cfg, q.shape, q.dtype, 2, "test").cudnn_compressed
    assert _nsa_pallas.takes_compressed_rows(q_heads // 2) == (q_heads == 32)
    cotangent = jnp.asarray(np.random.default_rng(6).standard_normal(q.shape), jnp.bfloat16)
    got = output_and_grads(nsa.nsa_attention, cfg, q, k, v, g, params, cotangent)
    want = output_and_grads(nsa.reference, cfg, q, k, v, g, params, cotangent)
    for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
        assert np.linalg.norm(a - e) <= 2e-2 * np.linalg.norm(e) + 1e-3


@gpu_only
def test_gpu_nsa_attention_under_vmap():
    """vmap of the dispatched bfloat16 GPU path over a leading axis (two
    items; groups of 16 heads, so the gate mix reads cuDNN's layout) equals
    the items one by one."""
    cfg = nsa.NSAConfig(window=100)
    items = [make_inputs(Case(cfg, 1, 600, 32, 2, 64), jnp.bfloat16, seed=seed)[:4] for seed in (7, 8)]
    stacked = [jnp.stack(parts) for parts in zip(*items)]
    run = jax.jit(lambda q, k, v, g: nsa.nsa_attention(q, k, v, g, cfg))
    got = jax.vmap(run)(*stacked)
    for i, item in enumerate(items):
        np.testing.assert_allclose(np.asarray(got[i], np.float32), np.asarray(run(*item), np.float32),
                                   rtol=2e-2, atol=2e-2)


@gpu_only
def test_gpu_nsa_attention_matches_reference():
    """The dispatched GPU path (kernels, float32) against the reference, forward and gradients."""
    cfg = nsa.NSAConfig(window=100)
    case = Case(cfg, 2, 700, 8, 2, 64)
    q, k, v, g, params = make_inputs(case, seed=3)
    cotangent = jnp.asarray(np.random.default_rng(2).standard_normal(q.shape), q.dtype)
    got = output_and_grads(nsa.nsa_attention, cfg, q, k, v, g, params, cotangent)
    want = output_and_grads(nsa.reference, cfg, q, k, v, g, params, cotangent)
    assert_trees_close(got, want, rtol=1e-4, atol=1e-4)


def test_gates():
    params = nsa.init_gate_params(jax.random.key(0), 6, 2)
    params["bias"] = jnp.arange(6.0).reshape(2, 3)
    hidden = jnp.asarray(np.random.default_rng(1).standard_normal((3, 4, 6)), jnp.float32)
    expected = 1 / (1 + np.exp(-(np.einsum("btc,chk->bthk", hidden, params["weight"]) + params["bias"])))
    np.testing.assert_allclose(nsa.gates(hidden, params), expected, **F32_TOL)


# ----------------------------------------------------------------------------- memory


def test_no_quadratic_intermediate():
    length = 2048
    cfg = nsa.NSAConfig(block_size=8, stride=4, select_size=16, num_selected=4, window=32, compression="mlp",
                        query_tile=64)
    q = jax.ShapeDtypeStruct((1, length, 2, 8), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, length, 1, 8), jnp.float32)
    g = jax.ShapeDtypeStruct((1, length, 2, 3), jnp.float32)
    params = jax.eval_shape(lambda: nsa.init_params(jax.random.key(0), cfg, 8))
    # A dense compressed branch alone would hold T * Hq * Nc = T^2 / 2 scores here.
    bound = length * length // 8

    def loss(fn):
        return lambda q, k, v, g, p: fn(q, k, v, g, cfg, params=p).sum()

    gradient = jax.grad(loss(nsa.nsa_attention), argnums=(0, 1, 2, 3, 4))
    for program in (jax.jit(loss(nsa.nsa_attention)), jax.jit(gradient)):
        largest = largest_intermediate(jax.make_jaxpr(program)(q, kv, kv, g, params).jaxpr)
        assert largest < bound, largest
    # the check can fail: the dense reference has [B, H, T, T] masks and scores
    assert largest_intermediate(jax.make_jaxpr(jax.jit(loss(nsa.reference)))(q, kv, kv, g, params).jaxpr) >= bound


# ----------------------------------------------------------------------------- errors and docs


@pytest.mark.parametrize("kwargs,message", [
    (dict(block_size=24, stride=16), "stride=16 must divide block_size=24"),
    (dict(select_size=40, stride=16), "must divide"),
    (dict(block_size=128), "block_size=128 must be <= select_size=64"),
    (dict(num_selected=0), "num_selected=0 must be >= 1"),
    (dict(window=0), "window=0 must be >= 1"),
    (dict(stride=-16), "stride=-16 must be >= 1"),
    (dict(local_blocks=-1), "local_blocks=-1 must be >= 0"),
    (dict(num_selected=2), "forced blocks"),
    (dict(compression="max"), "compression must be 'mean' or 'mlp'"),
    (dict(scale=0.0), "scale=0.0 must be a positive"),
    (dict(query_tile=2.5), "query_tile must be an int"),
    (dict(implementation="triton"), "implementation must be one of"),
])
def test_bad_config(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(")):
        nsa.NSAConfig(**kwargs)


def zero_params(cfg, head_dim):
    shapes = jax.eval_shape(lambda: nsa.init_params(jax.random.key(0), cfg, head_dim))
    return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)


def _bad_call(kind):
    q, k, v, g, _ = make_inputs(Case(SMALL, 1, 10, 4, 2, 8))
    mlp = dataclasses.replace(SMALL, compression="mlp")
    calls = {
        "heads": lambda: nsa.nsa_attention(q[:, :, :3], k, v, g[:, :, :3], SMALL),
        "gates": lambda: nsa.nsa_attention(q, k, v, g[..., :2], SMALL),
        "dim": lambda: nsa.nsa_attention(q[..., :4], k, v, g, SMALL),
        "kv": lambda: nsa.nsa_attention(q, k, v[:, :9], g, SMALL),
        "cfg": lambda: nsa.nsa_attention(q, k, v, g, {"block_size": 4}),
        "no params": lambda: nsa.nsa_attention(q, k, v, g, mlp),
        "params for mean": lambda: nsa.nsa_attention(q, k, v, g, SMALL, params=zero_params(mlp, 8)),
        "params shape": lambda: nsa.nsa_attention(q, k, v, g, mlp, params=zero_params(mlp, 4)),
        "cu start": lambda: nsa.nsa_attention(q, k, v, g, SMALL, cu_seqlens=jnp.array([1, 10])),
        "cu order": lambda: nsa.nsa_attention(q, k, v, g, SMALL, cu_seqlens=jnp.array([0, 6, 4])),
        "cu end": lambda: nsa.nsa_attention(q, k, v, g, SMALL, cu_seqlens=jnp.array([0, 11])),
        "cu batch": lambda: nsa.nsa_attention(*(jnp.concatenate([x, x]) for x in (q, k, v, g)), SMALL,
                                              cu_seqlens=jnp.array([0, 10])),
        "cu traced": lambda: jax.jit(lambda cu: nsa.nsa_attention(q, k, v, g, SMALL, cu_seqlens=cu))(
            jnp.array([0, 10])),
        "block ids": lambda: nsa.selected_attention(q, k, v, jnp.zeros((1, 10, 2, 2), jnp.int32), SMALL),
        "k_cmp": lambda: nsa.compressed_attention(q, k, v, SMALL),
    }
    return calls[kind]


@pytest.mark.parametrize("kind,message", [
    ("heads", r"Hq=3 of q \(1, 10, 3, 8\) must be a multiple of the KV heads Hkv=2"),
    ("gates", r"gates must have shape \[B, T, Hq, 3\] = \(1, 10, 4, 3\)"),
    ("dim", r"head dim D differs: q \(1, 10, 4, 4\), k \(1, 10, 2, 8\)"),
    ("kv", r"k and v must have the same shape"),
    ("cfg", r"cfg must be a jax_topk.nsa.NSAConfig, got dict"),
    ("no params", r"compression='mlp' needs params"),
    ("params for mean", r"params were given but cfg.compression is 'mean'"),
    ("params shape", r"params\['key'\]\['pos'\] must be \[l, D\] = \(4, 8\)"),
    ("cu start", r"cu_seqlens must start at 0"),
    ("cu order", r"never decrease"),
    ("cu end", r"end at most at T=10"),
    ("cu batch", r"batch of one packed sequence"),
    ("cu traced", r"pass a static max_seqlen"),
    ("block ids", r"block_ids must have shape \[B, T, Hkv, n\] = \(1, 10, 2, 3\)"),
    ("k_cmp", r"k_cmp \(1, 10, 2, 8\) must hold the 4 compressed blocks of T=10"),
])
def test_bad_input(kind, message):
    with pytest.raises((ValueError, TypeError), match=message):
        _bad_call(kind)()


def test_docstring_examples():
    failures, tried = doctest.testmod(nsa, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert failures == 0 and tried > 0
    for name in nsa.__all__:
        assert ">>>" in getattr(nsa, name).__doc__, f"jax_topk.nsa.{name} has no example"

