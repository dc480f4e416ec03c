"""GKD's supervised rows (distill.lmbda < 1; docs/algorithms/distillation.md): in each rollout batch a
fixed fraction λ of the prompts keeps the student's samples (on-policy), and the G rows of every other
prompt carry that prompt's completion from `data.completion_column` instead (supervised). TRL's GKDTrainer
draws on-policy or not once per batch with probability λ; here the choice is per prompt with exactly
round(λ·B) prompts on-policy in every batch, which has the same expectation without the batch-to-batch
swing, and which prompts is drawn from the step's rollout key (deterministic given the seed).

A supervised row has no sampler log-probs (they are 0): it trains the gkd divergence only, never the
surrogate, the KL or entropy terms, and stays out of the rollout correction (rl/objective.py, `supervised`).

Shapes: B prompts of this process, G rows each, T = rollout.max_new_tokens completion tokens.
"""
from __future__ import annotations

import jax
import numpy as np


def on_policy_count(lmbda: float, prompts: int) -> int:
    """How many of a batch's `prompts` are on-policy: round(λ·B), half away from zero."""
    return int(np.floor(lmbda * prompts + 0.5))


def supervised_prompts(key, lmbda: float, prompts: int) -> np.ndarray:
    """(B,) bool: True for the prompts whose rows are supervised, B − round(λ·B) of them, chosen by a
    permutation drawn from `key` (a step's rollout key)."""
    order = np.asarray(jax.random.permutation(jax.random.fold_in(key, 0x5d), prompts))
    out = np.zeros(prompts, bool)
    out[order[on_policy_count(lmbda, prompts):]] = True
    return out


def encode_completions(tokenizer, texts, T: int, eos_id: int, pad_id: int) -> dict[str, np.ndarray]:
    """The completions' rows as the sampler would give them: the text encoded alone (no special tokens),
    then EOS when it fits in T (else the row is truncated). Returns tokens (n,T) int32 (pad_id after the
    end), mask (n,T) int32, lengths (n,) int32, truncated (n,) bool."""
    n = len(texts)
    tokens, mask = np.full((n, T), pad_id, np.int32), np.zeros((n, T), np.int32)
    lengths, truncated = np.zeros(n, np.int32), np.zeros(n, bool)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"data.completion_column holds a {type(text).__name__} on a row of this batch; "
                             "expected the completion as text")
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        truncated[i] = len(ids) >= T
        ids = ids[:T] if truncated[i] else ids + [eos_id]
        tokens[i, :len(ids)], mask[i, :len(ids)], lengths[i] = ids, 1, len(ids)
    return {"tokens": tokens, "mask": mask, "lengths": lengths, "truncated": truncated}


def mix_rows(local: dict, supervised: np.ndarray, rows: dict, group_size: int) -> dict:
    """`local` (the sampler's rows; None when nothing was sampled) with the rows of supervised prompts
    replaced by `rows` (encode_completions of the B prompts' completions, each repeated over its group),
    the sampler's log-probs 0 there, and `supervised` (N,) float32 1/0 added."""
    row_sup = np.repeat(supervised, group_size)
    rep = {k: np.repeat(v, group_size, axis=0) for k, v in rows.items()}
    if local is None:
        local = {**rep, "sampler_logp": np.zeros(rep["mask"].shape, np.float32)}
        local["behavior_logp"] = local["sampler_logp"].copy()
    else:
        local = dict(local)
        for k, v in rep.items():
            local[k] = np.where(row_sup.reshape(-1, *[1] * (v.ndim - 1)), v, local[k]).astype(local[k].dtype)
        for k in ("sampler_logp", "behavior_logp"):
            local[k] = np.where(row_sup[:, None], 0.0, local[k]).astype(np.float32)
    local["supervised"] = row_sup.astype(np.float32)
    return local
