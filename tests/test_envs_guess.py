"""guess_digit: its feedback-free bound and its optimum checked by brute force over every policy, the
environment's replies, its data task and an episode through the runner on the built-in tokenizer."""
import functools
import itertools

import numpy as np
import pytest

from jaxrl_llm import envs
from jaxrl_llm.data import builtin_tokenizer
from jaxrl_llm.data.tasks import load_task
from jaxrl_llm.envs import EpisodeBatch, GuessDigitEnv, feedback_free_bound, feedback_optimum

ENV = GuessDigitEnv()
DIGITS = "0123456789"


def play(hidden, policy, max_turns):
    """One episode with the environment itself; `policy(replies) -> guess text`. Returns the reward."""
    _, state = ENV.reset({"prompt": "guess:", "hidden": hidden})
    replies, total = [], 0.0
    for _ in range(max_turns):
        r = ENV.step(state, policy(tuple(replies)))
        total += r.reward or 0.0
        if r.done:
            break
        replies.append(r.observation)
    return total


@pytest.mark.parametrize("max_turns", [1, 2, 3, 4])
def test_feedback_free_bound_by_brute_force(max_turns):
    """Every deterministic reply-ignoring policy (a fixed guess sequence over the 11 turn texts: 10 digits
    and a non-digit); the best stochastic one is a mixture of these, so its value is their max."""
    texts = list(DIGITS) + ["x"]
    best = max(np.mean([play(h, lambda replies, s=seq: s[len(replies)], max_turns) for h in range(10)])
               for seq in itertools.product(texts, repeat=max_turns))
    assert best == pytest.approx(feedback_free_bound(max_turns))


@pytest.mark.parametrize("max_turns", [1, 2, 3, 4])
def test_feedback_optimum_by_exhaustive_search_over_adaptive_policies(max_turns):
    """The best policy that reads the replies: exhaustive search over every guess at every information
    state (the replies so far), playing the environment for each hidden digit consistent with them."""

    @functools.lru_cache(maxsize=None)
    def best(candidates, turns_left):  # expected hits (count) over the hidden digits in `candidates`
        if not candidates or not turns_left:
            return 0
        values = []
        for g in DIGITS:
            hits, groups = 0, {}
            for h in candidates:
                r = ENV.step({"hidden": h}, g)
                if r.done:
                    hits += 1
                else:
                    groups.setdefault(r.observation, []).append(h)
            values.append(hits + sum(best(tuple(v), turns_left - 1) for v in groups.values()))
        return max(values)

    assert best(tuple(range(10)), max_turns) / 10 == pytest.approx(feedback_optimum(max_turns))
    assert feedback_optimum(max_turns) >= feedback_free_bound(max_turns)


def test_binary_search_reaches_the_optimum_and_replies_are_right():
    def bisect(replies, lo=0, hi=9):
        for r in replies:  # replay the replies of the guesses made so far
            g = (lo + hi) // 2
            lo, hi = (lo, g - 1) if r == "<" else (g + 1, hi)
        return str((lo + hi) // 2)

    assert np.mean([play(h, bisect, 4) for h in range(10)]) == feedback_optimum(4) == 1.0
    assert feedback_free_bound(4) == 0.4
    assert ENV.step({"hidden": 3}, "7").observation == "<" and ENV.step({"hidden": 8}, "7").observation == ">"
    assert ENV.step({"hidden": 3}, "ab").observation == "?" and ENV.step({"hidden": 3}, "").observation == "?"
    with pytest.raises(ValueError, match="must hold a digit"):
        ENV.reset({"prompt": "guess:", "hidden": 12})


def test_guess_digit_task_rows():
    train = load_task("guess_digit", 2000, seed=0)
    assert set(train["prompt"]) == {"guess:"}  # the prompt says nothing about the digit
    counts = np.bincount(train["hidden"], minlength=10)
    assert counts.min() > 150 and train["answer"] == [str(h) for h in train["hidden"]]
    assert load_task("guess_digit", 50, seed=0)["hidden"] == train["hidden"][:50]
    assert load_task("guess_digit", 50, seed=0, split="test")["hidden"] != train["hidden"][:50]


def test_an_episode_on_the_builtin_tokenizer_alternates_model_and_environment_tokens():
    """One-token turns (env.max_turn_tokens=1) and one-token replies: the trajectory's mask alternates."""
    tok = builtin_tokenizer()
    rows = [{"prompt": "guess:", "hidden": h} for h in (2, 9, 5)]
    scripts = [["5", "1", "2", "3"], ["0", "x", "4", "7"], ["5"]]
    trajs = [envs.Trajectory(budget=8) for _ in rows]
    with EpisodeBatch(envs.make_env("guess_digit"), rows, max_turns=4, max_workers=1) as batch:
        turn = 0
        while not batch.done.all():
            texts = [None if batch.done[i] else scripts[i][turn] for i in range(3)]
            for i, t in enumerate(texts):
                if t is not None:
                    trajs[i].add_model(tok.encode(t))
            for i, obs in enumerate(batch.step(texts)):
                if obs is not None:
                    assert trajs[i].add_env(envs.observation_ids(tok, None, texts[i], obs))
            turn += 1
    assert list(batch.episode_rewards()) == [1.0, 0.0, 1.0]
    assert tok.decode(trajs[0].ids) == "5<1>2" and trajs[0].mask == [1, 0, 1, 0, 1]
    assert tok.decode(trajs[1].ids) == "0>x?4>7" and trajs[1].mask == [1, 0] * 3 + [1]
    assert batch.metrics()["env/turns/mean"] == pytest.approx(8 / 3)
