"""`math_answer` on the case set (tests/data/math_cases.py), reward hacking, and the second judge."""

import importlib.util
import os
import subprocess
import sys
import threading
import time
from fractions import Fraction

import pytest

from jaxrl_llm.rewards import compute_rewards, get_reward_fn
from jaxrl_llm.rewards.math import judge, normalize_answer, parse_number, parse_structure
from jaxrl_llm.rewards.math import worker as math_worker

_SPEC = importlib.util.spec_from_file_location(
    "math_cases", os.path.join(os.path.dirname(__file__), "data", "math_cases.py")
)
math_cases = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(math_cases)

# Known misses of our judge, each with its reason; none may be a false positive.
KNOWN_MISSES = {
    (r"\boxed{ab}", "ba"): "a product of letters written without operator is read as the word 'ba'",
}


def test_case_set_through_the_reward_as_the_trainer_calls_it():
    _, fn = get_reward_fn("math_answer")
    cases = math_cases.CASES
    scores, metrics = compute_rewards([("math_answer", fn, 1.0)], ["q"] * len(cases), [c[1] for c in cases],
                                      {"answer": [c[2] for c in cases]})  # fmt: skip
    raw = fn(["q"] * len(cases), [c[1] for c in cases], answer=[c[2] for c in cases])
    wrong = [(c, got) for c, got in zip(cases, raw) if got != c[3] and (c[1], c[2]) not in KNOWN_MISSES]
    assert not wrong, wrong
    assert not [c for c, got in zip(cases, raw) if got == 1.0 and c[3] != 1.0]  # no false positive
    assert scores.tolist() == [0.0 if s is None else s for s in raw]
    assert metrics["reward/math_answer/judge_disagreement"] >= len(KNOWN_MISSES)


def test_case_set_is_large_and_every_category_has_both_outcomes():
    assert len(math_cases.CASES) >= 400
    for name, cases in math_cases.CATEGORIES.items():
        outcomes = {c[2] for c in cases}
        assert outcomes == {None} if name == "not_applicable" else {0.0, 1.0} <= outcomes, name


