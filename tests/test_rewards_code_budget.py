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
        ("1000000006", "1000000006.0", False),  # a float token never stands for an expected integer
        ("1000000006", "1e9", False),  # print(float(10**9)) for 1000000006, whatever the tolerance
        ("1000000000.0", "1000000006", True),  # an expected float: the tolerance applies
        ("4", "4.0000001", False),
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
    if expected.isdigit():
        assert values.same_output(expected, got, float_tolerance=0.5) is ok  # whatever the tolerance
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


def _reference_count(line: bytes) -> int:
    """Commas and opening brackets outside strings, plus one: a byte at a time."""
    count, inside, escaped = 1, False, False
    for byte in line:
        if inside:
            inside = escaped or byte != 0x22
            escaped = not escaped and byte == 0x5C
        elif byte == 0x22:
            inside = True
        else:
            count += byte in b",[{"
    return count


def test_elements_are_counted_outside_strings_in_one_pass():
    # A quote, then escaped quotes and commas, no closing quote: the old scan restarted its regex at
    # each quote (quadratic, the GIL held: 102 s for these 90 KB, measured by hand) and counted all
    # 30,000 commas. Strings straddling the scan's 1 MiB slices, escapes cut at a slice's end.
    slice_ = values._SLICE
    lines = [
        b'{"i": 0, "value": "' + b'\\",' * 30_000 + b"\n",
        b'["a,b", "\\",", ["c"], {"dict": [[1, "x"]]}]',
        b'["' + b"," * (slice_ - 2) + b'", 1, 2]',  # the string ends exactly at the first slice
        b'["' + b"x" * (slice_ - 3) + b'\\"' + b"," * 10 + b'", [3]]',  # an escape cut by the slice
        b'[' + b'"\\\\",' * (slice_ // 3) + b"[]]",  # many short strings of escaped backslashes
    ]
    for line in lines:  # the result only has to compare with the limit as the exact count would
        exact = _reference_count(line)
        assert values.count_elements(line, exact) <= exact < values.count_elements(line, exact - 1) + 1, line[:40]
        assert values.count_elements(line, exact - 1) > exact - 1
    assert values.count_elements(lines[0], 10) == 3  # json then refuses the unterminated string


def test_a_long_stdout_costs_the_judge_its_own_size_not_a_multiple():
    # 17 MiB of short lines against an expected output of many lines (the reply budget grows with it):
    # splitting them made ~6 million strings. Now a count of line breaks refuses it first.
    expected = "x\n" * 1_000_000
    got = "ab\n" * ((17 << 20) // 3)
    tracemalloc.start()
    try:
        ok = values.same_output(expected, got, float_tolerance=1e-6)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not ok and peak < 2 * len(got), f"{peak >> 20} MiB for a {len(got) >> 20} MiB reply"
    assert values.same_output(expected, expected.replace("x", " x "))  # lines still stripped and compared
