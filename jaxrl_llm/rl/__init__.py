"""RL objectives as pure, jit-able JAX functions: advantages, policy/value losses, KL control, and the
`Objective` that bundles a run's choices of them.

This package imports no other package of jaxrl_llm. See docs/algorithms/ for which options select PPO,
GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++, GSPO, GSPO-token, SAPO and CISPO.
"""
from jaxrl_llm.rl.aggregation import AGGREGATE_MODES, aggregate, aggregate_denominator, aggregate_parts, aggregate_sum
from jaxrl_llm.rl.advantages import (
    ADVANTAGE_SCALES,
    adaptive_lam,
    gae,
    group_advantages,
    group_process_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    token_rewards,
    whiten,
)
from jaxrl_llm.rl.correction import CORRECTION_MODES, MASK_MODES, correction_bounds, rollout_correction
from jaxrl_llm.rl.distill import DISTILL_KINDS, generalized_jsd, opd_advantages
from jaxrl_llm.rl.kl_control import AdaptiveKLController, FixedKLController
from jaxrl_llm.rl.losses import KL_KINDS, RATIOS, SURROGATES, kl_penalty, policy_loss, value_loss
from jaxrl_llm.rl.objective import ESTIMATORS, KL_PLACEMENTS, Estimator, Objective, register_estimator

__all__ = [
    "ADVANTAGE_SCALES",
    "AGGREGATE_MODES",
    "CORRECTION_MODES",
    "DISTILL_KINDS",
    "MASK_MODES",
    "ESTIMATORS",
    "KL_KINDS",
    "KL_PLACEMENTS",
    "RATIOS",
    "SURROGATES",
    "AdaptiveKLController",
    "Estimator",
    "FixedKLController",
    "Objective",
    "adaptive_lam",
    "aggregate",
    "aggregate_denominator",
    "aggregate_parts",
    "aggregate_sum",
    "correction_bounds",
    "gae",
    "generalized_jsd",
    "group_advantages",
    "group_process_advantages",
    "kl_penalty",
    "opd_advantages",
    "policy_loss",
    "register_estimator",
    "reinforce_pp_advantages",
    "rollout_correction",
    "rloo_advantages",
    "token_rewards",
    "value_loss",
    "whiten",
]
