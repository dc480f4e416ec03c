"""`format` reward: 1.0 when a completion matches a regex, else 0.0.

The default asks for reasoning in one `<think>...</think>` block followed by a non-empty answer, with
no further think tags. The tempered dots `(?:(?!</?think>).)` forbid a second or nested block and
keep matching linear in the completion length (no catastrophic backtracking).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from jaxrl_llm.rewards.registry import RewardFn, register_reward

DEFAULT_FORMAT_PATTERN = r"\s*<think>(?:(?!</?think>).)+</think>\s*(?!</?think>)\S(?:(?!</?think>).)*"
_MODES = ("fullmatch", "match", "search")


@register_reward("format", factory=True)
def format_reward(pattern: str = DEFAULT_FORMAT_PATTERN, *, mode: str = "fullmatch", flags: int = re.DOTALL) -> RewardFn:
    """Returns `reward(prompts, completions, **columns) -> list[float]`, 1.0 per matching completion.

    pattern: a Python regex. mode: 'fullmatch' (whole completion), 'match' (anchored at the start)
      or 'search' (anywhere). flags: `re` flags; DOTALL by default so `.` spans lines.
    """
    if mode not in _MODES:
        raise ValueError(f"format mode must be one of {_MODES}, got {mode!r}")
    if not isinstance(pattern, str):
        raise ValueError(f"format pattern must be a string, got {type(pattern).__name__}")
    try:
        regex = re.compile(pattern, flags)
    except re.error as e:
        raise ValueError(f"format pattern {pattern!r:.80} is not a valid regex: {e}") from e
    matcher = getattr(regex, mode)

    def reward(prompts: Sequence[str], completions: Sequence[str], **columns) -> list[float]:
        del prompts, columns  # the format depends on the completion alone
        return [1.0 if matcher(c) is not None else 0.0 for c in completions]

    reward.__name__ = "format"
    return reward
