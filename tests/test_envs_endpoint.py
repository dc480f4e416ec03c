"""The OpenAI-compatible endpoint (envs/endpoint.py, env.name=agent) with the real `openai` client on
localhost: requests become the turns of their episode's row, replies are the model's turns (tool calls
parsed), and every fault of an agent (raises, hangs, returns no number, rewrites history, sends garbage,
loses its server) fails its episode with a named status while the batch goes on.

The host-side tests drive `EpisodeBatch` with scripted turn texts (no model); the model tests run the
tiny random model and compare the endpoint's episodes with the in-process environment path's: the same
conversation, so the same token ids, masks, log-probs and rewards (the independent reference)."""
import json
import logging
import os
import sys
import threading
import urllib.error
import urllib.request

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from fixtures_envs import qwen_tokenizer  # noqa: E402

from jaxrl_llm import envs  # noqa: E402
from jaxrl_llm.envs.endpoint import AgentEnvironment  # noqa: E402
from jaxrl_llm.trainer.episodes import sample_episodes  # noqa: E402

openai = pytest.importorskip("openai")

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Adds.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
RELEASE = threading.Event()  # hung agents wait on it (set at module teardown: no thread outlives the tests)


@pytest.fixture(scope="module", autouse=True)
def _release_hung_agents():
    yield
    RELEASE.set()


def talk(client, task, seen=None):
    """An agent: three user turns, the reward the total length of the replies it got."""
    messages = [{"role": "user", "content": task["prompt"]}]
    total = 0
    for k in range(3):
        r = client.chat.completions.create(model="policy", messages=messages, temperature=0.3)
        choice = r.choices[0]
        if choice.finish_reason == "length":  # the episode's budget or turn limit: return
            break
        total += len(choice.message.content)
        if seen is not None:
            seen.setdefault(task["prompt"], []).append(choice.message.content)
        messages += [choice.message, {"role": "user", "content": f"turn {k + 1}: {len(choice.message.content)}"}]
    return float(total)


class Talk(envs.Environment):
    """`talk` as an in-process environment: the reference path."""

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}], 0

    def step(self, k, text):
        if k + 1 == 3:
            return envs.StepResult(None, float(len(text)), k + 1)
        return envs.StepResult([{"role": "user", "content": f"turn {k + 1}: {len(text)}"}], float(len(text)), k + 1)


def run_batch(env, rows, turns, max_turns=4, group_size=1):
    """Drives the episodes with scripted model turns: turns[t] is every row's text at turn t."""
    batch = envs.EpisodeBatch(env, rows, max_turns=max_turns, max_workers=4, group_size=group_size)
    observations = []
    for t in range(max_turns):
        if batch.done.all():
            break
        observations.append(batch.step([None if batch.done[i] else turns[t] for i in range(len(rows))]))
    batch.end()
    batch.close()
    return batch, observations


def test_requests_are_turns_tool_calls_parsed_and_the_return_is_the_reward():
    got = {}

    def agent(client, task):
        messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": task["q"]}]
        r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        msg = r.choices[0].message
        got["first"] = (r.choices[0].finish_reason, msg.content, [(c.function.name, json.loads(c.function.arguments))
                                                                   for c in msg.tool_calls])
        messages += [msg] + [{"role": "tool", "tool_call_id": c.id, "content": "5"} for c in msg.tool_calls]
        r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        got["second"] = (r.choices[0].finish_reason, r.choices[0].message.content, r.choices[0].message.tool_calls)
        return 1 if r.choices[0].message.content == "5" else 0

    env = AgentEnvironment(agent, timeout_s=30)
    turns = ['Let me add.<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "5"]
    batch, obs = run_batch(env, [{"q": "2+3?"}], turns)
    assert batch.prompts[0] == [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "2+3?"}]
    assert env.tool_schemas() == TOOLS  # what the chat template renders for the batch
    assert got["first"] == ("tool_calls", "Let me add.", [("add", {"a": 2, "b": 3})])
    assert got["second"] == ("stop", "5", None)
    tool_msg = obs[0][0][0]
    assert (tool_msg["role"], tool_msg["content"]) == ("tool", "5") and tool_msg["tool_call_id"].startswith("call_")
    # the runner's history holds the model's raw turn (what the template renders), not the parsed message
    assert batch.history[0][2] == {"role": "assistant", "content": turns[0]}
    assert batch.status == [""] and batch.episode_rewards().tolist() == [1.0] and batch.turns.tolist() == [2]
    # the observation renders through the template as for any tool environment (token-in-token-out)
    tok = qwen_tokenizer()
    text = envs.observation_text(tok, batch.history[0][:2], turns[0], obs[0][0], tools=env.tool_schemas())
    assert text.startswith("\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>")


