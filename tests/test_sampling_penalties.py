"""rollout.repetition_penalty and rollout.min_p: the distribution drawn from is transformers' (its logits
processors on the same logits), the behaviour log-probs are that distribution's (chi-square over many
draws, and a teacher-forced reference through the static, continuous-batching and multi-turn samplers),
and the trainer's full-vocabulary log-prob is unchanged."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.data.padding import left_pad
from jaxrl_llm.models import forward, lm
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.sampling import draw_tokens, generate, row_uniforms, turns

V = 61


def _hf_logprobs(logits, history, *, penalty, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """log-probs (V,) of transformers' processors on one row: repetition penalty over `history` (the
    row's prompt + completion ids), temperature, top-k, top-p, min-p (transformers' order)."""
    import torch
    from transformers import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                              TopKLogitsWarper, TopPLogitsWarper)
    ids = torch.as_tensor([list(history) or [0]], dtype=torch.long)
    scores = torch.as_tensor(np.asarray(logits, np.float32))[None]
    steps = [RepetitionPenaltyLogitsProcessor(penalty)] if history else []
    steps.append(TemperatureLogitsWarper(temperature))
    steps += [TopKLogitsWarper(top_k)] if top_k else []
    steps += [TopPLogitsWarper(top_p)] if top_p < 1 else []
    steps += [MinPLogitsWarper(min_p)] if min_p else []
    for step in steps:
        scores = step(ids, scores)
    return torch.log_softmax(scores, -1)[0].numpy()


@pytest.mark.parametrize("penalty,top_k,top_p,min_p", [(1.5, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.1), (0.7, 0, 1.0, 0.05),
                                                       (1.3, 20, 0.9, 0.1)])
def test_draws_follow_transformers_processors(penalty, top_k, top_p, min_p):
    """Random logits of both signs, a random `seen` set: every draw's behaviour log-prob is transformers'
    log-prob of that token, the frequencies are its probabilities (chi-square), no token outside its
    support is drawn, and the first log-prob stays log_softmax(logits / temperature)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, V).astype(np.float32)
    history = rng.choice(V, 25).tolist()
    temperature, n = 0.8, 20000
    ref = _hf_logprobs(logits, history, penalty=penalty, temperature=temperature, top_k=top_k, top_p=top_p,
                       min_p=min_p)
    seen = np.zeros((n, V), bool)
    seen[:, history] = penalty != 1.0
    token, logp, blogp = draw_tokens(jax.random.PRNGKey(1), jnp.tile(logits, (n, 1)), temperature, top_p,
                                     top_k=top_k, greedy=False, nucleus=top_p < 1,
                                     seen=jnp.asarray(seen) if penalty != 1.0 else None, penalty=penalty,
                                     min_p=min_p if min_p else None)
    token, logp, blogp = map(np.asarray, (token, logp, blogp))
    assert np.isfinite(ref[token]).all()
    np.testing.assert_allclose(blogp, ref[token], atol=2e-5)
    full = jax.nn.log_softmax(logits / temperature)
    np.testing.assert_allclose(logp, np.asarray(full)[token], atol=2e-5)
    probs = np.exp(ref)
    assert 3 < np.count_nonzero(probs) and np.abs(probs - np.exp(np.asarray(full))).max() > 0.02  # it changes
    from test_sampling import _chi_square_ok
    stat, critical = _chi_square_ok(np.bincount(token, minlength=V), probs)
    assert stat < critical, (stat, critical)


def test_greedy_applies_the_penalty_and_reports_the_convention():
    logits = jnp.asarray([[3.0, 2.0, -1.0], [-0.5, -2.0, -0.6]])
    seen = jnp.asarray([[True, False, False], [True, False, False]])
    token, logp, blogp = draw_tokens(None, logits, 1.0, 1.0, top_k=0, greedy=True, nucleus=False, seen=seen,
                                     penalty=2.0)
    assert np.asarray(token).tolist() == [1, 2]  # 3/2 < 2;  -0.5*2 < -0.6
    np.testing.assert_allclose(logp, np.asarray(jax.nn.log_softmax(logits))[[0, 1], [1, 2]], atol=1e-6)
    assert not np.asarray(blogp).any()


def _model():
    mc = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=8, max_position_embeddings=128, tie_word_embeddings=False)
    return mc, lm.init_params(mc, jax.random.PRNGKey(0))


