"""Tiny random Hugging Face models (made by transformers, torch CPU) saved to a directory, for parity tests."""
from __future__ import annotations

import json
import os

import numpy as np

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1,
            eos_token_id=2, pad_token_id=0)

# One entry per family variant the tests cover: (model_type, extra config kwargs).
VARIANTS = {
    "llama": ("llama", dict(tie_word_embeddings=False)),
    "llama_tied_llama3rope": ("llama", dict(tie_word_embeddings=True, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64))),
    "qwen2": ("qwen2", dict(tie_word_embeddings=False)),
    "qwen3": ("qwen3", dict(tie_word_embeddings=True, head_dim=16)),
}


def hf_config(model_type: str, **kw):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[model_type]
    return cls(**{**TINY, **kw})


def make_hf_model(path: str, variant: str = "llama", seed: int = 0, *, head: str = "causal",
                  max_shard_size: str | None = None, **overrides):
    """Saves a random model of `variant` to `path`; returns the torch model (eval mode, float32).

    head: "causal" (*ForCausalLM) or "seqcls" (*ForSequenceClassification with one label).
    Weights are drawn with a larger std than HF's init so that parity tests exercise every parameter.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    model_type, kw = VARIANTS[variant]
    cfg = hf_config(model_type, **{**kw, **overrides})
    torch.manual_seed(seed)
    if head == "seqcls":
        cfg.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(cfg)
    else:
        model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    model.eval()
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, **kwargs)
    return model


def hf_logits(model, tokens: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """transformers logits for a (left-padded) batch with positions from the mask, as HF generate does."""
    import torch
    tokens_t = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
    mask_np = np.ones_like(tokens) if mask is None else np.asarray(mask)
    positions = np.maximum(np.cumsum(mask_np, -1) - 1, 0)
    with torch.no_grad():
        out = model(input_ids=tokens_t, attention_mask=torch.as_tensor(mask_np, dtype=torch.long),
                    position_ids=torch.as_tensor(positions, dtype=torch.long))
    return out.logits.float().numpy()


def left_padded_batch(rng: np.random.Generator, lengths, vocab: int, pad: int = 0):
    """Random tokens (B, max(lengths)) left-padded with `pad`, and the 0/1 mask."""
    T = max(lengths)
    tokens = np.full((len(lengths), T), pad, np.int32)
    mask = np.zeros((len(lengths), T), np.int32)
    for i, n in enumerate(lengths):
        tokens[i, T - n:] = rng.integers(3, vocab, n)
        mask[i, T - n:] = 1
    return tokens, mask


def rewrite_config(path: str, **changes):
    """Edits config.json in place (e.g. to turn a 5.x `rope_parameters` into 4.x keys)."""
    file = os.path.join(path, "config.json")
    with open(file) as f:
        d = json.load(f)
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    with open(file, "w") as f:
        json.dump(d, f)
