"""`format`, `overlong` (DAPO) and `length_penalty` against slow Python references."""

import re
import time

import numpy as np
import pytest

from jaxrl_llm.rewards import get_reward_fn
from jaxrl_llm.rewards.format import DEFAULT_FORMAT_PATTERN, format_reward
from jaxrl_llm.rewards.shaping import linear_length_penalty, overlong_penalty

# ----------------------------------------------------------------------------- format


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<think>reasoning</think>The answer is 4.", 1.0),
        ("<think>\nstep 1\nstep 2\n</think>\n\n\\boxed{4}\n", 1.0),
        ("  <think>r</think> 4", 1.0),
        ("<think>r</think>", 0.0),  # no answer
        ("<think>r</think>   \n ", 0.0),  # whitespace is not an answer
        ("<think></think> 4", 0.0),  # empty reasoning
        ("The answer is 4.", 0.0),
        ("4 <think>r</think> 4", 0.0),  # text before the reasoning
        ("<think>a</think> 4 <think>b</think> 5", 0.0),  # a second block
        ("<think>a <think>b</think> c</think> 4", 0.0),  # nested blocks
        ("<think>unclosed reasoning 4", 0.0),
        ("<think>a</think> 4 </think>", 0.0),  # stray closing tag in the answer
    ],
)
def test_default_format(completion, expected):
    reward = format_reward()
    assert reward(["q"], [completion]) == [expected]


def test_default_format_is_linear_time_on_adversarial_input():
    # Many opening tags and no closing one: a backtracking pattern would take exponential time.
    completion = "<think>" + "a <think" * 20000
    start = time.thread_time()  # CPU time of this thread: a loaded host does not fail the test
    assert format_reward()(["q"], [completion]) == [0.0]
    assert time.thread_time() - start < 2.0


def test_custom_pattern_modes_and_registry_options():
    pattern = r"<answer>\d+</answer>"
    completions = ["<answer>12</answer>", "text <answer>12</answer>", "<answer>x</answer>"]
    assert format_reward(pattern)(["q"] * 3, completions) == [1.0, 0.0, 0.0]
    assert format_reward(pattern, mode="search")(["q"] * 3, completions) == [1.0, 1.0, 0.0]
    name, fn = get_reward_fn("format", pattern=pattern, mode="match", flags=re.IGNORECASE)
    assert name == "format"
    assert fn(["q"] * 2, ["<ANSWER>3</ANSWER> trailing", "no"]) == [1.0, 0.0]
    assert re.compile(DEFAULT_FORMAT_PATTERN)  # the default is a valid, public regex


def test_format_bad_configuration():
    with pytest.raises(ValueError, match="is not a valid regex"):
        format_reward("(unclosed")
    with pytest.raises(ValueError, match="format mode must be one of"):
        format_reward(mode="findall")
    with pytest.raises(ValueError, match="format pattern must be a string"):
        format_reward(3)


# ----------------------------------------------------------------------------- overlong


def _overlong_reference(length, l_max, l_buf):
    if length <= l_max - l_buf:
        return 0.0
    if length <= l_max:
        return (l_max - l_buf - length) / l_buf
    return -1.0


@pytest.mark.parametrize("l_max, l_buf", [(16, 4), (20, 20), (7, 1), (20480, 4096)])
def test_overlong_penalty_matches_reference(l_max, l_buf):
    lengths = np.unique(np.concatenate([np.arange(0, min(l_max, 64) + 5), [l_max - l_buf, l_max, l_max + 1, 3 * l_max]]))
    got = overlong_penalty(lengths, l_max, l_buf)
    assert got.dtype == np.float32
    expected = [_overlong_reference(int(n), l_max, l_buf) for n in lengths]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    # Properties: bounded, non-increasing in the length, exactly -1 at L_max.
    assert np.all((got <= 0) & (got >= -1))
    assert np.all(np.diff(got[np.argsort(lengths)]) <= 0)
    assert overlong_penalty(np.array([l_max]), l_max, l_buf)[0] == -1.0


def test_overlong_reward_defaults_from_trainer_fields():
    _, fn = get_reward_fn("overlong")
    lengths = list(range(0, 111, 5))
    got = fn(["q"] * len(lengths), ["c"] * len(lengths), completion_lengths=lengths, max_completion_length=100, truncated=[False] * len(lengths))
    # Default buffer: 20% of L_max (DAPO's 4096 of 20480).
    np.testing.assert_allclose(got, [_overlong_reference(n, 100, 20) for n in lengths], atol=1e-6)
    _, fn = get_reward_fn("overlong", max_length=50, buffer=10)
    got = fn(["q"] * len(lengths), ["c"] * len(lengths), completion_lengths=lengths, max_completion_length=100)
    np.testing.assert_allclose(got, [_overlong_reference(n, 50, 10) for n in lengths], atol=1e-6)


def test_overlong_bad_input():
    _, fn = get_reward_fn("overlong", buffer=4)
    with pytest.raises(ValueError, match="needs the column 'completion_lengths'"):
        fn(["q"], ["c"], max_completion_length=16)
    with pytest.raises(ValueError, match="needs max_length"):
        fn(["q"], ["c"], completion_lengths=[3])
    with pytest.raises(ValueError, match="completion_lengths must be 2 non-negative integers"):
        fn(["q"] * 2, ["c"] * 2, completion_lengths=[3], max_completion_length=16)
    with pytest.raises(ValueError, match="completion_lengths must be 1 non-negative integers"):
        fn(["q"], ["c"], completion_lengths=[1.5], max_completion_length=16)
    with pytest.raises(ValueError, match=r"buffer must be <= max_length \(16\)"):
        overlong_penalty(np.array([3]), 16, 17)
    with pytest.raises(ValueError, match="buffer must be a positive integer"):
        get_reward_fn("overlong", buffer=0)
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        get_reward_fn("overlong", max_length=2.5)


# ----------------------------------------------------------------------------- length penalty


@pytest.mark.parametrize("coef, l_max, free", [(1.0, 16, 0), (0.5, 20, 5), (2.0, 7, 6)])
def test_length_penalty_matches_reference(coef, l_max, free):
    lengths = np.arange(0, l_max + 3)
    got = linear_length_penalty(lengths, l_max, coef, free)
    expected = [-coef * max(0, n - free) / (l_max - free) for n in lengths]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    _, fn = get_reward_fn("length_penalty", coef=coef, free_length=free)
    assert fn(["q"] * len(lengths), ["c"] * len(lengths), completion_lengths=lengths.tolist(), max_completion_length=l_max) == pytest.approx(expected)


def test_length_penalty_bad_input():
    with pytest.raises(ValueError, match="coef must be a finite number"):
        get_reward_fn("length_penalty", coef=float("inf"))
    with pytest.raises(ValueError, match=r"free_length must be an integer in \[0, max_length=8\)"):
        linear_length_penalty(np.array([1]), 8, 1.0, 8)
