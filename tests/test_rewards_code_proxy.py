"""Proxy calls of the checker process go straight to the sandbox over the pipe pair the judge sets
up (`checker.Pipes`): many calls fit the default timeout, and everything the judge enforced when it
relayed each reply still holds on the direct path (the reply budget, refusals, the order of replies,
stdout kept apart from replies, the deadline, the output cap). Each attack runs beside an honest
sibling in the same batch."""

import os

import pytest
from fixtures_sandbox import require_bwrap

from jaxrl_llm.rewards.code import DEFAULT_TIMEOUT, parse_tests, run_code_tests

# A pytest-style test: the checker path (`script`), never the fast path.
PYTEST = "def test_add():\n    assert add(1, 2) == 3\n    assert add(20, 22) == 42\n"
HONEST = "def add(a, b):\n    return a + b\n"


def test_pytest_tests_take_the_checker_path():
    assert {case.kind for case in parse_tests(PYTEST)} == {"script"}


def test_100000_proxy_calls_of_a_correct_solution_pass():
    """Correctness at that scale; the time is benchmarks/code_semantics.py --calls' to measure (0.06 ms a
    call on the dev machine: 6 s of the default 10 s timeout, docs/rewards.md), never a test's: a loaded
    CI machine would make a wall-time bound flaky."""
    require_bwrap()
    tests = "for i in range(100000):\n    assert f(i) == i + 1\n"
    correct, wrong = "def f(x):\n    return x + 1\n", "def f(x):\n    return x + 2\n"
    right, off = run_code_tests([correct, wrong], [tests, tests], timeout=6 * DEFAULT_TIMEOUT, max_workers=2)
    assert (right.status, right.score) == ("passed", 1.0), right
    assert (off.status, off.score) == ("failed", 0.0), off
    assert "assert f(i) == i + 1" in off.reason


FORGE = "import os, sys\nREPLY = int(sys.argv[2])  # the checker's pipe once the solution runs\n"

# name -> (solution, status, a part of the reason)
ATTACKS = {
    "a reply over the budget": ("def add(a, b):\n    return 'a' * (20 << 20)\n", "output_limit", "a reply over"),
    "forged refusals": (FORGE + "def add(a, b):\n    while True:\n        os.write(REPLY, b'{\"blocked\": \"x\"}\\n')\n",
                        "blocked", "more)"),
    "a reply out of order": (FORGE + "def add(a, b):\n    os.write(REPLY, b'{\"i\": 7, \"value\": 3}\\n')\n"
                             "    return a + b\n", "crashed", "reply for call 7 when call 0 was made"),
    "an unreadable reply": (FORGE + "def add(a, b):\n    os.write(REPLY, b'{\"i\": 0, \"value\": NaN}\\n')\n",
                            "crashed", "unreadable reply"),
    "a reply line on stdout": ("def add(a, b):\n    print('{\"i\": 0, \"value\": 3}')\n    return 0\n", "failed",
                               "AssertionError"),
    "a stdout flood": ("def add(a, b):\n    while True:\n        print('x' * 65536)\n", "output_limit",
                       "stdout and stderr"),
    "a hang": ("def add(a, b):\n    while True:\n        pass\n", "timeout", "wall-clock"),
    "an exit in a call": ("import os\ndef add(a, b):\n    os._exit(3)\n", "crashed", "exited with code 3"),
    "a MemoryError": ("def add(a, b):\n    return [0] * (10 ** 10)\n", "memory", "MemoryError"),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_the_direct_path_keeps_the_judges_limits_beside_an_honest_sibling(name):
    require_bwrap()
    solution, status, reason = ATTACKS[name]
    attack, sibling = run_code_tests([solution, HONEST], [PYTEST, PYTEST], timeout=4.0, max_workers=2)
    assert (sibling.status, sibling.score) == ("passed", 1.0), sibling
    assert (attack.status, attack.score) == (status, 0.0), attack
    assert reason in attack.reason, attack


def test_a_judge_with_hundreds_of_open_descriptors_hands_the_pipes_over():
    """A trainer holds hundreds of descriptors, so the sandbox's pipe numbers can lie past its
    RLIMIT_NOFILE; the runner's handover dup2s onto them (on the previous code: both rows 'crashed',
    'exited with code 0 after 1 of 2 tests', seen first in CI's long-lived test workers)."""
    require_bwrap()
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(300)]
    try:
        right, wrong = run_code_tests([HONEST, "def add(a, b):\n    return a - b\n"], [PYTEST, PYTEST], max_workers=2)
    finally:
        for fd in held:
            os.close(fd)
    assert (right.status, right.score) == ("passed", 1.0), right
    assert (wrong.status, wrong.score) == ("failed", 0.0), wrong
