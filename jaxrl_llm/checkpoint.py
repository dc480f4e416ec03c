"""Orbax checkpoints of the whole run: train state (policy, optimizer states, value model, KL controller,
RNG, step) plus JSON metadata (data iterator position, anything the loop needs to resume exactly).

Saves are asynchronous and atomic (Orbax writes a temporary directory and renames it on commit), so an
unfinished checkpoint is never listed. A checkpoint that fails to restore (e.g. a truncated file) is
reported in one line, moved aside to `<step>.corrupt-<time>` (kept for inspection; no longer a step, so
training can save that step again) and the previous one is used. Damage that still decodes (a flipped
bit in compressed array data: zstd keeps no checksum) is caught by a checksum of every array, computed
on device at save time and stored in the metadata, then checked after the restore. Restoring onto an abstract state with
other shardings reshards (a checkpoint written on one mesh restores onto another).
"""
from __future__ import annotations

import logging
import os
import time

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from jaxrl_llm.compile_options import jit

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, directory: str, *, max_to_keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory) if "://" not in directory else directory
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                               enable_async_checkpointing=async_save,
                                               cleanup_tmp_directories=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def steps(self) -> list[int]:
        """Committed steps, oldest first (in-progress and aborted writes are never listed)."""
        # Reloading while an asynchronous save is in flight makes Orbax forget that step: it is then
        # never counted by max_to_keep (one checkpoint too many stays on disk). Listing is rare: wait.
        self.manager.wait_until_finished()
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def require_step(self, step: int | None) -> int:
        """`step` (the latest when None) when it is committed; else a one-line error listing those that are."""
        steps = self.steps()
        if step is not None and step not in steps:
            raise FileNotFoundError(f"{self.directory}: no checkpoint for step {step}; available: {steps or 'none'}")
        if not steps:
            raise FileNotFoundError(f"{self.directory}: no checkpoint")
        return steps[-1] if step is None else step

    def save(self, step: int, state, meta: dict, *, force: bool = False) -> bool:
        meta = {**meta, CHECKSUMS: checksums(state)}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        return self.manager.save(step, args=args, force=force)

    def restore(self, abstract_state, step: int | None = None):
        """(step, state, meta) from `step`, or from the newest checkpoint that restores cleanly.

        abstract_state: a pytree of jax.ShapeDtypeStruct (with shardings) describing the target.
        Returns None when there is no checkpoint at all.
        """
        candidates = [self.require_step(step)] if step is not None else list(reversed(self.steps()))
        failed, newest_error = [], ""
        for s in candidates:
            try:
                restored = self.manager.restore(s, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
                meta = dict(restored["meta"])
                _verify(restored["state"], meta.pop(CHECKSUMS, None))
            except Exception as e:  # corrupt or incompatible: say so in one line, try the previous one
                message = " ".join(str(e).split())[:300]
                if step is not None:
                    raise ValueError(f"checkpoint step {s} in {self.directory} cannot be restored: {message}") from None
                log.warning("checkpoint step %d in %s cannot be restored (%s); trying the previous one",
                            s, self.directory, message)
                newest_error = newest_error or message
                failed.append(s)
                continue
            # An older step restored, so the newer ones are damaged (not incompatible with this code):
            # move them aside, or Orbax would refuse to save those steps again.
            for bad in failed:
                log.warning("moved unrestorable checkpoint step %d aside to %s", bad, self._move_aside(bad))
            return s, restored["state"], meta
        if candidates:  # nothing moved: when no step restores, the cause is more likely the code than the files
            mismatch = self._mismatch(candidates[0], abstract_state)
            reason = f"{mismatch}: written by a run of another model?" if mismatch else newest_error
            raise ValueError(f"no checkpoint in {self.directory} can be restored (tried steps {candidates}; "
                             f"step {candidates[0]}: {reason})")
        return None

    def _mismatch(self, step: int, abstract_state) -> str | None:
        """The first array of the state that checkpoint `step` lacks or stores with another shape, in
        words (Orbax's own error names no array); None when the layouts agree or cannot be read."""
        try:
            stored = _by_path(self.manager.item_metadata(step)["state"])
        except Exception:  # unreadable metadata: the restore error says what it can
            return None
        wanted = _by_path(abstract_state)
        for path, want in wanted.items():
            have = stored.get(path)
            if have is None:
                return f"{path} is not in the checkpoint"
            if tuple(have.shape) != tuple(want.shape):
                return f"{path} has shape {tuple(have.shape)} in the checkpoint, {tuple(want.shape)} here"
        extra = sorted(set(stored) - set(wanted))
        return f"{extra[0]} is in the checkpoint but not in this run's state" if extra else None

    def _move_aside(self, step: int) -> str:
        """Renames an unrestorable step to `<step>.corrupt-<time>`: Orbax no longer lists it, so a resumed
        run saves that step afresh (Orbax refuses to save a step that exists, silently)."""
        path = ocp.path.step.find_step_path(self.directory, ocp.path.step.standard_name_format(), step=step)
        aside = path.parent / f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
        if jax.process_index() == 0:
            path.rename(aside)
        ocp.multihost.sync_global_processes(f"jaxrl_llm_checkpoint_move_aside_{step}")
        self.manager.reload()
        return aside.name

    def restore_params(self, abstract_params, step: int | None = None, *, with_meta: bool = False):
        """(step, policy params [, the metadata saved with them]) alone, without reading optimizer states."""
        step = self.require_step(step)
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        restore_args = jax.tree_util.tree_map(
            lambda x: ocp.ArrayRestoreArgs(sharding=getattr(x, "sharding", None) or device), abstract_params)
        # A manager of its own: the one that saved has bound "state" to the standard handler, which
        # refuses these partial-restore arguments.
        reader = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(read_only=True),
                                       item_names=("state", "meta"))
        try:
            restored = reader.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
                item={"params": abstract_params}, restore_args={"params": restore_args}, partial_restore=True),
                meta=ocp.args.JsonRestore()))
            _verify({"params": restored["state"]["params"]}, dict(restored["meta"]).get(CHECKSUMS))
        except Exception as e:  # a damaged checkpoint: one line naming it, never a partial export
            message = " ".join(str(e).split())[:300]
            raise ValueError(f"checkpoint step {step} in {self.directory} cannot be restored: {message}; "
                             f"available steps: {self.steps()}") from None
        finally:
            reader.close()
        return (step, restored["state"]["params"]) + ((dict(restored["meta"]),) if with_meta else ())

    def wait(self):
        self.manager.wait_until_finished()

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()


