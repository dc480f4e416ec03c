"""verifiers environments (`env.name=verifiers`): a `verifiers.v1` environment -- its taskset, harness
and rubric (the task's `@vf.reward`s and plugged judges) -- played by the policy through the
OpenAI-compatible endpoint of envs/endpoint.py (docs/environments.md, "verifiers environments").

Each episode is one agent of `AgentEnvironment` (`env.name=agent`): its "agent" runs verifiers' own
episode, `Env.run_episode(task, ctx)`, on one event loop shared by the batch, with `ctx.client` an
`EvalClientConfig` whose base URL is our endpoint. verifiers' interception server relays the harness's
model calls there (one client for every episode; the request's `X-Session-ID`, verifiers' trace id,
names the episode's row); each call is a turn of the row, the model's text the reply. When the harness
is done, verifiers scores the trace (its `finalize` and rubric) and the trace's reward is the episode's
reward. Token-in-token-out holds as for every agent: the ids trained on are the ids the model drew.

A row becomes a verifiers task: the task's data type (a `vf.TaskData` subclass) built from the row's
columns that are its fields (`prompt`, and the task's own: `answer`, `hidden`, ...); `taskset_rows` gives
a taskset's own tasks as such rows (a dataset to train on them).

Faults end the episode with a named status (envs/base.py): verifiers' timeouts (a stage deadline of the
agent, `trace.is_timeout`) are `timeout`; a harness that raised is `agent_error`; a model call that
failed (the endpoint refused it or was gone) is `disconnected` unless the endpoint already named the
status; anything else verifiers recorded (task setup or scoring raised, the env's own hooks) is `error`.

verifiers is imported only when this environment is built (env.name=verifiers).
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import logging
import math
import os
import sys
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from jaxrl_llm.envs.base import EpisodeFailed
from jaxrl_llm.envs.endpoint import AgentEnvironment
from jaxrl_llm.envs.registry import register_env

INSTALL = "pip install verifiers (or pip install 'jaxrl_llm[verifiers]')"
_MODEL_ERRORS = ("ProviderError", "InterceptionError", "TunnelError")
_LOOP_THREAD = "jaxrl-verifiers"


def check_config(kwargs: Mapping[str, Any]) -> None:
    """One-line ValueError naming the field: verifiers missing, no taskset, or an option of the wrong type."""
    if importlib.util.find_spec("verifiers") is None:
        raise ValueError(f"config.env.name='verifiers' needs the verifiers package: {INSTALL}")
    try:
        inspect.signature(VerifiersEnvironment).bind(**kwargs)
    except TypeError as e:
        raise ValueError(f"config.env.kwargs do not fit environment 'verifiers': {e}") from None
    taskset = kwargs.get("taskset", "")
    if not isinstance(taskset, str) or not taskset:
        raise ValueError("config.env.kwargs.taskset must name a verifiers taskset (the id of an installed "
                         f"environment package, e.g. 'my_env'), got {taskset!r}")
    for field in ("harness", "env_id"):
        if not isinstance(kwargs.get(field, ""), str):
            raise ValueError(f"config.env.kwargs.{field} must be a string id, got {kwargs[field]!r}")
    for field in ("taskset_args", "harness_args", "env_args"):
        if not isinstance(kwargs.get(field, {}), Mapping):
            raise ValueError(f"config.env.kwargs.{field} must be a mapping of options, got {kwargs[field]!r}")
    if kwargs.get("harness_args") and not kwargs.get("harness"):
        raise ValueError("config.env.kwargs.harness_args needs env.kwargs.harness (the harness id they configure)")
    path = kwargs.get("path", "")
    if path and not (isinstance(path, str) and os.path.isdir(path)):
        raise ValueError(f"config.env.kwargs.path must be a directory to import the taskset from, got {path!r}")
    with _on_path(path):
        module = _module_name(taskset)
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
    if not found and importlib.util.find_spec(f"verifiers.v1.tasksets.{module}") is None:
        raise ValueError(f"config.env.kwargs.taskset={taskset!r}: no module {module!r} importable here (a "
                         "verifiers taskset id is a top-level module: install the environment's package, or "
                         "set env.kwargs.path to the directory holding it)")


def _module_name(taskset_id: str) -> str:
    """The module verifiers imports for a taskset id (hub ids `owner/name@version` install as `name`)."""
    return taskset_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


@contextlib.contextmanager
def _on_path(path: str):
    """`path` first on sys.path while the block runs (nothing when empty or already there)."""
    path = os.path.abspath(path) if path else ""
    added = bool(path) and path not in sys.path
    if added:
        sys.path.insert(0, path)
    try:
        yield
    finally:
        if added:
            sys.path.remove(path)


def env_config(taskset: str, taskset_args: Mapping | None = None, harness: str = "",
               harness_args: Mapping | None = None, env_id: str = "", env_args: Mapping | None = None) -> dict:
    """The verifiers env config (its `[env]` block) our kwargs describe: the taskset, the single agent's
    harness (default: the taskset's own) on the local `subprocess` runtime, then `env_args` merged over."""
    out: dict[str, Any] = {"taskset": {**dict(taskset_args or {}), "id": taskset}}
    if env_id:
        out["id"] = env_id
    else:  # the single-agent env: its one seat is `agent`
        out["agent"] = {"runtime": {"type": "subprocess"}}
        if harness:
            out["agent"]["harness"] = {**dict(harness_args or {}), "id": harness}
    return _merge(out, env_args or {})


def _merge(base: dict, over: Mapping) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else _plain(v)
    return out


def _plain(v: Any) -> Any:
    """Config values as verifiers' pydantic models take them: mappings as dicts, tuples as lists."""
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v.item() if hasattr(v, "item") and getattr(v, "shape", None) == () else v


def load(config: Mapping) -> Any:
    """verifiers' `Env` for `config`; one-line ValueError naming what was not found or not valid."""
    import verifiers.v1 as vf
    from pydantic import ValidationError

    taskset = config["taskset"]["id"]
    try:
        return vf.load_environment(vf.resolve_env_config(dict(config)))
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise ValueError(f"config.env.kwargs: verifiers refused the env config of taskset {taskset!r}: "
                         f"{where}: {err.get('msg')}".replace("\n", " ")) from None
    except (ModuleNotFoundError, AttributeError, TypeError, ValueError) as e:
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"config.env.kwargs.taskset={taskset!r}: {type(e).__name__}: {line} (install the "
                         "environment's package, or name an importable module exporting a vf.Taskset)") from None


