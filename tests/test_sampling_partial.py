"""One round of partial rollouts (sampling/partial.py) held to two independent references:
- with the same weights in every round (version swaps disabled), rounds stopped after 1, 2, ... complete
  groups and resumed from their rows' tokens give exactly the continuous-batching sampler's tokens and
  masks, and its log-probs to 1e-5 (float32), for ragged left-padded prompts, every sampling mode, a
  sliding window with soft caps, an MoE model and LoRA adapters;
- with new weights at every round, every token's recorded log-prob equals a teacher-forced recomputation
  of the whole row under the weights of the version it records (1e-5), and each row's versions never
  decrease along it.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import token_logprobs
from jaxrl_llm.models.moe import unrecorded_routes
from jaxrl_llm.sampling import generate
from jaxrl_llm.sampling.partial import empty_rows, run_round
from test_sampling_paged import MODELS, PAD, _model, left_padded_batch

EOS = (3, 9, 17)
B, G, T, S = 3, 4, 13, 4
MODES = {
    "plain": dict(temperature=1.3),
    "topk_topp_minp_penalty": dict(temperature=0.9, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
    "greedy": dict(temperature=0.0),
}


def _key_rows(key, prompts: int):
    data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return np.stack([np.asarray(data)] * prompts)


def _rounds(config, weights, prompts, mask, key, **kw):
    """Rounds until every row is done, round v with weights(v), stopping once v + 1 groups are complete (MoE:
    routes recorded; the prompts' routes of the first round)."""
    table, v = empty_rows(B * G, T, PAD), 0
    if config.num_experts:
        table["routes"] = unrecorded_routes(config, B * G, T)
    first_prompt_routes = None
    keys = _key_rows(key, B)
    while not np.all(np.asarray(table["done"])):
        table = run_round(config, weights(v), prompts, mask, keys, table, v, v + 1, max_new_tokens=T,
                          num_samples=G, slots=S, eos_ids=EOS, **kw)
        first_prompt_routes = table["prompt_routes"] if first_prompt_routes is None else first_prompt_routes
        v += 1
    table["prompt_routes"] = first_prompt_routes
    return {k: np.asarray(x) for k, x in table.items()}, v


@pytest.fixture(scope="module")
def prompts():
    return left_padded_batch(np.random.default_rng(5), [5, 9, 2], 61, pad=PAD)


CASES = [("dense", mode) for mode in MODES] + [(model, "plain") for model in MODELS if model != "dense"]


@pytest.mark.parametrize("model,mode", CASES)
def test_rounds_with_one_policy_equal_the_slots_sampler(model, mode, prompts):
    config, params = _model(**MODELS[model])
    key = jax.random.PRNGKey(3)
    kw = MODES[mode]
    ref = generate(config, params, *prompts, key, max_new_tokens=T, num_samples=G, eos_ids=EOS, pad_id=PAD,
                   decode_slots=S, **kw)
    table, rounds = _rounds(config, lambda v: params, *prompts, key, **kw)
    assert rounds >= 2  # the rows really stopped and resumed
    if config.num_experts:  # each fed token's experts, whatever round fed it; the prompts' of the first round
        np.testing.assert_array_equal(table["routes"], np.asarray(ref.routes))
        np.testing.assert_array_equal(table["prompt_routes"], np.asarray(ref.prompt_routes)[:, ::G])
    mask = np.arange(T)[None] < table["lengths"][:, None]
    np.testing.assert_array_equal(mask, np.asarray(ref.mask).astype(bool))
    np.testing.assert_array_equal(np.where(mask, table["tokens"], PAD), np.asarray(ref.tokens))
    for got, want in ((table["logprobs"][:, 0], ref.logprobs), (table["logprobs"][:, 1], ref.behavior_logprobs)):
        np.testing.assert_allclose(np.where(mask, got, 0), np.where(mask, np.asarray(want), 0), atol=1e-5)


@pytest.mark.parametrize("model", ["dense", "window_softcap"])
def test_each_token_logprob_is_its_versions(model, prompts):
    config, params = _model(**MODELS[model])
    scale = lambda v: jax.tree_util.tree_map(lambda x: x * (1 + 0.15 * v), params)  # a new policy per round
    table, rounds = _rounds(config, scale, *prompts, jax.random.PRNGKey(4), temperature=0.8)
    mask = np.arange(T)[None] < table["lengths"][:, None]
    versions = np.where(mask, table["versions"], -1)
    assert len(np.unique(versions[mask])) >= 3  # rows really spanned several versions
    assert all(np.all(np.diff(v[m]) >= 0) for v, m in zip(versions, mask))
    p_tokens, p_mask = (np.repeat(a, G, axis=0) for a in prompts)
    full = np.concatenate([p_tokens, table["tokens"]], 1)
    full_mask = np.concatenate([p_mask, mask.astype(np.int32)], 1)
    P = p_tokens.shape[1]
    for v in range(rounds):
        ref = np.asarray(token_logprobs(config, scale(v), full[:, :-1], full_mask[:, :-1], full[:, 1:], 0.8))[:, P - 1:]
        at = versions == v
        np.testing.assert_allclose(table["logprobs"][:, 0][at], ref[at], atol=1e-5)
    # A mutation the check catches: the first version's weights do not explain the later tokens.
    ref0 = np.asarray(token_logprobs(config, scale(0), full[:, :-1], full_mask[:, :-1], full[:, 1:], 0.8))[:, P - 1:]
    assert np.abs(table["logprobs"][:, 0][versions > 0] - ref0[versions > 0]).max() > 1e-3


def test_a_round_waits_for_the_groups_it_holds(prompts):
    """need = 1 stops at the first complete group, unless a group is held: then it runs until that one is done."""
    config, params = _model()
    keys = _key_rows(jax.random.PRNGKey(3), B)
    kw = dict(max_new_tokens=T, num_samples=G, slots=S, eos_ids=EOS, temperature=1.3)
    free = run_round(config, params, *prompts, keys, empty_rows(B * G, T, PAD), 0, 1, **kw)
    complete = np.asarray(free["done"]).reshape(B, G).all(1)
    last = int(np.nonzero(~complete)[0][-1])  # a group the free round left unfinished
    held = run_round(config, params, *prompts, keys, empty_rows(B * G, T, PAD), 0, 1, hold=np.arange(B) == last, **kw)
    assert np.asarray(held["done"]).reshape(B, G)[last].all()
    assert int(held["iterations"]) > int(free["iterations"])
    done = np.asarray(held["done"])  # the rows both rounds finished agree token for token
    both = np.asarray(free["done"]) & done
    np.testing.assert_array_equal(np.asarray(free["tokens"])[both], np.asarray(held["tokens"])[both])


def test_a_table_with_more_rows_in_flight_than_slots_is_refused(prompts):
    config, params = _model()
    table = empty_rows(B * G, T, PAD)
    table["lengths"][:S + 1] = 3
    with pytest.raises(ValueError, match="5 rows in flight hold tokens, more than the 4 slots"):
        run_round(config, params, *prompts, _key_rows(jax.random.PRNGKey(0), B), table, 0, 1, max_new_tokens=T,
                  num_samples=G, slots=S, eos_ids=EOS)
