"""Compile time of the first training iteration against depth: 4, 8, 16 and 32 layers at one small width.

    python benchmarks/compile_time.py                            # 4, 8, 16, 32 layers, a fresh process each
    python benchmarks/compile_time.py --out docs/benchmarks.md   # also refresh the compile-time block there
    python benchmarks/compile_time.py --toy                      # seconds: keeps the script from rotting

What is measured. For each depth a GRPO `Trainer` is built on a random Qwen2 checkpoint of that depth
(benchmarks/mfu.py `build_trainer`), then every jitted function of one iteration is lowered and compiled
ahead of time on the arguments `Trainer.train_step` passes it, in pipeline order: the sampler
(`sampling.generate_program`, the program `generate` runs), `fns.score` (reference log-probs), `fns.prepare`
and `fns.update` (forward, backward, AdamW). Each is reported as trace + lower seconds and XLA compile
seconds. Then the caches are cleared (`jax.clear_caches()`) and `train_step` runs three times: the first
step's extra wall time over the median of the next two is the end-to-end compile cost of the first
iteration.

The decoder's multi-token passes (score, update) scan over the stacked layers (`nn.scan`), so their
programs do not grow with depth. The sampler's decode step unrolls the layer loop up to
`jaxrl_llm.models.lm.DECODE_UNROLL_MAX_LAYERS` (8) layers and scans beyond (at this model's layer size: on CPU,
layers averaging 8 MiB or more unroll at any depth): its compile time grows with depth up to 8 layers and is flat
after; the table says which form each depth got.

Isolation. Each depth runs in a fresh subprocess (no jit, trace or lowering cache carries over) with the
persistent compilation cache disabled. `--toy` runs the depths in this process instead, clearing jax's
caches between them, and skips the first-step measurement (it compiles everything a second time): the
update alone takes ~10 s of CPU to compile even at toy size.
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
sys.path.insert(0, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from harness.report import machine_description, markdown_table, update_markdown  # noqa: E402
from harness.shapes import ModelSize  # noqa: E402

FUNCTIONS = ("generate", "score", "prepare", "update")
TARGET = 1.3  # issue 9: deepest / shallowest compile time


def measure_depth(layers: int, args) -> dict:
    """Trace + lower and compile seconds of each jitted function of one iteration at `layers` layers, and
    the first `train_step`'s extra wall time. Returns {'layers', 'decode', 'functions': {name: {'lower',
    'compile'}}, 'first_step_extra', 'steady_step'}."""
    from harness.grpo import build_trainer, close_trainer, device_batch

    from jaxrl_llm import sampling, sharding
    from jaxrl_llm.models.lm import decode_unrolled
    size = ModelSize(f"{layers} layers", vocab_size=args.vocab, hidden_size=args.hidden,
                     intermediate_size=4 * args.hidden, num_layers=layers, num_heads=args.heads,
                     num_kv_heads=args.kv_heads)
    with tempfile.TemporaryDirectory(prefix="compile-bench-") as ws:
        trainer = build_trainer(ws, size, batch=args.batch, group=args.group, prompt_len=args.prompt_len,
                                new_tokens=args.new_tokens)
        c, mc, fns, state = trainer.c, trainer.mc, trainer.fns, trainer.state
        times: dict[str, dict[str, float]] = {}

        def aot(name, jitted, *a, **kw):
            t0 = time.perf_counter()
            lowered = jitted.lower(*a, **kw)
            t1 = time.perf_counter()
            compiled = lowered.compile()
            times[name] = {"lower": t1 - t0, "compile": time.perf_counter() - t1}
            return compiled

        b = device_batch(trainer)
        ref = state.ref_params if state.ref_params is not None else trainer.frozen_ref
        with sharding.use_mesh(trainer.mesh):
            # What `generate` (called by `Rollouts.sample_round`) hands its jitted program.
            aot("generate", sampling.generate_program, mc, state.params, b["prompt_tokens"], b["prompt_mask"],
                jax.random.PRNGKey(0), jnp.float32(max(c.rollout.temperature, 1e-6)), jnp.float32(c.rollout.top_p),
                max_new_tokens=c.rollout.max_new_tokens, num_samples=c.rollout.group_size,
                top_k=c.rollout.top_k, greedy=c.rollout.temperature == 0, nucleus=c.rollout.top_p < 1.0,
                eos_ids=trainer.eos_ids, pad_id=trainer.pad_id)
            # Each later function needs the previous one's outputs: run the compiled programs.
            b.update(aot("score", fns.score, state, ref, b)(state, ref, b))
            b.setdefault("old_logp", b["behavior_logp"])
            b.update(aot("prepare", fns.prepare, b, state.kl.value)(b, state.kl.value)[0])
            aot("update", fns.update, state, b, jnp.arange(c.rollout.batch_prompts))

        first_extra = steady = float("nan")
        if args.first_step:
            jax.clear_caches()  # the AOT programs above must not serve the first step
            walls = []
            for _ in range(3):
                t0 = time.perf_counter()
                state, metrics, _ = trainer.train_step(state)
                jax.block_until_ready(state.params)
                walls.append(time.perf_counter() - t0)
            steady = statistics.median(walls[1:])
            first_extra = walls[0] - steady
        close_trainer(trainer)
    return {"layers": layers, "decode": "unrolled" if decode_unrolled(mc) else "scan", "functions": times,
            "first_step_extra": first_extra, "steady_step": steady}


def run_worker(layers: int, args) -> dict:
    """`measure_depth` in a fresh Python process (its result comes back as one JSON line)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(layers), *args.passthrough]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("@@ ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"worker for {layers} layers failed (code {proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(lines[-1][3:])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="4,8,16,32", help="comma-separated depths")
    p.add_argument("--hidden", type=int, default=64, help="width (intermediate 4x, head dim hidden/heads)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--batch", type=int, default=2, help="prompts per iteration")
    p.add_argument("--group", type=int, default=4, help="completions per prompt (G)")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--no-first-step", dest="first_step", action="store_false",
                   help="skip the end-to-end first train_step measurement")
    p.add_argument("--in-process", action="store_true",
                   help="run the depths in this process, clearing jax's caches between them (default: a "
                        "fresh subprocess per depth)")
    p.add_argument("--toy", action="store_true",
                   help="depths 1 and 2, tiny shapes, in this process, no first step (smoke test)")
    p.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help="markdown file whose compile-time-results block is rewritten")
    args = p.parse_args(argv)
    if args.toy:
        args.layers, args.hidden, args.vocab, args.heads, args.kv_heads = "1,2", 16, 64, 2, 1
        args.batch, args.group, args.prompt_len, args.new_tokens = 1, 2, 2, 2
        args.in_process, args.first_step = True, False
    args.layer_list = [int(x) for x in args.layers.split(",") if x.strip()]
    for name in ("hidden", "heads", "kv_heads", "vocab", "batch", "group", "prompt_len", "new_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if len(args.layer_list) < 2 or min(args.layer_list) < 1:
        raise ValueError(f"--layers must name at least two depths >= 1, got {args.layers!r}")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        raise ValueError(f"--hidden must be divisible by --heads and --heads by --kv-heads, got "
                         f"{args.hidden}, {args.heads}, {args.kv_heads}")
    if args.group < 2:
        raise ValueError(f"--group must be >= 2 (GRPO normalizes within a group), got {args.group}")
    args.passthrough = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                        ("hidden", "heads", "kv_heads", "vocab", "batch", "group", "prompt_len", "new_tokens")]
    if not args.first_step:
        args.passthrough.append("--no-first-step")
    return args


