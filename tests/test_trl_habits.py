"""TRL habits that must work or get a hint: rewards passed to Trainer keep the config's weights, a single
reward callable, pathlib paths, TRL field names in errors, the prompt column hint."""
import os
import pathlib
import re
import sys

import pytest

from jaxrl_llm import config as config_lib
from jaxrl_llm.trainer.inputs import python_inputs
from jaxrl_llm.trl_names import TRL_FIELDS
from jaxrl_llm.field_names import unknown_field
from jaxrl_llm.validation import get_path

sys.path.insert(0, os.path.dirname(__file__))
from test_docs_trl import cited_fields  # noqa: E402


def correct(completions, **kwargs):
    return [1.0] * len(completions)


def brief(completions, **kwargs):
    return [0.5] * len(completions)


BASE = {"data.task": "digit_puzzles", "reward.functions": "digit_puzzles"}


def test_rewards_list_keeps_the_configs_weights():
    """Before: `"reward.weights": "1.0,0.5"` became "1.0,1.0" in config.json and in the scores."""
    c, callables, _ = python_inputs({**BASE, "reward.weights": "1.0,0.5"}, [correct, brief], None)
    assert callables == [correct, brief]
    assert config_lib.reward_specs(c) == [(f"{__name__}:correct", 1.0), (f"{__name__}:brief", 0.5)]
    c, _, _ = python_inputs(BASE, [correct, (brief, 2.0)], None)  # weights in the list, none in the config
    assert [w for _, w in config_lib.reward_specs(c)] == [1.0, 2.0]
    c, _, _ = python_inputs({**BASE, "reward.weights": "1,2"}, [correct, (brief, 2.0)], None)  # the same: fine
    assert [w for _, w in config_lib.reward_specs(c)] == [1.0, 2.0]


@pytest.mark.parametrize("weights,rewards,message", [
    ("1.0,0.5", [correct, (brief, 2.0)], r"reward.weights '1.0,0.5' conflicts with the weights of "
                                         r"Trainer\(rewards=...\) \(1.0,2.0\); give the weights in one place"),
    ("1.0,0.5,2", [correct, brief], r"reward.weights '1.0,0.5,2' has 3 entries for the 2 rewards given as "
                                    r"Trainer\(rewards=...\)"),
])
def test_conflicting_weights_are_refused_in_one_line(weights, rewards, message):
    with pytest.raises(ValueError, match=message):
        python_inputs({**BASE, "reward.weights": weights}, rewards, None)


def test_a_single_reward_callable_or_name_is_accepted():
    """Before: `Trainer(rewards=fn)` was `TypeError: 'function' object is not iterable`."""
    c, callables, _ = python_inputs(BASE, correct, None)
    assert callables == [correct] and c.reward.functions == f"{__name__}:correct"
    c, callables, _ = python_inputs(BASE, "digit_puzzles", None)
    assert callables == [] and c.reward.functions == "digit_puzzles"
    with pytest.raises(ValueError, match=r"Trainer\(rewards=...\) takes a reward function"):
        python_inputs(BASE, [], None)


def test_from_dict_accepts_pathlib_paths(tmp_path):
    """Before: "config.model.path: Could not override field 'path' ... cannot be casted to type <class 'str'>"."""
    c = config_lib.from_dict({"model": {"path": tmp_path}, "data.path": tmp_path / "train.jsonl",
                              "eval.path": pathlib.PurePosixPath("/x/held_out.jsonl")})
    assert (c.model.path, c.data.path, c.eval.path) == (str(tmp_path), str(tmp_path / "train.jsonl"),
                                                        "/x/held_out.jsonl")


@pytest.mark.parametrize("path,field", [
    ("rollout.num_generations", "rollout.group_size"), ("max_completion_length", "rollout.max_new_tokens"),
    ("learning_rate", "optimizer.learning_rate"), ("kl.beta", "kl.coef"), ("num_iterations", "train.epochs"),
    ("epsilon", "loss.clip_low and loss.clip_high"), ("train.max_steps", "total_steps"),
])
def test_trl_field_names_suggest_ours(path, field):
    """Before: `--config.rollout.num_generations` listed rollout's fields, without `group_size`."""
    hint = f"did you mean {field}? (TRL's {path.split('.')[-1]}; docs/coming_from_trl.md maps TRL's fields)"
    assert unknown_field(path, config_lib.base_config()).endswith(hint)  # the command line
    with pytest.raises(ValueError, match=re.escape(f"config.{path} is not a config field; {hint}")):
        config_lib.from_dict({path: 1})  # Python


def test_the_trl_name_table_mirrors_the_doc():
    """Every entry of the code's table is a row of docs/coming_from_trl.md's TRL table citing the same fields."""
    rows = {}
    for row, field, _ in cited_fields():
        for name in re.findall(r"`([a-z_0-9]+)", row):
            rows.setdefault(name, set()).add(field)
    for name, fields in TRL_FIELDS.items():
        assert name in rows, f"{name} has no row in docs/coming_from_trl.md"
        assert set(fields) <= rows[name], (name, fields, rows[name])
    for fields in TRL_FIELDS.values():  # and every field it names exists
        for f in fields:
            get_path(config_lib.base_config(), f)


def test_the_missing_prompt_column_suggests_trls():
    """Before: "dataset lacks the configured column(s) ['question']; available columns: ['prompt', ...]"."""
    import datasets
    from jaxrl_llm.data import builtin_tokenizer, prepare_prompts

    rows = datasets.Dataset.from_list([{"prompt": "1+1=", "solution": "2"}])
    with pytest.raises(ValueError, match=re.escape(
            "dataset lacks the configured column(s) ['question', 'answer']; available columns: ['prompt', 'solution']; "
            "set data.prompt_column=prompt (TRL's default column is prompt)")):
        prepare_prompts(rows, config_lib.base_config().data, builtin_tokenizer())
