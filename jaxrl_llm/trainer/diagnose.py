"""What went wrong with a step, in words the log and the errors use: why an update was empty (no loss
token: nothing to learn from, never a NaN) and the likeliest causes of non-finite updates.

Both read only a step's metrics row (the names of docs/design.md) and the config.
"""
from __future__ import annotations

import math

# Above these, a reward's scale or a learning rate is named as a likely cause of NaN/inf updates.
_LARGE_REWARD = 100.0
_HIGH_LR = 1e-4


def empty_cause(c, m: dict[str, float]) -> str:
    """Why the step's updates had no loss token (`train/empty_updates` > 0), from its metrics row."""
    if c.dapo.dynamic_sampling and m.get("dapo/kept_groups", 1.0) == 0.0:
        return (f"DAPO's dynamic sampling kept no group in {int(m.get('dapo/sample_rounds', 0))} round(s) "
                f"(dapo.max_sample_rounds={c.dapo.max_sample_rounds}): every group's rewards were equal "
                f"(dapo.filter_on), e.g. all wrong on a hard task; the step trains on nothing and is skipped")
    if c.dapo.mask_truncated and m.get("response_length/clip_ratio", 0.0) == 1.0:
        return (f"every completion was truncated at rollout.max_new_tokens={c.rollout.max_new_tokens} and "
                f"dapo.mask_truncated=True masks truncated completions out of the loss")
    if m.get("correction/kept_frac", 1.0) == 0.0:
        return f"the rollout correction (correction.mode={c.correction.mode}) rejected every token"
    return "no row of the minibatch had a loss token (masked rows, DAPO's filler groups or truncations)"


def nonfinite_causes(c, m: dict[str, float]) -> str:
    """The likeliest causes of NaN/inf updates that the last metrics row shows, as one clause."""
    causes = []
    mean, std = m.get("reward/mean", 0.0), m.get("reward/std", 0.0)
    if not (math.isfinite(mean) and math.isfinite(std)):
        causes.append("the rewards themselves are NaN/inf (reward/mean, reward/<fn>/mean)")
    elif max(abs(mean), std) > _LARGE_REWARD:
        causes.append(f"a reward's scale (reward/mean {mean:.3g}, reward/std {std:.3g}: scale it towards [0, 1] "
                      f"or lower reward.weights, advantage.scale={c.advantage.scale})")
    lr = c.optimizer.learning_rate
    if lr > _HIGH_LR:
        causes.append(f"a high learning rate (optimizer.learning_rate={lr:g})")
    if c.model.compute_dtype == "float16":
        causes.append("float16 compute (model.compute_dtype=float16 overflows easily; bfloat16 does not)")
    if not causes:
        causes.append(f"the rewards' scale (reward/std {std:.3g}) or the learning rate "
                      f"(optimizer.learning_rate={lr:g}); policy/grad_norm and policy/ratio_max show which step "
                      "diverged")
    return "likely causes: " + "; ".join(causes)
