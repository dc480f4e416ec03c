"""How long the first step takes from the command line, cold and with the compilation cache it keeps.

    python benchmarks/first_step.py                  # SmolLM2-135M's shape, 4 prompts x 4, 32 + 48 tokens
    python benchmarks/first_step.py --size 0.5B      # Qwen2.5-0.5B's shape
    python benchmarks/first_step.py --toy            # seconds: keeps the script from rotting

`python -m jaxrl_llm.train` runs the GRPO iteration of benchmarks/grpo_iteration.py (random weights of the
shape, the same prompts, reward and settings as against TRL) for `--steps` steps, three times, each in a
new workdir and a new process: with `--config.compilation_cache.dir=` (off: everything compiles), then twice
with the cache in a new directory (the first run fills it, the second reads it: a rerun, a resume or
another run at the same shapes). Reported per run: the first step's and the median later step's
`perf/step_s` from metrics.jsonl, the process's wall time, and the files in the cache. XLA's default flags,
JAX's default cache threshold (programs compiling in under a second are not kept).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from harness.report import load_average, machine_description, markdown_table, save_json  # noqa: E402

CONFIG_FILE = '''import json, os
from jaxrl_llm.config import from_dict
def get_config():
    return from_dict(json.load(open(os.path.join(os.path.dirname(__file__), "config.json"))))
'''


def run_cli(workspace: str, name: str, cache: str, steps: int) -> dict:
    """One `python -m jaxrl_llm.train` of the workspace's config in workdir `name`: its step times."""
    workdir = os.path.join(workspace, name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["PYTHONPATH"] = os.pathsep.join(x for x in (ROOT, HERE, env.get("PYTHONPATH", "")) if x)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "jaxrl_llm.train", f"--config={workspace}/config_file.py",
                           f"--workdir={workdir}", f"--config.total_steps={steps}",
                           f"--config.compilation_cache.dir={cache}"], capture_output=True, text=True, env=env,
                          cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{name}: the run failed: {proc.stderr[-3000:]}")
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps_s = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
    files = sum(len(fs) for _, _, fs in os.walk(cache)) if cache else 0
    return {"first_step_s": steps_s[0], "later_step_s": statistics.median(steps_s[1:]) if steps_s[1:] else None,
            "wall_s": wall, "cache_files": files}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--toy", action="store_true")
    p.add_argument("--size", default="135M", help="135M, 0.5B or 1.5B (random weights of that shape)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json", default="", help="also write the results here")
    args = p.parse_args(argv)
    if args.toy:
        args.size, args.prompt_len, args.new_tokens, args.steps = "gpu-toy", 4, 4, 2

    from harness.grpo import make_workspace, ours_config
    from harness.shapes import SIZES
    size = SIZES[args.size]
    with tempfile.TemporaryDirectory() as ws:
        make_workspace(ws, size, num_prompts=4 * args.batch, prompt_len=args.prompt_len,
                       max_positions=args.prompt_len + args.new_tokens, torch_side=False)
        c = ours_config(ws, args)
        with open(os.path.join(ws, "config.json"), "w") as f:
            json.dump(c.to_dict(), f)
        with open(os.path.join(ws, "config_file.py"), "w") as f:
            f.write(CONFIG_FILE)
        cache = os.path.join(ws, "cache")
        runs = {"no cache": run_cli(ws, "off", "", args.steps),
                "cache, first run (fills it)": run_cli(ws, "fill", cache, args.steps),
                "cache, second run (reads it)": run_cli(ws, "read", cache, args.steps)}
    print(machine_description())
    print(f"first step from the command line, {args.size} shape, {args.batch} prompts x {args.group}, "
          f"{args.prompt_len} + {args.new_tokens} tokens")
    print(markdown_table(["run", "first step s", "later step s (median)", "process wall s", "cache files"],
                         [[k, f"{r['first_step_s']:.1f}", "" if r["later_step_s"] is None else f"{r['later_step_s']:.1f}",
                           f"{r['wall_s']:.1f}", r["cache_files"]] for k, r in runs.items()]))
    cold, warm = runs["no cache"]["first_step_s"], runs["cache, second run (reads it)"]["first_step_s"]
    print(f"first step with the cache warm: {warm:.1f} s against {cold:.1f} s cold ({cold / warm:.2f}x)")
    if args.json:
        save_json(args.json, {"size": args.size, "args": vars(args), "runs": runs, "load": load_average()})
    return runs


if __name__ == "__main__":
    main()
