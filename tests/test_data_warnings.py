"""Warnings for inputs that train on something else than they seem to: most prompts cut by truncate_left,
conversations with empty messages, a reward that returns None for every row."""
import logging

import datasets
import numpy as np

from fixtures_envs import qwen_tokenizer
from jaxrl_llm.data import builtin_tokenizer, default_data_config, prepare_prompts
from jaxrl_llm.rewards.registry import score_rewards


def _config(**kw):
    c = default_data_config()
    c.max_prompt_length = 8
    c.max_prompt_length_policy = "truncate_left"
    c.prompt_column, c.answer_column = "prompt", ""
    c.use_chat_template = False
    for k, v in kw.items():
        c[k] = v
    return c


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_most_prompts_cut_warns_with_the_count(caplog):
    rows = [{"prompt": "x" * n} for n in (20, 30, 3, 12)]  # 3 of 4 longer than 8 tokens
    with caplog.at_level(logging.WARNING):
        _, stats = prepare_prompts(datasets.Dataset.from_list(rows), _config(), builtin_tokenizer())
    assert stats["data/truncated"] == 3
    assert [w for w in _warnings(caplog) if "cut 3 of the 4 prompts" in w]
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # one cut of four: the info line only
        prepare_prompts(datasets.Dataset.from_list(rows[2:] + [{"prompt": "ab"}]), _config(), builtin_tokenizer())
    assert not [w for w in _warnings(caplog) if "cut" in w]


def test_empty_conversation_content_warns(caplog):
    rows = [{"prompt": [{"role": "user", "content": "hi"}]}, {"prompt": [{"role": "user", "content": ""}]},
            {"prompt": [{"role": "system", "content": " "}, {"role": "user", "content": "q"}]}]
    with caplog.at_level(logging.WARNING):
        prepare_prompts(datasets.Dataset.from_list(rows), _config(max_prompt_length=256, use_chat_template=True),
                        qwen_tokenizer())
    assert [w for w in _warnings(caplog) if "2 of the 3 conversations" in w and "empty content" in w]


def test_an_all_none_reward_warns_once(caplog):
    def abstains(prompts, completions, **_):
        return [None] * len(completions)

    def scores(prompts, completions, **_):
        return [1.0] * len(completions)

    fns = [("abstains_warn_test", abstains, 1.0), ("scores", scores, 1.0)]
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            out = score_rewards(fns, ["p", "q"], ["a", "b"], {})
    assert np.array_equal(out.scores, [1.0, 1.0]) and out.metrics["reward/abstains_warn_test/none_frac"] == 1.0
    assert len([w for w in _warnings(caplog) if "'abstains_warn_test' returned None for every row" in w]) == 1
    assert not [w for w in _warnings(caplog) if "'scores'" in w]
