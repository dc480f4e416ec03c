"""The paged KV cache (`rollout.kv_page_size`, sampling/paged.py) against the unpaged continuous-batching
sampler on heavy-tailed lengths: rows in flight per GiB of cache, the compiled sampler's memory, and useful
tokens per second, side by side.

    python benchmarks/paged_cache.py                    # 135M shape, 8 prompts x 8, 64 + 2048, median 0.1 T
    python benchmarks/paged_cache.py --size 0.5B        # Qwen2.5-0.5B's shape
    python benchmarks/paged_cache.py --toy              # seconds: keeps the script from rotting

Variants, all with the same per-row draws (so the same rows, up to float rounding):
  * unpaged S: `decode_slots` = S, each slot's cache booked at P + T tokens (plus its prompt copy);
  * paged S, same memory: S slots on a pool of exactly the unpaged S slots' cache bytes -- never waits;
  * paged kS, same memory: k times the slots on that same pool -- rows wait for pages, and restart when the
    pool runs dry (`page_stats`), so the pool's tokens follow the rows actually in flight.
Memory: the cache (pool) bytes per layer stack from the shapes, and XLA's `memory_analysis` of each compiled
program (its temporaries: cache or pool, the one-layer page gather, logits, outputs). Time: useful tokens
(each row's tokens up to its stop token) over the call's seconds, calls alternating
(`harness.timing.time_interleaved`), the first (compilation) excluded. Heavy-tailed lengths as in
benchmarks/sampler_lengths.py (stop ids of calibrated probability on a random model).
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
from harness.report import machine_description, markdown_table, update_markdown  # noqa: E402
from harness.shapes import SIZES, build_models, eos_set_for_median, length_summary  # noqa: E402
from harness.timing import time_interleaved  # noqa: E402

from jaxrl_llm.models import forward  # noqa: E402
from jaxrl_llm.sampling import generate, paged_program, pages_needed, slots_program  # noqa: E402
from jaxrl_llm.sampling.paged import page_bytes  # noqa: E402

GIB = 2 ** 30


def compiled_temp_bytes(config, params, prompts, mask, stop, t, g, **kw) -> int:
    """XLA's temporaries of the sampler program `generate` would run with `kw` (decode_slots, kv_page_size,
    kv_pages)."""
    static = dict(max_new_tokens=t, num_samples=g, top_k=0, greedy=False, nucleus=False, eos_ids=tuple(stop), pad_id=0,
                  penalize=False, use_min_p=False, row_block=None, slots=kw["decode_slots"])
    if kw.get("kv_page_size"):
        program = paged_program
        static.update(page_size=kw["kv_page_size"], pages=kw["kv_pages"], shards=1)
    else:
        program = slots_program
    args = (config, params, jnp.asarray(prompts), jnp.asarray(mask), jax.random.PRNGKey(0), jnp.float32(1.0),
            jnp.float32(1.0), jnp.float32(1.0), jnp.float32(0.0))
    return program.lower(*args, **static).compile().memory_analysis().temp_size_in_bytes


def run(args, log=print) -> dict:
    size = SIZES[args.size]
    b, g, p, t, z, s = args.prompts, args.group, args.prompt_len, args.new_tokens, args.page, args.slots
    with tempfile.TemporaryDirectory() as tmp:
        _, config, params = build_models(tmp, size, max_positions=max(256, p + t))
    del _
    prompts = np.random.default_rng(0).integers(1, config.vocab_size - 1, (b, p)).astype(np.int32)
    mask = np.ones_like(prompts)
    probs = jax.nn.softmax(forward(config, params, prompts, mask), -1).mean((0, 1))
    stop = eos_set_for_median(np.asarray(probs), args.median * t)
    per_token = page_bytes(config, 1)  # keys + values of every layer, one token
    unpaged_bytes = s * (p + t) * per_token  # the slots' caches, plus their prompt copies
    pages = max(unpaged_bytes // (z * per_token), pages_needed(p, t, b, 1, z))
    log(f"{size.name}: {config.num_params() / 1e6:.1f}M parameters, {b} x G={g} rows, {p} + {t} tokens, median "
        f"{args.median * t:.0f}; {per_token / 1024:.0f} KiB of cache per token; pool of {pages} pages of {z}")
    variants = {f"unpaged S={s}": dict(decode_slots=s),
                f"paged S={s}": dict(decode_slots=s, kv_page_size=z, kv_pages=pages),
                f"paged S={args.more * s}": dict(decode_slots=args.more * s, kv_page_size=z, kv_pages=pages)}
    out: dict[str, dict] = {name: {} for name in variants}

    def call(name, kw):
        def fn(i):
            r = generate(config, params, prompts, mask, jax.random.PRNGKey(i), max_new_tokens=t, num_samples=g,
                         temperature=1.0, eos_ids=stop, pad_id=0, **kw)
            out[name].setdefault("lengths", {})[i] = np.asarray(r.lengths)
            if r.page_stats is not None:
                out[name].setdefault("stats", {})[i] = np.asarray(r.page_stats)
            return r.tokens
        return fn

    times = time_interleaved({name: call(name, kw) for name, kw in variants.items()}, repeats=args.repeats)
    rows = {}
    for name, kw in variants.items():
        timed = range(1, 1 + args.repeats)
        lens = np.concatenate([out[name]["lengths"][i] for i in timed])
        cache = (kw["kv_pages"] + 1) * z * per_token if "kv_page_size" in kw else unpaged_bytes
        stats = np.stack([out[name]["stats"][i] for i in timed]) if "stats" in out[name] else None
        rows[name] = dict(slots=kw["decode_slots"], cache_gib=cache / GIB, per_gib=kw["decode_slots"] / (cache / GIB),
                          temp_gib=compiled_temp_bytes(config, params, prompts, mask, stop, t, g, **kw) / GIB,
                          tps=lens.sum() / sum(times[name].runs), lengths=length_summary(lens),
                          restarts=None if stats is None else int(stats[:, 0].max()),
                          peak=None if stats is None else int(stats[:, 1].max()))
        log(f"{name:16s}: {rows[name]}")
    return dict(rows=rows, size=size.name, params=config.num_params(), pages=pages, stop=len(stop))


def report(result, args) -> str:
    base = result["rows"][f"unpaged S={args.slots}"]
    table = markdown_table(
        ["sampler", "slots", "cache GiB", "rows in flight per GiB", "compiled temp GiB", "useful tok/s",
         "vs unpaged", "restarts", "peak pages in use", "lengths median / p90 / max"],
        [[name, r["slots"], r["cache_gib"], r["per_gib"], r["temp_gib"], r["tps"], f"{r['tps'] / base['tps']:.2f}x",
          "-" if r["restarts"] is None else r["restarts"], "-" if r["peak"] is None else r["peak"],
          "{median:.0f} / {p90:.0f} / {max}".format(**r["lengths"])] for name, r in result["rows"].items()])
    return (f"Machine: {machine_description()}.\n\n{result['size']} shape ({result['params'] / 1e6:.0f}M parameters, "
            f"random weights), {args.prompts} prompts x G={args.group}, {args.prompt_len} + {args.new_tokens} tokens, "
            f"{result['stop']} stop ids for a median of {args.median * args.new_tokens:.0f}, float32, temperature 1; "
            f"pages of {args.page} tokens, a pool of {result['pages']} (the unpaged S={args.slots} cache's bytes); "
            f"{args.repeats} timed calls each, alternating.\n\n{table}\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="135M", choices=sorted(SIZES))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=2048)
    ap.add_argument("--median", type=float, default=0.1, help="median length as a fraction of --new-tokens")
    ap.add_argument("--slots", type=int, default=8, help="the unpaged sampler's decode slots")
    ap.add_argument("--more", type=int, default=4, help="the paged sampler's slots on the same memory, x --slots")
    ap.add_argument("--page", type=int, default=64, help="tokens per page")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--toy", action="store_true", help="a tiny model and batch, one repeat (smoke test)")
    ap.add_argument("--out", default=None, help="markdown file whose paged-cache results block is refreshed")
    args = ap.parse_args(argv)
    if args.toy:
        args.size, args.prompts, args.group, args.prompt_len, args.new_tokens = "toy", 2, 4, 8, 64
        args.slots, args.page, args.repeats = 2, 8, 1
    text = report(run(args), args)
    print(text)
    if args.out:
        update_markdown(args.out, "paged-cache", text)


if __name__ == "__main__":
    main()
