"""The config.json values of the models the memory plan knows (benchmarks/memory_plan.py): shapes only, no
download. Plain dicts, as `models.config.config_from_hf_dict` reads them."""

# config.json of Qwen/Qwen2.5-7B (no download needed: the memory plan uses shapes only).
QWEN25_7B = {
    "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 131072, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151643, "use_sliding_window": False,
}
# config.json of Qwen/Qwen2.5-1.5B: the model of the GPU suite's measured step (benchmarks/gpu_suite.py).
QWEN25_1_5B = dict(QWEN25_7B, vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                   num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True)
TOY = {"model_type": "qwen2", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
       "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu", "eos_token_id": 1}
# config.json of Qwen/Qwen2.5-32B.
QWEN25_32B = dict(QWEN25_7B, vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                  num_attention_heads=40, num_key_value_heads=8)
# config.json of Qwen/Qwen3-30B-A3B: 128 experts, 8 per token (3.3B active of 30.5B parameters).
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 40960, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645, "use_sliding_window": False,
    "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [],
}
# config.json of google/gemma-2-9b, of the text model of google/gemma-3-4b-pt, and of mistralai/Mistral-7B-v0.1.
GEMMA2_9B = {
    "model_type": "gemma2", "vocab_size": 256000, "hidden_size": 3584, "intermediate_size": 14336,
    "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0, "max_position_embeddings": 8192, "rope_theta": 10000.0,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "eos_token_id": 1,
}
GEMMA3_4B = {
    "model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 2560, "intermediate_size": 10240,
    "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "query_pre_attn_scalar": 256, "sliding_window": 1024, "sliding_window_pattern": 6, "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "max_position_embeddings": 131072, "hidden_activation": "gelu_pytorch_tanh", "eos_token_id": 1,
}
MISTRAL_7B = {
    "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "sliding_window": 4096,
    "max_position_embeddings": 32768, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "eos_token_id": 2,
}