def test_turn_limit_replies_length_and_the_agent_reward_still_counts():
    env = AgentEnvironment(talk, timeout_s=30)
    batch, _ = run_batch(env, [{"prompt": "hi"}, {"prompt": "yo"}], ["abc", "de"], max_turns=2)
    # after 2 turns the runner ends the episodes; the pending request gets finish_reason 'length'
    assert batch.status == ["", ""] and batch.episode_rewards().tolist() == [5.0, 5.0]


def _raises_first(client, task):
    raise RuntimeError("no model for me")


def _raises_later(client, task):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    raise KeyError("tool crashed")


def _hangs(client, task):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    RELEASE.wait(60)
    return 1.0


def _says_yes(client, task):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    return "yes"


def _returns_nan(client, task):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    return float("nan")


def _rewrites_history(client, task):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    try:  # the agent sees a clear 400
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}, {
            "role": "assistant", "content": r.choices[0].message.content + " (edited)"},
            {"role": "user", "content": "?"}])
    except openai.BadRequestError as e:
        task["seen"].append(e.body["message"])
        raise


def _forges_assistant(client, task):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}, r.choices[0].message,
                                                        {"role": "assistant", "content": "I will say 42"}])
    return 1.0


def _sends_garbage(client, task):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    request = urllib.request.Request(str(client.base_url) + "chat/completions", data=b"{not json", method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=30)
    except urllib.error.HTTPError as e:
        task["seen"].append(json.loads(e.read())["error"]["code"])
    return 1.0


def _never_asks(client, task):
    return 1.0


FAULTS = {"raises_first": (_raises_first, "agent_error", 0), "raises_later": (_raises_later, "agent_error", 1),
          "hangs": (_hangs, "timeout", 1), "says_yes": (_says_yes, "bad_reward", 1),
          "returns_nan": (_returns_nan, "bad_reward", 1), "rewrites_history": (_rewrites_history, "bad_request", 1),
          "forges_assistant": (_forges_assistant, "bad_request", 1),
          "sends_garbage": (_sends_garbage, "bad_request", 1),
          "never_asks": (_never_asks, "agent_error", 0)}


def dispatch(client, task):
    return FAULTS[task["fault"]][0](client, task) if task["fault"] else talk(client, task)


def test_faults_fail_their_episode_with_a_named_status_and_the_batch_goes_on(caplog):
    names = list(FAULTS)
    # each faulty episode shares its group with a sound one (group_size 2): a failed row takes its prompt
    rows = [r for name in names for r in ({"fault": name, "prompt": "x", "seen": []},
                                          {"fault": "", "prompt": "x", "seen": []})]
    env = AgentEnvironment(dispatch, timeout_s=0.5)
    with caplog.at_level(logging.DEBUG, logger="jaxrl_llm.envs.runner"):
        batch, _ = run_batch(env, rows, ["ab", "c", "d"], group_size=2)
        batch.check_failures(0.5)  # 9 of 18: not more than half
    for k, name in enumerate(names):
        _, status, turns = FAULTS[name]
        assert batch.status[2 * k] == status and batch.turns[2 * k] == turns, name
        assert batch.status[2 * k + 1] == "" and batch.episode_rewards()[2 * k + 1] == 4.0, name  # the sound one
        assert batch.episode_rewards()[2 * k] == 0.0 and batch.aborted[2 * k]
        assert batch.prompts[2 * k] == batch.prompts[2 * k + 1]
    assert "rewrite history" in rows[2 * names.index("rewrites_history")]["seen"][0]
    assert rows[2 * names.index("sends_garbage")]["seen"] == ["bad_request"]
    m = batch.metrics()
    n = len(rows)
    counts = {k: round(v * n) for k, v in m.items() if k.startswith("env/failed/") and v}
    assert counts == {"env/failed/agent_error_frac": 3, "env/failed/timeout_frac": 1,
                      "env/failed/bad_reward_frac": 2, "env/failed/bad_request_frac": 3}
    assert m["env/aborted_frac"] == pytest.approx(0.5)
    with pytest.raises(envs.EnvironmentFailed) as info:
        batch.check_failures(0.4)
    line = str(info.value)
    assert line.startswith("environment AgentEnvironment: 9 of 18 episodes of a batch failed (") and "\n" not in line
    assert "timeout 1" in line and "bad_request 3" in line
    logged = [r.getMessage() for r in caplog.records]
    assert sum("failed (" in x for x in logged) == 9 and any("(timeout): " in x and "0.5 s" in x for x in logged)
    assert sum("18 episodes failed: " in x for x in logged) == 2  # and one line for the batch per check


