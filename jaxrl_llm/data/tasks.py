"""Built-in synthetic verifiable task: digit puzzles of graded difficulty, shipped with the package.

The embedded default run (`configs/tiny.py`) learns this task from a randomly initialized model with no
download. Every prompt has one exact answer, checked by a program:

  level 1  max of two digits             "max(3,8)="        -> "8"
  level 2  max of four digits            "max(3,8,1,5)="    -> "8"
  level 3  min of two digits             "min(3,8)="        -> "3"
  level 4  max of three 2-digit numbers  "max(23,81,47)="   -> "81"

Why this shape: every answer is copied from the prompt, which attention learns quickly, so a tiny model
improves within minutes; more candidates, reading min instead of max (a policy that has learned "max"
must notice the one-letter change), and two-digit answers grade the difficulty. Answers
are spread evenly over the digits, so no single output earns reward on many prompts (an earlier version
with sums rewarded a constant leading "1" and policies collapsed onto it). The reward gives
per-character credit (`jaxrl_llm.rewards.tasks`, registered as "digit_puzzles"), (# answer characters
right at their position) / max(|answer|, |completion|), so
1.0 means solved (answer then EOS), rambling past the answer costs, and a random policy over the
100-character vocabulary earns something about once in a hundred samples.

Held-out split: a fixed eighth of the problem space (the prompts whose CRC-32 is 0 mod 8, about 10 of
the 100 prompts of levels 1 and 3 and an eighth of the larger levels) is the "test" split; the "train"
split never contains one of them (a problem drawn there is drawn again), so evaluation on "test"
measures answers to prompts the policy has never been trained on.
"""
from __future__ import annotations

import zlib
from collections.abc import Sequence

import datasets
import numpy as np

LEVEL_WEIGHTS = (0.3, 0.3, 0.2, 0.2)  # sampling frequency of levels 1..4
SPLITS = ("train", "test")
_HELD_OUT_MOD = 8  # one prompt in 8 is held out for evaluation
_TEST_STREAM = 0x7465  # seeds the test split's generator apart from the train split's (seed alone)


def is_held_out(prompt: str) -> bool:
    """Whether a prompt belongs to the held-out "test" split (a pure function of the prompt text)."""
    return zlib.crc32(prompt.encode("utf-8")) % _HELD_OUT_MOD == 0


def make_problem(rng: np.random.Generator, level: int) -> tuple[str, str]:
    """(prompt, answer) of one puzzle of `level` in 1..4."""
    if level in (1, 3):
        a = rng.integers(0, 10, 2)
        op = "max" if level == 1 else "min"
        return f"{op}({a[0]},{a[1]})=", str(a.max() if level == 1 else a.min())
    if level == 2:
        a = rng.integers(0, 10, 4)
        return f"max({','.join(map(str, a))})=", str(a.max())
    if level == 4:
        a = rng.integers(10, 100, 3)
        return f"max({','.join(map(str, a))})=", str(a.max())
    raise ValueError(f"level must be in 1..4, got {level}")


def _problem_in(rng: np.random.Generator, level: int, held_out: bool) -> tuple[str, str]:
    """A problem of `level` from one side of the split: drawn again until it falls there."""
    while True:
        prompt, answer = make_problem(rng, level)
        if is_held_out(prompt) == held_out:
            return prompt, answer


def digit_puzzles(num_rows: int = 4096, seed: int = 0, weights: Sequence[float] = LEVEL_WEIGHTS,
                  split: str = "train") -> datasets.Dataset:
    """A deterministic dataset with columns `prompt`, `answer` and `level`: `num_rows` problems of the
    `split` ("train" or the held-out "test", whose prompts never occur in "train")."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if num_rows < 1:
        raise ValueError(f"num_rows must be >= 1, got {num_rows}")
    w = np.asarray(weights, np.float64)
    if w.shape != (4,) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be 4 non-negative numbers with a positive sum, got {weights}")
    rng = np.random.default_rng(seed if split == "train" else [seed, _TEST_STREAM])
    levels = rng.choice(4, size=num_rows, p=w / w.sum()) + 1
    rows = [_problem_in(rng, int(level), split == "test") for level in levels]
    return datasets.Dataset.from_dict({"prompt": [p for p, _ in rows], "answer": [a for _, a in rows],
                                       "level": [int(x) for x in levels]})


def guess_digit(num_rows: int = 4096, seed: int = 0, weights: Sequence[float] = LEVEL_WEIGHTS,
                split: str = "train") -> datasets.Dataset:
    """Rows of the multi-turn `guess_digit` environment (jaxrl_llm/envs/guess.py): the same `prompt` for
    every row (it must say nothing about the digit), the `hidden` digit (uniform) and `answer` (its text).
    `weights` is unused (one level)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if num_rows < 1:
        raise ValueError(f"num_rows must be >= 1, got {num_rows}")
    rng = np.random.default_rng(seed if split == "train" else [seed, _TEST_STREAM])
    hidden = [int(h) for h in rng.integers(0, 10, num_rows)]
    return datasets.Dataset.from_dict({"prompt": ["guess:"] * num_rows, "hidden": hidden,
                                       "answer": [str(h) for h in hidden]})


TASKS = {"digit_puzzles": digit_puzzles, "guess_digit": guess_digit}


def load_task(name: str, num_rows: int, seed: int, weights: Sequence[float] = LEVEL_WEIGHTS,
              split: str = "train") -> datasets.Dataset:
    if name not in TASKS:
        raise ValueError(f"config.data.task {name!r} is unknown; built-in tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name](num_rows=num_rows, seed=seed, weights=weights, split=split)
