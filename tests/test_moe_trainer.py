"""One GRPO step of a tiny mixture-of-experts model through the trainer, with routing replay: the
sampler's recorded experts reach the score pass, which then reproduces the sampler's log-probs; and
the same step with the router's losses on (rl/router.py)."""
import os
import sys

import jax
import numpy as np
import pytest

from jaxrl_llm.models import load_hf, save_hf
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


@pytest.fixture(scope="module")
def moe_runs(tmp_path_factory):
    """One GRPO step of the tiny MoE without, then with the router's losses (same seed: the same rollout)."""
    tmp = tmp_path_factory.mktemp("moe_runs")
    out = {}
    for name, coefs in (("plain", (0.0, 0.0)), ("router", (0.5, 0.1))):
        c = small_config(total_steps=1)
        c.model.path = _tiny_moe_dir(str(tmp / "moe"), load_tokenizer(c.tokenizer))
        c.rollout.recompute_logprobs = True  # the score pass recomputes the log-probs the sampler reported
        c.checkpoint.every_steps = 10
        c.model.router_aux_loss_coef, c.model.router_z_loss_coef = coefs
        trainer = Trainer(c, str(tmp / name))
        m = trainer.run()[0]
        out[name] = (m, jax.tree_util.tree_map(np.asarray, trainer.state.params))
    out["init"] = load_hf(str(tmp / "moe"))[1]
    return out


def test_one_grpo_step_of_a_moe_replays_the_samplers_routes(moe_runs):
    for name in ("plain", "router"):
        m = moe_runs[name][0]
        assert np.isfinite(m["policy/loss"]) and m["policy/grad_norm"] > 0
        assert m["sampler/logp_diff_max"] <= 1e-4  # float32 sampler and trainer, the same experts
    assert not any(k.startswith("moe/") for k in moe_runs["plain"][0])


def test_router_losses_move_the_router_and_leave_the_experts(moe_runs):
    """The load-balancing and z terms reach the router (and, through its input, the layers below) but not
    the experts: the two runs' expert updates agree while their router updates differ. (AdamW's first
    step moves every weight by about lr whatever its gradient's size, so the comparison is of the
    updates' directions, not of their sizes.)"""
    (m, with_), (_, without), init = moe_runs["router"], moe_runs["plain"], moe_runs["init"]
    assert m["moe/drop_frac"] == 0.0 and 1.0 <= m["moe/expert_load_max"] <= 8.0
    assert m["moe/load_balance"] > 0 and m["moe/z_loss"] > 0
    moe = lambda p: p["layers"]["moe"]
    delta = lambda p, name: np.asarray(moe(p)[name]) - np.asarray(moe(init)[name])
    router_gap = np.abs(delta(with_, "router") - delta(without, "router")).max()
    expert_gap = max(np.abs(delta(with_, n) - delta(without, n)).max() for n in ("gate", "up", "down"))
    print(f"router update gap {router_gap:.3e}, expert update gap {expert_gap:.3e}")
    assert router_gap > 100 * max(expert_gap, 1e-9)
