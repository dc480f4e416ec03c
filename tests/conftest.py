"""The test run's JAX compilation cache (off unless asked for), its schedule and its time budget.

Compilation cache: off by default. Programs of identical shapes recur across a run (each `Trainer`,
sampler or evaluator jits its own functions), and JAX's persistent cache turns a repeated compilation
into a disk read: about a fifth less time for the compile-heavy files. But it serializes every CPU
executable and loads executables that other processes wrote, a path that has crashed a run: a worker
died of a segmentation fault inside a cache write (tests/test_sampling_slots.py's fixture). A CI run
(cache on) later lost a worker to a segmentation fault whose stack was not kept, and pytest-xdist
(3.8) then waited forever for the dead worker's files. A fifth of the time is not worth that risk.
Set JAXRL_TEST_COMPILATION_CACHE=1 for a faster local run with one cache shared by the workers and the
subprocesses that tests start (the CLI, the mesh workers; through JAX's own environment variables, and
the cache key holds XLA_FLAGS, so fake-device programs never collide); it is made by the controlling
process and removed at the end.

Schedule and budget: tests/budget.py (the `slow` marker, slow files first, the per-test CPU budget and
the run's wall-clock line against the CI budget). pytest.ini ends a run at the first dead worker
(`--max-worker-restart=0`) and a test hung past `faulthandler_timeout` with its traceback, so that no
crash or hang turns into a run that never ends.
"""
import os
import shutil
import tempfile

import jax

from budget import (pytest_collection_modifyitems, pytest_runtest_logreport,  # noqa: F401  (hooks)
                    pytest_runtest_makereport, pytest_runtest_setup, pytest_terminal_summary)

_DIR_VAR = "JAXRL_TEST_COMPILATION_CACHE_DIR"


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: an end-to-end run (a learning bar, a CLI in subprocesses) allowed "
                                       "past the per-test CPU budget; tests/budget.py caps how many there are")
    if not os.environ.get("JAXRL_TEST_COMPILATION_CACHE"):
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
