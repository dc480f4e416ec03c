"""The library's numbers on a GPU, side by side with transformers and TRL on the same card, in one command.

    python benchmarks/gpu_suite.py --json results.json --markdown results.md   # on a GPU machine (< 10 min)
    python benchmarks/gpu_suite.py --dry-run --json r.json                     # tiny shapes, any device (CI)
    python benchmarks/gpu_suite.py --render results.json --markdown docs/benchmarks.md  # results -> the doc
    bash benchmarks/gpu_suite.sh                 # the device machine: carried wheels, then the suite, into $OUT

Stages (`--stages`), each in a subprocess of its own (so that one stage's crash or out-of-memory is recorded
and the next still runs, and each stage's peak device memory is its own):
- env: device, driver, library versions; the matmul peaks measured here (bfloat16, and float32 at XLA's
  default precision and at 'highest').
- correctness: the transformers-parity and sampler tests of tests/ run on this device (pytest); logits of a
  Qwen2.5-0.5B-shaped random model against transformers on the same card, float32 and bfloat16; the
  sampler's log-probs against the trainer's, float32 and bfloat16.
- sampler: tokens/s of `sampling.generate` against transformers `generate`, random Qwen2.5-0.5B- and
  1.5B-shaped models in bfloat16, 32 prompts x G=8 = 256 rows, 256 + 1024 tokens, every row to full length,
  and again with heavy-tailed lengths (an end-of-sequence set calibrated so that the median length is about
  a fifth of the cap: `eos_set_for_median`); useful tokens/s counts the tokens before each row's end.
- update: MFU of the trainer's policy-gradient update (forward, backward, AdamW) on the 1.5B shape in
  bfloat16 at sequence 1k and 4k (same tokens per update), against the datasheet peak and the measured one.
- grpo: full GRPO iterations against TRL's `GRPOTrainer` (`use_vllm=False`) on the same card, model,
  batch and lengths (benchmarks/grpo_iteration.py with --device cuda), at the 0.5B and 1.5B shapes with
  uniform and heavy-tailed lengths (`--grpo-runs` picks some); time, compile and each side's peak device memory.
- memory: peak device memory of a 1.5B GRPO step (reference pass + update) at 1k + 4k tokens, against
  benchmarks/memory_plan.py's plan for the same run (compiled for CPU, the documented method, and for
  this device).

A stage that runs past the suite's `--budget` is skipped and recorded as such. Results: one JSON file
(`--json`) and a markdown report (`--markdown`, the `gpu-suite-results` block of that file).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from gpu_report import render  # noqa: E402
STAGES = ("env", "correctness", "sampler", "update", "grpo", "memory")


def grpo_runs(sizes, common: list[str], pack_length: int) -> dict:
    """{label: grpo_iteration arguments}: each size with uniform lengths (every row to the cap) and with
    heavy-tailed ones, the latter packed as a user of such lengths would run them (train.pack_length)."""
    runs = {}
    for size in sizes:
        args = [*common, "--sequential"] if size == "1.5B" else common  # both sides at once overfill the card
        runs[f"{size} uniform"] = ["--size", size, *args]
        runs[f"{size} heavy-tailed"] = ["--size", size, *args, "--heavy-tailed", "--pack-length", str(pack_length)]
    return runs


PLANS = {
    "full": dict(parity="0.5B", parity_rows=4, parity_len=256, identity_rows=32, identity_prompt=64,
                 identity_new=128, sampler_sizes=("0.5B", "1.5B"), sampler_prompts=32, sampler_group=8,
                 sampler_prompt=256, sampler_new=1024, update_size="1.5B",
                 update_shapes=((2, 8, 256, 768), (1, 4, 1024, 3072)), update_repeats=2,
                 grpo=grpo_runs(("0.5B", "1.5B"), ["--batch", "8", "--group", "8", "--prompt-len", "128",
                                                   "--new-tokens", "256", "--warmup", "1", "--repeats", "2"], 1024),
                 memory=dict(size="1.5B", batch=8, group=8, prompt=1024, new=4096, grad_accum=8), matmul_n=8192,
                 pytest=True),
    "dry": dict(parity="toy", parity_rows=3, parity_len=12, identity_rows=4, identity_prompt=6, identity_new=8,
                sampler_sizes=("toy",), sampler_prompts=2, sampler_group=2, sampler_prompt=8, sampler_new=24,
                update_size="toy", update_shapes=((1, 2, 8, 8), (1, 2, 16, 16)), update_repeats=1,
                grpo={"toy heavy-tailed": ["--toy", "--heavy-tailed", "--pack-length", "64"]},  # one run: CI time
                memory=dict(size="toy", batch=2, group=2, prompt=8, new=16, grad_accum=2),
                matmul_n=256, pytest=False),
}


# -------------------------------------------------------------------------------------------- driver
def run_stage_here(name: str, plan: str, budget: float, result: str, sampler_sizes: str = "",
                   grpo_runs: str = "") -> None:
    """One stage in this process; its result (or its error) is written to `result` as JSON. A stage of
    several runs (grpo) also writes what it has after each run, so that a stop at the budget keeps them."""
    import traceback
    sys.path.insert(0, HERE)
    p = dict(PLANS[plan])
    if sampler_sizes:
        p["sampler_sizes"] = tuple(sampler_sizes.split(","))
    if grpo_runs:  # checked by parse_args
        p["grpo"] = {k: p["grpo"][k] for k in grpo_runs.split(",")}
    t0 = time.perf_counter()

    def save(out: dict) -> None:
        with open(result, "w") as f:
            json.dump({**out, "seconds": time.perf_counter() - t0}, f, indent=1, default=float)

    import gpu_stages as st
    fns = {"env": lambda: st.stage_env(p), "correctness": lambda: st.stage_correctness(p, budget),
           "sampler": lambda: st.stage_sampler(p), "update": lambda: st.stage_update(p),
           "grpo": lambda: st.stage_grpo(p, lambda runs: save({"status": "ok", **runs})), "memory": lambda: st.stage_memory(p)}
    try:
        out = {"status": "ok", **fns[name]()}
    except Exception as e:  # recorded, and the suite goes on with the next stage
        out = {"status": "error", "error": " ".join(f"{type(e).__name__}: {e}".split())[:2000],
               "traceback": traceback.format_exc()[-4000:]}
    save(out)


# Device memory XLA may take: the stages that share the card with torch leave it room.
MEM_FRACTION = {"correctness": "0.45", "sampler": "0.45", "grpo": "0.45"}


def run_suite(stages, plan: str, budget: float, sampler_sizes: str = "", grpo_runs: str = "") -> dict:
    results = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "plan": plan, "stages": {}}
    start = time.perf_counter()
    for name in stages:
        left = budget - (time.perf_counter() - start)
        if left < 20:
            results["stages"][name] = {"status": f"skipped: the suite's {budget:.0f} s budget was spent"}
            continue
        print(f"\n===== {name} ({left:.0f} s left)", flush=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = MEM_FRACTION.get(name, "0.9")
        if name == "grpo":  # the stage's process and our trainer's worker both use the card: no preallocation
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        env["PYTHONPATH"] = os.pathsep.join(x for x in (ROOT, env.get("PYTHONPATH", "")) if x)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "result.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--stage", name, "--plan", plan, "--budget",
                   str(left), "--result", path, "--sampler-sizes", sampler_sizes, "--grpo-runs", grpo_runs]
            try:
                proc = subprocess.run(cmd, env=env, cwd=HERE, timeout=left)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = None
            if os.path.exists(path):
                with open(path) as f:
                    results["stages"][name] = json.load(f)
                if code is None:  # the runs it finished before the budget ran out
                    results["stages"][name]["stopped"] = f"at the suite's budget ({left:.0f} s were left when it started)"
            elif code is None:
                results["stages"][name] = {"status": "timed out", "error": f"stopped when the suite's budget ran out "
                                                                             f"({left:.0f} s were left when it started)"}
            else:
                results["stages"][name] = {"status": "crashed", "error": f"the stage's process ended with code {code} "
                                                                           "before writing its result"}
        print(f"===== {name}: {results['stages'][name]['status']}", flush=True)
    results["seconds"] = time.perf_counter() - start
    return results


def merge_results(parts: list[dict]) -> dict:
    """Several runs' results as one: stages merge, later runs winning; two successful runs of one stage
    (the sampler at 0.5B in one call and 1.5B in another) keep the keys of both, and the grpo stage's runs
    merge by label (a rerun of one label replaces that label alone)."""
    results = {"stages": {}}
    for part in parts:
        part = dict(part)
        stages = dict(results["stages"])
        for name, stage in part.pop("stages").items():
            both_ok = stage.get("status") == "ok" and stages.get(name, {}).get("status") == "ok"
            if both_ok and "runs" in stage and "runs" in stages[name]:
                stage = {**stage, "runs": {**stages[name]["runs"], **stage["runs"]}}
            stages[name] = {**stages[name], **stage} if both_ok else stage
        seconds = results.get("seconds", 0) + part.get("seconds", 0)
        results.update(part, stages=stages, seconds=seconds)
    return results


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on any device, every stage (seconds)")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    ap.add_argument("--budget", type=float, default=570.0, help="seconds for the whole suite")
    ap.add_argument("--json", default="", help="write the results to this JSON file")
    ap.add_argument("--markdown", default="", help="markdown file whose gpu-suite-results block is written")
    ap.add_argument("--render", default="", help="only render these results JSON files (comma-separated) into --markdown")
    ap.add_argument("--sampler-sizes", default="", help="comma-separated, of 0.5B, 1.5B, toy: the sampler "
                    "stage's models instead of the plan's")
    ap.add_argument("--grpo-runs", default="", help="comma-separated labels of the grpo stage's runs (e.g. "
                    "'0.5B uniform,1.5B heavy-tailed') instead of all of the plan's")
    ap.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    ap.add_argument("--plan", choices=list(PLANS), default="full", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.stage_list = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(args.stage_list) - set(STAGES))
    if unknown:
        ap.error(f"--stages: unknown {unknown}; expected some of {', '.join(STAGES)}")
    if args.budget <= 0:
        ap.error(f"--budget must be > 0 seconds, got {args.budget}")
    runs = PLANS[args.plan if args.stage else "dry" if args.dry_run else "full"]["grpo"]
    unknown = sorted(set(filter(None, args.grpo_runs.split(","))) - set(runs))
    if unknown:
        ap.error(f"--grpo-runs: unknown {unknown}; expected some of {', '.join(runs)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    sys.path.insert(0, HERE)
    if args.stage:
        return run_stage_here(args.stage, args.plan, args.budget, args.result, args.sampler_sizes, args.grpo_runs)
    if args.render:
        parts = []
        for path in args.render.split(","):
            with open(path) as f:
                parts.append(json.load(f))
        results = merge_results(parts)
    else:
        results = run_suite(args.stage_list, "dry" if args.dry_run else "full", args.budget, args.sampler_sizes,
                            args.grpo_runs)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1, default=float)
    text = render(results)
    print("\n" + text)
    if args.markdown:
        from harness.report import update_markdown
        update_markdown(args.markdown, "gpu-suite-results", text)
    return results


if __name__ == "__main__":
    main()
