"""Registry, spec resolution and `compute_rewards` (weights, None, errors, metrics)."""

import math
import sys
import textwrap

import numpy as np
import pytest

from jaxrl_llm.rewards import registry
from jaxrl_llm.rewards.registry import RewardError, RewardScores, compute_rewards, get_reward_fn, register_reward

PROMPTS = ["p0", "p1", "p2", "p3", "p4"]
COMPLETIONS = ["c0", "c1", "c2", "c3", "c4"]


@pytest.fixture
def clean_registry():
    before = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user module on sys.path with a plain reward, a factory and a non-callable."""
    (tmp_path / "user_rewards_mod.py").write_text(
        textwrap.dedent(
            """
            from jaxrl_llm.rewards import register_reward

            def length_reward(prompts, completions, *, scale=1.0, **kwargs):
                return [scale * len(c) for c in completions]

            @register_reward("user_scaled_const", factory=True)
            def make_const(value=1.0):
                def reward(prompts, completions, **kwargs):
                    return [value] * len(completions)
                return reward

            NOT_CALLABLE = 3

            @register_reward("user_lazy", factory=True)
            def user_lazy(scale, *, offset=0.0):
                def reward(prompts, completions, **kwargs):
                    return [scale + offset] * len(completions)
                return reward
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("user_rewards_mod", None)  # re-import: registration happens at import time
    yield "user_rewards_mod"
    sys.modules.pop("user_rewards_mod", None)


# ----------------------------------------------------------------------------- resolution


def test_builtins_are_registered_and_resolve():
    names = registry.registered_rewards()
    for builtin in ("math_answer", "format", "overlong", "length_penalty", "code_tests"):
        assert builtin in names
        name, fn = get_reward_fn(builtin)
        assert name == builtin and callable(fn)


def test_unknown_name_lists_registered_names_in_one_line():
    with pytest.raises(ValueError, match="unknown reward 'nope'") as info:
        get_reward_fn("nope")
    message = str(info.value)
    assert "\n" not in message
    for builtin in ("math_answer", "format", "overlong", "length_penalty", "code_tests"):
        assert builtin in message


def test_import_path_resolves_plain_function_and_binds_options(user_module, clean_registry):
    name, fn = get_reward_fn(f"{user_module}:length_reward")
    assert name == "length_reward"
    assert fn(["a", "b"], ["xx", "yyy"]) == [2.0, 3.0]
    name, fn = get_reward_fn(f"{user_module}:length_reward", scale=0.5)
    assert fn(["a"], ["xxxx"], answer=["ignored"]) == [2.0]


def test_import_path_to_registered_factory_calls_it(user_module, clean_registry):
    name, fn = get_reward_fn(f"{user_module}:make_const", value=0.25)
    assert name == "make_const"
    assert fn(["a", "b"], ["x", "y"]) == [0.25, 0.25]
    # Importing the module registered the factory under its name too.
    assert get_reward_fn("user_scaled_const", value=2.0)[1](["a"], ["x"]) == [2.0]


@pytest.mark.parametrize(
    "spec, match",
    [
        ("no_such_module_xyz:fn", "cannot import reward 'no_such_module_xyz:fn': ModuleNotFoundError"),
        ("json:no_such_function", "has no attribute 'no_such_function'"),
        (":fn", "must look like 'package.module:function'"),
        ("json:", "must look like 'package.module:function'"),
    ],
)
def test_import_failures_are_one_line_errors_naming_the_path(spec, match):
    with pytest.raises(ValueError, match=match) as info:
        get_reward_fn(spec)
    assert "\n" not in str(info.value)


def test_import_path_to_non_callable_is_rejected(user_module, clean_registry):
    with pytest.raises(ValueError, match="is a int, not a callable"):
        get_reward_fn(f"{user_module}:NOT_CALLABLE")


