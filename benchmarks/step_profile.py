"""Where the time and the bytes of one GRPO step go at a real model's shape, on this machine.

    python benchmarks/step_profile.py                      # SmolLM2-135M's shape, 4 prompts x 4, 32 + 48 tokens
    python benchmarks/step_profile.py --toy                # seconds: keeps the script from rotting

The model is random, with the shape of SmolLM2-135M (Llama: hidden 576, 30 layers, 9 heads / 3 KV heads,
intermediate 1536, vocabulary 49,152, tied embeddings), float32, saved by transformers and trained by
jaxrl_llm's Trainer as benchmarks/grpo_iteration.py sets it up (same reward, beta, lr). One warm-up step
(compilation) then `--repeats` steps, each split into its stages, each synchronized: the sampler's prefill
alone and the whole generation (decode = generation - prefill), the rewards, the reference pass, the update.
Each stage's CPU seconds are split into user and system, beside its minor page faults (memory faulted in).

Bytes: the process's resident set (VmRSS) before each stage and its peak during it (VmHWM, reset before
each stage through /proc/self/clear_refs), and XLA's `memory_analysis()` of each compiled program
(arguments, outputs, temporaries, aliased bytes), beside the parameter bytes.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness.memory import GIB, reset_peak, rss_gib as rss  # noqa: E402


def mem_line(name: str, compiled) -> str:
    m = compiled.memory_analysis()
    return (f"| {name} | {m.argument_size_in_bytes / GIB:.3f} | {m.output_size_in_bytes / GIB:.3f} | "
            f"{m.alias_size_in_bytes / GIB:.3f} | {m.temp_size_in_bytes / GIB:.3f} |")


class Stepper:
    """The Trainer with its state: `step()` is one `train_step`."""

    def __init__(self, trainer):
        self.trainer, self.state = trainer, trainer.state

    def step(self):
        self.state, _, _ = self.trainer.train_step(self.state)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--toy", action="store_true")
    p.add_argument("--size", default="135M", help="model shape (harness/shapes.py: 135M, 0.5B, 1.5B)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--decode-slots", type=int, default=0)
    p.add_argument("--pack-length", type=int, default=0)
    p.add_argument("--remat", default="none", help="model.remat")
    p.add_argument("--logits-chunk", type=int, default=0, help="model.logits_chunk (0: the default)")
    args = p.parse_args(argv)
    if args.toy:
        args.prompt_len, args.new_tokens, args.repeats = 4, 4, 1

    from harness.grpo import make_workspace, ours_config
    from harness.shapes import SIZES
    size = SIZES["gpu-toy" if args.toy else args.size]
    import jax
    import numpy as np
    # memory_analysis() below compiles the programs again: from the persistent cache, not from scratch
    jax.config.update("jax_compilation_cache_dir", os.path.join(tempfile.gettempdir(), "step-profile-jax-cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

    from jaxrl_llm.sampling import generate_program
    log = lambda *a: print(*a, flush=True)
    stages: dict[str, list[float]] = {}
    peaks: dict[str, list[float]] = {}
    cpus: dict[str, list[tuple[float, float, int]]] = {}

    def cpu() -> tuple[float, float, int]:
        """(user CPU s, system CPU s, minor page faults) of this process so far: the system time of a stage is
        mostly the kernel faulting in (and zeroing) memory that malloc mapped afresh (docs/benchmarks.md,
        "Page faults between programs")."""
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime, r.ru_stime, r.ru_minflt

    def timed(name, fn):
        reset_peak()
        t0, c0 = time.perf_counter(), cpu()
        out = jax.block_until_ready(fn())
        stages.setdefault(name, []).append(time.perf_counter() - t0)
        cpus.setdefault(name, []).append(tuple(b - a for a, b in zip(c0, cpu())))
        peaks.setdefault(name, []).append(rss()[1])
        return out

    with tempfile.TemporaryDirectory(prefix="step-profile-") as ws:
        make_workspace(ws, size, num_prompts=64, prompt_len=args.prompt_len,
                       max_positions=args.prompt_len + args.new_tokens, torch_side=True)
        log(f"after the workspace (torch model built and freed): RSS {rss()[0]:.2f} GiB")
        reset_peak()
        t0 = time.perf_counter()
        from jaxrl_llm.trainer import Trainer
        c = ours_config(ws, args)
        c.model.remat = args.remat
        c.model.logits_chunk = args.logits_chunk or c.model.logits_chunk
        ours = Stepper(Trainer(c, os.path.join(ws, "ours-run")))
        t = ours.trainer
        mc = t.mc
        pbytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(ours.state.params))
        log(f"setup {time.perf_counter() - t0:.1f} s; {mc.num_params() / 1e6:.1f}M params = {pbytes / GIB:.3f} GiB; "
            f"RSS {rss()[0]:.2f} GiB (peak {rss()[1]:.2f}); ref copy: {t.frozen_ref is not None or ours.state.ref_params is not None}")
        reset_peak()
        t0 = time.perf_counter()
        ours.step()
        log(f"first step (compiles) {time.perf_counter() - t0:.1f} s, peak RSS {rss()[1]:.2f} GiB")
        state = ours.state
        from jaxrl_llm import sharding
        mesh = sharding.use_mesh(t.mesh)
        mesh.__enter__()  # as train_step calls them (same arguments: no recompilation)
        for i in range(args.repeats):
            key = jax.random.fold_in(state.rng, 100 + i)
            local, _, _ = timed("generate + rewards", lambda: t.rollouts.collect(state.params, key))
            b = timed("to device", lambda: t.rollouts.device_batch(local))
            ref = state.ref_params if state.ref_params is not None else t.frozen_ref
            b.update(timed("reference pass (score)", lambda: t.fns.score(state, ref, b, None, t.base)))
            b.setdefault("old_logp", b["behavior_logp"])
            b.update(timed("advantages", lambda: t.fns.prepare(b, state.kl.value))[0])
            pidx = jax.random.permutation(key, t.c.rollout.batch_prompts)
            state, _ = timed("update (fwd + bwd + AdamW)", lambda: t.fns.update(state, b, pidx, None, t.base))
        ours.state = state
        # The sampler alone, on the same prompts: prefill = a 1-token generation.
        prompts, pmask = np.asarray(b["prompt_tokens"]), np.asarray(b["prompt_mask"])
        gen = lambda n: generate_program(mc, state.params, prompts, pmask, key, np.float32(1.0), np.float32(1.0),
                                         np.float32(1.0), np.float32(0.0), max_new_tokens=n,
                                         num_samples=args.group, top_k=0, greedy=False, nucleus=False,
                                         eos_ids=(1,), pad_id=0, penalize=False, use_min_p=False)
        for n in (1, args.new_tokens):
            gen(n)
            for _ in range(args.repeats):
                timed(f"sampler {n} token{'s' * (n > 1)}", lambda: gen(n))
        log(f"load average {os.getloadavg()[0]:.2f}")
        log("\n| stage | seconds (median) | CPU seconds, user + system | minor page faults | peak RSS GiB |\n"
            "|---|---|---|---|---|")
        for k, v in stages.items():
            user, system, faults = (statistics.median(x) for x in zip(*cpus[k]))
            log(f"| {k} | {statistics.median(v):.3f} | {user:.3f} + {system:.3f} | {faults:,.0f} | {max(peaks[k]):.2f} |")
        s1, sT = statistics.median(stages["sampler 1 token"]), statistics.median(stages[f"sampler {args.new_tokens} tokens"])
        log(f"decode: {(sT - s1) / (args.new_tokens - 1) * 1e3:.1f} ms/token step ({args.batch * args.group} rows)")
        log("\n| program | arguments GiB | outputs GiB | aliased GiB | temporaries GiB |\n|---|---|---|---|---|")
        log(mem_line("score", t.fns.score.lower(state, ref, b, None, t.base).compile()))
        log(mem_line("update", t.fns.update.lower(state, b, pidx, None, t.base).compile()))
        log(mem_line(f"sampler ({args.new_tokens} tokens)", generate_program.lower(
            mc, state.params, prompts, pmask, key, np.float32(1.0), np.float32(1.0), np.float32(1.0), np.float32(0.0),
            max_new_tokens=args.new_tokens, num_samples=args.group, top_k=0, greedy=False, nucleus=False,
            eos_ids=(1,), pad_id=0, penalize=False, use_min_p=False).compile()))


if __name__ == "__main__":
    main()
