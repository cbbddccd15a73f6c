"""How the primitives partition under ``jit`` with sharded inputs.

Each public primitive (``top_k``, ``sort``, ``route``, ``indexer``) has a LOCAL twin that
lowers straight to the kernel (or the pure-JAX fallback). The public one
lowers to the local one when the computation runs as one program (one device,
or inside ``shard_map``, where every mesh axis is manual); across devices it
lowers to a ``custom_partitioning`` call whose rules are here:

- Rows (every axis but the last) sharded any way: each device runs the local
  kernel on its rows. Outputs are sharded like the rows; no collective.
- The last axis sharded (vocabulary-parallel logits, expert-parallel scores):
  - ``top_k``: each device takes the top ``min(k, n_local)`` of its slice
    (global indices), the candidates are all-gathered along the sharded mesh
    axes (shards x min(k, n_local) values and indices per row, never the
    input), and a second top-k merges them. Candidates are gathered in
    shard order, so equal values keep the lower global index first: the
    result is the unsharded one, bit for bit.
  - ``route``: the same candidate merge (``_route.route_candidate_merge``:
    each device's best experts by the selection key, or each of its groups'
    best, are gathered with their logits and ids, and the kernel routes
    the candidates; a softmax normaliser the route reads is shared first as
    the row's max logit and each device's exact partial sum), wherever
    that is exact; where it is not (groups and devices that cut the
    experts unevenly, no kernel) the expert axis is gathered first.
  - ``sort``: the last axis is all-gathered and every device sorts the
    whole row (a sort's output has every element of the row).
  The outputs' last axis is never sharded.
- ``indexer`` (q, keys, weights, lengths, all leading with the batch, or
  keys every item shares): the batch axis is partitioned, shared keys
  replicated, every other axis gathered (``batch_partitioned_lowering``).

Sharding propagation: a Shardy rule (every leading axis is one factor shared by
operands and results; the outputs' last axis needs replication), or, with
GSPMD, the same rule as a callback.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec

from jax_topk import _compat

# A split strategy for a sharded last axis: (bind_local, operands, axes, params)
# -> results, run per device inside the partitioned computation.
SplitRule = Callable[..., Sequence[jax.Array]]
# Whether a split rule gives the unsharded result for one call:
# (avals_in, params, shards along the last axis, jax platform of the mesh) -> bool.
SplitGuard = Callable[..., bool]


def padded_spec(sharding, ndim: int) -> tuple:
    """The sharding's spec with one entry per dimension (None: unsharded)."""
    spec = tuple(sharding.spec) if sharding is not None and hasattr(sharding, "spec") else ()
    return spec + (None,) * (ndim - len(spec))


def output_sharding(aval) -> dict:
    """``aval.update`` keywords giving a result ``aval``'s sharding with the
    last axis unsharded (the abstract-eval rule for the outputs, whose last
    axis is never sharded); empty when ``aval`` carries no sharding."""
    sharding = getattr(aval, "sharding", None)
    if sharding is None or not hasattr(sharding, "update") or aval.ndim == 0:
        return {}
    return {"sharding": sharding.update(spec=PartitionSpec(*padded_spec(sharding, aval.ndim)[:-1], None))}


def _mesh_axes(entry) -> tuple[str, ...]:
    return entry if isinstance(entry, tuple) else (entry,)


