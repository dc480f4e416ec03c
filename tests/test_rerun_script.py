"""tpu_scripts/rerun.sh against a fake command: it reruns while the command exits with the resumable
status (75, the trainer's "preempted, checkpoint saved"), with a bounded number of reruns, and stops on
success, on any other status, and when a signal sent to it was passed on to the command."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tpu_scripts" / "rerun.sh"

# Exits with the next status of $FAKE_STATUSES (one per run, the last one repeated), logging each run.
# With the word "trap" as a status, it waits for SIGTERM and then exits 75, as the trainer does.
FAKE = r"""
import os, signal, sys, time
log = os.environ["FAKE_LOG"]
runs = open(log).read().count("\n") if os.path.exists(log) else 0
statuses = os.environ["FAKE_STATUSES"].split(",")
status = statuses[min(runs, len(statuses) - 1)]
with open(log, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")
if status == "trap":
    got = []
    signal.signal(signal.SIGTERM, lambda s, _: got.append(s))
    open(os.environ["FAKE_LOG"] + ".ready", "w").close()
    while not got:
        time.sleep(0.01)
    with open(log + ".signals", "a") as f:
        f.write(f"{len(got)}\n")
    sys.exit(75)
sys.exit(int(status))
"""


@pytest.fixture
def fake(tmp_path):
    (tmp_path / "fake.py").write_text(FAKE)
    log = tmp_path / "runs.log"

    def run(statuses: str, *options: str, background=False):
        env = dict(os.environ, FAKE_LOG=str(log), FAKE_STATUSES=statuses)
        argv = ["bash", str(SCRIPT), *options, "--", sys.executable, str(tmp_path / "fake.py"), "--workdir=w x"]
        if background:
            return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    run.runs = lambda: log.read_text().splitlines() if log.exists() else []
    run.log = log
    return run


@pytest.mark.parametrize("statuses,options,code,runs", [
    ("75,75,0", ["--backoff", "0"], 0, 3),                         # preempted twice, then done
    ("75,1", ["--backoff=0"], 1, 2),                               # another error: stop with it
    ("130", ["--backoff", "0"], 130, 1),                           # Ctrl-C (saved): no rerun
    ("75", ["--backoff", "0", "--max-retries", "2"], 75, 3),       # reruns exhausted
    ("3,0", ["--backoff", "0", "--resumable-status", "3"], 0, 2),
])
def test_reruns_while_resumable_and_stops_otherwise(fake, statuses, options, code, runs):
    done = fake(statuses, *options)
    assert done.returncode == code, done.stderr
    assert fake.runs() == ["--workdir=w x"] * runs  # the same command each time, arguments intact
    notes = [line for line in done.stderr.splitlines() if "stopped resumably" in line]
    assert len(notes) == (runs - 1 if code != 75 else runs)
    if code == 75:
        assert "giving up" in done.stderr.splitlines()[-1]


def test_backoff_doubles_up_to_the_bound(fake):
    t0 = time.monotonic()
    done = fake("75,75,75,0", "--backoff", "1", "--max-backoff", "1")
    assert done.returncode == 0 and len(fake.runs()) == 4
    assert 3 <= time.monotonic() - t0 < 20  # three pauses of 1 s (2 and 4 capped at 1)
    assert [line.split(" in ")[-1] for line in done.stderr.splitlines() if "rerun" in line] == ["1 s"] * 3


def test_a_signal_is_passed_on_once_and_ends_the_loop(fake):
    proc = fake("trap", "--backoff", "0", background=True)
    ready = Path(str(fake.log) + ".ready")
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err
    assert len(fake.runs()) == 1 and Path(str(fake.log) + ".signals").read_text() == "1\n"
    assert "not rerunning" in err


@pytest.mark.parametrize("args,message", [
    ([], "no command given (put it after --)"),
    (["--backoff", "5m", "--", "true"], "--backoff must be a non-negative integer, got '5m'"),
    (["--max-retries"], "--max-retries needs a value"),
    (["--resumable-status", "0", "--", "true"], "--resumable-status must be in [1, 255], got 0"),
    (["python", "-m", "jaxrl_llm.train"], "unknown argument 'python' (the command goes after --)"),
])
def test_bad_usage_is_a_one_line_error(args, message):
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"rerun.sh: error: {message}\n"


def test_help():
    done = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.startswith("Usage: rerun.sh ")
