"""Trace-time argument checks of the pure functions of `jaxrl_llm.rl`: they read shapes and Python
constants, never traced values, and raise a ValueError naming the function and the argument."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def static_float(x):
    """`x` as a Python float when its value is known at trace time, else None."""
    if isinstance(x, jax.core.Tracer):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def check_choice(fn, name, value, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{fn}: {name} must be one of {tuple(choices)}, got {value!r}")


def check_shape(fn, name, x, shape):
    if jnp.shape(x) != tuple(shape):
        raise ValueError(f"{fn}: {name} must have shape {tuple(shape)}, got {jnp.shape(x)}")


def check_2d(fn, name, x):
    if jnp.ndim(x) != 2:
        raise ValueError(f"{fn}: {name} must be 2-D (N, T), got shape {jnp.shape(x)}")


def check_scalar(fn, name, x):
    if jnp.ndim(x) != 0:
        raise ValueError(f"{fn}: {name} must be a scalar, got shape {jnp.shape(x)}")


def check_positive(fn, name, x):
    check_scalar(fn, name, x)
    v = static_float(x)
    if v is not None and not v > 0:
        raise ValueError(f"{fn}: {name} must be > 0, got {v}")


def check_range(fn, name, x, lo, hi, *, lo_open=False, hi_open=False):
    v = static_float(x)
    if v is None:
        return
    bad = (v <= lo if lo_open else v < lo) or (v >= hi if hi_open else v > hi)
    if bad:
        lb, rb = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ValueError(f"{fn}: {name} must be in {lb}{lo}, {hi}{rb}, got {v}")