def task_of(taskset, row: Mapping) -> Any:
    """The verifiers task of a row: the taskset's task type, its data from the row's columns that are
    fields of the task's data type (the rest ignored), with the taskset's task config."""
    task_cls = type(taskset).task_type()
    fields = task_cls.data_type().model_fields
    data = task_cls.data_type().model_validate({k: _plain(v) for k, v in row.items() if k in fields})
    return task_cls(data, taskset.config.task)


def taskset_rows(taskset: str, limit: int | None = None, path: str = "", taskset_args: Mapping | None = None,
                 **kwargs) -> list[dict]:
    """The taskset's own tasks as dataset rows (its `load()` order, the first `limit`), JSON-ready: every
    field the task's data type adds to `vf.TaskData`, and the `vf.TaskData` fields the task set (`prompt`,
    ...), `idx` aside; `task_of` turns a row back into the task. Written to a JSONL file, they are a
    dataset for `data.path`: the trainer then plays the taskset's own tasks."""
    import verifiers.v1 as vf

    check_config({"taskset": taskset, "path": path, "taskset_args": taskset_args or {}, **kwargs})
    with _on_path(path):
        vf_env = load(env_config(taskset, taskset_args, **kwargs))
        tasks = vf_env.taskset if limit is None else vf_env.taskset.take(limit)
        rows = []
        for task in tasks:
            data = task.data
            keep = (set(type(data).model_fields) - set(vf.TaskData.model_fields)) | data.model_fields_set
            rows.append(data.model_dump(mode="json", include=keep - {"idx"}))
        return rows


def episode_reward(episode) -> float:
    """verifiers' score of an episode (the sum of its traces' rewards: the one trace of a single-agent
    env), or EpisodeFailed with the status its failure maps to."""
    traces = list(episode.traces)
    if episode.is_timeout or any(t.is_timeout for t in traces):
        stops = sorted({t.stop_condition for t in traces if t.is_timeout} or {"episode_timeout"})
        raise EpisodeFailed("timeout", f"verifiers stopped the episode: {', '.join(stops)}")
    errors = [*episode.errors, *(e for t in traces for e in t.errors)]
    if errors or not episode.ok:
        first = errors[0] if errors else None
        kind = first.type if first is not None else ""
        status = ("agent_error" if kind == "HarnessError" else "disconnected" if kind in _MODEL_ERRORS
                  else "error")
        message = (first.message.strip().splitlines() or [""])[0][:200] if first is not None else "not ok"
        if first is not None and first.status_code is not None:
            kind = f"{kind} (status {first.status_code})"
        raise EpisodeFailed(status, f"verifiers recorded {kind or 'a failure'}: {message}")
    unscored = sorted(name for t in traces for name, r in t.rewards.items() if r is None)
    if unscored:
        raise EpisodeFailed("bad_reward", f"verifiers did not score {', '.join(unscored)}")
    reward = float(sum(t.reward for t in traces))
    if not math.isfinite(reward):
        raise EpisodeFailed("bad_reward", f"verifiers scored {reward}")
    return reward


