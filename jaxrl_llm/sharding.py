"""One device mesh (axes `data`, `fsdp`, `expert`, `tensor`) shared by policy, reference and value models.

Parameters carry logical axis names (models/transformer.py); `LOGICAL_RULES` maps them to mesh axes:
FSDP shards the embedding dimension of every weight, tensor parallelism shards heads, MLP width and the
vocabulary, the expert axis the experts of mixture-of-experts layers (models/moe.py; size 1 otherwise);
rollout rows (and the KV cache's rows) are sharded over data x fsdp. A dimension that its
mesh axes do not divide is replicated instead, with one logged note per parameter.

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

AXES = ("data", "fsdp", "expert", "tensor")
BATCH_AXES = ("data", "fsdp")

LOGICAL_RULES = (
    # parameters
    ("layers", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("expert", "expert"),
    # activations (nn.with_logical_constraint inside the model)
    ("batch", BATCH_AXES),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_mlp", "tensor"),
)


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices=None, expert: int = 1) -> Mesh:
    """Mesh of shape (data, fsdp, expert, tensor); one axis may be -1 to take the remaining devices."""
    devices = np.asarray(jax.devices() if devices is None else devices)
    n = devices.size
    shape = [int(data), int(fsdp), int(expert), int(tensor)]
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
        raise ValueError(f"mesh data*fsdp*expert*tensor = {'*'.join(map(str, shape))} = {int(np.prod(shape))} "
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
            mesh_axes = rules.get(logical) if logical is not None else None
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
    """Rows over data x fsdp, every other dimension replicated."""
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def axis_rules():
    """Context manager activating the logical rules for `nn.with_logical_constraint` while tracing."""
    return nn.logical_axis_rules(LOGICAL_RULES)


@contextlib.contextmanager
def use_mesh(mesh: Mesh):
    """Context for calling (and tracing) jitted functions on `mesh`: `jax.set_mesh` + the logical rules."""
    with jax.set_mesh(mesh), axis_rules():
        yield mesh


def optimizer_shardings(tx, abstract_opt_state, param_shardings, mesh: Mesh):
    """Shardings of an optax state: every parameter-shaped leaf (Adam's mu, nu) like its parameter, the
    rest (step counts) replicated. `jax.jit(tx.init)` alone would put all of it on one device, since
    zeros do not depend on the parameters' values."""
    return optax.tree_map_params(tx, lambda _, s: s, abstract_opt_state, param_shardings,
                                 transform_non_params=lambda _: replicated(mesh),
                                 is_leaf=lambda x: isinstance(x, NamedSharding))


def batch_divisor(mesh: Mesh) -> int:
    """Rows of every rollout batch (prompts and completions) must be a multiple of this."""
    return _axis_size(mesh, BATCH_AXES)
