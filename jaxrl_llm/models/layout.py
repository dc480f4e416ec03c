"""`constrain`: the model's activation sharding constraints, safe for any row count."""
from __future__ import annotations

import math

import flax.linen as nn
import jax


def constrain(x: jax.Array, names: tuple) -> jax.Array:
    """`nn.with_logical_constraint(x, names)`, except that a dimension its mesh axes do not divide is
    constrained to no axis (replicated) instead. XLA pads such a dimension to shard it unevenly, and
    with a tensor axis beside it the padded rows came back into the embedding's gradient: 2 rows over
    data 4 x tensor 2 gave a gradient off by 4,900 (of 570) while the loss agreed (tests/test_context.py).
    The trainer's rows are always a multiple of their shards; direct calls of the model functions need
    not be. Outside a mesh, or without rules for a name, the same as flax's."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    rules = dict(nn.get_logical_axis_rules())

    def fits(dim: int, name) -> bool:
        axes = rules.get(name) if name is not None else None
        axes = () if axes is None else ((axes,) if isinstance(axes, str) else axes)
        return dim % math.prod(dict(mesh.shape).get(a, 1) for a in axes) == 0

    return nn.with_logical_constraint(x, tuple(n if fits(d, n) else None for d, n in zip(x.shape, names)))