def test_lazy_builtin_is_imported_on_first_use_by_name(user_module, clean_registry, monkeypatch):
    # `reward_model` works this way: its module (JAX models) is only imported when asked for.
    monkeypatch.setitem(registry._LAZY_BUILTINS, "user_lazy", user_module)
    assert "user_lazy" in registry.registered_rewards() and user_module not in sys.modules
    with pytest.raises(ValueError, match="reward 'user_lazy': missing a required argument: 'scale'"):
        get_reward_fn("user_lazy")
    name, fn = get_reward_fn("user_lazy", scale=1.0, offset=0.5)
    assert name == "user_lazy" and fn(["a"], ["x"]) == [1.5]
    assert "reward_model" in registry.registered_rewards()


def test_unknown_options_are_rejected_with_the_accepted_ones():
    with pytest.raises(ValueError, match=r"reward 'math_answer' got unknown option\(s\) \['sympy_timout'\]"):
        get_reward_fn("math_answer", sympy_timout=1.0)
    with pytest.raises(ValueError, match="accepted: pattern, mode, flags"):
        get_reward_fn("format", patern="x")


def test_register_reward_decorator_and_duplicates(clean_registry):
    @register_reward("my_test_reward")
    def my_reward(prompts, completions, **kwargs):
        return [1.0] * len(completions)

    assert "my_test_reward" in registry.registered_rewards()
    assert get_reward_fn("my_test_reward") == ("my_test_reward", my_reward)
    register_reward("my_test_reward")(my_reward)  # same object again: a no-op

    with pytest.raises(ValueError, match="already registered"):
        register_reward("my_test_reward")(lambda p, c, **k: [0.0] * len(c))
    for bad in ("", "a:b", "a/b", " x"):
        with pytest.raises(ValueError, match="reward name must be"):
            register_reward(bad)


# ----------------------------------------------------------------------------- combination


def _reward_from_table(table):
    def reward(prompts, completions, **kwargs):
        return [table[int(c[1:])] for c in completions]

    return reward


def test_weighted_sum_and_metrics_match_a_python_loop():
    rng = np.random.default_rng(0)
    n = len(PROMPTS)
    tables = []
    for k in range(3):
        values = rng.normal(size=n).tolist()
        tables.append([None if rng.random() < 0.3 else v for v in values])
    tables[1][0] = None  # at least one None and one value per function
    tables[1][1] = 0.7
    weights = [1.0, -0.5, 2.0]
    fns = [(f"r{k}", _reward_from_table(t), w) for k, (t, w) in enumerate(zip(tables, weights))]

    scores, metrics = compute_rewards(fns, PROMPTS, COMPLETIONS, {})

    assert scores.dtype == np.float32 and scores.shape == (n,)
    for i in range(n):
        expected = sum(np.float32(w) * np.float32(t[i]) for t, w in zip(tables, weights) if t[i] is not None)
        assert scores[i] == pytest.approx(float(expected), rel=1e-6, abs=1e-7)
    for k, table in enumerate(tables):
        present = [v for v in table if v is not None]
        assert metrics[f"reward/r{k}/none_frac"] == pytest.approx(1 - len(present) / n)
        assert metrics[f"reward/r{k}/errors"] == 0.0
        if present:
            assert metrics[f"reward/r{k}/mean"] == pytest.approx(float(np.mean(np.float32(present))), rel=1e-6)


def test_all_none_function_has_no_mean_and_contributes_zero():
    fns = [("na", lambda p, c, **k: [None] * len(c), 1.0), ("one", lambda p, c, **k: [1] * len(c), 0.5)]
    scores, metrics = compute_rewards(fns, PROMPTS, COMPLETIONS)
    np.testing.assert_array_equal(scores, np.full(5, 0.5, np.float32))
    assert "reward/na/mean" not in metrics
    assert metrics["reward/na/none_frac"] == 1.0
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["reward/one/mean"] == 1.0


def test_integer_bool_and_numpy_values_become_float32():
    fns = [
        ("ints", lambda p, c, **k: [1, 2, 3, 4, 5], 1.0),
        ("bools", lambda p, c, **k: np.array([True, False, True, False, True]), 1.0),
        ("np64", lambda p, c, **k: [np.float64(0.25)] * 5, 2.0),
    ]
    scores, _ = compute_rewards(fns, PROMPTS, COMPLETIONS)
    assert scores.dtype == np.float32
    np.testing.assert_allclose(scores, [2.5, 2.5, 4.5, 4.5, 6.5])


