"""Partial rollouts (rollout.partial) against the synchronous loop and one-step-off rollouts (k = 1) on
heavy-tailed completion lengths: the trainer's time per step, and the tiny task's reward per sample.

  python benchmarks/partial_rollouts.py [--toy] [--size 3M] [--prompts 8] [--group 4] [--prompt-len 64] \
      [--new-tokens 2048] [--median 0.1] [--slots 0] [--steps 6] [--warmup 2] [--json F] [--out docs/benchmarks.md]
  python benchmarks/partial_rollouts.py --curves [--curve-steps 800] [--curve-slots 64] [--seeds 0,1] [--root DIR]

Time per step (one process, the three runs one after the other on the same workspace):
  sync     rollout.max_staleness 0: sample the batch, then train on it
  async    max_staleness 1: the batch of step i+1 is sampled by the policy after update i (one-step-off)
  partial  rollout.partial, max_staleness 2: the decode goes on across steps in a table of 2B groups; each
           batch is the first B groups to complete, the rows in flight go on with the next policy
All three: the trainer in-process (jaxrl_llm.trainer.Trainer, mesh.rollout_devices = 0: sampling and
training do not overlap), GRPO (harness/grpo.py `ours_config`), a random checkpoint of `--size`
(harness/shapes.py; 135M = SmolLM2-135M's shape), the continuous-batching sampler with `--slots` slots
(0: a quarter of the B*G rows), and stop ids calibrated so that completion lengths are geometric with median
`--median` x T, cut at T (harness/grpo.py `heavy_tailed_stop_ids`; generation_config's eos list, which the
trainer reads). Without overlap what differs is the tail: sync and async decode every row of a batch to its
end, so the longest rows set the decode steps; partial stops a round once B groups are complete.
Reported, medians of the steps after `--warmup`: step time, the rollout's share of it (sampling + rewards),
generated tokens per step (partial: every token drawn in the round, rows left in flight included), decode
steps per round (partial: the round's loop iterations, measured; sync/async: the slots schedule of the
batch's measured lengths, each row holding a slot for length - 1 steps), the batch's mean completion length,
and the ratios sync/partial, async/partial. Partial's batches are the groups that completed first, rows
begun in earlier rounds among them: their lengths differ from a fresh batch's (the update's tokens too, with
`--pack-length`; without it the update runs B*G rows of P + T tokens in every mode).

--curves runs configs/tiny.py (GRPO) for `--curve-steps` steps with k = 0, k = 1 and partial k = 2, all with
rollout.decode_slots = `--curve-slots` (the same sampler, so only the schedule differs), each in its own
process (`python -m jaxrl_llm.train`; a run whose workdir holds DONE is reused, an interrupted one resumes),
and prints the training reward per window of samples consumed (B*G = 256 per step in every mode) and the
held-out pass@1 (configs/tiny.py's evaluation: before the first step, every 100 steps, at the end).
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

MODES = {"sync": (0, False), "async": (1, False), "partial": (2, True)}  # name: (max_staleness, partial)


def slots_decode_steps(lengths, slots: int) -> int:
    """Decode steps of the slots sampler (sampling/slots.py) for rows of `lengths` in row order: the first
    token comes from the prefill, then a row holds a slot for length - 1 steps; a freed slot takes the next
    row at the same step. The makespan of that list schedule."""
    free = [0] * slots
    for n in lengths:
        if n > 1:
            heapq.heappush(free, heapq.heappop(free) + int(n) - 1)
    return max(free)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--toy", action="store_true", help="toy sizes, a few steps: checks the script runs")
    p.add_argument("--size", default="3M", help="model shape (harness/shapes.py: toy, 3M, 30M, 135M, ...)")
    p.add_argument("--prompts", type=int, default=8, help="rollout.batch_prompts B")
    p.add_argument("--group", type=int, default=4, help="rollout.group_size G")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=2048, help="rollout.max_new_tokens T (the cap)")
    p.add_argument("--median", type=float, default=0.1, help="median completion length / T")
    p.add_argument("--slots", type=int, default=0, help="rollout.decode_slots (0: B*G/4)")
    p.add_argument("--pack-length", type=int, default=0, help="train.pack_length (0: off, the default)")
    p.add_argument("--steps", type=int, default=6, help="training steps per mode, warm-up included")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians (compiles)")
    p.add_argument("--modes", default="sync,async,partial")
    p.add_argument("--workspace", default="", help="reuse this workspace (default: a temporary one)")
    p.add_argument("--json", default="", help="also write the results here")
    p.add_argument("--out", default="", help="markdown file whose results block is replaced")
    p.add_argument("--curves", action="store_true", help="the tiny task's reward per sample instead")
    p.add_argument("--curve-steps", type=int, default=800)
    p.add_argument("--curve-slots", type=int, default=64)
    p.add_argument("--seeds", default="0", help="--curves: config.seed of each run, comma-separated")
    p.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "partial_curves"))
    args = p.parse_args(argv)
    if args.toy:
        args.size, args.prompts, args.group, args.prompt_len, args.new_tokens = "toy", 2, 2, 4, 32
        args.median, args.steps, args.warmup, args.curve_steps, args.curve_slots = 0.25, 4, 1, 3, 16
    args.slots = args.slots or max(1, args.prompts * args.group // 4)
    if args.steps <= args.warmup:
        raise ValueError(f"--steps must exceed --warmup, got {args.steps} <= {args.warmup}")
    if args.median * args.new_tokens < 1:
        raise ValueError("--median x --new-tokens must be at least one token")
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        raise ValueError(f"--modes: unknown {sorted(unknown)}; expected {', '.join(MODES)}")
    return args


def mode_config(ws: str, args, k: int, partial: bool, steps: int):
    from harness import grpo
    ns = argparse.Namespace(prompt_len=args.prompt_len, batch=args.prompts, group=args.group,
                            new_tokens=args.new_tokens, decode_slots=args.slots, pack_length=args.pack_length)
    c = grpo.ours_config(ws, ns)
    c.rollout.max_staleness, c.rollout.partial, c.mesh.rollout_devices = k, partial, 0
    c.total_steps, c.eval.every_steps = steps, 0
    return c


def run_mode(ws: str, args, name: str) -> dict:
    """One mode's run: its metrics rows and, per step, the batch's lengths, tokens drawn and decode steps."""
    from jaxrl_llm.trainer import Trainer
    k, partial = MODES[name]
    trainer = Trainer(mode_config(ws, args, k, partial, args.steps), os.path.join(ws, name))
    drawn = []  # per round, in the order the producer ran them

    def recorded(collect):
        def wrapper(*a, **kw):
            local, first, info = collect(*a, **kw)
            steps = info.get("partial", {}).get("rollout/partial/decode_steps")
            drawn.append({"lengths": [int(x) for x in local["lengths"]], "gen_tokens": info["gen_tokens"],
                          "sample_s": info["sample_s"],
                          "decode_steps": steps if steps is not None else
                          slots_decode_steps(local["lengths"], args.slots),
                          "restarted": info.get("partial", {}).get("rollout/partial/restarted", 0.0)})
            return local, first, info
        return wrapper
    if partial:
        trainer.partial.collect = recorded(trainer.partial.collect)
    else:
        trainer.rollouts.collect = recorded(trainer.rollouts.collect)
    rows = trainer.run()
    return {"rows": rows, "rounds": drawn}


def summarize(run: dict, warmup: int) -> dict:
    """Medians over the steps after the warm-up (rounds: the ones after the warm-up's, in production order)."""
    rows, rounds = run["rows"][warmup:], run["rounds"][warmup:]
    med = lambda xs: statistics.median(xs) if xs else float("nan")
    lengths = [x for r in rounds for x in r["lengths"]]
    return {"step_s": med([r["perf/step_s"] for r in rows]), "sample_s": med([r["sample_s"] for r in rounds]),
            "gen_tokens": med([r["gen_tokens"] for r in rounds]),
            "decode_steps": med([r["decode_steps"] for r in rounds]),
            "batch_len_mean": sum(lengths) / max(len(lengths), 1), "batch_len_max": max(lengths, default=0),
            "restarted": sum(r["restarted"] for r in rounds),
            "staleness_mean": med([r.get("rollout/staleness/mean", 0.0) for r in rows]),
            "steps_timed": len(rows), "rounds_timed": len(rounds)}


def timing(args) -> tuple[str, dict]:
    import jax

    from harness import grpo
    from harness.report import machine_description, markdown_table
    from harness.shapes import size_of
    size = size_of(args.size)
    with tempfile.TemporaryDirectory() as tmp:
        ws = args.workspace or os.path.join(tmp, "ws")
        T = args.new_tokens
        if not os.path.exists(os.path.join(ws, "prompts.jsonl")):
            grpo.make_workspace(ws, size, num_prompts=max(64, 4 * args.prompts * (args.steps + 2)),
                                prompt_len=args.prompt_len, max_positions=args.prompt_len + T, torch_side=False)
        stop = grpo.heavy_tailed_stop_ids(ws, args.median * T)
        out = {}
        for name in args.modes.split(","):
            out[name] = summarize(run_mode(ws, args, name), args.warmup)
            print(f"{name:8s}: median step {out[name]['step_s']:.3f} s, rollout {out[name]['sample_s']:.3f} s, "
                  f"{out[name]['gen_tokens']:.0f} tokens drawn, {out[name]['decode_steps']:.0f} decode steps",
                  flush=True)
    head = (f"== {'toy' if args.toy else 'timing'}: {args.size}, {args.prompts} prompts x {args.group}, "
            f"{args.prompt_len} + {T} tokens, geometric lengths of median {args.median * T:.0f} "
            f"({len(stop)} stop ids), "
            f"decode_slots {args.slots}, pack_length {args.pack_length or 'off'}; {args.steps} steps per mode, medians "
            f"of steps {args.warmup + 1}..{args.steps}; {jax.device_count()} {jax.default_backend()} device(s)")
    table = markdown_table(
        ["mode", "k", "step s", "rollout s", "tokens drawn / step", "decode steps / round", "batch mean length",
         "batch max length", "rows restarted", "staleness (mean)"],
        [[n, MODES[n][0], o["step_s"], o["sample_s"], o["gen_tokens"], o["decode_steps"], o["batch_len_mean"],
          o["batch_len_max"], int(o["restarted"]), o["staleness_mean"]] for n, o in out.items()])
    lines = [head, machine_description(), "", table]
    if "partial" in out:
        p = out["partial"]
        for n in ("sync", "async"):
            if n in out:
                lines.append(f"{n} / partial: step {out[n]['step_s'] / p['step_s']:.2f}x, rollout "
                             f"{out[n]['sample_s'] / p['sample_s']:.2f}x, decode steps "
                             f"{out[n]['decode_steps'] / max(p['decode_steps'], 1):.2f}x")
    text = "\n".join(lines)
    print(text)
    return text, {"args": vars(args), "stop_ids": len(stop), "modes": out, "machine": machine_description()}


def curves(args) -> tuple[str, dict]:
    runs = {"k=0": (0, False), "k=1": (1, False), "partial k=2": (2, True)}
    B = G = 4 if args.toy else 16  # configs/tiny.py's batch: 256 samples a step in every mode
    seeds = [int(x) for x in args.seeds.split(",")]
    result = {}
    lines = [f"== curves: configs/tiny.py GRPO, {args.curve_steps} steps ({args.curve_steps * B * G:,} samples) "
             f"per run, decode_slots {args.curve_slots} in every run, seeds {args.seeds}",
             "| run | seed | reward by window of samples consumed | last window "
             "| held-out pass@1 (step 0, every 100 steps, end) | staleness (mean) | rows restarted |",
             "|---|---|---|---|---|---|---|"]
    win = max(1, args.curve_steps // 8)
    for name, (k, partial) in runs.items():
        for seed in seeds:
            wd = os.path.join(args.root, f"{name.replace(' ', '_').replace('=', '')}_s{seed}")
            if not os.path.exists(os.path.join(wd, "DONE")):
                cmd = [sys.executable, "-m", "jaxrl_llm.train", f"--config={ROOT}/configs/tiny.py",
                       f"--workdir={wd}", f"--config.seed={seed}", f"--config.total_steps={args.curve_steps}",
                       f"--config.rollout.max_staleness={k}", f"--config.rollout.partial={partial}",
                       f"--config.rollout.decode_slots={args.curve_slots}", "--config.log.progress=False",
                       "--config.export.at_end=False", "--config.export.plot=False"]
                if args.toy:
                    cmd += ["--config.eval.every_steps=0", "--config.rollout.batch_prompts=4",
                            "--config.rollout.group_size=4", "--config.checkpoint.every_steps=1000"]
                print(" ".join(cmd[1:]), flush=True)
                subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            with open(os.path.join(wd, "metrics.jsonl")) as f:
                rows = [json.loads(line) for line in f]
            r = [x["reward/mean"] for x in rows if "reward/mean" in x]
            ev = [x["eval/pass@1"] for x in rows if "eval/pass@1" in x]
            means = [sum(r[i:i + win]) / len(r[i:i + win]) for i in range(0, len(r), win)]
            stale = [x["rollout/staleness/mean"] for x in rows if "rollout/staleness/mean" in x]
            restarted = sum(x.get("rollout/partial/restarted", 0.0) for x in rows)
            tens = [round(sum(r[i:i + 10]) / len(r[i:i + 10]), 4) for i in range(0, len(r), 10)]
            one = {"reward_per_10_steps": tens, "eval_pass@1": ev, "window_means": means, "window_steps": win,
                   "staleness_mean": sum(stale) / max(len(stale), 1), "restarted": restarted}
            result[f"{name} seed {seed}"] = one
            evs = " ".join(f"{e:.3f}" for e in ev) or "-"
            lines.append(f"| {name} | {seed} | {' '.join(f'{m:.3f}' for m in means)} | {means[-1]:.3f} | {evs} | "
                         f"{one['staleness_mean']:.2f} | {int(restarted)} |")
    lines.append(f"(windows of {win} steps = {win * B * G:,} samples)" if not args.toy else "(toy sizes)")
    text = "\n".join(lines)
    print(text)
    return text, {"args": vars(args), "runs": result}


def main(argv=None):
    args = parse_args(argv)
    text, result = curves(args) if args.curves else timing(args)
    if args.json:
        from harness.report import save_json
        save_json(args.json, result)
    if args.out:
        from harness.report import update_markdown
        update_markdown(args.out, "partial-curves" if args.curves else "partial-timing", text)


if __name__ == "__main__":
    main()
