"""Sampler throughput: `jaxrl_llm.sampling.generate` against transformers `generate` (PyTorch CPU), same
weights, same prompts, side by side; and the cost of G completions per prompt (prefill sharing).

    python benchmarks/sampler.py                          # ~3M and ~30M models, B=64, 32 + 64 tokens
    python benchmarks/sampler.py --out docs/benchmarks.md # also refresh the results block of the doc
    python benchmarks/sampler.py --toy                    # seconds: keeps the script from rotting (tests)

Fairness: both sample from the full distribution (temperature 1, no top-k, no top-p) in float32 and both
produce every row to full length. The HF model has no EOS token, so `generate` runs max_new_tokens
steps. Our loop stops only once every row has drawn its EOS (an id of probability ~1/V per draw); the
script checks that it ran all T steps, and a row that drew it keeps being computed (then padded) just
like HF's finished rows, so both compute N*T tokens. Timed calls exclude the first one (compilation,
warm-up), reported separately; the two libraries alternate call by call so that the load of a shared
machine hits both alike; the median of the repeats is reported. transformers runs with one thread per
core and with one thread (`--threads`) and the ratio is taken against the faster: on a loaded machine
torch's OpenMP threads spin at barriers while their partner is descheduled, and 2 threads can be 10x
slower than 1. XLA keeps its default (one thread per core). `--wait-idle` waits, before each timed call,
until other processes leave the machine idle.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.flops import decode_flops_per_token  # noqa: E402
from harness.peers import hf_generate, hf_with_threads  # noqa: E402
from harness.report import load_average, machine_description, markdown_table, save_json, update_markdown  # noqa: E402
from harness.sampling import full_length, jax_generate, logp_gap  # noqa: E402
from harness.shapes import SIZES, ModelSize, build_models  # noqa: E402
from harness.memory import peak_rss_gib  # noqa: E402
from harness.timing import matmul_peak_flops, time_interleaved, wait_for_idle  # noqa: E402

from jaxrl_llm.models.lm import decode_logits, prefill  # noqa: E402

TARGETS = {"3M": 5.0, "30M": 2.0, "135M": 2.0, "0.5B": 2.0}  # minimum speed-up over transformers


def bench_size(size: ModelSize, args, before_each, log):
    b, p, t, g = args.batch, args.prompt_len, args.new_tokens, args.group
    if g and b % g:
        raise ValueError(f"--batch {b} must be a multiple of --group {g}")
    with tempfile.TemporaryDirectory() as tmp:
        hf, config, params = build_models(tmp, size, max_positions=max(256, p + t))
    n_params = config.num_params()
    log(f"\n== {size.name}: {n_params / 1e6:.2f}M parameters (vocab {config.vocab_size}, hidden "
        f"{config.hidden_size}, {config.num_layers} layers, {config.num_heads}/{config.num_kv_heads} heads, "
        f"mlp {config.intermediate_size}, {config.model_type})")
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, config.vocab_size - 1, (b, p)).astype(np.int32)
    mask = np.ones((b, p), np.int32)
    prompts_j, mask_j = jnp.asarray(prompts), jnp.asarray(mask)
    prefill_fn = jax.jit(lambda tokens, m: decode_logits(
        config, params, prefill(config, params, tokens, m, with_lm_head=False)[0][:, -1]))

    # 1. throughput, side by side; prefill alone, to split our time into prefill and decode steps.
    hf_runs = {f"hf{k}": hf_with_threads(k, lambda i: hf_generate(hf, prompts, mask, t, i)) for k in args.threads}
    times = time_interleaved({
        "jax": lambda i: full_length(jax_generate(config, params, prompts_j, mask_j, t, i), t), **hf_runs,
        "prefill": lambda i: prefill_fn(prompts_j, mask_j),
    }, repeats=args.repeats, before_each=before_each)
    best = min(hf_runs, key=lambda k: times[k].median)  # HF at its best thread count
    times["hf"], r_threads = times[best], int(best[2:])
    tokens = b * t
    flops = tokens * decode_flops_per_token(config, p + t / 2)
    gap = logp_gap(config, params, jax_generate(config, params, prompts_j, mask_j, t, 0))
    r = dict(name=size.name, params=n_params, times=times, jax_tps=tokens / times["jax"].median,
             hf_tps=tokens / times["hf"].median, flops=flops, logp_gap=gap, hf_threads=r_threads)
    r["ratio"] = r["jax_tps"] / r["hf_tps"]
    r["step_ms"] = (times["jax"].median - times["prefill"].median) / (t - 1) * 1e3
    for key, label in (("jax", "jaxrl_llm"), *((k, f"HF {k[2:]} thr") for k in hf_runs)):
        log(f"{label:12s}: {times[key].median * 1e3:8.1f} ms  {tokens / times[key].median:8.0f} tok/s  "
            f"{flops / times[key].median / 1e9:5.1f} GFLOP/s  (first call {times[key].first:.2f} s; "
            f"repeats {', '.join(f'{x * 1e3:.0f}' for x in times[key].runs)} ms)")
    target = TARGETS.get(size.name)
    log(f"ratio       : {r['ratio']:.2f}x against transformers with {r_threads} thread(s)"
        + (f" (target >= {target:g}x)" if target else ""))
    log(f"ours        : prefill {times['prefill'].median * 1e3:.1f} ms + {r['step_ms']:.2f} ms per decode step; "
        f"log-probs vs the trainer's: max |diff| {gap:.1e}")

    r["load"] = load_average()
    if not g:
        return r
    # 2. G completions per prompt, N = B rows either way: B/G prompts x G against the same B/G prompts
    # each repeated G times (what a sampler without prefix sharing computes), and against HF's
    # num_return_sequences (which expands the prompts before its prefill).
    bp = b // g
    few, few_mask = prompts_j[:bp], mask_j[:bp]
    rep, rep_mask = jnp.repeat(few, g, axis=0), jnp.repeat(few_mask, g, axis=0)
    r["group"] = time_interleaved({
        "shared": lambda i: full_length(jax_generate(config, params, few, few_mask, t, i, num_samples=g), t),
        "repeated": lambda i: full_length(jax_generate(config, params, rep, rep_mask, t, i), t),
        "hf_group": hf_with_threads(r_threads, lambda i: hf_generate(hf, prompts[:bp], mask[:bp], t, i,
                                                                      num_return_sequences=g)),
        "prefill_few": lambda i: prefill_fn(few, few_mask),
        "prefill_all": lambda i: prefill_fn(rep, rep_mask),
    }, repeats=args.repeats, before_each=before_each)
    gt = r["group"]
    log(f"{bp} prompts x G={g} against {b} rows (each prompt repeated {g}x), per generated token:")
    for key, label in (("shared", f"jaxrl_llm G={g}, prompt prefilled once"),
                       ("repeated", f"jaxrl_llm G=1, prompt prefilled {g}x"),
                       ("hf_group", f"transformers num_return_sequences={g}")):
        log(f"  {label:40s} {gt[key].median / tokens * 1e6:8.2f} us/token")
    log(f"  prefill of {bp} prompts: {gt['prefill_few'].median * 1e3:.2f} ms; of {b} rows: "
        f"{gt['prefill_all'].median * 1e3:.2f} ms")
    return r


def report(results, args, peak) -> str:
    rows = []
    for r in results:
        tm = r["times"]
        rows.append([r["name"], f"{r['params'] / 1e6:.2f}M", tm["jax"].median * 1e3,
                     f"{tm['hf'].median * 1e3:,.0f} ({r['hf_threads']} thr)",
                     r["jax_tps"], r["hf_tps"], f"**{r['ratio']:.2f}x**", f">= {TARGETS.get(r['name'], 0):g}x",
                     f"{r['flops'] / tm['jax'].median / peak:.0%}", f"{r['flops'] / tm['hf'].median / peak:.0%}",
                     tm["prefill"].median * 1e3, r["step_ms"], tm["jax"].warmup, tm["hf"].warmup,
                     r["load"], f"{r['logp_gap']:.0e}"])
    table = markdown_table(["model", "params", "ours ms", "HF ms", "ours tok/s", "HF tok/s", "ratio", "target",
                            "ours % peak", "HF % peak", "ours prefill ms", "ours ms/step", "ours compile s",
                            "HF warm-up s", "load average after", "logp gap"], rows)
    g, b, t = args.group, args.batch, args.new_tokens
    grows = []
    for r in (r for r in results if "group" in r):
        gt = r["group"]
        per_tok = lambda k: gt[k].median / (b * t) * 1e6
        grows.append([r["name"], per_tok("shared"), per_tok("repeated"), per_tok("hf_group"),
                      gt["prefill_few"].median * 1e3, gt["prefill_all"].median * 1e3])
    gtable = "" if not g else markdown_table(["model", f"ours {b // g}x{g} us/token", f"ours {b}x1 (repeated) us/token",
                             f"HF num_return_sequences={g} us/token", f"prefill {b // g} prompts ms",
                             f"prefill {b} rows ms"], grows)
    return (f"Machine: {machine_description()}. Matmul peak (best of a jitted 2048x2048 float32 matmul): "
            f"{peak / 1e9:.0f} GFLOP/s.\n\n"
            f"{b} prompts x {args.prompt_len} tokens, {t} new tokens, sampling at temperature 1 from the full "
            f"vocabulary, float32; median of {args.repeats} alternating repeats"
            f"{' taken when the machine was idle' if args.wait_idle else ''}. % peak: model FLOPs "
            f"(2 per weight + attention) per second over the matmul peak. logp gap: max |sampler log-prob - "
            f"trainer `token_logprobs`| over the rollout. Peak RSS of the process (both libraries, both "
            f"models): {peak_rss_gib():.2f} GiB.\n\n{table}\n\n" + (
            f"G completions per prompt, N = {b} rows either way ({b // g} prompts x G={g} against the same "
            f"{b // g} prompts each repeated {g} times), time per generated token, and prefill alone:\n\n"
            f"{gtable}\n" if g else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", "--size", default="3M,30M", help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--batch", type=int, default=64, help="prompts (rows) of the throughput comparison")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--group", type=int, default=16, help="G of the prefill-sharing comparison (0: skip it)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", default=f"{os.cpu_count()},1",
                    help="comma-separated torch intra-op thread counts; HF is compared at its fastest")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                    help="before each timed call, wait up to this long for the machine to be idle")
    ap.add_argument("--toy", action="store_true", help="tiny model and batch, 1 repeat (smoke test)")
    ap.add_argument("--out", default=None, help="markdown file whose sampler results block is refreshed")
    ap.add_argument("--key", default="sampler-results", help="the results block's name in --out")
    ap.add_argument("--json", default="", help="also write the results here as JSON")
    args = ap.parse_args(argv)
    if args.toy:  # G=1 reuses the compiled shapes: the smoke test pays for two compilations only
        args.sizes, args.batch, args.prompt_len, args.new_tokens, args.group, args.repeats = "toy", 4, 8, 6, 1, 1
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise SystemExit(f"--sizes: unknown {unknown}; expected some of {', '.join(SIZES)}")
    for name in ("batch", "prompt_len", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        args.threads = sorted({int(x) for x in args.threads.split(",")}, reverse=True)
    except ValueError:
        raise SystemExit(f"--threads must be comma-separated integers, got {args.threads!r}") from None
    if not args.threads or min(args.threads) < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")

    import torch
    torch.set_num_threads(args.threads[0])
    before_each = (lambda: wait_for_idle(timeout=args.wait_idle)) if args.wait_idle > 0 else None
    if before_each is not None:
        before_each()
    peak = matmul_peak_flops(256 if args.toy else 2048)
    print(machine_description())
    print(f"matmul peak: {peak / 1e9:.1f} GFLOP/s")
    results = [bench_size(SIZES[s], args, before_each, print) for s in sizes]
    text = report(results, args, peak)
    print("\n" + text)
    if args.out:
        update_markdown(args.out, args.key, text)
        print(f"wrote {args.out}")
    if args.json:
        save_json(args.json, {"machine": machine_description(), "args": vars(args), "peak_rss_gib": peak_rss_gib(),
                              "results": [{k: v for k, v in r.items() if k not in ("times", "group")}
                                          | {"times": {k: vars(v) for k, v in r["times"].items()}} for r in results]})
    return results


if __name__ == "__main__":
    main()
