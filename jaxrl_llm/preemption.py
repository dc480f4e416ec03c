"""Stopping a run cleanly on a signal: SIGTERM (a preempted or rescheduled host), SIGINT (Ctrl-C), or
JAX's preemption notice on a multi-host run.

`StopSignals` is a context manager held around the training steps. The first signal only sets a flag:
the step in progress finishes (its update is never cut in half), and at the step boundary
`should_stop(step)` returns why to stop, so the loop can save a checkpoint and raise `Preempted`. A
second signal gets the signal's default action: the process ends at once. On exit the handlers that
were in place before are put back (a library must not leave its handlers installed).

Several processes must stop at the same step, or the others would wait forever in the next step's
collectives. `should_stop` is called by every process at every step boundary, and there it agrees:
the processes all-gather the signal each has received (one 4-byte collective per step), and when JAX's
preemption service runs (`jax.distributed`), `reached_preemption_sync_point` reports its notice at the
step it chose for all. On such a run SIGTERM is left to JAX's notifier (installed by
`jax.distributed.initialize`; a Python handler would replace it for good, as the signal module cannot
restore a handler it did not install), so there the second SIGTERM does not end the process.

Nothing here imports jax at module level: the command lines import `Preempted` before jax starts.
"""
from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger(__name__)

PREEMPTED_EXIT = 75  # EX_TEMPFAIL (sysexits.h): "try again later": the run saved and resumes when rerun
INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for Ctrl-C: the run saved, but a person stopped it


class Preempted(Exception):
    """Training stopped at a step boundary on a signal, after committing a checkpoint of that step:
    rerunning the same command (same config, same workdir) resumes from `step`."""

    def __init__(self, reason: str, step: int, total_steps: int, workdir: str):
        self.reason, self.step, self.total_steps, self.workdir = reason, step, total_steps, workdir
        self.exit_code = INTERRUPTED_EXIT if reason.startswith("interrupted") else PREEMPTED_EXIT
        super().__init__(f"{reason} after step {step} of {total_steps}: checkpoint saved; rerunning the same "
                         f"command resumes from step {step} in {workdir}")


_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}


def _preemption_service() -> bool:
    """Whether JAX's preemption sync manager runs (started by jax.distributed.initialize)."""
    try:
        from jax._src import distributed  # private: a later jax may move it; then we handle SIGTERM ourselves
        return distributed.global_state.preemption_sync_manager is not None
    except (ImportError, AttributeError):
        return False


class StopSignals:
    """`with StopSignals() as stop: ... if stop.should_stop(step): ...` (see the module's docstring)."""

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
        self.signals = tuple(signals)
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._jax_notices = False

    def __enter__(self) -> StopSignals:
        self.received, self._previous = None, {}
        import jax
        self._jax_notices = jax.process_count() > 1 and _preemption_service()
        if threading.current_thread() is not threading.main_thread():  # signal.signal works there only
            log.debug("not in the main thread: signals keep their handlers; the run stops on no signal")
            return self
        for sig in self.signals:
            if sig == signal.SIGTERM and self._jax_notices:
                continue  # JAX's notifier has it (see the module's docstring)
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            # None: a handler installed outside Python, which the signal module cannot put back.
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        first = self.received is None
        if first:
            self.received = signum
        for sig in self._previous:  # the next signal, of either kind, ends the process at once
            signal.signal(sig, signal.SIG_DFL)
        if first:  # os.write: a handler may run inside a logging or print call of the main thread
            os.write(2, f"received {_NAMES.get(signum, signum)}: finishing the current step, then saving a "
                        "checkpoint; a second signal exits at once\n".encode())

    def should_stop(self, step: int) -> str | None:
        """Why the run stops after `step` ("preempted (SIGTERM)", "interrupted (SIGINT)", ...), or None.
        With several processes every one must call it at every step boundary: the answer is agreed."""
        import jax
        if jax.process_count() == 1:
            return _reason({self.received or 0}, notice=False)
        import numpy as np
        from jax.experimental import multihost_utils
        received = {int(s) for s in np.asarray(multihost_utils.process_allgather(np.int32(self.received or 0)))}
        notice = self._jax_notices and multihost_utils.reached_preemption_sync_point(step)
        return _reason(received, notice)


def _reason(received: set[int], notice: bool) -> str | None:
    if signal.SIGINT in received:  # a person asked to stop: a babysitter must not rerun the command
        return "interrupted (SIGINT)"
    if signal.SIGTERM in received:
        return "preempted (SIGTERM)"
    if notice:
        return "preempted (JAX preemption notice)"
    others = sorted(s for s in received if s)
    return f"stopped ({', '.join(_NAMES.get(s, str(s)) for s in others)})" if others else None
