"""The `openenv` environment (jaxrl_llm/envs/openenv_env.py) against a real OpenEnv server: the guess
environment of tests/openenv_guess_server.py, written with openenv-core's server API and launched by
the adapter as a subprocess on a localhost port (no network beyond localhost).

- an episode through our runner sees what openenv-core's own client sees driving the same server;
- a training run through the trainer (env.name=openenv) equals the same run on the built-in
  guess_digit, which the server reimplements (same seed: same episodes, rewards, metrics);
- faults (a step that raises, hangs past its timeout, returns no text; a killed server) end their
  episode with a named status, counted, the batch goes on; most of a batch failing stops the run in
  one line; a one-session server refuses a batch in one line; bad configs (missing package, no server
  named, an unknown option) are refused at start-up.
"""
import importlib.util
import os
import sys

import numpy as np
import pytest

pytest.importorskip("openenv")  # the `test` extra installs openenv-core

from jaxrl_llm import config as config_lib  # noqa: E402
from jaxrl_llm import envs  # noqa: E402
from jaxrl_llm.trainer import Trainer  # noqa: E402
from test_trainer_multiturn import mt_config  # noqa: E402

APP = "tests.openenv_guess_server:app"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def server():
    """The adapter with the server it launched (closed, and the server stopped, after the module)."""
    env = envs.make_env("openenv", {"app": APP, "reset_columns": ("hidden",), "step_timeout_s": 3.0})
    yield env
    env.close()
    assert env._proc.poll() is not None  # the server launched here is gone


def _reference(base_url, hidden, turns):
    """openenv-core's own client driving the server: (prompt, [(message or None when done, reward)])."""
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url).sync() as client:
        first = client.reset(hidden=hidden)
        out = []
        for t in turns:
            r = client.step({"text": t})
            out.append((None if r.done else r.observation["message"], r.reward))
            if r.done:
                break
    return first.observation["message"], out


def test_episodes_match_the_openenv_client(server):
    """Rows with different hidden digits, scripted turns: prompts, observations and rewards through the
    runner equal the client's on the same server; the schema gave the text fields."""
    assert (server._action_field, server._obs_field) == ("text", "message")
    hidden = [3, 5, 7, 0]
    script = [["5", "5", "5", "x"], ["3", "4", "6", "9"], [None, None, "7", "8"]]
    with envs.EpisodeBatch(server, [{"hidden": np.int64(h)} for h in hidden], max_turns=3) as batch:
        seen = [[] for _ in hidden]
        for turn in script:
            texts = [t if not batch.done[i] else None for i, t in enumerate(turn)]
            obs = batch.step(texts)
            for i, t in enumerate(texts):
                if t is not None:
                    seen[i].append((obs[i], batch.turn_rewards[i][-1]))
        assert batch.prompts == ["guess:"] * len(hidden)
        assert not batch.aborted.any() and batch.metrics()["env/aborted_frac"] == 0
        rewards = batch.episode_rewards()
    for i, h in enumerate(hidden):
        turns = [s[i] for s in script if s[i] is not None]
        prompt, ref = _reference(server.base_url, h, turns)
        assert prompt == "guess:"
        if len(ref) == 3:  # the runner's turn limit ends the episode: nothing to show after the last turn
            ref[-1] = (None, ref[-1][1])
        assert seen[i] == ref, (h, seen[i], ref)
    assert rewards.tolist() == [1.0, 1.0, 1.0, 0.0]  # 3 and 5 found at turn 2, 7 at turn 3, 0 never


def test_action_builder_renderer_and_chat_turns(server):
    """env.kwargs.action builds a typed Action from the turn, env.kwargs.observation renders the reply,
    chat=True gives the prompt and the replies as user messages (a second adapter on the same server)."""
    env = envs.make_env("openenv", {"base_url": server.base_url, "reset_columns": ("hidden",), "chat": True,
                                    "action": "tests.openenv_guess_server:stripped_action",
                                    "observation": "tests.openenv_guess_server:reply_text"})
    try:
        with envs.EpisodeBatch(env, [{"hidden": 2}], max_turns=3) as batch:
            assert batch.prompts == [[{"role": "user", "content": "reply: guess:"}]]
            assert batch.step([" 7 "]) == [[{"role": "user", "content": "reply: <"}]]
            assert batch.step(["2\n"]) == [None] and batch.episode_rewards().tolist() == [1.0]
            assert batch.history[0][-1] == {"role": "assistant", "content": "2\n"}
    finally:
        env.close()
    assert env._proc is None  # nothing launched: the module's server goes on


