"""tests/budget.py, the suite's time guard, on a generated suite run by pytest in a subprocess (budgets
shrunk to 0.3 s): an unmarked test over the CPU budget fails naming it (only warns on an overloaded
machine), a marked one passes, sleeping costs no CPU, too many slow tests stop the collection, and files
with slow tests are collected first, and the summary counts the tests' compilations."""
import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))

CONFTEST = f"""
import sys
sys.path.insert(0, {TESTS!r})
import budget
budget.PER_TEST_CPU_S, budget.MAX_SLOW, budget.SLOW_ELSEWHERE = 0.3, {{max_slow}}, ("test_b.py::test_listed",)
budget.OVERLOADED_PER_CORE = {{overloaded}}
from budget import (pytest_collection_modifyitems, pytest_runtest_logreport, pytest_runtest_makereport,
                    pytest_runtest_setup, pytest_terminal_summary)

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long")
"""
BURN = """
import time
import pytest

def burn(seconds=0.6):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
"""
TEST_A = BURN + """
def test_quick():
    pass

def test_burns():
    burn()

def test_sleeps():
    time.sleep(1.0)

def test_burns_in_a_child():
    import subprocess, sys
    child = "import time\\ns = time.process_time()\\nwhile time.process_time() - s < 0.6:\\n    pass"
    subprocess.run([sys.executable, "-c", child])
"""
TEST_B = BURN + """
@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2])
def test_marked(n):
    burn()

def test_listed():
    burn()
"""


def run_suite(tmp_path, max_slow: int, *args: str, overloaded: float = 1e9,
              files: dict | None = None) -> subprocess.CompletedProcess:
    """The generated suite; `overloaded` is the load per core above which the CPU budget only warns."""
    (tmp_path / "conftest.py").write_text(CONFTEST.format(max_slow=max_slow, overloaded=overloaded))
    for name, text in (files or {"test_a.py": TEST_A, "test_b.py": TEST_B}).items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rA", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_unmarked_tests_over_the_cpu_budget_fail_and_marked_ones_pass(tmp_path):
    proc = run_suite(tmp_path, 2)
    lines = proc.stdout.splitlines()
    outcome = {line.split()[1]: line.split()[0] for line in lines if line.startswith(("PASSED", "FAILED"))}
    assert outcome == {"test_b.py::test_marked[1]": "PASSED", "test_b.py::test_marked[2]": "PASSED",
                       "test_b.py::test_listed": "PASSED", "test_a.py::test_quick": "PASSED",
                       "test_a.py::test_burns": "FAILED", "test_a.py::test_sleeps": "PASSED",
                       "test_a.py::test_burns_in_a_child": "FAILED"}, proc.stdout[-3000:]
    assert ("test_a.py::test_burns used 1 s of CPU (setup and call), over the 0.3 s of a test not marked slow"
            in proc.stdout)
    assert proc.returncode == 1
    assert "test time budget" in proc.stdout and "CPU of the tests" in proc.stdout


def test_on_an_overloaded_machine_the_cpu_budget_only_warns(tmp_path):
    proc = run_suite(tmp_path, 2, overloaded=-1.0)  # any load is over
    assert proc.returncode == 0 and "FAILED" not in proc.stdout, proc.stdout[-3000:]
    over = [line for line in proc.stdout.splitlines() if line.startswith("OVER BUDGET: ")]
    assert len(over) == 2 and "test_a.py::test_burns used 1 s of CPU" in over[0] and "not failed: load" in over[0]


def test_too_many_slow_tests_stop_the_collection(tmp_path):
    proc = run_suite(tmp_path, 1)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 tests are marked slow, at most 1 may be (tests/budget.py)" in proc.stderr


def test_files_with_slow_tests_are_collected_first(tmp_path):
    proc = run_suite(tmp_path, 2, "--collect-only", "-q")
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert ids == ["test_b.py::test_marked[1]", "test_b.py::test_marked[2]", "test_b.py::test_listed",
                   "test_a.py::test_quick", "test_a.py::test_burns", "test_a.py::test_sleeps",
                   "test_a.py::test_burns_in_a_child"], proc.stdout


def test_the_compilations_of_each_test_are_counted(tmp_path):
    """compile_s (a user property, in --junitxml) holds what JAX reported compiling during the test, and
    the run's summary adds them up."""
    import json
    import xml.etree.ElementTree as ET
    jit_test = ("import jax\nimport jax.numpy as jnp\n\n"
                "def test_compiles():\n"
                "    jax.jit(lambda x: jnp.sin(x) * 2 + 1)(jnp.arange(3.0)).block_until_ready()\n\n"
                "def test_compiles_nothing():\n    pass\n")
    proc = run_suite(tmp_path, 2, "--junitxml", str(tmp_path / "r.xml"), files={"test_c.py": jit_test})
    assert proc.returncode == 0, proc.stdout[-3000:]
    got = {}
    for case in ET.parse(tmp_path / "r.xml").iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        got[case.get("name")] = json.loads(props["compile_s"].replace("'", '"'))
    assert set(got["test_compiles"]) == {"tracing", "lowering", "XLA"}
    assert all(v > 0 for v in got["test_compiles"].values()), got
    assert all(v == 0 for v in got["test_compiles_nothing"].values()), got
    line = next(line for line in proc.stdout.splitlines() if line.startswith("compiling in the test processes: "))
    assert "tracing" in line and "XLA" in line and "subprocesses not counted" in line
