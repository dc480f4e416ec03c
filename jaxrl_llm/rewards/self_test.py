"""The reward self-test: probe completions built from a few dataset rows, what each reward pays them, and
which probe a reward pays like a correct answer.

Probes of one row (`build_probes`; a probe with several variants is scored by the best or the worst of
them, as `PROBES` says):

  empty      ""
  reference  the reference answer stated plainly: `r`, `The answer is r.`, `\\boxed{r}`, `#### r`,
             `<answer>r</answer>` (the best of the five: the score of a correct answer, whatever form the
             reward reads)
  echo       the prompt echoed
  numbers    every candidate answer listed: the integers r-m..r+m (m = max(10, min(|r|, 500))) for an
             integer reference, else the reference among 20 wrong answers, the reference in the middle
  boxed      five `\\boxed{}` values, the reference the third
  hedged     the reference hedged with a wrong answer, in both orders (`r or w`, `w or r`; the worse of
             the two: a reward that reads one position is not fooled, one that pays either answer is)
  overlong   wrong answers (or, without a reference, the prompt) repeated to 10x the token budget
The probes that state the reference need one: without it (no answer column, or a row without a value)
only `empty`, `echo` and `overlong` are built, and nothing can be flagged.

A probe is **flagged** for a reward when, over the rows where the reward pays `reference` more than
`empty`, the probe's mean score is >= the mean of `reference` on the same rows (within 1e-6): it scores
like a correct answer. `empty` itself is flagged when the reward pays the reference something but
never more than the empty completion (a code reward whose tests never run pays nothing else). A reward that returns None on every probe, or raises on every one (with
`reward.on_error=zero`), is flagged too: it judges nothing on this data.

The calling itself is the caller's (`run_self_test` takes a function building the batch's inputs), so
the probes reach the rewards exactly as rollouts do: trainer/reward_check.py.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.rewards.registry import RewardError, score_rewards

log = logging.getLogger(__name__)

MODES = ("warn", "error", "off")
# name -> (what it is, how its variants combine on a row: "max" | "min" | "one")
PROBES: dict[str, tuple[str, str]] = {
    "empty": ("the empty completion", "one"),
    "reference": ("the reference answer stated plainly", "max"),
    "echo": ("the prompt echoed", "one"),
    "numbers": ("every candidate answer listed", "one"),
    "boxed": ("several \\boxed{} values, the reference among wrong ones", "one"),
    "hedged": ("the reference hedged with a wrong answer, in both orders", "min"),
    "overlong": ("wrong answers repeated to 10x the token budget", "one"),
}
OVERLONG_FACTOR = 10  # the overlong probe's length in token budgets
_TOLERANCE = 1e-6
_INT = re.compile(r"[-−]?\d+")
_DECIMAL = re.compile(r"[-−]?\d*\.(\d+)")


class RewardSelfTestError(ValueError):
    """`reward.self_test=error` and a reward paid a probe like a correct answer (or judged nothing)."""


# ------------------------------------------------------------------------------------------------ probes
def reference_text(value: Any) -> str | None:
    """The answer a row's reference states: GSM8K's `... #### 72` -> `72`, a `\\boxed{}` solution -> its
    box, a number -> its text; None for a missing or non-scalar value."""
    if value is None or isinstance(value, bool) or not isinstance(value, (str, int, float, np.integer, np.floating)):
        return None
    if not isinstance(value, str):
        return str(value.item() if isinstance(value, np.generic) else value)
    from jaxrl_llm.rewards.math import reference_answer  # the math reward's own reading of a reference
    return reference_answer(value)


def wrong_answers(reference: str, k: int) -> list[str]:
    """k distinct answers of the reference's form, none equal to it: neighbouring integers or decimals,
    neighbouring letters for a one-letter choice, else the reference with its digits shifted (or a
    suffix)."""
    out: list[str] = []
    if _INT.fullmatch(reference) or _DECIMAL.fullmatch(reference):
        decimals = m.group(1) if (m := _DECIMAL.fullmatch(reference)) else ""
        value, step = float(reference.replace("−", "-")), 10.0 ** -len(decimals)
        for i in range(1, k + 1):
            for sign in (1, -1):
                text = f"{value + sign * i * step:.{len(decimals)}f}"
                if text != reference and text not in out:
                    out.append(text)
    elif len(reference) == 1 and reference.isalpha():
        base = ord("A" if reference.isupper() else "a")
        out = [chr(base + i) for i in range(26) if chr(base + i) != reference]
    elif any(ch.isdigit() for ch in reference):
        for i in range(1, 10):
            text = "".join(str((int(ch) + i) % 10) if ch.isdigit() else ch for ch in reference)
            if text != reference and text not in out:
                out.append(text)
    out += [f"{reference}{i}" for i in range(1, k + 1)]  # tops up a short list (few digits to shift)
    return list(dict.fromkeys(out))[:k]


def _candidates(reference: str) -> list[str]:
    """The `numbers` probe's list: the reference among many wrong answers, in the middle."""
    if _INT.fullmatch(reference):
        r = int(reference.replace("−", "-"))
        m = max(10, min(abs(r), 500))
        return [str(v) for v in range(r - m, r + m + 1)]
    wrong = wrong_answers(reference, 20)
    return wrong[:10] + [reference] + wrong[10:]


