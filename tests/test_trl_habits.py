"""TRL habits that must work or get a hint: rewards passed to Trainer keep the config's weights, a single
reward callable, pathlib paths, TRL field names in errors, the prompt column hint."""
import pathlib

import pytest

from jaxrl_llm import config as config_lib
from jaxrl_llm.trainer.inputs import python_inputs


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
