"""GRPO iteration vs TRL: one full iteration -- generate, reward, reference log-probs, one update -- of
jaxrl_llm against TRL's `GRPOTrainer` (and Tunix when it installs), same checkpoint, tokenizer, batch and
reward, side by side; prints the ratio, each side's first iteration (compile) and peak RSS.

    python benchmarks/grpo_iteration.py                            # 3M Qwen2, 8 prompts x G=8, 32 + 64 tokens
    python benchmarks/grpo_iteration.py --size 135M --batch 4 --group 4 --new-tokens 48 --frameworks ours,trl
    python benchmarks/grpo_iteration.py --size 135M ... --heavy-tailed   # heavy-tailed completion lengths
    python benchmarks/grpo_iteration.py --out docs/benchmarks.md   # also refresh the results block there
    python benchmarks/grpo_iteration.py --toy --frameworks ours    # seconds: keeps the script from rotting

Processes. Every framework runs in a subprocess of its own (`harness/worker.py`), stepping one iteration
per 'go' from this process, so each side's peak RSS is its own. jaxrl_llm uses this virtualenv; TRL uses
`benchmarks/.venv/trl` (created on first use: `torch==2.13.0`, the CPU build, then `trl==1.16.0`) or
`--trl-python`; Tunix (`google-tunix`) `benchmarks/.venv/tunix`, its own `GRPOLearner` with the vanilla
rollout on its own Qwen2 model from the same safetensors; the script reports why when it cannot run.

What is compared. The checkpoint is a random model of `--size` (harness/shapes.py: toy, 3M, 30M, and the
real shapes 135M = SmolLM2-135M, 0.5B = Qwen2.5-0.5B, 1.5B = Qwen2.5-1.5B) saved by transformers, with a
word-level tokenizer of the same vocabulary; prompts are `--prompt-len` random words = tokens. Both sides:
B prompts x G completions, temperature 1, no top-k/top-p, exactly T new tokens (TRL: `min_new_tokens`;
ours: fixed shapes), GRPO loss (seq-mean-token-mean) with beta = 0.04 (both run a reference forward), one
AdamW step per iteration, the same reward (`harness.grpo.even_words`) on decoded text, no gradient
checkpointing. TRL: `use_vllm=False`, transformers `generate`; torch with OMP_WAIT_POLICY=PASSIVE and
`--trl-threads` threads (default: one per core, as XLA).

Heavy-tailed lengths (`--heavy-tailed`): a row ends at the first of a set of stop ids (generation_config's
`eos_token_id` list, read by both TRL and jaxrl_llm) calibrated so that lengths are geometric with median
`--median` x T, cut at T. Both sides draw from the same distribution; the lengths of both are reported.
`--decode-slots` sets our `rollout.decode_slots`, `--decode-shrink` our `rollout.decode_shrink`, `--pack-length` our
`train.pack_length`.

Timing. Iterations alternate (ours, TRL, ours, TRL, ...), so the load of a shared machine hits them alike;
the first `--warmup` iterations (compilation, torch's lazy init) are reported separately, then the median
of `--repeats`. FLOPs (`harness.flops.iteration_flops`) over the matmul peak measured in the same run give
the roofline. The load average is printed before and after: on a shared machine it qualifies every ratio.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import grpo, peers  # noqa: E402
from harness.flops import iteration_flops  # noqa: E402
from harness.report import machine_description, markdown_table, save_json, update_markdown  # noqa: E402
from harness.shapes import SIZES, size_of  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=list(SIZES), default="3M", help="model shape (harness/shapes.py)")
    p.add_argument("--toy", action="store_true", help="toy model and batch, 1 timed iteration (smoke test)")
    p.add_argument("--frameworks", default="ours,trl,tunix", help="comma-separated: ours, trl, tunix")
    p.add_argument("--trl-threads", default=str(os.cpu_count()), help="torch thread counts to run TRL with (CPU)")
    p.add_argument("--trl-python", default="", help="run TRL with this interpreter instead of benchmarks/.venv/trl")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="TRL's device (ours: JAX's default)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="compute dtype of both (TRL: bf16 autocast over float32 weights, ours: model.compute_dtype)")
    p.add_argument("--batch", type=int, default=8, help="prompts per iteration")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--heavy-tailed", action="store_true", help="heavy-tailed completion lengths (see above)")
    p.add_argument("--median", type=float, default=0.2, help="--heavy-tailed: median length / --new-tokens")
    p.add_argument("--decode-slots", type=int, default=0, help="our rollout.decode_slots (0 = all rows)")
    p.add_argument("--decode-shrink", type=int, default=0, help="our rollout.decode_shrink (0 = off)")
    p.add_argument("--pack-length", type=int, default=0,
                   help="our train.pack_length (0 = unpacked; at least --prompt-len + --new-tokens)")
    p.add_argument("--warmup", type=int, default=2, help="iterations not timed (compilation, warm-up)")
    p.add_argument("--repeats", type=int, default=7, help="timed iterations per framework")
    p.add_argument("--stages", action="store_true", help="also time each stage of our iteration")
    p.add_argument("--wait-idle", action="store_true", help="wait for an idle machine before each iteration")
    p.add_argument("--sequential", action="store_true",
                   help="one framework after the other instead of alternating (half the memory on the machine)")
    p.add_argument("--out", default="", help="markdown file whose grpo-iteration block is rewritten")
    p.add_argument("--key", default="grpo-iteration-results", help="the results block's name in --out")
    p.add_argument("--json", default="", help="also write the results here as JSON")
    args = p.parse_args(argv)
    if args.toy:
        args.size, args.batch, args.group, args.prompt_len = "toy", 2, 2, 4
        args.new_tokens = 16 if args.heavy_tailed else 4  # a median of at least one token
        args.warmup, args.repeats = 1, 1
    for name in ("batch", "group", "prompt_len", "new_tokens", "warmup", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.group < 2:
        raise ValueError(f"--group must be >= 2 (GRPO normalizes within a group), got {args.group}")
    unknown = set(args.frameworks.split(",")) - {"ours", "trl", "tunix"}
    if unknown:
        raise ValueError(f"--frameworks: unknown {sorted(unknown)}; expected ours, trl, tunix")
    return args


def start_workers(args, ws: str, steps: int, log) -> tuple[dict, dict]:
    """{name: started Worker} of the frameworks asked for, and {name: why not} of those that cannot run."""
    frameworks = args.frameworks.split(",")
    shared = dict(workspace=ws, steps=steps, batch=args.batch, group=args.group, prompt_len=args.prompt_len,
                  new_tokens=args.new_tokens, device=args.device, dtype=args.dtype, heavy_tailed=args.heavy_tailed)
    workers, unavailable = {}, {}
    if "ours" in frameworks:
        workers["jaxrl_llm"] = peers.Worker(sys.executable, "ours", dict(
            shared, decode_slots=args.decode_slots, decode_shrink=args.decode_shrink, pack_length=args.pack_length,
            stages=args.repeats if args.stages else 0), keep_path=True)
    if "trl" in frameworks:
        python = args.trl_python or peers.ensure_venv("trl", log)
        counts = sorted({int(x) for x in args.trl_threads.split(",")}) if args.device == "cpu" else [1]
        for threads in counts:
            label = f"{threads} thread{'s' * (threads > 1)}" if args.device == "cpu" else args.device
            workers[f"TRL ({label})"] = peers.Worker(python, "trl", dict(shared, threads=threads),
                                                     keep_path=bool(args.trl_python))
    if "tunix" in frameworks:
        try:
            w = peers.Worker(peers.ensure_venv("tunix", log), "tunix", shared)
            if w.expect("unavailable", "setup")["event"] == "unavailable":
                unavailable["Tunix"] = w.events["unavailable"]["reason"]
                w.proc.stdin.close()
                w.proc.wait(timeout=60)
            else:
                workers["Tunix"] = w
        except RuntimeError as e:
            unavailable["Tunix"] = " ".join(str(e).split())[:400]
    return workers, unavailable


def describe(args, config, flops, flops_unshared, peak, stop, loads) -> str:
    B, G, P, T = args.batch, args.group, args.prompt_len, args.new_tokens
    tail = (f" (heavy-tailed: {len(stop)} stop ids, median {args.median * T:.0f}; FLOPs and roofline count every "
            f"row at full length)" if stop else "")
    return (f"Model {args.size} ({config.num_params() / 1e6:.2f}M parameters), {B} prompts x G={G}, {P} prompt + "
            f"{T} new tokens{tail}, rollout.decode_slots={args.decode_slots}, rollout.decode_shrink="
            f"{args.decode_shrink}, train.pack_length={args.pack_length}; "
            f"{'one framework after the other' if args.sequential else 'alternating'}, load average "
            f"{' / '.join(f'{x:.2f}' for x in loads)} before / after the timed iterations. Matmul peak "
            f"{peak / 1e9:.0f} GFLOP/s; iteration {flops['total'] / 1e9:.2f} GFLOP (generation "
            f"{flops['generation'] / 1e9:.2f}, reference {flops['reference'] / 1e9:.2f}, policy forward + backward "
            f"{flops['policy_fwd_bwd'] / 1e9:.2f}; {flops_unshared['total'] / 1e9:.2f} without prefix sharing): "
            f"roofline {flops['total'] / peak * 1e3:.0f} ms.")


def result_lines(args, timings, done, unavailable) -> list[str]:
    """Side-by-side ratios (time, peak RSS), then each framework's completion lengths."""
    T, lines = args.new_tokens, []
    ours = timings.get("jaxrl_llm")
    for name in (n for n in timings if n != "jaxrl_llm" and ours):
        ours_dev, theirs_dev = done["jaxrl_llm"].get("device_peak_gib"), done[name].get("device_peak_gib")
        # On the GPU the bytes that matter are the device's (host RSS there read the same for both processes).
        memory = (f"peak device memory {ours_dev:.2f} GiB against {theirs_dev:.2f} GiB" if ours_dev and theirs_dev else
                  f"peak RSS ratio (theirs / ours): {done[name]['peak_rss_gib'] / done['jaxrl_llm']['peak_rss_gib']:.2f}x")
        lines.append(f"jaxrl_llm / {name} iterations/s ratio: {timings[name].median / ours.median:.2f}x; {memory}")
    trl = [n for n in timings if n.startswith("TRL")]
    if ours and trl:
        best = min(trl, key=lambda n: timings[n].median)
        lines.append(f"ratio against the faster TRL ({best}): {timings[best].median / ours.median:.2f}x "
                     f"(target >= {3 if args.heavy_tailed else 2}x)")
    lines += [f"{name}: not run -- {reason}" for name, reason in unavailable.items()]
    for name, d in done.items():
        if name == "jaxrl_llm":
            m = d["metrics"]
            lines.append(grpo.length_line("jaxrl_llm", [x["response_length/mean"] for x in m],
                                          [x["response_length/min"] for x in m], [x["response_length/max"] for x in m], T)
                         + f"; sampler vs trainer log-prob max gap {max(x['sampler/logp_diff_max'] for x in m):.2e}")
        elif d.get("completion_mean_lengths"):
            lines.append(grpo.length_line(name, d["completion_mean_lengths"], d.get("completion_min_lengths", []),
                                          d.get("completion_max_lengths", []), T))
    return lines


