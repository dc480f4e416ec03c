"""`env.name=verifiers` (jaxrl_llm/envs/verifiers_env.py): a verifiers.v1 environment -- the guess task of
tests/verifiers_guess.py, written with verifiers' public API (taskset, in-process harness, rubric) --
played by the policy through the endpoint of envs/endpoint.py, offline (localhost only).

- its episodes are the in-process guess_digit's, token for token (multi-turn: the harness answers each
  guess), and their rewards are verifiers' own scoring of the same completions: verifiers' own episode
  loop, pointed at a server replaying the completions our model drew, scores each one the same;
- configs/tiny_verifiers.py trains two steps exactly as configs/tiny_multiturn.py (the rubric's `found`
  is guess_digit's reward);
- the taskset's own tasks, as rows (`taskset_rows`) read back through a JSONL dataset, are the same tasks;
- faults (a harness that raises or hangs past verifiers' timeout, a rubric that raises) end their episode
  with a named status, the batch goes on; bad configs are refused at start-up in one line.
"""
import http.server
import json
import os
import sys
import threading

import jax
import numpy as np
import pytest

pytest.importorskip("verifiers")  # the `test` extra installs verifiers

sys.path.insert(0, os.path.dirname(__file__))
from jaxrl_llm import config as config_lib  # noqa: E402
from jaxrl_llm import envs  # noqa: E402
from jaxrl_llm.envs import verifiers_env  # noqa: E402
from jaxrl_llm.trainer.episodes import sample_episodes  # noqa: E402

TESTS = os.path.dirname(os.path.abspath(__file__))
RUBRIC = {"task": {"rewards": {"digits": {"weight": 0.25}}}}  # verifiers' config plugs the weight
KW = dict(max_turns=4, max_new_tokens=8, max_turn_tokens=1, temperature=1.0, group_size=2)


def make(**kwargs):
    return envs.make_env("verifiers", {"taskset": "verifiers_guess", "path": TESTS, "chat": False,
                                       "timeout_s": 60, **kwargs})


