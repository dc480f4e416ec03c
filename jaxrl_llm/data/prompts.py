"""Prompt building: dataset row -> user message -> prompt text (chat template or raw) -> token ids.

Pure functions of Python values and a tokenizer; `loading.py` maps them over a dataset in batches.

BOS rule. A chat template that wants BOS writes it itself (Llama, Gemma: `{{ bos_token }}`), so text
rendered by `apply_chat_template` is tokenized with `add_special_tokens=False`; tokenizing it with
special tokens would put a second BOS in front (Llama 3 with `add_bos_token`). A raw prompt (no chat
template) gets BOS in front exactly when the tokenizer itself prepends BOS to `encode(text)` (Llama
does, Qwen and GPT-2 do not), and never twice when the text already starts with it. Other tokens a
tokenizer may append when encoding with special tokens (an EOS after the text) are never added: a
prompt must end where generation starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import string
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import transformers

Messages = list[dict[str, str]]

LENGTH_POLICIES = ("drop", "truncate_left", "error")


def template_fields(template: str) -> list[str]:
    """Column names a `str.format` prompt template reads, e.g. "Q: {question}" -> ["question"].

    Raises ValueError (naming `data.prompt_template`) on malformed braces or positional fields.
    """
    fields = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"data.prompt_template {template!r} is not a valid format string: {e}") from None
    for _, field, _, _ in parsed:
        if field is None:
            continue
        # "{row[key]}" or "{row.attr}" read column "row".
        root = field.split(".", 1)[0].split("[", 1)[0]
        if root == "" or root.isdigit():
            raise ValueError(
                f"data.prompt_template {template!r} has a positional field {{{field}}}; "
                "name a column instead, e.g. {question}"
            )
        if root not in fields:
            fields.append(root)
    return fields


def is_messages(value: Any) -> bool:
    """Whether `value` is a conversation: a non-empty list of {"role", "content"} dicts."""
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) > 0
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value)
    )


def is_conversation(value: Any) -> bool:
    """Whether a prompt column's value is a conversation: a non-empty list of {"role", "content"} dicts."""
    return is_messages(value)


def user_prompt(row: Mapping[str, Any], *, prompt_column: str, prompt_template: str, index: int) -> str | Messages:
    """The user turn of one row: the template filled with the row's columns, else the prompt column.

    A prompt column may also hold a conversation (a list of {"role", "content"} dicts, the Hugging
    Face "conversational" format); it is returned as is. `index` only names the row in errors.
    """
    if prompt_template:
        try:
            return prompt_template.format(**row)
        except (KeyError, IndexError, AttributeError, ValueError, TypeError) as e:
            raise ValueError(f"data.prompt_template could not be filled from row {index}: {e!r}") from None
    value = row[prompt_column]
    if isinstance(value, str) or is_messages(value):
        return value
    raise ValueError(
        f"data.prompt_column {prompt_column!r} of row {index} holds {type(value).__name__}, "
        "expected a string or a list of {'role', 'content'} messages"
    )


def last_user_content(messages: Messages) -> str:
    """The text of the last user turn of a conversation ("" if it has none)."""
    users = [m["content"] for m in messages if m.get("role") == "user"]
    return users[-1] if users else ""


def to_messages(prompt: str | Messages, system_prompt: str) -> Messages:
    """Chat messages: [system (if given and the conversation has none), user or the conversation]."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    if system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system_prompt}] + messages
    return messages


def raw_prompt_text(prompt: str, system_prompt: str) -> str:
    """Prompt text without a chat template: the system prompt, a blank line, then the prompt."""
    return f"{system_prompt}\n\n{prompt}" if system_prompt else prompt


def chat_prompt_texts(
    tokenizer: transformers.PreTrainedTokenizerBase, conversations: list[Messages], first_index: int = 0
) -> list[str]:
    """`apply_chat_template(conv, tokenize=False, add_generation_prompt=True)` for each conversation."""
    try:
        # One batched call renders about twice as fast as a call per row.
        return list(tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True))
    except Exception:  # Rendered again row by row below, to name the row that fails.
        pass
    texts = []
    for offset, messages in enumerate(conversations):
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # Jinja raises its own types (e.g. "System role not supported").
            message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"the chat template failed on row {first_index + offset}: {message}") from e
        texts.append(text)
    return texts


def tokenizer_adds_bos(tokenizer: transformers.PreTrainedTokenizerBase) -> bool:
    """Whether `tokenizer(text)` (with special tokens) starts with BOS when the text itself does not."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    probe = "a"
    with_special = tokenizer(probe, add_special_tokens=True)["input_ids"]
    without = tokenizer(probe, add_special_tokens=False)["input_ids"]
    return bool(with_special) and with_special[0] == bos and (not without or without[0] != bos)


def encode_prompts(
    tokenizer: transformers.PreTrainedTokenizerBase, texts: list[str], *, prepend_bos: bool
) -> list[list[int]]:
    """Token ids of prompt texts, no special tokens added except BOS when `prepend_bos` (see BOS rule)."""
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    if prepend_bos:
        bos = tokenizer.bos_token_id
        ids = [row if row[:1] == [bos] else [bos] + row for row in ids]
    return [list(row) for row in ids]


def truncate_left(ids: list[int], max_length: int, bos_id: int | None) -> list[int]:
    """The last `max_length` ids; a leading BOS is kept in front (models expect it at position 0)."""
    if len(ids) <= max_length:
        return ids
    if bos_id is not None and ids[0] == bos_id and max_length > 1:
        return [bos_id] + ids[len(ids) - (max_length - 1):]
    return ids[len(ids) - max_length:]
