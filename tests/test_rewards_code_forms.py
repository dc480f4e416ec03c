"""`code_tests` with the official harnesses' semantics: every real test form runs (plain asserts,
`check(candidate)`, pytest `test_*` functions and classes, `unittest.TestCase`, `from solution import`),
a case is a check that calls the solution (`no_tests` otherwise), Python's own `==`/`is`/`in`/truthiness
on real values, the solution's names, and the fast path scoring as the checker path does. Each attack
runs beside an honest sibling in the same batch (benchmarks/code_semantics.py holds the table)."""

import os
import sys
import textwrap

import pytest

from jaxrl_llm.rewards.code import parse_tests, run_code_tests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from code_semantics import ATTACKS, HONEST_NO_TESTS, run  # noqa: E402

ADD = "def add(a, b):\n    return a + b\n"


def test_the_attack_table_wrong_zero_honest_full_marks():
    for name, (wrong, honest, wrong_status, honest_status) in run().items():
        assert wrong == 0.0, (name, wrong_status)
        if name in HONEST_NO_TESTS:
            assert (honest, wrong_status, honest_status) == (0.0, "no_tests", "no_tests"), name
        else:
            assert (honest, honest_status) == (1.0, "passed"), name


NO_CASE = [  # test code that runs no case calling the solution
    "def check(candidate):\n    assert candidate(1, 2) == 3\n",
    "import math\nX = 3\n",
    "print('All tests passed!')\n'''a docstring'''\npass\n",
    "if False:\n    assert add(1, 2) == 3\n",
    "import unittest\nclass TestCases(unittest.TestCase):\n    def helper(self):\n        return add(1, 2)\n",
    "def test_nothing():\n    assert 1 + 1 == 2\n",
    "import pytest\n@pytest.mark.skip(reason='later')\ndef test_add():\n    assert add(1, 2) == 3\n",
    "# only a comment\n",
]


def test_tests_that_call_no_solution_score_zero_with_status_no_tests():
    results = run_code_tests(["pass", ADD] * len(NO_CASE), [t for t in NO_CASE for _ in range(2)], max_workers=2)
    assert [(r.status, r.score) for r in results] == [("no_tests", 0.0)] * 2 * len(NO_CASE)


PYTEST_FILE = '''
import pytest
from solution import add

@pytest.fixture
def numbers():
    values = [1, 2, 3]
    yield values
    values.clear()  # teardown runs

@pytest.mark.parametrize("a, b, total", [(1, 2, 3), (0, 0, 0), (-1, 1, 0)])
def test_add(a, b, total):
    assert add(a, b) == total

def test_approx():
    assert add(0.1, 0.2) == pytest.approx(0.3)

def test_raises():
    with pytest.raises(TypeError):
        add(1, "a")

class TestNumbers:
    def setup_method(self, method):
        self.offset = 10

    def test_offset(self, numbers):
        assert add(numbers[0], self.offset) == 11

def test_needs_a_builtin_fixture(tmp_path):
    assert add(1, 1) == 2
'''

UNITTEST_FILE = '''
import unittest

class TestCases(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.base = 10

    def setUp(self):
        self.values = [1, 2, 3]

    def tearDown(self):
        self.values = None

    def test_sum(self):
        self.assertEqual(add(self.base, self.values[0]), 11)

    def test_subtests(self):
        for x in self.values:
            with self.subTest(x=x):
                self.assertEqual(add(x, x), 2 * x)

    def test_raises(self):
        with self.assertRaises(TypeError):
            add(1, "a")

if __name__ == "__main__":
    unittest.main()
'''

def test_pytest_and_unittest_files_each_test_one_case():
    wrong = "def add(a, b):\n    return a - b\n"
    results = run_code_tests([ADD, wrong, ADD, wrong], [PYTEST_FILE, PYTEST_FILE, UNITTEST_FILE, UNITTEST_FILE],
                             max_workers=2)  # fmt: skip
    right, bad, right_unit, bad_unit = results
    # Four pytest tests pass; the one asking for pytest's own tmp_path fails, naming it.
    assert (right.passed, right.total) == (4, 5) and "the pytest fixture 'tmp_path' is not available" in right.reason
    assert (bad.passed, bad.total) == (1, 5)  # a - b: only pytest.raises passes
    assert (right_unit.status, right_unit.passed, right_unit.total) == ("passed", 3, 3)
    assert (bad_unit.passed, bad_unit.total) == (1, 3) and "AssertionError: 9 != 11" in bad_unit.reason


FAST_FORMS = [  # every fast-path assert form
    "assert f(2) == 4", "assert 4 == f(2)", "assert f(2) != True", "assert f(2) is True", "assert f(2) is None",
    "assert f(2)", "assert not f(2)", "assert f(2) in [4, True]", "assert f(2) in (1.0, 2)",
    "assert math.isclose(f(2), 4.0)", "assert abs(f(2) - 1) < 1e-9", "assert abs(f(2) - 4) <= 0",
    "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\ncheck(f)",
]
RETURNS = ["x * x", "1", "True", "float(x * x)", "None", "0", "1.0", "[x]", "(x * x,)", "complex(x * x, 0)", "'4'"]


def python_verdicts(body: str) -> list[bool]:
    """What Python itself (the official harness: solution and test in one program) says of each form."""
    verdicts = []
    for form in FAST_FORMS:
        namespace = {"math": __import__("math")}
        exec(f"def f(x):\n    return {body}\n", namespace)
        try:
            exec(form, namespace)
            verdicts.append(True)
        except Exception:
            verdicts.append(False)
    return verdicts


def test_the_fast_path_scores_as_python_and_as_the_checker_path_on_every_form():
    tests = "import math\n" + "\n".join(FAST_FORMS)  # one row per solution: every form a case
    checker = "_slow = list()\n" + tests  # a call in an assignment: the checker process
    assert {c.kind for c in parse_tests(tests)} == {"call"} and {c.kind for c in parse_tests(checker)} == {"script"}
    codes = [f"def f(x):\n    return {r}\n" for r in RETURNS]
    results = run_code_tests(codes * 2, [tests] * len(codes) + [checker] * len(codes), max_workers=2)
    for k, body in enumerate(RETURNS):
        expected = sum(python_verdicts(body))
        fast, slow = results[k], results[len(codes) + k]
        assert (fast.passed, fast.total) == (slow.passed, slow.total) == (expected, len(FAST_FORMS)), (body, fast, slow)
    assert python_verdicts("1")[2] is False and python_verdicts("float(x * x)")[0] is True  # 1 == True, 4.0 == 4


def test_real_values_cross_both_ways_and_in_place_changes_come_back():
    # A Counter, a defaultdict, a deque and a builtin type as arguments of a checker-path call (the
    # judge used to fail the whole batch on them: marshal took only plain types), changed in place.
    code = textwrap.dedent(
        """
        def f(counter, table, queue, kind):
            counter["z"] += 1
            table["new"].append(1)
            queue.appendleft(0)
            return kind(3), type(counter).__name__
        """
    )
    tests = textwrap.dedent(
        """
        from collections import Counter, defaultdict, deque
        c, t, q = Counter("aab"), defaultdict(list), deque([1, 2], maxlen=3)
        assert f(c, t, q, float) == (3.0, "Counter")
        assert c == Counter("aabz") and t == {"new": [1]} and list(q) == [0, 1, 2]
        """
    )
    wrong = code.replace('counter["z"] += 1', "counter = Counter()")
    right, bad = run_code_tests([code, wrong], [tests, tests], max_workers=2)
    assert (right.status, right.passed, right.total) == ("passed", 1, 1), right
    assert bad.score == 0.0, bad
