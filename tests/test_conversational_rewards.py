"""Conversational datasets: TRL's reward functions get completions as TRL passes them (one assistant
message per row), run unchanged, and a reward reading the wrong form gets a hint naming the switch."""
import re

import numpy as np
import pytest

from fixtures_data import make_tiny_tokenizer
from jaxrl_llm.rewards import RewardError, UserReward, score_rewards
from test_pipelines import _tiny_checkpoint
from test_trainer import small_config


# TRL's documentation, GRPOTrainer, "Example 3: reward completions based on a specific format", unchanged.
def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


# The accuracy reward of TRL's conversational examples: the prompt's last message and an `answer` column.
def correctness_reward_func(prompts, completions, answer, **kwargs):
    responses = [completion[0]["content"] for completion in completions]
    assert all(p[-1]["role"] == "user" for p in prompts)
    return [2.0 if r.strip() == a else 0.0 for r, a in zip(responses, answer)]


# The accuracy reward of TRL's documentation: math_verify on the message content, None when the gold
# solution does not parse (TRL then skips the row, as our None does).
def accuracy_reward(completions, solution, **kwargs):
    """Reward function that checks if the completion is the same as the ground truth."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    contents = [completion[0]["content"] for completion in completions]
    rewards = []
    for content, sol in zip(contents, solution):
        gold_parsed = parse(sol, extraction_mode="first_match")
        if len(gold_parsed) != 0:
            answer_parsed = parse(
                content,
                extraction_config=[LatexExtractionConfig(
                    normalization_config=NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True,
                                                             equations=True, boxed="all", units=True),
                    boxed_match_priority=0, try_extract_without_anchor=False)],
                extraction_mode="first_match")
            try:
                reward = float(verify(gold_parsed, answer_parsed))
            except Exception:
                reward = None
        else:
            reward = None
        rewards.append(reward)
    return rewards


def test_trl_accuracy_reward_runs_unchanged():
    fn = [("accuracy_reward", UserReward(accuracy_reward, True, "prompt"), 1.0)]
    out = score_rewards(fn, ["q"] * 3, ["so $\\boxed{2}$", "it is $\\boxed{3}$", "x"],
                        {"prompt": CONVERSATIONS[:1] * 3, "solution": ["$2$", "$2$", "no math here"]})
    np.testing.assert_array_equal(out.components["accuracy_reward"], [1.0, 0.0, 0.0])
    assert out.metrics["reward/accuracy_reward/none_frac"] == 1 / 3  # the unparseable gold


CONVERSATIONS = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}],
                 [{"role": "user", "content": "2+3?"}]]
TEXTS = ["<think>easy</think><answer>2</answer>", " 5"]


def test_trl_documentation_rewards_run_unchanged_on_messages():
    fns = [(f.__name__, UserReward(f, True, "prompt"), 1.0) for f in (format_reward_func, correctness_reward_func)]
    out = score_rewards(fns, ["1+1?", "2+3?"], TEXTS, {"prompt": CONVERSATIONS, "answer": ["2", "5"]})
    np.testing.assert_array_equal(out.components["format_reward_func"], [1.0, 0.0])
    np.testing.assert_array_equal(out.components["correctness_reward_func"], [0.0, 2.0])
    # Without a conversation column the prompts are the user text as one user message.
    seen = []
    spy = UserReward(lambda prompts, completions, **kw: seen.append((prompts, completions)) or [0.0] * 2, True)
    score_rewards([("spy", spy, 1.0)], ["a", "b"], ["x", "y"])
    assert seen == [([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
                     [[{"role": "assistant", "content": "x"}], [{"role": "assistant", "content": "y"}]])]


def text_reward(completions, **kwargs):
    return [float(c.strip() == "5") for c in completions]


@pytest.mark.parametrize("fn,messages,hint", [
    (format_reward_func, False, "(completions are strings here; reward.completion_format=messages passes"),
    (text_reward, True, "read completion[0]['content'], or set reward.completion_format=text for strings)"),
])
def test_a_reward_reading_the_other_form_gets_a_hint(fn, messages, hint):
    """Before: `TypeError: string indices must be integers`, after the first rollout compiled, no hint."""
    with pytest.raises(RewardError, match=re.escape(hint)):
        score_rewards([(fn.__name__, UserReward(fn, messages, "prompt"), 1.0)], ["q", "q"], TEXTS,
                      {"prompt": CONVERSATIONS, "answer": ["2", "5"]})
    with pytest.raises(RewardError, match=r"missing 1 required positional argument"):  # a call error: no hint
        score_rewards([("f", UserReward(lambda completions, x: [0.0], messages), 1.0)], ["q"], ["a"])


SEEN = []


def recording_format_reward(completions, **kwargs):
    SEEN.append(completions)
    return format_reward_func(completions, **kwargs)


def test_trainer_passes_messages_for_a_conversational_dataset(tmp_path):
    tok = make_tiny_tokenizer(tmp_path / "model", chat_template=True)
    _tiny_checkpoint(tmp_path / "model", tok)
    from jaxrl_llm.trainer import Trainer
    rows = [{"prompt": c, "answer": a} for c, a in zip(CONVERSATIONS * 2, ["2", "5"] * 2)]
    c = small_config(total_steps=1, **{"model.path": str(tmp_path / "model"), "data.task": "",
                                       "data.prompt_column": "prompt", "data.extra_columns": (),
                                       "data.max_prompt_length": 48, "model.max_position_embeddings": 512,
                                       "rollout.batch_prompts": 2, "data.use_chat_template": "auto"})
    SEEN.clear()
    history = Trainer(c, str(tmp_path / "w"), rewards=[recording_format_reward, correctness_reward_func],
                      dataset=rows).run()
    assert "reward/correctness_reward_func/mean" in history[0] and np.isfinite(history[0]["policy/loss"])
    assert all(isinstance(r, list) and len(r) == 1 and r[0]["role"] == "assistant" and isinstance(r[0]["content"], str)
               for r in SEEN[0])
