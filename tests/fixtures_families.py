"""Tiny random Mistral / Gemma 2 / Gemma 3 text models made by transformers (torch CPU), for parity tests.

Every feature binds: windows (5, 8) shorter than the test sequences, both layer kinds, soft caps below
the raw scores' and logits' range, head_dim != hidden / heads, query_pre_attn_scalar != head_dim, and a
Gemma 3 global RoPE (theta and linear scaling) different from the local one.
"""
from __future__ import annotations

import jax
import pytest


@pytest.fixture(autouse=True)
def exact_float32_matmuls():
    """float32 comparisons at 1e-5 on any backend (GPUs default to TF32 matmuls); autouse in the files that
    import it."""
    with jax.default_matmul_precision("float32"):
        yield

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
            head_dim=12, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
            pad_token_id=0)

FAMILIES = {
    "mistral": dict(num_hidden_layers=2, sliding_window=5, tie_word_embeddings=False),
    "gemma2": dict(num_hidden_layers=3, sliding_window=8, query_pre_attn_scalar=20, attn_logit_softcapping=2.0,
                   final_logit_softcapping=3.0),
    # 7 layers: 5 local, 1 global, 1 local (the pattern's period and a remainder)
    "gemma3_text": dict(num_hidden_layers=7, sliding_window=5, query_pre_attn_scalar=16, rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}),
}


def hf_family_config(family: str, **kw):
    from transformers import Gemma2Config, MistralConfig
    from transformers.models.gemma3 import Gemma3TextConfig
    cls = {"mistral": MistralConfig, "gemma2": Gemma2Config, "gemma3_text": Gemma3TextConfig}[family]
    cfg = cls(**{**TINY, **FAMILIES[family], **kw})
    cfg._attn_implementation = "eager"  # the soft cap is eager-only in transformers
    return cfg


def make_family_model(path: str, family: str, seed: int = 0, **kw):
    """Saves a random `family` model to `path` and returns it (torch, float32, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_family_config(family, **kw), attn_implementation="eager")
    with torch.no_grad():  # larger than HF's init so that every parameter (and every cap) matters
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma's norms multiply by (1 + w), Mistral's by w
                p.copy_((0.0 if family.startswith("gemma") else 1.0) + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(path)
    return model
