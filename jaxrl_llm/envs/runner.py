"""Runs an environment for all rows of a batch: resets, one `step` per active row per turn (in a
thread pool once a step proves slow: tools), the turn limit, errors, the episodes' `end` and the `env/*`
metrics.

Errors: an exception raised by `reset` is the environment's bug on a data row and stops the run (a
one-line ValueError naming the row) -- except `EpisodeFailed`, which fails that episode before its first
turn (its prompt is its group's, it samples nothing; the endpoint's agents). An exception raised by
`step`, or a malformed return (an observation that is neither text, messages nor None; a NaN or
non-numeric reward), ends that episode: the environment's state can no longer be trusted. The turn earns
no reward, the row's error count grows, the episode gets a named status (`base.failure_status`; the
statuses are listed in envs/base.py), counted in `env/failed/<status>_frac`, and the run goes on --
unless more than `max_failed_frac` of the batch's episodes failed (`check_failures`, which also logs the
batch's failures in one line): then the run stops with one line naming the most common status and an
example. Errors the environment handles itself (a malformed tool call, a tool that raised) are not
exceptions: it replies with an error observation, the episode goes on, and it reports them in
`info["errors"]`, which count in `env/errors/mean` too.

Lifecycle: `env.start_batch(rows)` before the resets; `end()` after the last turn calls `env.end(state)`
once for every episode (concurrently: an agent's return is awaited there), adding a number it returns to
the episode's last turn reward and failing the episode on an exception; `fail(i, ...)` (the sampler
could not render an observation) calls `env.abort(state)`. `close()` ends the episodes `end()` has not.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.envs.base import (FAILURE_STATUSES, Environment, EpisodeFailed, MalformedResult, Observation,
                                  StepResult, check_observation, check_reward, failure_status)

log = logging.getLogger(__name__)

# A row's step that returns within this runs the next one in the calling thread: handing a step to a pool
# thread costs tens of microseconds under the GIL, more than a simple environment's whole step (the
# built-in guess_digit's takes a few). The first slower step sends the rest of the batch's steps to the pool.
INLINE_STEP_S = 1e-3


def as_messages(obs: Observation) -> list[dict]:
    """An observation as chat messages: a text becomes one user message."""
    if obs is None:
        return []
    if isinstance(obs, str):
        return [{"role": "user", "content": obs}]
    return [dict(m) for m in obs]


class EnvironmentFailed(RuntimeError):
    """Most episodes of a batch failed (`EpisodeBatch.check_failures`): the run stops."""


class EpisodeBatch:
    """The episodes of `rows` (one per row) under `env`, at most `max_turns` model turns each.

    prompts[i]: row i's initial prompt (messages or text). history[i]: for a chat prompt, its messages so
    far (prompt, then each assistant turn and observation): what the chat template renders; None for a
    text prompt. Call `step(turn_texts)` after each model turn; it returns the observations to append.
    """

    def __init__(self, env, rows: Sequence[Mapping[str, Any]], *, max_turns: int, max_workers: int = 8,
                 group_size: int = 1):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.env, self.max_turns = env, max_turns
        n = len(rows)
        self.prompts, self.states = [], []
        self.status: list[str] = [""] * n  # a failed episode's FAILURE_STATUSES entry; "" otherwise
        self.last_error: list[str] = [""] * n
        self._unended: list[int] = []  # the episodes whose `env.end` is still to run
        start_batch = _hook(env, "start_batch")
        if start_batch is not None:  # an environment that starts its episodes together (agents)
            start_batch(rows)
        for i, row in enumerate(rows):
            try:
                prompt, state = env.reset(row)
            except EpisodeFailed as e:  # this episode fails before its first turn, the run goes on
                prompt, state = None, None
                self.status[i], self.last_error[i] = e.status, _error_line(e)
            except Exception as e:  # noqa: BLE001
                self.close()  # the episodes reset so far release what they hold
                raise ValueError(f"environment {type(env).__name__}.reset raised on row {i}: "
                                 f"{type(e).__name__}: {e}") from e
            else:
                self._unended.append(i)
            if prompt is not None and not isinstance(prompt, str):
                prompt = [dict(m) for m in check_observation(prompt) or []]
            self.prompts.append(prompt)
            self.states.append(state)
        # A failed row takes its group's prompt (the G rows of a prompt share its prefill), or a stand-in.
        g = max(group_size, 1)
        for i in (i for i, p in enumerate(self.prompts) if p is None):
            group = self.prompts[i - i % g:i - i % g + g]
            self.prompts[i] = next((p for p in group if p is not None),
                                   next((p for p in self.prompts if p is not None), "(failed episode)"))
        self.history = [None if isinstance(p, str) else list(p) for p in self.prompts]
        self.turns = np.zeros(n, np.int32)
        self.aborted = np.asarray([bool(s) for s in self.status], bool)  # failed (a named status)
        self.done = self.aborted.copy()
        self.errors = self.aborted.astype(np.int32)
        self.tool_calls = np.zeros(n, np.int32)
        self.turn_rewards: list[list[float | None]] = [[] for _ in range(n)]
        self.max_workers = max_workers
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # started by the first slow step

    def close(self) -> None:
        """Stops the step threads and ends the episodes `end()` has not (an exception midway: their
        rewards and failures no longer count, an exception of `env.end` is logged)."""
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        end = _hook(self.env, "end")
        rows, self._unended = self._unended, []
        if end is not None:
            for i, result in zip(rows, _map(lambda i: _call(end, self.states[i]), rows)):
                if result[1] is not None:
                    log.warning("environment %s.end raised: %s", type(self.env).__name__, result[1])

    def end(self) -> None:
        """After the last turn: `env.end(state)` once for every episode, concurrently (an agent's reward
        comes once its episode is over). For an episode that had not failed, a number returned adds to
        its last turn's reward; an exception fails it (its turn earns nothing). A failed episode's
        `end` only releases: what it returns or raises is ignored."""
        end = _hook(self.env, "end")
        rows, self._unended = self._unended, []
        if end is None:
            return
        for i, (reward, error, status) in zip(rows, _map(lambda i: _call(end, self.states[i]), rows)):
            if self.aborted[i]:
                continue
            if error is not None:
                self.errors[i] += 1
                self.aborted[i] = True
                self.status[i], self.last_error[i] = status, error
                if self.turn_rewards[i]:
                    self.turn_rewards[i][-1] = None  # a failed episode earns nothing for its last turn
            elif reward is not None:
                if not self.turn_rewards[i]:
                    self.turn_rewards[i].append(None)
                self.turn_rewards[i][-1] = (self.turn_rewards[i][-1] or 0.0) + reward

    def fail(self, i: int, status: str, error: str) -> None:
        """Fails episode i after its turn was stepped (its observation could not be used): the turn
        earns nothing, the status is counted, `env.abort(state)` (if any) stops the episode now."""
        self.errors[i] += 1
        self.aborted[i] = self.done[i] = True
        self.status[i], self.last_error[i] = status, error
        if self.turn_rewards[i]:
            self.turn_rewards[i][-1] = None
        abort = _hook(self.env, "abort")
        if abort is not None:
            try:
                abort(self.states[i])
            except Exception as e:  # noqa: BLE001 - the episode has failed already
                log.warning("environment %s.abort raised: %s", type(self.env).__name__, _error_line(e))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def step(self, turn_texts: Sequence[str | None], *, cannot_continue: Sequence[bool] | None = None
             ) -> list[Observation]:
        """One turn: `turn_texts[i]` is row i's model turn (None for rows already done). Rows in
        `cannot_continue` (the model ended with EOS, or the token budget is spent) are stepped (the
        environment still rewards that turn) and then end. Returns the observation of each row, None for
        the rows that are done now."""
        n = len(self.prompts)
        if len(turn_texts) != n:
            raise ValueError(f"turn_texts has {len(turn_texts)} entries for {n} episodes")
        active = [i for i in range(n) if not self.done[i]]
        for i in active:
            if not isinstance(turn_texts[i], str):
                raise ValueError(f"episode {i} is active but its turn text is {turn_texts[i]!r:.40}")
        results = self._run(active, turn_texts)
        out: list[Observation] = [None] * n
        stop = cannot_continue if cannot_continue is not None else [False] * n
        for i, (result, error, status) in zip(active, results):
            self.turns[i] += 1
            if error is not None:
                self.errors[i] += 1
                self.aborted[i] = self.done[i] = True
                self.status[i], self.last_error[i] = status, error
                self.turn_rewards[i].append(None)
                continue
            self.states[i] = result.state
            self.turn_rewards[i].append(result.reward)
            self.errors[i] += int(result.info.get("errors", 0))
            self.tool_calls[i] += int(result.info.get("tool_calls", 0))
            if self.history[i] is not None:
                self.history[i].append({"role": "assistant", "content": turn_texts[i]})
            if result.done or stop[i] or self.turns[i] >= self.max_turns:
                self.done[i] = True
                continue
            if self.history[i] is not None:
                self.history[i].extend(as_messages(result.observation))
            out[i] = result.observation
        return out

    def _run(self, active: list[int], turn_texts: Sequence[str | None]) -> list:
        """`_step_one` of each active row, in order: in this thread while steps return within INLINE_STEP_S;
        from the first slower one on (in this turn and the later ones) on the pool, `max_workers` at a time."""
        step = lambda j: self._step_one(j, turn_texts[j])
        results, k = [], 0
        while self._pool is None and k < len(active):
            start = time.perf_counter()
            results.append(step(active[k]))
            k += 1
            if self.max_workers > 1 and time.perf_counter() - start > INLINE_STEP_S:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.max_workers)
        if self._pool is not None:
            results += self._pool.map(step, active[k:])
        return results

    def _step_one(self, i: int, text: str) -> tuple[StepResult | None, str | None, str]:
        """(result, None, "") or, when the episode fails, (None, the error in one line, its status)."""
        try:
            result = self.env.step(self.states[i], text)
            if not isinstance(result, StepResult):
                raise MalformedResult(f"step returned {type(result).__name__}, not a StepResult")
            check_observation(result.observation)
            reward = check_reward(result.reward)
            return StepResult(result.observation, reward, result.state, dict(result.info or {})), None, ""
        except Exception as e:  # noqa: BLE001 - the episode ends, the run goes on
            return None, _error_line(e), failure_status(e)

    def check_failures(self, max_failed_frac: float = 1.0, gather=None) -> None:
        """After `end()`: logs this batch's failed episodes (one line: the count of each status and an
        example; each episode's error at DEBUG level) and
        raises EnvironmentFailed, one line naming the most common status and an example, when more than
        `max_failed_frac` of the episodes failed (over every process's with `gather`, as `metrics`)."""
        gather = gather or (lambda x: x)
        failed = [i for i, s in enumerate(self.status) if s]
        counts = collections.Counter(self.status[i] for i in failed)
        example = {s: self.last_error[i] for i in reversed(failed) for s in [self.status[i]]}
        for i in failed:
            log.debug("episode %d failed (%s): %s", i, self.status[i], self.last_error[i])
        if failed:
            log.warning("environment %s: %d of %d episodes failed: %s", type(self.env).__name__, len(failed),
                        len(self.status), "; ".join(f"{s} {k} ({example[s]})" for s, k in counts.most_common()))
        everyone = gather(np.asarray([bool(s) for s in self.status]))
        if everyone.size and everyone.mean() > max_failed_frac:
            if failed:
                top = counts.most_common(1)[0][0]
                cause = (f"{', '.join(f'{s} {k}' for s, k in counts.most_common())} here; the most common, "
                         f"{top}: {example[top]}")
            else:
                cause = "the failed episodes ran on other processes"
            raise EnvironmentFailed(f"environment {type(self.env).__name__}: {int(everyone.sum())} of {everyone.size} "
                                    f"episodes of a batch failed (more than env.max_failed_frac={max_failed_frac}): "
                                    f"{cause}; the run stops")

    def episode_rewards(self) -> np.ndarray:
        """(N,) float32: the sum of each episode's turn rewards (None counts 0)."""
        return np.asarray([sum(r for r in rs if r is not None) for rs in self.turn_rewards], np.float32)

    def metrics(self, gather=None) -> dict[str, float]:
        """`env/turns/mean`, `env/tool_calls/mean`, `env/errors/mean`, `env/aborted_frac`,
        `env/failed/<status>_frac` (each of FAILURE_STATUSES), `env/reward/mean` and
        `env/reward/turn{k}/mean` (over the episodes that reached turn k).
        gather: (n, ...) array -> the rows of every process (in process order), for metrics over all of
        them; None: these episodes'."""
        gather = gather or (lambda x: x)
        rewards = np.full((len(self.turn_rewards), self.max_turns), np.nan)  # NaN: turn not reached
        for i, rs in enumerate(self.turn_rewards):
            rewards[i, :len(rs)] = [r or 0.0 for r in rs]
        status = np.asarray([[s == name for name in FAILURE_STATUSES] for s in self.status], bool
                            ).reshape(len(self.status), len(FAILURE_STATUSES))
        turns, tool_calls, errors, aborted, total, rewards, status = (
            gather(np.asarray(x)) for x in (self.turns, self.tool_calls, self.errors, self.aborted,
                                             self.episode_rewards(), rewards, status))
        out = {"env/turns/mean": float(turns.mean()), "env/tool_calls/mean": float(tool_calls.mean()),
               "env/errors/mean": float(errors.mean()), "env/aborted_frac": float(aborted.mean()),
               "env/reward/mean": float(total.mean())}
        for name, frac in zip(FAILURE_STATUSES, status.mean(0)):
            out[f"env/failed/{name}_frac"] = float(frac)
        for k in range(rewards.shape[1]):
            reached = ~np.isnan(rewards[:, k])
            if reached.any():
                out[f"env/reward/turn{k + 1}/mean"] = float(np.mean(rewards[reached, k]))
        return out


def _error_line(e: BaseException) -> str:
    """The exception in one line: an EpisodeFailed's message (it says what failed), else type: message."""
    s = str(e).strip()
    line = s.splitlines()[0] if s else ""
    return line if isinstance(e, EpisodeFailed) else f"{type(e).__name__}: {line}"


def _call(fn, state) -> tuple[float | None, str | None, str]:
    """(fn(state) as a checked reward, None, "") or (None, the error in one line, its status)."""
    try:
        return check_reward(fn(state)), None, ""
    except Exception as e:  # noqa: BLE001 - fails the episode, not the run
        return None, _error_line(e), failure_status(e)


def _map(fn, items: list) -> list:
    """fn over items: in this thread for one, else on threads (an agent's `end` waits for its return)."""
    if len(items) <= 1:
        return [fn(i) for i in items]
    with concurrent.futures.ThreadPoolExecutor(min(len(items), 64)) as pool:
        return list(pool.map(fn, items))


def _hook(env, name: str):
    """The environment's lifecycle hook `name`, or None where it has none or keeps Environment's no-op."""
    fn = getattr(env, name, None)
    if not callable(fn) or getattr(type(env), name, None) is getattr(Environment, name):
        return None
    return fn
