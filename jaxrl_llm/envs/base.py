"""The environment interface of multi-turn episodes (docs/environments.md).

An environment is plain Python run on the host, one episode per rollout row:

  reset(row) -> (prompt, state)          prompt: a list of chat messages or a text
  step(state, turn_text) -> StepResult   after each model turn (its text, decoded up to the turn end)

`StepResult.observation` is what the environment says next: a text (appended as-is, for a model without
chat template), a list of messages (`{"role": "tool" | "user", "content": ...}`, rendered through the
chat template) or None when the episode ends. `reward` is the turn's reward (None: the turn earns
nothing); the episode's reward is the sum of its turns'. `state` is the environment's own value (never
inspected by the runner); `info` carries counters the runner logs (`tool_calls`, `tool_errors`).
`end(state)` (optional) is called once per episode when its batch is over: release what the episode
holds (a server session).

An exception from `step` ends its episode with a status named by its type (`failure_status`):
`timeout` (TimeoutError), `disconnected` (ConnectionError), `malformed` (MalformedResult: a result the
runner cannot read) or `error` (anything else).

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

    def end(self, state: Any) -> None:
        """Called once per episode (its last state) when its batch is over, failed episodes included."""


class MalformedResult(ValueError):
    """A step result, observation or reward the runner cannot use (status `malformed`)."""


# The named statuses of an episode an exception ended, in the order the metrics list them.
FAILURE_STATUSES = ("error", "timeout", "malformed", "disconnected")


def failure_status(error: BaseException) -> str:
    """The status of an episode ended by `error`: timeout, disconnected, malformed or error."""
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
