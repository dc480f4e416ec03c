"""Prompt data: tokenizers, dataset loading and prompt building, batching, left padding.

See docs/data.md. The built-in synthetic tasks live in `jaxrl_llm.data.tasks`. Names are imported on
first use, so that `jaxrl_llm.data.config` (what configs need) loads without `datasets`/`transformers`.
"""

import importlib

_EXPORTS = {
    "GLOBAL_MAX_PROMPT_LENGTH": "config",
    "PromptIterator": "iterator",
    "iterator_from_config": "iterator",
    "PROMPT_IDS": "config",
    "PROMPT_TEXT": "config",
    "PROMPT_USER": "config",
    "reward_columns": "config",
    "default_data_config": "config",
    "validate_data_config": "config",
    "held_out_rows": "holdout",
    "split_held_out": "holdout",
    "load_prompt_dataset": "loading",
    "load_raw_dataset": "loading",
    "prepare_prompts": "loading",
    "bucket_length": "padding",
    "left_pad": "padding",
    "pad_prompt_batch": "padding",
    "prompt_buckets": "padding",
    "builtin_tokenizer": "tokenizer",
    "has_chat_template": "tokenizer",
    "load_tokenizer": "tokenizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"jaxrl_llm.data.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jaxrl_llm.data' has no attribute {name!r}")


def __dir__():
    return __all__
