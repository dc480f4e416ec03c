"""Rewards of the built-in synthetic tasks of `jaxrl_llm.data.tasks` (the data package imports no
rewards: each task's checker lives here and is registered under the task's name)."""
from __future__ import annotations

from collections.abc import Sequence

from jaxrl_llm.rewards.registry import register_reward


def char_credit(completion: str, answer: str) -> float:
    """Per-character credit in [0, 1]: 1.0 iff completion == answer."""
    hits = sum(c == a for c, a in zip(completion, answer))
    return hits / max(len(answer), len(completion), 1)


@register_reward("digit_puzzles")
def digit_puzzle_reward(prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[str],
                        **_) -> list[float]:
    """Reward of the digit puzzles; `completions` are decoded up to (not including) EOS."""
    return [char_credit(c.strip(), str(a)) for c, a in zip(completions, answer)]
