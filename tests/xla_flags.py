"""The XLA flags of the test run (set by tests/conftest.py before JAX starts; inherited by subprocesses).

The tests' programs run for milliseconds and compile for seconds: compilation dominates their CPU. Three
things make it cheaper (FAST_COMPILE), measured one after the other on the 2-core machine (`pytest -q -n 0
FILE`, CPU seconds):
- no LLVM optimizations: tests/test_audit_metrics.py 81.6 -> 52.5 s (`--xla_backend_optimization_level=1`
  alone: 69.8 s);
- XLA:CPU's older fusion emitters (`--xla_cpu_use_fusion_emitters=false`), on top of that: XLA's compile
  time of tests/test_sampling.py's programs 43.4 -> 18.6 s (the whole file 96 -> 48 s); the whole suite
  3,717 -> 2,372 s of test CPU. Without the first flag the second saves little (tests/test_models.py:
  152 s with it alone, 68 s with both);
- one LLVM module per program (`--xla_cpu_parallel_codegen_split_count=1`): XLA splits a program's code into
  parts compiled on parallel threads, which costs CPU in all (each part is set up and optimized on its own)
  and gains nothing when both cores already run a test each: tests/test_packing.py, compilation cache off,
  alternating three times, 60.0 -> 52.2 s of user CPU (tests/test_off_policy.py 51.7 -> 43.4 s, twice).
  Turning off the concurrency-optimized scheduler on top of it cost CPU (52.2 -> 54.9 s): not taken. Under
  XLA's defaults (the learning bars below) the flag saved nothing: 100 steps of configs/tiny.py from the
  CLI, twice each, 29.5 and 29.9 s of user CPU without it, 30.7 and 30.5 s with it.
A run of hundreds of steps pays for unoptimized code instead (the k = 2 learning bar: 100.6 -> 173.1 s
without LLVM's optimizations): the learning bars run the CLI with XLA's defaults
(fixtures_reliability.learning_run). Numbers change by float32 rounding only (the tests' tolerances hold),
but a seed-fixed test samples other tokens: no test may rely on what a seed happens to draw.

A process that compares its numbers with a subprocess's must give the subprocess the same flags: `with_flags`
adds the run's flags to a subprocess's own (the fake device count). JAXRL_TEST_XLA_OPTIMIZE=1 runs the
tests with XLA's defaults instead (what users run).
"""
import os

FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1")
_OPTIMIZE_VAR = "JAXRL_TEST_XLA_OPTIMIZE"


def run_flags() -> str:
    """The flags this test run compiles with ('' when JAXRL_TEST_XLA_OPTIMIZE=1)."""
    return "" if os.environ.get(_OPTIMIZE_VAR) == "1" else FAST_COMPILE


def install() -> None:
    """Adds the run's flags to this process's XLA_FLAGS (before JAX starts its backend; idempotent)."""
    os.environ["XLA_FLAGS"] = with_flags(os.environ.get("XLA_FLAGS", ""))


def with_flags(*flags: str) -> str:
    """`flags` (e.g. '--xla_force_host_platform_device_count=8') followed by the run's, each once."""
    out = []
    for f in " ".join([*flags, run_flags()]).split():
        if f not in out:
            out.append(f)
    return " ".join(out)
