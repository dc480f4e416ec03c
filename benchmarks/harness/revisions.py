"""Code of another revision, side by side with this checkout's: its `jaxrl_llm` package extracted from git
(the checkout is not touched) and run in worker processes that time functions on request, in rounds that
alternate between the revisions (benchmarks/sampler_profile.py: the sampler before and after a rewrite)."""
from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import tarfile

from harness.timing import Timing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPLY = "@@profile@@ "  # prefix of a worker's protocol lines on stdout (anything else there is noise)


class Worker:
    """A worker process running `cmd` with the package under `src` first on its path: it prints one
    `REPLY`-prefixed JSON line when ready and one per JSON request read from its stdin."""

    def __init__(self, label: str, src: str, cmd: list[str], logdir: str):
        self.label = label
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.stderr_path = os.path.join(logdir, f"{label}.stderr")
        self._stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True, env=env, cwd=logdir)
        self.info = None

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY):])
        self._stderr.flush()
        with open(self.stderr_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"the {self.label} worker exited (rc {self.proc.wait()}):\n{tail}")

    def ready(self) -> dict:
        if self.info is None:
            self.info = self.read()
        return self.info

    def request(self, **req) -> dict:
        self.ready()
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


def time_remote(calls: dict[str, tuple[Worker, str, int]], *, repeats: int, before_each=None) -> dict[str, Timing]:
    """`harness.timing.time_interleaved` across worker processes: each round asks every (worker, function, calls)
    once, in order; a round's sample is the median of the worker's own timings of its `calls` calls (the
    pipe is not timed). Round 0 is the warm-up: `first` is its first call (compilation included)."""
    first, runs = {}, {name: [] for name in calls}
    for i in range(1 + repeats):
        for name, (worker, fn, n) in calls.items():
            if before_each is not None:
                before_each()
            seconds = worker.request(cmd="time", name=fn, i=i, calls=n)["seconds"]
            if i == 0:
                first[name] = seconds[0]
            else:
                runs[name].append(statistics.median(seconds))
    return {name: Timing(first=first[name], runs=tuple(runs[name])) for name in calls}


def extract_package(dest: str, rev: str) -> str:
    """`git archive rev jaxrl_llm | tar -x -C dest` (the checkout is not touched). Returns dest."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "jaxrl_llm"], capture_output=True, check=False)
    if archive.returncode:
        raise RuntimeError(f"git archive {rev} failed: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest
