"""`guess_digit`: a task only feedback can solve, for the built-in tiny model and character tokenizer.

Each episode hides a digit h (uniform over 0..9, the row's `hidden` column; the prompt is the same text
for every row, so it says nothing about h). Each model turn is one guess: a single digit (one token of the
built-in tokenizer, `env.max_turn_tokens=1`). The environment replies with one character: '<' (h is
lower than the guess), '>' (h is higher) or '?' (the turn is not a single digit). A right guess earns
reward 1 and ends the episode; after `max_turns` wrong guesses it ends with 0.

Best expected reward of a policy that ignores the replies (the bound a run must beat): such a policy is
a distribution over guess sequences fixed in advance, its expected reward is linear in that
distribution, so a deterministic sequence attains the best; a sequence finds h iff h is among its first
K = max_turns guesses, so the best is min(K, 10)/10 -- 0.4 for the default K = 4.
With the replies, each guess splits the remaining interval in two (a binary search whose probe is also
a candidate), so K guesses can resolve 2^K - 1 values: min(2^K - 1, 10)/10 -- 1.0 for K = 4.
`feedback_free_bound` and `feedback_optimum` compute them; tests/test_envs_guess.py checks both by brute
force over every policy.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrl_llm.envs.base import Environment, StepResult
from jaxrl_llm.envs.registry import register_env

NUM_VALUES = 10
PROMPT = "guess:"


def feedback_free_bound(max_turns: int, num_values: int = NUM_VALUES) -> float:
    """The best expected reward of any policy that ignores the environment's replies."""
    return min(max_turns, num_values) / num_values


def feedback_optimum(max_turns: int, num_values: int = NUM_VALUES) -> float:
    """The best expected reward of any policy (a binary search on the replies)."""
    return min(2 ** max_turns - 1, num_values) / num_values


@register_env("guess_digit")
class GuessDigitEnv(Environment):
    """Guess the hidden digit from '<'/'>' replies; reward 1 on the right guess. The turn limit is the
    runner's (`env.max_turns`)."""

    def __init__(self, hidden_column: str = "hidden", prompt_column: str = "prompt"):
        self.hidden_column, self.prompt_column = hidden_column, prompt_column

    def reset(self, row: Mapping[str, Any]):
        hidden = int(row[self.hidden_column])
        if not 0 <= hidden < NUM_VALUES:
            raise ValueError(f"column {self.hidden_column!r} must hold a digit, got {hidden}")
        return str(row[self.prompt_column]), {"hidden": hidden}

    def step(self, state, turn_text: str) -> StepResult:
        if len(turn_text) != 1 or turn_text not in "0123456789":
            return StepResult("?", 0.0, state)
        guess, hidden = int(turn_text), state["hidden"]
        if guess == hidden:
            return StepResult(None, 1.0, state)
        return StepResult("<" if hidden < guess else ">", 0.0, state)
