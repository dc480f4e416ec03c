"""`reasoning_gym` reward: the task's own `score_answer` on the completion's extracted answer.

The rows come from `data.source = "reasoning_gym"` (jaxrl_llm/data/reasoning_gym.py): each names its task
(`task`), the keyword arguments of the task's dataset (`rg_config`) and the item's index (`rg_index`). The
reward rebuilds that entry with the package (cached) and returns `dataset.score_answer(answer, entry)`,
the number the package itself gives the answer, partial credits included (e.g. a task's credit for an
answer that contains the oracle answer among other text: len(oracle) / len(answer), always below the 1
of the answer alone).

Extraction (`extract`):
  "answer_tag" (default): the text between the last `</answer>` and the last `<answer>` before it,
    stripped; no such pair -> None, which every task scores 0. Only that one block counts, so several
    candidate answers in several blocks earn what the last one earns, and an answer outside the tags
    earns nothing. The same text as the package's own extraction (`reasoning_gym.utils.extract_answer`)
    wherever answer blocks do not nest, but found with two `rfind`s: linear in the completion's length
    (the package's lazy regex takes quadratic time on a completion of many unclosed `<answer>` tags).
  "whole": the whole completion, stripped (a model trained to answer with the answer alone, such as the
    built-in tiny one).
A format reward (`format` with the pattern of your tags) can be added beside it in reward.functions.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

from jaxrl_llm.data import reasoning_gym as rg_data
from jaxrl_llm.rewards.registry import RewardFn, RewardScores, register_reward

EXTRACTIONS = ("answer_tag", "whole")
OPEN_TAG, CLOSE_TAG = "<answer>", "</answer>"


def extract_tagged(completion: str) -> str | None:
    """The stripped text of the last complete `<answer>...</answer>` block (see the module docstring)."""
    end = completion.rfind(CLOSE_TAG)
    if end < 0:
        return None
    start = completion.rfind(OPEN_TAG, 0, end)
    if start < 0:
        return None
    return completion[start + len(OPEN_TAG):end].strip()


def extract(completion: str, how: str = "answer_tag") -> str | None:
    """The answer `score_answer` is given for `completion` under extraction `how`."""
    return extract_tagged(completion) if how == "answer_tag" else completion.strip()


@functools.lru_cache(maxsize=64)
def _dataset(task: str, config_json: str):
    return rg_data.rebuild_dataset(task, config_json)


@functools.lru_cache(maxsize=1 << 16)
def _entry(task: str, config_json: str, index: int):
    return _dataset(task, config_json)[index]


def score(completion: str, task: str, config_json: str, index: int, how: str = "answer_tag") -> float:
    """The reward of one completion: the task's `score_answer` on its extracted answer."""
    entry = _entry(task, config_json, int(index))
    return float(_dataset(task, config_json).score_answer(extract(completion, how), entry))


@register_reward("reasoning_gym", factory=True)
def reasoning_gym_reward(extract: str = "answer_tag", tasks: Sequence[str] = ()) -> RewardFn:
    """Returns `reward(completions, task, rg_config, rg_index) -> RewardScores` (see the module docstring).

    extract: "answer_tag" (the last <answer>...</answer> block) or "whole" (the stripped completion).
    tasks: the run's tasks (the trainer passes data.reasoning_gym's): the metrics `sum_<task>` and
      `rows_<task>` (reward/reasoning_gym/...) of every one of them on every call, the sum of its rows'
      scores and their count (0 and 0 for a task the batch lacks: every process reports the same names),
      from which the trainer's curriculum reads each task's mean; without `tasks`, those of the rows' tasks.
    """
    if extract not in EXTRACTIONS:
        raise ValueError(f"reasoning_gym extract must be one of {EXTRACTIONS}, got {extract!r}")
    how, names = extract, tuple(tasks)

    def reward(completions: Sequence[str], task: Sequence[str], rg_config: Sequence[str], rg_index: Sequence[int],
               **_) -> RewardScores:
        scores = [score(c, t, j, i, how) for c, t, j, i in zip(completions, task, rg_config, rg_index)]
        metrics = {}
        for name in names or sorted(set(task)):
            mine = [s for s, t in zip(scores, task) if t == name]
            metrics[f"sum_{name}"], metrics[f"rows_{name}"] = float(sum(mine)), float(len(mine))
        return RewardScores(scores, metrics=metrics)

    reward.__name__ = "reasoning_gym"
    return reward
