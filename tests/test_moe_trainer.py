"""GRPO steps of a tiny mixture-of-experts model through the trainer, with routing replay: the sampler's
recorded experts reach the score pass, which then reproduces the sampler's log-probs -- with the
continuous-batching sampler, packed passes and a batch sampled one update ahead (rollout.max_staleness=1),
whose routes the checkpoint keeps; and one step with the router's losses on (rl/router.py)."""
import json
import os
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxrl_llm.checkpoint import Checkpointer
from jaxrl_llm.models import load_hf, save_hf
from jaxrl_llm.models.lm import positions_from_mask
from jaxrl_llm.models.transformer import Decoder
from jaxrl_llm.trainer import async_rollout as ar
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


def test_grpo_steps_of_a_moe_replay_the_samplers_routes_and_the_checkpoint_keeps_them(tmp_path):
    c = small_config(total_steps=2)
    c.model.path = _tiny_moe_dir(str(tmp_path / "moe"), load_tokenizer(c.tokenizer))
    c.rollout.recompute_logprobs = True  # the score pass recomputes the log-probs the sampler reported
    c.rollout.max_staleness = 1  # step 1's batch is sampled by the initial policy and checkpointed at step 1
    c.rollout.decode_slots = 3
    c.train.pack_length = 32
    history = Trainer(c, str(tmp_path / "run")).run()
    m = history[0]
    assert np.isfinite(m["policy/loss"]) and m["policy/grad_norm"] > 0
    assert m["sampler/logp_diff_max"] <= 1e-5  # float32 sampler and trainer, the same experts
    ck = Checkpointer(str(tmp_path / "run" / "checkpoints"), max_to_keep=10)
    try:
        meta = ck.manager.restore(1, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    finally:
        ck.close()
    (batch,) = [ar.from_json(d) for d in meta["inflight"]]
    local = batch.local
    again = ar.from_json(json.loads(json.dumps(ar.to_json(batch)))).local  # saved again and restored: equal
    assert all(np.array_equal(again[k], local[k]) and again[k].dtype == local[k].dtype for k in local)
    assert (batch.step, batch.version) == (1, 0)
    assert local["routes"].shape == (*local["tokens"].shape, 1, 2) and local["prompt_routes"].shape[-2:] == (1, 2)
    # The stored routes are the experts the initial model routes [prompt; completion] to (a full forward).
    config, params = load_hf(c.model.path)
    G = c.rollout.group_size
    full = np.concatenate([np.repeat(local["prompt_tokens"], G, 0), local["tokens"]], 1)
    full_mask = np.concatenate([np.repeat(local["prompt_mask"], G, 0), local["mask"]], 1)
    _, _, fresh = Decoder(config, with_lm_head=False, return_routes=True).apply(
        {"params": params}, full, positions_from_mask(full_mask), full_mask.astype(bool))
    recorded = np.concatenate([np.repeat(local["prompt_routes"], G, 0), local["routes"]], 1).transpose(2, 0, 1, 3)
    valid = full_mask.astype(bool)
    valid[np.arange(len(full)), full.shape[1] - 1 - np.argmax(valid[:, ::-1], 1)] = False  # the last: never fed
    assert np.all(np.sort(recorded, -1) == np.sort(np.asarray(fresh), -1), -1)[:, valid].all()


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
