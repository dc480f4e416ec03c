"""Reusable builders of tiny local data for tests: a tokenizer with a chat template, GSM8K-like files.

Plain importable functions (no pytest fixtures) so that any test module, or a script building a tiny
local checkpoint, can call them with its own `tmp_path`.
"""

from __future__ import annotations

import csv
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import tokenizers
from tokenizers import decoders, models, pre_tokenizers
import transformers

TINY_BOS = "<s>"
TINY_EOS = "</s>"
TINY_PAD = "<pad>"
TINY_CHAT_SPECIALS = ("<|im_start|>", "<|im_end|>")

# ChatML turns preceded by the BOS token, like the Llama templates: the rendered text already holds
# BOS, so tokenizing it with the tokenizer's own BOS would duplicate it (the case the loader avoids).
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A few merges so that some tokens span several bytes, as in real byte-level BPE vocabularies.
_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("#", "#"), ("##", "##")]


def make_tiny_tokenizer(
    directory,
    chat_template: bool = True,
    *,
    add_bos: bool = True,
    eos: bool = True,
    pad: bool = True,
) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (~270 ids) saved to `directory` with `save_pretrained`.

    `AutoTokenizer.from_pretrained(directory)` loads it back. `add_bos`: the tokenizer prepends `<s>`
    when encoding with special tokens (Llama-like); `eos`/`pad`: whether `</s>`/`<pad>` are set;
    `chat_template`: attach `TINY_CHAT_TEMPLATE`. Returns the tokenizer as saved.
    """
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    for left, right in _MERGES:
        vocab[left + right] = len(vocab)
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=list(_MERGES)))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = [TINY_BOS, TINY_PAD, *TINY_CHAT_SPECIALS] + ([TINY_EOS] if eos else [])
    backend.add_special_tokens(specials)
    kwargs = dict(
        tokenizer_object=backend,
        bos_token=TINY_BOS,
        additional_special_tokens=list(TINY_CHAT_SPECIALS),
        add_bos_token=add_bos,
        add_eos_token=False,
        clean_up_tokenization_spaces=False,
    )
    if eos:
        kwargs["eos_token"] = TINY_EOS
    if pad:
        kwargs["pad_token"] = TINY_PAD
    tokenizer = transformers.PreTrainedTokenizerFast(**kwargs)
    if chat_template:
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
    os.makedirs(directory, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def gsm8k_like_rows(n: int) -> list[dict]:
    """`n` rows in the GSM8K schema: `question` and `answer` ("reasoning ... #### <int>").

    Question lengths grow with the row index (a filler sentence repeated `i % 5` times) so that
    length policies have rows on both sides of a threshold.
    """
    rows = []
    for i in range(n):
        a, b = 3 + i, 2 * i + 1
        filler = " She also likes to count." * (i % 5)
        question = f"Natalia sold {a} clips in April and {b} clips in May.{filler} How many clips in all?"
        answer = f"In April and May she sold {a} + {b} = <<{a}+{b}={a + b}>>{a + b} clips.\n#### {a + b}"
        rows.append({"question": question, "answer": answer})
    return rows


def write_gsm8k_like(path, n: int, fmt: str = "jsonl") -> list[dict]:
    """Writes `gsm8k_like_rows(n)` to `path` as jsonl, json (a list of records), parquet or csv.

    Returns the rows written, so that a test can compare what it loads with what it wrote.
    """
    rows = gsm8k_like_rows(n)
    path = str(path)
    if fmt == "jsonl":
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    elif fmt == "json":
        with open(path, "w", encoding="utf-8") as f:
            json.dump(rows, f)
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "csv":
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["question", "answer"])
            writer.writeheader()
            writer.writerows(rows)
    else:
        raise ValueError(f"fmt must be one of jsonl, json, parquet, csv; got {fmt!r}")
    return rows


def tiny_api_config(**fields) -> dict:
    """Fields of a one-step Trainer on the built-in tiny model (the Python API's tests), `fields` on top."""
    base = {"total_steps": 1, "model.max_position_embeddings": 32, "model.num_layers": 1, "data.max_prompt_length": 8,
            "rollout": {"batch_prompts": 2, "group_size": 2, "max_new_tokens": 2}, "log.progress": False,
            "export.at_end": False, "export.plot": False}
    return {**base, **fields}


ARITHMETIC_ROWS = [{"question": f"{i}+{i}=", "answer": str(2 * i)} for i in range(8)]  # rows given in Python
