"""The test run's XLA flags (tests/xla_flags.py): installed in this process, carried to the CLI subprocesses
whose numbers the tests compare with this process's (a CLI run compiled with other flags rounds otherwise and
samples other tokens: tests/test_async.py's kill-and-resume test failed so)."""
import os

import fixtures_reliability as fr
import xla_flags

DEVICES = "--xla_force_host_platform_device_count=8"


def test_with_flags_puts_the_run_flags_after_the_callers_once():
    run = xla_flags.run_flags().split()
    got = xla_flags.with_flags(DEVICES).split()
    assert got == [DEVICES, *run]
    assert xla_flags.with_flags(DEVICES, " ".join(run)).split() == got  # each flag once
    assert xla_flags.with_flags().split() == run


def test_this_process_and_the_cli_compile_with_the_same_flags(tmp_path, monkeypatch):
    if os.environ.get("JAXRL_TEST_XLA_OPTIMIZE") == "1":
        assert xla_flags.run_flags() == ""
    else:
        assert xla_flags.run_flags() == xla_flags.FAST_COMPILE
    here = os.environ.get("XLA_FLAGS", "").split()
    assert set(xla_flags.run_flags().split()) <= set(here)  # tests/conftest.py installed them
    assert set(fr.cli_env(tmp_path)["XLA_FLAGS"].split()) == set(xla_flags.run_flags().split())
    assert fr.cli_env(tmp_path, XLA_FLAGS=DEVICES)["XLA_FLAGS"].split() == [DEVICES, *xla_flags.run_flags().split()]
    monkeypatch.setenv("JAXRL_TEST_XLA_OPTIMIZE", "1")  # the opt-out: XLA's defaults, and only the caller's flags
    assert xla_flags.with_flags(DEVICES) == DEVICES and fr.cli_env(tmp_path)["XLA_FLAGS"] == ""