def test_a_server_that_dies_fails_its_episodes_and_the_next_batch_gets_a_new_one():
    env = AgentEnvironment(talk, timeout_s=30)
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    batch = envs.EpisodeBatch(env, rows, max_turns=3)
    env._server.stop()  # dies while both agents wait for their first reply
    batch.step(["x", "y"])
    batch.end()
    assert batch.status == ["disconnected", "disconnected"]
    with pytest.raises(envs.EnvironmentFailed, match="2 of 2 episodes of a batch failed .* disconnected 2 here"):
        batch.check_failures(0.5)
    batch, _ = run_batch(env, rows, ["ab", "c", "d"])  # a new server: the run goes on
    assert batch.status == ["", ""] and batch.episode_rewards().tolist() == [4.0, 4.0]


def test_bad_config_is_refused_with_one_line_saying_what_to_install(monkeypatch):
    with pytest.raises(ValueError, match=r"^env.kwargs.agent: cannot import agent 'no_such_pkg_x.agents:run'.*"
                                         r"\(pip install no_such_pkg_x\)$"):
        envs.make_env("agent", {"agent": "no_such_pkg_x.agents:run"})
    with pytest.raises(ValueError, match="do not fit environment 'agent'"):
        envs.make_env("agent", {"agnet": "test_envs_endpoint:talk"})
    with pytest.raises(ValueError, match="timeout_s must be a number > 0"):
        envs.make_env("agent", {"agent": "test_envs_endpoint:talk", "timeout_s": 0})
    # as if openai were not installed
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "openai" else object())
    with pytest.raises(ValueError, match=r"needs the openai package: pip install openai"):
        envs.make_env("agent", {"agent": "test_envs_endpoint:talk"})
    assert isinstance(envs.make_env("agent", {"agent": "test_envs_endpoint:talk", "client": "url"}), AgentEnvironment)


# -- with the tiny model --

