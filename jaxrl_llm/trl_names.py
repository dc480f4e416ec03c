"""TRL's `GRPOConfig` / `GRPOTrainer` names and the fields of ours that do the same, for the "did you mean"
of an unknown config field (`--config.rollout.num_generations` -> `rollout.group_size`).

Mirrors the TRL table of docs/coming_from_trl.md (tests/test_docs_trl.py holds the two equal): that
table is the reference, with the notes on units and semantics; this one only names the fields.
"""
from __future__ import annotations

# TRL name -> our field(s); the first is the one to set, the others go with it.
TRL_FIELDS: dict[str, tuple[str, ...]] = {
    "num_generations": ("rollout.group_size",),
    "per_device_train_batch_size": ("rollout.batch_prompts",),
    "generation_batch_size": ("rollout.batch_prompts",),
    "gradient_accumulation_steps": ("train.grad_accum",),
    "steps_per_generation": ("train.minibatches",),
    "num_iterations": ("train.epochs",),
    "beta": ("kl.coef",),
    "epsilon": ("loss.clip_low", "loss.clip_high"),
    "epsilon_high": ("loss.clip_high",),
    "delta": ("loss.dual_clip",),
    "loss_type": ("loss.aggregate",),
    "scale_rewards": ("advantage.scale",),
    "importance_sampling_level": ("loss.ratio",),
    "mask_truncated_completions": ("dapo.mask_truncated",),
    "max_completion_length": ("rollout.max_new_tokens",),
    "max_prompt_length": ("data.max_prompt_length",),
    "temperature": ("rollout.temperature",),
    "top_p": ("rollout.top_p",),
    "top_k": ("rollout.top_k",),
    "learning_rate": ("optimizer.learning_rate",),
    "lr_scheduler_type": ("optimizer.schedule",),
    "warmup_steps": ("optimizer.warmup_steps",),
    "weight_decay": ("optimizer.weight_decay",),
    "adam_beta1": ("optimizer.b1",),
    "adam_beta2": ("optimizer.b2",),
    "adam_epsilon": ("optimizer.eps",),
    "max_grad_norm": ("optimizer.max_grad_norm",),
    "max_steps": ("total_steps",),
    "num_train_epochs": ("data.num_epochs",),
    "save_steps": ("checkpoint.every_steps",),
    "save_total_limit": ("checkpoint.max_to_keep",),
    "eval_steps": ("eval.every_steps",),
    "log_completions": ("log.samples_every",),
    "num_completions_to_print": ("log.num_samples",),
    "reward_weights": ("reward.weights",),
    "reward_funcs": ("reward.functions",),
    "ref_model_sync_steps": ("ref.refresh_every",),
    "ref_model_mixup_alpha": ("ref.mix_alpha",),
    "vllm_importance_sampling_cap": ("correction.cap",),
    "gradient_checkpointing": ("model.remat",),
    "lmbda": ("distill.lmbda", "data.completion_column"),  # GKDConfig's
    "seq_kd": ("distill.seq_kd",),
}


def trl_hint(key: str) -> str:
    """'' or "; did you mean <ours>? (TRL's <key> ...)" for the last component of an unknown field's path."""
    fields = TRL_FIELDS.get(key)
    if not fields:
        return ""
    also = f" and {', '.join(fields[1:])}" if len(fields) > 1 else ""
    return f"; did you mean {fields[0]}{also}? (TRL's {key}; docs/coming_from_trl.md maps TRL's fields)"
