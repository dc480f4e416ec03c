"""The test run's shared JAX compilation cache, its schedule and its time budget.

Compilation cache: programs of identical shapes recur across a run: each `Trainer`, sampler or evaluator
jits its own functions (the in-memory cache of one `jax.jit` object does not help the next object), and
the two workers compile the same tiny models. With one persistent cache per run, the second compilation
of a program is a disk read. The directory is made by the controlling process (before the workers
start, which inherit its environment) and removed at the end of the run, so no run reads another's
entries. The subprocesses that tests start (the CLI, the mesh workers) get it too, through JAX's own
environment variables (the cache key holds XLA_FLAGS, so fake-device programs never collide with this
process's). Set JAXRL_TEST_NO_COMPILATION_CACHE=1 to run without it (e.g. to compare timings).

XLA flags: tests/xla_flags.py (no LLVM optimization, the older fusion emitters: the tests' programs compile
for seconds and run for milliseconds; subprocesses inherit the flags). JAXRL_TEST_XLA_OPTIMIZE=1 runs with
XLA's defaults.

Schedule and budget: tests/budget.py (the `slow` marker, slow files first, the per-test CPU budget and
the run's wall-clock line against the CI budget). Memory mappings: tests/mappings.py keeps a worker under
the kernel's limit (at the limit XLA's compiler dies of a segmentation fault). pytest.ini ends a run at
the first dead worker and at a test hung for 20 minutes, so that no crash becomes a run that never ends.
"""
import os
import shutil
import tempfile

import xla_flags

xla_flags.install()  # before JAX starts its backend, which reads XLA_FLAGS once

import jax  # noqa: E402

import mappings  # noqa: E402
from budget import (pytest_collection_modifyitems, pytest_runtest_logreport,  # noqa: F401  (hooks)
                    pytest_runtest_makereport, pytest_runtest_setup, pytest_terminal_summary)

_DIR_VAR = "JAXRL_TEST_COMPILATION_CACHE_DIR"


def pytest_configure(config):
    config.pluginmanager.register(mappings, "jaxrl_llm_mappings")
    config.addinivalue_line("markers", "slow: an end-to-end run (a learning bar, a CLI in subprocesses) allowed "
                                       "past the per-test CPU budget; tests/budget.py caps how many there are")
    if os.environ.get("JAXRL_TEST_NO_COMPILATION_CACHE"):
        return
    if not hasattr(config, "workerinput") and _DIR_VAR not in os.environ:  # the controller, or a run with -n 0
        os.environ[_DIR_VAR] = tempfile.mkdtemp(prefix="jaxrl_llm_test_jax_cache_")
        config._jaxrl_cache_owner = True
    jax.config.update("jax_compilation_cache_dir", os.environ[_DIR_VAR])
    # Tiny test programs compile in well under JAX's default threshold of one second: cache them all.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # Subprocesses: the same cache. A test that sets its own JAX_COMPILATION_CACHE_DIR keeps it.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ[_DIR_VAR])
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_unconfigure(config):
    if getattr(config, "_jaxrl_cache_owner", False):
        directory = os.environ.pop(_DIR_VAR)
        if os.environ.get("JAX_COMPILATION_CACHE_DIR") == directory:
            del os.environ["JAX_COMPILATION_CACHE_DIR"]
        shutil.rmtree(directory, ignore_errors=True)
