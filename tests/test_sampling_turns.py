"""The multi-turn sampler (`sampling.turns`): stop, append and resume against independent references --
the single-turn sampler on the same tokens, a single-shot prefill of the whole episode (the KV cache),
the trainer's teacher-forced log-probs, and the re-prefilling episode loop of tests/episodes_reference.py."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from episodes_reference import reference_episodes  # noqa: E402
from fixtures_envs import qwen_tokenizer  # noqa: E402

from jaxrl_llm import envs  # noqa: E402
from jaxrl_llm.data import builtin_tokenizer  # noqa: E402
from jaxrl_llm.data.padding import left_pad  # noqa: E402
from jaxrl_llm.models import lm, token_logprobs  # noqa: E402
from jaxrl_llm.models.config import ModelConfig  # noqa: E402
from jaxrl_llm.sampling import generate, turns  # noqa: E402
from jaxrl_llm.trainer.episodes import sample_episodes  # noqa: E402

V = 97


def _model(vocab=V, layers=2, seed=0):
    mc = ModelConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=layers, num_heads=4,
                     num_kv_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=False)
    # Untied: a tiny random model with a tied head keeps drawing the token it was fed, greedily.
    return mc, lm.init_params(mc, jax.random.PRNGKey(seed))


def _ids(turn, i):
    return [int(t) for t in np.asarray(turn.tokens)[i, :int(turn.count[i])]]


def test_a_turn_stops_at_its_stop_token_or_limit_and_draws_per_row():
    """Run 2 adds to run 1's stop id a token run 1 drew: each row stops at the first occurrence of
    either. Per-row streams: the tokens before the stop are run 1's, whatever the other rows do."""
    mc, params = _model()
    prompts, mask = left_pad([[5, 6, 7], [9, 10, 11, 12, 13], [40], [41, 42]], 8, 0)
    rng = jax.random.PRNGKey(3)
    limit = np.array([12, 12, 0, 7])
    ep = turns.start(mc, params, prompts, mask, capacity=32)
    _, free = turns.decode_turn(mc, params, ep, rng, limit, max_tokens=12, stop_ids=[V - 1], temperature=1.0)
    for i, n in enumerate(limit):  # to the limit or to the stop id, nothing after it
        a = _ids(free, i)
        assert (len(a) == n and V - 1 not in a) or a.index(V - 1) == len(a) - 1
    assert len(_ids(free, 0)) == 12
    stop = _ids(free, 0)[4]
    ep = turns.start(mc, params, prompts, mask, capacity=32)
    ep, cut = turns.decode_turn(mc, params, ep, rng, limit, max_tokens=12, stop_ids=[V - 1, stop], temperature=1.0)
    for i in range(4):
        a, b = _ids(free, i), _ids(cut, i)
        expect = a[:a.index(stop) + 1] if stop in a else a
        assert b == expect, i
        assert int(ep.length[i]) == len(b)
        np.testing.assert_allclose(np.asarray(cut.logprobs)[i, :len(b)], np.asarray(free.logprobs)[i, :len(b)],
                                   atol=1e-6)
    assert not np.asarray(cut.tokens)[:, 12:].any() and not np.asarray(cut.logprobs)[2].any()


def test_first_turn_greedy_equals_the_single_turn_sampler():
    mc, params = _model()
    prompts, mask = left_pad([[5, 6, 7], [9, 10, 11, 12, 13]], 8, 0)
    g = generate(mc, params, prompts, mask, jax.random.PRNGKey(0), max_new_tokens=10, temperature=0, eos_ids=[V - 1],
                 pad_id=0)
    ep = turns.start(mc, params, prompts, mask, capacity=20)
    _, t = turns.decode_turn(mc, params, ep, jax.random.PRNGKey(0), [10, 10], max_tokens=10, stop_ids=[V - 1],
                             temperature=0)
    np.testing.assert_array_equal(np.asarray(t.tokens), np.asarray(g.tokens))
    np.testing.assert_allclose(np.asarray(t.logprobs), np.asarray(g.logprobs), atol=1e-5)
    assert len(set(np.asarray(g.tokens).ravel().tolist())) > 4  # not one repeated token