def test_columns_are_row_aligned_and_scalars_pass_through():
    seen = {}

    def reward(prompts, completions, *, answer, completion_lengths, truncated, max_completion_length, **kwargs):
        seen.update(kwargs)
        assert max_completion_length == 16
        return [float(a == c) + 0.0 * l + 0.0 * t for a, c, l, t in zip(answer, completions, completion_lengths, truncated)]

    columns = {
        "answer": ["c0", "x", "c2", "x", "c4"],
        "completion_lengths": np.array([3, 4, 5, 6, 16]),
        "truncated": [False, False, False, False, True],
        "max_completion_length": 16,
        "extra": ("a", "b", "c", "d", "e"),
    }
    scores, _ = compute_rewards([("match", reward, 1.0)], PROMPTS, COMPLETIONS, columns)
    np.testing.assert_array_equal(scores, [1, 0, 1, 0, 1])
    assert seen == {"extra": ("a", "b", "c", "d", "e")}


@pytest.mark.parametrize(
    "columns, match",
    [
        ({"answer": ["a"] * 4}, "column 'answer' has 4 rows, expected 5"),
        ({"answer": np.zeros((5, 2))}, r"column 'answer' must be 1-D with 5 rows, got shape \(5, 2\)"),
        ({"prompts": ["a"] * 5}, "columns must not contain 'prompts'"),
    ],
)
def test_bad_columns(columns, match):
    with pytest.raises(ValueError, match=match):
        compute_rewards([("one", lambda p, c, **k: [1.0] * len(c), 1.0)], PROMPTS, COMPLETIONS, columns)


def test_bad_arguments():
    one = lambda p, c, **k: [1.0] * len(c)  # noqa: E731
    with pytest.raises(ValueError, match="prompts has 5 rows but completions has 4"):
        compute_rewards([("one", one, 1.0)], PROMPTS, COMPLETIONS[:4])
    with pytest.raises(ValueError, match=r"completions\[1\] must be a string"):
        compute_rewards([("one", one, 1.0)], PROMPTS[:2], ["a", 3])
    with pytest.raises(ValueError, match="names must be unique"):
        compute_rewards([("one", one, 1.0), ("one", one, 2.0)], PROMPTS, COMPLETIONS)
    with pytest.raises(ValueError, match=r"weight must be a finite number, got nan"):
        compute_rewards([("one", one, float("nan"))], PROMPTS, COMPLETIONS)
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'zero'"):
        compute_rewards([("one", one, 1.0)], PROMPTS, COMPLETIONS, on_error="skip")
    with pytest.raises(ValueError, match="prompts is empty"):
        compute_rewards([("one", one, 1.0)], [], [])
    with pytest.raises(ValueError, match=r"\(name, fn, weight\) triple"):
        compute_rewards([("one", one)], PROMPTS, COMPLETIONS)


# ----------------------------------------------------------------------------- errors


def _fails_on_row_3(prompts, completions, **kwargs):
    out = []
    for c in completions:
        if c == "c3":
            raise ValueError("boom\nsecond line")
        out.append(1.0)
    return out


def test_raising_function_is_named_with_its_row():
    with pytest.raises(RewardError, match=r"^reward 'flaky' raised on row 3: ValueError: boom$") as info:
        compute_rewards([("flaky", _fails_on_row_3, 1.0)], PROMPTS, COMPLETIONS)
    assert info.value.reward == "flaky" and info.value.row == 3
    assert isinstance(info.value.__cause__, ValueError)


def test_on_error_zero_zeroes_only_the_failing_rows_and_counts_them():
    fns = [("flaky", _fails_on_row_3, 2.0), ("one", lambda p, c, **k: [1.0] * len(c), 1.0)]
    scores, metrics = compute_rewards(fns, PROMPTS, COMPLETIONS, on_error="zero")
    np.testing.assert_array_equal(scores, [3.0, 3.0, 3.0, 1.0, 3.0])
    assert metrics["reward/flaky/errors"] == 1.0
    assert metrics["reward/flaky/mean"] == pytest.approx(0.8)  # the zeroed row counts as a 0
    assert metrics["reward/one/errors"] == 0.0


