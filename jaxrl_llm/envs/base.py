"""The environment interface of multi-turn episodes (docs/environments.md).

An environment is plain Python run on the host, one episode per rollout row:

  reset(row) -> (prompt, state)          prompt: a list of chat messages or a text
  step(state, turn_text) -> StepResult   after each model turn (its text, decoded up to the turn end)

`StepResult.observation` is what the environment says next: a text (appended as-is, for a model without
chat template), a list of messages (`{"role": "tool" | "user", "content": ...}`, rendered through the
chat template) or None when the episode ends. `reward` is the turn's reward (None: the turn earns
nothing); the episode's reward is the sum of its turns'. `state` is the environment's own value (never
inspected by the runner); `info` carries counters the runner logs (`tool_calls`, `tool_errors`).

The episode's lifecycle hooks besides `reset` and `step`, all optional (no-ops on this base class):

  start_batch(rows)       before the batch's resets: start its episodes together (agents' threads)
  end(state) -> reward    once per episode when its turns are over, failed episodes included: release
                          what it holds (a server session); a number returned adds to the last turn's
                          reward (an agent's return value), an exception fails the episode
  abort(state)            the runner failed an episode whose `step` had returned (its observation cannot
                          be rendered): stop it now (an agent gets its HTTP 400); `end` still follows

Failed episodes. An exception from `step` or `end` (or, raising `EpisodeFailed`, from `reset`: that
episode samples nothing) ends its episode with a status, `failure_status(exception)`, the one mapping
from exceptions to FAILURE_STATUSES:

  error         anything else the environment raised (its bug, an OpenEnv server's step that raised)
  timeout       TimeoutError: no answer within the environment's time limit (an agent past `timeout_s`)
  malformed     MalformedResult: a result, observation or reward the runner cannot use
  disconnected  ConnectionError: the server between the runner and the episode died or dropped it (an
                OpenEnv server; the endpoint agents talk to)
  agent_error   `env.name=agent`: the agent raised, or returned before sending any request
  bad_reward    `env.name=agent`: the agent returned something else than a finite number
  bad_request   `env.name=agent`: a malformed request, or one that does not extend the conversation

`EpisodeFailed(status, message)` names the status itself (the endpoint's faults). The runner counts each
in `env/failed/<status>_frac` and stops the run when more than `env.max_failed_frac` of a batch failed.

Environments never see token ids: the runner keeps the tokens the model sampled and appends the
observation's tokens after them (envs/tokens.py), so nothing the model generated is ever re-encoded.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Union

Message = Mapping[str, Any]
Observation = Union[str, Sequence[Message], None]


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What `Environment.step` returns; `observation=None` ends the episode."""

    observation: Observation
    reward: float | None = None
    state: Any = None
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.observation is None


class Environment:
    """Base class of environments: subclass it and define `reset` and `step` (both host-side Python).

    `step` may be slow (a tool, a sandbox): the runner calls it for all active rows of a batch from a
    thread pool, so it must not share mutable state between episodes except through thread-safe objects.
    """

    def reset(self, row: Mapping[str, Any]) -> tuple[str | list[Message], Any]:
        """The initial prompt of the episode of dataset row `row` (its columns) and the initial state."""
        raise NotImplementedError

    def step(self, state: Any, turn_text: str) -> StepResult:
        """The environment's reply to the model's turn `turn_text` (without its turn-end token)."""
        raise NotImplementedError

    def tool_schemas(self) -> list[dict] | None:
        """JSON schemas of the tools the chat template renders (`apply_chat_template(tools=...)`); None."""
        return None

    def start_batch(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Called with a batch's rows before their `reset`s (which follow in the same order)."""

    def end(self, state: Any) -> float | None:
        """Called once per episode (its last state) when its turns are over, failed episodes included:
        release what it holds. A number returned adds to the last turn's reward of an episode that did
        not fail; an exception fails it (its status by `failure_status`)."""
        return None

    def abort(self, state: Any) -> None:
        """The runner failed this episode after its `step` returned (see the module docstring)."""


class MalformedResult(ValueError):
    """A step result, observation or reward the runner cannot use (status `malformed`)."""


# The named statuses of a failed episode (the module docstring says what each means), in the order the
# metrics list them.
FAILURE_STATUSES = ("error", "timeout", "malformed", "disconnected", "agent_error", "bad_reward", "bad_request")


class EpisodeFailed(Exception):
    """The episode cannot go on; `status` (one of FAILURE_STATUSES) names why. From `reset`, it fails that
    episode before its first turn (any other exception of `reset` stops the run)."""

    def __init__(self, status: str, message: str):
        if status not in FAILURE_STATUSES:
            raise ValueError(f"EpisodeFailed status must be one of {FAILURE_STATUSES}, got {status!r}")
        super().__init__(message)
        self.status = status


def failure_status(error: BaseException) -> str:
    """The status of an episode ended by `error` (the one mapping from exceptions to FAILURE_STATUSES)."""
    if isinstance(error, EpisodeFailed):
        return error.status
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, ConnectionError):
        return "disconnected"
    if isinstance(error, MalformedResult):
        return "malformed"
    return "error"


def check_observation(obs: Any) -> Observation:
    """`obs` if it is a text, a list of messages with string roles and contents, or None; else
    MalformedResult (a ValueError)."""
    if obs is None or isinstance(obs, str):
        return obs
    if isinstance(obs, Mapping) or not isinstance(obs, Sequence) or not obs:
        raise MalformedResult(f"an observation must be a text, a non-empty list of messages or None, got {obs!r:.80}")
    for m in obs:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise MalformedResult(f"an observation message needs string 'role' and 'content', got {m!r:.80}")
    return obs


def check_reward(reward: Any) -> float | None:
    """The turn reward as a finite float, or None; MalformedResult (a ValueError) for anything else (NaN, a
    string...)."""
    if reward is None:
        return None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward or abs(reward) == float("inf"):
        raise MalformedResult(f"a turn reward must be a finite number or None, got {reward!r:.80}")
    return float(reward)
