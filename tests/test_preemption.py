"""Preemption-safe training (docs/reliability.md, "Preemption"): on SIGTERM, SIGINT or JAX's preemption
notice the step in progress finishes, a checkpoint of it is committed, one line says where the rerun
resumes, and the process exits 75 (preempted) or 130 (Ctrl-C); a second signal ends it at once; every
process of a multi-host run stops at the same step; the previous signal handlers are put back."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import fixtures_reliability as fr
from jaxrl_llm.preemption import INTERRUPTED_EXIT, PREEMPTED_EXIT, Preempted, StopSignals

STEPS = 24  # tiny steps take tens of milliseconds: enough of them that the signal lands mid-run


@pytest.fixture(scope="module")
def compile_cache(request, tmp_path_factory):
    """The persistent compilation cache of tests/test_reliability.py (same directory): the CLI runs
    share the tiny programs, so a session compiles them once."""
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("jaxrl_llm_compilation_cache") if cache is not None else tmp_path_factory.mktemp("jax_cache")


def _args(wd):
    # No periodic checkpoint before the end: the one the rerun resumes from is the one the signal saved.
    return fr.train_args(wd, total_steps=STEPS, checkpoint__every_steps=1000)


def test_sigterm_mid_run_saves_and_the_rerun_gives_the_uninterrupted_run(compile_cache, tmp_path):
    env = fr.cli_env(compile_cache)
    ref = tmp_path / "ref"
    done = fr.run_cli("train", _args(ref), env)
    assert done.returncode == 0, done.stderr[-3000:]

    wd = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "jaxrl_llm.train", *_args(wd)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=fr.ROOT)
    try:
        deadline = time.monotonic() + 240
        while not ((wd / "metrics.jsonl").exists() and (wd / "metrics.jsonl").read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)  # the first step is done
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == PREEMPTED_EXIT, err[-3000:]
    rows = fr.read_jsonl(wd / "metrics.jsonl")
    k = len(rows)
    assert 1 <= k < STEPS and [r["step"] for r in rows] == list(range(1, k + 1))
    assert fr.committed_steps(wd) == [k]  # the step it finished, committed (no other checkpoint was due)
    assert err.strip().splitlines()[-1] == (f"jaxrl_llm.train: preempted (SIGTERM) after step {k} of {STEPS}: "
                                            f"checkpoint saved; rerunning the same command resumes from step "
                                            f"{k} in {wd}")
    assert "Traceback" not in err and not (wd / "DONE").exists()

    done = fr.run_cli("train", _args(wd), env)  # the same command
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from step {k} " in done.stderr
    got, want = fr.read_jsonl(wd / "metrics.jsonl"), fr.read_jsonl(ref / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert fr.without_perf(got) == fr.without_perf(want)  # bitwise: the later steps included
    assert fr.read_jsonl(wd / "samples.jsonl") == fr.read_jsonl(ref / "samples.jsonl")
    a, b = fr.read_state(ref, STEPS), fr.read_state(wd, STEPS)
    assert a.keys() == b.keys() and any("params" in key for key in a)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_python_api_raises_preempted_after_saving_and_restores_the_handlers(tmp_path):
    """Ctrl-C during the second step's rewards: the step finishes, is saved, `Preempted` says so (exit
    code 130: a person stopped it); SIGINT and SIGTERM have their previous handlers again; a new
    Trainer resumes."""
    import jaxrl_llm
    from jaxrl_llm.config import from_dict
    sys.path.insert(0, os.path.join(fr.ROOT, "configs"))
    import tiny

    calls = []

    def interrupting_reward(prompts, completions, **_):
        calls.append(1)
        if len(calls) == 3:  # the start-up reward check, step 1, step 2
            os.kill(os.getpid(), signal.SIGINT)
        return [0.5 * (i % 2) for i in range(len(completions))]

    config = from_dict({**fr.SMALL, "total_steps": 3, "checkpoint.every_steps": 1000}, base=tiny.get_config())
    wd = str(tmp_path / "run")
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Preempted) as info:
        jaxrl_llm.Trainer(config, wd, rewards=[interrupting_reward]).run()
    assert {s: signal.getsignal(s) for s in before} == before
    e = info.value
    assert (e.reason, e.step, e.total_steps, e.exit_code) == ("interrupted (SIGINT)", 2, 3, INTERRUPTED_EXIT)
    assert fr.committed_steps(wd) == [2]
    history = jaxrl_llm.Trainer(config, wd, rewards=[interrupting_reward]).run()
    assert [m["step"] for m in history] == [3.0] and os.path.exists(os.path.join(wd, "DONE"))
    assert {s: signal.getsignal(s) for s in before} == before


def test_stop_signals_flag_the_first_and_put_the_handlers_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with StopSignals() as stop:
        assert stop.should_stop(1) is None
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while stop.received is None and time.monotonic() < deadline:
            time.sleep(0.001)
        assert stop.should_stop(2) == "preempted (SIGTERM)"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL  # the next signal ends the process
    assert {s: signal.getsignal(s) for s in before} == before


SECOND_SIGNAL = """
import os, signal
from jaxrl_llm.preemption import StopSignals
with StopSignals() as stop:
    os.kill(os.getpid(), signal.SIGINT)
    print(stop.should_stop(1), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    print("still running", flush=True)
"""


def test_a_second_signal_ends_the_process_at_once(compile_cache):
    proc = subprocess.run([sys.executable, "-c", SECOND_SIGNAL], capture_output=True, text=True, timeout=120,
                          env=fr.cli_env(compile_cache), cwd=fr.ROOT)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert proc.stdout == "interrupted (SIGINT)\n"
    assert "received SIGINT: finishing the current step, then saving a checkpoint" in proc.stderr


# Two processes (jax.distributed, gloo); process 1 gets the signal at step 3; both report where they stop.
AGREE = """
import json, os, signal, sys, time
coordinator, pid, sig = sys.argv[1], int(sys.argv[2]), getattr(signal, sys.argv[3])
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
from jaxrl_llm import distributed as dist
assert dist.initialize(coordinator, 2, pid, timeout_s=120)
from jaxrl_llm.preemption import StopSignals
out = {}
with StopSignals() as stop:
    for step in range(1, 1000):
        if pid == 1 and step == 3:
            os.kill(os.getpid(), sig)
        time.sleep(0.01)  # a step's work
        reason = stop.should_stop(step)
        if reason:
            out.update(step=step, reason=reason)
            break
print(json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("sig,reason", [("SIGINT", "interrupted (SIGINT)"),
                                        ("SIGTERM", "preempted (JAX preemption notice)")])
def test_processes_agree_on_the_stop_step(tmp_path, compile_cache, sig, reason):
    """SIGINT: our handler and the all-gather of the signals; SIGTERM: JAX's preemption notifier (which
    jax.distributed installs) and its sync point. Either way both processes stop after the same step."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{s.getsockname()[1]}"
    (tmp_path / "agree.py").write_text(AGREE)
    env = fr.cli_env(compile_cache)
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "agree.py"), coordinator, str(p), sig],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=fr.ROOT)
             for p in range(2)]
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err[-2000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
    assert outs[0] == outs[1] and outs[0]["reason"] == reason and outs[0]["step"] >= 3, outs


def test_preempted_message_and_exit_codes():
    e = Preempted("preempted (SIGTERM)", 7, 10, "gs://b/run")
    assert e.exit_code == PREEMPTED_EXIT == 75
    assert str(e) == ("preempted (SIGTERM) after step 7 of 10: checkpoint saved; rerunning the same command "
                      "resumes from step 7 in gs://b/run")
    assert re.match(r"interrupted", Preempted("interrupted (SIGINT)", 1, 2, "w").reason)
    assert Preempted("interrupted (SIGINT)", 1, 2, "w").exit_code == INTERRUPTED_EXIT == 130