def test_function_failing_only_on_the_whole_batch():
    def batch_only(prompts, completions, **kwargs):
        if len(completions) > 1:
            raise RuntimeError("batch too large")
        return [0.5]

    with pytest.raises(RewardError, match="raised on the batch of 5 rows but on no single row: RuntimeError"):
        compute_rewards([("batchy", batch_only, 1.0)], PROMPTS, COMPLETIONS)
    scores, metrics = compute_rewards([("batchy", batch_only, 1.0)], PROMPTS, COMPLETIONS, on_error="zero")
    np.testing.assert_array_equal(scores, np.full(5, 0.5, np.float32))
    assert metrics["reward/batchy/errors"] == 0.0


def test_row_retry_slices_columns_consistently():
    def needs_alignment(prompts, completions, *, answer, max_completion_length, **kwargs):
        if len(completions) > 1:
            raise RuntimeError("force the row-by-row path")
        assert answer[0] == "a" + completions[0][1:] and max_completion_length == 7
        return [1.0]

    columns = {"answer": [f"a{i}" for i in range(5)], "max_completion_length": 7}
    scores, metrics = compute_rewards([("r", needs_alignment, 1.0)], PROMPTS, COMPLETIONS, columns, on_error="zero")
    np.testing.assert_array_equal(scores, np.ones(5, np.float32))
    assert metrics["reward/r/errors"] == 0.0


@pytest.mark.parametrize("on_error", ["raise", "zero"])
@pytest.mark.parametrize(
    "output, match",
    [
        ([1.0] * 4, "reward 'bad' returned 4 values for 5 rows"),
        ("11111", "reward 'bad' returned str, expected a list of 5 floats or None"),
        (np.ones((5, 1)), r"returned an array of shape \(5, 1\)"),
        ([1.0, 1.0, "1.0", 1.0, 1.0], r"non-numeric value '1.0' \(str\) on row 2"),
        ([1.0, [1.0], 1.0, 1.0, 1.0], r"returned the process step 1.0 on row 1; expected \(token index >= 0"),
        ([1.0, 1.0, [(0, 1.0), (0, 2.0)], 1.0, 1.0], r"two process steps at one token index on row 2"),
        ([1.0, 1.0, 1.0, [(-1, 1.0)], 1.0], r"process step \(-1, 1.0\) on row 3"),
        ([1.0, 1.0, 1.0, [(2, float("nan"))], 1.0], r"process step \(2, nan\) on row 3"),
        ([{"a": 1}, 1.0, 1.0, 1.0, 1.0], r"non-numeric value \{'a': 1\} \(dict\) on row 0"),
        ([1.0, 1.0, 1.0, float("nan"), 1.0], "reward 'bad' returned nan on row 3"),
        ([float("-inf"), 1.0, 1.0, 1.0, 1.0], "reward 'bad' returned -inf on row 0"),
        ([1.0, 1e39, 1.0, 1.0, 1.0], "returned 1e\\+39 on row 1, which overflows float32"),
    ],
)
def test_invalid_returns_always_raise(output, match, on_error):
    with pytest.raises(RewardError, match=match) as info:
        compute_rewards([("bad", lambda p, c, **k: output, 1.0)], PROMPTS, COMPLETIONS, on_error=on_error)
    assert "\n" not in str(info.value)


def test_reward_scores_report_extra_metrics_from_the_batch_call():
    def with_metrics(prompts, completions, **kwargs):
        return RewardScores([1.0] * len(completions), metrics={"judged": len(completions), "odd": 0.5})

    out = with_metrics(PROMPTS, COMPLETIONS)
    assert out == [1.0] * 5 and isinstance(out, list)  # a plain list to every other caller
    scores, metrics = compute_rewards([("m", with_metrics, 2.0)], PROMPTS, COMPLETIONS)
    np.testing.assert_array_equal(scores, np.full(5, 2.0, np.float32))
    assert metrics["reward/m/judged"] == 5.0 and metrics["reward/m/odd"] == 0.5
    assert metrics["reward/m/mean"] == 1.0


