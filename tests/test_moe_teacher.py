"""A mixture-of-experts teacher routes its own tokens: the score pass's teacher log-probs (opd's whole
training signal) equal the teacher's own full forward, whatever routes the student's sampler recorded.

The batch is a rollout of a MoE student (routing replay on: the batch carries the student's routes). The
teachers: another MoE of the same depth (the student's routes have the right shape, so a pass that replayed
them would run and be silently wrong), and one of another depth (a replayed route would not fit). The
reference: a single full forward of [prompt; completion] through the teacher, routing afresh, its log-softmax
at each completion token; unpacked and packed score passes, float32.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.lm import init_params, positions_from_mask
from jaxrl_llm.models.packing import plan_packs, sequence_lengths
from jaxrl_llm.models.transformer import Decoder, lm_head_weight
from jaxrl_llm.rl import Objective
from jaxrl_llm.sampling import generate
from jaxrl_llm.trainer.state import OptimizerSpec, UpdatePlan
from jaxrl_llm.trainer.steps import make_score

G = 2


def _moe(num_layers, seed):
    """A tiny float32 Qwen3-MoE (8 experts, top 2) with std-0.1 weights, so that routing varies by token."""
    c = ModelConfig(model_type="qwen3_moe", vocab_size=100, hidden_size=32, intermediate_size=64,
                    num_layers=num_layers, num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, num_experts=8,
                    num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True, max_position_embeddings=128)
    rng = np.random.default_rng(seed)
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x if "scale" in jax.tree_util.keystr(p) else jnp.asarray(rng.normal(0, 0.1, x.shape), x.dtype),
        init_params(c, jax.random.PRNGKey(seed)))
    return c, params


@pytest.fixture(scope="module")
def student_batch():
    """A MoE student's rollout (3 prompts x G, left padding) as the trainer's batch, with its routes."""
    c, params = _moe(2, 0)
    rng = np.random.default_rng(1)
    prompts = rng.integers(3, c.vocab_size, (3, 6)).astype(np.int32)
    mask = np.ones_like(prompts)
    mask[0, :2] = 0
    r = generate(c, params, prompts, mask, jax.random.PRNGKey(3), max_new_tokens=8, num_samples=G, eos_ids=[1],
                 pad_id=0)
    assert r.routes is not None
    return c, {"prompt_tokens": prompts, "prompt_mask": mask, "tokens": np.asarray(r.tokens),
               "mask": np.asarray(r.mask), "routes": jnp.asarray(r.routes).transpose(1, 2, 0, 3),
               "prompt_routes": jnp.asarray(r.prompt_routes)[:, ::G].transpose(1, 2, 0, 3)}


def _own_forward(tc, tparams, b):
    """(N,T) the teacher's log-probs of the completion tokens from one full forward, routing afresh."""
    prompts, pmask = np.repeat(b["prompt_tokens"], G, 0), np.repeat(b["prompt_mask"], G, 0)
    full, full_mask = np.concatenate([prompts, b["tokens"]], 1), np.concatenate([pmask, b["mask"]], 1)
    hidden = Decoder(tc).apply({"params": tparams}, full, positions_from_mask(full_mask), full_mask.astype(bool))[0]
    logits = np.asarray(hidden, np.float64) @ np.asarray(lm_head_weight(tc, tparams), np.float64)
    p = prompts.shape[1]
    logp = jax.nn.log_softmax(logits[:, p - 1:-1], axis=-1)
    picked = np.take_along_axis(np.asarray(logp), b["tokens"][:, :, None], axis=-1)[:, :, 0]
    return np.where(b["mask"] > 0, picked, 0.0)


def _plan():
    opt = OptimizerSpec(1e-3, 0, "constant", 0.0, 0.0, 0.9, 0.999, 1e-8, 1.0, 0)
    return UpdatePlan(temperature=1.0, group_size=G, minibatches=1, grad_accum=1, recompute_logprobs=False,
                      ref_mix_alpha=0.0, optimizer=opt, value_optimizer=opt, pack_length=32)


@pytest.mark.parametrize("depth", [2, 3], ids=["same_depth", "other_depth"])
def test_an_moe_teachers_opd_logprobs_are_its_own_full_forward(student_batch, depth):
    mc, b = student_batch
    tc, tparams = _moe(depth, 7)
    objective = Objective(group_size=G, estimator="none", aggregate="token-mean", distill="opd")
    score = jax.jit(make_score(objective, _plan(), mc, tc))
    expected = _own_forward(tc, tparams, b)
    lengths = np.asarray(sequence_lengths(b["prompt_mask"], b["mask"]))
    pack = {k: jnp.asarray(v) for k, v in plan_packs(lengths[None], 32).items()}  # one chunk's plan
    for packing in (None, pack):
        got = np.asarray(score(None, None, b, packing, None, tparams)["teacher_logp"])
        np.testing.assert_allclose(got, expected, atol=2e-5)
    # the student's routes are no teacher's: replaying them would give other log-probs (the test can fail)
    if depth == 2:
        wrong = Decoder(tc).apply
        full_routes = jnp.concatenate([jnp.repeat(b["prompt_routes"], G, 0), b["routes"]], 1).transpose(2, 0, 1, 3)
        prompts, pmask = np.repeat(b["prompt_tokens"], G, 0), np.repeat(b["prompt_mask"], G, 0)
        full, full_mask = np.concatenate([prompts, b["tokens"]], 1), np.concatenate([pmask, b["mask"]], 1)
        logits = wrong({"params": tparams}, full, positions_from_mask(full_mask), full_mask.astype(bool),
                       routes=full_routes)[0]
        assert np.abs(np.asarray(logits) - np.asarray(Decoder(tc).apply(
            {"params": tparams}, full, positions_from_mask(full_mask), full_mask.astype(bool))[0])).max() > 1e-2
