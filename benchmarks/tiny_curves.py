"""Runs the embedded default (configs/tiny.py) for each algorithm over several seeds, checks the bar on
each, and plots the reward curves beside the held-out pass@1 (128 prompts of the task's test split, never
trained on, 16 samples each).

  python benchmarks/tiny_curves.py [--algos grpo,dr_grpo,dapo,gspo,sapo,ppo] [--seeds 0-4] [--jobs 1] \
      [--records FILE.jsonl] [--steps N] [--out docs/tiny_curves.png]
  python benchmarks/tiny_curves.py --algos grpo --lora-rank 16 --lora-lr 1e-3 --base-steps 150 --steps 400 \
      --out docs/lora_curves.png

Each run is its own process (a fresh start, compile included, like a user's run). The bar is the issue's:
the mean reward of the last 10% of steps must reach the initial mean reward (that of the random initial
policy: the first 10 steps) plus half of the headroom to the maximum reward 1.0. Per algorithm it prints
how many seeds pass, and the table gives the median and the range over the seeds of the final reward and
of the held-out pass@1 and pass@8 (initial and final), and the median wall time.

--jobs N runs N processes side by side (a sweep of many seeds on a 2-core host: the wall times are then
those of runs sharing the cores, and the table says so). --records FILE keeps one JSON line per run
(algo, seed, wall, the reward curve, the evaluations): a run already recorded there is not run again, so
a sweep can be resumed, or extended with more seeds, and the table rebuilt from it.
The plot shows the median seed's run of each algorithm. Writes the PNG and a markdown table
(docs/tiny_curves.md) that the README shows.

LoRA (--lora-rank R): the random tiny model is no base to adapt (its frozen, tied embedding of std 0.02
bounds every logit, docs/lora.md), so a base is trained first: --base-steps of full fine-tuning of the
first algorithm, exported. Then full fine-tuning and LoRA (rank R, --lora-lr) each continue from that
base for --steps steps, plotted side by side (one seed, the config's).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from harness.report import machine_description
from harness.runs import ROOT, held_out, run

ALGOS = ("grpo", "dr_grpo", "dapo", "gspo", "sapo", "ppo")


def seed_list(text: str) -> list[int]:
    """'0-4' -> [0, 1, 2, 3, 4]; '0,3,7' -> [0, 3, 7]."""
    out = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def bar(rewards: np.ndarray) -> dict:
    """The issue's bar on one run's per-step mean rewards: initial (first 10 steps), final (last 10%)."""
    init, final = rewards[:10].mean(), rewards[-max(1, len(rewards) // 10):].mean()
    need = init + 0.5 * (1.0 - init)
    return dict(init=float(init), final=float(final), need=float(need), ok=bool(final >= need))


def one_run(label: str, algo: str, seed: int | None, steps: int | None, extra: tuple[str, ...]) -> dict:
    """A run of the command line, summarized: wall time, reward curve, the bar, the held-out evaluations."""
    args = extra + ((f"--config.seed={seed}",) if seed is not None else ())
    with tempfile.TemporaryDirectory() as work:
        wall, rows = run(algo, steps, work, args)
    r = np.array([row["reward/mean"] for row in rows if "reward/mean" in row])  # step 0: evaluation only
    entropy = np.array([row["policy/entropy"] for row in rows if "policy/entropy" in row])
    curve, ends = held_out(rows)
    return dict(label=label, algo=algo, seed=seed, wall=wall, steps=len(r), rewards=r.round(5).tolist(),
                entropy=entropy.round(4).tolist(), eval=curve.tolist(), **{k: list(v) for k, v in ends.items()},
                **bar(r))


def load_records(path: str | None) -> list[dict]:
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(label: str, runs: list[dict]) -> dict:
    """Median and range over the seeds' runs of one label; the median seed's run for the plot."""
    finals = np.array([r["final"] for r in runs])
    median_run = runs[int(np.argsort(finals)[len(finals) // 2])]
    med = lambda xs: (float(np.median(xs)), float(np.min(xs)), float(np.max(xs)))
    return dict(label=label, n=len(runs), passed=sum(r["ok"] for r in runs), steps=runs[0]["steps"],
                wall=float(np.median([r["wall"] for r in runs])), init=float(np.median([r["init"] for r in runs])),
                need=float(np.median([r["need"] for r in runs])), final=med(finals),
                p1=(med([r["pass@1"][0] for r in runs]), med([r["pass@1"][1] for r in runs])),
                p8=(med([r["pass@8"][0] for r in runs]), med([r["pass@8"][1] for r in runs])),
                seeds=sorted(r["seed"] for r in runs), median_run=median_run)


def table(summaries: list[dict], jobs: int) -> list[str]:
    rng = lambda m: f"{m[0]:.3f} [{m[1]:.3f}, {m[2]:.3f}]" if m[1] != m[2] else f"{m[0]:.3f}"
    seeds = summaries[0]["seeds"]
    span = f"seeds {seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else f"seeds {seeds}"
    wall = "wall time" + (f" ({jobs} runs side by side)" if jobs > 1 else "")
    out = [f"| algo | steps | passing the bar ({span}) | {wall}, median | initial reward | final reward, median "
           "[range] | bar | held-out pass@1, median [range] | held-out pass@8, median |", "|---|---|---|---|---|---|---|---|---|"]
    out += [f"| {s['label']} | {s['steps']} | {s['passed']}/{s['n']} | {s['wall']:.0f} s | {s['init']:.3f} | "
            f"{rng(s['final'])} | {s['need']:.3f} | {s['p1'][0][0]:.3f} → {rng(s['p1'][1])} | "
            f"{s['p8'][0][0]:.3f} → {s['p8'][1][0]:.3f} |" for s in summaries]
    return out


def plot(summaries: list[dict], path: str, start: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax_eval) = plt.subplots(1, 2, figsize=(12, 4))
    for i, s in enumerate(summaries):
        res = s["median_run"]
        r = np.array(res["rewards"])
        w = max(1, len(r) // 40)
        smooth = np.convolve(r, np.ones(w) / w, mode="valid")
        ax.plot(np.arange(len(smooth)) + w, smooth, color=f"C{i}", label=f"{s['label']} (seed {res['seed']})")
        if res["eval"]:
            ev = np.array(res["eval"])
            ax_eval.plot(ev[:, 0], ev[:, 1], color=f"C{i}", marker="o", ms=3, label=s["label"])
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward (moving average)")
    ax.set_title(f"configs/tiny.py: training reward, digit puzzles {start}, CPU (each algorithm's median seed)",
                 fontsize=9)
    ax_eval.set_xlabel("step")
    ax_eval.set_ylabel("held-out pass@1")
    ax_eval.set_title("held-out pass@1: 128 test-split prompts never trained on, 16 samples each", fontsize=9)
    for a in (ax, ax_eval):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algos", default=",".join(ALGOS))
    ap.add_argument("--seeds", default="0-4", help="'0-4' or '0,3,7'; the config's own seed is 0")
    ap.add_argument("--jobs", type=int, default=1, help="runs side by side")
    ap.add_argument("--records", default="", help="JSON lines of the runs: read (runs there are not rerun), appended")
    ap.add_argument("--steps", type=int, default=0, help="0: the config's default length")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "tiny_curves.png"))
    ap.add_argument("--lora-rank", dest="lora_rank", type=int, default=0, help="> 0: full vs LoRA from a trained base")
    ap.add_argument("--lora-lr", dest="lora_lr", type=float, default=1e-3, help="LoRA's learning rate")
    ap.add_argument("--base-steps", dest="base_steps", type=int, default=150, help="full fine-tuning steps of the base")
    args = ap.parse_args()
    base_tmp = tempfile.TemporaryDirectory()
    seeds = seed_list(args.seeds)
    variants = [(algo, algo, ()) for algo in args.algos.split(",")]
    if args.lora_rank:
        algo = variants[0][1]
        base_wall, _ = run(algo, args.base_steps, base_tmp.name, ("--config.eval.every_steps=0",), export=True)
        print(f"base: {args.base_steps} steps of full {algo} in {base_wall:.0f} s", flush=True)
        common = (f"--config.model.path={base_tmp.name}/hf",)
        lora = (f"--config.lora.rank={args.lora_rank}", f"--config.lora.alpha={args.lora_rank}",
                f"--config.optimizer.learning_rate={args.lora_lr}")
        variants = [(f"{algo} full", algo, common), (f"{algo} LoRA r={args.lora_rank}", algo, common + lora)]
        seeds = [None]
    steps = args.steps or None
    records = [r for r in load_records(args.records) if r.get("steps_arg") == steps]
    done = {(r["label"], r["seed"]) for r in records}
    todo = [(label, algo, seed, extra) for seed in seeds for label, algo, extra in variants if (label, seed) not in done]

    def work(job):
        label, algo, seed, extra = job
        res = {**one_run(label, algo, seed, steps, extra), "steps_arg": steps}
        print(f"{label:8s} seed {seed} {res['steps']:4d} steps {res['wall']:6.1f} s  reward {res['init']:+.3f} -> "
              f"{res['final']:+.3f} (bar {res['need']:.3f}) {'PASS' if res['ok'] else 'FAIL'}  held-out pass@1 "
              f"{res['pass@1'][0]:.3f} -> {res['pass@1'][1]:.3f}", flush=True)
        if args.records:
            with open(args.records, "a") as f:
                f.write(json.dumps(res) + "\n")
        return res

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        records += list(pool.map(work, todo))
    summaries = []
    for label, _, _ in variants:
        runs = [r for r in records if r["label"] == label and r["seed"] in seeds]
        summaries.append(summarize(label, runs))
        s = summaries[-1]
        print(f"{label}: {s['passed']}/{s['n']} seeds pass the bar; final reward median {s['final'][0]:.3f} "
              f"[{s['final'][1]:.3f}, {s['final'][2]:.3f}]", flush=True)
    plot(summaries, args.out, f"from a {args.base_steps}-step base" if args.lora_rank else "from a random init")
    lines = table(summaries, args.jobs)
    lines.append(f"\n(host: {machine_description()})")
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