def test_draws_follow_each_row_and_offset_not_the_turns():
    """Token j of row n is drawn from fold_in(fold_in(rng, n), j): the first turn is the continuous-batching
    sampler's rollout (the same per-row streams), and splitting a turn in two with nothing appended
    between them changes no token."""
    mc, params = _model()
    prompts, mask = left_pad([[5, 6, 7], [9, 10, 11, 12, 13]], 8, 0)
    rng, kw = jax.random.PRNGKey(5), dict(stop_ids=[V - 1], temperature=0.8, top_k=20)
    g = generate(mc, params, prompts, mask, rng, max_new_tokens=7, eos_ids=[V - 1], pad_id=0, decode_slots=2,
                 temperature=0.8, top_k=20)
    ep = turns.start(mc, params, prompts, mask, capacity=16)
    _, whole = turns.decode_turn(mc, params, ep, rng, [7, 7], max_tokens=7, **kw)
    np.testing.assert_array_equal(np.asarray(whole.tokens), np.asarray(g.tokens))
    np.testing.assert_allclose(np.asarray(whole.behavior_logprobs), np.asarray(g.behavior_logprobs), atol=1e-5)
    ep = turns.start(mc, params, prompts, mask, capacity=16)
    ep, a = turns.decode_turn(mc, params, ep, rng, [3, 3], max_tokens=7, **kw)
    ep = turns.append(mc, params, ep, [[], []])
    _, b = turns.decode_turn(mc, params, ep, rng, [4, 4], max_tokens=7, **kw)
    for i in range(2):
        both = _ids(a, i) + _ids(b, i)
        assert (both[:both.index(V - 1) + 1] if V - 1 in both else both) == _ids(whole, i)
    assert len(_ids(b, 1)) > 0  # the second turn drew something in at least one row


def _episode(mc, params, prompts, g, obs, temperature, limits=((6, 0, 3, 6), (5, 5, 5, 5))):
    """start -> turn (limits[0]) -> append obs -> turn (limits[1]) on B prompts x g rows."""
    tokens, mask = left_pad(prompts, 8, 0)
    ep = turns.start(mc, params, tokens, mask, capacity=40, num_samples=g)
    rng = jax.random.PRNGKey(7)
    kw = dict(max_tokens=6, stop_ids=[V - 1], temperature=temperature, top_p=0.9 if temperature else 1.0)
    ep, t1 = turns.decode_turn(mc, params, ep, rng, np.array(limits[0]), **kw)
    ep = turns.append(mc, params, ep, obs)
    ep, t2 = turns.decode_turn(mc, params, ep, rng, np.array(limits[1]), **kw)
    rows = [prompts[i // g] for i in range(len(obs))]
    seqs = [(_ids(t1, i), obs[i], _ids(t2, i)) for i in range(len(obs))]
    return ep, rows, seqs, (t1, t2)


def _check_against_single_shot(mc, params, ep, rows, seqs, turn_outs):
    """Every cached key/value equals a single-shot prefill of [prompt ; all the episode's tokens], and the
    turns' log-probs (temperature 1) the trainer's teacher-forced ones. seqs[i] = (turn 1, observation,
    turn 2) ids of row i."""
    full = [p + a + o + b for p, (a, o, b) in zip(rows, seqs)]
    assert np.asarray(ep.length).tolist() == [len(f) - len(p) for f, p in zip(full, rows)]
    width = max(map(len, full))
    tokens, mask = left_pad(full, width, 0)
    _, kv = lm.prefill(mc, params, jnp.asarray(tokens), jnp.asarray(mask), with_lm_head=False)
    keys, values = turns._prefill_layout(mc, ep.cache)
    for i, (f, p) in enumerate(zip(full, rows)):
        span = slice(width - len(f) + len(p), width)
        n = len(f) - len(p)
        np.testing.assert_allclose(np.asarray(keys)[:, i, :n], np.asarray(kv[0])[:, i, span], atol=2e-5)
        np.testing.assert_allclose(np.asarray(values)[:, i, :n], np.asarray(kv[1])[:, i, span], atol=2e-5)
    ref = np.asarray(token_logprobs(mc, params, tokens[:, :-1], mask[:, :-1], tokens[:, 1:], 1.0))
    t1, t2 = turn_outs
    for i, (f, p) in enumerate(zip(full, rows)):
        a, o, b = seqs[i]
        at = width - len(f) + len(p) - 1  # ref[:, at + j] predicts the episode's token j
        got = np.r_[np.asarray(t1.logprobs)[i, :len(a)], np.asarray(t2.logprobs)[i, :len(b)]]
        want = np.r_[ref[i, at:at + len(a)], ref[i, at + len(a) + len(o):at + len(a) + len(o) + len(b)]]
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("path", ["unrolled", "scanned", "windowed"])
def test_append_and_resume_match_a_single_shot_prefill(path, monkeypatch):
    """After turn, append, turn: every cached key/value equals a single-shot prefill of [prompt ; all the
    tokens]; the sampler's log-probs equal the trainer's teacher-forced ones; the resumed greedy turn
    equals the single-turn sampler run on the whole sequence as a fresh prompt."""
    if path == "scanned":
        monkeypatch.setattr(lm, "DECODE_UNROLL_MAX_LAYERS", 0)
    jax.clear_caches()  # the programs' traces depend on the path
    mc, params = _model(layers=3)
    if path == "windowed":  # Mistral / Gemma layers: a window shorter than the episodes, soft caps
        mc = mc.replace(sliding_window=4, layer_types=("sliding_attention", "full_attention", "sliding_attention"),
                        attn_softcap=1.0, final_softcap=5.0)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    obs = [[20, 21, 22], [23], [], [30, 31, 32, 33, 34, 35, 36, 37, 38]]  # one row appends nothing
    ep, rows, seqs, (t1, t2) = _episode(mc, params, prompts, 2, obs, temperature=1.0)
    _check_against_single_shot(mc, params, ep, rows, seqs, (t1, t2))
    # resume, greedy: the second turn is the single-turn sampler's on [prompt ; turn ; observation]
    _, rows, seqs, (_, t2) = _episode(mc, params, prompts, 2, obs, temperature=0.0)
    before, bmask = left_pad([p + a + o for p, (a, o, _) in zip(rows, seqs)], 32, 0)
    g = generate(mc, params, before, bmask, jax.random.PRNGKey(0), max_new_tokens=5, temperature=0,
                 eos_ids=[V - 1], pad_id=0)
    np.testing.assert_array_equal(np.asarray(t2.tokens)[:, :5], np.asarray(g.tokens))
    np.testing.assert_allclose(np.asarray(t2.logprobs)[:, :5], np.asarray(g.logprobs), atol=1e-5)
    jax.clear_caches()


def test_calls_see_a_window_of_the_cache_and_leave_the_rest_intact():
    """A call attends over (and writes) only the first power-of-two slots its rows can reach: after a row
    of 100 tokens has ended, the other row's append and turn run on a 64-slot window of the 256-slot
    cache; the long row's keys and values stay those of a single-shot prefill."""
    mc, params = _model()
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    tokens, mask = left_pad(prompts, 8, 0)
    ep = turns.start(mc, params, tokens, mask, capacity=256)
    rng, kw = jax.random.PRNGKey(11), dict(stop_ids=[V - 1], temperature=0.0)  # greedy: no stop in 100
    ep, t1 = turns.decode_turn(mc, params, ep, rng, [100, 3], max_tokens=100, **kw)
    assert turns._window_for(ep, 6) == 64 < int(ep.length[0]) and ep.capacity == 256
    ep = turns.append(mc, params, ep, [[], [20, 21, 22]])
    ep, t2 = turns.decode_turn(mc, params, ep, rng, [0, 5], max_tokens=5, **kw)
    seqs = [(_ids(t1, 0), [], []), (_ids(t1, 1), [20, 21, 22], _ids(t2, 1))]
    assert len(seqs[0][0]) > 64 and len(seqs[1][2]) > 0  # the long row stands past the window
    _check_against_single_shot(mc, params, ep, prompts, seqs, (t1, t2))


def test_bad_calls_are_refused():
    mc, params = _model()
    prompts, mask = left_pad([[5, 6], [7]], 4, 0)
    ep = turns.start(mc, params, prompts, mask, capacity=8)
    with pytest.raises(ValueError, match="limit must be"):
        turns.decode_turn(mc, params, ep, jax.random.PRNGKey(0), [9, 1], max_tokens=8, stop_ids=[1])
    with pytest.raises(ValueError, match="row 1: an observation of 9 tokens does not fit the 8"):
        turns.append(mc, params, ep, [[1], list(range(9))])
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        turns.start(mc, params, prompts, mask, capacity=511)


class Echo(envs.Environment):
    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}], 0

    def step(self, state, text):
        return envs.StepResult([{"role": "user", "content": f"turn {state + 1}: {len(text)}"}], 0.5, state + 1)


