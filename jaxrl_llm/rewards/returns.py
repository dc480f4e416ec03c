"""What a reward function returns, validated: a list of N floats or None, optionally a `RewardScores`
carrying batch metrics, and per-row process steps; `RewardError` names the function and the row of a
broken contract. Used by the registry's `score_rewards`."""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_FLOAT32_MAX = float(np.finfo(np.float32).max)


class RewardScores(list):
    """A reward function's (N,) scores plus extra metrics about the batch.

    A plain list everywhere (it compares equal to one); `compute_rewards` logs each metric as
    `reward/<name>/<key>`. Keys must be non-empty strings without '/', values finite numbers.
    """

    def __init__(self, scores=(), *, metrics: Mapping[str, float] | None = None):
        super().__init__(scores)
        self.metrics = dict(metrics or {})


class RewardError(ValueError):
    """A reward function raised or broke its contract. `reward` names it, `row` is the row or None."""

    def __init__(self, message: str, *, reward: str, row: int | None = None):
        super().__init__(message)
        self.reward = reward
        self.row = row


def extra_metrics(name: str, out: Any) -> dict[str, float]:
    """A `RewardScores`' metrics, validated: a bad key or value is a bug in the reward function."""
    extra = getattr(out, "metrics", None) if isinstance(out, RewardScores) else None
    if not extra:
        return {}
    checked = {}
    for key, value in extra.items():
        if not isinstance(key, str) or not key or "/" in key:
            raise RewardError(f"reward {name!r} returned a metric named {key!r}; names are non-empty, without '/'",
                              reward=name)  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise RewardError(f"reward {name!r} returned metric {key!r} = {value!r}, not a finite number", reward=name)
        checked[key] = float(value)
    return checked


def to_values(name: str, out: Any, n: int, row_offset: int = 0):
    """Validates a reward function's return; returns values (n,) float32, present (n,) bool and the
    process steps of each row (a row given as (token index, reward) steps is valued at their sum)."""
    if isinstance(out, np.ndarray):
        if out.ndim != 1:
            raise RewardError(f"reward {name!r} returned an array of shape {out.shape}, expected ({n},)", reward=name)
        out = out.tolist()
    elif not isinstance(out, (list, tuple)):
        raise RewardError(
            f"reward {name!r} returned {type(out).__name__}, expected a list of {n} floats or None", reward=name
        )
    if len(out) != n:
        raise RewardError(f"reward {name!r} returned {len(out)} values for {n} rows", reward=name)
    values = np.zeros((n,), np.float32)
    present = np.zeros((n,), bool)
    steps: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for i, v in enumerate(out):
        row = i + row_offset
        if v is None:
            continue
        if isinstance(v, (list, tuple)):
            steps[i] = _process_steps(name, v, row)
            v = float(sum(r for _, r in steps[i]))
        elif isinstance(v, (bool, np.bool_, numbers.Real)):  # numbers.Real covers NumPy scalars
            v = float(v)
        else:
            raise RewardError(
                f"reward {name!r} returned a non-numeric value {v!r:.60} ({type(v).__name__}) on row {row}",
                reward=name,
                row=row,
            )
        if not math.isfinite(v):
            raise RewardError(f"reward {name!r} returned {v} on row {row}", reward=name, row=row)
        if abs(v) > _FLOAT32_MAX:
            raise RewardError(f"reward {name!r} returned {v} on row {row}, which overflows float32", reward=name, row=row)
        values[i], present[i] = v, True
    return values, present, steps


def _process_steps(name: str, steps: Sequence[Any], row: int) -> list[tuple[int, float]]:
    """A row's process reward: (token index >= 0, finite reward) pairs, at most one per index."""
    out = []
    for step in steps:
        ok = isinstance(step, (list, tuple)) and len(step) == 2
        t, r = step if ok else (None, None)
        if not ok or isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0 or \
                isinstance(r, bool) or not isinstance(r, numbers.Real) or not math.isfinite(r):
            raise RewardError(f"reward {name!r} returned the process step {step!r:.60} on row {row}; expected "
                              "(token index >= 0, finite reward) pairs", reward=name, row=row)
        out.append((int(t), float(r)))
    if len({t for t, _ in out}) != len(out):
        raise RewardError(f"reward {name!r} returned two process steps at one token index on row {row}",
                          reward=name, row=row)
    return sorted(out)