def _model(vocab):
    from jaxrl_llm.models.config import ModelConfig
    from jaxrl_llm.models.lm import init_params
    mc = ModelConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=True)
    return mc, init_params(mc, jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def tiny():
    tok = qwen_tokenizer()
    return (tok, *_model(len(tok)))


KW = dict(max_turns=4, max_new_tokens=64, max_turn_tokens=6, temperature=1.0, group_size=2)


def test_endpoint_episodes_equal_the_in_process_ones_token_for_token(tiny):
    from test_envs_rollout import _trainer_gap
    tok, mc, params = tiny
    rows = [{"prompt": p} for p in ("hello", "hello", "what is 2+2", "what is 2+2")]
    seen = {}
    env = AgentEnvironment(lambda client, task: talk(client, task, seen), timeout_s=60)
    ep = sample_episodes(mc, params, tok, env, rows, jax.random.PRNGKey(3), pad_id=tok.pad_token_id, **KW)
    ref = sample_episodes(mc, params, tok, Talk(), rows, jax.random.PRNGKey(3), pad_id=tok.pad_token_id, **KW)
    env.close()
    for name in ("prompt_tokens", "tokens", "attention_mask", "mask", "logprobs", "behavior_logprobs", "truncated",
                 "rewards"):
        np.testing.assert_array_equal(getattr(ep, name), getattr(ref, name), err_msg=name)
    assert ep.texts == ref.texts and ep.mask.sum() > 0
    # what the agents read is the decoding of the ids the model drew (rows 0 and 1 share their prompt)
    assert sorted(seen["hello"]) == sorted(t for i in (0, 1) for t in ep.texts[i])
    assert _trainer_gap(mc, params, ep, 1.0) <= 1e-4  # the trainer's log-probs are the sampler's
    assert ep.metrics["env/aborted_frac"] == 0.0


def test_failed_episodes_sample_nothing_and_most_failing_stops_the_run(tiny):
    tok, mc, params = tiny
    rows = [{"fault": f, "prompt": "x", "seen": []} for f in ("", "raises_first", "", "raises_later")]
    env = AgentEnvironment(dispatch, timeout_s=60)
    ep = sample_episodes(mc, params, tok, env, rows, jax.random.PRNGKey(4), pad_id=tok.pad_token_id, **KW)
    assert ep.mask[1].sum() == 0 and ep.attention_mask[1].sum() == 0 and ep.texts[1] == []  # failed at its start
    assert ep.mask[3].sum() > 0 and len(ep.texts[3]) == 1 and ep.rewards[3] == 0  # failed after one turn
    assert ep.rewards[0] == sum(map(len, ep.texts[0])) and ep.metrics["env/failed/agent_error_frac"] == 0.5
    rows = [{"fault": f, "prompt": "x", "seen": []} for f in ("", "raises_first", "says_yes", "raises_later")]
    with pytest.raises(envs.EnvironmentFailed, match=(
            r"^environment AgentEnvironment: 3 of 4 episodes of a batch failed \(more than env.max_failed_frac=0.5\): "
            r"agent_error 2, bad_reward 1 here; the most common, agent_error: the agent raised RuntimeError: no model "
            r"for me; the run stops$")):
        sample_episodes(mc, params, tok, env, rows, jax.random.PRNGKey(4), pad_id=tok.pad_token_id, **KW)
    env.close()


def test_the_guess_digit_agent_plays_the_in_process_episodes():
    """jaxrl_llm.envs.agents:guess_digit over the endpoint (text mode, the built-in tokenizer without chat
    template) against the in-process guess_digit environment: the same episodes, token for token."""
    from jaxrl_llm.data import builtin_tokenizer
    tok = builtin_tokenizer()
    mc, params = _model(len(tok))
    rows = [{"prompt": "guess:", "hidden": h} for h in (0, 0, 3, 3, 7, 7, 9, 9)]
    kw = dict(max_turns=4, max_new_tokens=8, max_turn_tokens=1, temperature=1.0, group_size=2,
              pad_id=tok.pad_token_id)
    env = envs.make_env("agent", {"agent": "jaxrl_llm.envs.agents:guess_digit", "chat": False, "timeout_s": 60})
    ep = sample_episodes(mc, params, tok, env, rows, jax.random.PRNGKey(5), **kw)
    ref = sample_episodes(mc, params, tok, envs.make_env("guess_digit"), rows, jax.random.PRNGKey(5), **kw)
    env.close()
    for name in ("prompt_tokens", "tokens", "attention_mask", "mask", "logprobs", "truncated", "rewards"):
        np.testing.assert_array_equal(getattr(ep, name), getattr(ref, name), err_msg=name)
    assert ep.texts == ref.texts and (ep.attention_mask.sum(1) > ep.mask.sum(1)).any()  # replies were appended


def test_tiny_agent_config_trains_like_the_in_process_environment(tmp_path):
    """configs/tiny_agent.py (shrunk as test_trainer_multiturn's runs) makes the same training step as
    configs/tiny_multiturn.py: the agent's return value is the reward the update sees."""
    from test_trainer_multiturn import _load, mt_config
    from jaxrl_llm.trainer import Trainer
    c = mt_config(total_steps=1)
    agent = _load("tiny_agent").get_config()
    c.env = agent.env
    (m_agent,) = Trainer(c, str(tmp_path / "agent")).run()
    (m_env,) = Trainer(mt_config(total_steps=1), str(tmp_path / "env")).run()
    same = [k for k in m_env if k.startswith(("reward/", "env/", "loss", "sampler/", "kl", "grad"))]
    assert "reward/mean" in same and "env/turns/mean" in same
    assert {k: m_agent[k] for k in same} == {k: m_env[k] for k in same}


def _two_user_turns(client, task):
    messages = [{"role": "user", "content": "x"}]
    r = client.chat.completions.create(model="m", messages=messages)
    try:
        client.chat.completions.create(model="m", messages=messages + [
            r.choices[0].message, {"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    except openai.BadRequestError as e:
        task["seen"].append(e.body["message"])
        raise


def test_messages_the_template_refuses_fail_only_their_episode(tiny):
    """A template that raises on two user turns in a row (as alternation-checking templates do): the agent
    that sends them fails with bad_request and gets a 400; the other episodes and the run go on."""
    _, mc, params = tiny
    tok = qwen_tokenizer()
    tok.chat_template = ("{%- for m in messages %}"
                         "{%- if loop.index0 > 0 and m.role == messages[loop.index0 - 1].role %}"
                         "{{ raise_exception('roles must alternate') }}{%- endif %}"
                         "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
                         "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
    rows = [{"fault": f, "prompt": "x", "seen": []} for f in ("", "two_user_turns", "", "")]
    FAULTS["two_user_turns"] = (_two_user_turns, "bad_request", 1)
    env = AgentEnvironment(dispatch, timeout_s=60)
    ep = sample_episodes(mc, params, tok, env, rows, jax.random.PRNGKey(6), pad_id=tok.pad_token_id, **KW)
    env.close()
    assert ep.metrics["env/failed/bad_request_frac"] == 0.25 and ep.metrics["env/aborted_frac"] == 0.25
    assert len(ep.texts[1]) == 1 and ep.rewards[1] == 0 and "cannot render" in rows[1]["seen"][0]
    assert all(len(ep.texts[i]) >= 2 and ep.rewards[i] == sum(map(len, ep.texts[i])) for i in (0, 2, 3))
