"""benchmarks/code_reward.py and code_attacks.py stay runnable: a tiny batch through the old sandbox (from git)
and the new one. Nothing here times anything: the figures are measured by hand (docs/rewards.md)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_code_reward_benchmark_runs_at_toy_size():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from code_reward import OLD_REV

    has_rev = subprocess.run(["git", "-C", ROOT, "cat-file", "-e", f"{OLD_REV}^{{commit}}"], capture_output=True)
    if has_rev.returncode:
        pytest.skip(f"revision {OLD_REV} (the sandbox before the judge) is not in this clone (shallow?)")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "code_reward.py"), "--batch", "4",
                           "--rounds", "1", "--workers", "2"], capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith(("before", "after"))}
    assert float(lines["before"].split()[1]) > 0 and float(lines["after"].split()[1]) > 0


def test_code_attacks_benchmark_runs(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "code_attacks.py"), "--attack", "output",
                           "--attack", "fences", "--fence-kb", "64", "--timeout", "10"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "TMPDIR": str(tmp_path)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not any(p.name.startswith("code_attacks_") for p in tmp_path.iterdir()), "the benchmark left its folder"
    output, fences = (json.loads(line) for line in proc.stdout.splitlines())
    assert output["sibling_score"] == fences["sibling_score"] == 1.0, proc.stdout
    assert output["attack_status"] == "output_limit" and output["host_tmp_peak_mib"] == 0.0, proc.stdout