@register_env("verifiers")
class VerifiersEnvironment(AgentEnvironment):
    """`env.name=verifiers`: a verifiers.v1 environment played through the endpoint.

    taskset: the verifiers taskset id (an installed environment package or importable module exporting
      its `vf.Taskset` subclass in `__all__`, and optionally its own `vf.Harness`/`vf.Env`).
    taskset_args: the taskset config's fields (its `[env.taskset]` block).
    harness / harness_args: the single agent's harness id and its config (default: the taskset's own).
    env_id: a verifiers `Env` id to pair with the taskset (default: the taskset's own, else SingleAgentEnv).
    env_args: merged over the env config (e.g. {"agent": {"timeout": {"rollout": 30}}}); the single
      agent runs on the local `subprocess` runtime unless env_args.agent.runtime says otherwise.
    path: a directory put first on sys.path to import the taskset from (a local environment, not installed).
    timeout_s, chat: as for `env.name=agent` (the episode's own time in all; chat template or text).
    """

    def __init__(self, taskset: str, taskset_args: Mapping | None = None, harness: str = "",
                 harness_args: Mapping | None = None, env_id: str = "", env_args: Mapping | None = None,
                 path: str = "", timeout_s: float = 600.0, chat: bool = True):
        kwargs = dict(taskset=taskset, taskset_args=taskset_args or {}, harness=harness,
                      harness_args=harness_args or {}, env_id=env_id, env_args=env_args or {})
        check_config({**kwargs, "path": path, "timeout_s": timeout_s, "chat": chat})
        vf_log = logging.getLogger("verifiers")
        if vf_log.level == logging.NOTSET:  # a line per rollout at INFO: warnings only, unless set otherwise
            vf_log.setLevel(logging.WARNING)
        if path and os.path.abspath(path) not in sys.path:  # verifiers imports the taskset's modules later too
            sys.path.insert(0, os.path.abspath(path))
        self.vf_env = load(env_config(**kwargs))
        super().__init__(self._play, timeout_s=timeout_s, client="url", chat=chat)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: weakref.finalize | None = None
        self._vf_lock = threading.Lock()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop every episode's verifiers coroutine runs on, inside `Env.serving()` (started once)."""
        with self._vf_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name=_LOOP_THREAD, daemon=True).start()
                serving = self.vf_env.serving()
                asyncio.run_coroutine_threadsafe(serving.__aenter__(), loop).result()
                # Left by close(), or when this object is collected or the interpreter exits (a trainer
                # does not close its environment): verifiers' servers go down before the loop stops.
                self._loop, self._stop = loop, weakref.finalize(self, _stop_serving, loop, serving)
            return self._loop

    def _play(self, url: str, row: dict) -> float:
        """The episode's agent: verifiers' episode of the row's task against our endpoint; its reward."""
        import verifiers.v1 as vf

        server = self._server
        head, _, rest = url.partition("/ep/")
        key = rest.split("/")[0]
        if server is None or server.episodes.get(key) is None:
            raise ConnectionError("the endpoint of this episode is gone")
        task = task_of(self.vf_env.taskset, row)
        # One client config for every episode (verifiers keeps a client per distinct config): the
        # endpoint routes each call by its X-Session-ID header, the trace id registered below.
        ctx = vf.ModelContext(model="policy", client=vf.EvalClientConfig(
            base_url=f"{head}/v1", api_key_var="JAXRL_VERIFIERS_KEY",
            timeout={"connect": None}))  # local: a wait to connect is the trainer busy, not a lost server
        traces: list[str] = []

        def on_trace(trace) -> None:
            traces.append(trace.id)
            server.aliases[trace.id] = key

        future = asyncio.run_coroutine_threadsafe(self.vf_env.run_episode(task, ctx, on_trace=on_trace),
                                                  self._event_loop())
        try:
            episode = future.result()
        finally:
            for trace_id in traces:
                server.aliases.pop(trace_id, None)
        return episode_reward(episode)

    def close(self) -> None:
        """Ends the episodes, leaves verifiers' serving context and stops the loop and the endpoint."""
        super().close()
        with self._vf_lock:
            stop, self._loop, self._stop = self._stop, None, None
        if stop is not None:
            stop()


def _stop_serving(loop: asyncio.AbstractEventLoop, serving) -> None:
    """Leaves verifiers' serving context on its loop, then stops the loop."""
    future = asyncio.run_coroutine_threadsafe(serving.__aexit__(None, None, None), loop)
    future.add_done_callback(lambda _: loop.call_soon_threadsafe(loop.stop))
    if threading.current_thread().name != _LOOP_THREAD:  # (collected on the loop's own thread: no waiting)
        with contextlib.suppress(Exception):
            future.result(timeout=30)