@pytest.mark.parametrize("task", ["chat", "guess_digit"])
def test_greedy_episodes_equal_the_reprefilling_reference(task):
    """The KV-cache episodes and tests/episodes_reference.py (each turn a fresh prefill of the whole
    sequence on the single-turn sampler) give the same greedy episodes: tokens, masks, texts, rewards."""
    if task == "chat":  # Qwen template, turns cut by the per-turn budget
        tok, env, rows, kw = qwen_tokenizer(), Echo(), [{"prompt": "hello there"}, {"prompt": "hi"}] * 2, \
            dict(max_turns=3, max_new_tokens=96, max_turn_tokens=5)
    else:
        tok, env, rows, kw = builtin_tokenizer(), envs.make_env("guess_digit"), \
            [{"prompt": "guess:", "hidden": h} for h in (0, 3, 7, 9)], dict(max_turns=4, max_new_tokens=8,
                                                                            max_turn_tokens=1)
    mc, params = _model(vocab=len(tok), seed=1)
    got = sample_episodes(mc, params, tok, env, rows, jax.random.PRNGKey(1), temperature=0.0,
                          pad_id=tok.pad_token_id, **kw)
    ref = reference_episodes(mc, params, tok, env, rows, jax.random.PRNGKey(1), temperature=0.0,
                             pad_id=tok.pad_token_id, **kw)
    for name in ("prompt_tokens", "tokens", "attention_mask", "mask", "truncated", "rewards"):
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)
    np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5)
    assert got.texts == ref.texts and got.metrics == ref.metrics
    assert got.mask.sum() > 2 * len(rows) and (got.attention_mask > got.mask).any()  # several turns each


