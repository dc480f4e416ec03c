"""One GRPO step of a tiny mixture-of-experts model through the trainer, with routing replay: the
sampler's recorded experts reach the score pass, which then reproduces the sampler's log-probs."""
import os
import sys

import jax
import numpy as np

from jaxrl_llm.models import save_hf
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.lm import init_params
from jaxrl_llm.trainer import Trainer
from jaxrl_llm.trainer.setup import load_tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_trainer import small_config  # noqa: E402


def _tiny_moe_dir(path: str, tokenizer) -> str:
    c = ModelConfig(model_type="qwen3_moe", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                    num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, num_experts=8,
                    num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True, max_position_embeddings=64,
                    eos_token_id=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id)
    rng = np.random.default_rng(0)  # std 0.1: tokens spread over the experts
    params = jax.tree_util.tree_map(lambda x: rng.normal(0, 0.1, x.shape).astype(np.float32),
                                    init_params(c, jax.random.PRNGKey(0)))
    save_hf(path, c, params, tokenizer=tokenizer)
    return path


def test_one_grpo_step_of_a_moe_replays_the_samplers_routes(tmp_path):
    c = small_config(total_steps=1)
    c.model.path = _tiny_moe_dir(str(tmp_path / "moe"), load_tokenizer(c.tokenizer))
    c.rollout.recompute_logprobs = True  # the score pass recomputes the log-probs the sampler reported
    c.checkpoint.every_steps = 10
    m = Trainer(c, str(tmp_path / "run")).run()[0]
    assert np.isfinite(m["policy/loss"]) and m["policy/grad_norm"] > 0
    assert m["sampler/logp_diff_max"] <= 1e-4  # float32 sampler and trainer, the same experts
