"""The update step under each `model.remat`, side by side at one shape: time, CPU and peak memory.

    python benchmarks/remat_update.py                 # SmolLM2-135M's shape, 4 prompts x 4, 32 + 48 tokens
    python benchmarks/remat_update.py --toy           # seconds: keeps the script from rotting

Each mode runs in its own subprocess (so that each peak resident set is its own), on the same random
checkpoint (`harness.grpo.build_trainer`: the GRPO preset, full fine-tuning, float32): the trainer's jitted
update (forward, backward, AdamW) compiled ahead of time on the batch `harness.grpo.update_batch` builds
(every completion T tokens long), one warm-up call, then `--repeats` timed calls. Reported per mode: the
median wall and CPU (user + system) seconds of a call, the resident set before the update, its peak
during the timed calls (VmHWM, reset after the warm-up: it starts from what compilation left resident)
and over the whole process (setup, compilation, all calls: what a run's peak is), and XLA's temporaries
of the compiled update.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness.memory import GIB, reset_peak, rss_gib  # noqa: E402
MODES = ("none", "dots", "full")


def measure(workspace: str, args) -> dict:
    """One mode, in this process: the numbers of the module docstring."""
    import jax
    import jax.numpy as jnp

    from harness.grpo import build_trainer, update_batch
    from harness.shapes import SIZES
    from jaxrl_llm import sharding
    tr = build_trainer(workspace, SIZES[args.size], batch=args.batch, group=args.group, prompt_len=args.prompt_len,
                       new_tokens=args.new_tokens, remat=args.remat, run=f"run-{args.remat}")
    b = update_batch(tr, tr.state)
    pidx = jnp.arange(args.batch)
    state, rest = tr.state, rss_gib()[0]
    with sharding.use_mesh(tr.mesh):
        t0 = time.perf_counter()
        compiled = tr.fns.update.lower(state, b, pidx).compile()
        compile_s = time.perf_counter() - t0
        state, m = compiled(state, b, pidx)  # warm-up
        jax.block_until_ready(m)
        run_peak = rss_gib()[1]  # the process so far: setup, compilation, the first update
        reset_peak()
        walls, cpus = [], []
        for _ in range(args.repeats):
            w0, c0 = time.perf_counter(), os.times()
            state, m = compiled(state, b, pidx)
            jax.block_until_ready(m)
            c1 = os.times()
            walls.append(time.perf_counter() - w0)
            cpus.append(c1.user + c1.system - c0.user - c0.system)
    temps = compiled.memory_analysis().temp_size_in_bytes / GIB
    med = lambda xs: sorted(xs)[len(xs) // 2]
    return {"remat": args.remat, "wall_s": med(walls), "cpu_s": med(cpus), "rest_gib": rest,
            "peak_gib": rss_gib()[1], "run_peak_gib": max(run_peak, rss_gib()[1]), "temp_gib": temps,
            "compile_s": compile_s, "grad_norm": float(m["policy/grad_norm"]), "logits_chunk": tr.mc.logits_chunk}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="135M", help="a harness/shapes.py size")
    p.add_argument("--toy", action="store_true", help="toy model, 1 timed call (smoke test)")
    p.add_argument("--batch", type=int, default=4, help="prompts per update (B)")
    p.add_argument("--group", type=int, default=4, help="completions per prompt (G)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2, help="timed calls per mode")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated model.remat values")
    p.add_argument("--remat", default="", help=argparse.SUPPRESS)  # set: measure this mode here (a child)
    p.add_argument("--workspace", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.toy:
        args.size, args.batch, args.group, args.prompt_len, args.new_tokens, args.repeats = "toy", 2, 2, 4, 6, 1
    if args.remat:
        print("RESULT " + json.dumps(measure(args.workspace, args)), flush=True)
        return
    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="remat-bench-") as ws:
        for mode in args.modes.split(","):
            cmd = [sys.executable, os.path.abspath(__file__), "--remat", mode, "--workspace", ws, "--size", args.size,
                   "--batch", str(args.batch), "--group", str(args.group), "--prompt-len", str(args.prompt_len),
                   "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode or not lines:
                raise RuntimeError(f"remat={mode} failed:\n{out.stderr[-3000:]}")
            rows.append(json.loads(lines[-1][len("RESULT "):]))
            print(f"remat={mode}: done", flush=True)
    print(f"\n{args.size}, {args.batch} prompts x G={args.group}, {args.prompt_len} + {args.new_tokens} tokens, "
          f"float32, logits_chunk {rows[0]['logits_chunk']}, {args.repeats} timed updates per mode; "
          f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}\n")
    print("| model.remat | update wall s | update CPU s | RSS before GiB | peak RSS, timed updates GiB | peak RSS, "
          "whole process GiB | XLA temporaries GiB | compile s |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['remat']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['rest_gib']:.2f} | {r['peak_gib']:.2f} "
              f"| {r['run_peak_gib']:.2f} | {r['temp_gib']:.2f} | {r['compile_s']:.1f} |")
    norms = {r["remat"]: r["grad_norm"] for r in rows}
    print(f"\ngradient norms of the timed update (equal across modes up to float noise): {norms}")


if __name__ == "__main__":
    main()
