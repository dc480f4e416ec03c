"""One JAX persistent compilation cache per test run, shared by the xdist workers.

Programs of identical shapes recur across a run: each `Trainer`, sampler or evaluator jits its own
functions (the in-memory cache of one `jax.jit` object does not help the next object), and the two
workers compile the same tiny models. With the cache, the second compilation of a program is a disk read.
The directory is made by the controlling process (before the workers start, which inherit its
environment) and removed at the end of the run, so no run reads another's entries. Subprocesses that a
test starts are not affected (they get the caller's environment without JAX config). Set
JAXRL_TEST_NO_COMPILATION_CACHE=1 to run without it (e.g. to compare timings).
"""
import os
import shutil
import tempfile

import jax

_DIR_VAR = "JAXRL_TEST_COMPILATION_CACHE_DIR"


def pytest_configure(config):
    if os.environ.get("JAXRL_TEST_NO_COMPILATION_CACHE"):
        return
    if not hasattr(config, "workerinput") and _DIR_VAR not in os.environ:  # the controller, or a run with -n 0
        os.environ[_DIR_VAR] = tempfile.mkdtemp(prefix="jaxrl_llm_test_jax_cache_")
        config._jaxrl_cache_owner = True
    jax.config.update("jax_compilation_cache_dir", os.environ[_DIR_VAR])
    # Tiny test programs compile in well under JAX's default threshold of one second: cache them all.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    if getattr(config, "_jaxrl_cache_owner", False):
        shutil.rmtree(os.environ.pop(_DIR_VAR), ignore_errors=True)
