"""Runs an environment for all rows of a batch: resets, one `step` per active row per turn (in a
thread pool once a step proves slow: tools), the turn limit, errors and the `env/*` metrics.

Errors: an exception raised by `reset` is the environment's bug on a data row and stops the run (a
one-line ValueError naming the row). An exception raised by `step`, or a malformed return (an
observation that is neither text, messages nor None; a NaN or non-numeric reward), ends that episode:
the environment's state can no longer be trusted. The turn earns no reward, the row's error count
grows, the run goes on. Errors the environment handles itself (a malformed tool call, a tool that
raised) are not exceptions: it replies with an error observation, the episode goes on, and it reports
them in `info["errors"]`, which count in `env/errors/mean` too.

Every episode that ended by an exception has a status: `env_error` for `step`'s exceptions and
malformed returns, or the `status` of an `EpisodeFailed` (envs/endpoint.py: an agent that raised, timed
out, returned no number, sent a malformed request). `reset` may raise `EpisodeFailed` too: that episode
fails before its first turn (its prompt is its group's, it samples nothing), the run goes on. Each
failure is logged (one warning line) and counted (`env/failed/<status>_frac`); `failure_summary()` is
the one line a run that stops on them prints.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.envs.base import Observation, StepResult, check_observation, check_reward
from jaxrl_llm.envs.endpoint import STATUSES, EpisodeFailed

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
        self.status: list[str] = [""] * n  # "" = not failed; else one of endpoint.STATUSES
        self.last_error: list[str] = [""] * n
        if callable(getattr(env, "start_batch", None)):  # an environment that starts its episodes together (agents)
            env.start_batch(rows)
        for i, row in enumerate(rows):
            try:
                prompt, state = env.reset(row)
            except EpisodeFailed as e:  # this episode fails before its first turn, the run goes on
                prompt, state = None, None
                self._failed(i, e.status, _error_line(e))
            except Exception as e:  # noqa: BLE001
                raise ValueError(f"environment {type(env).__name__}.reset raised on row {i}: "
                                 f"{type(e).__name__}: {e}") from e
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
        self.aborted = np.asarray([bool(s) for s in self.status])  # ended by an exception of the environment
        self.done = self.aborted.copy()
        self.errors = self.aborted.astype(np.int32)
        self.tool_calls = np.zeros(n, np.int32)
        self.ended_by_env = np.zeros(n, bool)  # step returned no observation
        self.turn_rewards: list[list[float | None]] = [[] for _ in range(n)]
        self.max_workers = max_workers
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # started by the first slow step

    def fail(self, i: int, status: str, error: str) -> None:
        """Ends episode i as failed after its turn was stepped (its observation could not be used): the
        turn earns nothing, the status is counted, the environment's `abort_episode(state)` (if any) runs."""
        self.errors[i] += 1
        self.aborted[i] = self.done[i] = True
        self._failed(i, status, error)
        if self.turn_rewards[i]:
            self.turn_rewards[i][-1] = None
        abort = getattr(self.env, "abort_episode", None)
        if callable(abort):
            abort(self.states[i])

    def _failed(self, i: int, status: str, error: str) -> None:
        self.status[i], self.last_error[i] = status, error
        log.warning("episode %d failed (%s): %s", i, status, error)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

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
                self._failed(i, status, error)
                self.turn_rewards[i].append(None)
                continue
            self.ended_by_env[i] = result.done
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
        try:
            result = self.env.step(self.states[i], text)
            if not isinstance(result, StepResult):
                raise ValueError(f"step returned {type(result).__name__}, not a StepResult")
            check_observation(result.observation)
            reward = check_reward(result.reward)
            return StepResult(result.observation, reward, result.state, dict(result.info or {})), None, ""
        except Exception as e:  # noqa: BLE001 - the episode ends, the run goes on
            return None, _error_line(e), getattr(e, "status", "env_error")

    def finish(self) -> None:
        """After the last turn: `env.finish_episode(state)` (if the environment has it; an agent's reward may come
        only once its episode is over) for every episode that did not fail, concurrently; a number it
        returns adds to the episode's last turn reward, an exception fails the episode."""
        finish = getattr(self.env, "finish_episode", None)
        rows = [i for i in range(len(self.prompts)) if self.states[i] is not None or not self.aborted[i]]
        if not callable(finish) or not rows:
            return

        def one(i):
            try:
                return check_reward(finish(self.states[i])), None, ""
            except Exception as e:  # noqa: BLE001
                return None, _error_line(e), getattr(e, "status", "env_error")

        with concurrent.futures.ThreadPoolExecutor(min(len(rows), 64)) as pool:
            results = list(pool.map(one, rows))
        for i, (reward, error, status) in zip(rows, results):
            if self.aborted[i]:
                continue
            if error is not None:
                self.errors[i] += 1
                self.aborted[i] = True
                self._failed(i, status, error)
                if self.turn_rewards[i]:
                    self.turn_rewards[i][-1] = None  # a failed episode earns nothing for its last turn
            elif reward is not None:
                if not self.turn_rewards[i]:
                    self.turn_rewards[i].append(None)
                self.turn_rewards[i][-1] = (self.turn_rewards[i][-1] or 0.0) + reward

    def failure_summary(self, gather=None) -> tuple[float, str]:
        """(the fraction of failed episodes, one line: how many, by status, and the first one's error)."""
        gather = gather or (lambda x: x)
        codes = gather(np.asarray([STATUSES.index(s) + 1 if s in STATUSES else (len(STATUSES) + 1 if s else 0)
                                   for s in self.status], np.int32))
        failed = int((codes > 0).sum())
        counts = collections.Counter(STATUSES[c - 1] if c <= len(STATUSES) else "other" for c in codes if c)
        first = next((f"episode {i}: {e}" for i, e in enumerate(self.last_error) if e), "")
        by = ", ".join(f"{s}: {k}" for s, k in counts.most_common())
        return (failed / max(len(codes), 1),
                f"{failed} of {len(codes)} episodes failed ({by}); first: {first}" if failed else "")

    def episode_rewards(self) -> np.ndarray:
        """(N,) float32: the sum of each episode's turn rewards (None counts 0)."""
        return np.asarray([sum(r for r in rs if r is not None) for rs in self.turn_rewards], np.float32)

    def metrics(self, gather=None) -> dict[str, float]:
        """`env/turns/mean`, `env/tool_calls/mean`, `env/errors/mean`, `env/aborted_frac`,
        `env/reward/mean` and `env/reward/turn{k}/mean` (over the episodes that reached turn k).
        gather: (n, ...) array -> the rows of every process (in process order), for metrics over all of
        them; None: these episodes'."""
        gather = gather or (lambda x: x)
        rewards = np.full((len(self.turn_rewards), self.max_turns), np.nan)  # NaN: turn not reached
        for i, rs in enumerate(self.turn_rewards):
            rewards[i, :len(rs)] = [r or 0.0 for r in rs]
        turns, tool_calls, errors, aborted, total, rewards = (
            gather(np.asarray(x)) for x in (self.turns, self.tool_calls, self.errors, self.aborted,
                                             self.episode_rewards(), rewards))
        out = {"env/turns/mean": float(turns.mean()), "env/tool_calls/mean": float(tool_calls.mean()),
               "env/errors/mean": float(errors.mean()), "env/aborted_frac": float(aborted.mean()),
               "env/reward/mean": float(total.mean())}
        codes = gather(np.asarray([STATUSES.index(s) + 1 if s in STATUSES else 0 for s in self.status], np.int32))
        for k, status in enumerate(STATUSES):
            if (codes == k + 1).any():
                out[f"env/failed/{status}_frac"] = float(np.mean(codes == k + 1))
        for k in range(rewards.shape[1]):
            reached = ~np.isnan(rewards[:, k])
            if reached.any():
                out[f"env/reward/turn{k + 1}/mean"] = float(np.mean(rewards[reached, k]))
        return out


def _error_line(e: BaseException) -> str:
    s = str(e).strip()
    line = s.splitlines()[0] if s else ""
    return line if isinstance(e, EpisodeFailed) else f"{type(e).__name__}: {line}"
