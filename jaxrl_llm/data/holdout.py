"""The held-out slice of your own data: with `data.path` and no `eval.path`, periodic evaluation takes the
rows whose prompt hashes to 0 mod `eval.holdout` (CRC-32 of the prompt column's value, as the built-in
task splits its problems) and training never draws them.

A function of the prompt alone, not of the row's position: the same prompt falls on the same side in
every run, on every process and after a resume, and a prompt repeated in the file is never on both
sides (the held-out rows are prompts training has not seen).
"""
from __future__ import annotations

import json
import zlib

import datasets


def prompt_hash(value) -> int:
    """CRC-32 of a prompt: the UTF-8 text of a string, else its canonical JSON (a conversation)."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    return zlib.crc32(text.encode("utf-8"))


def held_out_rows(dataset: datasets.Dataset, column: str, every: int) -> list[bool]:
    """Per row of `dataset`: whether its `column` value hashes to 0 mod `every` (every >= 1)."""
    return [prompt_hash(v) % every == 0 for v in dataset[column]]


def split_held_out(dataset: datasets.Dataset, column: str, every: int, path: str
                   ) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(training rows, held-out rows) of `dataset`, both in file order. A one-line error when either side
    is empty (too few rows for a 1-in-`every` slice)."""
    flags = held_out_rows(dataset, column, every)
    held = [i for i, f in enumerate(flags) if f]
    train = [i for i, f in enumerate(flags) if not f]
    if not held or not train:
        side = "no row falls in" if not held else "every row falls in"
        raise ValueError(f"eval.holdout={every}: {side} the held-out slice of data.path {path!r} ({len(flags)} rows, "
                         "1 prompt in eval.holdout by hash); set eval.path to a held-out file, or eval.every_steps=0")
    return dataset.select(train), dataset.select(held)
