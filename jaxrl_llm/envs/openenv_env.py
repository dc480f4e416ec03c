"""`openenv`: an environment served by openenv-core (an OpenEnv server), driven through openenv-core's
own client (`GenericEnvClient`, one websocket session per episode). docs/environments.md "OpenEnv".

  env.kwargs.app="my_pkg.server:app"      launched here: `python -m uvicorn my_pkg.server:app` on a free
                                          localhost port, ready once `/health` answers, stopped at exit
  env.kwargs.base_url="http://host:8000"  or a server already running

Per episode: `reset(row)` opens a session and calls the client's reset (the row's `reset_columns` as its
keyword arguments); the observation, rendered as text, is the prompt. `step(state, turn_text)` sends an
action built from the model's turn -- `{action_field: turn_text}`, the field defaulting to the action
schema's one string field, or `action="module:function"` (turn_text -> an Action or a dict) -- and
returns the server's reward; `done` ends the episode, otherwise the rendered observation is the next
turn (`observation_field`, defaulting to the observation schema's one string field, or
`observation="module:function"` (the observation dict -> a text or messages)). `end(state)` keeps the
session for a later episode's reset (sessions are opened once, not per episode); a failed episode's
session is closed.

Faults end the episode with a named status (envs/base.py `failure_status`): a step that raised on the
server (`error`), no answer within `step_timeout_s` (`timeout`), an observation without its text
(`malformed`), a server that died or dropped the connection (`disconnected`, naming the exit code of a
server launched here).

The server holds each session's environment: it must allow as many sessions as a batch runs episodes
(openenv-core's `create_app(..., max_concurrent_envs=N)`, with `SUPPORTS_CONCURRENT_SESSIONS = True` on
the Environment); a server that refuses one stops the run at that reset with a one-line error saying so.

openenv-core is imported when the environment is built, never by config validation (`check_config`).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import importlib.util
import inspect
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_llm.envs.base import Environment, MalformedResult, StepResult
from jaxrl_llm.envs.registry import register_env

INSTALL = "pip install openenv-core"
_NOT_TEXT = ("done", "reward", "metadata")  # fields of every OpenEnv observation/action, never the text
_CLOSE_S = 5.0  # closing a session (batch end) waits at most this


def check_config(kwargs: Mapping[str, Any]) -> None:
    """One-line ValueError naming the field for a bad `env.kwargs` of `openenv` or a missing package."""
    if importlib.util.find_spec("openenv") is None:
        raise ValueError(f"config.env.name='openenv' needs the openenv-core package: {INSTALL}")
    try:
        inspect.signature(OpenEnvEnvironment).bind(**kwargs)
    except TypeError as e:
        raise ValueError(f"config.env.kwargs do not fit environment 'openenv': {e}") from None
    app, base_url = kwargs.get("app", ""), kwargs.get("base_url", "")
    if bool(app) == bool(base_url):
        raise ValueError("config.env.kwargs: give one of env.kwargs.app ('package.module:app', an OpenEnv server "
                         "launched here) or env.kwargs.base_url (one already running, 'http://host:port')")
    for field in ("app", "action", "observation"):
        spec = kwargs.get(field, "")
        if not spec:
            continue
        module, _, attr = str(spec).partition(":")
        if not (module and attr):
            raise ValueError(f"config.env.kwargs.{field}={spec!r} must be an import path 'package.module:name'")
        try:
            with _as_the_server_imports():
                found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ValueError(f"config.env.kwargs.{field}={spec!r}: no module {module!r} importable here")
    if base_url and not str(base_url).startswith(("http://", "https://", "ws://", "wss://")):
        raise ValueError(f"config.env.kwargs.base_url={base_url!r} must start with http:// or https://")
    for field in ("step_timeout_s", "start_timeout_s"):
        v = kwargs.get(field, 1.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"config.env.kwargs.{field} must be a number of seconds > 0, got {v!r}")
    cols = kwargs.get("reset_columns", ())
    if isinstance(cols, str) or not all(isinstance(c, str) for c in cols):
        raise ValueError(f"config.env.kwargs.reset_columns must be a tuple of column names, got {cols!r}")


CAPACITY_HINT = ("the OpenEnv server holds fewer sessions than a batch runs episodes (each holds one): serve it "
                 "with create_app(..., max_concurrent_envs=N), N >= the episodes of a batch, its Environment "
                 "marked SUPPORTS_CONCURRENT_SESSIONS")


class _Episode:
    """One episode's state: its client (None once closed)."""

    __slots__ = ("client",)

    def __init__(self, client):
        self.client = client