def _check_teacher_forced(mc, params, prompt, completion, blogp, logp, **kw):
    """Each completion token's behaviour log-prob is transformers' on the teacher-forced logits, the
    penalty over the real prompt ids and the completion so far; its log-prob the convention's."""
    seq = np.asarray([list(prompt) + list(completion)], np.int32)
    logits = np.asarray(forward(mc, params, seq, np.ones_like(seq)))[0]
    for t, tok in enumerate(completion):
        row = logits[len(prompt) + t - 1]
        ref = _hf_logprobs(row, list(prompt) + list(completion[:t]), **kw)
        assert abs(blogp[t] - ref[tok]) < 1e-4, (t, blogp[t], ref[tok])
        conv = np.asarray(jax.nn.log_softmax(row / kw["temperature"]))[tok]
        assert abs(logp[t] - conv) < 1e-4


PROMPTS = [[5, 6, 7, 5], [9, 10, 11, 12, 13, 9], [40]]
KW = dict(penalty=2.5, temperature=1.3, min_p=0.02)


@pytest.mark.parametrize("slots", [0, 2])
def test_static_and_slot_samplers_penalise_the_prompt_and_the_completion(slots):
    mc, params = _model()
    tokens, mask = left_pad(PROMPTS, 8, 0)
    G, T = 3, 10
    r = generate(mc, params, tokens, mask, jax.random.PRNGKey(2), max_new_tokens=T, num_samples=G,
                 temperature=KW["temperature"], eos_ids=[V - 1], pad_id=0, decode_slots=slots,
                 repetition_penalty=KW["penalty"], min_p=KW["min_p"])
    out, m, blp, lp = (np.asarray(x) for x in (r.tokens, r.mask, r.behavior_logprobs, r.logprobs))
    assert not np.allclose(blp[m == 1], lp[m == 1], atol=1e-3)
    for n in range(len(PROMPTS) * G):
        k = int(m[n].sum())
        _check_teacher_forced(mc, params, PROMPTS[n // G], out[n, :k].tolist(), blp[n], lp[n], **KW)


def test_episodes_penalise_every_token_of_the_episode_and_rewind_takes_tokens_out():
    """Turn, observation, turn: the second turn's penalty covers the prompt, the first turn and the
    observation. A rewind takes the dropped tokens out of the counts (the counts of the kept history)."""
    mc, params = _model()
    tokens, mask = left_pad(PROMPTS[:2], 8, 0)
    rng = jax.random.PRNGKey(7)
    sample = dict(temperature=KW["temperature"], repetition_penalty=KW["penalty"], min_p=KW["min_p"])
    ep = turns.start(mc, params, tokens, mask, capacity=40, repetition_penalty=True)
    ep, t1 = turns.decode_turn(mc, params, ep, rng, [6, 6], max_tokens=6, stop_ids=[V - 1], **sample)
    first = [second_ids(t1, i) for i in range(2)]
    obs = [[20, 21, 20], [first[1][0], 33]]
    ep = turns.append(mc, params, ep, obs)
    ep, t2 = turns.decode_turn(mc, params, ep, rng, [6, 6], max_tokens=6, stop_ids=[V - 1], **sample)
    for i in range(2):
        second = second_ids(t2, i)
        assert len(second) > 2
        history = PROMPTS[i] + first[i] + obs[i]
        blp = np.asarray(t2.behavior_logprobs)[i]
        _check_teacher_forced(mc, params, history, second, blp, np.asarray(t2.logprobs)[i], **KW)
    # rewind 2 tokens of row 0, none of row 1: the counts are those of what the caches hold.
    kept = [PROMPTS[0] + first[0] + obs[0] + second_ids(t2, 0)[:-2], PROMPTS[1] + first[1] + obs[1] + second_ids(t2, 1)]
    ep = turns.rewind(ep, np.array([2, 0]), [second_ids(t2, 0)[-2:], []])
    expect = np.stack([np.bincount(k, minlength=V) for k in kept])
    np.testing.assert_array_equal(np.asarray(ep.counts), expect)
    with pytest.raises(ValueError, match="dropped_ids"):
        turns.rewind(ep, np.array([1, 0]))


def second_ids(turn, i):
    return np.asarray(turn.tokens)[i, :int(turn.count[i])].tolist()


def test_bad_values_are_refused_in_one_line():
    mc, params = _model()
    tokens, mask = left_pad(PROMPTS, 8, 0)
    for kw, field in ((dict(repetition_penalty=0.0), "repetition_penalty"), (dict(min_p=1.0), "min_p")):
        with pytest.raises(ValueError, match=field):
            generate(mc, params, tokens, mask, jax.random.PRNGKey(0), max_new_tokens=2, eos_ids=[1], pad_id=0, **kw)
    from jaxrl_llm.config import prepare
    for field, value in (("rollout.repetition_penalty", -1.0), ("rollout.min_p", 1.5)):
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            prepare({"data.task": "digit_puzzles", field: value})
