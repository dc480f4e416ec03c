"""Tool calling: parsing both formats (hand-worked cases, a round-trip property, malformed input), the
tools' schemas through a chat template, and ToolEnvironment attacked like a policy would."""
import json
import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from fixtures_envs import llama3_tokenizer, qwen_tokenizer  # noqa: E402

from jaxrl_llm import envs  # noqa: E402
from jaxrl_llm.envs import EpisodeBatch, ToolCall, ToolEnvironment, parse_tool_calls  # noqa: E402


def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def shout(text: str, times: int = 1) -> str:
    """Repeats a text in upper case.

    Args:
        text: What to shout.
        times: How many times.
    """
    return text.upper() * times


def explode(why: str) -> str:
    """Always fails.

    Args:
        why: The reason.
    """
    raise RuntimeError(f"exploded: {why}")


def nap(seconds: float) -> str:
    """Sleeps.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "rested"


def hermes(name, args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


# ----------------------------------------------------------------------------- parsing


def test_hand_worked_hermes_and_llama3_calls():
    text = "Let me compute.\n" + hermes("add", {"a": 1, "b": 2}) + "\n" + hermes("shout", {"text": "hi"})
    assert parse_tool_calls(text) == ([ToolCall("add", {"a": 1, "b": 2}), ToolCall("shout", {"text": "hi"})], [])
    llama = '<|python_tag|>{"name": "add", "parameters": {"a": 3, "b": 4}}; {"name": "shout", "parameters": {"text": "x"}}'
    assert parse_tool_calls(llama) == ([ToolCall("add", {"a": 3, "b": 4}), ToolCall("shout", {"text": "x"})], [])
    assert parse_tool_calls('{"name": "add", "parameters": {"a": 1, "b": 1}}') == ([ToolCall("add", {"a": 1, "b": 1})], [])
    # arguments given as a JSON string (some models do), and no arguments at all
    assert parse_tool_calls(hermes("add", '{"a": 5, "b": 6}'))[0] == [ToolCall("add", {"a": 5, "b": 6})]
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>')[0] == [ToolCall("now", {})]
    assert parse_tool_calls("The answer is 42.") == ([], [])
    assert parse_tool_calls('The answer is {"a": 1}', fmt="hermes") == ([], [])


@pytest.mark.parametrize("text, error", [
    ('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>', "not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', "with a string 'name'"),
    ('<tool_call>["add", 1]</tool_call>', "with a string 'name'"),
    ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}', "never closed"),
    ('<tool_call><tool_call>{"name": "add", "arguments": {}}</tool_call></tool_call>', "nested"),
    ('<|python_tag|>{"name": "add", "parameters": {"a": 1', "not valid JSON"),
    ("<tool_call>" + "[" * 30000 + "</tool_call>", "longer than"),
])
def test_malformed_calls_give_errors_not_exceptions(text, error):
    calls, errors = parse_tool_calls(text)
    assert not calls and len(errors) == 1 and error in errors[0]


def test_one_bad_call_does_not_hide_the_good_ones_and_calls_are_capped():
    text = hermes("add", {"a": 1, "b": 2}) + "<tool_call>{oops}</tool_call>" + hermes("add", {"a": 2, "b": 2})
    calls, errors = parse_tool_calls(text)
    assert [c.arguments["a"] for c in calls] == [1, 2] and len(errors) == 1
    calls, errors = parse_tool_calls('{"name": "add", "parameters": {}} trailing words')  # Llama 3: the call runs
    assert calls == [ToolCall("add", {})] and len(errors) == 1 and "not valid JSON" in errors[0]
    calls, errors = parse_tool_calls(hermes("add", {"a": 0, "b": 0}) * 50, max_calls=3)
    assert len(calls) == 3 and errors == ["too many tool calls in one turn (50); only the first 3 were run"]


def test_parsing_round_trips_random_calls_in_both_formats():
    """Property: calls rendered in either format (with random prose around Hermes calls) parse back."""
    rng = np.random.default_rng(0)
    words = ["x", "é", "<b>", "}{", '"q"', "\\n", "tool_call", "😀"]
    for _ in range(200):
        calls = [ToolCall(f"f{rng.integers(100)}", {f"k{j}": (str(rng.choice(words)) if rng.random() < 0.5
                                                          else int(rng.integers(-9, 9)))
                                                   for j in range(rng.integers(0, 3))})
                 for _ in range(rng.integers(1, 4))]
        prose = [str(rng.choice(words)) for _ in range(len(calls) + 1)]
        text = prose[0] + "".join(hermes(c.name, c.arguments) + p for c, p in zip(calls, prose[1:]))
        assert parse_tool_calls(text, max_calls=9) == (calls, [])
        llama = "<|python_tag|>" + "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}) for c in calls)
        assert parse_tool_calls(llama, max_calls=9) == (calls, [])


# ----------------------------------------------------------------------------- ToolEnvironment


@pytest.fixture(scope="module")
def env():
    return ToolEnvironment([add, shout, explode, nap], max_calls_per_turn=3, max_output_chars=50, tool_timeout_s=0.3)


def _step(env, text):
    _, state = env.reset({"prompt": "q"})
    return env.step(state, text)


def test_schemas_come_from_transformers_and_render_through_the_template(env):
    from transformers.utils import get_json_schema
    assert env.tool_schemas()[0] == get_json_schema(add)
    for tok in (qwen_tokenizer(), llama3_tokenizer()):
        text = tok.decode(envs.prompt_ids(tok, [{"role": "user", "content": "2+2?"}], env.tool_schemas()))
        assert '"name": "shout"' in text and "Repeats a text in upper case." in text


def test_a_good_call_returns_its_result_as_a_tool_message(env):
    r = _step(env, "Sure. " + hermes("add", {"a": 2, "b": 40}))
    assert r.observation == [{"role": "tool", "name": "add", "content": "42"}]
    assert r.info == {"tool_calls": 1, "errors": 0} and r.state["tool_calls"] == 1 and r.reward is None


def test_an_answer_without_calls_ends_the_episode(env):
    r = _step(env, "The answer is 42.")
    assert r.done and r.info["tool_calls"] == 0


@pytest.mark.parametrize("call, message", [
    (("nope", {}), "unknown tool 'nope'; tools: add, explode, nap, shout"),
    (("add", {"a": 1}), "bad arguments for tool 'add': missing a required argument: 'b'"),
    (("add", {"a": 1, "b": 2, "c": 3}), "bad arguments for tool 'add': got an unexpected keyword argument 'c'"),
    (("add", {"a": "1", "b": 2}), "argument 'a' of tool 'add' must be of JSON type integer"),
    (("add", {"a": True, "b": 2}), "argument 'a' of tool 'add' must be of JSON type integer"),
    (("explode", {"why": "because"}), "tool 'explode' raised RuntimeError: exploded: because"),
    (("nap", {"seconds": 5}), "tool 'nap' did not return within 0.3 s"),
])
def test_every_bad_call_is_an_error_observation(env, call, message):
    r = _step(env, hermes(*call))
    assert not r.done and r.info["errors"] == 1
    assert r.observation[0]["content"].startswith("error: " + message)


def test_attacks_huge_output_many_calls_calls_after_the_answer(env):
    r = _step(env, hermes("shout", {"text": "ab", "times": 10_000}))
    content = r.observation[0]["content"]
    assert content.startswith("AB" * 25) and content.endswith("[... 19950 more characters cut]")
    r = _step(env, hermes("add", {"a": 1, "b": 1}) * 10)
    assert r.info == {"tool_calls": 3, "errors": 1} and len(r.observation) == 4
    assert r.observation[0]["content"].startswith("error: too many tool calls")
    r = _step(env, "The answer is 7. " + hermes("add", {"a": 3, "b": 4}))  # a call after the answer still runs
    assert not r.done and r.observation[-1]["content"] == "7"
    r = _step(env, '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}')  # Llama 3 format
    assert r.observation == [{"role": "tool", "name": "add", "content": "3"}]


def test_constructor_errors():
    with pytest.raises(ValueError, match="at least one tool"):
        ToolEnvironment([])
    with pytest.raises(ValueError, match="has no usable schema"):
        ToolEnvironment([lambda x: x])
    with pytest.raises(ValueError, match="unique"):
        ToolEnvironment([add, add])
    assert set(ToolEnvironment(["fixtures_envs:word_count"], python=True).tools) == {"word_count", "python"}
    with pytest.raises(ValueError, match="cannot import tool"):
        ToolEnvironment(["fixtures_envs:nope"])


def test_python_tool_runs_in_the_sandbox_with_its_limits():
    env = ToolEnvironment(python=True, python_timeout_s=1.0, max_output_chars=100)
    r = _step(env, hermes("python", {"code": "print(sum(range(10)))"}))
    assert r.observation[0]["content"] == "45\n" and r.info["errors"] == 0
    r = _step(env, hermes("python", {"code": "while True: pass"}))
    assert "error (timeout)" in r.observation[0]["content"]
    r = _step(env, hermes("python", {"code": "import os; os.system('echo hi')"}))
    assert "error (" in r.observation[0]["content"]


def test_a_tool_episode_through_the_runner_and_the_chat_template():
    """A scripted policy: a call, a malformed call, an answer. The trajectory's environment tokens decode to
    the template's rendering, model tokens keep mask 1, and the metrics count calls and errors."""
    tok = qwen_tokenizer()
    env = ToolEnvironment([add])
    turns = [hermes("add", {"a": 2, "b": 3}), "<tool_call>{bad</tool_call>", "It is 5."]
    end_id = tok.convert_tokens_to_ids(envs.turn_end_text(tok))
    with EpisodeBatch(env, [{"prompt": "2+3?"}], max_turns=5, max_workers=2) as batch:
        prompt = envs.prompt_ids(tok, batch.prompts[0], env.tool_schemas())
        traj = envs.Trajectory(budget=1000)
        for text in turns:
            history = list(batch.history[0])
            traj.add_model(tok.encode(text, add_special_tokens=False) + [end_id])
            obs = batch.step([text])[0]
            if obs is None:
                break
            assert traj.add_env(envs.observation_ids(tok, history, text, obs, tools=env.tool_schemas()))
    assert batch.done[0] and batch.turns[0] == 3
    full = tok.apply_chat_template(batch.history[0], tools=env.tool_schemas(), tokenize=False)
    assert tok.decode(prompt + traj.ids) == full.rstrip("\n")
    model_text = tok.decode([i for i, m in zip(traj.ids, traj.mask) if m])
    assert model_text == "".join(t + "<|im_end|>" for t in turns)
    assert batch.metrics()["env/tool_calls/mean"] == 1 and batch.metrics()["env/errors/mean"] == 1
