"""The reward check at start-up: once the dataset is read and before anything is loaded or compiled, every
reward function of the run is called on probe completions of a few dataset rows (rewards/self_test.py),
through the rollout's own input building (the dataset's columns, the trainer fields, the completions
decoded from token ids). A broken contract (a raise, a return that is not N values, a non-finite value)
is training's one-line RewardError in seconds; a probe paid like a correct answer is a warning, or an
error with `reward.self_test=error`. `off` calls no reward before the first rollout (rewards with side
effects or a cost per call): the first rollout then meets a broken contract, as it did before.
"""
from __future__ import annotations

import functools
import logging
import time

import numpy as np

from jaxrl_llm import distributed as dist
from jaxrl_llm.data.config import PROMPT_USER
from jaxrl_llm.rewards.self_test import (OVERLONG_FACTOR, SelfTestReport, build_probes, enforce, reference_text,
                                         run_self_test)

log = logging.getLogger(__name__)

PROBE_ROWS = 4  # dataset rows probed, spread evenly over the dataset


def check_rewards(c, rollouts, dataset) -> SelfTestReport | None:
    """Runs the check for `rollouts.reward_fns` on rows of the prepared prompt `dataset`; prints the table
    (process 0) and returns the report; None (nothing called) with `reward.self_test=off` or without
    reward functions."""
    if not rollouts.reward_fns or c.reward.self_test == "off":
        return None
    t0 = time.perf_counter()
    picks = sorted({int(i) for i in np.linspace(0, len(dataset) - 1, min(PROBE_ROWS, len(dataset))).round()})
    rows = dataset[picks]
    answer = c.data.answer_column
    refs = [reference_text(v) for v in rows[answer]] if answer and answer in rows else [None] * len(picks)
    count = lambda s: len(rollouts.tokenizer(s, add_special_tokens=False)["input_ids"])
    budget = OVERLONG_FACTOR * c.rollout.max_new_tokens
    probes = [build_probes(p, r, budget, count) for p, r in zip(rows[PROMPT_USER], refs)]
    report = run_self_test(rollouts.reward_fns, probes, functools.partial(_inputs, rollouts, dataset, picks),
                           on_error=c.reward.on_error)
    report.total_s = time.perf_counter() - t0  # the probes' tokenization included
    if dist.is_main():
        turn = "\n(env.name: each probe stands for an episode's last model turn, what the reward functions score)"
        print(f"{report.format()}{turn if c.env.name else ''}\n(the start-up reward check took "
              f"{report.total_s:.3f} s)", flush=True)
    enforce(report, c.reward.self_test)
    return report


def _inputs(rollouts, dataset, picks, texts, rows, truncated):
    """(prompts, completions, columns) of the probe `texts` as a rollout gives them to the rewards: each
    text tokenized (+ EOS unless truncated) and decoded back, beside its dataset row's columns."""
    ids = rollouts.tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    ids = [list(x) + ([] if cut else [rollouts.eos_ids[0]]) for x, cut in zip(ids, truncated)]
    lengths = np.array([len(x) for x in ids], np.int32)
    tokens = np.full((len(ids), max(1, int(lengths.max(initial=0)))), rollouts.pad_id, np.int32)
    for i, x in enumerate(ids):
        tokens[i, :len(x)] = x
    local = {"tokens": tokens, "lengths": lengths, "truncated": np.asarray(truncated, bool)}
    batch = dataset[[picks[r] for r in rows]]
    prompts, columns = rollouts.reward_inputs(batch, local, 0, repeat=1)
    return prompts, rollouts.completions(local), columns
