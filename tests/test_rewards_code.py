"""`code_tests`: test formats, assert parsing, exact comparison, scoring and statuses.

The attack catalogue: test_rewards_code_hacks.py (reward hacks) and test_rewards_code_harm.py (host harm).
"""

import json
import os
import textwrap
import time

import pytest

from jaxrl_llm.rewards import get_reward_fn
from jaxrl_llm.rewards.code import Case, code_tests, extract_code, parse_tests, run_code_tests, run_sandboxed, values

ADD = "def add(a, b):\n    return a + b\n"
SUM_STDIN = "a, b = map(int, input().split())\nprint(a + b)\n"


# ----------------------------------------------------------------------------- formats


def test_assert_forms_become_function_call_cases():
    source = textwrap.dedent(
        """
        import math
        assert add(1, 2) == 3; assert 3 == add(2, 1)
        assert add(1, b=2) != 4
        assert find([1], 2) is None
        assert add(1, 1) in (2, 3)
        assert math.isclose(add(0.1, 0.2), 0.3, rel_tol=1e-6)
        assert abs(add(0.1, 0.2) - 0.3) < 1e-9
        assert is_even(2)
        assert not is_even(3)
        assert Solution().twoSum([2, 7], 9) == [0, 1]
        """
    )
    cases = parse_tests(source)
    assert [(c.payload[0], c.check) for c in cases] == [
        ("add", "eq"), ("add", "eq"), ("add", "ne"), ("find", "is"), ("add", "in"), ("add", "isclose"),
        ("add", "abs_lt"), ("is_even", "truthy"), ("is_even", "falsy"), ("twoSum", "eq"),
    ]  # fmt: skip
    assert cases[2].payload == ("add", [1], {"b": 2}) and cases[2].expected == 4
    assert cases[5].rel_tol == 1e-6 and cases[6].abs_tol == 1e-9
    assert parse_tests(["assert add(1, 2) == 3"]) == [Case("call", ("add", [1, 2], {}), 3)]
    assert parse_tests("") == [] and parse_tests([]) == []


@pytest.mark.parametrize(
    "test, passing, failing",
    [  # forms beyond the fast path run in the checker process: the test code's own verdict
        ("assert add(1, 2) + 1 == 4", ADD, "def add(a, b):\n    return a - b"),
        ("x = 2\nassert add(x, 2) == 4", ADD, "def add(a, b):\n    return 5"),
        ("def expected(a, b):\n    return a + b\nassert add(1, 2) == expected(1, 2)", ADD, "def add(a, b):\n    return 0"),
        ("assert add(*[1, 2]) == 3", ADD, "def add(a, b):\n    return (a, b)"),
        ("assert add(1, 2) == complex(0, 1)", "def add(a, b):\n    return 1j", ADD),
        ("import math\nassert math.isclose(add(0.1, 0.2), 0.3) and add(1, 1) > 1", ADD, "def add(a, b):\n    return 0.3"),
        ("assert math.isclose(add(0.1, 0.2) * 1, 0.3)", ADD, "def add(a, b):\n    return 0.4"),  # math: the module
        ("if __name__ == '__main__':\n    assert add(1, 2) == 3", ADD, "def add(a, b):\n    return 0"),
    ],
)
def test_other_test_code_runs_in_the_checker(test, passing, failing):
    cases = parse_tests(test)
    assert {c.kind for c in cases} == {"script"} and sum(c.counted for c in cases) == 1
    assert run_sandboxed(passing, test, timeout=5).score == 1.0
    assert run_sandboxed(failing, test, timeout=5).score == 0.0


def test_test_code_errors_are_early_and_clear():
    with pytest.raises(ValueError, match=r"tests\[1\] is not valid Python"):
        parse_tests(["assert f(1) == 1", "assert ("])
    with pytest.warns(DeprecationWarning, match="unsafe_asserts is deprecated and ignored"):
        assert parse_tests(["assert add(1, 2) == 3"], unsafe_asserts=True) == parse_tests(["assert add(1, 2) == 3"])


