"""Prompt data: tokenizers, dataset loading and prompt building, batching, left padding.

See docs/data.md. The built-in synthetic tasks live in `jaxrl_llm.data.tasks`.
"""

from jaxrl_llm.data.iterator import GLOBAL_MAX_PROMPT_LENGTH, PromptIterator, iterator_from_config
from jaxrl_llm.data.loading import (
    PROMPT_IDS,
    PROMPT_TEXT,
    PROMPT_USER,
    default_data_config,
    load_prompt_dataset,
    load_raw_dataset,
    prepare_prompts,
    validate_data_config,
)
from jaxrl_llm.data.padding import bucket_length, left_pad, pad_prompt_batch, prompt_buckets
from jaxrl_llm.data.tokenizer import builtin_tokenizer, has_chat_template, load_tokenizer

__all__ = [
    "GLOBAL_MAX_PROMPT_LENGTH",
    "PROMPT_IDS",
    "PROMPT_TEXT",
    "PROMPT_USER",
    "PromptIterator",
    "bucket_length",
    "builtin_tokenizer",
    "default_data_config",
    "has_chat_template",
    "iterator_from_config",
    "left_pad",
    "load_prompt_dataset",
    "load_raw_dataset",
    "load_tokenizer",
    "pad_prompt_batch",
    "prepare_prompts",
    "prompt_buckets",
    "validate_data_config",
]