def test_faults_end_their_episode_with_a_named_status(server):
    """A step that raises on the server, one that hangs past step_timeout_s and one whose observation has
    no text each end their episode (error, timeout, malformed: counted in env/failed/*); the healthy
    episodes go on; more than max_failed_frac failed stops the run in one line naming the cause."""
    with envs.EpisodeBatch(server, [{"hidden": h} for h in (3, 1, 1, 1, 2)], max_turns=3) as batch:
        obs = batch.step(["5", "raise", "hang", "none", "9"])
        assert obs == ["<", None, None, None, "<"]
        assert batch.status == ["", "error", "timeout", "malformed", ""]
        assert "the environment exploded" in batch.last_error[1]
        assert "step_timeout_s=3.0" in batch.last_error[2]
        obs = batch.step(["3", None, None, None, "2"])  # the batch goes on
        assert batch.episode_rewards().tolist() == [1, 0, 0, 0, 1]
        m = batch.metrics()
        assert m["env/aborted_frac"] == pytest.approx(0.6)
        assert [m[f"env/failed/{s}_frac"] for s in envs.FAILURE_STATUSES] == pytest.approx([0.2, 0.2, 0.2, 0, 0, 0, 0])
        batch.check_failures(0.6)  # 3 of 5 is not more than 0.6
        with pytest.raises(envs.EnvironmentFailed, match=r"3 of 5 episodes of a batch failed .*max_failed_frac=0.5"
                           ) as info:
            batch.check_failures(0.5)
        assert "\n" not in str(info.value) and "error" in str(info.value)
        sessions = list(batch.states)
        idle = len(server._idle)
    assert all(s.client is None for s in sessions)
    assert len(server._idle) == idle + 2  # the healthy episodes' sessions serve later resets; the failed are closed


def test_one_session_server_refuses_a_batch_and_a_killed_server_disconnects():
    """openenv-core's default server holds one session: a batch of two episodes stops at the second reset
    with one line saying what to serve; the first episode's session is released and serves the next batch.
    Then the server process dies between turns: the episode ends `disconnected`, naming the exit code, and
    the next batch's reset stops the run with one line."""
    env = envs.make_env("openenv", {"app": APP + "_one_session", "reset_columns": ("hidden",),
                                    "step_timeout_s": 10.0})
    try:
        # refused with CAPACITY_REACHED, or (a loaded machine) the close of the refused session seen first
        with pytest.raises(ValueError, match="reset raised on row 1: (RuntimeError: .*CAPACITY_REACHED|ConnectionError: "
                           ".*a new session, closed by a live server: it may be full;).*the OpenEnv server holds fewer "
                           "sessions than a batch runs episodes .*max_concurrent_envs") as info:
            envs.EpisodeBatch(env, [{"hidden": 3}, {"hidden": 4}], max_turns=3)
        assert "\n" not in str(info.value)
        with envs.EpisodeBatch(env, [{"hidden": 3}], max_turns=3) as batch:
            assert batch.step(["5"]) == ["<"]
            env._proc.kill()
            env._proc.wait()
            assert batch.step(["3"]) == [None]
            assert batch.status == ["disconnected"]
            assert "exited with code -9" in batch.last_error[0]
            with pytest.raises(envs.EnvironmentFailed, match="disconnected 1 here; the most common, disconnected"):
                batch.check_failures(0.5)
        with pytest.raises(ValueError, match="reset raised on row 0: ConnectionError: the OpenEnv server") as info:
            envs.EpisodeBatch(env, [{"hidden": 1}], max_turns=1)
        assert "\n" not in str(info.value)
    finally:
        env.close()