def main(argv=None):
    args = parse_args(argv)
    from harness.timing import matmul_peak_flops, time_interleaved, wait_for_idle

    from jaxrl_llm.models import read_hf_config
    log = lambda *a: print(*a, flush=True)
    B, G, P, T = args.batch, args.group, args.prompt_len, args.new_tokens
    steps = args.warmup + args.repeats
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as ws:
        grpo.make_workspace(ws, size_of(args.size), num_prompts=max(64, B * steps), prompt_len=P,
                            max_positions=max(1024, P + T), torch_side=True)
        stop = grpo.heavy_tailed_stop_ids(ws, args.median * T) if args.heavy_tailed else []
        if stop:
            log(f"heavy-tailed: {len(stop)} stop ids for a median of {args.median * T:.0f} of {T} tokens")
        config = read_hf_config(os.path.join(ws, "model"))
        peak = matmul_peak_flops()
        groups = [[f] for f in args.frameworks.split(",")] if args.sequential else [args.frameworks.split(",")]
        setup, timings, done, unavailable, loads, step_ends = {}, {}, {}, {}, [], {}
        for group in groups:
            workers, missing = start_workers(argparse.Namespace(**{**vars(args), "frameworks": ",".join(group)}),
                                             ws, steps, log)
            unavailable.update(missing)
            for name, w in workers.items():
                msg = w.events.get("setup") or w.expect("setup")  # Tunix's was read when it was started
                setup[name] = msg["seconds"]
                log(f"{name}: {msg.get('framework') or 'torch ' + msg['torch'] + ', trl ' + msg['trl']}, "
                    f"{msg['threads']} threads")
            for w in workers.values():
                w.expect("ready")
            idle = (lambda: wait_for_idle(timeout=60)) if args.wait_idle else None
            loads.append(os.getloadavg()[0])
            timings |= time_interleaved({name: w.step for name, w in workers.items()}, repeats=args.repeats,
                                        warmup=args.warmup, before_each=idle)
            loads.append(os.getloadavg()[0])
            done |= {name: w.close() for name, w in workers.items()}
            step_ends |= {name: w.step_ends for name, w in workers.items()}

    flops = iteration_flops(config, B, G, P, T)
    flops_unshared = iteration_flops(config, B, G, P, T, prefix_shared=False)
    roofline = flops["total"] / peak
    text = describe(args, config, flops, flops_unshared, peak, stop, loads)
    rows = [[name, setup[name], tm.first, tm.median, tm.spread, 1 / tm.median, tm.median / roofline,
             flops["total"] / tm.median / 1e9, done[name]["peak_rss_gib"]] for name, tm in timings.items()]
    table = markdown_table(["framework", "setup s", "first iteration s", "iteration s (median)", "spread",
                            "iterations/s", "x roofline", "GFLOP/s", "peak RSS GiB"], rows)
    lines = result_lines(args, timings, done, unavailable)
    stages = done.get("jaxrl_llm", {}).get("stages") or {}
    stage_table = markdown_table(["stage of our iteration", "seconds (median)", "share"],
                                 [[k, v, v / sum(stages.values())] for k, v in stages.items()]) if stages else ""
    machine = machine_description()
    log(f"\n{machine}\n{text}\n\n{table}\n" + "\n".join(lines) + (f"\n\n{stage_table}" if stage_table else ""))
    if args.out:
        update_markdown(args.out, args.key, f"Measured on {machine}.\n\n{text}\n\n{table}\n\n"
                        + "\n".join(f"- {line}" for line in lines) + (f"\n\n{stage_table}" if stage_table else ""))
    result = {"timings": {name: {"first": tm.first, "median": tm.median, "spread": tm.spread}
                          for name, tm in timings.items()},
              "setup_s": setup, "peak_rss_gib": {n: d["peak_rss_gib"] for n, d in done.items()},
              "device_peak_gib": {n: d.get("device_peak_gib") for n, d in done.items()}, "flops": flops,
              "roofline_s": roofline, "peak_flops": peak, "lines": lines, "params": config.num_params(),
              "unavailable": unavailable, "load_average": loads, "machine": machine, "args": vars(args),
              "step_ends": step_ends}
    if args.json:
        save_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
