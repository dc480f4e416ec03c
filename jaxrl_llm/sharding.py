"""One device mesh (axes `data`, `fsdp`, `expert`, `sequence`, `tensor`) shared by policy, reference and
value models.

Parameters carry logical axis names (models/transformer.py); `LOGICAL_RULES` maps them to mesh axes:
FSDP shards the embedding dimension of every weight, tensor parallelism shards heads, MLP width and the
vocabulary, the expert axis the experts of mixture-of-experts layers (models/moe.py; size 1 otherwise);
rollout rows (and the KV cache's rows) are sharded over data x fsdp. The `sequence` axis (context
parallelism, models/context.py) splits the tokens of each row in the trainer's passes
(`use_mesh(mesh, sequence=True)`: rows over data x fsdp, tokens over sequence), is one more axis of rows
for the sampler and the rollout batch (rows over data x fsdp x sequence: decoding is not split along
the sequence, and each chip's KV cache holds 1/(data*fsdp*sequence) of the rows), and shards the
weights' embedding dimension with fsdp, so that its devices hold no replica of parameters or optimizer
state. A mesh whose sequence axis is 1 has exactly the specs of a mesh without one. A dimension that its mesh axes do not divide is replicated instead, with one logged note per
parameter.

Jitted code runs under `use_mesh(mesh)`: `jax.set_mesh` plus the logical rules. Both are needed for the
model's `nn.with_logical_constraint` calls to take effect: Flax reads the mesh from
`jax.sharding.get_abstract_mesh()`, which the legacy `with mesh:` context does not set (under it every
activation constraint is silently a no-op).
"""
from __future__ import annotations

import contextlib
import logging

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

log = logging.getLogger(__name__)

AXES = ("data", "fsdp", "expert", "sequence", "tensor")
BATCH_AXES = ("data", "fsdp")  # the rows of the trainer's passes
ROLLOUT_AXES = ("data", "fsdp", "sequence")  # the rows of the sampler and of the rollout batch

LOGICAL_RULES = (
    # parameters
    ("layers", None),
    ("vocab", "tensor"),
    ("embed", ("fsdp", "sequence")),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("expert", "expert"),
    # activations (nn.with_logical_constraint inside the model)
    ("batch", ROLLOUT_AXES),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_mlp", "tensor"),
)
# The trainer's passes over whole rows: rows over data x fsdp, the tokens of a row over `sequence`.
SEQUENCE_RULES = tuple(("length", "sequence") if name == "length" else ("batch", BATCH_AXES) if name == "batch"
                       else (name, axes) for name, axes in LOGICAL_RULES)


def _without_unit_sequence(mesh_axes, mesh: Mesh | None):
    """`mesh_axes` (None, a name or a tuple) without `sequence` when the mesh (None: any) has none of size > 1."""
    unit = mesh is None or dict(mesh.shape).get("sequence", 1) == 1
    if isinstance(mesh_axes, tuple) and "sequence" in mesh_axes and unit:
        mesh_axes = tuple(a for a in mesh_axes if a != "sequence")
        return mesh_axes[0] if len(mesh_axes) == 1 else (mesh_axes or None)
    return mesh_axes


def rules_for(mesh: Mesh | None, sequence: bool = False) -> tuple:
    """The logical rules on `mesh` [in the trainer's passes], `sequence` dropped where its axis is 1."""
    return tuple((name, _without_unit_sequence(axes, mesh)) for name, axes in
                 (SEQUENCE_RULES if sequence else LOGICAL_RULES))


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices=None, expert: int = 1,
              sequence: int = 1) -> Mesh:
    """Mesh of shape (data, fsdp, expert, sequence, tensor); one axis may be -1 to take the remaining
    devices."""
    devices = np.asarray(jax.devices() if devices is None else devices)
    n = devices.size
    shape = [int(data), int(fsdp), int(expert), int(sequence), int(tensor)]
    for name, s in zip(AXES, shape):
        if s == 0 or s < -1:
            raise ValueError(f"mesh.{name} must be a positive int or -1, got {s}")
    if shape.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got mesh {tuple(shape)}")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        if n % known:
            raise ValueError(f"mesh {tuple(shape)}: {n} devices are not divisible by {known}")
        shape[shape.index(-1)] = n // known
    if int(np.prod(shape)) != n:
        raise ValueError(f"mesh data*fsdp*expert*sequence*tensor = {'*'.join(map(str, shape))} = {int(np.prod(shape))} "
                         f"does not match the {n} available devices")
    # A TPU-topology-aware order when there is one; a plain reshape on CPU.
    try:
        from jax.experimental import mesh_utils
        grid = mesh_utils.create_device_mesh(tuple(shape), devices=list(devices.flat))
    except Exception:  # non-TPU backends with unusual device counts
        grid = devices.reshape(shape)
    return Mesh(grid, AXES)