CHECKSUMS = "array_checksums"  # metadata key: {array path: checksum} of the saved state


def checksums(tree) -> dict[str, int]:
    """{array path: sum of its bits (as uint32 words) weighted by odd, position-dependent weights, mod
    2^32}: a flipped bit always changes its array's checksum, a moved or rewritten block almost surely.
    Computed on device (sharded arrays included); one small reduction per array."""
    leaves = {k: v for k, v in _by_path(tree).items() if v is not None}
    values = jax.device_get(_checksum_leaves(tuple(leaves.values())))
    return {k: int(v) for k, v in zip(leaves, values)}


@jit
def _checksum_leaves(leaves):
    out = []
    for x in leaves:
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        if x.dtype == jnp.bool_:
            x = x.astype(jnp.uint8)
        width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
        words = jax.lax.bitcast_convert_type(x, width).astype(jnp.uint32).reshape(-1)
        weights = jnp.arange(words.size, dtype=jnp.uint32) * jnp.uint32(1013904226) + jnp.uint32(1)  # odd
        out.append(jnp.sum(words * weights, dtype=jnp.uint32))
    return jnp.stack(out) if out else jnp.zeros((0,), jnp.uint32)


def _verify(tree, expected: dict[str, int] | None) -> None:
    """Raises when an array of `tree` does not match its checksum (checkpoints without any pass)."""
    if expected is None:
        return
    for path, value in checksums(tree).items():
        if path in expected and expected[path] != value:
            raise ValueError(f"array {path} does not match the checksum saved with it: the data is damaged")


def _by_path(tree) -> dict[str, object]:
    """{'params/layers/q_proj/kernel': leaf} whatever the containers (Orbax's metadata uses dicts
    where the state has dataclass fields)."""
    def name(k):
        return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
    return {"/".join(name(k) for k in path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def abstract_like(tree):
    """ShapeDtypeStructs (with shardings) of a pytree of arrays: the target of a restore."""
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)
