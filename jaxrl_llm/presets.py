"""Algorithm presets: the defaults each `algo` gives the fields it decides (the schema's placeholders).

`jaxrl_llm.config.resolve` fills every such field still unset from `preset_defaults(algo, max_staleness)`
(`_COMMON`, then `PRESETS[algo]`, then `ASYNC_DEFAULTS` under asynchronous sampling), so an explicit
setting always wins. docs/algorithms/ gives the reasons and the papers.
"""

_COMMON = {
    "loss.ratio": "token", "loss.surrogate": "clip", "loss.clip_low": 0.2, "loss.clip_high": 0.2,
    "loss.dual_clip": 0.0, "loss.aggregate": "seq-mean-token-mean", "loss.norm_length": 0,
    "advantage.estimator": "group", "advantage.scale": "group", "advantage.whiten": False,
    "kl.coef": 0.0, "kl.estimator": "k3", "kl.placement": "loss", "kl.adaptive": False,
    "entropy_coef": 0.0, "dapo.dynamic_sampling": False, "dapo.overlong_buffer": 0,
    "dapo.mask_truncated": False, "value.enabled": False, "rollout.recompute_logprobs": False,
    "correction.mode": "none", "distill.kind": "opd",
}

# With rollout.max_staleness >= 1, on top of the preset (an explicit setting still wins): the proximal
# policy is recomputed by the trainer (the behaviour one is up to k updates old), and the gap between
# them is corrected by truncated importance sampling (cap 2), which keeps every token; see
# docs/algorithms/async.md.
ASYNC_DEFAULTS = {"rollout.recompute_logprobs": True, "correction.mode": "token_truncate"}

# Defaults per algorithm, on top of _COMMON.
PRESETS = {
    "ppo": {"advantage.estimator": "gae", "advantage.whiten": True, "loss.aggregate": "token-mean",
            "kl.coef": 0.05, "kl.estimator": "k1", "kl.placement": "reward", "value.enabled": True},
    "grpo": {"kl.coef": 0.04},
    "dr_grpo": {"advantage.scale": "none", "loss.aggregate": "seq-mean-token-sum-norm"},
    "dapo": {"loss.clip_high": 0.28, "loss.aggregate": "token-mean", "dapo.dynamic_sampling": True,
             "dapo.overlong_buffer": -1},  # -1: a quarter of max_new_tokens
    # GSPO's band (1 ± 4e-4) is narrower than the sampler/trainer gap of a bfloat16 run: the proximal
    # log-probs are recomputed so that the first update's sequence ratios are exactly 1.
    "gspo": {"loss.ratio": "sequence", "loss.clip_low": 3e-4, "loss.clip_high": 4e-4, "rollout.recompute_logprobs": True},
    "gspo_token": {"loss.ratio": "sequence_token", "loss.clip_low": 3e-4, "loss.clip_high": 4e-4,
                   "rollout.recompute_logprobs": True},
    # SAPO's objective averages each sequence's gated token terms over its length, then over the group
    # (the GRPO/GSPO form its paper writes); docs/algorithms/sapo_cispo.md.
    "sapo": {"loss.surrogate": "sapo", "loss.aggregate": "seq-mean-token-mean"},
    "cispo": {"loss.surrogate": "cispo", "loss.aggregate": "token-mean"},
    "rloo": {"advantage.estimator": "rloo", "loss.aggregate": "token-mean"},
    "reinforce_pp": {"advantage.estimator": "reinforce_pp", "loss.aggregate": "token-mean", "kl.coef": 0.01,
                     "kl.estimator": "k1", "kl.placement": "reward"},
    # On-policy distillation alone (teacher.path required): no advantage from the rewards, the teacher's
    # per-token signal only, averaged over tokens as TRL's GKD does; docs/algorithms/distillation.md.
    "opd": {"advantage.estimator": "none", "loss.aggregate": "token-mean"},
    "gkd": {"advantage.estimator": "none", "loss.aggregate": "token-mean", "distill.kind": "gkd"},
}
ALGOS = tuple(PRESETS)


def preset_defaults(algo: str, max_staleness) -> dict[str, object]:
    """Field path -> default for `algo`: the common defaults, the algorithm's over them, and with
    `max_staleness` an int >= 1 the asynchronous ones over both. `algo` must be one of ALGOS."""
    stale = ASYNC_DEFAULTS if isinstance(max_staleness, int) and max_staleness > 0 else {}
    return {**_COMMON, **PRESETS[algo], **stale}