def _axis_size(mesh: Mesh, axes) -> int:
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else axes
    return int(np.prod([mesh.shape[a] for a in axes]))


def logical_to_sharding(logical_specs, shapes, mesh: Mesh, rules=LOGICAL_RULES, name: str = "params"):
    """Pytree of logical PartitionSpecs + matching shapes -> pytree of NamedShardings on `mesh`.

    A dimension whose size its mesh axes do not divide falls back to replication (logged once per leaf).
    """
    rules = dict(rules)

    def one(path, spec, shape):
        shape = getattr(shape, "shape", shape)
        axes = []
        for i, logical in enumerate(tuple(spec) + (None,) * (len(shape) - len(spec))):
            mesh_axes = _without_unit_sequence(rules.get(logical) if logical is not None else None, mesh)
            size = _axis_size(mesh, mesh_axes)
            if size > 1 and shape[i] % size:
                log.info("%s%s: dim %d (%s=%d) not divisible by mesh %s=%d; replicated", name,
                         jax.tree_util.keystr(path), i, logical, shape[i], mesh_axes, size)
                mesh_axes = None
            axes.append(mesh_axes)
        return NamedSharding(mesh, P(*axes))

    return jax.tree_util.tree_map_with_path(one, logical_specs, shapes,
                                            is_leaf=lambda x: isinstance(x, P))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Rollout rows over data x fsdp [x sequence], every other dimension replicated."""
    return NamedSharding(mesh, P(_without_unit_sequence(ROLLOUT_AXES, mesh), *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def axis_rules(mesh: Mesh | None = None, sequence: bool = False):
    """Context manager activating the logical rules for `nn.with_logical_constraint` while tracing
    (`rules_for(mesh, sequence)`; without a mesh, those of a mesh without a sequence axis)."""
    return nn.logical_axis_rules(rules_for(mesh, sequence))


@contextlib.contextmanager
def use_mesh(mesh: Mesh, sequence: bool = False):
    """Context for calling (and tracing) jitted functions on `mesh`: `jax.set_mesh` + the logical rules.
    sequence: the trainer's passes over whole rows, whose tokens the `sequence` axis splits (a mesh whose
    sequence axis is 1 traces the same program either way)."""
    with jax.set_mesh(mesh), axis_rules(mesh, sequence):
        yield mesh


def optimizer_shardings(tx, abstract_opt_state, param_shardings, mesh: Mesh):
    """Shardings of an optax state: every parameter-shaped leaf (Adam's mu, nu) like its parameter, the
    rest (step counts) replicated. `jax.jit(tx.init)` alone would put all of it on one device, since
    zeros do not depend on the parameters' values."""
    return optax.tree_map_params(tx, lambda _, s: s, abstract_opt_state, param_shardings,
                                 transform_non_params=lambda _: replicated(mesh),
                                 is_leaf=lambda x: isinstance(x, NamedSharding))


def batch_divisor(mesh: Mesh) -> int:
    """Rows of every rollout batch (prompts and completions) must be a multiple of this: data x fsdp x
    sequence."""
    return _axis_size(mesh, _without_unit_sequence(ROLLOUT_AXES, mesh))


def row_shards(mesh: Mesh) -> int:
    """The row shards of the trainer's passes (data x fsdp): every micro-batch's rows are a multiple of it."""
    return _axis_size(mesh, BATCH_AXES)