def _replay_server(texts):
    """An OpenAI-compatible server replaying recorded completions: episode i's n-th call gets texts[i][n],
    and `finish_reason: "length"` past them (as our endpoint answers once the turn limit is reached)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            turns = texts[int(self.path.split("/")[2])]
            n = sum(m["role"] == "assistant" for m in body["messages"])
            text, reason = (turns[n], "stop") if n < len(turns) else ("", "length")
            data = json.dumps({"id": "r", "object": "chat.completion", "created": 0, "model": "policy", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _verifiers_scores(texts, rows):
    """verifiers' own episode loop and scoring (Env.run_episode: harness, interception, rubric) on the
    completions of `texts`: each episode's traces' reward and its per-reward scores."""
    import asyncio

    import verifiers.v1 as vf

    server = _replay_server(texts)
    env = verifiers_env.load(verifiers_env.env_config("verifiers_guess", RUBRIC))
    port = server.server_address[1]

    async def run():
        async with env.serving():
            return await asyncio.gather(*(env.run_episode(
                verifiers_env.task_of(env.taskset, row),
                vf.ModelContext(model="policy", client=vf.EvalClientConfig(
                    base_url=f"http://127.0.0.1:{port}/ep/{i}/v1", api_key_var="JAXRL_NO_KEY")))
                for i, row in enumerate(rows)))

    try:
        episodes = asyncio.run(run())
    finally:
        server.shutdown()
        server.server_close()
    assert all(e.ok for e in episodes)
    return ([e.traces[0].reward for e in episodes],
            [{k: r.score for k, r in e.traces[0].rewards.items()} for e in episodes])


def test_episodes_are_guess_digits_and_rewards_are_verifiers_own_scores():
    from jaxrl_llm.data import builtin_tokenizer
    from test_envs_endpoint import _model
    tok = builtin_tokenizer()
    mc, params = _model(len(tok))
    rows = [{"prompt": "guess:", "hidden": h} for h in (0, 0, 3, 3, 7, 7, 9, 9)]
    env = make(taskset_args=RUBRIC)
    ep = sample_episodes(mc, params, tok, env, rows, jax.random.PRNGKey(0), pad_id=tok.pad_token_id, **KW)
    env.close()
    ref = sample_episodes(mc, params, tok, envs.make_env("guess_digit"), rows, jax.random.PRNGKey(0),
                          pad_id=tok.pad_token_id, **KW)
    for name in ("prompt_tokens", "tokens", "attention_mask", "mask", "logprobs", "truncated"):
        np.testing.assert_array_equal(getattr(ep, name), getattr(ref, name), err_msg=name)
    assert ep.texts == ref.texts and ep.metrics["env/aborted_frac"] == 0.0
    assert max(map(len, ep.texts)) >= 2 and (ep.attention_mask.sum(1) > ep.mask.sum(1)).any()  # multi-turn
    rewards, scores = _verifiers_scores(ep.texts, rows)
    np.testing.assert_allclose(ep.rewards, rewards, rtol=0, atol=1e-6)
    # both rubric entries count: `found` is guess_digit's reward, `digits` (weight 0.25) adds to it
    assert [s["found"] for s in scores] == ref.rewards.tolist()
    assert 1.0 in ref.rewards.tolist() and any(0 < s["digits"] < 1 for s in scores) and len(set(rewards)) > 2


def test_tiny_verifiers_config_trains_like_the_in_process_environment(tmp_path):
    """configs/tiny_verifiers.py (shrunk as test_trainer_multiturn's runs) makes the same two training steps
    as configs/tiny_multiturn.py: verifiers' score is the reward the update sees."""
    from test_trainer_multiturn import _load, mt_config
    from jaxrl_llm.trainer import Trainer
    vf_config = _load("tiny_verifiers").get_config()
    assert vf_config.env.name == "verifiers" and vf_config.data.task == "guess_digit"
    c = mt_config(total_steps=2)
    c.env = vf_config.env
    c.env.kwargs.path = TESTS  # the config names tests/ relative to the repository root
    got = Trainer(c, str(tmp_path / "vf")).run()
    want = Trainer(mt_config(total_steps=2), str(tmp_path / "env")).run()
    assert len(got) == len(want) == 2
    for m_vf, m_env in zip(got, want):
        same = [k for k in m_env if k.startswith(("reward/", "env/", "loss", "sampler/", "kl", "grad"))]
        assert "reward/mean" in same and "env/turns/mean" in same
        assert {k: m_vf[k] for k in same} == {k: m_env[k] for k in same}


def test_taskset_rows_are_a_dataset_of_its_own_tasks(tmp_path):
    """verifiers_env.taskset_rows: the taskset's tasks as JSONL rows; read back as a dataset, each row is
    its task again (its data field for field)."""
    import datasets
    rows = verifiers_env.taskset_rows("verifiers_guess", path=TESTS)
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = datasets.load_dataset("json", data_files=str(path), split="train")
    env = verifiers_env.load(verifiers_env.env_config("verifiers_guess"))
    tasks = list(env.taskset)
    assert len(loaded) == len(tasks) == 10 and loaded.column_names == ["prompt", "hidden", "fault"]
    for row, task in zip(loaded, tasks):
        assert verifiers_env.task_of(env.taskset, row).data == task.data.model_copy(update={"idx": None})
    assert verifiers_env.taskset_rows("verifiers_guess", limit=2, path=TESTS) == rows[:2]


def _run_batch(env, rows, turns):
    batch = envs.EpisodeBatch(env, rows, max_turns=4, max_workers=8)
    for t in range(4):
        if batch.done.all():
            break
        batch.step([None if batch.done[i] else turns[t] for i in range(len(rows))])
    batch.end()
    return batch


def test_faults_fail_their_episode_with_a_named_status_and_the_batch_goes_on():
    """The hanging harness has a 2 s agent timeout of its own (its task data's, verifiers' per-task
    override): verifiers' stage timeouts count the time its model calls wait, and a batch's turn waits
    for its slowest episode, so a timeout for every episode would stop the ones waiting on the hang too."""
    env = make()
    faults = ["", "harness_raises", "harness_hangs", "scoring_raises", ""]
    rows = [{"prompt": "guess:", "hidden": 7, "fault": f} for f in faults]
    rows[2]["timeout"] = {"agent": 2.0}
    batch = _run_batch(env, rows, ["5", "7", "3", "3"])
    env.close()
    assert batch.status == ["", "agent_error", "timeout", "error", ""]
    assert batch.episode_rewards().tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]  # the others found 7 at turn 2
    assert batch.turns.tolist() == [2, 0, 1, 2, 2]  # the raising harness never called the model
    m = batch.metrics()
    assert m["env/failed/agent_error_frac"] == m["env/failed/timeout_frac"] == m["env/failed/error_frac"] == 0.2
    assert "the harness broke" in batch.last_error[1] and "agent_timeout" in batch.last_error[2]
    assert "the rubric cannot read this trace" in batch.last_error[3]


def test_bad_config_is_refused_at_start_up_in_one_line(monkeypatch):
    from test_trainer_multiturn import mt_config

    def check(**kwargs):
        c = mt_config(**{"env.name": "verifiers"})
        c.env.kwargs = kwargs
        with pytest.raises(ValueError) as e:
            config_lib.prepare(c)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert check(taskset="no_such_env") == (
        "config.env.kwargs.taskset='no_such_env': no module 'no_such_env' importable here (a verifiers taskset "
        "id is a top-level module: install the environment's package, or set env.kwargs.path to the directory "
        "holding it)")
    assert check(taskset="") .startswith("config.env.kwargs.taskset must name a verifiers taskset")
    assert check(taskset="verifiers_guess", path="/no/such/dir").startswith("config.env.kwargs.path must be")
    assert check(taskset="verifiers_guess", path=TESTS, taskset_args=3).startswith(
        "config.env.kwargs.taskset_args must be a mapping")
    with pytest.raises(ValueError, match=r"^config.env.kwargs: verifiers refused the env config of taskset "
                                         r"'verifiers_guess': agent.runtime"):
        make(env_args={"agent": {"runtime": {"type": "no_such_runtime"}}})
    with pytest.raises(ValueError, match=r"^config.env.kwargs do not fit environment 'verifiers': "):
        make(no_such_option=1)
    real = verifiers_env.importlib.util.find_spec
    monkeypatch.setattr(verifiers_env.importlib.util, "find_spec",
                        lambda name, *a: None if name == "verifiers" else real(name, *a))
    assert check(taskset="verifiers_guess") == (
        "config.env.name='verifiers' needs the verifiers package: pip install verifiers (or pip install "
        "'jaxrl_llm[verifiers]')")
