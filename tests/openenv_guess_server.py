"""An OpenEnv environment written with openenv-core's own server API, for tests/test_envs_openenv.py.

`guess_digit` (jaxrl_llm/envs/guess.py) as an OpenEnv server: reset(hidden=h) hides the digit h and
answers the prompt "guess:"; each step's action is the model's turn (`GuessAction.text`); the
observation's `message` is '<', '>' or '?' and a right guess ends the episode with reward 1. So a
training run through the `openenv` adapter must match the same run on the built-in `guess_digit`.

Fault actions (the fault tests send them as turn texts): "raise" (step raises), "hang" (step sleeps
past any test's step timeout), "none" (the observation has no text: malformed). The server's death
is a test's kill of its process.

Served by `uvicorn tests.openenv_guess_server:app` (the adapter launches it: env.kwargs.app);
`app_one_session` is the same environment served for one session at a time.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app


class GuessAction(Action):
    text: str


class GuessObservation(Observation):
    message: Optional[str] = None


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # no shared state: one instance per session

    def __init__(self):
        super().__init__()
        self._state = State(step_count=0)
        self.hidden = 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, hidden: int = 0,
              **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        self.hidden = int(hidden)
        return GuessObservation(message="guess:")

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        text = action.text
        if text == "raise":
            raise RuntimeError("the environment exploded")
        if text == "hang":
            time.sleep(60)
        if text == "none":
            return GuessObservation(message=None)
        if len(text) != 1 or text not in "0123456789":
            return GuessObservation(message="?", reward=0.0)
        guess = int(text)
        if guess == self.hidden:
            return GuessObservation(message="=", reward=1.0, done=True)
        return GuessObservation(message="<" if self.hidden < guess else ">", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


def stripped_action(turn_text: str) -> GuessAction:
    """A typed action builder (env.kwargs.action): the turn without surrounding spaces."""
    return GuessAction(text=turn_text.strip())


def reply_text(observation: dict) -> str:
    """An observation renderer (env.kwargs.observation)."""
    return f"reply: {observation['message']}"


app = create_fastapi_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=256)
# openenv-core's default: one session at a time (a batch of two episodes is refused)
app_one_session = create_fastapi_app(GuessEnvironment, GuessAction, GuessObservation)
