"""Soak run of the trainer: resident memory and step time over a long run of configs/tiny.py.

    python benchmarks/soak.py                         # 300 steps of the tiny config (GRPO), minutes on a CPU
    python benchmarks/soak.py --algo=ppo --steps=200  # another preset
    python benchmarks/soak.py --small --steps=30 --warmup=10 --window=10 --json=out.json   # smoke (tests)

The real `Trainer.run()` loop runs, checkpoints (asynchronous Orbax saves), metrics, samples and
TensorBoard included; `train_step` is wrapped to stamp each iteration. Per iteration it records the
wall time from one step's start to the next (so a step pays for its own metric writes and saves) and
the resident set size (RSS, from /proc/self/statm) at its start; a `jax.monitoring` listener records
every trace and XLA compilation with the step it happened in.

Reported (after `--warmup` steps, which must hold the first checkpoint and sample write so that their
one-time compilations and buffers are not counted as growth):
  RSS at the end of warm-up vs at the end, both after a `gc.collect()`, and the growth in %
                                                                 (criterion: < 5 %);
  also the end vs the lowest RSS after warm-up and the Theil-Sen drift of RSS, since the allocator
  can hand back memory late (about 400 MiB of compilation memory some 55 steps in)
  median and 10th percentile of the step time of the first and the last `--window` steps after
  warm-up, and the Theil-Sen slope of the step time over those steps as a drift over the run in % of
  the median; the same for the process's CPU time per step (criterion: no upward drift; on a shared
  machine the neighbours' load moves the wall time, hardly the CPU time, which is the program's cost)
  the functions traced or compiled after warm-up                 (criterion: none)
Nothing asserts here (benchmarks measure and print); tests/test_reliability.py runs the smoke version
and checks its JSON.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "configs"))

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# The shapes of tests/test_trainer.py's small_config: with a warm compilation cache the smoke run
# compiles nothing (the reward is the built-in task's own, so the run needs nothing from tests/).
SMALL = {"model.hidden_size": 32, "model.num_layers": 1, "model.intermediate_size": 64,
         "rollout.batch_prompts": 4, "rollout.group_size": 2, "rollout.max_new_tokens": 3, "data.task_rows": 64,
         "eval.every_steps": 0}


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; the peak from getrusage elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def build_config(args):
    import tiny
    c = tiny.get_config(f"algo={args.algo}")
    c.total_steps = args.steps
    c.log.progress = False
    c.export.at_end = False
    c.export.plot = False
    if args.small:
        for key, value in SMALL.items():
            section, leaf = key.split(".")
            c[section][leaf] = value
    c.checkpoint.every_steps = args.checkpoint_every
    c.log.samples_every = args.samples_every
    return c


def slope_drift(times: np.ndarray) -> float:
    """Theil-Sen slope of a per-step series (step time, RSS) vs step (the median of the slopes between
    every pair of steps: the periodic checkpoint steps do not tilt it as they tilt a least-squares fit),
    times the number of steps, in % of the series' median: how much higher the last step sits than the
    first along that line."""
    t = np.asarray(times, np.float64)
    i, j = np.triu_indices(len(t), k=1)
    slope = float(np.median((t[j] - t[i]) / (j - i)))
    return 100.0 * slope * len(t) / float(np.median(t))


def soak(args) -> dict:
    import jax

    from jaxrl_llm.trainer import Trainer

    c = build_config(args)
    if args.warmup + 2 * args.window > args.steps:
        raise ValueError(f"--steps={args.steps} must be at least --warmup + 2 * --window = "
                         f"{args.warmup + 2 * args.window}")
    if c.checkpoint.every_steps > args.warmup:
        raise ValueError(f"--warmup={args.warmup} must hold the first checkpoint (every "
                         f"{c.checkpoint.every_steps} steps), or its one-time costs count as growth")
    step_of_event = {"step": 0}
    events = []  # (step, "trace" | "compile", function name)

    def listener(event, duration, **kwargs):
        if event in (TRACE_EVENT, COMPILE_EVENT):
            events.append((step_of_event["step"], "trace" if event == TRACE_EVENT else "compile",
                           kwargs.get("fun_name", "?")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    workdir = args.workdir or tempfile.mkdtemp(prefix="jaxrl_llm-soak-")
    starts, cpu, rss, baseline = [], [], [], []
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    try:
        trainer = Trainer(c, workdir)
        inner = trainer.train_step

        def stamped(state):
            if len(starts) == args.warmup:
                # The baseline: compilation leaves garbage in reference cycles that a later collection
                # frees (hundreds of MiB at once); collect it so it does not pass for a shrinking heap.
                gc.collect()
                baseline.append(rss_bytes())
            starts.append(time.perf_counter())
            cpu.append(time.process_time())
            rss.append(rss_bytes())
            step_of_event["step"] = len(starts)
            return inner(state)

        trainer.train_step = stamped
        trainer.run()
        starts.append(time.perf_counter())  # the end of the last step (its writes and final save included)
        cpu.append(time.process_time())
        gc.collect()
        rss_end = rss_bytes()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    times = np.diff(np.array(starts))  # times[i]: step i + 1
    cpu_times = np.diff(np.array(cpu))  # CPU seconds of all the process's threads in step i + 1
    after, cpu_after = times[args.warmup:], cpu_times[args.warmup:]
    rss_warm = baseline[0]
    late = [e for e in events if e[0] > args.warmup]
    first_w, last_w = after[:args.window], after[-args.window:]
    return {
        "algo": args.algo, "small": args.small, "steps": args.steps, "warmup": args.warmup,
        "window": args.window, "checkpoint_every": c.checkpoint.every_steps,
        "rss_mib_warm": rss_warm / 2**20, "rss_mib_end": rss_end / 2**20,
        "rss_growth_pct": 100.0 * (rss_end - rss_warm) / rss_warm,
        "rss_mib_max_after_warmup": max(rss[args.warmup:]) / 2**20,
        "rss_mib_min_after_warmup": min(rss[args.warmup:]) / 2**20,
        "rss_growth_from_min_pct": 100.0 * (rss_end - min(rss[args.warmup:])) / min(rss[args.warmup:]),
        "rss_drift_pct": slope_drift(np.array(rss[args.warmup:], np.float64)),
        "rss_mib_median_first_window": float(np.median(rss[args.warmup:args.warmup + args.window])) / 2**20,
        "rss_mib_median_last_window": float(np.median(rss[-args.window:])) / 2**20,
        "rss_mib_per_step": [r / 2**20 for r in rss],
        "step_s": times.tolist(), "first_step_s": float(times[0]),
        "median_first_window_s": float(statistics.median(first_w)),
        "median_last_window_s": float(statistics.median(last_w)),
        "median_ratio": float(statistics.median(last_w) / statistics.median(first_w)),
        "p10_first_window_s": float(np.percentile(first_w, 10)),
        "p10_last_window_s": float(np.percentile(last_w, 10)),
        "cpu_step_s": cpu_times.tolist(),
        "cpu_median_first_window_s": float(np.median(cpu_after[:args.window])),
        "cpu_median_last_window_s": float(np.median(cpu_after[-args.window:])),
        "cpu_drift_pct": slope_drift(cpu_after),
        "slope_drift_pct": slope_drift(after),
        "traces_after_warmup": [f"step {s}: {kind} {name}" for s, kind, name in late],
        "events_during_warmup": len(events) - len(late),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def report(r: dict) -> str:
    load = lambda v: "/".join(f"{x:.1f}" for x in v) if v else "?"
    ms = lambda key: f"{1e3 * r[key]:.1f} ms"
    lines = [
        f"soak: {r['steps']} steps of configs/tiny.py ({r['algo']}{', small shapes' if r['small'] else ''}), "
        f"checkpoint every {r['checkpoint_every']}, warm-up {r['warmup']} steps; load average "
        f"{load(r['load_average_start'])} at the start, {load(r['load_average_end'])} at the end",
        f"  RSS        after warm-up {r['rss_mib_warm']:.1f} MiB, at the end {r['rss_mib_end']:.1f} MiB: "
        f"{r['rss_growth_pct']:+.2f} % ({'within' if r['rss_growth_pct'] < 5 else 'ABOVE'} the 5 % bound); "
        f"after warm-up lowest {r['rss_mib_min_after_warmup']:.1f}, highest {r['rss_mib_max_after_warmup']:.1f} "
        f"MiB; the end vs the lowest {r['rss_growth_from_min_pct']:+.2f} %; median of the first {r['window']} "
        f"{r['rss_mib_median_first_window']:.1f}, of the last {r['window']} {r['rss_mib_median_last_window']:.1f} MiB; "
        f"Theil-Sen drift {r['rss_drift_pct']:+.2f} %",
        f"  step time  first step {r['first_step_s']:.2f} s (compilation); first {r['window']} after warm-up: "
        f"median {ms('median_first_window_s')}, 10th percentile {ms('p10_first_window_s')}; last {r['window']}: "
        f"median {ms('median_last_window_s')}, 10th percentile {ms('p10_last_window_s')}; "
        f"Theil-Sen drift over the run {r['slope_drift_pct']:+.1f} %",
        f"  CPU time   per step (all threads; what the neighbours' load does not inflate): median of the first "
        f"{r['window']} {ms('cpu_median_first_window_s')}, of the last {r['window']} "
        f"{ms('cpu_median_last_window_s')}; Theil-Sen drift {r['cpu_drift_pct']:+.1f} %",
        f"  traces/compilations after warm-up: {len(r['traces_after_warmup'])} "
        f"({r['events_during_warmup']} during warm-up)",
    ]
    lines += [f"    {t}" for t in r["traces_after_warmup"][:20]]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    # 75: past the first checkpoint (40) and a one-off return of compilation memory to the OS that the
    # allocator makes some 55 steps in (about 400 MiB), which would otherwise pass for shrinking.
    p.add_argument("--warmup", type=int, default=75, help="steps excluded from the trends")
    p.add_argument("--window", type=int, default=50, help="steps in each median window")
    p.add_argument("--algo", default="grpo")
    p.add_argument("--small", action="store_true", help="the tests' smaller shapes")
    p.add_argument("--checkpoint-every", type=int, default=40, help="checkpoint interval (steps)")
    p.add_argument("--samples-every", type=int, default=20, help="samples.jsonl interval (steps)")
    p.add_argument("--workdir", default="", help="keep the run here (default: a temporary directory)")
    p.add_argument("--json", default="", help="also write the measurements to this file")
    args = p.parse_args(argv)
    result = soak(args)
    print(report(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
