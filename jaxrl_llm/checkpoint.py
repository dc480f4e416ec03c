"""Orbax checkpoints of the whole run: train state (policy, optimizer states, value model, KL controller,
RNG, step) plus JSON metadata (data iterator position, anything the loop needs to resume exactly).

Saves are asynchronous and atomic (Orbax writes a temporary directory and renames it on commit), so an
unfinished checkpoint is never listed. A checkpoint that fails to restore (e.g. a truncated file) is
reported in one line and the previous one is used. Restoring onto an abstract state with other
shardings reshards (a checkpoint written on one mesh restores onto another).
"""
from __future__ import annotations

import logging
import os

import jax
import orbax.checkpoint as ocp

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
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, step: int, state, meta: dict, *, force: bool = False) -> bool:
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        return self.manager.save(step, args=args, force=force)

    def restore(self, abstract_state, step: int | None = None):
        """(step, state, meta) from `step`, or from the newest checkpoint that restores cleanly.

        abstract_state: a pytree of jax.ShapeDtypeStruct (with shardings) describing the target.
        Returns None when there is no checkpoint at all.
        """
        candidates = [step] if step is not None else list(reversed(self.steps()))
        if step is not None and step not in self.steps():
            raise FileNotFoundError(f"{self.directory}: no checkpoint for step {step}; "
                                    f"available: {self.steps() or 'none'}")
        for s in candidates:
            try:
                restored = self.manager.restore(s, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
                return s, restored["state"], dict(restored["meta"])
            except Exception as e:  # corrupt or incompatible: say so in one line, try the previous one
                message = " ".join(str(e).split())[:300]
                if step is not None:
                    raise ValueError(f"checkpoint step {s} in {self.directory} cannot be restored: {message}") from None
                log.warning("checkpoint step %d in %s cannot be restored (%s); trying the previous one",
                            s, self.directory, message)
        if candidates:
            raise ValueError(f"no checkpoint in {self.directory} can be restored (tried steps {candidates})")
        return None

    def restore_params(self, abstract_params, step: int | None = None):
        """(step, policy params) alone, without reading optimizer states (export)."""
        steps = self.steps()
        if not steps:
            raise FileNotFoundError(f"{self.directory}: no checkpoint")
        step = steps[-1] if step is None else step
        if step not in steps:
            raise FileNotFoundError(f"{self.directory}: no checkpoint for step {step}; available: {steps}")
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        restore_args = jax.tree_util.tree_map(
            lambda x: ocp.ArrayRestoreArgs(sharding=getattr(x, "sharding", None) or device), abstract_params)
        restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item={"params": abstract_params}, restore_args={"params": restore_args}, partial_restore=True)))
        return step, restored["state"]["params"]

    def wait(self):
        self.manager.wait_until_finished()

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()


def abstract_like(tree):
    """ShapeDtypeStructs (with shardings) of a pytree of arrays: the target of a restore."""
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)
