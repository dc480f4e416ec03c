"""Fault injection for reliability tests: SIGKILL the process at a named point of a named step.

The environment variable `JAXRL_LLM_FAULT` arms it, e.g.

  JAXRL_LLM_FAULT=update:3 python -m jaxrl_llm.train ...    # killed during the update of step 4

A spec is a comma-separated list of `name:step` (kill when point `name` is reached with that step) or
`name` (kill the first time point `name` is reached). `step` is the number of RL steps completed when
the point is reached (the step a checkpoint is saved under), so `update:3` fires in the fourth
iteration, after checkpoint 3. The points (see docs/reliability.md):

  step        start of an iteration (records its step for the points below that take none)
  sample      the sampler's program has been dispatched and is running
  update      the first optimizer update of the iteration has been dispatched and is running
  checkpoint  `Checkpointer.save` returned: Orbax's asynchronous write is in flight, not committed
  export      inside `save_hf`'s temporary directory, after the weights and before the rename

SIGKILL (not an exception) is the point: no `finally`, no atexit, no flush runs, as on a preempted or
OOM-killed host. The spec is read once at import; unarmed, `point` is one falsy-global test, and a
step given as a device array is never read (no host sync).
"""
from __future__ import annotations

import os
import signal
import sys

ENV = "JAXRL_LLM_FAULT"


def parse(spec: str) -> frozenset[tuple[str, int | None]]:
    """'update:3,export' -> {('update', 3), ('export', None)}; a one-line ValueError on a bad spec."""
    out = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, step = part.partition(":")
        if not name.isidentifier() or (sep and not step.isdigit()):
            raise ValueError(f"{ENV}={spec!r} must be comma-separated name[:step] entries "
                             f"(e.g. 'update:3'), got {part!r}")
        out.add((name, int(step) if sep else None))
    return frozenset(out)


_ARMED = parse(os.environ.get(ENV, ""))
_last_step: int | None = None  # the step given to the previous point (armed only)


def arm(spec: str) -> None:
    """Replaces the armed spec ('' disarms); for in-process use. Subprocesses read `JAXRL_LLM_FAULT`."""
    global _ARMED, _last_step
    _ARMED, _last_step = parse(spec), None


def point(name: str, step=None) -> None:
    """SIGKILLs this process when the armed spec names (`name`, `step`) or `name` alone.

    step: steps completed (an int or a scalar array, read only when armed); None = the step given to
    the previous point, for places where the step array has been donated.
    """
    global _last_step
    if not _ARMED:
        return
    if step is not None:
        _last_step = int(step)
    if (name, None) in _ARMED or (name, _last_step) in _ARMED:
        where = name if _last_step is None else f"{name}:{_last_step}"
        sys.stderr.write(f"jaxrl_llm.faults: SIGKILL at {where} (pid {os.getpid()})\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
