"""Rewards: the registry, the weighted combination and the built-in reward functions.

A reward is a function returning one `float | None` per row, called by keyword with the inputs it
declares (`prompts`, `completions`, trainer fields, dataset columns; `calling`); see `registry` for the
contract and docs/rewards.md for a guide. Importing this package registers the built-ins:
`math_answer`, `format`, `overlong`, `length_penalty`, `code_tests`, `digit_puzzles` (the reward of
the built-in task, `jaxrl_llm.rewards.tasks`) and `reasoning_gym` (a reasoning-gym task's own score,
`jaxrl_llm.rewards.reasoning_gym`); `reward_model` (a learned
reward model, `jaxrl_llm.rewards.model`) is imported on first use by name.
"""

from jaxrl_llm.rewards.code import (
    SandboxResult,
    code_tests,
    extract_code,
    parse_tests,
    run_code_tests,
    run_sandboxed,
    sandbox_layers,
)
from jaxrl_llm.rewards.calling import (TRAINER_FIELDS, TrainerState, UserReward, check_reward_parameters,
                                       generation_fields)
from jaxrl_llm.rewards.format import DEFAULT_FORMAT_PATTERN, format_reward
from jaxrl_llm.rewards.math import (
    extract_answer,
    math_answer,
    normalize_answer,
    parse_number,
    reference_answer,
    score_answer,
)
from jaxrl_llm.rewards.registry import (
    RewardError,
    RewardFn,
    RewardScores,
    RewardBatch,
    compute_rewards,
    get_reward_fn,
    score_rewards,
    register_reward,
    registered_rewards,
)
from jaxrl_llm.rewards.tasks import char_credit, digit_puzzle_reward
from jaxrl_llm.rewards.reasoning_gym import reasoning_gym_reward  # its package is imported on first call
from jaxrl_llm.rewards.shaping import (
    length_penalty,
    linear_length_penalty,
    overlong_penalty,
    overlong_reward,
)


def __getattr__(name: str):
    # `RewardModel` pulls in JAX and the model code: imported on first access only, so scoring with
    # verifiable rewards stays light.
    if name == "RewardModel":
        from jaxrl_llm.rewards.model import RewardModel

        return RewardModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RewardModel",
    "TRAINER_FIELDS",
    "TrainerState",
    "UserReward",
    "check_reward_parameters",
    "generation_fields",
    "DEFAULT_FORMAT_PATTERN",
    "RewardError",
    "RewardFn",
    "RewardScores",
    "SandboxResult",
    "char_credit",
    "code_tests",
    "digit_puzzle_reward",
    "reasoning_gym_reward",
    "RewardBatch",
    "compute_rewards",
    "score_rewards",
    "extract_answer",
    "extract_code",
    "format_reward",
    "get_reward_fn",
    "length_penalty",
    "linear_length_penalty",
    "math_answer",
    "normalize_answer",
    "overlong_penalty",
    "overlong_reward",
    "parse_number",
    "parse_tests",
    "reference_answer",
    "register_reward",
    "registered_rewards",
    "run_code_tests",
    "run_sandboxed",
    "sandbox_layers",
    "score_answer",
]
