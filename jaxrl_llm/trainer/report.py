"""What a step reports: its metrics (the names of docs/design.md), samples for the log, and its FLOPs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import distributed as dist
from jaxrl_llm import metrics as metrics_lib
from jaxrl_llm.rl.objective import on_policy


def update_metrics(step_metrics: list[dict], b: dict, kl_stats: dict, kl_coef, recompute: bool,
                   fresh: bool = True) -> dict[str, float]:
    """The updates' metrics combined over the step's minibatches, with the KL and sampler figures.
    fresh: the batch was sampled by the policy this step starts from (staleness 0: always, synchronous)."""
    m: dict[str, float] = {}
    for k in step_metrics[0]:
        vals = [float(x[k]) for x in step_metrics]
        m[k] = min(vals) if k.endswith("ratio_min") else max(vals) if k.endswith("max") else float(np.mean(vals))
    # Updates of this step skipped for a NaN/inf loss or gradient, and the consecutive ones so far
    # (the run stops when they reach train.max_nonfinite_steps).
    m["train/skipped_updates"] = float(sum(float(x["train/skipped_updates"]) for x in step_metrics))
    # Updates with no loss token (skipped, never counted as non-finite): their causes, `empty_cause`.
    m["train/empty_updates"] = float(sum(float(x["train/empty_updates"]) for x in step_metrics))
    m["train/nonfinite_streak"] = float(step_metrics[-1]["train/nonfinite_streak"])
    # Sampler drift: the sampler's log-probs against the trainer's forward of the *same* (behaviour)
    # policy. Without recomputation, the first update's: before it the policy is the sampler's. With it,
    # the recomputed proximal log-probs, which are the behaviour's only on a fresh batch; a stale one
    # (rollout.max_staleness >= 1) has no exact behaviour recomputation and reports none (its
    # proximal-behaviour gap is `staleness_gap`'s).
    m.pop("sampler/logp_diff_max")
    if not recompute:
        m["sampler/logp_diff_max"] = float(step_metrics[0]["sampler/logp_diff_max"])
    elif fresh:
        valid = (b["mask"] > 0) & (b["seen_rows"][:, None] > 0)  # rows without loss tokens may be unscored
        m["sampler/logp_diff_max"] = float(jnp.max(jnp.where(valid, jnp.abs(b["old_logp"] - b["sampler_logp"]), 0)))
    m.update({k: float(v) for k, v in jax.device_get(kl_stats).items() if k != "kl/seq_sum"})
    m["kl/coef"] = float(kl_coef)
    return m


def staleness_gap(b: dict) -> dict[str, float]:
    """`rollout/staleness/logp_gap`: max over the loss tokens of |proximal − behaviour| log-probs, the
    recomputed `old_logp` against the sampler's `sampler_logp` (full-distribution log-probs, as the
    proximal ones: no top-k/top-p); the policy's move over the batch's staleness, plus the sampler drift
    that `sampler/logp_diff_max` bounds. 0 on a batch without loss tokens. GKD's supervised rows have
    no sampler log-probs: not counted."""
    gap = jnp.where(on_policy(b, b["loss_mask"]) > 0, jnp.abs(b["old_logp"] - b["sampler_logp"]), 0.0)
    return {"rollout/staleness/logp_gap": float(jnp.max(gap))}


def rollout_metrics(first: dict, info: dict, G: int, dynamic_sampling: bool) -> dict[str, float]:
    """Rewards and lengths of the step's first sampling round, over every process's rows: the policy's
    rows; GKD's supervised rows (the dataset's completions, `first["supervised"]`) apart, in
    `reward/supervised_mean` (and in the others only when no row was sampled, λ = 0)."""
    scores = dist.allgather_rows(first["scores"])
    lengths = dist.allgather_rows(first["lengths"]).astype(np.float64)
    truncated = dist.allgather_rows(first["truncated"])
    extra = {}
    if "supervised" in first:
        sup = dist.allgather_rows(first["supervised"]) > 0
        extra["reward/supervised_mean"] = float(scores[sup].mean()) if sup.any() else 0.0
        if not sup.all():  # whole groups are supervised, so the groups of the rest stay whole
            scores, lengths, truncated = scores[~sup], lengths[~sup], truncated[~sup]
    groups = scores.reshape(-1, G)
    m = {**extra, "reward/mean": float(scores.mean()), "reward/std": float(scores.std()),
         "reward/frac_zero_std": float(np.mean(groups.std(axis=1) == 0)) if G > 1 else 0.0,
         "response_length/mean": float(lengths.mean()), "response_length/max": float(lengths.max()),
         "response_length/min": float(lengths.min()), "response_length/clip_ratio": float(truncated.mean())}
    for k, v in info["reward_metrics"].items():
        m[k] = float(np.mean(dist.allgather_rows(np.array([v]))))
    if dynamic_sampling:
        m["dapo/sample_rounds"] = float(info["rounds"])
        m["dapo/kept_groups"] = float(info["kept_groups"])
    return m


def data_metrics(data, stats: dict[str, int]) -> dict[str, float]:
    """Where the run is in its prompts, after this step's batches: `data/epoch` (epochs served, fractional),
    `data/rows_seen` (prompt rows drawn so far, DAPO's extra rounds included), `data/rows_skipped_per_epoch`
    (the remainder of each epoch that no full batch takes), and the dataset's counts from loading
    (`data/rows_loaded`, `data/rows`, `data/dropped_too_long`, `data/truncated`, `data/prompt_length_max`)."""
    return {"data/epoch": data.rows_served / data.rows_per_epoch, "data/rows_seen": float(data.rows_served),
            "data/rows_skipped_per_epoch": float(stats["data/rows"] - data.rows_per_epoch),
            **{k: float(v) for k, v in stats.items()}}


def perf_metrics(c, info: dict, P: int, step_s: float, update_s: float, flops: float, peak: float) -> dict[str, float]:
    """Throughput of the step: sampled tokens/s, update tokens/s, model FLOPs utilization."""
    N = c.rollout.batch_prompts * c.rollout.group_size
    gen_tokens = float(np.sum(dist.allgather_rows(np.array([info["gen_tokens"]]))))
    update_tokens = c.train.epochs * (c.rollout.batch_prompts * P + N * c.rollout.max_new_tokens)
    return {"perf/step_s": step_s, "perf/sample_tokens_per_s": gen_tokens / max(info["sample_s"], 1e-9),
            "perf/update_tokens_per_s": update_tokens / max(update_s, 1e-9),
            "perf/mfu": flops / step_s / (peak * jax.device_count())}


def step_flops(c, mc, P: int, uses_ref: bool) -> float:
    """FLOPs of one step: sampling + reference/value forwards + forward+backward of every update."""
    B, G, T = c.rollout.batch_prompts, c.rollout.group_size, c.rollout.max_new_tokens
    prompt = B * metrics_lib.flops_per_token(mc, P / 2, lm_head=False)
    completion = B * G * T * metrics_lib.flops_per_token(mc, P + T / 2)
    sample = prompt + completion
    forwards = (int(uses_ref) + int(c.rollout.recompute_logprobs) + int(c.value.enabled)) * (prompt + completion)
    train = 3 * c.train.epochs * (prompt + completion) * (2 if c.value.enabled else 1)
    return sample + forwards + train


def sample_rows(num_rows: int, G: int, n: int) -> list[int]:
    """Which `n` of the step's rows to log: the first completion of each prompt, then the second, ... so
    that the samples cover min(n, B) prompts rather than one prompt's group (rows b*G + g)."""
    B = num_rows // G
    return [b * G + g for g in range(G) for b in range(B)][:n]


def samples(info: dict, first: dict, n: int, G: int) -> list[dict]:
    """`n` rows of the step's first sampling round for samples.jsonl, from several prompts: prompt,
    completion, the reference answer (with an answer column), the total reward and each reward
    function's weighted part of it (which sum to the total)."""
    components, references = info["rewards"].components, info["references"]
    out = []
    for i in sample_rows(len(info["prompts"]), G, n):
        row = {"prompt": info["prompts"][i], "completion": info["completions"][i]}
        if references is not None:
            row["reference"] = references[i]
        row["reward"] = float(first["scores"][i])
        row["rewards"] = {name: float(v[i]) for name, v in components.items()}
        out.append(row)
    return out
