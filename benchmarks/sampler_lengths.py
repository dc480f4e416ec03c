"""The sampler on heavy-tailed completion lengths: useful tokens per second (the tokens up to and including
each row's stop token) of continuous batching (`decode_slots` = S) and of the shrinking static batch
(`decode_shrink` = k: N/k rows once at most that many are left) against the static batch (decode_slots
= 0: every row decoded until the longest is done) and against transformers `generate` (PyTorch CPU),
same weights, same prompts, same stop tokens, side by side.

    python benchmarks/sampler_lengths.py                           # 3M model, 16 prompts x 4, 32 + 256 tokens
    python benchmarks/sampler_lengths.py --out docs/benchmarks.md  # also refresh the doc's results block
    python benchmarks/sampler_lengths.py --toy                     # seconds: keeps the script from rotting

Heavy-tailed lengths, reproducibly: a random model's next-token distribution is close to uniform, so a
set of stop ids of total probability h gives geometric lengths; `gpu_stages.eos_set_for_median` picks the
smallest set whose mean probability over the prompts gives the median `--median` x T (h = 1 - 2^(-1/m)),
and the cap T cuts the tail (2^-(T/m) of the rows reach it). Every framework draws from the full
distribution at temperature 1, float32, and stops a row at the first stop id; the lengths of each side
are reported (they are draws from the same distribution, not the same draws: the streams differ). Calls
alternate (`harness.timing.time_interleaved`); the first call (compilation) is excluded; useful tokens/s is the
sum over the timed calls of the tokens over the sum of their times. transformers runs at each
`--threads` count and the ratio is taken against its fastest (see benchmarks/sampler.py).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.peers import hf_with_threads  # noqa: E402
from harness.report import machine_description, markdown_table, update_markdown  # noqa: E402
from harness.sampling import logp_gap  # noqa: E402
from harness.shapes import SIZES, build_models, completion_lengths, eos_set_for_median, length_summary  # noqa: E402
from harness.timing import time_interleaved  # noqa: E402

from jaxrl_llm.models import forward  # noqa: E402
from jaxrl_llm.sampling import generate  # noqa: E402


def stop_set(config, params, prompts, mask, median: float) -> list[int]:
    """The stop ids whose mean next-token probability over the prompts gives geometric lengths of `median`."""
    probs = jax.nn.softmax(forward(config, params, prompts, mask), -1).mean((0, 1))
    return eos_set_for_median(np.asarray(probs), median)


def run(args, log=print) -> dict:
    size = SIZES[args.size]
    b, g, p, t = args.prompts, args.group, args.prompt_len, args.new_tokens
    n = b * g
    with tempfile.TemporaryDirectory() as tmp:
        hf, config, params = build_models(tmp, size, max_positions=max(256, p + t))
    prompts = np.random.default_rng(0).integers(1, config.vocab_size - 1, (b, p)).astype(np.int32)
    mask = np.ones_like(prompts)
    stop = stop_set(config, params, prompts, mask, args.median * t)
    log(f"{size.name}: {config.num_params() / 1e6:.2f}M parameters; {b} prompts x G={g} = {n} rows, {p} + {t} "
        f"tokens; {len(stop)} stop ids for a median of {args.median * t:.0f} tokens")
    lengths: dict[str, list] = {}

    def ours(name, slots=0, shrink=0):
        def call(i):
            r = generate(config, params, prompts, mask, jax.random.PRNGKey(i), max_new_tokens=t, num_samples=g,
                         temperature=1.0, eos_ids=stop, pad_id=0, decode_slots=slots, decode_shrink=shrink)
            lengths.setdefault(name, {})[i] = r.lengths
            return r.tokens
        return call

    def theirs(i):
        import torch
        torch.manual_seed(i)
        with torch.inference_mode():
            out = hf.generate(input_ids=torch.as_tensor(prompts, dtype=torch.long),
                              attention_mask=torch.as_tensor(mask, dtype=torch.long), do_sample=True,
                              temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=t, min_new_tokens=0,
                              num_return_sequences=g, pad_token_id=0, eos_token_id=list(stop))
        lengths.setdefault("transformers", {})[i] = completion_lengths(out[:, p:].numpy(), stop, t)
        return out

    variants = {"ours static": {}, **{f"ours shrink {k}": dict(shrink=k) for k in args.shrink},
                **{f"ours S={s}": dict(slots=s) for s in args.slots}}
    fns = {**{name: ours(name, **kw) for name, kw in variants.items()},
           **{f"hf{k}": hf_with_threads(k, theirs) for k in args.threads}}
    times = time_interleaved(fns, repeats=args.repeats)
    best = min((k for k in fns if k.startswith("hf")), key=lambda k: times[k].median)
    times["transformers"] = times[best]
    timed = range(1, 1 + args.repeats)  # call 0 is the warm-up; every side sees the same seeds
    rows = {}
    for name in (*variants, "transformers"):
        lens = np.concatenate([np.asarray(lengths[name][i]) for i in timed])
        rows[name] = dict(s=times[name].median, tps=lens.sum() / sum(times[name].runs),
                          first=times[name].first, lengths=length_summary(lens))
    for name, r in rows.items():
        r["vs_hf"] = r["tps"] / rows["transformers"]["tps"]
        r["vs_static"] = r["tps"] / rows["ours static"]["tps"]
        log(f"{name:14s}: {r['s'] * 1e3:8.0f} ms  {r['tps']:8.0f} useful tok/s  {r['vs_hf']:.2f}x transformers  "
            f"{r['vs_static']:.2f}x static  lengths {r['lengths']}")
    gap = max((logp_gap(config, params, generate(config, params, prompts, mask, jax.random.PRNGKey(0),
                                                 max_new_tokens=t, num_samples=g, eos_ids=stop, pad_id=0,
                                                 decode_slots=kw.get("slots", 0), decode_shrink=kw.get("shrink", 0)))
               for kw in variants.values() if kw), default=0.0)
    return dict(rows=rows, gap=gap, hf_threads=int(best[2:]), stop=len(stop), params=config.num_params(),
                size=size.name)


def report(result, args) -> str:
    b, g, p, t = args.prompts, args.group, args.prompt_len, args.new_tokens
    table = markdown_table(
        ["sampler", "ms per call", "useful tok/s", "vs transformers", "vs static", "first call s",
         "lengths min / p10 / median / p90 / max (mean)"],
        [[name + (f" ({result['hf_threads']} thr)" if name == "transformers" else ""), r["s"] * 1e3, r["tps"],
          f"**{r['vs_hf']:.2f}x**", f"{r['vs_static']:.2f}x", r["first"],
          "{min} / {p10:.0f} / {median:.0f} / {p90:.0f} / {max} ({mean:.0f})".format(**r["lengths"])]
         for name, r in result["rows"].items()])
    return (f"Machine: {machine_description()}.\n\n{result['size']} model ({result['params'] / 1e6:.2f}M "
            f"parameters), {b} prompts x G={g} = {b * g} rows, {p}-token prompts, up to {t} new tokens, "
            f"{result['stop']} stop ids calibrated for a median of {args.median * t:.0f} tokens, temperature 1, "
            f"float32; {args.repeats} timed calls each, alternating. Useful tokens: each row's tokens up to "
            f"and including its stop token. S: decode slots (continuous batching); static: every row "
            f"decoded until the longest ends; shrink k: the static batch shrunk to N/k rows, N/k^2 ... "
            f"(`rollout.decode_shrink`, the static batch's draws). logp gap of the slotted and shrunk "
            f"samplers against the trainer's "
            f"`token_logprobs`: {result['gap']:.0e}.\n\n{table}\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="3M", choices=sorted(SIZES))
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--median", type=float, default=0.2, help="median length as a fraction of --new-tokens")
    ap.add_argument("--slots", default="16,32", help="comma-separated decode slot counts")
    ap.add_argument("--shrink", default="4", help="comma-separated decode_shrink factors ('' = none)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", default=f"{os.cpu_count()},1", help="torch thread counts; the fastest is compared")
    ap.add_argument("--toy", action="store_true", help="tiny model and batch, 1 repeat (smoke test)")
    ap.add_argument("--out", default=None, help="markdown file whose sampler-lengths results block is refreshed")
    args = ap.parse_args(argv)
    if args.toy:
        args.size, args.prompts, args.group, args.prompt_len, args.new_tokens, args.slots, args.repeats = (
            "toy", 2, 2, 8, 16, "2", 1)
        args.threads, args.shrink = "1", "2"  # 4 rows -> 2
    args.slots = [int(s) for s in args.slots.split(",") if s.strip()]
    args.shrink = [int(k) for k in args.shrink.split(",") if k.strip()]
    args.threads = sorted({int(x) for x in args.threads.split(",")}, reverse=True)
    if not 0 < args.median <= 1 or not all(0 < s <= args.prompts * args.group for s in args.slots):
        raise SystemExit("--median must be in (0, 1] and every --slots in [1, prompts x group]")
    if not all(k >= 2 for k in args.shrink):
        raise SystemExit("every --shrink must be >= 2")
    import torch
    torch.set_num_threads(args.threads[0])
    result = run(args)
    text = report(result, args)
    print("\n" + text)
    if args.out:
        update_markdown(args.out, "sampler-lengths-results", text)
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
