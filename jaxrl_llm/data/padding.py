"""Left padding of prompts to a few bucketed lengths, so that variable lengths compile few shapes.

Bucket rule: the buckets of `max_length` are the powers of two from `min_bucket` (16) up to, but not
including, `max_length`, then `max_length` itself. A batch is padded to the smallest bucket that holds
its longest prompt (the longest of the GLOBAL batch on multi-host runs, so all hosts agree). With
max_length = 512 the buckets are 16, 32, 64, 128, 256, 512: at most 6 compiled prompt shapes, and a
batch is padded to less than twice its longest prompt (or to min_bucket).

Left padding puts every prompt's last token in the last column, where generation starts; the mask
(1 on prompt tokens, 0 on padding) is explicit, so pad_id may equal the EOS id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

DEFAULT_MIN_BUCKET = 16


def prompt_buckets(max_length: int, *, min_bucket: int = DEFAULT_MIN_BUCKET) -> tuple[int, ...]:
    """The padded lengths a prompt batch can take, ascending; the last is `max_length`."""
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1:
        raise ValueError(f"max_length must be a positive int, got {max_length!r}")
    if (isinstance(min_bucket, bool) or not isinstance(min_bucket, (int, np.integer)) or min_bucket < 1
            or min_bucket & (min_bucket - 1)):
        raise ValueError(f"min_bucket must be a positive power of two, got {min_bucket!r}")
    buckets = []
    size = int(min_bucket)
    while size < max_length:
        buckets.append(size)
        size *= 2
    return tuple(buckets) + (int(max_length),)


def bucket_length(n: int, max_length: int, *, min_bucket: int = DEFAULT_MIN_BUCKET) -> int:
    """The smallest bucket of `prompt_buckets(max_length)` that is >= n (a prompt length)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if n > max_length:
        raise ValueError(f"prompt length {n} exceeds max_length={max_length}")
    return next(b for b in prompt_buckets(max_length, min_bucket=min_bucket) if b >= n)


def left_pad(ids_list: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-aligns each id list in a row of `length`: (tokens int32 (B, length), mask int32 (B, length)).

    Row b holds `pad_id` in its first `length - len(ids_list[b])` columns (mask 0), then the ids
    (mask 1). A list longer than `length` is an error, never silently cut.
    """
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
        raise ValueError(f"length must be a non-negative int, got {length!r}")
    tokens = np.full((len(ids_list), length), pad_id, dtype=np.int32)
    mask = np.zeros((len(ids_list), length), dtype=np.int32)
    for b, ids in enumerate(ids_list):
        n = len(ids)
        if n > length:
            raise ValueError(f"prompt {b} has {n} tokens, more than the padded length {length}")
        if n:
            tokens[b, length - n:] = np.asarray(ids, dtype=np.int32)
            mask[b, length - n:] = 1
    return tokens, mask


def pad_prompt_batch(
    batch: Mapping[str, Any], max_length: int, pad_id: int, *, min_bucket: int = DEFAULT_MIN_BUCKET
) -> tuple[np.ndarray, np.ndarray]:
    """Left-pads a `PromptIterator` batch's `prompt_ids` to the bucket of its global longest prompt.

    Uses `batch['global_max_prompt_length']` when present (all hosts then pick the same bucket),
    else the longest prompt of this batch. Returns (tokens, mask), int32 (b, bucket).
    """
    ids_list = batch["prompt_ids"]
    longest = batch.get("global_max_prompt_length", max((len(ids) for ids in ids_list), default=0))
    return left_pad(ids_list, bucket_length(int(longest), max_length, min_bucket=min_bucket), pad_id)
