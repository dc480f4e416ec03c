"""Runs the embedded default (configs/tiny.py) for each algorithm and plots the reward curves beside
the held-out pass@1 (128 prompts of the task's test split, never trained on, 16 samples each).

  python benchmarks/tiny_curves.py [--algos grpo,dr_grpo,dapo,gspo,sapo,ppo] [--steps N] [--out docs/tiny_curves.png]
  python benchmarks/tiny_curves.py --algos grpo --lora-rank 16 --lora-lr 1e-3 --base-steps 150 --steps 400 \
      --out docs/lora_curves.png

LoRA (--lora-rank R): the random tiny model is no base to adapt (its frozen, tied embedding of std 0.02
bounds every logit, docs/lora.md), so a base is trained first: --base-steps of full fine-tuning of the
first algorithm, exported. Then full fine-tuning and LoRA (rank R, --lora-lr) each continue from that
base for --steps steps, plotted side by side.

For every algorithm, each in its own process (a fresh start, compile included, like a user's run), it
prints the wall time of the whole run and checks the issue's bar: the mean reward of the last 10% of
steps must reach the initial mean reward (that of the random initial policy: the first 10 steps) plus
half of the headroom to the maximum reward 1.0. The table also gives the held-out pass@1 and pass@8 of the
initial policy (step 0) and of the final one.
Writes the PNG and a markdown table (docs/tiny_curves.md) that the README shows.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from harness.runs import ROOT, held_out, run

ALGOS = ("grpo", "dr_grpo", "dapo", "gspo", "sapo", "ppo")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algos", default=",".join(ALGOS))
    ap.add_argument("--steps", type=int, default=0, help="0: the config's default length")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "tiny_curves.png"))
    ap.add_argument("--lora-rank", dest="lora_rank", type=int, default=0, help="> 0: full vs LoRA from a trained base")
    ap.add_argument("--lora-lr", dest="lora_lr", type=float, default=1e-3, help="LoRA's learning rate")
    ap.add_argument("--base-steps", dest="base_steps", type=int, default=150, help="full fine-tuning steps of the base")
    args = ap.parse_args()
    results = {}
    variants = [(algo, algo, ()) for algo in args.algos.split(",")]
    base_tmp = tempfile.TemporaryDirectory()
    if args.lora_rank:
        algo = variants[0][1]
        base_wall, _ = run(algo, args.base_steps, base_tmp.name, ("--config.eval.every_steps=0",), export=True)
        print(f"base: {args.base_steps} steps of full {algo} in {base_wall:.0f} s", flush=True)
        common = (f"--config.model.path={base_tmp.name}/hf",)
        lora = (f"--config.lora.rank={args.lora_rank}", f"--config.lora.alpha={args.lora_rank}",
                f"--config.optimizer.learning_rate={args.lora_lr}")
        variants = [(f"{algo} full", algo, common), (f"{algo} LoRA r={args.lora_rank}", algo, common + lora)]
    for label, algo, extra in variants:
        with tempfile.TemporaryDirectory() as work:
            wall, rows = run(algo, args.steps or None, work, extra)
        r = np.array([row["reward/mean"] for row in rows if "reward/mean" in row])  # step 0: evaluation only
        init, final = r[:10].mean(), r[-max(1, len(r) // 10):].mean()
        need = init + 0.5 * (1.0 - init)
        ev_curve, ends = held_out(rows)
        results[label] = dict(wall=wall, steps=len(r), init=init, final=final, need=need, curve=r, eval=ev_curve,
                             **ends)
        print(f"{label:8s} {len(r):4d} steps {wall:6.1f} s  reward {init:+.3f} -> {final:+.3f} "
              f"(bar {need:.3f}) {'PASS' if final >= need and wall <= 300 else 'FAIL'}  held-out pass@1 "
              f"{ends['pass@1'][0]:.3f} -> {ends['pass@1'][1]:.3f}, pass@8 {ends['pass@8'][0]:.3f} -> "
              f"{ends['pass@8'][1]:.3f}", flush=True)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax_eval) = plt.subplots(1, 2, figsize=(12, 4))
    for i, (algo, res) in enumerate(results.items()):
        r = res["curve"]
        w = max(1, len(r) // 40)
        smooth = np.convolve(r, np.ones(w) / w, mode="valid")
        ax.plot(np.arange(len(smooth)) + w, smooth, color=f"C{i}", label=f"{algo} ({res['wall']:.0f} s)")
        if len(res["eval"]):
            ax_eval.plot(res["eval"][:, 0], res["eval"][:, 1], color=f"C{i}", marker="o", ms=3, label=algo)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward (moving average)")
    start = f"from a {args.base_steps}-step base" if args.lora_rank else "from a random init"
    ax.set_title(f"configs/tiny.py: training reward, digit puzzles {start}, CPU", fontsize=9)
    ax_eval.set_xlabel("step")
    ax_eval.set_ylabel("held-out pass@1")
    ax_eval.set_title("held-out pass@1: 128 test-split prompts never trained on, 16 samples each", fontsize=9)
    for a in (ax, ax_eval):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    table = ["| algo | steps | wall time | initial reward | final reward | bar (initial + half headroom) "
             "| held-out pass@1 | held-out pass@8 |", "|---|---|---|---|---|---|---|---|"]
    table += [f"| {a} | {r['steps']} | {r['wall']:.0f} s | {r['init']:.3f} | {r['final']:.3f} | {r['need']:.3f} "
              f"| {r['pass@1'][0]:.3f} → {r['pass@1'][1]:.3f} | {r['pass@8'][0]:.3f} → {r['pass@8'][1]:.3f} |"
              for a, r in results.items()]
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
