"""The test suite's time budget (pytest hooks, imported by tests/conftest.py).

CI (`.ci/run`: install, then `pytest -q tests` on two xdist workers) has 15 minutes on its 2-core
machine, the install included. Three rules keep the suite inside it by construction:

1. Per-test CPU budget. A test not marked `slow` may use at most PER_TEST_CPU_S seconds of CPU for its
   setup and call, counted over the worker process and the subprocesses it waited for (a module
   fixture's setup lands on the first test that uses it). Over that, the test fails, saying so. CPU
   time, not wall time: on a loaded machine a test waits longer but burns about the same CPU. Not quite
   the same: contention (shared caches, hyperthreads) inflates it, about 2x on a 2-core machine at load
   20 (two 800-step runs of tests/test_async.py took 94 s of wall time together on the quiet CI machine;
   one took 92 s of CPU at load 20). So above
   OVERLOADED_PER_CORE (the 1-minute load average per core, at the end of the test) an over-budget test
   is listed at the end of the run instead of failing: the rule does not flake on a loaded machine, and
   CI (two workers on two cores) enforces it. Every unmarked test of the last CI run took under a minute
   of wall time there; the budget is half as much again, so a compilation-cache miss (which worker
   compiled a program first varies between runs) does not reach it either.
2. `@pytest.mark.slow` is for the few end-to-end runs (one learning bar per capability, a CLI run in
   subprocesses); at most MAX_SLOW of them may exist (test functions, a parametrized one counted once:
   a count, exact, checked at collection). The files that hold them start first (`--dist loadfile
   --no-loadscope-reorder` in pytest.ini, pytest-xdist >= 3.8; xdist's default order, most tests first,
   started the 138 s GPU-suite dry run as the 58th of 82 files), so a long file never leaves the other
   worker idle at the end.
3. The run ends with its wall time and summed test CPU against the budget, and a loud warning when the
   wall time is over TESTS_WALL_BUDGET_S (the CI budget less the install): wall time depends on the
   machine's load, so it warns and never fails. It says how long the test processes spent compiling
   (JAX's duration events: tracing, lowering, XLA; subprocesses not counted; `compile_s` per test in
   --junitxml), so that the next saving is looked for where the time is.
"""
import os
import resource
import sys
import time

import pytest

# XLA:CPU runs a test's programs on both cores: CPU seconds are about twice the wall seconds of a
# compute-bound test, so 180 s of CPU is about 90 s of wall time on the CI machine.
PER_TEST_CPU_S = 180.0
MAX_SLOW = 12
OVERLOADED_PER_CORE = 2.0  # 1-minute load average per core above which CPU time is not trusted to fail a test
TESTS_WALL_BUDGET_S = 13 * 60
# tests/test_benchmarks*.py are kept by benchmarks/ (each runs a script at toy size): their long ones
# are marked here, by node id, rather than in files that move with the benchmarks.
SLOW_ELSEWHERE = ("tests/test_benchmarks_gpu.py::test_dry_run_passes_every_stage_and_writes_its_results",
                  "tests/test_benchmarks_training.py::test_mfu_script_runs_at_toy_size")


# JAX's duration events of a compilation, by the name the summary gives them.
_COMPILE_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "tracing",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
                   "/jax/core/compile/backend_compile_duration": "XLA"}
_compile_s = dict.fromkeys(_COMPILE_EVENTS.values(), 0.0)  # this process's, since it started


def _on_duration(event: str, seconds: float, **_) -> None:
    name = _COMPILE_EVENTS.get(event)
    if name:
        _compile_s[name] += seconds


def _listen_to_compiles() -> None:
    """Counts this process's compilations from here on (once; a process that never imports JAX adds nothing)."""
    if "jax" in sys.modules and not getattr(_listen_to_compiles, "done", False):
        import jax.monitoring
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _listen_to_compiles.done = True


