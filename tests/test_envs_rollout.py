"""Multi-turn rollouts (trainer/episodes.py on sampling/turns.py) on a tiny random model: the trainer's
teacher-forced log-probs equal the sampler's on every model token of multi-turn rows, the mask covers
exactly the model's tokens, and the environment's tokens are its replies."""
import os
import sys

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from fixtures_envs import qwen_tokenizer  # noqa: E402

from jaxrl_llm import envs  # noqa: E402
from jaxrl_llm.data import builtin_tokenizer  # noqa: E402
from jaxrl_llm.models import token_logprobs  # noqa: E402
from jaxrl_llm.models.config import ModelConfig  # noqa: E402
from jaxrl_llm.models.lm import init_params  # noqa: E402
from jaxrl_llm.trainer.episodes import sample_episodes  # noqa: E402


def _model(vocab):
    mc = ModelConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=True)
    return mc, init_params(mc, jax.random.PRNGKey(0))


def _trainer_gap(mc, params, ep, temperature):
    full = np.concatenate([ep.prompt_tokens, ep.tokens], 1)
    full_mask = np.concatenate([ep.prompt_mask, ep.attention_mask], 1)
    p = ep.prompt_tokens.shape[1]
    ref = np.asarray(token_logprobs(mc, params, full[:, :-1], full_mask[:, :-1], full[:, 1:], temperature))[:, p - 1:]
    m = ep.mask.astype(bool)
    return float(np.abs(ref - ep.logprobs)[m].max())


class Echo(envs.Environment):
    """A chat environment that always answers 'turn k: <length of the model's text>'."""

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}], 0

    def step(self, state, text):
        return envs.StepResult([{"role": "user", "content": f"turn {state + 1}: {len(text)}"}], 0.5, state + 1)


def test_guess_digit_episodes_keep_the_logprob_identity_and_the_mask():
    tok = builtin_tokenizer()
    mc, params = _model(len(tok))
    rows = [{"prompt": "guess:", "hidden": h} for h in (0, 3, 7, 9)]
    # The random model rarely writes a digit: its other turns get '?' replies, which take the same paths.
    ep = sample_episodes(mc, params, tok, envs.make_env("guess_digit"), rows, jax.random.PRNGKey(1), max_turns=4,
                         max_new_tokens=8, max_turn_tokens=1, temperature=1.0, pad_id=tok.pad_token_id)
    assert _trainer_gap(mc, params, ep, 1.0) <= 1e-4
    env = envs.GuessDigitEnv()
    for i, row in enumerate(rows):
        # independent reconstruction: one model token per turn, then the reply of the environment replayed
        # on that turn's text (none after the last turn, after the right guess or after EOS)
        _, state = env.reset(row)
        n = int(ep.attention_mask[i].sum())
        ids, mask = list(ep.tokens[i, :n]), list(ep.mask[i, :n])
        j, turns = 0, 0
        while j < n:
            assert mask[j] == 1 and tok.decode([ids[j]]) == ep.texts[i][turns] or ids[j] == tok.eos_token_id
            r = env.step(state, ep.texts[i][turns])
            j, turns = j + 1, turns + 1
            if r.done or turns == 4 or ids[j - 1] == tok.eos_token_id:
                break
            assert ids[j] == tok.encode(r.observation)[0] and mask[j] == 0
            j += 1
        assert j == n and turns == len(ep.texts[i])
        assert not ep.attention_mask[i, n:].any() and not ep.mask[i, n:].any()
    assert ep.metrics["env/turns/mean"] == pytest.approx(np.mean([len(t) for t in ep.texts]))


def test_chat_episodes_with_budget_cut_turns():
    """Qwen-style template, turns cut by the per-turn budget: the inserted <|im_end|> is an environment
    token, the observation follows through the template, and the identity holds on every model token."""
    tok = qwen_tokenizer()
    mc, params = _model(len(tok))
    rows = [{"prompt": "hello there"}, {"prompt": "hi"}]
    ep = sample_episodes(mc, params, tok, Echo(), rows, jax.random.PRNGKey(2), max_turns=3, max_new_tokens=96,
                         max_turn_tokens=5, temperature=0.7, pad_id=tok.pad_token_id)
    assert _trainer_gap(mc, params, ep, 0.7) <= 1e-4
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for i in range(2):
        n = int(ep.attention_mask[i].sum())
        ids, mask = ep.tokens[i, :n], ep.mask[i, :n]
        text = tok.decode(ids[mask == 0])
        assert "turn 1:" in text and "<|im_start|>assistant\n" in text
        assert mask[:5].sum() == min(5, np.argmax(ids == end) + 1 if (ids[:5] == end).any() else 5)
        # every environment stretch after a budget-cut turn opens with the turn end the runner inserted
        starts = np.flatnonzero(np.diff(np.r_[1, mask]) == -1)
        for s in starts:
            assert ids[s] == end or ids[s - 1] == end
    assert ep.rewards.tolist() == [0.5 * len(t) for t in ep.texts]