def main(argv=None):
    args = parse_args(argv)
    # A compile-time benchmark must compile: never read programs back from an on-disk cache.
    jax.config.update("jax_enable_compilation_cache", False)
    if args.worker:
        print("@@ " + json.dumps(measure_depth(args.worker, args)), flush=True)
        return 0
    log = lambda *a: print(*a, flush=True)
    results = []
    for layers in args.layer_list:
        t0 = time.perf_counter()
        if args.in_process:
            r = measure_depth(layers, args)
            jax.clear_caches()
        else:
            r = run_worker(layers, args)
        results.append(r)
        total = sum(sum(v.values()) for v in r["functions"].values())
        log(f"{layers} layers: compile {total:.1f} s in all ({time.perf_counter() - t0:.0f} s with setup)")

    def seconds(r, fn=None):
        fns = [fn] if fn else FUNCTIONS
        return sum(r["functions"][f]["lower"] + r["functions"][f]["compile"] for f in fns)

    headers = ["layers", "decode step"] + [f"{f} s (lower + compile)" for f in FUNCTIONS] + [
        "total s", "first step extra s", "steady step s"]
    rows = []
    for r in results:
        rows.append([r["layers"], r["decode"]]
                    + [f"{r['functions'][f]['lower']:.2f} + {r['functions'][f]['compile']:.2f}" for f in FUNCTIONS]
                    + [seconds(r), r["first_step_extra"], r["steady_step"]])
    table = markdown_table(headers, rows)
    lo, hi = results[0], results[-1]
    name = f"{hi['layers']}/{lo['layers']} layers"
    lines = [f"{name} compile ratio {seconds(hi) / seconds(lo):.2f}x (target <= {TARGET}x), total of "
             f"{', '.join(FUNCTIONS)}"]
    lines += [f"{name} {f}: {seconds(hi, f) / seconds(lo, f):.2f}x" for f in FUNCTIONS]
    lines.append(f"{name} without generate: "
                 f"{(seconds(hi) - seconds(hi, 'generate')) / (seconds(lo) - seconds(lo, 'generate')):.2f}x")
    if args.first_step:
        lines.append(f"{name} first-iteration overhead (first train_step minus a steady one): "
                     f"{hi['first_step_extra'] / lo['first_step_extra']:.2f}x")
    from jaxrl_llm.models.lm import DECODE_UNROLL_MAX_LAYERS
    lines.append(f"the sampler's decode step unrolls its layers up to {DECODE_UNROLL_MAX_LAYERS} layers and "
                 "scans beyond at these layer sizes (on CPU, layers averaging 8 MiB or more unroll at any depth: "
                 "jaxrl_llm/models/lm.py decode_unrolled); score and update scan at every depth")
    log(f"\n{machine_description()}\n\n{table}\n")
    for line in lines:
        log(line)
    if args.out:
        body = (f"Measured on {machine_description()}.\n\nWidth {args.hidden} (intermediate {4 * args.hidden}, "
                f"{args.heads} heads, {args.kv_heads} KV heads, vocabulary {args.vocab}), {args.batch} prompts x "
                f"G={args.group}, {args.prompt_len} prompt + {args.new_tokens} new tokens, float32; "
                f"{'one process, caches cleared between depths' if args.in_process else 'a fresh process per depth'}, "
                f"persistent compilation cache off.\n\n{table}\n\n" + "\n".join(f"- {line}" for line in lines))
        update_markdown(args.out, "compile-time-results", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
