"""Public entry points: `run_sandboxed`, `run_code_tests` and the `code_tests` reward."""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Mapping, Sequence

from jaxrl_llm.rewards.code import launch
from jaxrl_llm.rewards.code.cases import parse_tests
from jaxrl_llm.rewards.code.extract import extract_code
from jaxrl_llm.rewards.code.judge import (
    DEFAULT_DISK_MB,
    DEFAULT_FILE_SIZE_MB,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT,
    SandboxResult,
    judge,
)
from jaxrl_llm.rewards.registry import register_reward


NO_TESTS = SandboxResult("no_tests", "the tests hold no statement: score 0")


def sandbox_layers() -> tuple[str, ...]:
    """The protection layers active on this machine (see docs/rewards.md); `bwrap` among them means
    the solution runs in bubblewrap namespaces, its absence that only the fallback layers hold."""
    return launch.layers()


def run_sandboxed(code: str, tests=(), *, timeout: float = DEFAULT_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB,
                  cpu_time: float | None = None, file_size_mb: int = DEFAULT_FILE_SIZE_MB,
                  disk_mb: int = DEFAULT_DISK_MB, unsafe_asserts: bool | None = None,
                  float_tolerance: float | None = None) -> SandboxResult:  # fmt: skip
    """Runs `code` against `tests` (any format of `parse_tests`; none: the program runs once with
    empty stdin and `stdout` holds what it printed) in one sandbox.

    timeout: wall-clock seconds for the whole run. cpu_time: RLIMIT_CPU seconds, default
    ceil(timeout). memory_mb: RLIMIT_AS. file_size_mb: RLIMIT_FSIZE (files, output). disk_mb: the
    size of the sandbox's writable tmpfs. unsafe_asserts: deprecated, ignored (test code of any form
    runs in the checker process)."""
    if unsafe_asserts is not None:
        parse_tests([], unsafe_asserts=unsafe_asserts)  # the deprecation warning
    if not _has_tests(tests):
        cases = []
    elif not (cases := parse_tests(tests)):
        return NO_TESTS  # test code with no statement (comments only): nothing to run
    return judge(code, cases, timeout=timeout, memory_mb=memory_mb, cpu_time=cpu_time, file_size_mb=file_size_mb,
                 disk_mb=disk_mb, float_tolerance=float_tolerance)  # fmt: skip


def _has_tests(tests) -> bool:
    """False for None, '' (or blanks) and empty lists: the row is not applicable."""
    if tests is None:
        return False
    if isinstance(tests, str):
        return bool(tests.strip())
    return isinstance(tests, Mapping) or not isinstance(tests, Sequence) or len(tests) > 0  # others: parse_tests says why


def run_code_tests(completions: Sequence[str], tests: Sequence, *, timeout: float = DEFAULT_TIMEOUT,
                   memory_mb: int = DEFAULT_MEMORY_MB, max_workers: int | None = None, unsafe_asserts: bool | None = None,
                   float_tolerance: float | None = None) -> list[SandboxResult | None]:  # fmt: skip
    """Runs every completion's code against its row's tests, at most `max_workers` sandboxes at a
    time (default: the CPU count). Rows whose tests are None or empty give None."""
    if isinstance(tests, str) or not isinstance(tests, Sequence) or len(tests) != len(completions):
        raise ValueError(f"code_tests needs the column 'tests' with {len(completions)} entries")
    if max_workers is not None and (isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1):
        raise ValueError(f"max_workers must be a positive integer, got {max_workers!r}")
    if unsafe_asserts is not None:
        parse_tests([], unsafe_asserts=unsafe_asserts)  # the deprecation warning, once per batch
    rows = []
    for i, row in enumerate(tests):
        try:
            rows.append(parse_tests(row) if _has_tests(row) else [])
        except ValueError as e:
            raise ValueError(f"tests of row {i}: {e}") from e
    jobs = [i for i, cases in enumerate(rows) if cases]
    results: list[SandboxResult | None] = [None if not _has_tests(t) else NO_TESTS for t in tests]
    if not jobs:
        return results
    launch.warn_if_weak()
    workers = min(len(jobs), max_workers or os.cpu_count() or 1)
    # Threads suffice: each one only waits on its sandbox. No preexec_fn anywhere, so fork from
    # these threads is safe.
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(judge, extract_code(completions[i]), rows[i], timeout=timeout, memory_mb=memory_mb,
                               float_tolerance=float_tolerance): i for i in jobs}  # fmt: skip
        for future in concurrent.futures.as_completed(futures):
            results[futures[future]] = future.result()
    return results


@register_reward("code_tests")
def code_tests(prompts: Sequence[str], completions: Sequence[str], *, tests: Sequence,
               timeout: float = DEFAULT_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB, max_workers: int | None = None,
               unsafe_asserts: bool | None = None, float_tolerance: float | None = None, **columns) -> list[float | None]:  # fmt: skip
    """Pass fraction of each completion's code on its row's `tests` (see `parse_tests`), judged
    outside the sandbox; 0 on time-out, memory or a refused operation; None without tests."""
    del prompts, columns
    results = run_code_tests(completions, tests, timeout=timeout, memory_mb=memory_mb, max_workers=max_workers,
                             unsafe_asserts=unsafe_asserts, float_tolerance=float_tolerance)  # fmt: skip
    return [None if r is None else r.score for r in results]