def gather_last_axis(a: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """``a``'s last axis all-gathered over mesh ``axes``, in shard order (per device)."""
    return jax.lax.all_gather(a, axes, axis=a.ndim - 1, tiled=True)


def top_k_candidate_merge(bind_local, operands, axes: tuple[str, ...], *, k: int):
    """``top_k`` of rows whose last axis is split over mesh ``axes`` (run per
    device): local top-k, all-gather of the candidates, merge."""
    x = operands[0]
    lengths = operands[1] if len(operands) > 1 else None
    n_local = x.shape[-1]
    shard = jax.lax.axis_index(axes)
    offset = shard * n_local
    local = (x,)
    if lengths is not None:
        local += (jnp.clip(lengths - offset, 0, n_local).astype(lengths.dtype),)
    values, indices = bind_local(*local, k=min(k, n_local))
    indices = jnp.where(indices >= 0, indices + offset, indices)
    values, indices = gather_last_axis(values, axes), gather_last_axis(indices, axes)
    if lengths is None:
        merged, at = bind_local(values, k=k)
        return merged, jnp.take_along_axis(indices, at, axis=-1)
    # Padding slots (index -1) after every real candidate, keeping shard
    # order among the real ones; then a top-k over the real ones only.
    order = jnp.argsort(indices < 0, axis=-1, stable=True)
    values = jnp.take_along_axis(values, order, axis=-1)
    indices = jnp.take_along_axis(indices, order, axis=-1)
    real = jnp.sum(indices >= 0, axis=-1, dtype=jnp.int32)
    merged, at = bind_local(values, real, k=k)
    picked = jnp.take_along_axis(indices, jnp.maximum(at, 0), axis=-1)
    return merged, jnp.where(at >= 0, picked, -1)


def _is_partitioned(ctx) -> bool:
    """Whether this lowering is one program over several devices that XLA's
    partitioner splits (rather than one device, or a shard_map body)."""
    context = ctx.module_context.axis_context
    mesh = getattr(context, "mesh", None)
    manual = getattr(context, "manual_axes", None)
    if mesh is not None and manual is not None and set(manual) == set(mesh.axis_names):
        return False  # shard_map: every axis manual
    devices = getattr(context, "num_devices", None)
    if devices is None and mesh is not None:
        devices = math.prod(mesh.shape.values())
    return bool(devices and devices > 1)


# What an operand is to the partitioning, given operand 0 ``[..., n]``:
ELEMENTS = "elements"  # shaped like operand 0 (a per-token bias): sharded like it
ROWS = "rows"  # one per row, ``[...]`` (lengths): sharded like its rows
SHARED = "shared"  # the same for every row (a bias per expert, or none): replicated


# What a partitioning rule gives the shared lowering: the custom_partitioning
# partition and infer callbacks, the Shardy rule and its factors that need
# replication.
PartitionPlan = tuple[Callable, Callable, str, tuple[str, ...]]


def _lowering_over_local(local: Primitive, plan: Callable[..., PartitionPlan]) -> Callable:
    """The lowering of a public primitive over its local twin ``local``: the
    local kernel itself on one device or in a ``shard_map`` body, else a
    ``custom_partitioning`` call built from ``plan(avals_in, bind_local,
    params)``."""

    def bind_local(*operands, **params):
        return tuple(local.bind(*operands, **params))

    def lowering(ctx, *operands, **params):
        bind = lambda *ops: bind_local(*ops, **params)  # noqa: E731
        if not _is_partitioned(ctx):
            return mlir.lower_fun(bind, multiple_results=True)(ctx, *operands)
        partition, infer, rule, replicated = plan(ctx.avals_in, bind_local, params)
        call = custom_partitioning(bind)
        call.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule,
                           need_replication_factors=replicated)
        return mlir.lower_fun(lambda *ops: tuple(call(*ops)), multiple_results=True)(ctx, *operands)

    return lowering


def _mesh_platform(mesh) -> str:
    """The jax platform ("cpu", "gpu", ...) of a mesh's devices."""
    devices = getattr(mesh, "devices", None)
    return devices.flat[0].platform if devices is not None else jax.default_backend()


def partitioned_lowering(
    local: Primitive,
    *,
    roles: Callable[[Sequence], Sequence[str]],
    split_rule: SplitRule | None,
    split_applies: SplitGuard | None = None,
) -> Callable:
    """The lowering of a public primitive whose operand 0 is ``[..., n]`` and
    whose results are ``[..., m]``, over its local twin ``local``.

    ``roles(avals_in)``: each operand's role (ELEMENTS for operand 0).
    ``split_rule``: what runs per device when the last axis of operand 0 is
    sharded; None gathers that axis first. ``split_applies``: when given,
    the calls for which ``split_rule`` is used (the others gather).
    """

    def plan(avals_in, bind_local, params) -> PartitionPlan:
        ndim = avals_in[0].ndim
        operand_roles = list(roles(avals_in))

        def splits(mesh, entry) -> bool:
            """Whether a last axis sharded over mesh axes ``entry`` is split (else gathered)."""
            if split_rule is None:
                return False
            shards = math.prod(mesh.shape[a] for a in _mesh_axes(entry))
            return split_applies is None or split_applies(avals_in, params, shards, _mesh_platform(mesh))

        def operand_specs(x_spec):
            """What each operand must be sharded as, given operand 0's spec."""
            by_role = {ELEMENTS: lambda aval: x_spec, ROWS: lambda aval: x_spec[:-1],
                       SHARED: lambda aval: (None,) * aval.ndim}
            return [by_role[role](aval) for role, aval in zip(operand_roles, avals_in)]

        def shardings_for(mesh, arg_shapes):
            x_sharding = arg_shapes[0].sharding
            if not isinstance(x_sharding, NamedSharding):  # no mesh to read: run replicated
                x_spec = (None,) * ndim
            else:
                x_spec = padded_spec(x_sharding, ndim)
            if x_spec[-1] is not None and not splits(mesh, x_spec[-1]):
                x_spec = x_spec[:-1] + (None,)
            args = tuple(NamedSharding(mesh, PartitionSpec(*s)) for s in operand_specs(x_spec))
            out = NamedSharding(mesh, PartitionSpec(*x_spec[:-1], None))
            return x_spec, args, (out, out)

        def partition(mesh, arg_shapes, result_shape):
            x_spec, args, outs = shardings_for(mesh, arg_shapes)
            if x_spec[-1] is None:
                fn = lambda *ops: bind_local(*ops, **params)  # noqa: E731
            else:
                axes = _mesh_axes(x_spec[-1])
                fn = lambda *ops: tuple(split_rule(bind_local, ops, axes, **params))  # noqa: E731
            return mesh, fn, outs, args

        def infer(mesh, arg_shapes, result_shape):
            return shardings_for(mesh, arg_shapes)[2]

        rows = " ".join(f"r{i}" for i in range(ndim - 1))
        n = avals_in[0].shape[-1]

        def factors(role, aval):  # a shared vector as long as the row shares its factor
            if role == SHARED:
                return "n" if aval.shape == (n,) else " ".join(f"s{i}" for i in range(aval.ndim))
            return f"{rows} n" if role == ELEMENTS else rows

        rule = (", ".join(factors(r, a) for r, a in zip(operand_roles, avals_in))
                + f" -> {rows} m, {rows} m")
        return partition, infer, rule, ("m",)

    return _lowering_over_local(local, plan)


