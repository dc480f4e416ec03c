"""The `data` config section: its fields, defaults and validation (light: no datasets/transformers import,
so that reading and checking a config costs no heavy import)."""

from __future__ import annotations

from typing import Any

import ml_collections

from jaxrl_llm.data import prompts as prompts_lib

PROMPT_TEXT = "prompt_text"
PROMPT_IDS = "prompt_ids"
PROMPT_USER = "prompt_user"  # the user's prompt before any chat template (what reward models should see)
_RESERVED = (PROMPT_TEXT, PROMPT_IDS, PROMPT_USER)
# The longest prompt of the whole global batch (a batch key), so that every host pads to the same bucket.
GLOBAL_MAX_PROMPT_LENGTH = "global_max_prompt_length"
# What reward functions never receive as a column: token ids, the internal user prompt (they get it as
# `prompts`) and the batch's padding length. Every other column reaches them, in training and evaluation.
NOT_REWARD_COLUMNS = (PROMPT_IDS, PROMPT_USER, GLOBAL_MAX_PROMPT_LENGTH)


def reward_columns(names) -> list[str]:
    """The column names of a prompt dataset or batch that reward functions receive."""
    return [n for n in names if n not in NOT_REWARD_COLUMNS]


def default_data_config() -> ml_collections.ConfigDict:
    """The `data` config section with its defaults (GSM8K-style: question -> answer)."""
    c = ml_collections.ConfigDict()
    c.path = ""  # hub dataset name, or a local .json/.jsonl/.parquet/.csv file or directory
    c.name = ""  # hub subset (config) name, e.g. "main" for gsm8k; "" for none
    c.split = "train"  # split to load; slicing works ("train[:1000]"); a local file is split "train"
    c.cache_dir = ""  # `datasets` cache directory; "" for its default (~/.cache/huggingface)
    c.prompt_column = "question"  # column holding the prompt (text or a list of chat messages)
    c.prompt_template = ""  # format string over the row's columns, e.g. "Q: {question}\nA:"; wins over prompt_column
    c.answer_column = "answer"  # the reference answer: required, in samples.jsonl, eval's maj@k; "" for none
    c.completion_column = ""  # gkd with distill.lmbda < 1: the supervised rows' completions (text); "" for none
    c.extra_columns = ()  # further columns that must be present, e.g. ("tests",); every column reaches the rewards
    c.system_prompt = ""  # system message (chat template), or a first paragraph of raw prompts
    c.use_chat_template = ml_collections.FieldReference("auto", field_type=object)  # 'auto' | True | False
    c.max_prompt_length = 512  # longest prompt in tokens; also the largest padding bucket
    c.max_prompt_length_policy = "drop"  # longer prompts: 'drop' | 'truncate_left' | 'error'
    c.shuffle_seed = 0  # epoch e is permutation (shuffle_seed, e) of the rows
    c.num_epochs = 0  # passes over the data before the iterator stops; 0 for unlimited
    return c


def _check_type(config, field: str, types, expected: str):
    value = config[field]
    # bool is an int subclass, but True is no prompt length.
    if isinstance(value, bool) or not isinstance(value, types):
        raise ValueError(f"data.{field} must be {expected}, got {value!r}")
    return value


def use_chat_template_flag(value: Any) -> str | bool:
    """Normalizes `data.use_chat_template`: 'auto', True or False (strings 'true'/'false' accepted)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("auto", "true", "false"):
        return {"auto": "auto", "true": True, "false": False}[value.lower()]
    raise ValueError(f"data.use_chat_template must be 'auto', True or False, got {value!r}")


def validate_data_config(config) -> None:
    """Checks every field of a `data` section; a one-line ValueError naming the first bad field."""
    missing = [f for f in default_data_config().keys() if f not in config]
    if missing:
        raise ValueError(f"data config lacks fields {missing}; start from default_data_config()")
    for field in ("path", "name", "split", "cache_dir", "prompt_column", "prompt_template", "answer_column",
                  "completion_column", "system_prompt"):
        _check_type(config, field, str, "a string")
    if not config.split:
        raise ValueError("data.split must name a split, e.g. 'train'")
    if not config.prompt_column and not config.prompt_template:
        raise ValueError("data.prompt_column and data.prompt_template are both empty; set one")
    if config.prompt_template:
        prompts_lib.template_fields(config.prompt_template)
    extra = _check_type(config, "extra_columns", (tuple, list), "a tuple of column names")
    if not all(isinstance(c, str) and c for c in extra):
        raise ValueError(f"data.extra_columns must hold non-empty column names, got {tuple(extra)!r}")
    passthrough = ([config.answer_column] if config.answer_column else []) + list(extra)
    if len(set(passthrough)) != len(passthrough):
        raise ValueError(f"data.answer_column and data.extra_columns repeat a column: {passthrough}")
    clash = [c for c in passthrough if c in _RESERVED]
    if clash:
        raise ValueError(
            f"data.answer_column/extra_columns may not use the reserved names {list(_RESERVED)}, got {clash}"
        )
    use_chat_template_flag(config.use_chat_template)
    if _check_type(config, "max_prompt_length", int, "a positive int") <= 0:
        raise ValueError(f"data.max_prompt_length must be a positive int, got {config.max_prompt_length}")
    if config.max_prompt_length_policy not in prompts_lib.LENGTH_POLICIES:
        raise ValueError(
            f"data.max_prompt_length_policy must be one of {list(prompts_lib.LENGTH_POLICIES)}, "
            f"got {config.max_prompt_length_policy!r}"
        )
    if _check_type(config, "shuffle_seed", int, "a non-negative int") < 0:
        raise ValueError(f"data.shuffle_seed must be a non-negative int, got {config.shuffle_seed}")
    if _check_type(config, "num_epochs", int, "a non-negative int") < 0:
        raise ValueError(f"data.num_epochs must be >= 0 (0 for unlimited), got {config.num_epochs}")


# ----------------------------------------------------------------------------------------------------
# Loading.
