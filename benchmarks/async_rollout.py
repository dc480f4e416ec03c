"""Asynchronous rollouts (rollout.max_staleness, mesh.rollout_devices): the per-step timeline on 8 devices
split 4/4 against the synchronous loop on the same 8 devices, and the tiny task's learning curves for
k = 0, 1, 2.

  python benchmarks/async_rollout.py [--toy] [--steps 12] [--out docs/benchmarks.md]
  python benchmarks/async_rollout.py --curves [--root DIR] [--png docs/async_curves.png]

Timeline (one process, the three runs side by side, the first 2 steps -- compiles -- left out):
  sync     k=0, r=0: sample then train, both on all 8 devices (today's loop)
  split    k=0, r=4: sample on 4 devices, train on the other 4, one after the other: the trainer's wait
           for its batch is the sampling stage t_sample (with the weight copy), the rest of the step t_train
  async    k=1, r=4: the batch of step i+1 is sampled (and scored) while step i trains
It prints the median step time of each, the trainer's wait for rollouts and the sampler's wait for
weights in the async run, and the ideal speed-up of overlap from the measured stages:
(t_sample + t_train) / max(t_sample, t_train). Without --xla flags of its own it asks XLA for 8 CPU
devices; on a machine with 2 cores those 8 devices share 2 cores, so the two meshes compete for the
same cores and no real overlap can show: the numbers measure the machinery, not a speed-up.

--curves runs configs/tiny.py (GRPO, 800 steps, held-out evaluation) with k = 0, 1, 2, each in its own
process (reusing <root>/k<k> when it already holds a finished run), and plots the reward curves side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

if "--curves" not in sys.argv:  # the timeline needs its 8 devices before jax is imported
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "configs"))
WARMUP = 2  # steps left out of the medians: they compile

MODES = {"sync": (0, 0), "split": (0, 4), "async": (1, 4)}  # name: (max_staleness, rollout_devices)


def timeline_config(k: int, r: int, steps: int, toy: bool):
    import tiny
    c = tiny.get_config("algo=grpo")
    c.total_steps, c.rollout.max_staleness, c.mesh.rollout_devices = steps, k, r
    c.log.progress, c.log.tensorboard, c.export.at_end, c.export.plot = False, False, False, False
    c.eval.every_steps, c.checkpoint.every_steps = 0, 10_000
    if toy:
        c.model.hidden_size, c.model.num_layers, c.model.intermediate_size = 32, 1, 64
        c.rollout.batch_prompts, c.rollout.group_size, c.rollout.max_new_tokens = 8, 2, 3
        c.data.task_rows = 64
    else:  # a model whose stages take long enough to time (still seconds per step on CPU)
        c.model.hidden_size, c.model.num_layers, c.model.intermediate_size = 256, 4, 512
        c.model.num_heads, c.model.num_kv_heads = 8, 4
        c.rollout.batch_prompts, c.rollout.group_size, c.rollout.max_new_tokens = 16, 8, 24
        c.model.max_position_embeddings = 64
    return c


def timeline(args) -> str:
    import jax
    from jaxrl_llm.trainer import Trainer
    if jax.device_count() != 8:
        raise SystemExit(f"needs 8 devices, found {jax.device_count()} (XLA_FLAGS={os.environ.get('XLA_FLAGS')})")
    med = lambda rows, key: statistics.median(r.get(key, 0.0) for r in rows[WARMUP:])
    out = {}
    with tempfile.TemporaryDirectory() as work:
        for name, (k, r) in MODES.items():
            rows = Trainer(timeline_config(k, r, args.steps, args.toy), os.path.join(work, name)).run()
            out[name] = {"step": med(rows, "perf/step_s"), "wait": med(rows, "perf/rollout_wait_s"),
                         "weights": med(rows, "perf/sampler_wait_s"), "rows": rows}
            print(f"{name:6s} k={k} r={r}: median step {out[name]['step']:.3f} s", flush=True)
    t_sample, t_train = out["split"]["wait"], out["split"]["step"] - out["split"]["wait"]
    ideal = (t_sample + t_train) / max(t_sample, t_train, 1e-9)
    lines = [f"== {'toy' if args.toy else 'timeline'}: {args.steps} steps, medians of steps {WARMUP + 1}..{args.steps}, "
             f"{jax.device_count()} {jax.devices()[0].platform} devices on {os.cpu_count()} cores",
             "| run | k | rollout devices | step (s) | trainer waits for rollout (s) | sampler waits for weights (s) |",
             "|---|---|---|---|---|---|"]
    for name, (k, r) in MODES.items():
        o = out[name]
        waits = (f"{o['wait']:.3f} | {o['weights']:.3f}" if name != "sync" else "- | -")
        lines.append(f"| {name} | {k} | {r or 'shared (8)'} | {o['step']:.3f} | {waits} |")
    lines += ["", f"stages on the 4/4 split (run `split`): t_sample {t_sample:.3f} s, t_train {t_train:.3f} s; ideal "
              f"overlap speed-up (t_sample + t_train) / max(t_sample, t_train) = {ideal:.2f}x",
              f"measured: async / split ratio {out['async']['step'] / out['split']['step']:.2f}, "
              f"async / sync ratio {out['async']['step'] / out['sync']['step']:.2f} (lower is faster)"]
    lines += ["", "per step of the async run (s): step | trainer waits for rollout | sampler waits for weights | "
              "step time", "```"]
    lines += [f"{int(r['step']):4d} {r['perf/rollout_wait_s']:8.3f} {r['perf/sampler_wait_s']:8.3f} "
              f"{r['perf/step_s']:8.3f}" for r in out["async"]["rows"]]
    lines.append("```")
    text = "\n".join(lines)
    print(text)
    return text


def curves(args) -> str:
    import numpy as np
    rows = {}
    for k in (0, 1, 2):
        wd = os.path.join(args.root, f"k{k}")
        if not os.path.exists(os.path.join(wd, "DONE")):
            subprocess.run([sys.executable, "-m", "jaxrl_llm.train", f"--config={ROOT}/configs/tiny.py:algo=grpo",
                            f"--workdir={wd}", "--config.log.progress=False", "--config.export.at_end=False",
                            f"--config.rollout.max_staleness={k}"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        with open(os.path.join(wd, "metrics.jsonl")) as f:
            rows[k] = [json.loads(line) for line in f]
    lines = ["| k | initial reward | final reward (last 80 steps) | bar | first step the 50-step mean reaches the bar "
             "| held-out pass@1 | reward by 80-step window |", "|---|---|---|---|---|---|---|"]
    series = {}
    for k, rs in rows.items():
        r = np.array([x["reward/mean"] for x in rs if "reward/mean" in x])
        init, final = r[:10].mean(), r[-len(r) // 10:].mean()
        bar = init + (1 - init) / 2
        m = np.convolve(r, np.ones(50) / 50, mode="valid")
        first = int(np.argmax(m >= bar)) + 50 if (m >= bar).any() else "never"
        ev = [x["eval/pass@1"] for x in rs if "eval/pass@1" in x]
        windows = " ".join(f"{w:.2f}" for w in r[: len(r) // 80 * 80].reshape(-1, 80).mean(1))
        lines.append(f"| {k} | {init:.3f} | {final:.3f} | {bar:.3f} | {first} | {ev[0]:.3f} → {ev[-1]:.3f} | {windows} |")
        series[k] = r
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        for k, r in series.items():
            ax.plot(np.arange(25, len(r) + 1), np.convolve(r, np.ones(25) / 25, mode="valid"), label=f"k = {k}")
        ax.set(xlabel="step", ylabel="reward (25-step mean)", title="configs/tiny.py GRPO, rollout.max_staleness = k")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=100)
    text = "\n".join(lines)
    print(text)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--toy", action="store_true", help="tiny sizes, a few steps: checks the script runs")
    ap.add_argument("--steps", type=int, default=0, help="steps per run (default 12, toy 4)")
    ap.add_argument("--out", default="", help="markdown file whose results block is replaced")
    ap.add_argument("--curves", action="store_true", help="the learning curves of k = 0, 1, 2 instead")
    ap.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "async_curves"))
    ap.add_argument("--png", default="")
    args = ap.parse_args()
    args.steps = args.steps or (4 if args.toy else 12)
    text = curves(args) if args.curves else timeline(args)
    if args.out:
        sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
        from harness.report import update_markdown
        update_markdown(args.out, "async-curves" if args.curves else "async-timeline", text)


if __name__ == "__main__":
    main()
