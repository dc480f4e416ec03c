"""The code judge against the official harnesses' semantics: each item of the attack table as a wrong
solution (must score 0) beside an honest one (must score 1.0) on the same tests, in one batch.

    python benchmarks/code_semantics.py          # prints: item, wrong score, honest score, statuses
    python benchmarks/code_semantics.py --calls  # the cost of one proxy call (checker -> sandbox)

tests/test_rewards_code_forms.py runs the same table. Run it against another tree with
PYTHONPATH=<tree> to compare (the note of issue 60 has the before/after table).
"""

from __future__ import annotations

import os
import sys
import textwrap

ADD = "def add(a, b):\n    return a + b\n"

# name -> (tests, wrong solution, honest solution)
ATTACKS: dict[str, tuple[str, str, str]] = {
    "pytest functions, the empty solution": (
        "def test_add():\n    assert add(1, 2) == 3\n", "pass", ADD),
    "unittest.TestCase, the empty solution": (
        "import unittest\nclass TestCases(unittest.TestCase):\n    def test_add(self):\n"
        "        self.assertEqual(add(1, 2), 3)\n", "pass", ADD),
    "check(candidate) never called": (
        "def check(fn):\n    assert fn(1, 2) == 3\n", "pass", ADD),  # honest: no_tests too, so 0 (see below)
    "from solution import (KodCode)": (
        "from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n", "def add(a, b):\n    return a - b", ADD),
    "print() beside asserts": (
        "assert add(1, 2) == 3\nassert add(2, 2) == 4\nassert add(0, 0) == 0\nassert add(5, 5) == 10\n"
        "print('All tests passed!')\n", "def add(a, b):\n    return -1", ADD),
    "`!= True` with 1 for True": (
        "assert is_odd(2) != True\n", "def is_odd(n):\n    return 1", "def is_odd(n):\n    return n % 2 == 1"),
    "float result for an int (MBPP)": (
        "assert area(2) == 4\n", "def area(r):\n    return 5.0", "def area(r):\n    return float(r * r)"),
    "Counter result (MBPP)": (
        "from collections import Counter\nassert count('aab') == Counter({'a': 2, 'b': 1})\n",
        "def count(s):\n    return {'a': 1}", "from collections import Counter\ndef count(s):\n    return Counter(s)"),
    "a function named max": (
        "assert max([1, 5, 3]) + 0 == 5\n", "def max(xs):\n    return 0", "def max(xs):\n    return sorted(xs)[-1]"),
    "a solution's round() judging its area": (
        "assert round(area(3), 2) == 28.27\n", "def area(r):\n    return 0\ndef round(x, n):\n    return 28.27",
        "import math\ndef area(r):\n    return math.pi * r * r"),
    "a name bound elsewhere in the tests": (
        "def helper(add):\n    return add\nassert add(1, 2) == 3\n", "def add(a, b):\n    return 0", ADD),
    "quit() is the solution's": (
        "assert quit(2) + 0 == 4\n", "def quit(x):\n    return x", "def quit(x):\n    return 2 * x"),
    "StopIteration ends all(map(...))": (
        "assert all(map(is_even, [2, 3, 4]))\n", "def is_even(n):\n    raise StopIteration",
        "def is_even(n):\n    return True if n != 3 else 3 % 2 == 1"),
    "unittest.main() at the end": (
        "import unittest\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n"
        "if __name__ == '__main__':\n    unittest.main()\n", "def add(a, b):\n    return 5", ADD),
    "in-place result": (
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]\n", "def sort_in_place(xs):\n    return sorted(xs)",
        "def sort_in_place(xs):\n    xs.sort()"),
}
HONEST_NO_TESTS = {"check(candidate) never called"}  # the honest solution scores 0 too: the tests run nothing


def run(max_workers: int = 2) -> dict[str, tuple[float, float, str, str]]:
    """name -> (wrong score, honest score, wrong status, honest status), all rows in one batch."""
    from jaxrl_llm.rewards.code import run_code_tests

    names = list(ATTACKS)
    completions = [ATTACKS[n][1] for n in names] + [ATTACKS[n][2] for n in names]
    tests = [ATTACKS[n][0] for n in names] * 2
    results = run_code_tests(completions, tests, max_workers=max_workers)
    k = len(names)
    return {n: (results[i].score, results[k + i].score, results[i].status, results[k + i].status)
            for i, n in enumerate(names)}  # fmt: skip


def per_call_ms(calls: int = 20_000, repeats: int = 3) -> tuple[float, float]:
    """(ms per proxy call, seconds for `calls` calls): the best of `repeats` runs of a test making
    `calls` calls of a trivial solution, less the best run making one call (start-up, load)."""
    from jaxrl_llm.rewards.code import run_sandboxed

    solution = "def f(x):\n    return x + 1\n"

    def best(n: int) -> float:
        tests = f"for i in range({n}):\n    assert f(i) == i + 1\n"
        results = [run_sandboxed(solution, tests, timeout=600) for _ in range(repeats)]
        if any(r.score != 1.0 for r in results):
            raise RuntimeError(f"the trivial solution did not pass: {results}")
        return min(r.duration_s for r in results)

    many, one = best(calls), best(1)
    return 1000 * (many - one) / (calls - 1), many


def main() -> None:
    if not os.environ.get("PYTHONPATH"):  # PYTHONPATH=<tree> judges with that tree
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if "--calls" in sys.argv:
        from jaxrl_llm.rewards.code import sandbox_layers

        ms, seconds = per_call_ms()
        load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        print(f"layers: {', '.join(sandbox_layers())}; {load}")
        print(f"{ms:.4f} ms per proxy call ({seconds:.2f} s for 20,000 calls, start-up included)")
        return
    for name, (wrong, honest, ws, hs) in run().items():
        print(f"{name:<40} wrong {wrong:.2f} ({ws})  honest {honest:.2f} ({hs})")


if __name__ == "__main__":
    main()
