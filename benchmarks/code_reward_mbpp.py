"""MBPP (the original 974 problems, tests/data/mbpp.jsonl.gz) through the `code_tests` reward: the
reference solutions and four wrong ones, how many score full marks / above 0, problems/s, and for
every reference that misses, the official harness's verdict beside it (solution, `test_setup_code`
and the asserts run as one program, as MBPP's own evaluation does).

    python benchmarks/code_reward_mbpp.py [--workers 2] [--checker-only] [--limit N] [--only reference]

The tests of a row are its `test_setup_code` and `test_list`. --checker-only sends every row through
the checker process (a leading non-constant assignment takes them off the fast path).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import gzip
import json
import os
import subprocess
import sys
import time

from harness.wrong_solutions import OFF_BY_ONE

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "mbpp.jsonl.gz")


def problems() -> list[dict]:
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def mbpp_tests(problem: dict, checker_only: bool = False) -> str:
    prefix = "_off_the_fast_path = [].copy()\n" if checker_only else ""
    return prefix + problem["test_setup_code"] + "\n" + "\n".join(problem["test_list"]) + "\n"


def entry_point(problem: dict) -> str:
    """The function the asserts test: the first name they call that the reference solution defines."""
    defined = {n.name for n in ast.parse(problem["code"]).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for node in ast.walk(ast.parse("\n".join(problem["test_list"]))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defined:
            return node.func.id
    raise ValueError(f"task {problem['task_id']}: no tested function found")


def solutions(rows: list[dict]) -> dict[str, list[str]]:
    """The reference solutions and four wrong ones, one completion per problem each."""
    shifted = rows[1:] + rows[:1]
    names = [entry_point(p) for p in rows]
    return {
        "reference": [p["code"] for p in rows],
        "return None": [f"{p['code']}\ndef {e}(*args, **kwargs):\n    return None\n" for p, e in zip(rows, names)],
        "off by one": [p["code"] + OFF_BY_ONE.format(e=e) for p, e in zip(rows, names)],
        "the next problem's solution": [f"{q['code']}\n{e} = {f}\n" for e, q, f in zip(names, shifted, names[1:] + names[:1])],
        "raise StopIteration": [f"{p['code']}\ndef {e}(*args, **kwargs):\n    raise StopIteration\n" for p, e in zip(rows, names)],
    }  # fmt: skip


def official_verdict(problem: dict, code: str, timeout: float = 10.0) -> str:
    """'pass' or the error of the solution and the row's tests run as one program (a subprocess)."""
    program = code + "\n" + mbpp_tests(problem)
    try:
        proc = subprocess.run([sys.executable, "-I", "-c", program], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    lines = proc.stderr.strip().splitlines()
    return "pass" if proc.returncode == 0 else (lines[-1] if lines else f"exit {proc.returncode}")


def main() -> None:
    if not os.environ.get("PYTHONPATH"):  # PYTHONPATH=<tree> judges with that tree
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from jaxrl_llm.rewards.code import code_tests, parse_tests

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checker-only", action="store_true")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--only", default=None, help="only the solution set of this name (e.g. reference)")
    args = parser.parse_args()
    rows = problems()[: args.limit]
    tests = [mbpp_tests(p, args.checker_only) for p in rows]
    checker = sum(parse_tests(t)[-1].kind == "script" for t in tests)
    print(f"{len(rows)} problems ({checker} through the checker process, {len(rows) - checker} on the fast path), "
          f"{args.workers} workers, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'solutions':30} {'problems/s':>10} {'full marks':>11} {'above 0':>8}")
    for name, completions in solutions(rows).items():
        if args.only and name != args.only:
            continue
        start = time.perf_counter()
        scores = code_tests(["q"] * len(rows), completions, tests=tests, max_workers=args.workers)
        rate = len(rows) / (time.perf_counter() - start)
        print(f"{name:30} {rate:10.1f} {scores.count(1.0):>11} {sum(s > 0 for s in scores):>8}", flush=True)
        if name == "reference":
            for p, s in zip(rows, scores):
                if s < 1.0:
                    print(f"  miss: task {p['task_id']} scored {s:.2f}; official harness: {official_verdict(p, p['code'])}")
        else:
            above = [(p["task_id"], round(s, 2)) for p, s in zip(rows, scores) if s > 0]
            print("  above 0: " + ", ".join(f"{t} ({s})" for t, s in above))


if __name__ == "__main__":
    main()
