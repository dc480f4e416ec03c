"""Deterministic, resumable, host-sharded batches of prompts.

Epoch e visits the rows in the order `np.random.default_rng([seed, e]).permutation(num_rows)`: a pure
function of (seed, epoch), so the whole batch sequence is a function of (seed, batch_size, dataset)
and the state to checkpoint is two ints, the epoch and the position (rows consumed in that epoch).

Sharding: `batch_size` is the GLOBAL batch. All hosts walk the same permutation and each returns its
contiguous slice `[shard_index*b, (shard_index+1)*b)` of every global batch (b = batch_size /
shard_count), so the union of the shards' batches is exactly the global batch, and the state is the
same on every host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import datasets
import numpy as np
import pyarrow.compute as pc

from jaxrl_llm.data.config import GLOBAL_MAX_PROMPT_LENGTH, PROMPT_IDS, PROMPT_TEXT


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


class PromptIterator:
    """Batches of a prepared prompt dataset (see `load_prompt_dataset`), epoch after epoch.

    `next(it)` returns a dict with `prompt_text` list[str], `prompt_ids` list[list[int]] (unpadded)
    and every other column of the dataset as a list (this shard's rows, batch_size // shard_count of
    them), plus `global_max_prompt_length` (int): the longest prompt of the whole global batch.
    `num_epochs=None` (or 0) iterates forever; otherwise StopIteration after that many epochs.
    With `drop_last` the rows left after the last full batch of an epoch are skipped (they differ
    from epoch to epoch); without it the epoch ends with a short batch (single host only).
    """

    def __init__(
        self,
        dataset: datasets.Dataset,
        batch_size: int,
        *,
        seed: int,
        shard_index: int = 0,
        shard_count: int = 1,
        drop_last: bool = True,
        num_epochs: int | None = None,
        shuffle: bool = True,
    ):
        if not isinstance(dataset, datasets.Dataset):
            raise ValueError(f"dataset must be a datasets.Dataset, got {type(dataset).__name__}")
        missing = [c for c in (PROMPT_TEXT, PROMPT_IDS) if c not in dataset.column_names]
        if missing:
            raise ValueError(
                f"dataset lacks the column(s) {missing} (build it with load_prompt_dataset); "
                f"available columns: {dataset.column_names}"
            )
        self._batch_size = _check_int("batch_size", batch_size, 1)
        self._seed = _check_int("seed", seed, 0)
        self._shard_count = _check_int("shard_count", shard_count, 1)
        self._shard_index = _check_int("shard_index", shard_index, 0)
        if self._shard_index >= self._shard_count:
            raise ValueError(f"shard_index must be < shard_count={shard_count}, got {shard_index}")
        if self._batch_size % self._shard_count:
            raise ValueError(
                f"batch_size={batch_size} (the global batch) must be divisible by shard_count={shard_count}"
            )
        if not drop_last and self._shard_count > 1:
            raise ValueError(
                "drop_last=False needs shard_count=1: a short last batch cannot be split evenly over hosts"
            )
        self._num_epochs = None if not num_epochs else _check_int("num_epochs", num_epochs, 1)
        self._num_rows = len(dataset)
        if self._num_rows == 0:
            raise ValueError("dataset has no rows")
        if drop_last and self._batch_size > self._num_rows:
            raise ValueError(f"batch_size={batch_size} exceeds the dataset's {self._num_rows} rows (drop_last=True)")
        # Plain Python lists whatever format the caller set (numpy/jax formats would change the batch).
        self._dataset = dataset.with_format(None)
        self._drop_last = bool(drop_last)
        self._shuffle = bool(shuffle)
        # Read once through Arrow (no Python lists): needed for the global max of every batch.
        self._lengths = (
            pc.list_value_length(dataset.with_format("arrow")[PROMPT_IDS]).to_numpy(zero_copy_only=False)
        ).astype(np.int64)
        self._epoch = 0
        self._position = 0
        self._order_epoch = -1
        self._order = np.empty(0, np.int64)

    # ------------------------------------------------------------------------------------------------
    # Properties.

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (0-based)."""
        return self._epoch

    @property
    def batch_size(self) -> int:
        """The global batch size."""
        return self._batch_size

    @property
    def local_batch_size(self) -> int:
        """Rows this shard returns per batch: batch_size // shard_count."""
        return self._batch_size // self._shard_count

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self._num_rows, self._batch_size)
        return full + (1 if rest and not self._drop_last else 0)

    @property
    def rows_per_epoch(self) -> int:
        """Rows an epoch serves (global): all of them, less the remainder that drop_last skips."""
        return self.steps_per_epoch * self._batch_size if self._drop_last else self._num_rows

    @property
    def rows_served(self) -> int:
        """Rows served (global) since the first epoch began: a function of the state, exact across resumes."""
        return self._epoch * self.rows_per_epoch + self._position

    # ------------------------------------------------------------------------------------------------
    # State.

    def state(self) -> dict[str, int]:
        """Plain ints to checkpoint: epoch, position (rows consumed in it), and seed/num_rows to check."""
        return {"epoch": self._epoch, "position": self._position, "seed": self._seed, "num_rows": self._num_rows}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continues from `state()`: the next batch is the one that followed when it was taken."""
        if not isinstance(state, Mapping):
            raise ValueError(f"iterator state must be a dict, got {type(state).__name__}")
        missing = [k for k in ("epoch", "position", "seed", "num_rows") if k not in state]
        if missing:
            raise ValueError(f"iterator state lacks {missing}; expected the dict PromptIterator.state() returns")
        epoch = _check_int("state['epoch']", _as_int(state["epoch"]), 0)
        position = _check_int("state['position']", _as_int(state["position"]), 0)
        if _as_int(state["seed"]) != self._seed:
            raise ValueError(f"iterator state was saved with seed={state['seed']}, this iterator has seed={self._seed}")
        if _as_int(state["num_rows"]) != self._num_rows:
            raise ValueError(
                f"iterator state was saved over {state['num_rows']} rows, this dataset has {self._num_rows}"
            )
        if position >= self._num_rows:
            raise ValueError(f"state['position']={position} must be < the dataset's {self._num_rows} rows")
        self._epoch, self._position = epoch, position
        self._normalize()

    def replace_dataset(self, dataset: datasets.Dataset) -> None:
        """Serves `dataset`'s rows from the next batch on, at the same epoch and position (the next epoch
        when the position leaves no batch in it): a curriculum's regenerated rows. The order is then the
        permutation (seed, epoch) of the new row count."""
        if len(dataset) == 0 or (self._drop_last and self._batch_size > len(dataset)):
            raise ValueError(f"the replacing dataset has {len(dataset)} rows, fewer than a batch of {self._batch_size}")
        self._dataset = dataset.with_format(None)
        self._num_rows = len(dataset)
        self._lengths = (
            pc.list_value_length(dataset.with_format("arrow")[PROMPT_IDS]).to_numpy(zero_copy_only=False)
        ).astype(np.int64)
        self._order_epoch = -1
        self._normalize()

    @classmethod
    def from_state(
        cls, dataset: datasets.Dataset, batch_size: int, state: Mapping[str, Any], **kwargs
    ) -> "PromptIterator":
        """`PromptIterator(dataset, batch_size, seed=state['seed'], **kwargs)` restored to `state`."""
        kwargs.setdefault("seed", _as_int(state["seed"]) if isinstance(state, Mapping) and "seed" in state else 0)
        iterator = cls(dataset, batch_size, **kwargs)
        iterator.restore(state)
        return iterator

    # ------------------------------------------------------------------------------------------------
    # Iteration.

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            if self._shuffle:
                self._order = np.random.default_rng([self._seed, epoch]).permutation(self._num_rows)
            else:
                self._order = np.arange(self._num_rows)
            self._order_epoch = epoch
        return self._order

    def _normalize(self) -> None:
        # Moves to the next epoch as soon as the current one has no batch left, so that `epoch` and
        # `state()` always describe the next batch.
        left = self._num_rows - self._position
        if left <= 0 or (self._drop_last and left < self._batch_size):
            self._epoch += 1
            self._position = 0

    def __iter__(self) -> "PromptIterator":
        return self

    def __next__(self) -> dict[str, Any]:
        if self._num_epochs is not None and self._epoch >= self._num_epochs:
            raise StopIteration
        order = self._permutation(self._epoch)
        global_rows = order[self._position:self._position + self._batch_size]
        local = len(global_rows) // self._shard_count
        local_rows = global_rows[self._shard_index * local:(self._shard_index + 1) * local]
        batch = self._dataset[[int(i) for i in local_rows]]
        batch = {PROMPT_TEXT: batch[PROMPT_TEXT], PROMPT_IDS: batch[PROMPT_IDS],
                 **{k: v for k, v in batch.items() if k not in (PROMPT_TEXT, PROMPT_IDS)}}
        batch[GLOBAL_MAX_PROMPT_LENGTH] = int(self._lengths[global_rows].max())
        self._position += len(global_rows)
        self._normalize()
        return batch


def _as_int(value: Any) -> Any:
    # Restored checkpoints may hand back numpy scalars or 0-d arrays instead of Python ints.
    if isinstance(value, np.ndarray) and value.shape == ():
        return value.item()
    if isinstance(value, np.integer):
        return int(value)
    return value


def iterator_from_config(
    dataset: datasets.Dataset, data_config, batch_size: int, *, shard_index: int = 0, shard_count: int = 1
) -> PromptIterator:
    """A training `PromptIterator` with `data.shuffle_seed` and `data.num_epochs` (0: unlimited)."""
    return PromptIterator(
        dataset,
        batch_size,
        seed=data_config.shuffle_seed,
        shard_index=shard_index,
        shard_count=shard_count,
        drop_last=True,
        num_epochs=data_config.num_epochs or None,
    )
