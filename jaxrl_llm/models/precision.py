"""The matmul precision that a model's compute dtype means.

A float32 compute dtype means float32 products. XLA's default precision does not give them everywhere: on
NVIDIA GPUs since Ampere it runs float32 matmuls as TF32 (10-bit mantissa), on TPU as bfloat16 passes.
Measured on an H200 (docs/benchmarks.md, GPU suite): logits 1.4e-3 away from transformers' at the default
precision, 1e-6 at 'highest', and the sampler's log-probs 1.4e-4 away from the trainer's. So every model
function runs its float32 matmuls at 'highest' (the backward's products inherit it); other compute dtypes
keep the caller's setting. CPUs compute float32 products in float32 either way: nothing changes there.
"""
from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp


def precision_for(dtype):
    """The context to trace matmuls of `dtype` operands in: 'highest' for float32, else the caller's."""
    if jnp.dtype(dtype) == jnp.float32:
        return jax.default_matmul_precision("highest")
    return contextlib.nullcontext()


def matmul_precision(config):
    """The context to trace `config`'s matmuls in: that of its compute dtype."""
    return precision_for(config.dtype)


def precise(fn):
    """Decorates a model function whose first argument is its ModelConfig (see the module docstring)."""
    @functools.wraps(fn)
    def wrapped(config, *args, **kwargs):
        with matmul_precision(config):
            return fn(config, *args, **kwargs)
    return wrapped
