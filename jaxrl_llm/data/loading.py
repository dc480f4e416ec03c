"""Prompt datasets: the `data` config section, loading with `datasets.load_dataset`, tokenizing once.

`load_prompt_dataset(config.data, tokenizer)` returns a `datasets.Dataset` with the columns
`prompt_text` (str, what the model is prompted with), `prompt_ids` (list[int], unpadded),
`prompt_user` (the user's prompt before any chat template) and every column of the dataset under its own
name (the rewards receive them all), plus counts for the metrics
(`data/dropped_too_long`, `data/truncated`, ...). `PromptIterator` batches it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os

import datasets
import numpy as np
import transformers

from jaxrl_llm.data import prompts as prompts_lib
from jaxrl_llm.data.config import PROMPT_IDS, PROMPT_TEXT, PROMPT_USER, use_chat_template_flag, validate_data_config
from jaxrl_llm.data.files import data_file_extension
from jaxrl_llm.data.tokenizer import has_chat_template

logger = logging.getLogger(__name__)

# Builder of `datasets.load_dataset` for each local file extension (files.DATA_EXTENSIONS, checked there).
_FILE_BUILDERS = {
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".ndjson": ("json", {}),
    ".parquet": ("parquet", {}),
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"sep": "\t"}),
    ".arrow": ("arrow", {}),
}

# Rows per `datasets.map` call: one fast-tokenizer batch call and one chat-template loop each.
_MAP_BATCH = 1000


def load_raw_dataset(config) -> datasets.Dataset:
    """The configured split, as `datasets.load_dataset` returns it (no tokenization).

    A local file goes through the builder named by its extension with `data_files` (its one split is
    "train"); a local directory through `load_dataset(dir)` (a `save_to_disk` directory through
    `load_from_disk`); anything else is a hub name: `load_dataset(path, name or None, split=...)`.
    """
    path = os.path.expanduser(config.path)
    extension = data_file_extension(config.path)  # a missing local file fails here, not after a hub request
    cache_dir = config.cache_dir or None
    name = config.name or None
    if extension is not None:
        builder, builder_kwargs = _FILE_BUILDERS[extension]
        load = lambda: datasets.load_dataset(  # noqa: E731
            builder, data_files={"train": path}, split=config.split, cache_dir=cache_dir, **builder_kwargs
        )
    elif os.path.isdir(path) and os.path.isfile(os.path.join(path, "state.json")):
        load = lambda: datasets.load_from_disk(path)  # noqa: E731
    else:  # a directory of data files, or a hub name
        load = lambda: datasets.load_dataset(path, name, split=config.split, cache_dir=cache_dir)  # noqa: E731
    try:
        dataset = load()
    except datasets.exceptions.DatasetGenerationError as e:  # a file that does not parse: say where
        cause = e.__cause__ or e
        detail = _first_bad_json_line(path) if os.path.isfile(path) else None
        detail = detail or " ".join(str(cause).split())[:300] or type(cause).__name__
        raise ValueError(f"data.path {config.path!r} could not be read: {detail}") from e
    except (OSError, ValueError, StopIteration, datasets.exceptions.DatasetNotFoundError) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        # What `datasets` says of a file with no rows: "corresponds to no data", or (its json builder
        # reading the first batch of an empty file) a bare StopIteration.
        if "corresponds to no data" in message or isinstance(e, StopIteration):
            raise ValueError(f"data.path {config.path!r} split {config.split!r} has no rows") from e
        raise ValueError(f"data.path {config.path!r} (split {config.split!r}) could not be loaded: {message}") from e
    if isinstance(dataset, datasets.DatasetDict):  # a save_to_disk directory of several splits
        if config.split not in dataset:
            raise ValueError(f"data.split {config.split!r} is not among the splits {list(dataset)}")
        dataset = dataset[config.split]
    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(
            f"data.path {config.path!r} gave a {type(dataset).__name__}, expected one split (a datasets.Dataset)"
        )
    return dataset


def _first_bad_json_line(path: str) -> str | None:
    """'line N is not ...' for the first line of a JSON-lines file that is not a JSON object; None when
    every line is one (or the file is one JSON document, as a .json file may be)."""
    if os.path.splitext(path)[1].lower() not in (".jsonl", ".ndjson", ".json"):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as e:
                if number == 1 and line.lstrip().startswith(("[", "{")) and path.endswith(".json"):
                    return None  # a multi-line JSON document: datasets' own message is the better one
                return f"line {number} is not valid JSON ({e.msg} at column {e.colno})"
            if not isinstance(value, dict):
                return f"line {number} is a JSON {type(value).__name__}, expected an object of columns"
    return None


# ----------------------------------------------------------------------------------------------------
# Prompt building and tokenization.


# Columns that usually hold the prompt (TRL's is `prompt`), in the order they are suggested.
_PROMPT_COLUMNS = ("prompt", "messages", "question", "problem", "query", "instruction", "input")


def _column_hint(config, missing: list[str], available: list[str]) -> str:
    """'; set data.prompt_column=prompt' when the prompt column is missing and a usual one is present."""
    if config.prompt_template or config.prompt_column not in missing:
        return ""
    present = [c for c in _PROMPT_COLUMNS if c in available]
    return f"; set data.prompt_column={present[0]} (TRL's default column is prompt)" if present else ""


def _required_columns(config) -> list[str]:
    if config.prompt_template:
        needed = prompts_lib.template_fields(config.prompt_template)
    else:
        needed = [config.prompt_column]
    passthrough = ([config.answer_column] if config.answer_column else []) + list(config.extra_columns)
    passthrough += [config.completion_column] if config.get("completion_column") else []
    return needed + [c for c in passthrough if c not in needed]


def _chat_enabled(config, tokenizer) -> bool:
    flag = use_chat_template_flag(config.use_chat_template)
    if flag is True and not has_chat_template(tokenizer):
        raise ValueError(
            f"data.use_chat_template=True but tokenizer {tokenizer.name_or_path!r} has no chat template"
        )
    return has_chat_template(tokenizer) if flag == "auto" else flag


def _fingerprint(dataset: datasets.Dataset, config, tokenizer, chat: bool) -> str:
    # Given explicitly so that `datasets` does not try to hash the tokenizer inside the map function.
    parts = [
        getattr(dataset, "_fingerprint", ""),
        repr(sorted((k, repr(v)) for k, v in config.items())),
        tokenizer.name_or_path,
        str(len(tokenizer)),
        str(getattr(tokenizer, "chat_template", None)),
        str(chat),
    ]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def as_dataset(rows) -> datasets.Dataset:
    """Prompt rows given in Python as a `datasets.Dataset`: a Dataset as is, a list of dicts (one per
    row) or a dict of equal-length column lists."""
    if isinstance(rows, datasets.Dataset):
        return rows
    try:
        if isinstance(rows, dict):
            return datasets.Dataset.from_dict(rows)
        rows = list(rows)
        if not all(isinstance(r, dict) for r in rows):
            raise TypeError("every row must be a dict of column -> value")
        return datasets.Dataset.from_list(rows)
    except (TypeError, ValueError, datasets.arrow_writer.SchemaInferenceError) as e:
        raise ValueError(f"dataset must be a datasets.Dataset, a list of row dicts or a dict of columns: "
                         f"{' '.join(str(e).split())[:200]}") from None


def prepare_prompts(
    dataset: datasets.Dataset, config, tokenizer: transformers.PreTrainedTokenizerBase
) -> tuple[datasets.Dataset, dict[str, int]]:
    """Builds and tokenizes the prompt of every row, applies the max-length policy.

    Returns (dataset with columns prompt_text, prompt_ids, prompt_user and every column of `dataset`;
    stats) where stats has
    `data/rows_loaded`, `data/rows`, `data/dropped_too_long`, `data/truncated`, `data/prompt_length_max`.
    The max-length policy: 'drop' removes longer prompts, 'truncate_left' keeps their last
    max_prompt_length tokens (a leading BOS stays in front; prompt_text is the decoded kept ids),
    'error' raises naming the first such row.
    """
    validate_data_config(config)
    _check_columns(dataset, config)
    chat = _chat_enabled(config, tokenizer)
    # Every column reaches the rewards under its own name (the generated ones replace a namesake).
    passthrough = [c for c in dataset.column_names if c not in (PROMPT_TEXT, PROMPT_IDS, PROMPT_USER)]
    build = functools.partial(_build_batch, config=config, tokenizer=tokenizer, chat=chat, passthrough=passthrough,
                              prepend_bos=not chat and prompts_lib.tokenizer_adds_bos(tokenizer))
    prepared = dataset.map(
        build,
        with_indices=True,
        batched=True,
        batch_size=_MAP_BATCH,
        remove_columns=dataset.column_names,
        keep_in_memory=True,
        new_fingerprint=_fingerprint(dataset, config, tokenizer, chat),
        desc="tokenizing prompts",
    )
    raw_lengths = np.asarray(prepared["_raw_length"], dtype=np.int64)
    prepared = prepared.select_columns([PROMPT_TEXT, PROMPT_IDS, PROMPT_USER, *passthrough])  # drops _raw_length
    prepared = _apply_length_policy(prepared, raw_lengths, config)
    stats = _prompt_stats(raw_lengths, len(prepared), config)
    _warn_cut_and_empty(dataset, config, stats, config.max_prompt_length)
    logger.info(
        "prompts: %d rows of %d kept (%d dropped as too long, %d truncated), longest %d tokens; chat template: %s",
        stats["data/rows"], stats["data/rows_loaded"], stats["data/dropped_too_long"], stats["data/truncated"],
        stats["data/prompt_length_max"], chat,
    )
    return prepared, stats


def _check_columns(dataset: datasets.Dataset, config) -> None:
    """A one-line error for a dataset with no rows or without a configured column."""
    if len(dataset) == 0:
        raise ValueError(f"data.path {config.path!r} split {config.split!r} has no rows")
    missing = [c for c in _required_columns(config) if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"dataset lacks the configured column(s) {missing}; available columns: {dataset.column_names}"
            f"{_column_hint(config, missing, dataset.column_names)}"
        )


def _build_batch(batch: dict[str, list], indices: list[int], *, config, tokenizer, chat: bool, prepend_bos: bool,
                 passthrough: list[str]) -> dict[str, list]:
    """One `datasets.map` batch: the prompt columns, the raw token count `_raw_length` (before any
    truncation, for the length policy) and the passed-through columns."""
    rows = [{k: batch[k][j] for k in batch} for j in range(len(indices))]
    users = [
        prompts_lib.user_prompt(row, prompt_column=config.prompt_column, prompt_template=config.prompt_template,
                                index=i)
        for row, i in zip(rows, indices)
    ]
    texts = _prompt_texts(users, indices, config, tokenizer, chat)
    ids = _encode(texts, indices, tokenizer, prepend_bos)
    lengths = [len(row_ids) for row_ids in ids]
    if config.max_prompt_length_policy == "truncate_left":
        _truncate_left(ids, texts, config.max_prompt_length, tokenizer)
    plain = [u if isinstance(u, str) else prompts_lib.last_user_content(u) for u in users]
    out = {PROMPT_TEXT: texts, PROMPT_IDS: ids, PROMPT_USER: plain, "_raw_length": lengths}
    out.update({c: batch[c] for c in passthrough})
    return out


def _prompt_texts(users: list, indices: list[int], config, tokenizer, chat: bool) -> list[str]:
    """The text each row is prompted with: its user prompt (a string or chat messages) through the chat
    template, or as raw text (then chat messages are an error)."""
    if chat:
        conversations = [prompts_lib.to_messages(u, config.system_prompt) for u in users]
        return prompts_lib.chat_prompt_texts(tokenizer, conversations, first_index=indices[0])
    for u, i in zip(users, indices):
        if not isinstance(u, str):
            raise ValueError(
                f"row {i} holds chat messages but tokenizer {tokenizer.name_or_path!r} has no chat "
                "template (or data.use_chat_template=False)"
            )
    return [prompts_lib.raw_prompt_text(u, config.system_prompt) for u in users]


def _encode(texts: list[str], indices: list[int], tokenizer, prepend_bos: bool) -> list[list[int]]:
    """Token ids of each prompt text; an empty one is an error naming its row."""
    ids = prompts_lib.encode_prompts(tokenizer, texts, prepend_bos=prepend_bos)
    for row_ids, i in zip(ids, indices):
        if not row_ids:
            raise ValueError(f"the prompt of row {i} is empty (no tokens)")
    return ids


def _truncate_left(ids: list[list[int]], texts: list[str], max_length: int, tokenizer) -> None:
    """In place: every prompt over `max_length` tokens keeps its last ones (a leading BOS stays in front),
    and its text becomes the decoded kept ids."""
    for j, row_ids in enumerate(ids):
        if len(row_ids) > max_length:
            ids[j] = prompts_lib.truncate_left(row_ids, max_length, tokenizer.bos_token_id)
            texts[j] = tokenizer.decode(ids[j], skip_special_tokens=False)


def _apply_length_policy(prepared: datasets.Dataset, raw_lengths: np.ndarray, config) -> datasets.Dataset:
    """'error' raises naming the first prompt over data.max_prompt_length, 'drop' removes those (an error
    when none is left); 'truncate_left' has already cut them."""
    max_length, policy = config.max_prompt_length, config.max_prompt_length_policy
    too_long = raw_lengths > max_length
    if policy == "error" and too_long.any():
        row = int(np.argmax(too_long))
        raise ValueError(
            f"the prompt of row {row} has {int(raw_lengths[row])} tokens > data.max_prompt_length={max_length} "
            "(data.max_prompt_length_policy='error')"
        )
    if policy == "drop" and too_long.any():
        keep = np.flatnonzero(~too_long)
        if keep.size == 0:
            raise ValueError(
                f"no prompts left: all {len(raw_lengths)} rows are longer than data.max_prompt_length={max_length} "
                "(data.max_prompt_length_policy='drop')"
            )
        prepared = prepared.select(keep)
    return prepared


def _prompt_stats(raw_lengths: np.ndarray, rows_kept: int, config) -> dict[str, int]:
    """The data/* counts of `prepare_prompts` from each loaded row's token count before truncation."""
    max_length, policy = config.max_prompt_length, config.max_prompt_length_policy
    too_long = raw_lengths > max_length
    kept_lengths = np.minimum(raw_lengths, max_length) if policy == "truncate_left" else raw_lengths[~too_long]
    return {
        "data/rows_loaded": int(len(raw_lengths)),
        "data/rows": int(rows_kept),
        "data/dropped_too_long": int(too_long.sum()) if policy == "drop" else 0,
        "data/truncated": int(too_long.sum()) if policy == "truncate_left" else 0,
        "data/prompt_length_max": int(kept_lengths.max()),
    }


def _warn_cut_and_empty(dataset: datasets.Dataset, config, stats: dict[str, int], max_length: int) -> None:
    """Warnings for what trains on other prompts than the data's: most prompts cut by 'truncate_left'
    (the model never sees their beginning, often the question), and conversations holding messages
    with empty content (an export that lost its text)."""
    cut, rows = stats["data/truncated"], stats["data/rows_loaded"]
    if cut * 2 > rows:
        logger.warning("data.max_prompt_length=%d cut %d of the %d prompts (data.max_prompt_length_policy="
                       "'truncate_left' keeps their last tokens): raise data.max_prompt_length", max_length, cut, rows)
    if config.prompt_template or config.prompt_column not in dataset.column_names:
        return
    empty = sum(1 for v in dataset[config.prompt_column] if prompts_lib.is_messages(v)
                and any(not str(m.get("content") or "").strip() for m in v))
    if empty:
        logger.warning("%d of the %d conversations in data.prompt_column %r hold a message with empty content",
                       empty, rows, config.prompt_column)


def load_prompt_dataset(
    config, tokenizer: transformers.PreTrainedTokenizerBase
) -> tuple[datasets.Dataset, dict[str, int]]:
    """`load_raw_dataset(config)` then `prepare_prompts`: the tokenized prompts and their counts."""
    validate_data_config(config)
    return prepare_prompts(load_raw_dataset(config), config, tokenizer)