def test_dict_formats_and_their_errors():
    assert parse_tests({"inputs": ["1 2\n"], "outputs": ["3\n"]}) == [Case("stdio", "1 2\n", "3\n")]
    calls = {"fn_name": "add", "inputs": [[1, 2], [[1], [2]]], "outputs": [3, [1, 2]]}
    assert parse_tests(calls)[1] == Case("call", ("add", [[1], [2]], {}), [1, 2])
    assert parse_tests(json.dumps(calls)) == parse_tests(calls)  # the JSON text of a dataset column
    with pytest.raises(ValueError, match=r"tests\['inputs'\] and tests\['outputs'\] must be lists of the same"):
        parse_tests({"inputs": ["1"], "outputs": []})
    with pytest.raises(ValueError, match="must hold strings"):
        parse_tests({"inputs": [1], "outputs": ["1"]})
    with pytest.raises(ValueError, match=r"tests\['fn_name'\] must be a Python identifier"):
        parse_tests({"fn_name": "a b", "inputs": [[1]], "outputs": [1]})
    with pytest.raises(ValueError, match=r"tests\['outputs'\]\[0\] is not a plain value"):
        parse_tests({"fn_name": "f", "inputs": [[1]], "outputs": [object()]})
    with pytest.raises(ValueError, match="tests looks like JSON but is not"):
        parse_tests("{inputs")
    with pytest.raises(ValueError, match="tests must be a dict, a string or a list of strings, got int"):
        parse_tests(3)
    with pytest.raises(ValueError, match=r"tests is not valid Python: .* \(line 1\)"):
        parse_tests("assert (")


def test_checker_cases_proxies_and_exact_equality():
    tests = textwrap.dedent(
        """
        import math
        def helper(n):
            return [add(i, i) for i in range(n)]
        total = sum(helper(3))
        assert total == 6
        for i in range(5):
            assert add(i, 1) == i + 1, "loop"
        assert Solution().twice(2) == 4
        print("test code may print")
        """
    )
    cases = parse_tests(tests)
    assert [c.counted for c in cases] == [False, False, False, True, True, True, False]  # print(...): a bare call
    modules = lambda tests: [n for n, kind in parse_tests(tests)[0].payload[1] if kind == "module"]
    assert modules(tests) == []  # the solution's names are known at run time; `math` is imported
    assert modules("assert math.isclose(f(1), 1.0) or g()") == ["math"]
    code = ADD + "class Solution:\n    def twice(self, x):\n        return 2 * x\n"
    result = run_sandboxed(code, tests, timeout=5)
    assert (result.status, result.passed, result.total) == ("passed", 3, 3)  # print() calls no solution: no case
    # `==` is Python's, as in the official harnesses: 3.0 == 3.
    assert run_sandboxed(code.replace("a + b", "float(a + b)"), tests, timeout=5).score == 1.0
    result = run_sandboxed(code.replace("a + b", "a * b"), tests, timeout=5)
    assert (result.passed, result.reason) == (1, "test 3 failed: AssertionError: assert total == 6")
    # float_tolerance reaches the checker's exact comparison too.
    assert run_sandboxed("def f():\n    return 0.1 + 0.2", "x = f()\nassert x == 0.3").score == 0.0
    assert run_sandboxed("def f():\n    return 0.1 + 0.2", "x = f()\nassert x == 0.3", float_tolerance=1e-9).score == 1.0
    # A setup statement that raises fails the whole row, even the cases that passed before it.
    setup = ["assert add(1, 1) == 2 and add(0, 0) == 0", "ok = check(add)", "assert add(2, 2) == 4"]
    check = "def check(f):\n    assert f(3, 3) == 6\n    return True"
    wrong = ADD.replace("a + b", "a + b + (a == 3)")
    assert run_sandboxed(ADD, [check] + setup, timeout=5).score == 1.0
    result = run_sandboxed(wrong, [check] + setup, timeout=5)
    assert (result.score, result.reason) == (0.0, "test 2 failed: AssertionError: assert f(3, 3) == 6"), result
    # An exception of the solution reaches the test code as the same builtin type.
    raising = "def f(x):\n    raise ValueError('no')"
    caught = "try:\n    f(1)\n    ok = False\nexcept ValueError:\n    ok = True\nassert ok"
    assert run_sandboxed(raising, caught, timeout=5).score == 1.0


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("Here:\n```python\nx = 1\n```\nthen\n```python\nx = 2\n```", "x = 2\n"),
        ("```py\nx = 3\n```", "x = 3\n"),
        ("```\nx = 4\n```\n```bash\nls\n```", "x = 4\n"),
        ("```bash\nls\n```\n```Python3\nx = 5\n```", "x = 5\n"),
        ("<think>use a loop</think>\nx = 6", "\nx = 6"),
        ("x = 7", "x = 7"),
        ("Truncated:\n```python\nx = 8\nwhile", "x = 8\nwhile"),
    ],
)
def test_extract_code(completion, expected):
    assert extract_code(completion) == expected


