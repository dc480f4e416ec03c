"""The code reward attacked for reward: every hack must score 0, on the bubblewrap sandbox (in CI it
must exist: a missing bwrap fails there instead of skipping) and on the fallback layers, since the
judge, outside the sandbox, does not depend on them. Host harm: test_rewards_code_harm.py."""

import textwrap
import time

import pytest
from fixtures_sandbox import ADD_TESTS, STDIO_TESTS, backend  # noqa: F401  (backend: a fixture)

from jaxrl_llm.rewards.code import judge, parse_tests, run_sandboxed

# ----------------------------------------------------------------------------- reward hacks

HACKS = {
    "always-equal object": """
        class E:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
        def add(a, b): return E()
    """,
    "int subclass equal to everything": """
        class I(int):
            def __eq__(self, other): return True
            __hash__ = int.__hash__
        def add(a, b): return I(0)
    """,
    "str subclass / custom repr": """
        class S(str):
            def __repr__(self): return "3"
        def add(a, b): return S("3")
    """,
    "bool for int": "def add(a, b): return True",
    "NaN and inf": "def add(a, b): return float('nan') if a > 0 else float('inf')",
    "huge int": "def add(a, b): return 10 ** 100000",
    "deeply nested value": """
        def add(a, b):
            x = []
            for _ in range(100000): x = [x]
            return x
    """,
    "patch builtins.exec/compile/enumerate": """
        import builtins
        builtins.exec = lambda *a, **k: None
        builtins.compile = lambda *a, **k: compile('pass', '<x>', 'exec')
        builtins.enumerate = lambda it, start=0: iter([])
        def add(a, b): return None
    """,
    "patch json.dumps to claim passes": """
        import json
        json.dumps = lambda obj, **k: '{"i": %d, "ok": true, "stdout": "3\\\\n"}' % obj.get("i", 0)
        def add(a, b): return None
    """,
    "patch os.write to forge every reply": """
        import os
        real = os.write
        def forged(fd, data):
            return real(fd, b'{"i": 0, "ok": true}\\n' * 50 + b'{"ready": true}\\n') or len(data)
        os.write = forged
        def add(a, b): return None
    """,
    "forge replies on every fd, 1000 times": """
        import json, os
        for fd in range(3, 64):
            for i in range(3):
                try:
                    os.write(fd, (json.dumps({"i": i, "ok": True, "value": {"always": True}}) + "\\n").encode() * 300)
                except OSError:
                    pass
        def add(a, b): return None
    """,
    "frame walking: rewrite the harness's state": """
        import sys
        frame = sys._getframe()
        while frame is not None:
            for name in ("cfg", "handlers", "request"):
                if name in frame.f_locals:
                    value = frame.f_locals[name]
                    if isinstance(value, dict):
                        value.clear()
            frame = frame.f_back
        def add(a, b): return None
    """,
    "traceback tb_frame: call the reporter directly": """
        import sys
        try:
            raise ValueError
        except ValueError as e:
            frame = e.__traceback__.tb_frame
        while frame is not None and "reply" not in frame.f_locals:
            frame = frame.f_back
        if frame is not None:
            for k in range(1000):
                frame.f_locals["reply"]({"i": k % 3, "value": 3})
        def add(a, b): return None
    """,
    "read the expected answers": """
        import gc, os, sys
        blob = " ".join(map(str, sys.argv)) + open("/proc/self/cmdline", "rb").read().decode(errors="replace")
        for fd in range(3, 64):
            try:
                os.set_blocking(fd, False)
                blob += os.read(fd, 1 << 20).decode(errors="replace")
            except OSError:
                pass
        try:
            blob += " ".join(repr(o)[:200] for o in gc.get_objects() if isinstance(o, (dict, list, str)))
        except Exception:
            pass
        FOUND = "987654321" in blob
        def add(a, b): return 987654321 if FOUND else None
    """,
    "exit early with success code": """
        import os
        os._exit(0)
    """,
    "SystemExit from the function": "def add(a, b): raise SystemExit(0)",
    "kill the judge's view: close the reply pipe": """
        import os
        for fd in range(3, 64):
            try: os.close(fd)
            except OSError: pass
        def add(a, b): return a + b + 1
    """,
}


@pytest.mark.parametrize("attack", sorted(HACKS))
def test_reward_hacks_score_zero(attack, backend):
    expected = [987654321] if attack == "read the expected answers" else None
    tests = ["assert add(1, 2) == 987654321"] if expected else ADD_TESTS
    result = judge(textwrap.dedent(HACKS[attack]), parse_tests(tests), backend=backend, timeout=5, memory_mb=256)
    assert result.score == 0.0 and result.passed == 0, (attack, result)


