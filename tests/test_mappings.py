"""tests/mappings.py, the guard that keeps a test process under the kernel's limit on memory mappings: the
count grows with every live compiled program and falls when the guard drops JAX's caches; over half the
limit the guard drops them and only then; a suite run in a subprocess reports it in its summary."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import mappings

TESTS = os.path.dirname(os.path.abspath(__file__))
# Without /proc (not Linux) the guard is off, and there is no count to watch.
linux_only = pytest.mark.skipif(not mappings.mappings()[1], reason="no /proc/self/maps: the guard is off here")


def _compile_many(n):
    functions = [jax.jit(lambda x, i=i: jnp.tanh(x * i + 1).sum()) for i in range(n)]
    for f in functions:
        f(jnp.ones(3)).block_until_ready()
    return functions


@linux_only
def test_live_programs_hold_mappings_and_dropping_the_caches_frees_them():
    count, limit = mappings.mappings()
    assert 0 < count < limit
    functions = _compile_many(60)  # the jitted functions stay alive: only the caches hold their programs
    grown, _ = mappings.mappings()
    assert grown >= count + 60, (count, grown)  # at least one mapping per live executable (about ten here)
    assert all(f._cache_size() == 1 for f in functions)
    assert mappings.relieve(grown, limit=grown)  # over half of a limit it has reached
    assert all(f._cache_size() == 0 for f in functions)
    after, _ = mappings.mappings()
    assert after < grown - 60, (grown, after)
    assert float(functions[0](jnp.ones(3))) == float(jnp.tanh(jnp.ones(3)).sum())  # compiles again


def test_under_half_the_limit_nothing_is_dropped():
    (f,) = _compile_many(1)
    assert not mappings.relieve(500, limit=1000) and not mappings.relieve(10, limit=0)  # 0: /proc did not say
    assert f._cache_size() == 1
    assert mappings.relieve(501, limit=1000) and f._cache_size() == 0


@linux_only
def test_a_run_reports_its_peak_and_drops(tmp_path):
    (tmp_path / "conftest.py").write_text(f"""
import sys
sys.path.insert(0, {TESTS!r})
import mappings
mappings.SHARE_OF_LIMIT = 0.0  # every test starts over the line: the caches are dropped before each
from mappings import pytest_runtest_logreport, pytest_runtest_setup, pytest_terminal_summary
""")
    (tmp_path / "test_x.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "JAX's compilation caches dropped 2 times" in proc.stdout, proc.stdout[-2000:]
