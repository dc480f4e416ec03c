"""Routing replay beyond the static sampler: the continuous-batching sampler (`rollout.decode_slots`) and the
multi-turn sampler (`env.name`) record every fed token's experts, and the trainer's pass replays them,
packed (`train.pack_length`) or not.

References: a single full forward of [prompt; completion] routing afresh (the experts each token must
have been routed to, float32), and the sampler's own log-probs (the identity). A router perturbed between
sampling and scoring makes fresh routing differ: then the packed and the unpacked replaying passes must
agree with each other and differ from the pass that routes afresh -- a dropped route would fail that.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import envs
from jaxrl_llm.data import builtin_tokenizer
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.lm import init_params, positions_from_mask
from jaxrl_llm.models.packing import plan_packs, plan_shared_packs, sequence_lengths
from jaxrl_llm.models.transformer import Decoder
from jaxrl_llm.sampling import generate
from jaxrl_llm.trainer.episodes import sample_episodes
from jaxrl_llm.trainer.steps import logp_of

G = 2


@pytest.fixture(scope="module")
def moe():
    """A tiny float32 Qwen3-MoE (2 layers, 8 experts, top 2) with std-0.1 weights: routing varies by token."""
    c = ModelConfig(model_type="qwen3_moe", vocab_size=100, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, num_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=16, norm_topk_prob=True, max_position_embeddings=128)
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x if "scale" in jax.tree_util.keystr(p) else jnp.asarray(rng.normal(0, 0.1, x.shape), x.dtype),
        init_params(c, jax.random.PRNGKey(0)))
    return c, params


@pytest.fixture(scope="module")
def slots_batch(moe):
    """A rollout of the continuous-batching sampler (3 slots for 6 rows) as the trainer's batch (rows first)."""
    c, params = moe
    rng = np.random.default_rng(1)
    prompts = rng.integers(3, c.vocab_size, (3, 6)).astype(np.int32)
    mask = np.ones_like(prompts)
    mask[0, :2] = 0  # left padding
    r = generate(c, params, prompts, mask, jax.random.PRNGKey(3), max_new_tokens=8, num_samples=G, eos_ids=[1],
                 pad_id=0, decode_slots=3)
    assert r.routes.shape == (2, 6, 8, 2) and r.prompt_routes.shape == (2, 6, 6, 2)
    return r, {"prompt_tokens": prompts, "prompt_mask": mask, "tokens": r.tokens, "mask": r.mask,
               "routes": r.routes.transpose(1, 2, 0, 3), "prompt_routes": r.prompt_routes[:, ::G].transpose(1, 2, 0, 3)}


@pytest.fixture(scope="module")
def episode_batch(moe):
    """Multi-turn episodes (guess_digit: observations between one-token turns) as the trainer's batch."""
    c, params = moe
    tok = builtin_tokenizer()
    rows = [{"prompt": "guess:", "hidden": h} for h in (3, 7) for _ in range(G)]
    ep = sample_episodes(c, params, tok, envs.make_env("guess_digit"), rows, jax.random.PRNGKey(1), max_turns=3,
                         max_new_tokens=24, max_turn_tokens=2, pad_id=tok.pad_token_id, group_size=G)
    assert ep.routes.shape == (4, 24, 2, 2) and (ep.attention_mask.sum(1) > ep.mask.sum(1)).any()  # observations
    return ep, {"prompt_tokens": ep.prompt_tokens[::G], "prompt_mask": ep.prompt_mask[::G], "tokens": ep.tokens,
                "mask": ep.mask, "attention_mask": ep.attention_mask, "routes": ep.routes,
                "prompt_routes": ep.prompt_routes}


@pytest.fixture(scope="module")
def passes(moe):
    """Jitted (fresh_routes(params, b), logp(params, b, pack)), shared by the tests (one compile per shape)."""
    c, _ = moe
    forward = jax.jit(lambda p, full, m: Decoder(c, with_lm_head=False, return_routes=True).apply(
        {"params": p}, full, positions_from_mask(m), m.astype(bool))[2])

    def fresh_routes(params, b):
        """(L, N, P+T, k) experts of a single full forward of [prompt; completion], routing afresh."""
        full = np.concatenate([np.repeat(b["prompt_tokens"], G, 0), b["tokens"]], 1)
        full_mask = np.concatenate([np.repeat(b["prompt_mask"], G, 0), b.get("attention_mask", b["mask"])], 1)
        return np.asarray(forward(params, full, full_mask)), full_mask.astype(bool)
    return fresh_routes, jax.jit(lambda p, b, pack: logp_of(c, p, b, 1.0, pack=pack, pack_length=32))


