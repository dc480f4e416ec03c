"""A stand-in for `jax.lax.ragged_dot` in the memory planner (benchmarks/memory_plan.py `--ragged_dot proxy`).

XLA:CPU lowers `ragged_dot` as a masked product of every row with every group's matrix, so a plan of a
mixture-of-experts model compiled for CPU books temporaries of (rows x experts x width) that no GPU or TPU
grouped-matmul kernel allocates (docs/moe.md, "Memory plan"), and its compilation at long rows takes tens
of minutes. The accelerators' grouped kernels allocate their operands and their result: the forward an
(M, N) output, the backward an (M, K) input gradient and a (G, K, N) weight gradient. `grouped_product`
has exactly those shapes and dtypes: it multiplies every row by group 0's matrix (the FLOPs and values of
the other groups are not modelled; the planner never runs the program, it reads the buffer sizes of the
compiled one).
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp


def _product(lhs, rhs, preferred_element_type):
    return jnp.dot(lhs, rhs[0], preferred_element_type=preferred_element_type)


@jax.custom_vjp
def _grouped(lhs, rhs, group_sizes):
    return _product(lhs, rhs, None)


def _forward(lhs, rhs, group_sizes):
    return _product(lhs, rhs, None), (lhs, rhs, group_sizes)


def _backward(res, g):
    lhs, rhs, group_sizes = res
    d_lhs = jnp.dot(g, rhs[0].T.astype(g.dtype)).astype(lhs.dtype)  # (M, K)
    d_rhs = jnp.zeros_like(rhs).at[0].set(jnp.dot(lhs.T, g.astype(lhs.dtype)).astype(rhs.dtype))  # (G, K, N)
    return d_lhs, d_rhs, None


_grouped.defvjp(_forward, _backward)


def grouped_product(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None):
    """`ragged_dot`'s signature and shapes: lhs (M, K), rhs (G, K, N), group_sizes (G,) -> (M, N)."""
    del precision, group_offset
    out = _grouped(lhs, rhs, group_sizes)
    return out if preferred_element_type is None else out.astype(preferred_element_type)


@contextlib.contextmanager
def grouped_products_as_on_accelerators():
    """Within the block, `jax.lax.ragged_dot` (looked up at each call by models/moe.py) is `grouped_product`."""
    real = jax.lax.ragged_dot
    jax.lax.ragged_dot = grouped_product
    try:
        yield
    finally:
        jax.lax.ragged_dot = real
