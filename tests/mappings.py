"""Keeps a long-lived test process under the kernel's limit on memory mappings (a pytest plugin, registered
by tests/conftest.py).

Every executable XLA:CPU compiles maps its code and data into the process (about ten mappings for a tiny
program), and JAX keeps every executable it compiled while its jitted function lives. An xdist worker
runs some 800 tests: one file alone held 14,000 mappings, and what global caches keep adds up across
files. At the kernel's `vm.max_map_count` (65,530 by default) an mmap fails, LLVM reports "Cannot allocate
memory" and XLA's compiler dies of a segmentation fault (reproduced with the limit lowered to 8,000): the
death of two CI workers late in the run, one of them in a compilation of tests/test_sampling_slots.py.

So before each test: over half the limit, drop JAX's in-memory compilation caches (`jax.clear_caches`;
a later call compiles again, from the run's persistent compilation cache when it holds the program). The
run's summary line says how high the count went (before a test) and how often the caches were dropped.
"""
from __future__ import annotations

import gc

import jax
import pytest

SHARE_OF_LIMIT = 0.5  # over this share of vm.max_map_count, the caches are dropped before the next test


def mappings() -> tuple[int, int]:
    """(memory mappings of this process, the kernel's limit on them); (0, 0) where /proc does not say."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f), limit
    except (OSError, ValueError):
        return 0, 0


def relieve(count: int, limit: int) -> bool:
    """Drops JAX's compilation caches (and the garbage that holds executables) when `count` mappings are
    over SHARE_OF_LIMIT of `limit`; True when it did."""
    if not limit or count <= SHARE_OF_LIMIT * limit:
        return False
    gc.collect()
    jax.clear_caches()
    return True


class _Peak:
    count = limit = drops = 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    count, limit = mappings()
    dropped = relieve(count, limit)
    # To the controller through the test's reports (xdist): the peak and the drops of every worker.
    item.user_properties.append(("maps", (count, limit, int(dropped))))
    yield


def pytest_runtest_logreport(report):
    if report.when != "call":
        return
    count, limit, dropped = dict(report.user_properties).get("maps", (0, 0, 0))
    _Peak.count, _Peak.limit, _Peak.drops = max(_Peak.count, count), max(_Peak.limit, limit), _Peak.drops + dropped


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput") or not _Peak.limit:
        return
    terminalreporter.write_line(f"memory mappings: at most {_Peak.count:,} before a test (limit {_Peak.limit:,}); "
                                f"JAX's compilation caches dropped {_Peak.drops} times (tests/mappings.py)")