def _pack(b, length=32, shared=False):
    """A packing plan of the batch: a prompt copy per completion, or (shared) once per row for its group."""
    lengths = np.asarray(sequence_lengths(b["prompt_mask"], b.get("attention_mask", b["mask"])))
    if shared:
        plen = np.repeat(np.asarray(b["prompt_mask"]).sum(1), G)
        plan = plan_shared_packs(plen[None], lengths[None], G, length)
        starts = [(n // G, r, o) for n, (r, o) in enumerate(zip(plan["row"][0], plan["prompt_offset"][0])) if r >= 0]
        assert len(set(starts)) < len(starts)  # some prompt copy serves two completions
    else:
        plan = plan_packs(lengths[None], length)
    return {k: jnp.asarray(v[0]) for k, v in plan.items()}


@pytest.mark.parametrize("which", ["slots_batch", "episode_batch"])
def test_recorded_routes_are_a_full_forwards_and_replay_keeps_the_identity(moe, passes, which, request):
    (c, params), (fresh_routes, logp) = moe, passes
    _, b = request.getfixturevalue(which)
    fresh, valid = fresh_routes(params, b)
    recorded = np.concatenate([np.repeat(b["prompt_routes"], G, 0), b["routes"]], 1).transpose(2, 0, 1, 3)
    if which == "slots_batch":  # the last drawn token of a row is never fed: no route
        last = valid.shape[1] - 1 - np.argmax(valid[:, ::-1], 1)
        valid[np.arange(len(last)), last] = False
    same = np.all(np.sort(recorded, -1) == np.sort(fresh, -1), -1)  # (L,N,P+T)
    assert valid.sum() > 30 and same[:, valid].all()
    sampler_logp = request.getfixturevalue(which)[0].logprobs
    m = np.asarray(b["mask"]).astype(bool)
    for pack in (None, _pack(b), _pack(b, shared=True)):  # unpacked and packed: the float32 identity
        assert np.abs(np.asarray(logp(params, b, pack)) - np.asarray(sampler_logp))[m].max() <= 1e-5


@pytest.mark.parametrize("which", ["slots_batch", "episode_batch"])
def test_a_perturbed_router_routes_afresh_unless_the_routes_are_replayed(moe, passes, which, request):
    (c, params), (fresh_routes, logp) = moe, passes
    _, b = request.getfixturevalue(which)
    router = params["layers"]["moe"]["router"]
    moved = {**params, "layers": {**params["layers"], "moe": {
        **params["layers"]["moe"], "router": router + jnp.asarray(np.random.default_rng(2).normal(0, 0.3, router.shape),
                                                                  router.dtype)}}}
    fresh, valid = fresh_routes(moved, b)
    recorded = np.concatenate([np.repeat(b["prompt_routes"], G, 0), b["routes"]], 1).transpose(2, 0, 1, 3)
    assert (~np.all(np.sort(recorded, -1) == np.sort(fresh, -1), -1))[:, valid].mean() > 0.2
    m = np.asarray(b["mask"]).astype(bool)
    plain = {k: v for k, v in b.items() if k not in ("routes", "prompt_routes")}
    unpacked = np.asarray(logp(moved, b, None))
    for pack in (_pack(b), _pack(b, shared=True)):
        assert np.abs(np.asarray(logp(moved, b, pack)) - unpacked)[m].max() <= 1e-5  # packing carries every route
    for afresh in (logp(moved, plain, None), logp(moved, plain, _pack(b))):
        assert np.abs(np.asarray(afresh) - unpacked)[m].max() > 1e-3


def test_the_update_benchmarks_dense_twin_has_the_moes_active_parameters():
    """benchmarks/moe_routing_replay.py --update compares an MoE with the dense model of its active
    parameters: the twin's parameter count is the MoE's minus the idle experts and the routers."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from moe_routing_replay import active_params, dense_twin
    c = ModelConfig(model_type="qwen3_moe", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=3,
                    num_heads=2, num_kv_heads=1, head_dim=8, qk_norm=True, num_experts=8, num_experts_per_tok=3,
                    moe_intermediate_size=4, norm_topk_prob=True)
    twin = dense_twin(c)
    assert twin.num_experts == 0 and twin.intermediate_size == 12
    assert active_params(c) - 3 * 16 * 8 == twin.num_params()  # routers: L x D x E
    assert twin.num_params() == init_params_count(twin)


def init_params_count(c) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(jax.eval_shape(lambda: init_params(c, jax.random.PRNGKey(0)))))