@register_env("openenv")
class OpenEnvEnvironment(Environment):
    """An OpenEnv server's environment, one session per episode (see the module docstring)."""

    def __init__(self, app: str = "", base_url: str = "", action: str = "", action_field: str = "",
                 observation: str = "", observation_field: str = "", reset_columns: Sequence[str] = (),
                 chat: bool = False, step_timeout_s: float = 60.0, start_timeout_s: float = 120.0):
        check_config({k: v for k, v in locals().items() if k not in ("self", "__class__")})
        from openenv.core.generic_client import GenericEnvClient

        self._client_cls = GenericEnvClient
        self.app, self.reset_columns, self.chat = app, tuple(reset_columns), bool(chat)
        self.step_timeout_s, self._proc, self._log = float(step_timeout_s), None, None
        self._idle: list = []  # connected clients whose episode is over: their sessions serve the next resets
        self._lock = threading.Lock()
        self._closing: set = set()  # failed episodes' session closes in flight
        self._loop = asyncio.new_event_loop()  # every episode's client runs on this one loop
        running = threading.Event()
        self._loop.call_soon(running.set)
        threading.Thread(target=self._loop.run_forever, name="openenv-client", daemon=True).start()
        running.wait()
        if app:
            self._log = tempfile.TemporaryFile()  # the server's output: its last line names why it died
            self._proc, self.base_url = _launch(app, self._log)
        else:
            self.base_url = str(base_url).rstrip("/")
        self._finalizer = weakref.finalize(self, _shutdown, self._loop, self._proc, self._log)
        try:
            schema = self._wait_ready(float(start_timeout_s))
            self._action_fn = _load("action", action) if action else None
            self._action_field = action_field or ("" if action else _text_field(schema, "action"))
            self._render_fn = _load("observation", observation) if observation else None
            self._obs_field = observation_field or ("" if observation else _text_field(schema, "observation"))
        except BaseException:
            self.close()
            raise

    # -- the server ---------------------------------------------------------------------------------

    def _wait_ready(self, timeout_s: float) -> dict:
        """The server's /schema once its /health answers; one-line ValueError if it exits or stays silent."""
        import httpx

        where = f"the OpenEnv server {self.app!r} (launched at {self.base_url})" if self.app else \
            f"no OpenEnv server answers at env.kwargs.base_url={self.base_url!r}"
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise ValueError(f"{where} exited with code {self._proc.returncode} at start: {self._last_line()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    return httpx.get(f"{self.base_url}/schema", timeout=10.0).json()
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ValueError(f"{where}: /health did not answer within env.kwargs.start_timeout_s={timeout_s}"
                                 if self.app else f"{where} (/health, {timeout_s} s)")
            time.sleep(0.1)

    def _last_line(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        lines = [x.strip() for x in self._log.read().decode(errors="replace").splitlines() if x.strip()]
        return lines[-1] if lines else "(no output)"

    def _lost(self, error: BaseException) -> ConnectionError:
        """The ConnectionError of an episode whose server went away."""
        if self._proc is not None and self._proc.poll() is not None:
            return ConnectionError(f"the OpenEnv server {self.app!r} exited with code {self._proc.returncode}")
        return ConnectionError(f"lost the OpenEnv server at {self.base_url}: {type(error).__name__}: {error}")

    def close(self) -> None:
        """Closes the idle sessions, stops the client loop and the server launched here (the last two also
        at exit)."""
        with self._lock:
            idle, self._idle = self._idle, []
            closing = list(self._closing)
        for client in idle:
            self._release(_Episode(client), wait=True)
        concurrent.futures.wait(closing, timeout=_CLOSE_S)  # closes started, not dropped by the loop's stop
        self._finalizer()

    # -- episodes -----------------------------------------------------------------------------------

    def _submit(self, coro) -> concurrent.futures.Future:
        if not self._loop.is_running():  # closed: the coroutine would never run
            coro.close()
            raise ConnectionError("the openenv environment is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _call(self, coro, timeout_s: float):
        future = self._submit(coro)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the OpenEnv server did not answer within env.kwargs.step_timeout_s="
                               f"{self.step_timeout_s}") from None

    def _client_call(self, state: _Episode, method: str, *args, **kwargs):
        """`state.client.<method>(...)` on the loop; the episode's session is dropped on any failure, and a
        lost connection or a dead server is a ConnectionError."""
        if state.client is None:
            raise ConnectionError("the episode's OpenEnv session is closed")
        try:
            # The client bounds each answer by step_timeout_s; the margin covers the connection.
            return self._call(getattr(state.client, method)(*args, **kwargs), self.step_timeout_s + 10.0)
        except BaseException as e:
            self._release(state, wait=False)  # a hung session's close would wait on it
            if isinstance(e, TimeoutError):
                raise TimeoutError(f"the OpenEnv server did not answer within env.kwargs.step_timeout_s="
                                   f"{self.step_timeout_s}") from None
            if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit
                raise
            if isinstance(e, RuntimeError) and str(e).startswith("Server error:"):  # the environment raised
                raise
            raise self._lost(e) from e

    def reset(self, row: Mapping[str, Any]):
        missing = [c for c in self.reset_columns if c not in row]
        if missing:
            raise ValueError(f"env.kwargs.reset_columns names {missing}, not columns of the dataset ({sorted(row)})")
        kwargs = {c: _plain(row[c]) for c in self.reset_columns}
        with self._lock:
            client = self._idle.pop() if self._idle else None
        try:
            if client is not None:  # a session an earlier episode ended: reset it (no new connection)
                try:
                    state = _Episode(client)
                    result = self._client_call(state, "reset", **kwargs)
                except (ConnectionError, RuntimeError):  # the server closed or reaped it: a new session
                    client = None
            if client is None:
                state = _Episode(self._client_cls(self.base_url, message_timeout_s=self.step_timeout_s))
                result = self._client_call(state, "reset", **kwargs)
        except RuntimeError as e:
            if "CAPACITY_REACHED" in str(e):
                raise RuntimeError(f"{e}: {CAPACITY_HINT}") from None
            raise
        except ConnectionError as e:
            # A new session closed at once by a server that is still up: openenv-core refuses a session past
            # its capacity with CAPACITY_REACHED, but on a loaded machine the client saw the close first.
            if self._proc is not None and self._proc.poll() is None:  # (a server at a URL: alive or not, unknown)
                raise ConnectionError(f"{e} (a new session, closed by a live server: it may be full; "
                                      f"{CAPACITY_HINT})") from None
            raise
        try:
            return self._render(result.observation), state
        except BaseException:
            self._release(state, wait=False)
            raise

    def step(self, state: _Episode, turn_text: str) -> StepResult:
        action = self._action_fn(turn_text) if self._action_fn else {self._action_field: turn_text}
        result = self._client_call(state, "step", action)
        if result.done:
            return StepResult(None, result.reward, state)
        try:
            return StepResult(self._render(result.observation), result.reward, state)
        except BaseException:  # the episode fails: its session is not handed to another
            self._release(state, wait=False)
            raise

    def end(self, state: _Episode) -> None:
        """The episode's session goes back to the idle ones, for a later episode's reset; a failed
        episode's was already closed."""
        client, state.client = state.client, None
        if client is not None:
            with self._lock:
                self._idle.append(client)

    def _release(self, state: _Episode, wait: bool) -> None:
        """Closes the episode's session: waiting (at most _CLOSE_S) or not (a failed episode: its session
        may be stuck in a hung step)."""
        client, state.client = state.client, None
        if client is None:
            return
        if not wait:
            try:
                future = self._submit(client.close())
            except ConnectionError:
                return
            with self._lock:
                self._closing.add(future)
            future.add_done_callback(self._closing.discard)
            return
        try:
            self._call(client.close(), _CLOSE_S)
        except Exception:  # noqa: BLE001 - a dead server: nothing left to release
            pass

    def _render(self, obs: Any):
        if self._render_fn is not None:
            out = self._render_fn(obs)
        else:
            out = obs.get(self._obs_field) if isinstance(obs, Mapping) else None
            if not isinstance(out, str):
                raise MalformedResult(f"the OpenEnv observation's {self._obs_field!r} is not a text: {obs!r:.80}")
        return [{"role": "user", "content": out}] if self.chat and isinstance(out, str) else out


def _text_field(schema: Mapping[str, Any], kind: str) -> str:
    """The one string field of the server's action or observation schema; one-line ValueError otherwise."""
    props = (schema.get(kind) or {}).get("properties") or {}
    texts = [k for k, p in props.items() if k not in _NOT_TEXT and _is_text(p)]
    if len(texts) == 1:
        return texts[0]
    other = {"action": "action='package.module:function' (turn text -> action)",
             "observation": "observation='package.module:function' (observation dict -> text)"}[kind]
    raise ValueError(f"config.env.kwargs.{kind}_field: the server's {kind} has {len(texts)} text fields "
                     f"{texts} (of {sorted(props)}); name the one to use, or give env.kwargs.{other}")


def _is_text(prop: Mapping[str, Any]) -> bool:
    return prop.get("type") == "string" or any(p.get("type") == "string" for p in prop.get("anyOf", ()))


@contextlib.contextmanager
def _as_the_server_imports():
    """Resolve module paths as the launched server does (`_launch`: the working directory first on its path).

    `python -m` puts the working directory on sys.path, a console script or plain `pytest` does not; without
    this a config naming `my_pkg.server:app` next to it would pass in one and be refused in the other.
    """
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _load(field: str, spec: str):
    module, _, attr = spec.partition(":")
    try:
        with _as_the_server_imports():
            obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # noqa: BLE001 - user modules fail in every way
        raise ValueError(f"config.env.kwargs.{field}={spec!r} cannot be imported: {type(e).__name__}: {e}") from None
    if not callable(obj):
        raise ValueError(f"config.env.kwargs.{field}={spec!r} is a {type(obj).__name__}, not a function")
    return obj


def _plain(value: Any) -> Any:
    """A dataset value as JSON (NumPy scalars and arrays to Python)."""
    return value.tolist() if hasattr(value, "tolist") else value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(app: str, log) -> tuple[subprocess.Popen, str]:
    """`python -m uvicorn app` on a free localhost port; the child imports what this process can."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + [p for p in sys.path if p]))
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            env=env)
    return proc, f"http://127.0.0.1:{port}"


def _shutdown(loop, proc, log) -> None:
    loop.call_soon_threadsafe(loop.stop)
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if log is not None:
        log.close()
