"""Decoder LMs (Llama, Qwen2, Qwen3) with exact Hugging Face import/export."""
from jaxrl_llm.models import lora
from jaxrl_llm.models.config import ModelConfig, RopeConfig, read_hf_config
from jaxrl_llm.models.lm import (completion_hidden, forward, hidden_states, init_params, logits_from_hidden,
                                 logprobs_from_hidden, param_logical_axes, token_logprobs)
from jaxrl_llm.models.hf import CheckpointError, load_hf, save_hf
from jaxrl_llm.models.value import init_value_params, load_hf_value, value_forward, value_head, value_logical_axes

__all__ = ["CheckpointError", "ModelConfig", "RopeConfig", "completion_hidden", "forward", "hidden_states",
           "init_params", "init_value_params", "lora", "load_hf", "load_hf_value", "logits_from_hidden",
           "logprobs_from_hidden", "param_logical_axes", "read_hf_config", "save_hf", "token_logprobs",
           "value_forward", "value_head", "value_logical_axes"]