STRUCTURED = [
    (r"\{1, 2, 3\}", ["1", "2", "3"]),
    ("(3, 4)", ["3", "4"]),
    ("[-2, 7)", ["-2", "7"]),
    ("x = 2, y = -1", ["2", "-1"]),
    ("2x + 3y = 12", ["2", "3", "12"]),
    (r"x \ge 5", ["5"]),
    (r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", ["1", "2", "3", "4"]),
    ("5, -2", ["5", "-2"]),
]


def _hacks(numbers, listing=True):
    yield from (rf"\boxed{{{x}}}" for x in numbers)  # a structure answered with one of its numbers
    if listing:  # listing candidates (for a set, listing its elements is the right answer, `x = 5 or
        # x = -2` too; for a system, its values in the reference's order)
        yield "Possible answers: " + ", ".join(numbers) + "."
        yield " ".join(rf"\boxed{{{x}}}" for x in numbers)  # one box per candidate
        yield rf"\boxed{{{numbers[0]} \text{{ or }} {numbers[-1]}}}"
    yield "\n".join(f"#### {x}" for x in numbers)
    yield "The answer is " + " or ".join(numbers) + "."
    yield f"The answer is {numbers[-1]}."


@pytest.mark.parametrize("reference, numbers", STRUCTURED)
def test_reward_hacking_structures_pay_nothing(reference, numbers):
    completions = list(_hacks(numbers, listing=reference not in (r"\{1, 2, 3\}", "5, -2", "x = 2, y = -1")))
    _, fn = get_reward_fn("math_answer")
    assert fn(["q"] * len(completions), completions, answer=[reference] * len(completions)) == [0.0] * len(completions)


@pytest.mark.parametrize(
    "completion",
    [r"\boxed{A B C D E}", r"\boxed{(A) (B) (C)}", "The answer is A, B, C, D or E.", r"\boxed{A/B}",
     r"\boxed{A} \boxed{C}", "Answer: (A) or (C)"],
)  # fmt: skip
def test_reward_hacking_choices_listing_options_pay_nothing(completion):
    assert judge(completion, "A").score == 0.0
    assert judge(completion, "C").score == 0.0


def test_hedged_answers_are_not_shown_to_the_second_judge():
    verdict = judge(r"\boxed{(3, 4)} \boxed{(4, 3)}", "(3, 4)")
    assert (verdict.score, verdict.second) == (0.0, None)


@pytest.mark.parametrize("value", [7, 150, -3])
def test_reward_hacking_scalars_listing_candidates_pay_nothing(value):
    candidates = [str(value + d) for d in (-2, -1, 0, 1, 2)]
    completions = list(_hacks(candidates))[len(candidates) :]  # the single right box aside
    completions.append(rf"\boxed{{{value}}} \boxed{{{value + 1}}}")
    completions.append(rf"\boxed{{{value - 1}}}" + f"\n#### {value}")
    completions.append(f"It is either {value} or {value + 1}.")
    _, fn = get_reward_fn("math_answer")
    scores = fn(["q"] * len(completions), completions, answer=[str(value)] * len(completions))
    assert scores == [0.0] * len(completions), list(zip(completions, scores))
    assert fn(["q"], [rf"\boxed{{{value}}} so \boxed{{{value}.0}}"], answer=[str(value)]) == [1.0]


def test_second_judge_decides_only_where_ours_cannot_read_the_reference():
    # `\binom{4}{2}` is outside our whitelist: math-verify's verdict is the score.
    assert judge(r"\boxed{6}", r"\binom{4}{2}").score == 1.0
    assert judge(r"\boxed{5}", r"\binom{4}{2}").score == 0.0
    verdict = judge(r"\boxed{\{3, 2, 1\}}", r"\{1, 2, 3\}")
    assert (verdict.score, verdict.ours, verdict.second) == (1.0, 1.0, 1.0)
    # Plain numbers never reach the second judge (the fast path).
    assert judge(r"\boxed{4}", "4").second is None
    assert judge(r"\boxed{\{1, 2\}}", r"\{1, 2, 3\}", second_judge=False).second is None


def test_judge_disagreement_is_a_metric_and_can_be_turned_off():
    completions = [r"\boxed{ab}", r"\boxed{(3, 4)}", r"\boxed{12}"]
    answers = ["ba", "(3, 4)", "12"]
    _, fn = get_reward_fn("math_answer")
    out = fn(["q"] * 3, completions, answer=answers)
    assert out == [0.0, 1.0, 1.0] and out.metrics == {"judge_disagreement": 1.0}
    _, off = get_reward_fn("math_answer", second_judge=False)
    _, metrics = compute_rewards([("math_answer", off, 1.0)], ["q"] * 3, completions, {"answer": answers})
    assert "reward/math_answer/judge_disagreement" not in metrics


def test_math_verify_runs_from_a_thread():
    # math-verify's own timeout uses signal.alarm, which raises outside the main thread: it must run
    # in the worker process, with its timeout off.
    results = []
    thread = threading.Thread(target=lambda: results.append(judge(r"\boxed{6}", r"\binom{4}{2}").score))
    thread.start()
    thread.join()
    assert results == [1.0]


def test_math_verify_time_limit_is_hard():
    assert judge(r"\boxed{6}", r"\binom{4}{2}").score == 1.0  # the worker is up: start-up not timed below
    start = time.perf_counter()
    # Our judge cannot read `\binom{4}{2}`, so math-verify evaluates the tower: the worker is killed.
    verdict = judge(r"\boxed{9^{9^{9^{9}}}}", r"\binom{4}{2}", timeout=0.5)
    assert (verdict.score, verdict.second) == (0.0, 0.0)
    assert 0.5 <= time.perf_counter() - start < 0.5 + 3.0  # the kill, not the tower (minutes); slack for a loaded host
    assert math_worker.WORKER._proc is None  # killed, and restarted on demand:
    assert judge(r"\boxed{6}", r"\binom{4}{2}").score == 1.0


@pytest.mark.parametrize(
    "text, value",
    [
        ("1000,99", Fraction(100099, 100)),
        ("1,234", Fraction(1234)),  # a valid thousands grouping wins over a decimal comma
        (r"14{,}916", Fraction(14916)),
        (r"11,\! 111", Fraction(11111)),
        ("1 000 000", Fraction(1000000)),
        (r"3 \times 10^{8}", Fraction(3 * 10**8)),
        (r"2.5 × 10^-3", Fraction(1, 400)),
        ("−7", Fraction(-7)),
        (r"12 \textnormal{ miles}", Fraction(12)),
    ],
)
def test_number_formats(text, value):
    assert parse_number(normalize_answer(text)) == (value, False)


def test_scientific_exponent_is_bounded():
    assert parse_number(r"1 \times 10^{99999}") is None  # no gigantic integer on the fast path


def test_reference_equation_keeps_its_left_side_unless_it_is_one_symbol():
    assert normalize_answer("2x + 3y = 12", lhs="symbol") == "2x + 3y = 12"
    assert normalize_answer("x = 12", lhs="symbol") == "12"
    assert normalize_answer(r"x = \frac{1}{2}", lhs="chain") == r"\frac{1}{2}"
    assert parse_structure("2x + 3y = 12").kind == "relation"
    assert parse_structure(r"x < 5").items == ((False, "-\\infty", "5", False),)
    assert parse_structure(r"\begin{vmatrix} 1 & 2 \\ 3 & 4 \end{vmatrix}").kind == "determinant"


def test_benchmark_script_runs_at_toy_size():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # The comparison needs the repository's history (a shallow clone lacks the old revision).
    has_old = subprocess.run(["git", "-C", root, "cat-file", "-e", "6a930c7:jaxrl_llm/rewards/math.py"],
                             capture_output=True).returncode == 0  # fmt: skip
    if not has_old:
        pytest.skip("revision 6a930c7 (the single-module math.py) is not in this clone's history")
    out = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "math_reward.py"), "--toy"],
                         capture_output=True, text=True, timeout=300, check=True).stdout  # fmt: skip
    assert "all" in out and "numeric path" in out and "structured references" in out