def build_probes(prompt: str, reference: str | None, overlong_tokens: int,
                 count_tokens: Callable[[str], int]) -> dict[str, tuple[str, ...]]:
    """The probes of one row: name -> variant texts (see PROBES). `overlong_tokens`: the overlong probe's
    length in tokens at least, as `count_tokens` counts them."""
    probes: dict[str, tuple[str, ...]] = {"empty": ("",)}
    if reference is not None:
        w = wrong_answers(reference, 4)
        probes["reference"] = (reference, f"The answer is {reference}.", f"\\boxed{{{reference}}}", f"#### {reference}",
                               f"<answer>{reference}</answer>")  # the last: rewards reading answer tags (reasoning_gym)
    probes["echo"] = (prompt,)
    if reference is not None:
        probes["numbers"] = (" ".join(_candidates(reference)),)
        probes["boxed"] = (" ".join(f"\\boxed{{{x}}}" for x in (w[0], w[1], reference, w[2], w[3])),)
        probes["hedged"] = (f"The answer is {reference} or {w[0]}.", f"The answer is {w[0]} or {reference}.")
    unit = " ".join(f"Perhaps it is {x}." for x in w) + " " if reference is not None else f"{prompt.strip() or '...'} "
    probes["overlong"] = (_repeat_to(unit, overlong_tokens, count_tokens),)
    return probes


def _repeat_to(unit: str, tokens: int, count_tokens: Callable[[str], int]) -> str:
    """`unit` repeated until it counts at least `tokens` tokens (bounded at 64 characters a token, for a
    tokenizer that would count it as nothing)."""
    text = unit * max(1, math.ceil(tokens / max(1, count_tokens(unit))))
    while count_tokens(text) < tokens and len(text) < 64 * tokens:
        text += unit
    return text


# ------------------------------------------------------------------------------------------- the test
@dataclasses.dataclass
class SelfTestReport:
    """table: reward -> probe -> mean score over the rows (None: the reward gave None on every row, or
    the probe was not built); flagged: (reward, probe, why) triples; seconds: reward -> time spent in it;
    total_s: the whole check's time (the caller may add its own preparation)."""

    rows: int
    probes: tuple[str, ...]
    table: dict[str, dict[str, float | None]]
    flagged: list[tuple[str, str, str]]
    seconds: dict[str, float]
    total_s: float = 0.0

    def metrics(self) -> dict[str, float]:
        """`reward/self_test/<reward>/<probe>` (omitted where None), `reward/self_test/flagged` and the
        wall-clock `perf/reward_self_test_s` (perf/: it differs between any two runs)."""
        out = {f"reward/self_test/{name}/{probe}": v for name, col in self.table.items()
               for probe, v in col.items() if v is not None}
        out["reward/self_test/flagged"] = float(len(self.flagged))
        out["perf/reward_self_test_s"] = float(self.total_s)
        return out

    def format(self) -> str:
        """The table: a row per probe, a column per reward; `!` marks a flagged score."""
        names = list(self.table)
        marked = {(r, p) for r, p, _ in self.flagged}
        width = max([len(n) for n in names] + [9])
        cell = lambda name, probe: ("-" if self.table[name].get(probe) is None else
                                    f"{self.table[name][probe]:.3f}") + ("!" if (name, probe) in marked else "")
        lines = [f"reward self-test: mean score of each probe over {self.rows} dataset rows ('!' = scores like "
                 f"the reference answer; docs/rewards.md)",
                 "probe     " + "  ".join(f"{n:>{width}}" for n in names)]
        lines += [f"{p:<10}" + "  ".join(f"{cell(n, p):>{width}}" for n in names) for p in self.probes]
        lines.append(f"{'seconds':<10}" + "  ".join(f"{self.seconds[n]:>{width}.3f}" for n in names))
        return "\n".join(lines)