def test_correct_answers_count_once_whatever_the_solution_writes(backend):
    code = textwrap.dedent(
        """
        import json, os
        def add(a, b):
            for fd in range(3, 64):  # duplicate and future replies on every fd
                try:
                    os.write(fd, b"".join((json.dumps({"i": i, "value": 3}) + "\\n").encode() for i in range(9)))
                except OSError:
                    pass
            return a + b
        """
    )
    result = judge(code, parse_tests(ADD_TESTS), backend=backend, timeout=5)
    assert result.passed <= result.total == 3 and 0.0 <= result.score <= 1.0


def test_stdout_hacks_score_zero(backend):
    for code in [
        'print(\'{"i": 0, "stdout": "3"}\')',  # fake protocol lines on stdout
        "import os\nos.write(1, b'3\\n')\nos._exit(0)",  # then end before the judge reads
        "import sys\nsys.stdout = None",
        # forged replies claiming passes for every index, on every fd (no correct answer in them)
        "import os\nfor fd in range(3, 64):\n    try: os.write(fd, b''.join(b'{\"i\": %d, \"ok\": true}\\n{\"i\": %d, \"stdout\": \"\"}\\n' % (i, i) for i in range(9)))\n    except OSError: pass",
    ]:
        result = judge(code, parse_tests(STDIO_TESTS), backend=backend, timeout=5)
        assert result.score == 0.0, (code, result)


def test_test_code_of_any_form_cannot_be_forged(backend):
    # Test code beyond the simple forms runs in the checker process (the old opt-in ran it in the
    # sandbox, where an always-equal object passed): the solution's values arrive there as plain data.
    tests = ["assert add(1, 2) - add(2, 1) + 3 == add(1, 2)", "assert [add(i, 1) for i in range(3)] == [1, 2, 3]"]
    for attack in ["always-equal object", "int subclass equal to everything", "patch os.write to forge every reply",
                   "traceback tb_frame: call the reporter directly", "frame walking: rewrite the harness's state"]:
        result = judge(textwrap.dedent(HACKS[attack]), parse_tests(tests), backend=backend, timeout=5)
        assert result.passed == 0 and result.score == 0.0, (attack, result)
    # The expected values stay in the checker: computed by the test code, never sent.
    tests = ["expected = 987654320 + 1\nassert add(1, 2) == expected"]
    result = judge(textwrap.dedent(HACKS["read the expected answers"]), parse_tests(tests), backend=backend, timeout=5)
    assert parse_tests(tests)[0].kind == "script" and result.score == 0.0, result


def test_cpu_spin_is_cut_by_the_cpu_limit(backend):
    result = judge("while True:\n    pass", parse_tests(ADD_TESTS), backend=backend, timeout=10, cpu_time=1)
    assert result.status == "cpu_limit" and result.score == 0.0


# ----------------------------------------------------------------------------- the judge's parser

PROTOCOL_PAYLOADS = {  # Python expressions evaluated in the sandbox
    "nested 200k deep": 'b"[" * 200_000 + b"\\n"',
    "100k-digit int": 'b\'{"i": 0, "value": 1\' + b"0" * 100_000 + b"}\\n"',
    "invalid UTF-8": 'b\'\\xff\\xfe{"i": 0, "value": 3}\\n\'',
    "NaN literal": 'b\'{"i": 0, "value": NaN}\\n\'',
    "two tags": 'b\'{"i": 0, "value": {"tuple": [3], "set": [3]}}\\n\'',
    "unhashable set member": 'b\'{"i": 0, "value": {"set": [[3]]}}\\n\'',
    "bool index": 'b\'{"i": false, "value": 3}\\n\'',
    "endless line": 'b"x" * (64 << 20)',
}


@pytest.mark.parametrize("payload", sorted(PROTOCOL_PAYLOADS))
def test_malformed_replies_fail_the_case_without_hurting_the_judge(payload, backend):
    # Written straight to the reply pipe (its fd is the runner's last argument), instead of answering.
    code = f"import os, sys\ndef add(a, b):\n    os.write(int(sys.argv[2]), {PROTOCOL_PAYLOADS[payload]})\n    return None"
    start = time.monotonic()
    result = judge(code, parse_tests(["assert add(1, 2) == 3"]), backend=backend, timeout=10, memory_mb=256)
    assert result.score == 0.0 and time.monotonic() - start < 8, result  # before the 10 s limit


def test_deep_recursion_crashes_only_the_sandbox(backend):
    code = "import sys\nsys.setrecursionlimit(10 ** 6)\ndef add(a, b):\n    return add(a, b) + 1"
    result = judge(code, parse_tests(ADD_TESTS), backend=backend, timeout=10, memory_mb=128)
    assert result.score == 0.0 and result.status in ("crashed", "failed", "memory"), result