# ----------------------------------------------------------------------------- values


def test_values_round_trip_as_the_same_python_types():
    from collections import Counter, OrderedDict, defaultdict, deque

    plain = [None, True, 3, -2.5, "s", [1, (2, 3)], {1: "a", "b": [2]}, {1, 2}, frozenset({3}), float("inf"),
             complex(1, -2), b"\x00\xff", bytearray(b"ab"), Counter("abca"), OrderedDict(b=1, a=2),
             defaultdict(list, {1: [2]}), deque([1, 2], 5), [complex(float("nan"), 1)], [int, type(None)]]  # fmt: skip
    for value in plain:
        back = values.decode(json.loads(json.dumps(values.encode(value))))
        assert type(back) is type(value) and repr(back) == repr(value)
    assert values.decode(values.encode(defaultdict(lambda: 0))).default_factory is None  # a lambda cannot cross
    assert values.equal(1, True) and values.equal(240.0, 240) and values.equal(Counter(a=1), {"a": 1})
    assert values.equal(0.3, 0.1 + 0.2, 1e-9) and not values.equal(0.3, 0.1 + 0.2)
    for bad in [object(), type("I", (int,), {})(3), [range(3)], __import__("collections").namedtuple("P", "x")(1),
                object, type("T", (), {})]:  # fmt: skip
        with pytest.raises(TypeError, match="cannot cross the sandbox boundary"):
            values.encode(bad)
    for bad in [{"tuple": 1}, {"x": []}, {"dict": [[1]]}, {"a": 1, "b": 2}, {"complex": ["1", 2]},
                {"defaultdict": ["eval", []]}, {"deque": [[1, 2], 1]}, {"bytes": 3}, {"type": "object"}]:  # fmt: skip
        with pytest.raises(ValueError):
            values.decode(bad)
    with pytest.raises(ValueError, match="non-standard JSON constant NaN"):
        values.read_reply(b'{"value": NaN}', values.Budget())
    assert values.same_output("1 2\n3\n", "1 2  \n3\n\n") and not values.same_output("3", "3.0")
    assert values.same_output("0.3333", "0.33333", float_tolerance=1e-3)


# ----------------------------------------------------------------------------- scoring


