"""PromptIterator: deterministic shuffling, epochs, host sharding, exact resume."""

import datasets
import numpy as np
import pytest

from jaxrl_llm.data import PromptIterator, default_data_config, iterator_from_config


def _dataset(n):
    # Row r has r % 7 + 1 prompt tokens, so batches have different longest prompts.
    return datasets.Dataset.from_dict({
        "prompt_text": [f"p{r}" for r in range(n)],
        "prompt_ids": [[r] * (r % 7 + 1) for r in range(n)],
        "answer": [str(r) for r in range(n)],
        "row": list(range(n)),
    })


def _reference_batches(n, batch_size, seed, epochs, drop_last=True):
    """The documented order, written out: epoch e walks default_rng([seed, e]).permutation(n)."""
    batches = []
    for e in range(epochs):
        order = np.random.default_rng([seed, e]).permutation(n)
        stop = n - n % batch_size if drop_last else n
        batches += [list(order[i:i + batch_size]) for i in range(0, stop, batch_size)]
    return batches


def _rows(batch):
    return batch["row"]


def test_batches_follow_the_seeded_permutation_per_epoch():
    n, bs, seed = 23, 5, 7
    it = PromptIterator(_dataset(n), bs, seed=seed)
    expected = _reference_batches(n, bs, seed, epochs=3)
    got = [_rows(next(it)) for _ in range(len(expected))]
    assert got == expected
    assert it.steps_per_epoch == 4 and it.epoch == 3


def test_batch_content_and_global_max_length():
    ds = _dataset(10)
    batch = next(PromptIterator(ds, 4, seed=1))
    assert list(batch) == ["prompt_text", "prompt_ids", "answer", "row", "global_max_prompt_length"]
    assert batch["prompt_text"] == [f"p{r}" for r in batch["row"]]
    assert batch["prompt_ids"] == [[r] * (r % 7 + 1) for r in batch["row"]]
    assert batch["answer"] == [str(r) for r in batch["row"]]
    assert batch["global_max_prompt_length"] == max(r % 7 + 1 for r in batch["row"])


def test_same_seed_same_sequence_other_seed_differs():
    ds = _dataset(40)
    a = [_rows(b) for b, _ in zip(PromptIterator(ds, 8, seed=3), range(10))]
    b = [_rows(b) for b, _ in zip(PromptIterator(ds, 8, seed=3), range(10))]
    c = [_rows(b) for b, _ in zip(PromptIterator(ds, 8, seed=4), range(10))]
    assert a == b and a != c


def test_epochs_wrap_and_each_epoch_is_a_fresh_permutation():
    n, bs = 12, 4
    it = PromptIterator(_dataset(n), bs, seed=0, drop_last=False)
    epochs = []
    for e in range(3):
        assert it.epoch == e
        rows = sum((_rows(next(it)) for _ in range(it.steps_per_epoch)), [])
        assert sorted(rows) == list(range(n))  # every row once per epoch
        epochs.append(rows)
    assert epochs[0] != epochs[1] != epochs[2]


def test_drop_last_false_ends_an_epoch_with_a_short_batch():
    batches = [_rows(b) for b in PromptIterator(_dataset(10), 4, seed=2, drop_last=False, num_epochs=1)]
    assert [len(b) for b in batches] == [4, 4, 2]
    assert batches == _reference_batches(10, 4, 2, epochs=1, drop_last=False)


def test_num_epochs_stops_iteration():
    it = PromptIterator(_dataset(9), 3, seed=0, num_epochs=2)
    assert [_rows(b) for b in it] == _reference_batches(9, 3, 0, epochs=2)
    with pytest.raises(StopIteration):
        next(it)


def test_no_shuffle_is_dataset_order():
    it = PromptIterator(_dataset(6), 3, seed=0, shuffle=False)
    assert [_rows(next(it)) for _ in range(3)] == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]