def test_openenv_config_is_checked_at_start_up(monkeypatch):
    """One line naming the field: no server named, both, an unknown module or option, a bad timeout; and
    the package to install when openenv-core is missing."""
    base = mt_config(**{"env.name": "openenv"})
    for kwargs, message in [({}, "give one of env.kwargs.app"),
                            ({"app": APP, "base_url": "http://127.0.0.1:1"}, "give one of env.kwargs.app"),
                            ({"app": "no_such_pkg.server:app"}, "env.kwargs.app='no_such_pkg.server:app': no module"),
                            ({"app": "tests.openenv_guess_server"}, "must be an import path"),
                            ({"base_url": "127.0.0.1:8000"}, "must start with http"),
                            ({"app": APP, "colour": 1}, "env.kwargs do not fit environment 'openenv'"),
                            ({"app": APP, "step_timeout_s": 0}, "env.kwargs.step_timeout_s must be"),
                            ({"app": APP, "reset_columns": "hidden"}, "reset_columns must be a tuple")]:
        c = base.copy_and_resolve_references()
        c.env.kwargs = kwargs
        with pytest.raises(ValueError, match=message) as info:
            config_lib.prepare(c)
        assert "\n" not in str(info.value)
    c = base.copy_and_resolve_references()
    c.env.kwargs = {"app": APP}
    config_lib.prepare(c)
    spec = importlib.util.spec_from_file_location("tiny_openenv", os.path.join(ROOT, "configs", "tiny_openenv.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert config_lib.prepare(module.get_config()).env.kwargs.app == APP  # docs/environments.md's runnable config
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "openenv" else find_spec(name, *a))
    with pytest.raises(ValueError, match=r"needs the openenv-core package: pip install openenv-core$"):
        config_lib.prepare(c)


def test_module_paths_resolve_from_the_working_directory_as_in_the_server(monkeypatch, tmp_path):
    """A config naming `my_pkg.server:app` beside the working directory passes whether or not this process
    put that directory on sys.path (`python -m` does, a console script or plain `pytest` does not), as the
    launched server imports it; sys.path is left as it was."""
    pkg = tmp_path / "my_openenv_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "server.py").write_text("app = object()\ndef act(text):\n    return {'text': text}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path), os.getcwd())])
    before = list(sys.path)
    from jaxrl_llm.envs import openenv_env
    openenv_env.check_config({"app": "my_openenv_pkg.server:app", "action": "my_openenv_pkg.server:act"})
    assert openenv_env._load("action", "my_openenv_pkg.server:act")("x") == {"text": "x"}
    assert sys.path == before
    with pytest.raises(ValueError, match="no module 'my_openenv_pkg.nothing' importable here"):
        openenv_env.check_config({"app": "my_openenv_pkg.nothing:app"})


def test_a_training_run_on_the_openenv_server_equals_guess_digit(server, tmp_path):
    """Two steps of the tiny multi-turn run with env.name=openenv (the module's server, at its URL) and the
    same run on the built-in guess_digit: the same episodes, so the same rewards, env metrics, loss and
    gradient norm."""
    runs = {}
    for name, kwargs in [("openenv", {"base_url": server.base_url, "reset_columns": ("hidden",)}),
                         ("guess_digit", {})]:
        # 32 episodes a step; seed 3: some find the digit (the rewards are not all zero)
        c = mt_config(**{"env.name": name, "rollout.group_size": 8, "seed": 3})
        c.env.kwargs = kwargs
        runs[name] = Trainer(c, str(tmp_path / name)).run()
    keys = [k for k in runs["guess_digit"][-1] if k.startswith(("env/", "reward/", "policy/", "response_length/"))]
    assert {"env/reward/mean", "env/turns/mean", "policy/loss", "policy/grad_norm"} <= set(keys), keys
    assert runs["openenv"][0]["env/reward/mean"] > 0 and runs["openenv"][0]["policy/grad_norm"] > 0
    for a, b in zip(runs["openenv"], runs["guess_digit"]):
        assert {k: a[k] for k in keys} == pytest.approx({k: b[k] for k in keys}, abs=1e-6)
    assert runs["openenv"][-1]["env/failed/error_frac"] == 0