# An operand's or result's axes as Shardy factor names, ``"b"`` first where it
# leads with the batch, e.g. ``"b h d"`` (equal names: equal sizes).
Factors = tuple[Sequence[str], Sequence[str]]


def batch_partitioned_lowering(local: Primitive, *, factors: Callable[[Sequence], Factors | None]) -> Callable:
    """The lowering of a public primitive whose results, and operands but
    for shared ones, lead with one batch axis ``b`` (the indexer: q, keys,
    weights, lengths -> scores, ids), over its local twin ``local``. The batch
    axis is the only one partitioned: each device runs the local kernel on its
    items, outputs sharded like them, no collective; any other sharded axis is
    gathered, and an operand not led by ``b`` (keys every item shares) is
    replicated.

    ``factors(avals_in)``: (operand factors, result factors) for this call, or
    None where the batch cannot be split (everything is then gathered: each
    device computes every item).
    """

    def plan(avals_in, bind_local, params) -> PartitionPlan:
        given = factors(avals_in)
        splits = given is not None
        operand_factors, result_factors = given if splits else factors_unsplit(avals_in)
        # Every factor but the batch needs replication (the batch too where it
        # is not split), named in the order of first appearance (Shardy wants
        # the special factors' indices sorted).
        names = [name for f in (*operand_factors, *result_factors) for name in f.split()]
        replicated = tuple(dict.fromkeys(name for name in names if name != "b" or not splits))
        rule = ", ".join(operand_factors) + " -> " + ", ".join(result_factors)

        def shardings_for(mesh, arg_shapes):
            first = arg_shapes[0].sharding
            batch = padded_spec(first, 1)[0] if splits and isinstance(first, NamedSharding) else None

            def batch_only(f):  # sharded along the batch if led by it, every other axis whole
                axes = f.split()
                lead = batch if axes[0] == "b" else None
                return NamedSharding(mesh, PartitionSpec(lead, *([None] * (len(axes) - 1))))

            return tuple(map(batch_only, operand_factors)), tuple(map(batch_only, result_factors))

        def partition(mesh, arg_shapes, result_shape):
            args, outs = shardings_for(mesh, arg_shapes)
            return mesh, lambda *ops: bind_local(*ops, **params), outs, args

        def infer(mesh, arg_shapes, result_shape):
            return shardings_for(mesh, arg_shapes)[1]

        return partition, infer, rule, replicated

    def factors_unsplit(avals_in) -> Factors:
        """Distinct factor names for every axis but the batch (each led by ``b``
        where its size is the batch's)."""
        batch = avals_in[0].shape[0]
        ops = [" ".join(["b" if i == 0 and a.shape[0] == batch else f"o{j}a{i}" for i in range(a.ndim)])
               for j, a in enumerate(avals_in)]
        return ops, ("b k", "b k")

    return _lowering_over_local(local, plan)


def register(public: Primitive, lowering: Callable) -> None:
    """Registers ``lowering`` for ``public`` on every platform; the partitioned
    lowering needs the devices at lowering time."""
    mlir.register_lowering(public, lowering)
    _compat.requires_devices_during_lowering(public)
