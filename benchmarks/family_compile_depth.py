"""Compile time of the forward + backward of a tiny Gemma 3-style model (5 local : 1 global layers) by depth:
the two layer kinds are data of one scanned body, so the compile time does not grow with the layer count.

    PYTHONPATH=. python benchmarks/family_compile_depth.py
"""
import time, jax, jax.numpy as jnp
from jaxrl_llm.models.config import ModelConfig, RopeConfig
from jaxrl_llm.models import init_params, token_logprobs
for L in (6, 12, 24, 48):
    c = ModelConfig(model_type="gemma3_text", vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=L,
                    num_heads=4, num_kv_heads=2, head_dim=16, sliding_window=8,
                    layer_types=tuple("sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(L)),
                    local_rope=RopeConfig(theta=1e4), rope=RopeConfig(theta=1e6), attn_softcap=50.0, final_softcap=30.0,
                    query_pre_attn_scalar=16.0, norm_offset=1.0, sandwich_norm=True, hidden_act="gelu_tanh",
                    embed_scale=True, qk_norm=True, tie_word_embeddings=True, attention="blockwise", attention_block=16)
    p = init_params(c, jax.random.PRNGKey(0))
    x = jnp.zeros((2, 64), jnp.int32); m = jnp.ones((2, 64), jnp.int32)
    f = jax.jit(jax.grad(lambda p: token_logprobs(c, p, x, m, x).sum()))
    t = time.perf_counter(); f.lower(p).compile(); print(f"L={L}: forward+backward compile {time.perf_counter()-t:.2f} s", flush=True)
