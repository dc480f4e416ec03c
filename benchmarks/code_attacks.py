"""What three attacks on the code reward cost the trainer's process: parent wall time, parent peak
memory, host disk, and the score of an honest sibling judged in the same batch.

  fences   a completion of ``` fences on one line (code extraction runs in the caller's thread)
  blocked  forged {"blocked": ...} lines written to the reply pipe until the timeout
  output   stdout and stderr flooded by a function-call solution, with disk_mb=1

Each attack runs in a fresh process, so its peak RSS is its own.

    python benchmarks/code_attacks.py [--attack fences|blocked|output] [--fence-kb 80] [--timeout 10]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HONEST_CODE = "def add(a, b):\n    return a + b\n"
HONEST = "```python\n" + HONEST_CODE + "```"
TESTS = ["assert add(1, 2) == 3", "assert add(20, 22) == 42"]
FLOOD_BLOCKED = """```python
import os, sys
line = ('{"blocked": "' + 'x' * 300 + '"}\\n').encode() * 64
def add(a, b):
    while True:
        os.write(int(sys.argv[2]), line)
```"""
FLOOD_OUTPUT = """
import os
def add(a, b):
    for fd in (1, 2):
        for _ in range(15):
            try:
                os.write(fd, b"x" * (1 << 20))
            except OSError:
                break
    return a + b
"""


def _host_tmp_peak(stop: threading.Event, root: str, peak: list) -> None:
    """Polls the bytes under `root` (the judge's temporary directory) every 5 ms."""
    while not stop.is_set():
        total = 0
        for d, _, files in os.walk(root):
            for f in files:
                try:
                    total += os.lstat(os.path.join(d, f)).st_size
                except OSError:
                    pass
        peak[0] = max(peak[0], total)
        time.sleep(0.005)


def one(attack: str, fence_kb: int, timeout: float) -> dict:
    from jaxrl_llm.rewards.code import code_tests, run_sandboxed

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    out: dict = {"attack": attack}
    if attack in ("fences", "blocked"):
        bad = "```" * (fence_kb * 1024 // 3) if attack == "fences" else FLOOD_BLOCKED
        if attack == "fences":
            from jaxrl_llm.rewards.code import extract_code

            extract_start = time.perf_counter()
            extract_code(bad)
            out["extract_s"] = round(time.perf_counter() - extract_start, 3)
        if attack == "blocked":
            from jaxrl_llm.rewards.code import run_code_tests

            results = run_code_tests([bad, HONEST], [TESTS, TESTS], timeout=timeout, max_workers=2)
            out["blocked_kept"] = len(results[0].blocked)
            out["attack_status"] = results[0].status
            scores = [r.score for r in results]
        else:
            scores = code_tests(None, [bad, HONEST], tests=[TESTS, TESTS], timeout=timeout, max_workers=2)
        out["sibling_score"] = scores[1]
    else:
        saved, tempfile.tempdir = tempfile.tempdir, tempfile.mkdtemp(prefix="code_attacks_")
        stop, peak = threading.Event(), [0]
        watcher = threading.Thread(target=_host_tmp_peak, args=(stop, tempfile.tempdir, peak))
        watcher.start()
        try:
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                attack_run = pool.submit(run_sandboxed, FLOOD_OUTPUT, TESTS, timeout=timeout, disk_mb=1)
                honest_run = pool.submit(run_sandboxed, HONEST_CODE, TESTS, timeout=timeout)
                result, honest = attack_run.result(), honest_run.result()
        finally:  # the watched folder is ours: leave nothing behind in the host's /tmp
            stop.set()
            watcher.join()
            shutil.rmtree(tempfile.tempdir, ignore_errors=True)
            tempfile.tempdir = saved
        out.update(host_tmp_peak_mib=round(peak[0] / 2**20, 2), attack_status=result.status,
                   attack_reason=result.reason, sibling_score=honest.score)  # fmt: skip
    out["parent_s"] = round(time.perf_counter() - start, 2)
    out["parent_peak_rss_delta_mib"] = round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attack", choices=["fences", "blocked", "output"], action="append")
    parser.add_argument("--fence-kb", type=int, default=80)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.attack[0], args.fence_kb, args.timeout)))
        return
    for attack in args.attack or ["fences", "blocked", "output"]:
        command = [sys.executable, os.path.abspath(__file__), "--child", "--attack", attack,
                   "--fence-kb", str(args.fence_kb), "--timeout", str(args.timeout)]  # fmt: skip
        proc = subprocess.run(command, capture_output=True, text=True)
        print(proc.stdout.strip() or proc.stderr[-2000:])


if __name__ == "__main__":
    main()
