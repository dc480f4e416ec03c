"""Length-based reward shaping: DAPO's overlong penalty and a linear length penalty.

Both read the trainer-provided column `completion_lengths` (tokens generated, EOS included) and take
their length scale from `max_completion_length` unless configured.
"""

from __future__ import annotations

import numbers

import numpy as np

from jaxrl_llm.rewards.registry import RewardFn, register_reward

# DAPO used L_max = 20480 with a 4096-token buffer: the buffer defaults to the same 20% of L_max.
_DEFAULT_BUFFER_FRACTION = 0.2


def overlong_penalty(lengths: np.ndarray, max_length: int, buffer: int) -> np.ndarray:
    """DAPO soft overlong punishment. lengths (N,) ints -> (N,) float32 in [-1, 0].

    0 if |o| <= L_max - L_buf; (L_max - L_buf - |o|) / L_buf if L_max - L_buf < |o| <= L_max;
    -1 beyond L_max. Continuous: it reaches -1 exactly at |o| = L_max.
    """
    _check_positive_int("max_length", max_length)
    _check_positive_int("buffer", buffer)
    if buffer > max_length:
        raise ValueError(f"buffer must be <= max_length ({max_length}), got {buffer}")
    lengths = np.asarray(lengths, np.float32)
    start = np.float32(max_length - buffer)
    ramp = (start - lengths) / np.float32(buffer)
    # clip covers both flat parts: 0 below the buffer, -1 at and beyond L_max.
    return np.clip(ramp, -1.0, 0.0).astype(np.float32)


def linear_length_penalty(lengths: np.ndarray, max_length: int, coef: float = 1.0, free_length: int = 0) -> np.ndarray:
    """-coef * max(0, |o| - free_length) / (max_length - free_length). lengths (N,) -> (N,) float32.

    With the defaults it is -coef * |o| / L_max: -coef for a completion that fills the budget.
    """
    _check_positive_int("max_length", max_length)
    if isinstance(free_length, bool) or not isinstance(free_length, numbers.Integral) or not 0 <= free_length < max_length:
        raise ValueError(f"free_length must be an integer in [0, max_length={max_length}), got {free_length!r}")
    lengths = np.asarray(lengths, np.float32)
    excess = np.maximum(lengths - np.float32(free_length), np.float32(0.0))
    return (np.float32(-coef) * excess / np.float32(max_length - free_length)).astype(np.float32)


@register_reward("overlong", factory=True)
def overlong_reward(max_length: int | None = None, buffer: int | None = None) -> RewardFn:
    """DAPO overlong shaping as a reward. max_length: L_max, default the trainer's
    `max_completion_length`; buffer: L_buf, default 20% of L_max (DAPO's 4096 of 20480)."""
    if max_length is not None:
        _check_positive_int("max_length", max_length)
    if buffer is not None:
        _check_positive_int("buffer", buffer)

    def reward(prompts, completions, *, completion_lengths=None, max_completion_length=None, **columns):
        del prompts, columns
        lengths = _lengths(completion_lengths, len(completions), "overlong")
        l_max = _resolve_max_length("overlong", max_length, max_completion_length)
        l_buf = buffer if buffer is not None else max(1, round(_DEFAULT_BUFFER_FRACTION * l_max))
        return overlong_penalty(lengths, l_max, l_buf).tolist()

    reward.__name__ = "overlong"
    return reward


@register_reward("length_penalty", factory=True)
def length_penalty(coef: float = 1.0, max_length: int | None = None, free_length: int = 0) -> RewardFn:
    """Linear length penalty as a reward, see `linear_length_penalty`; max_length defaults to the
    trainer's `max_completion_length`."""
    if isinstance(coef, bool) or not isinstance(coef, numbers.Real) or not np.isfinite(coef):
        raise ValueError(f"coef must be a finite number, got {coef!r}")
    if max_length is not None:
        _check_positive_int("max_length", max_length)

    def reward(prompts, completions, *, completion_lengths=None, max_completion_length=None, **columns):
        del prompts, columns
        lengths = _lengths(completion_lengths, len(completions), "length_penalty")
        l_max = _resolve_max_length("length_penalty", max_length, max_completion_length)
        return linear_length_penalty(lengths, l_max, coef, free_length).tolist()

    reward.__name__ = "length_penalty"
    return reward


def _lengths(completion_lengths, n: int, who: str) -> np.ndarray:
    if completion_lengths is None:
        raise ValueError(f"reward {who!r} needs the column 'completion_lengths' (tokens per completion)")
    lengths = np.asarray(completion_lengths)
    if lengths.shape != (n,) or not np.issubdtype(lengths.dtype, np.integer) or np.any(lengths < 0):
        raise ValueError(
            f"completion_lengths must be {n} non-negative integers, got shape {lengths.shape} dtype {lengths.dtype}"
        )
    return lengths


def _resolve_max_length(who: str, configured: int | None, from_trainer) -> int:
    value = configured if configured is not None else from_trainer
    if value is None:
        raise ValueError(f"reward {who!r} needs max_length: configure it or pass max_completion_length")
    _check_positive_int("max_completion_length" if configured is None else "max_length", value)
    return int(value)


def _check_positive_int(arg: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{arg} must be a positive integer, got {value!r}")
