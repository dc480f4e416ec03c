"""On-policy distillation on the built-in task: a teacher trained by the library, then a student from
random init trained three ways (opd alone, GRPO alone, GRPO + opd mixed); steps and wall time to the
learning bar and the held-out pass@1 of each.

  python benchmarks/distill_demo.py [--teacher-steps 800] [--steps 400] [--out docs/distillation_demo.md]

The teacher is the embedded default (configs/tiny.py, GRPO) trained for --teacher-steps and exported
(workdir/hf). Each student is the same tiny architecture from the same random initialization and sees the
same prompts and sampling budget (16 prompts x 16 samples a step); only the objective differs:

  opd    algo=opd,  teacher.path=<teacher>: the teacher's per-token log-probs are the whole signal
  grpo   algo=grpo: the verifiable reward alone (the default)
  mixed  algo=grpo, teacher.path=<teacher>, distill.coef=1: GRPO's advantage + the opd advantage
  gkd, opd_no_kl (--runs): algo=gkd (beta 0.5); opd without the tiny config's KL to the initial policy

The bar (that of benchmarks/tiny_curves.py): the initial mean reward (the first 10 steps of the teacher's
run, which starts from the students' random initialization) plus half the headroom to 1.0; "steps to the bar" is the first step whose trailing 10-step mean training reward reaches
it, its wall time the sum of the steps' perf/step_s up to there (compilation of step 1 included; setup
excluded). Each run is its own process (a fresh start, like a user's).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.runs import held_out, run  # noqa: E402


def to_bar(rows: list[dict], bar: float | None = None) -> tuple[float, int | None, float | None]:
    """(bar, first step whose trailing 10-step mean reward reaches it or None, seconds of steps to it)."""
    steps = [r for r in rows if "reward/mean" in r]
    r = np.array([x["reward/mean"] for x in steps])
    if bar is None:
        init = float(r[:10].mean())
        bar = init + 0.5 * (1.0 - init)
    trail = np.convolve(r, np.ones(10) / 10, mode="valid")  # trail[i]: mean of steps i..i+9
    hit = np.nonzero(trail >= bar)[0]
    if not len(hit):
        return bar, None, None
    i = int(hit[0]) + 9
    return bar, int(steps[i]["step"]), float(sum(x.get("perf/step_s", 0.0) for x in steps[:i + 1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher-steps", type=int, default=800)
    ap.add_argument("--steps", type=int, default=400, help="steps of each student run")
    ap.add_argument("--runs", default="opd,mixed,grpo", help="of opd, grpo, mixed, gkd, opd_no_kl")
    ap.add_argument("--workdir", default="", help="keep the runs here (default: a temporary directory)")
    ap.add_argument("--out", default="", help="write the markdown table here")
    args = ap.parse_args()
    root = args.workdir or tempfile.mkdtemp(prefix="distill_demo_")
    teacher = os.path.join(root, "teacher")
    if not os.path.isdir(os.path.join(teacher, "hf")):
        wall, rows = run("grpo", args.teacher_steps, teacher, export=True)
        print(f"teacher: {args.teacher_steps} GRPO steps in {wall:.0f} s, held-out pass@1 "
              f"{held_out(rows)[1]['pass@1'][1]:.3f}", flush=True)
    with open(os.path.join(teacher, "metrics.jsonl")) as f:
        t_metrics = [json.loads(line) for line in f]
    t_pass = held_out(t_metrics)[1]["pass@1"][1]
    bar = to_bar(t_metrics)[0]  # the teacher run starts from the students' random initialization (seed 0)
    hf = f"--config.teacher.path={teacher}/hf"
    runs = {"opd": ("opd", (hf,)), "grpo": ("grpo", ()), "mixed": ("grpo", (hf, "--config.distill.coef=1.0")),
            "gkd": ("gkd", (hf,)), "opd_no_kl": ("opd", (hf, "--config.kl.coef=0.0"))}
    table = ["| student objective | steps to the bar | wall time to the bar | total wall (steps) | final reward "
             "(last 10%) | held-out pass@1 (start → end) |", "|---|---|---|---|---|---|"]
    for name in args.runs.split(","):
        algo, extra = runs[name]
        wall, rows = run(algo, args.steps, os.path.join(root, name), extra)
        bar, step, secs = to_bar(rows, bar)
        r = np.array([x["reward/mean"] for x in rows if "reward/mean" in x])
        p1 = held_out(rows)[1]["pass@1"]
        line = (f"| {name} | {step if step else f'not in {args.steps}'} | {f'{secs:.0f} s' if secs else '-'} | "
                f"{wall:.0f} s ({args.steps}) | {r[-max(1, len(r) // 10):].mean():.3f} | {p1[0]:.3f} → {p1[1]:.3f} |")
        print(line, flush=True)
        table.append(line)
    text = (f"Teacher: configs/tiny.py (GRPO) after {args.teacher_steps} steps, held-out pass@1 {t_pass:.3f}. "
            f"Bar: {bar:.3f}.\n\n" + "\n".join(table) + "\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