def test_reward_scores_metrics_are_dropped_on_the_row_by_row_retry():
    def batch_fails(prompts, completions, **kwargs):
        if len(completions) > 1:
            raise RuntimeError("force the row-by-row path")
        return RewardScores([1.0], metrics={"judged": 1})

    _, metrics = compute_rewards([("m", batch_fails, 1.0)], PROMPTS, COMPLETIONS, on_error="zero")
    assert "reward/m/judged" not in metrics and metrics["reward/m/mean"] == 1.0


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"a/b": 1.0}, "returned a metric named 'a/b'"),
        ({"": 1.0}, "returned a metric named ''"),
        ({"x": float("nan")}, "returned metric 'x' = nan, not a finite number"),
        ({"x": "1"}, "returned metric 'x' = '1', not a finite number"),
    ],
)
def test_reward_scores_bad_metrics_raise(extra, match):
    fn = lambda p, c, **k: RewardScores([0.0] * len(c), metrics=extra)  # noqa: E731
    with pytest.raises(RewardError, match=match):
        compute_rewards([("bad", fn, 1.0)], PROMPTS, COMPLETIONS, on_error="zero")


def test_weighted_sum_overflow_is_an_error():
    with pytest.raises(ValueError, match="overflows float32"):
        compute_rewards([("big", lambda p, c, **k: [1e30] * len(c), 1e10)], PROMPTS, COMPLETIONS)


def test_end_to_end_with_builtins():
    specs = [("math_answer", {}, 1.0), ("format", {}, 0.5), ("overlong", {"buffer": 4}, 1.0)]
    fns = [(*get_reward_fn(spec, **kw), w) for spec, kw, w in specs]
    completions = [
        "<think>2+2</think> The answer is \\boxed{4}.",
        "The answer is 5",
        "<think>long</think> 4",
        "<think>x</think> \\boxed{4}",
    ]
    columns = {
        "answer": ["#### 4", "#### 4", "#### 4", "no value here"],
        "completion_lengths": [10, 15, 16, 12],
        "truncated": [False, False, True, False],
        "max_completion_length": 16,
    }
    scores, metrics = compute_rewards(fns, ["q"] * 4, completions, columns)
    # math: 1, 0, 1, None; format: 1, 0, 1, 1; overlong (L=16, buf=4 -> ramp from 12): 0, -0.75, -1, 0.
    np.testing.assert_allclose(scores, [1.5, -0.75, 0.5, 0.5], rtol=0, atol=1e-6)
    assert metrics["reward/math_answer/none_frac"] == 0.25
    assert metrics["reward/math_answer/mean"] == pytest.approx(2 / 3)
    assert metrics["reward/format/mean"] == 0.75
    assert metrics["reward/overlong/mean"] == pytest.approx(-1.75 / 4)


def test_process_rewards_are_steps_valued_at_their_sum():
    """A row may be a list of (token index, reward) steps: its score is their weighted sum, and the
    weighted steps come back sorted per row for a process estimator; components are per function."""
    def steps(prompts, completions, **_):
        return [[(3, 1.0), (0, -0.5)], None, [], 2.0]

    def flat(prompts, completions, **_):
        return [1.0, 1.0, None, 0.0]

    batch = registry.score_rewards([("steps", steps, 2.0), ("flat", flat, 1.0)], ["p"] * 4, ["c"] * 4)
    np.testing.assert_array_equal(batch.scores, [2.0, 1.0, 0.0, 4.0])
    assert batch.steps == [[(0, -1.0), (3, 2.0)], [], [], []]
    np.testing.assert_array_equal(batch.components["steps"], [1.0, 0.0, 0.0, 4.0])
    np.testing.assert_array_equal(batch.components["flat"], [1.0, 1.0, 0.0, 0.0])
    scores, metrics = registry.compute_rewards([("steps", steps, 2.0)], ["p"] * 4, ["c"] * 4)
    assert metrics["reward/steps/mean"] == pytest.approx((0.5 + 0.0 + 2.0) / 3)
