"""Throughput of the `code_tests` reward: completions/s on a typical stdin/stdout problem, before
(the single-process sandbox at OLD_REV, loaded from git) and after (this tree), side by side.

The problem: read n and n integers, print their sum and maximum; 10 cases of 1000 numbers. The old
sandbox has no stdin/stdout format, so its rows call the same program's `solve()` from assert
tests with sys.stdin/sys.stdout swapped (what a dataset had to do before).

    python benchmarks/code_reward.py [--batch 256] [--workers N] [--rounds 3] [--old-rev REV]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl_llm.rewards.code import run_code_tests, sandbox_layers  # noqa: E402

# The last commit with the single-process sandbox (jaxrl_llm/rewards/code.py), before the judge.
OLD_REV = "6a930c7b243f1e1ca087df24074131b73c25a1dc"

SOLUTION = """```python
import sys
def solve():
    data = sys.stdin.read().split()
    n = int(data[0])
    xs = list(map(int, data[1:1 + n]))
    print(sum(xs), max(xs))
if __name__ == "__main__":
    solve()
```"""


def make_cases(count: int = 10, size: int = 1000, seed: int = 0) -> dict:
    rng = random.Random(seed)
    inputs, outputs = [], []
    for _ in range(count):
        xs = [rng.randint(-10**6, 10**6) for _ in range(size)]
        inputs.append(f"{size}\n{' '.join(map(str, xs))}\n")
        outputs.append(f"{sum(xs)} {max(xs)}\n")
    return {"inputs": inputs, "outputs": outputs}


def old_tests(cases: dict) -> str:
    lines = ["import io, sys", "def _run(text):", "    sys.stdin, out = io.StringIO(text), io.StringIO()",
             "    sys.stdout = out", "    try:", "        solve()", "    finally:", "        sys.stdout = sys.__stdout__",
             "    return out.getvalue()"]  # fmt: skip
    lines += [f"assert _run({i!r}).split() == {o!r}.split()" for i, o in zip(cases["inputs"], cases["outputs"])]
    return "\n".join(lines)


def load_old(rev: str) -> types.ModuleType:
    """`jaxrl_llm/rewards/code.py` at `rev`, as a module that does not touch the reward registry."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    source = subprocess.run(["git", "-C", root, "show", f"{rev}:jaxrl_llm/rewards/code.py"], check=True,
                            capture_output=True, text=True).stdout  # fmt: skip
    source = source.replace('@register_reward("code_tests")', "")
    module = types.ModuleType("old_code_reward")
    module.__dict__["__file__"] = f"<{rev}:jaxrl_llm/rewards/code.py>"
    sys.modules[module.__name__] = module  # dataclasses look their module up by name
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def measure(fn, completions, tests, workers) -> tuple[float, list[float]]:
    start = time.perf_counter()
    results = fn(completions, tests, max_workers=workers, timeout=30)
    elapsed = time.perf_counter() - start
    return len(completions) / elapsed, [r.score for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=3, help="before/after alternate, so load drifts hit both")
    parser.add_argument("--old-rev", default=OLD_REV)
    args = parser.parse_args()
    cases = make_cases()
    completions = [SOLUTION] * args.batch
    old = load_old(args.old_rev)
    runs = {"before": [], "after": []}
    for _ in range(args.rounds):
        rate, scores = measure(old.run_code_tests, completions, [old_tests(cases)] * args.batch, args.workers)
        assert set(scores) == {1.0}, set(scores)
        runs["before"].append(rate)
        rate, scores = measure(run_code_tests, completions, [cases] * args.batch, args.workers)
        assert set(scores) == {1.0}, set(scores)
        runs["after"].append(rate)
    print(f"batch {args.batch}, {args.workers} workers, {os.cpu_count()} CPUs, 10 stdin/stdout cases per completion, "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"layers after: {', '.join(sandbox_layers())}")
    print(f"{'':8}{'completions/s (median)':>24}   rounds")
    notes = {"before": f"{args.old_rev[:10]}: one process, tests run in the solution's interpreter",
             "after": "this tree: judged outside the sandbox"}  # fmt: skip
    for name, rates in runs.items():
        listed = ", ".join(f"{r:.1f}" for r in rates)
        print(f"{name:8}{statistics.median(rates):>24.1f}   {listed}   ({notes[name]})")


if __name__ == "__main__":
    main()
