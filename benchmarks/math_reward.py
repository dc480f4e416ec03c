"""`math_answer` judged: agreement with the case set by category, and throughput on 10k completions.

    python benchmarks/math_reward.py                 # both, old = OLD_REV's math.py (git), new = this tree
    python benchmarks/math_reward.py --old-rev HEAD~3 --n 10000
    python benchmarks/math_reward.py --toy           # seconds: keeps the script from rotting (tests)
    python benchmarks/math_reward.py --skip throughput --cases math_verify   # or --cases solutions

Agreement: every case of tests/data/math_cases.py (or of `--cases`) through `get_reward_fn("math_answer")` the way the
trainer calls it, for the old verifier (a git revision's single-module math.py, loaded as a module),
the new one, and math-verify alone (the whole completion parsed, the reference wrapped in `$...$`,
boxed answers first). A false positive is a row expected 0.0 (or None) and paid 1.0.

Throughput: N completions scored in one batch call, old and new interleaved, best of `--repeats`:
the numeric path (GSM8K-style plain-number references) and structured references (sets, tuples,
intervals, equations), the latter with and without the second judge. Timings are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import time
import types
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from jaxrl_llm.rewards import get_reward_fn  # noqa: E402


def load_cases(name: str = "project"):
    """(category, completion, reference, expected) of a case set: "project" (tests/data/math_cases.py),
    "solutions" (tests/data/math_solution_cases.py) or "math_verify" (Math-Verify's test suite, its
    rejected expectations replaced by the corrected ones; the category is the suite's test function)."""
    if name == "math_verify":
        with open(os.path.join(ROOT, "tests", "data", "math_verify_cases.json"), encoding="utf-8") as f:
            cases = json.load(f)["cases"]
        return [(c["test"].split("::")[1], c["completion"], c["reference"], c.get("corrected", c["expected"]))
                for c in cases]  # fmt: skip
    filename = {"project": "math_cases.py", "solutions": "math_solution_cases.py"}[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tests", "data", filename))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


# The last revision with the single-module verifier (before structured references and the second judge).
OLD_REV = "6a930c7"


def load_old(rev: str):
    """The single-module math.py of `rev` as a module, its registration removed (the name is taken)."""
    source = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:jaxrl_llm/rewards/math.py"],
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    source = source.replace('@register_reward("math_answer")\n', "")
    module = types.ModuleType("old_math_answer")
    # Its worker starts `jaxrl_llm.rewards.math._worker_main` from the package root above `__file__`:
    # the new package keeps that entry point and the old request format.
    module.__file__ = os.path.join(ROOT, "jaxrl_llm", "rewards", "math.py")
    exec(compile(source, f"{rev}:math.py", "exec"), module.__dict__)
    return module


def math_verify_alone():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    def fn(prompts, completions, *, answer, **_):
        out = []
        for completion, reference in zip(completions, answer):
            gold = [g for g in parse(f"${reference}$", config) if not isinstance(g, str)]
            out.append(None if not gold else float(verify(gold, parse(completion, config))))
        return out

    return fn


def agreement(judges: dict, cases) -> None:
    """Prints agreement and false positives per category and judge."""
    stats = {name: defaultdict(Counter) for name in judges}
    for name, fn in judges.items():
        for category, completion, reference, expected in cases:
            got = fn(["q"], [completion], answer=[reference])[0]
            row = stats[name][category]
            row["n"] += 1
            row["agree"] += got == expected
            row["fp"] += got == 1.0 and expected != 1.0
    categories = list(dict.fromkeys(c[0] for c in cases))
    header = f"{'category':16s}{'n':>5s}" + "".join(f"{n + ' agree':>18s}{'FP':>5s}" for n in judges)
    print(header)
    for category in categories + ["all"]:
        line = ""
        for name in judges:
            rows = stats[name].values() if category == "all" else [stats[name][category]]
            n, agree, fp = (sum(r[k] for r in rows) for k in ("n", "agree", "fp"))
            line += f"{agree:>9d} ({100 * agree / n:5.1f}%){fp:>5d}"
        print(f"{category:16s}{n:>5d}{line}")


def numeric_batch(n: int, seed: int = 0):
    """GSM8K-style rows: a few lines of reasoning, the answer as `####`, a box, or the last number."""
    rng = random.Random(seed)
    completions, answers = [], []
    for i in range(n):
        value = rng.randint(1, 5000)
        shown = value if rng.random() < 0.7 else value + rng.randint(1, 9)
        steps = " ".join(f"Then {rng.randint(1, 99)} + {rng.randint(1, 99)} = {rng.randint(2, 198)}." for _ in range(6))
        tail = [f"\n#### {shown}", f" So the answer is \\boxed{{{shown:,}}}.", f" She has {shown} apples."][i % 3]
        completions.append(f"Let us think step by step. {steps}{tail}")
        answers.append(f"Reasoning <<{value}>>.\n#### {value}" if i % 2 else str(value))
    return completions, answers


STRUCTURES = [
    ("\\{1, 2, 3\\}", "\\boxed{\\{3, 2, 1\\}}", "\\boxed{3}"),
    ("(3, 4)", "The point is $(3, 4)$.", "\\boxed{4}"),
    ("[0, 1)", "\\boxed{[0, 1)}", "\\boxed{[0, 1]}"),
    ("x = 2, y = -1", "\\boxed{x = 2, y = -1}", "\\boxed{-1}"),
    ("2x + 3y = 12", "\\boxed{4x + 6y = 24}", "\\boxed{12}"),
    ("x < 5", "\\boxed{(-\\infty, 5)}", "\\boxed{x > 5}"),
]


def structured_batch(n: int, seed: int = 1):
    rng = random.Random(seed)
    completions, answers = [], []
    for i in range(n):
        reference, right, wrong = STRUCTURES[i % len(STRUCTURES)]
        completions.append(f"Working it out step by step. {right if rng.random() < 0.5 else wrong}")
        answers.append(reference)
    return completions, answers


def throughput(fns: dict, batch, repeats: int) -> dict:
    completions, answers = batch
    prompts = ["q"] * len(completions)
    best = {name: (float("inf"), float("inf")) for name in fns}
    for name, fn in fns.items():  # untimed warm-up: worker start-up is not throughput
        fn(prompts[:50], completions[:50], answer=answers[:50])
    for _ in range(repeats):
        for name, fn in fns.items():  # interleaved: drift on a shared machine hits both alike
            start, cpu = time.perf_counter(), time.process_time()
            fn(prompts, completions, answer=answers)
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def report(title: str, best: dict, n: int, base: str) -> None:
    # CPU time of this process: steady on a loaded machine, but blind to the worker process (sympy,
    # math-verify), so only the wall time tells the structured path's cost.
    print(f"\n{title}: {n} completions, best of the repeats")
    for name, (seconds, cpu) in best.items():
        ratio = best[base][0] / seconds
        print(f"  {name:24s}{seconds:8.3f} s  {1e6 * seconds / n:8.1f} us/row  {n / seconds:9.0f} rows/s  "
              f"{ratio:5.2f}x {base}   CPU here {1e6 * cpu / n:6.1f} us/row")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-rev", default=OLD_REV, help="git revision holding the old single-module math.py")
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--toy", action="store_true", help="a few cases and rows: checks the script runs")
    parser.add_argument("--skip", choices=["agreement", "throughput"], default=None)
    parser.add_argument("--cases", choices=["project", "solutions", "math_verify"], default="project",
                        help="the case set of the agreement table")  # fmt: skip
    args = parser.parse_args()
    old = load_old(args.old_rev).math_answer
    _, new = get_reward_fn("math_answer")
    cases = load_cases(args.cases)
    n = args.n
    if args.toy:
        cases, n, args.repeats = cases[::25], 30, 1
    if args.skip != "agreement":
        agreement({"old": old, "new": new, "math-verify": math_verify_alone()}, cases)
    if args.skip != "throughput":
        report("numeric path", throughput({"old": old, "new": new}, numeric_batch(n), args.repeats), n, "old")
        _, new_one = get_reward_fn("math_answer", second_judge=False)
        fns = {"old": old, "new": new, "new, no second judge": new_one}
        report("structured references", throughput(fns, structured_batch(n), args.repeats), n, "old")


if __name__ == "__main__":
    main()
