"""RoPE as transformers computes it, to the float32 rounding: the frequencies' rounding is part of the
model. An ulp off in one frequency is an angle error that grows with the position (5e-4 in cos/sin at
position 8191, 3-6x transformers' own float32 logit error on a small model at 512 positions), so the
checks are against transformers' rotary module and against its float64 logits."""
import copy

import jax.numpy as jnp
import numpy as np
import pytest
from fixtures_hf import hf_logits, make_hf_model

from jaxrl_llm.models import forward, load_hf
from jaxrl_llm.models.config import config_from_hf_dict
from jaxrl_llm.models.transformer import rope_cos_sin

ROPES = {  # (model_type, head_dim, rope_parameters): the published models' settings and every scaling type
    "qwen2.5": ("qwen2", 64, dict(rope_type="default", rope_theta=1000000.0)),
    "qwen3": ("qwen2", 128, dict(rope_type="default", rope_theta=1000000.0)),
    "llama3": ("llama", 128, dict(rope_type="default", rope_theta=500000.0)),
    "llama2": ("llama", 128, dict(rope_type="default", rope_theta=10000.0)),
    "linear": ("llama", 64, dict(rope_type="linear", rope_theta=10000.0, factor=4.0)),
    "llama3.1": ("llama", 128, dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=8192)),
    "yarn": ("qwen2", 128, dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0,
                                original_max_position_embeddings=32768)),
}


@pytest.mark.parametrize("name", sorted(ROPES))
def test_cos_sin_equal_transformers_rotary_embedding(name):
    """Same float32 angles (position x frequency) as transformers' up to 8k positions: cos/sin differ by
    at most the two libraries' cos/sin rounding (a few 1e-8), not by an angle error."""
    import torch
    from transformers import LlamaConfig, Qwen2Config
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding
    model_type, head_dim, rope = ROPES[name]
    cls, rotary = {"qwen2": (Qwen2Config, Qwen2RotaryEmbedding), "llama": (LlamaConfig, LlamaRotaryEmbedding)}[model_type]
    hf_config = cls(hidden_size=4 * head_dim, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                    max_position_embeddings=32768, rope_parameters=rope)
    positions = np.arange(8192)[None]
    with torch.no_grad():
        cos, sin = rotary(hf_config)(torch.zeros(1), torch.as_tensor(positions))
    ours = rope_cos_sin(config_from_hf_dict(hf_config.to_dict()), jnp.asarray(positions))
    for a, b in zip(ours, (cos, sin)):
        assert np.abs(np.asarray(a) - b.numpy()).max() <= 5e-7, name


def test_float32_logits_as_close_to_float64_as_transformers_float32(tmp_path):
    """transformers' float64 logits (same weights, positions from the mask) as the reference: our float32
    logits are about as far from them as transformers' float32 ones (measured 1.1-1.3x over seeds; 3-6x
    with numpy's float32 powers of theta), at positions up to 512 where RoPE's angles are large."""
    import torch
    model = make_hf_model(str(tmp_path), "qwen2", 0, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                          rope_parameters=dict(rope_type="default", rope_theta=500000.0))
    config, params = load_hf(str(tmp_path))
    tokens = np.random.default_rng(0).integers(1, config.vocab_size, (2, 512)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[1, :128] = 0
    valid = mask.astype(bool)
    with torch.no_grad():
        ref = copy.deepcopy(model).double()(
            input_ids=torch.as_tensor(tokens, dtype=torch.long), attention_mask=torch.as_tensor(mask),
            position_ids=torch.as_tensor(np.maximum(np.cumsum(mask, -1) - 1, 0))).logits.numpy()[valid]
    theirs = np.abs(hf_logits(model, tokens, mask)[valid] - ref).max()
    ours = np.abs(np.asarray(forward(config, params, tokens, mask), np.float64)[valid] - ref).max()
    print(f"max |logit - float64 logit|: ours {ours:.2e}, transformers float32 {theirs:.2e}")
    assert ours <= 1.5 * theirs and ours <= 2e-5
