"""The estimators of held-out evaluation, pure Python/NumPy: pass@k, majority vote, and the metrics of
one evaluation from per-prompt counts.

pass@k (Chen et al. 2021): the probability that at least one of k samples drawn without replacement from
the n generated samples of a prompt, c of them correct, is correct: 1 - C(n-c, k) / C(n, k). Written as
the product 1 - prod_{i=n-c+1..n} (1 - k/i), which never forms the (huge) binomial coefficients; exactly
1.0 when n - c < k (every k-subset holds a correct sample). Averaged over prompts it is an unbiased
estimate of the policy's pass@k.

maj@k: the answer given by most of a prompt's k samples wins; a tie goes to the answer that appeared
first (the lowest sample index), so the vote is a function of the samples alone. The vote is correct
when the first sample giving the winning answer is correct (score >= the threshold). Samples without an
answer (None) do not vote; a prompt where none has one counts as wrong.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _check_counts(n, c, k) -> None:
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"pass_at_k: {name} must be an int, got {v!r}")
    if not (n >= 1 and 0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (see the module docstring)."""
    _check_counts(n, c, k)
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_array(n, c, k: int) -> np.ndarray:
    """`pass_at_k` of every prompt: n and c int arrays (broadcast together), k one int. float64."""
    n, c = np.broadcast_arrays(np.asarray(n), np.asarray(c))
    return np.array([pass_at_k(int(ni), int(ci), k) for ni, ci in zip(n.ravel(), c.ravel())],
                    np.float64).reshape(n.shape)


def majority_vote(answers: Sequence[str | None], correct: Sequence[bool]) -> tuple[str | None, bool]:
    """(the winning answer, whether it is correct) of one prompt's samples (see the module docstring)."""
    if len(answers) != len(correct):
        raise ValueError(f"majority_vote: {len(answers)} answers for {len(correct)} correctness flags")
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, a in enumerate(answers):
        if a is not None:
            counts[a] = counts.get(a, 0) + 1
            first.setdefault(a, i)
    if not counts:
        return None, False
    winner = min(counts, key=lambda a: (-counts[a], first[a]))
    return winner, bool(correct[first[winner]])


def pass_ks(k: int) -> list[int]:
    """The k's reported for k samples per prompt: 1, 2, 4, ... below k, and k."""
    ks = [1 << i for i in range(k.bit_length()) if (1 << i) < k]
    return ks + [k]


def summarize(k: int, correct, score_mean, maj=None, level=None, task=None) -> dict[str, float]:
    """Metrics of one evaluation from per-prompt arrays: `correct` (P,) correct samples of k, `score_mean`
    (P,) mean score, `maj` (P,) 0/1 votes or None, `level` (P,) ints or None (then no per-level breakdown,
    eval/level<L>/), `task` (P,) task names or None (then no per-task breakdown, eval/task/<name>/)."""
    correct, score_mean = np.asarray(correct, np.int64), np.asarray(score_mean, np.float64)
    m = _group_metrics(k, correct, score_mean, maj, pass_ks(k), "eval/")
    for groups, name in ((level, lambda g: f"eval/level{int(g)}/"), (task, lambda g: f"eval/task/{g}/")):
        if groups is None:
            continue
        groups = np.asarray(groups)
        for g in sorted(set(groups.tolist())):
            sel = groups == g
            m.update(_group_metrics(k, correct[sel], score_mean[sel], None if maj is None else np.asarray(maj)[sel],
                                    sorted({1, k}), name(g)))
    return m


def _group_metrics(k, correct, score_mean, maj, ks, prefix) -> dict[str, float]:
    m = {f"{prefix}pass@{j}": float(pass_at_k_array(k, correct, j).mean()) for j in ks}
    m[f"{prefix}mean_reward"] = float(score_mean.mean())
    if maj is not None:
        m[f"{prefix}maj@{k}"] = float(np.mean(maj))
    return m
