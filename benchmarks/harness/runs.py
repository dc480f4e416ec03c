"""Runs of the command line on configs/tiny.py (the built-in task), read back from metrics.jsonl."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(algo: str, steps: int | None, workdir: str, extra: tuple[str, ...] = (),
        export: bool = False) -> tuple[float, list[dict]]:
    cmd = [sys.executable, "-m", "jaxrl_llm.train", f"--config={ROOT}/configs/tiny.py:algo={algo}",
           f"--workdir={workdir}", "--config.log.progress=False", f"--config.export.at_end={export}", *extra]
    if steps:
        cmd.append(f"--config.total_steps={steps}")
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return wall, [json.loads(line) for line in f]


def held_out(rows: list[dict]) -> tuple[np.ndarray, dict]:
    """(steps and pass@1 of every evaluation, {pass@1, pass@8: (initial, final)})."""
    ev = [r for r in rows if "eval/pass@1" in r]
    curve = np.array([(r["step"], r["eval/pass@1"]) for r in ev])
    ends = {k: (ev[0].get(f"eval/{k}", np.nan), ev[-1].get(f"eval/{k}", np.nan)) for k in ("pass@1", "pass@8")}
    return curve, ends