def run_self_test(reward_fns: Sequence[tuple[str, Callable[..., Any], float]],
                  probes: Sequence[Mapping[str, Sequence[str]]],
                  inputs: Callable[[list[str], list[int], list[bool]], tuple[list[str], list[str], dict]],
                  *, on_error: str = "raise") -> SelfTestReport:
    """Calls every reward (weight 1) once on all probe completions of all rows.

    probes: per dataset row, `build_probes`' dict. inputs(texts, row of each text, truncated) -> the
      (prompts, completions, columns) of `score_rewards`, built as the rollout builds them.
    A contract error (a raise under on_error='raise', a wrong length, type or value) is the RewardError
    of training, its row named as the dataset row and probe.
    """
    t0 = time.perf_counter()
    flat = [(r, name, text) for r, row in enumerate(probes) for name, texts in row.items() for text in texts]
    texts, rows = [t for _, _, t in flat], [r for r, _, _ in flat]
    prompts, completions, columns = inputs(texts, rows, [name == "overlong" for _, name, _ in flat])
    order = tuple(p for p in PROBES if any(p in row for row in probes))
    table, flagged, seconds = {}, [], {}
    for name, fn, _ in reward_fns:
        t0 = time.perf_counter()
        try:
            batch = score_rewards([(name, fn, 1.0)], prompts, completions, columns, on_error=on_error)
        except RewardError as e:
            where = "" if e.row is None else f" (dataset row {rows[e.row]}, probe {flat[e.row][1]!r})"
            raise RewardError(f"{e}{where}, in the reward check at start-up", reward=e.reward, row=e.row) from e
        seconds[name] = time.perf_counter() - t0
        values, present = batch.components[name], batch.present[name]
        scores = _row_scores(flat, len(probes), values, present)
        table[name] = {p: _mean([s for s in scores[p] if s is not None]) for p in order}
        flagged += _flags(name, scores, int(present.sum()), batch.metrics[f"reward/{name}/errors"], len(flat))
    return SelfTestReport(len(probes), order, table, flagged, seconds, time.perf_counter() - t0)


def _row_scores(flat, n_rows: int, values: np.ndarray, present: np.ndarray) -> dict[str, list[float | None]]:
    """probe -> its score on each dataset row (None: not built, or None on every variant)."""
    got: dict[tuple[str, int], list[float]] = {}
    for i, (r, probe, _) in enumerate(flat):
        got.setdefault((probe, r), [])
        if present[i]:
            got[(probe, r)].append(float(values[i]))
    out: dict[str, list[float | None]] = {p: [None] * n_rows for p in PROBES}
    for (probe, r), vals in got.items():
        how = PROBES[probe][1]
        out[probe][r] = None if not vals else (min(vals) if how == "min" else max(vals))
    return out


def _flags(name: str, scores, present: int, errors: float, n: int) -> list[tuple[str, str, str]]:
    """(reward, probe, why) of every probe paid like the reference; of a reward that judges nothing."""
    if present == 0:
        return [(name, "*", "returned None on every probe completion: it judges nothing on these rows")]
    if errors >= n:
        return [(name, "*", "raised on every probe completion (reward.on_error=zero scores them 0)")]
    ref, empty = scores["reference"], scores["empty"]
    both = [r for r in range(len(ref)) if ref[r] is not None and empty[r] is not None]
    judged = [r for r in both if ref[r] > empty[r]]
    out = []
    if both and not judged and _mean([ref[r] for r in both]) > 0:  # pays the empty completion like the answer
        got = _mean([empty[r] for r in both])
        out.append((name, "empty", f"({PROBES['empty'][0]}) scores like a correct answer: mean {got:.3f} >= the "
                                   f"reference's {_mean([ref[r] for r in both]):.3f} over {len(both)} rows"))
    for probe in PROBES:
        if probe in ("empty", "reference"):
            continue
        rows = [r for r in judged if scores[probe][r] is not None]
        if not rows:
            continue
        got, want = _mean([scores[probe][r] for r in rows]), _mean([ref[r] for r in rows])
        if got >= want - _TOLERANCE:
            out.append((name, probe, f"({PROBES[probe][0]}) scores like a correct answer: mean {got:.3f} >= "
                                     f"the reference's {want:.3f} over {len(rows)} rows"))
    return out


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def enforce(report: SelfTestReport, mode: str) -> None:
    """Logs every flagged probe as a warning (mode 'warn') or raises RewardSelfTestError naming the
    first ones (mode 'error')."""
    if mode not in MODES:
        raise ValueError(f"reward.self_test must be one of {MODES}, got {mode!r}")
    lines = [f"reward {r!r}" + (f", probe {p!r} {why}" if p != "*" else f": {why}") for r, p, why in report.flagged]
    if not lines or mode == "off":
        return
    if mode == "error":
        raise RewardSelfTestError(f"reward.self_test=error: {'; '.join(lines)} (the table and the probes: "
                                  "docs/rewards.md; reward.self_test=warn to train anyway)")
    for line in lines:
        log.warning("reward self-test: %s", line)