def test_shards_are_disjoint_contiguous_slices_of_the_global_batch():
    ds, bs, shards = _dataset(50), 12, 3
    full = PromptIterator(ds, bs, seed=5)
    parts = [PromptIterator(ds, bs, seed=5, shard_index=i, shard_count=shards) for i in range(shards)]
    for _ in range(9):  # crosses two epoch boundaries
        global_batch = next(full)
        local = [next(p) for p in parts]
        assert all(len(_rows(b)) == bs // shards for b in local)
        assert sum((_rows(b) for b in local), []) == _rows(global_batch)
        assert len(set(sum((_rows(b) for b in local), []))) == bs
        # Every host sees the longest prompt of the global batch, so they pick the same bucket.
        assert {b["global_max_prompt_length"] for b in local} == {global_batch["global_max_prompt_length"]}
        assert {p.epoch for p in parts} == {full.epoch}


@pytest.mark.parametrize("consumed", [0, 3, 4, 9])
def test_exact_resume_from_state(consumed):
    ds = _dataset(17)
    it = PromptIterator(ds, 4, seed=11)
    for _ in range(consumed):
        next(it)
    state = it.state()
    assert all(type(v) is int for v in state.values())
    continued = [next(it) for _ in range(7)]
    resumed_it = PromptIterator(ds, 4, seed=11)
    resumed_it.restore({k: np.asarray(v) for k, v in state.items()})  # as a checkpoint may return them
    assert [next(resumed_it) for _ in range(7)] == continued
    from_state = PromptIterator.from_state(ds, 4, state)
    assert [next(from_state) for _ in range(7)] == continued


def test_state_moves_to_next_epoch_after_its_last_batch():
    it = PromptIterator(_dataset(10), 5, seed=0)
    next(it)
    assert it.state()["epoch"] == 0 and it.state()["position"] == 5
    next(it)
    assert it.state()["epoch"] == 1 and it.state()["position"] == 0


def test_restore_rejects_a_foreign_state():
    ds = _dataset(10)
    it = PromptIterator(ds, 2, seed=1)
    with pytest.raises(ValueError, match="saved with seed=2"):
        it.restore({"epoch": 0, "position": 0, "seed": 2, "num_rows": 10})
    with pytest.raises(ValueError, match="saved over 11 rows"):
        it.restore({"epoch": 0, "position": 0, "seed": 1, "num_rows": 11})
    with pytest.raises(ValueError, match="lacks"):
        it.restore({"epoch": 0})
    with pytest.raises(ValueError, match="position"):
        it.restore({"epoch": 0, "position": 10, "seed": 1, "num_rows": 10})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=6, shard_count=4), "must be divisible by shard_count=4"),
        (dict(batch_size=4, shard_count=2, shard_index=2), "shard_index must be < shard_count"),
        (dict(batch_size=20), "exceeds the dataset's 10 rows"),
        (dict(batch_size=0), "batch_size must be an int >= 1"),
        (dict(batch_size=4, seed=-1), "seed must be an int >= 0"),
        (dict(batch_size=4, shard_count=2, drop_last=False), "drop_last=False needs shard_count=1"),
    ],
)
def test_bad_arguments(kwargs, message):
    kwargs.setdefault("seed", 0)
    with pytest.raises(ValueError, match=message):
        PromptIterator(_dataset(10), **kwargs)


def test_dataset_without_prompt_columns_is_an_error():
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['prompt_ids'\]"):
        PromptIterator(datasets.Dataset.from_dict({"prompt_text": ["a"]}), 1, seed=0)


def test_iterator_from_config_uses_seed_and_epochs():
    config = default_data_config()
    config.shuffle_seed, config.num_epochs = 9, 1
    it = iterator_from_config(_dataset(8), config, 4, shard_index=1, shard_count=2)
    expected = _reference_batches(8, 4, 9, epochs=1)
    assert [_rows(b) for b in it] == [batch[2:] for batch in expected]


def test_selected_rows_dataset_lengths_follow_the_selection():
    # A dataset after `select` (what the 'drop' policy returns) keeps an indices mapping.
    ds = _dataset(20).select([13, 6, 2, 19, 4, 0])
    it = PromptIterator(ds, 3, seed=0)
    for _ in range(4):
        batch = next(it)
        assert batch["global_max_prompt_length"] == max(r % 7 + 1 for r in batch["row"])
        assert batch["prompt_ids"] == [[r] * (r % 7 + 1) for r in batch["row"]]