def test_a_group_must_share_its_prompt():
    class Random(Echo):
        def reset(self, row):
            return [{"role": "user", "content": str(np.random.default_rng().integers(1 << 30))}], 0

    tok = qwen_tokenizer()
    mc, params = _model(vocab=len(tok))
    with pytest.raises(ValueError, match=r"reset gave different prompts for the same row \(episodes 0..1\)"):
        sample_episodes(mc, params, tok, Random(), [{"prompt": "a"}] * 2, jax.random.PRNGKey(0), max_turns=2,
                        max_new_tokens=16, pad_id=tok.pad_token_id, group_size=2)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stop_strings_end_turns_and_rewind_the_cache(temperature):
    """env.stop_strings: a turn ends at the first stop string in its text (tokens drawn after it are
    dropped: the row's cache is rewound and its last kept token re-fed). The episodes keep the log-prob
    identity on every model token, so the cache holds exactly the kept tokens; greedy, they equal the
    re-prefilling reference under the same rule."""
    tok = qwen_tokenizer()
    mc, params = _model(vocab=len(tok), seed=1)
    rows = [{"prompt": "hello there"}, {"prompt": "hi"}, {"prompt": "yo"}, {"prompt": "hey"}]
    kw = dict(max_turns=3, max_new_tokens=120, max_turn_tokens=24, temperature=temperature, pad_id=tok.pad_token_id)
    free = sample_episodes(mc, params, tok, Echo(), rows, jax.random.PRNGKey(4), **kw)
    text = free.texts[0][0]
    stop = text[len(text) // 2:len(text) // 2 + 2]  # cuts row 0's first turn in its middle
    assert len(stop) == 2
    got = sample_episodes(mc, params, tok, Echo(), rows, jax.random.PRNGKey(4), stop_strings=(stop,), **kw)
    first = got.texts[0][0]
    assert first.endswith(stop) and stop not in first[:-1] and len(first) < len(text)
    assert all(stop not in t[:-1] for turns_ in got.texts for t in turns_)
    assert _trainer_gap(mc, params, got, max(temperature, 1.0)) <= 1e-4
    if temperature == 0:
        ref = reference_episodes(mc, params, tok, Echo(), rows, jax.random.PRNGKey(4), stop_strings=(stop,), **kw)
        for name in ("tokens", "attention_mask", "mask", "truncated", "rewards"):
            np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)
        assert got.texts == ref.texts


def _trainer_gap(mc, params, ep, temperature):
    """Max |sampler log-prob - the trainer's teacher-forced log-prob| over the episodes' model tokens."""
    full = np.concatenate([ep.prompt_tokens, ep.tokens], 1)
    full_mask = np.concatenate([ep.prompt_mask, ep.attention_mask], 1)
    p = ep.prompt_tokens.shape[1]
    ref = np.asarray(token_logprobs(mc, params, full[:, :-1], full_mask[:, :-1], full[:, 1:], temperature))[:, p - 1:]
    return float(np.abs(ref - ep.logprobs)[ep.mask.astype(bool)].max())


class Silent(envs.Environment):
    """A text environment whose replies are empty: the next turn continues right after the model's."""

    def reset(self, row):
        return row["prompt"], 0

    def step(self, state, text):
        return envs.StepResult("", 0.0, state + 1)


def test_a_stop_string_then_an_empty_reply_refeeds_the_last_kept_token():
    """With nothing to append after a turn cut at a stop string, the row's hidden state must be rebuilt
    (its cache rewound one token further, the last kept token fed again): the next turn's first log-prob
    is the trainer's."""
    tok = builtin_tokenizer()
    mc, params = _model(vocab=len(tok), seed=2)
    rows = [{"prompt": "guess:"}, {"prompt": "say:"}]
    kw = dict(max_turns=3, max_new_tokens=60, max_turn_tokens=12, temperature=1.0, pad_id=tok.pad_token_id)
    free = sample_episodes(mc, params, tok, Silent(), rows, jax.random.PRNGKey(6), **kw)
    stop = free.texts[0][0][5]  # one character of row 0's first turn
    got = sample_episodes(mc, params, tok, Silent(), rows, jax.random.PRNGKey(6), stop_strings=(stop,), **kw)
    assert got.texts[0][0].endswith(stop) and len(got.texts[0]) >= 2 and (got.attention_mask == got.mask).all()
    assert _trainer_gap(mc, params, got, 1.0) <= 1e-4
