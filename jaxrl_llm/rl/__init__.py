"""RL objectives as pure, jit-able JAX functions: advantages, policy/value losses, KL control.

See docs/algorithms/ for which options select PPO, GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++, GSPO,
GSPO-token, SAPO and CISPO.
"""
from jaxrl_llm.rl.advantages import (
    adaptive_lam,
    gae,
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    token_rewards,
    whiten,
)
from jaxrl_llm.rl.kl_control import AdaptiveKLController, FixedKLController
from jaxrl_llm.rl.losses import (
    AGGREGATE_MODES,
    KL_KINDS,
    RATIOS,
    SURROGATES,
    aggregate,
    aggregate_denominator,
    aggregate_parts,
    aggregate_sum,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    value_loss,
)

__all__ = [
    "AGGREGATE_MODES",
    "KL_KINDS",
    "RATIOS",
    "SURROGATES",
    "AdaptiveKLController",
    "FixedKLController",
    "adaptive_lam",
    "aggregate",
    "aggregate_denominator",
    "aggregate_parts",
    "aggregate_sum",
    "entropy_from_logits",
    "gae",
    "group_advantages",
    "kl_penalty",
    "policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "token_rewards",
    "value_loss",
    "whiten",
]
