"""Left padding and prompt-length buckets."""

import numpy as np
import pytest

from jaxrl_llm.data import bucket_length, left_pad, pad_prompt_batch, prompt_buckets


def _left_pad_reference(ids_list, length, pad_id):
    tokens = [[pad_id] * (length - len(ids)) + list(ids) for ids in ids_list]
    mask = [[0] * (length - len(ids)) + [1] * len(ids) for ids in ids_list]
    shape = (len(ids_list), length)
    return np.array(tokens, dtype=np.int64).reshape(shape), np.array(mask).reshape(shape)


def test_left_pad_matches_reference():
    rng = np.random.default_rng(0)
    ids_list = [list(rng.integers(1, 50, size=n)) for n in (3, 0, 8, 1, 5)]
    tokens, mask = left_pad(ids_list, 8, pad_id=0)
    ref_tokens, ref_mask = _left_pad_reference(ids_list, 8, 0)
    assert tokens.dtype == np.int32 and mask.dtype == np.int32 and tokens.shape == (5, 8)
    np.testing.assert_array_equal(tokens, ref_tokens)
    np.testing.assert_array_equal(mask, ref_mask)
    # Every prompt ends in the last column; the mask counts its tokens.
    np.testing.assert_array_equal(mask.sum(1), [len(ids) for ids in ids_list])


def test_left_pad_with_pad_equal_to_a_real_token():
    # pad == eos is allowed: only the mask tells padding from tokens.
    tokens, mask = left_pad([[7, 7], [5]], 3, pad_id=7)
    np.testing.assert_array_equal(tokens, [[7, 7, 7], [7, 7, 5]])
    np.testing.assert_array_equal(mask, [[0, 1, 1], [0, 0, 1]])


def test_left_pad_rejects_too_long_and_handles_empty_batch():
    with pytest.raises(ValueError, match="prompt 1 has 4 tokens, more than the padded length 3"):
        left_pad([[1], [1, 2, 3, 4]], 3, 0)
    tokens, mask = left_pad([], 4, 0)
    assert tokens.shape == mask.shape == (0, 4)


def test_prompt_buckets_rule():
    assert prompt_buckets(512) == (16, 32, 64, 128, 256, 512)
    assert prompt_buckets(300) == (16, 32, 64, 128, 256, 300)
    assert prompt_buckets(16) == (16,)
    assert prompt_buckets(10) == (10,)
    assert prompt_buckets(100, min_bucket=8) == (8, 16, 32, 64, 100)
    with pytest.raises(ValueError, match="min_bucket must be a positive power of two"):
        prompt_buckets(64, min_bucket=12)
    with pytest.raises(ValueError, match="max_length must be a positive int"):
        prompt_buckets(0)


@pytest.mark.parametrize("max_length", [1, 16, 17, 100, 512])
def test_bucket_length_is_smallest_fitting_bucket(max_length):
    for n in range(max_length + 1):
        # Reference: scan the candidate sizes one by one.
        candidates = [2 ** k for k in range(4, 12) if 2 ** k < max_length] + [max_length]
        expected = min(c for c in candidates if c >= n)
        assert bucket_length(n, max_length) == expected
    with pytest.raises(ValueError, match=f"exceeds max_length={max_length}"):
        bucket_length(max_length + 1, max_length)


def test_few_shapes_for_many_lengths():
    shapes = {bucket_length(n, 512) for n in range(1, 513)}
    assert shapes == set(prompt_buckets(512))


def test_pad_prompt_batch_uses_the_global_longest_prompt():
    batch = {"prompt_ids": [[1, 2, 3], [4]], "global_max_prompt_length": 40}
    tokens, mask = pad_prompt_batch(batch, 128, pad_id=0)
    assert tokens.shape == (2, 64)  # the global batch needs 40 -> bucket 64, though this shard needs 3
    np.testing.assert_array_equal(tokens[:, -3:], [[1, 2, 3], [0, 0, 4]])
    np.testing.assert_array_equal(mask.sum(1), [3, 1])
    tokens, _ = pad_prompt_batch({"prompt_ids": [[1] * 20]}, 128, pad_id=0)
    assert tokens.shape == (1, 32)
