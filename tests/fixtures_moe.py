"""Tiny random Qwen3-MoE and Mixtral models made by transformers (torch CPU), for the MoE parity tests."""
from __future__ import annotations

from fixtures_hf import TINY

# name -> (model_type, config kwargs): many experts, top-8 and top-2, with and without renormalization,
# and dense MLP layers among sparse ones.
MOE_VARIANTS = {
    "qwen3_moe_top8": ("qwen3_moe", dict(num_experts=16, num_experts_per_tok=8, moe_intermediate_size=24,
                                         norm_topk_prob=False, head_dim=16, tie_word_embeddings=False)),
    "qwen3_moe_top2": ("qwen3_moe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                                         norm_topk_prob=True, head_dim=8, tie_word_embeddings=True)),
    "mixtral_top2": ("mixtral", dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=24)),
    # dense MLP layers among the sparse ones: layers 1 and 5 have experts (step 2, 0 and 3 listed dense)
    "qwen3_moe_mixed": ("qwen3_moe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                                          norm_topk_prob=True, head_dim=8, num_hidden_layers=6,
                                          decoder_sparse_step=2, mlp_only_layers=[0, 3])),
}


def make_moe_model(path: str, variant: str, seed: int = 0):
    """Saves a random MoE model to `path`; returns the torch model (eval, float32). Weights drawn with a
    larger std than HF's init (router included, so that routing differs across tokens)."""
    import torch
    from transformers import AutoModelForCausalLM, MixtralConfig, Qwen3MoeConfig
    model_type, kw = MOE_VARIANTS[variant]
    cls = Qwen3MoeConfig if model_type == "qwen3_moe" else MixtralConfig
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cls(**{**TINY, **kw}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.1 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(path)
    return model
