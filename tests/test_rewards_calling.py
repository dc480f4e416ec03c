"""Rewards are called by keyword with the parameters they declare, as TRL calls them; the old positional
style keeps working; a parameter nothing provides is a one-line error before anything compiles."""
import re

import numpy as np
import pytest

from jaxrl_llm.rewards import (TRAINER_FIELDS, TrainerState, check_reward_parameters, generation_fields,
                               get_reward_fn, register_reward, score_rewards)
from jaxrl_llm.rewards import calling


# ---------------------------------------------------------------- reward functions in the spirit of TRL's docs
def accuracy_reward(completions, solution, **kwargs):
    """TRL's example: the completion must equal the dataset's `solution` column."""
    return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]


def format_reward(completions, **kw):
    return [1.0 if re.fullmatch(r"<answer>\d+</answer>", c) else 0.0 for c in completions]


def len_reward(completion_ids, **kw):
    return [-len(ids) / 10 for ids in completion_ids]


def level_bonus(prompts, level):  # no **kwargs: receives exactly what it declares
    return [0.5 * lv for lv in level]


def schedule(completions, trainer_state, **kw):
    """Shaping by training progress, as TRL's `trainer_state` allows."""
    return [trainer_state.global_step / trainer_state.max_steps] * len(completions)


def legacy(p, c, **columns):  # the positional style of the earlier contract
    return [float(len(x) + len(columns["solution"][i])) for i, x in enumerate(c)]


def legacy_named(_, outputs, solution):
    return [float(o == s) for o, s in zip(outputs, solution)]


PROMPTS = ["1+1=", "1+1=", "2+3=", "2+3="]
COMPLETIONS = ["<answer>2</answer>", "2", "5", "<answer>6</answer>"]


def _columns():
    tokens = np.array([[5, 6, 1, 0], [7, 1, 0, 0], [8, 9, 9, 9], [4, 4, 1, 0]])
    lengths, truncated = np.array([3, 2, 4, 3]), np.array([False, False, True, False])
    return {"solution": ["2", "2", "5", "5"], "level": [1, 1, 2, 2], "prompt_text": PROMPTS,
            **generation_fields(tokens, lengths, truncated, 4, TrainerState(3, 12))}


def _score(*fns):
    return score_rewards([(f.__name__, f, 1.0) for f in fns], PROMPTS, COMPLETIONS, _columns())


def test_trl_style_rewards_get_what_they_declare():
    batch = _score(accuracy_reward, format_reward, len_reward, level_bonus, schedule)
    np.testing.assert_array_equal(batch.components["accuracy_reward"], [0, 1, 1, 0])
    np.testing.assert_array_equal(batch.components["format_reward"], [1, 0, 0, 1])
    np.testing.assert_allclose(batch.components["len_reward"], [-0.3, -0.2, -0.4, -0.3])  # EOS included
    np.testing.assert_array_equal(batch.components["level_bonus"], [0.5, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(batch.components["schedule"], [0.25] * 4)
    np.testing.assert_allclose(batch.scores, np.sum(list(batch.components.values()), axis=0), rtol=1e-6)


def test_completion_ids_are_the_counted_tokens():
    cols = _columns()
    assert cols["completion_ids"] == [[5, 6, 1], [7, 1], [8, 9, 9, 9], [4, 4, 1]]
    assert [len(ids) for ids in cols["completion_ids"]] == cols["completion_lengths"]


def test_kwargs_receive_every_input_by_name():
    seen = {}

    def spy(**kwargs):
        seen.update(kwargs)
        return [0.0] * len(kwargs["completions"])

    _score(spy)
    assert set(seen) == {*TRAINER_FIELDS, "solution", "level"}
    assert seen["prompts"] == PROMPTS and seen["completions"] == COMPLETIONS


def test_the_positional_style_keeps_working():
    batch = _score(legacy, legacy_named)
    np.testing.assert_array_equal(batch.components["legacy"], [len(c) + 1 for c in COMPLETIONS])
    np.testing.assert_array_equal(batch.components["legacy_named"], [0, 1, 1, 0])
    # Configured options (a partial of the function, or a factory's closure) still bind.
    name, fn = get_reward_fn("overlong", max_length=4, buffer=2)
    np.testing.assert_allclose(score_rewards([(name, fn, 1.0)], PROMPTS, COMPLETIONS, _columns()).scores,
                               [-0.5, 0.0, -1.0, -0.5])


def test_bound_options_are_not_overwritten_by_a_column_of_the_same_name():
    def threshold_reward(completions, level, *, threshold=0, **kw):
        return [float(lv > threshold) for lv in level]

    name, fn = get_reward_fn(threshold_reward, threshold=1)
    cols = dict(_columns(), threshold=[9, 9, 9, 9])  # a dataset column named like the option
    np.testing.assert_array_equal(score_rewards([(name, fn, 1.0)], PROMPTS, COMPLETIONS, cols).scores, [0, 0, 1, 1])


def test_a_failing_row_is_named_with_keyword_calls_too():
    def picky(completions, level, **kw):
        return [1.0 / (lv - 2) for lv in level]  # rows 2 and 3 divide by zero

    with pytest.raises(ValueError, match="reward 'picky' raised on row 2: ZeroDivisionError"):
        _score(picky)


def test_the_signature_is_read_once_per_function(monkeypatch):
    calls = []
    real = calling.inspect.signature
    monkeypatch.setattr(calling.inspect, "signature", lambda fn: calls.append(fn) or real(fn))

    def fresh(completions, **kw):
        return [0.0] * len(completions)

    for _ in range(3):
        _score(fresh)
    assert calls == [fresh]


def test_registered_trl_style_reward_by_name():
    register_reward("trl_accuracy_for_tests")(accuracy_reward)
    name, fn = get_reward_fn("trl_accuracy_for_tests")
    np.testing.assert_array_equal(score_rewards([(name, fn, 1.0)], PROMPTS, COMPLETIONS, _columns()).scores,
                                  [0, 1, 1, 0])


@pytest.mark.parametrize("fn,param", [(accuracy_reward, "solution"), (level_bonus, "level"),
                                      (legacy_named, "solution"), (lambda prompts, outputs, **kw: [], "outputs")])
def test_an_undeclared_input_is_a_one_line_error_naming_function_and_parameter(fn, param):
    with pytest.raises(ValueError) as e:
        check_reward_parameters([(fn.__name__, fn, 1.0)], ["question", "answer", "prompt_text"])
    message = str(e.value)
    assert "\n" not in message and f"reward {fn.__name__!r}" in message and f"parameter {param!r}" in message
    assert "available: prompts, completions, completion_ids" in message and "answer" in message


def test_parameters_with_defaults_or_present_columns_pass_the_check():
    def optional(completions, solution=None, **kw):
        return [0.0] * len(completions)

    check_reward_parameters([(f.__name__, f, 1.0) for f in (optional, format_reward, len_reward, schedule, legacy)],
                            ["answer"])
    check_reward_parameters([("accuracy_reward", accuracy_reward, 1.0)], ["solution"])
