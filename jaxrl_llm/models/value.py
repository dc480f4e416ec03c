"""Value model: the decoder backbone plus a scalar head; the LM head is never computed.

params = {"backbone": decoder parameters without `lm_head`, "head": {"kernel": (D,), "bias": ()}}.
`value_forward` returns one value per position: V(s_t) for the state that the hidden state at t ends,
i.e. the same alignment as the log-prob of the token that position predicts.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jaxrl_llm.models.config import ModelConfig, read_hf_config
from jaxrl_llm.models.hf import read_checkpoint
from jaxrl_llm.models.lm import hidden_states, param_logical_axes


def init_value_params(config: ModelConfig, policy_params, rng: jax.Array | None = None, head_std: float = 0.0):
    """Value parameters from the policy's: a copy of the backbone, head zero (or normal(head_std))."""
    backbone = {k: v for k, v in policy_params.items() if k != "lm_head"}
    backbone = jax.tree_util.tree_map(jnp.array, backbone)  # a copy: policy and value train separately
    pdt = jnp.dtype(config.param_dtype)
    kernel = jnp.zeros((config.hidden_size,), pdt)
    if head_std > 0:
        kernel = head_std * jax.random.normal(rng, (config.hidden_size,), pdt)
    return {"backbone": backbone, "head": {"kernel": kernel, "bias": jnp.zeros((), pdt)}}


def value_logical_axes(config: ModelConfig):
    return {"backbone": param_logical_axes(config, with_lm_head=False),
            "head": {"kernel": PartitionSpec("embed"), "bias": PartitionSpec()}}


def value_head(config: ModelConfig, params, hidden: jax.Array) -> jax.Array:
    """(..., D) hidden -> (...) float32 values."""
    kernel = params["head"]["kernel"].astype(jnp.float32)
    # A float32 head: 'highest' so that a GPU (TF32) or TPU (bfloat16 passes) computes it in float32 too.
    values = jnp.dot(hidden.astype(jnp.float32), kernel, precision="highest")
    return values + params["head"]["bias"].astype(jnp.float32)


@functools.partial(jax.jit, static_argnames="config")
def value_forward(config: ModelConfig, params, tokens: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """(B,T) float32 values of a left-padded batch."""
    return value_head(config, params, hidden_states(config, params["backbone"], tokens, attention_mask))


def load_hf_value(path: str, dtype=jnp.float32, *, compute_dtype=None, shardings=None, **config_overrides):
    """(config, value params) from a HF `*ForSequenceClassification` checkpoint with one label.

    The backbone is read as for the causal LM, `score.weight` (1, D) becomes the head's kernel, bias 0.
    """
    config = read_hf_config(path, param_dtype=jnp.dtype(dtype).name,
                            dtype=jnp.dtype(compute_dtype or dtype).name, **config_overrides)
    backbone_shardings = None if shardings is None else shardings["backbone"]
    backbone, extras = read_checkpoint(path, config, dtype, with_lm_head=False,
                                       extra={"score.weight": (1, config.hidden_size)},
                                       shardings=backbone_shardings)
    pdt = jnp.dtype(dtype)
    head = {"kernel": jnp.asarray(extras["score.weight"][0], pdt), "bias": jnp.zeros((), pdt)}
    return config, {"backbone": backbone, "head": head}
