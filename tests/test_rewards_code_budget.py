"""The judge cannot be stalled: one decoding budget, hash-safe sets and dicts, comparison errors that
fail one case, bounded replies; each attack beside an honest sibling in the same batch. And exact
integers under `float_tolerance`."""

import json
import os
import sys
import time
import tracemalloc

import pytest

from jaxrl_llm.rewards.code import values

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from code_reward_attacks import ATTACKS, run_attack  # noqa: E402

TIMEOUT = 5.0


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attacks_cost_the_judge_little_and_spare_the_sibling(name):
    tracemalloc.start()
    start = time.monotonic()
    try:
        attack, sibling, how = run_attack(name, TIMEOUT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (attack, sibling) == (0.0, 1.0), how
    assert time.monotonic() - start < TIMEOUT + 5  # a generous bound: before, minutes
    assert peak < 160 << 20, f"the judge allocated {peak >> 20} MiB"  # before: GiBs


def test_sets_and_dicts_decode_without_worst_case_hashing():
    p = 2**61 - 1
    for value in [{-1, -2}, {1, 2.5, "a", (1, 2), frozenset({3})}, {k * p for k in range(60)}, {(1,): {2: 3}}]:
        assert values.decode(json.loads(json.dumps(values.encode(value)))) == value  # few equal hashes: fine
    for bad in [{"set": [k * p for k in range(1, 200)]}, {"dict": [[k * p, 0] for k in range(1, 200)]},
                {"frozenset": [[k * p] for k in range(1, 200)]}]:  # fmt: skip
        with pytest.raises((ValueError, TypeError)):
            values.decode(bad)
    start = time.thread_time()  # CPU time of this thread: a loaded host does not fail the test
    with pytest.raises(ValueError, match="too many equal hashes"):
        values.decode({"set": [k * p for k in range(1, 200_000)]})
    assert time.thread_time() - start < 5  # quadratic: hours


def test_the_budget_is_checked_before_parsing():
    budget = values.Budget(bytes=1000, elements=50, digits=20)
    assert values.read_reply(b'{"i": 0, "value": [1, 2, 3]}', budget) == {"i": 0, "value": [1, 2, 3]}
    with pytest.raises(ValueError, match="reply of 1013 bytes over the budget of 1000"):
        values.read_reply(b'{"value": "' + b"x" * 1000 + b'"}', budget)
    with pytest.raises(ValueError, match="more than 50 elements"):
        values.read_reply(b'{"value": [' + b"[]," * 60 + b"[]]}", budget)
    with pytest.raises(ValueError, match="integer of more than 20 digits"):
        values.read_reply(b'{"value": -' + b"9" * 21 + b"}", budget)
    line = b'{"value": "' + b"," * 500 + b'"}'  # commas inside a string are not elements
    assert values.count_elements(line, 50) == 2 and values.read_reply(line, budget)["value"] == "," * 500
    escaped = b'{"value": "\\"' + b"," * 500 + b'"}'
    assert values.count_elements(escaped, 50) == 2
    with pytest.raises(RecursionError):
        values.read_reply(b'{"value": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", values.Budget(bytes=1 << 20))


@pytest.mark.parametrize(
    "expected, got, ok",
    [
        ("1000000006", "1000000000", False),  # within 1e-6 relative, but integers compare exactly
        ("1000000006", "1_000_000_006", False),  # not a plain number: compared as text
        ("1000000006", "1000000006.0", True),  # a float on one side: the tolerance applies
        ("0.3333333", "0.33333334", True),
        ("2.5e3", "2500", True),
        ("2", "3", False),
        ("inf", "1e400", False),
        ("abc 1.0", "abc 1.0000001", True),
        ("abc", "abd", False),
        ("7", "+7", False),
    ],
)
def test_float_tolerance_applies_only_to_floats(expected, got, ok):
    assert values.same_output(expected, got, float_tolerance=1e-6) is ok
    assert values.same_output(expected, expected, float_tolerance=1e-6)


def test_decoding_and_comparing_count_against_the_row_timeout(monkeypatch):
    from jaxrl_llm.rewards.code import parse_tests, run_sandboxed

    real_equal = values.equal

    def slow_equal(*args):  # a comparison that takes its time, as a huge honest answer would
        time.sleep(0.8)
        return real_equal(*args)

    monkeypatch.setattr(values, "equal", slow_equal)  # the judge calls values.equal
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(3, 3) == 6"]
    assert [c.kind for c in parse_tests(tests)] == ["call"] * 3
    result = run_sandboxed("def add(a, b):\n    return a + b", tests, timeout=1.5)
    # The second comparison ends past the deadline: it does not count (answered in time, it would).
    assert result.status == "timeout" and (result.passed, result.total) == (1, 3), result


def test_the_checker_process_has_limits_of_its_own():
    from jaxrl_llm.rewards.code import run_sandboxed

    add = "def add(a, b):\n    return a + b"
    start = time.monotonic()
    result = run_sandboxed(add, ["assert add(1, 2) == 3 and add(0, 0) == 0", "while True:\n    pass"], timeout=2)
    assert result.status == "timeout" and (result.passed, result.total) == (1, 2), result
    assert time.monotonic() - start < 2 + 10  # the 2 s limit, not the endless loop; slack for a loaded host
    # Test code that allocates past the checker's RLIMIT_AS fails that case only.
    result = run_sandboxed(add, ["x = add(1, 2)\nassert x == 3", "assert len(bytearray(4 << 30)) > 0"], timeout=5)
    assert (result.passed, result.total) == (1, 2) and "MemoryError" in result.reason, result