def test_function_call_scoring_and_statuses():
    result = run_sandboxed(ADD, ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add(0, 0) == 0"])
    assert (result.status, result.passed, result.total) == ("failed", 2, 3)
    assert result.score == pytest.approx(2 / 3) and result.reason == "test 1 failed: returned 4"
    result = run_sandboxed("def add(a, b):\n    return a +", ["assert add(1, 2) == 3"])
    assert result.status == "error" and result.reason.startswith("solution raised SyntaxError")
    result = run_sandboxed("def add(a, b):\n    return str(a + b)", ["assert add(1, 2) == 3"])
    assert (result.status, result.reason) == ("failed", "test 0 failed: returned '3'")
    result = run_sandboxed("def add(a, b):\n    return 1 / 0", ["assert add(1, 2) == 3"])
    assert result.reason == "test 0 failed: ZeroDivisionError: division by zero"
    code = "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]"
    assert run_sandboxed(code, "assert Solution().twoSum([2, 7], 9) == [0, 1]").status == "passed"


def test_stdin_stdout_scoring():
    tests = {"inputs": ["1 2\n", "3 4\n", "5 5\n"], "outputs": ["3\n", "7", "11"]}
    result = run_sandboxed(SUM_STDIN, tests, timeout=5)
    assert (result.status, result.passed, result.total) == ("failed", 2, 3)
    assert result.reason == "test 2 failed: wrong output"
    # open(0), sys.stdin.buffer, exit() at the end and __main__ guards all work.
    code = "import sys\ndef main():\n    a, b = map(int, open(0).read().split())\n    sys.stdout.write(str(a + b))\n    sys.exit(0)\nif __name__ == '__main__':\n    main()"
    assert run_sandboxed(code, tests, timeout=5).passed == 2
    code = "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))"
    assert run_sandboxed(code, tests, timeout=5).passed == 2
    floats = {"inputs": [""], "outputs": ["0.333333"]}
    assert run_sandboxed("print(1/3)", floats).status == "failed"
    assert run_sandboxed("print(1/3)", floats, float_tolerance=1e-6).status == "passed"


def test_threads_work_where_each_sandbox_has_its_own_uid():
    from jaxrl_llm.rewards.code import sandbox_layers

    code = "import threading, sys\nsys.setrecursionlimit(10000)\nt = threading.Thread(target=lambda: print(3))\nt.start(); t.join()"
    result = run_sandboxed(code, {"inputs": [""], "outputs": ["3"]}, timeout=5)
    expected = "passed" if {"bwrap", "distinct_uid"} <= set(sandbox_layers()) else "error"
    assert result.status == expected or (expected == "error" and result.score == 0.0), result


def test_code_tests_reward_batches_rows_in_order():
    completions = [f"```python\n{ADD}```", "```python\ndef add(a, b):\n    return a - b\n```", "no code", ADD,
                   SUM_STDIN]  # fmt: skip
    tests = [["assert add(1, 2) == 3"], "assert add(2, 1) == 3\nassert add(1, 1) == 0", ["assert add(1, 2) == 3"],
             None, {"inputs": ["2 2"], "outputs": ["4"]}]  # fmt: skip
    scores = code_tests(["q"] * 5, completions, tests=tests, timeout=5, max_workers=2)
    assert scores == [1.0, 0.5, 0.0, None, 1.0]  # a row without tests is not applicable
    name, fn = get_reward_fn("code_tests", timeout=5.0, max_workers=1)
    assert name == "code_tests" and fn(["q"], [ADD], tests=[["assert add(2, 2) == 4"]]) == [1.0]
    with pytest.raises(ValueError, match="needs the column 'tests' with 2 entries"):
        code_tests(["q"] * 2, ["a", "b"], tests=[["assert True"]])
    with pytest.raises(ValueError, match="tests of row 0: tests is not valid Python"):
        code_tests(["q"], ["a"], tests=["assert ("])
    with pytest.raises(ValueError, match="tests of row 0: tests must be a dict, a string or a list of strings, got int"):
        code_tests(["q"], ["a"], tests=[3])
    # A check never called runs no case: 0, not a pass.
    assert code_tests(["q"], ["a"], tests=[["def check(candidate):\n    assert candidate(1)"]]) == [0.0]


def test_a_batch_runs_in_parallel_within_the_pool():
    start = time.monotonic()
    results = run_code_tests([SUM_STDIN] * 16, [{"inputs": ["1 1"], "outputs": ["2"]}] * 16, max_workers=4)
    assert all(r.status == "passed" for r in results) and time.monotonic() - start < 30


def test_no_tests_runs_the_program_once():
    result = run_sandboxed("print('hello')\nraise SystemExit(0)")
    assert (result.status, result.stdout, result.score) == ("passed", "hello\n", 1.0)
    result = run_sandboxed("print('x' * 3_000_000)")  # long output: the head is kept, the run passes
    assert result.status == "passed" and result.stdout == "x" * 4096
    result = run_sandboxed("raise ValueError('x')")
    assert result.status == "failed" and "ValueError: x" in result.reason and result.score == 0.0


def test_bad_arguments():
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        run_sandboxed("pass", timeout=0)
    with pytest.raises(ValueError, match="memory_mb must be a positive integer"):
        run_sandboxed("pass", memory_mb=0.5)
    with pytest.raises(ValueError, match="code must be a string"):
        run_sandboxed(b"pass")
    with pytest.raises(ValueError, match="max_workers must be a positive integer"):
        run_code_tests(["pass"], [["assert f() == 1"]], max_workers=0)


def test_large_answers_fit_the_reply_limit():
    big = "x" * 3_000_000
    assert run_sandboxed(f"print('x' * {len(big)})", {"inputs": [""], "outputs": [big]}, timeout=10).status == "passed"
    code = "def f(n):\n    return list(range(n))"
    assert run_sandboxed(code, {"fn_name": "f", "inputs": [[200_000]], "outputs": [list(range(200_000))]},
                         timeout=10).status == "passed"  # fmt: skip


def test_values_cross_the_sandbox_boundary_intact():
    value = ['a"b\\c\n\x00\x1f\x7f é 😀', (1, -0.0, 1e300, 2**70), {1: {"k": None}, (2, 3): frozenset({True})},
             {1.5, "s"}, [], {}]  # fmt: skip
    code = f"def f():\n    return {value!r} + [float('-inf')]"
    value.append(float("-inf"))
    assert run_sandboxed(code, {"fn_name": "f", "inputs": [[]], "outputs": [value]}).status == "passed"
    code = "def f(*args, **kwargs):\n    return [args, kwargs]"
    assert run_sandboxed(code, ["assert f((1, 2), {3}, k={4: 5}) == [((1, 2), {3}), {'k': {4: 5}}]"]).status == "passed"


def test_humaneval_style_check_functions():
    tests = textwrap.dedent(
        '''
        METADATA = {"author": "x", "dataset": "test"}

        def check(candidate):
            """Docstrings are fine."""
            assert candidate(1, 2) == 3
            assert abs(candidate(0.1, 0.2) - 0.3) < 1e-6

        check(add)
        '''
    )
    cases = parse_tests(tests)
    assert [c.payload[0] for c in cases] == ["add", "add"] and cases[1].check == "abs_lt"
    assert run_sandboxed(ADD, tests).status == "passed"
    # The asserts of one check(f) are one case, as on the checker path and in the official harness.
    result = run_sandboxed(ADD.replace("a + b", "round(a + b)"), tests)
    assert (result.passed, result.total, result.score) == (0, 1, 0.0)
    result = run_sandboxed(ADD, "def check(candidate):\n    assert candidate(1) == 1")  # never called
    assert (result.status, result.score) == ("no_tests", 0.0)
    looped = "def check(candidate):\n    for x in range(3):\n        assert candidate(x, 0) == x\ncheck(add)"
    assert [c.kind for c in parse_tests(looped)] == ["script", "script"]  # the whole check: one case
    assert run_sandboxed(ADD, looped).score == 1.0 and run_sandboxed(ADD.replace("a + b", "a"), looped).score == 1.0
    assert run_sandboxed(ADD.replace("a + b", "a * b"), looped).score == 0.0


def test_any_refused_operation_scores_zero_even_when_caught():
    code = ADD + "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9))\nexcept OSError:\n    pass"
    result = run_sandboxed(code, ["assert add(1, 1) == 2"], timeout=5)
    assert (result.status, result.passed, result.score) == ("blocked", 1, 0.0)
    assert result.reason.startswith("refused by the sandbox: socket.")
    code = "import socket\ntry:\n    socket.socket()\nexcept OSError:\n    pass\nprint(3)"
    result = run_sandboxed(code, {"inputs": [""], "outputs": ["3"]}, timeout=5)
    assert result.status == "blocked" and result.score == 0.0 and len(result.blocked) == 1


def test_limits_statuses_and_cleanup(tmp_path, monkeypatch):
    code = "import time\ndef add(a, b):\n    if a == 2:\n        time.sleep(60)\n    return a + b"
    start = time.monotonic()
    result = run_sandboxed(code, ["assert add(1, 1) == 2", "assert add(2, 2) == 4"], timeout=1)
    assert result.status == "timeout" and result.reason == "wall-clock limit of 1 s exceeded: killed by the judge"
    assert (result.passed, result.total, result.score) == (1, 2, 0.5)  # the case answered in time counts
    assert time.monotonic() - start < 10  # killed at 1 s, not left to run; slack for a loaded host
    spin = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass"
    result = run_sandboxed(spin, ["assert f() == 1"], timeout=10, cpu_time=1)  # killed at the hard limit, 2 s
    assert result.status == "cpu_limit" and "SIGKILL" in result.reason
    result = run_sandboxed("import ctypes", ["assert f() == 1"])
    assert result.status == "blocked" and "ctypes" in result.reason
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    result = run_sandboxed("import os\nos.chmod('.', 0o500)\nopen('x', 'w')", ["assert f() == 1"], timeout=3)
    assert result.score == 0.0 and os.listdir(tmp_path) == []  # the judge's files are all removed