def _cpu_s() -> float:
    """CPU seconds of this process (all threads) and of its finished, waited-for children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _is_slow(item) -> bool:
    return item.get_closest_marker("slow") is not None or item.nodeid in SLOW_ELSEWHERE


def pytest_collection_modifyitems(session, config, items):
    slow = sorted({item.nodeid.split("[")[0] for item in items if _is_slow(item)})  # a parametrized test once
    if len(slow) > MAX_SLOW:
        raise pytest.UsageError(f"{len(slow)} tests are marked slow, at most {MAX_SLOW} may be (tests/budget.py): "
                                f"make one smaller or fold it into another run; slow: {slow}")
    # Files holding a slow test first (a stable sort: collection order otherwise, a file's tests together).
    slow_files = {item.nodeid.split("::")[0] for item in items if _is_slow(item)}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_files)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    _listen_to_compiles()  # after tests/conftest.py imported JAX, before the test compiles
    item._budget_cpu_start = _cpu_s()
    item._budget_compile_start = dict(_compile_s)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not hasattr(item, "_budget_cpu_start"):
        return
    cpu = _cpu_s() - item._budget_cpu_start
    compile_s = {k: round(v - item._budget_compile_start[k], 4) for k, v in _compile_s.items()}
    for key, value in (("cpu_s", round(cpu, 2)), ("compile_s", compile_s)):
        report.user_properties.append((key, value))  # to the controller (xdist)
        item.user_properties.append((key, value))  # to the later reports (--junitxml writes them)
    if not (report.passed and cpu > PER_TEST_CPU_S and not _is_slow(item)):
        return
    message = (f"{item.nodeid} used {cpu:.0f} s of CPU (setup and call), over the {PER_TEST_CPU_S:g} s of a test "
               "not marked slow (tests/budget.py): share its compiled programs with a module fixture, shrink its "
               "shapes or steps, or fold it into one of the slow runs")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if load <= OVERLOADED_PER_CORE * cores:
        report.outcome, report.longrepr = "failed", message
    else:  # contention inflates CPU time too (shared caches, hyperthreads): listed at the end, not failed
        report.user_properties.append(("over_budget", f"{message} [not failed: load {load:.0f} on {cores} cores]"))


class _Totals:
    start = time.monotonic()
    cpu = 0.0
    compile_s = dict.fromkeys(_COMPILE_EVENTS.values(), 0.0)
    slow = []  # (cpu s, node id)
    over = []  # messages of tests over the budget that were not failed


def pytest_runtest_logreport(report):
    properties = dict(report.user_properties)
    if report.when == "call" and "cpu_s" in properties:
        _Totals.cpu += properties["cpu_s"]
        for k, v in properties.get("compile_s", {}).items():
            _Totals.compile_s[k] += v
        _Totals.slow.append((properties["cpu_s"], report.nodeid))
        if "over_budget" in properties:
            _Totals.over.append(properties["over_budget"])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput") or not _Totals.slow:  # a worker, or nothing ran (--collect-only)
        return
    wall = time.monotonic() - _Totals.start
    top = ", ".join(f"{n.split('/')[-1]} {c:.0f} s" for c, n in sorted(_Totals.slow, reverse=True)[:5])
    terminalreporter.write_sep("-", "test time budget")
    terminalreporter.write_line(f"wall {wall:.0f} s (CI budget for the tests: {TESTS_WALL_BUDGET_S} s); CPU of the "
                                f"tests {_Totals.cpu:.0f} s; most CPU: {top}")
    parts = ", ".join(f"{k} {v:.0f} s" for k, v in _Totals.compile_s.items())
    terminalreporter.write_line(f"compiling in the test processes: {sum(_Totals.compile_s.values()):.0f} s ({parts}; "
                                "the durations JAX reports; subprocesses not counted)")
    for message in _Totals.over:
        terminalreporter.write_line(f"OVER BUDGET: {message}", red=True)
    if wall > TESTS_WALL_BUDGET_S and len(_Totals.slow) > 200:  # a whole run, not one file
        terminalreporter.write_sep("!", f"OVER BUDGET: the tests took {wall:.0f} s > {TESTS_WALL_BUDGET_S} s", red=True)
