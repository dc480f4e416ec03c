"""The policy-gradient pass at long sequence lengths: `jax.value_and_grad` of a log-prob loss through
`models.token_logprobs` (hidden 256, 4 layers) with the same 4096 tokens per step at T = 256, 2048 and
8192 (one row of 8192 there), for each `model.attention`; then packed vs padded rows on a heavy-tailed
batch of lengths (the trainer's update pass, `models.packing`).

    python benchmarks/pg_pass.py                   # CPU, float32 (docs/benchmarks.md, "The policy-gradient
                                                   # pass at long T, and sequence packing")
    python benchmarks/pg_pass.py --toy             # seconds: keeps the script from rotting (tests)

GFLOP/s: model FLOPs only, 3x the forward (forward + backward), the forward being 2 FLOPs per weight per
token (LM head included) plus causal attention, 4·heads·head_dim per (query, visible key) pair
(`jaxrl_llm.metrics.flops_per_token`; a token at position i sees i+1 keys). Memory: the compiled
program's `memory_analysis().temp_size_in_bytes` (what XLA allocates besides arguments and outputs; the
arguments, parameters and tokens, are the same at every T). The machine's float32 matmul peak is measured
in the same run (`harness.timing.matmul_peak_flops`). Timings are medians of interleaved repeats, first call
(compilation) excluded. `auto` is not timed separately: it compiles to the implementation named beside it.
The dense path at T = 8192 is compiled (for its memory) but not run: its (heads, T, T) float32 scores
make one call take minutes on a 2-core machine.

Packed vs padded: N completions of a heavy-tailed length distribution (lognormal, clipped to [20, T],
median about T/8: the reasoning-RL shape) after a P-token prompt each; `padded` is the trainer's unpacked
pass (completion_hidden over (N, T), the prompt shared per row), `packed` runs the same rows' real tokens
in rows of P + T tokens (first-fit-decreasing). Reported: real completion tokens per second.
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.report import machine_description, markdown_table  # noqa: E402
from harness.timing import matmul_peak_flops, time_interleaved  # noqa: E402

from jaxrl_llm.metrics import flops_per_token  # noqa: E402
from jaxrl_llm.models import ModelConfig, completion_hidden, logprobs_from_hidden, token_logprobs  # noqa: E402
from jaxrl_llm.models.kernels import resolve_attention  # noqa: E402
from jaxrl_llm.models.lm import init_params  # noqa: E402
from jaxrl_llm.models.packing import pack_efficiency, packed_logprobs, plan_packs, sequence_lengths  # noqa: E402

IMPLS = ("xla", "blockwise")


def model(attention: str, *, toy: bool = False) -> ModelConfig:
    if toy:
        return ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1,
                           num_heads=2, num_kv_heads=1, head_dim=8, qkv_bias=True, max_position_embeddings=256,
                           attention=attention, attention_block=16)
    return ModelConfig(model_type="qwen2", vocab_size=4096, hidden_size=256, intermediate_size=1024, num_layers=4,
                       num_heads=4, num_kv_heads=2, head_dim=64, qkv_bias=True, max_position_embeddings=16384,
                       attention=attention)


def pass_flops(c: ModelConfig, rows: int, length: int) -> float:
    """Forward + backward model FLOPs of `rows` causal rows of `length` tokens (mean context (T+1)/2)."""
    return 3 * rows * length * flops_per_token(c, (length + 1) / 2)


def pg_step(c: ModelConfig):
    """jitted params, tokens, w -> (sum(logp * w), grads): the policy-gradient pass's shape of work."""
    def loss(params, tokens, w):
        mask = jnp.ones_like(tokens)
        return jnp.sum(token_logprobs(c, params, tokens, mask, jnp.roll(tokens, -1, axis=1)) * w)
    return jax.jit(jax.value_and_grad(loss))


def measure_lengths(lengths, tokens: int, repeats: int, toy: bool):
    """{(impl, T): (seconds or None, temp bytes, flops)} for the implementations at each T."""
    out, rng = {}, np.random.default_rng(0)
    for t in lengths:
        rows = max(1, tokens // t)
        toks = jnp.asarray(rng.integers(0, model("xla", toy=toy).vocab_size, (rows, t)), jnp.int32)
        w = jnp.asarray(rng.standard_normal((rows, t)), jnp.float32)
        calls = {}
        for impl in IMPLS:
            c = model(impl, toy=toy)
            params = init_params(c, jax.random.PRNGKey(0))
            fn = pg_step(c)
            temp = fn.lower(params, toks, w).compile().memory_analysis().temp_size_in_bytes
            out[impl, t] = [None, temp, pass_flops(c, rows, t)]
            if not (impl == "xla" and t > 4096):
                calls[impl] = lambda i, fn=fn, params=params: fn(params, toks, w)
        for impl, timing in time_interleaved(calls, repeats=repeats).items():
            out[impl, t][0] = timing.median
        print(f"T={t}: " + ", ".join(f"{i} {out[i, t][0]}" for i in IMPLS), flush=True)
    return out


def length_table(res, lengths, peak: float) -> str:
    headers = ["T", "rows", "attention", "ms", "GFLOP/s", "of peak", "temp MiB"]
    rows = []
    for t in lengths:
        for impl in IMPLS + ("auto",):
            name = auto_impl(t) if impl == "auto" else impl
            sec, temp, flops = res[name, t]
            label = f"auto (= {name})" if impl == "auto" else impl
            rows.append([t, max(1, res["_tokens"] // t), label, "-" if sec is None else f"{sec * 1e3:.0f}",
                         "-" if sec is None else f"{flops / sec / 1e9:.1f}", "-" if sec is None else f"{flops / sec / peak:.2f}",
                         f"{temp / 2 ** 20:.1f}"])
    return markdown_table(headers, rows)


def auto_impl(t: int) -> str:
    """What `auto` compiles to on this backend for a float32 pass of t keys per query."""
    return resolve_attention("auto", backend=jax.default_backend(), dtype=jnp.float32, head_dim=64, keys=t,
                             segments=False)


def ratio_table(res, short: int, long: int) -> str:
    rows = []
    for impl in IMPLS + ("auto",):
        a, b = (impl, impl) if impl != "auto" else (auto_impl(short), auto_impl(long))
        (s0, m0, f0), (s1, m1, f1) = res[a, short], res[b, long]
        rows.append([impl if impl != "auto" else f"auto ({a} -> {b})", f"{(f1 / s1) / (f0 / s0):.2f}", f"{m1 / m0:.2f}"])
    return markdown_table(["attention", f"GFLOP/s T={long} / T={short} (target >= 0.7)",
                           f"temp memory T={long} / T={short} (target <= 1.5)"], rows)


def heavy_tailed(n: int, cap: int, rng) -> np.ndarray:
    """n completion lengths: lognormal with median cap/8, clipped to [20, cap] (min(20, cap) when tiny)."""
    return np.clip(np.round(np.exp(rng.normal(np.log(cap / 8), 1.0, n))), min(20, cap), cap).astype(int)


def packed_vs_padded(n: int, p: int, t: int, repeats: int, toy: bool) -> str:
    rng = np.random.default_rng(1)
    c = model("auto", toy=toy)
    params = init_params(c, jax.random.PRNGKey(0))
    lengths = heavy_tailed(n, t, rng)
    prompts, pmask = jnp.asarray(rng.integers(1, c.vocab_size, (n, p)), jnp.int32), jnp.ones((n, p), jnp.int32)
    comps = jnp.asarray(rng.integers(1, c.vocab_size, (n, t)), jnp.int32)
    cmask = jnp.asarray(np.arange(t)[None] < lengths[:, None], jnp.int32)
    w = jnp.asarray(rng.standard_normal((n, t)), jnp.float32) * cmask
    plan = jax.tree_util.tree_map(lambda x: x[0], plan_packs(np.asarray(sequence_lengths(pmask, cmask))[None], p + t))

    def padded(params, prompts, pmask, comps, cmask, w, plan):
        return jnp.sum(logprobs_from_hidden(c, params, completion_hidden(c, params, prompts, pmask, comps, cmask), comps) * w)

    def packed(params, prompts, pmask, comps, cmask, w, plan):
        return jnp.sum(packed_logprobs(c, params, prompts, pmask, comps, cmask, plan, p + t) * w)

    # Arrays as arguments, not closed-over constants (XLA would constant-fold the packing's gathers).
    args = (params, prompts, pmask, comps, cmask, w, plan)
    fns = {name: jax.jit(jax.value_and_grad(f)) for name, f in (("padded", padded), ("packed", packed))}
    temp = {k: f.lower(*args).compile().memory_analysis().temp_size_in_bytes for k, f in fns.items()}
    timing = time_interleaved({k: (lambda i, f=f: f(*args)) for k, f in fns.items()}, repeats=repeats)
    real = int(lengths.sum())
    rows = [[k, f"{timing[k].median * 1e3:.0f}", f"{real / timing[k].median:.0f}", f"{temp[k] / 2 ** 20:.1f}"]
            for k in fns]
    eff = pack_efficiency({"slots": plan["slots"]}, p + t)
    head = (f"N={n} completions after P={p} prompt tokens, T={t}: lengths min {lengths.min()}, median "
            f"{int(np.median(lengths))}, max {lengths.max()}, mean {lengths.mean():.0f}; packed into "
            f"{plan['slots'].shape[0]} rows of {p + t} (efficiency {eff:.2f}); speed-up packed/padded "
            f"{timing['padded'].median / timing['packed'].median:.2f}x")
    return head + "\n\n" + markdown_table(["pass", "ms", "completion tokens/s", "temp MiB"], rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--toy", action="store_true", help="tiny model and lengths, one repeat: seconds on CPU")
    ap.add_argument("--lengths", default="256,2048,8192")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per step")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pack", default="8,64,2048", help="N,P,T of the packed vs padded comparison")
    args = ap.parse_args(argv)
    lengths, tokens, repeats, pack = [int(x) for x in args.lengths.split(",")], args.tokens, args.repeats, args.pack
    if args.toy:
        lengths, tokens, repeats, pack = [16, 32], 32, 1, "4,8,32"
    peak = matmul_peak_flops(256 if args.toy else 2048)
    print(f"== policy-gradient pass: {machine_description()}; backend {jax.default_backend()}, float32, "
          f"matmul peak {peak / 1e9:.1f} GFLOP/s")
    res = measure_lengths(lengths, tokens, repeats, args.toy)
    res["_tokens"] = tokens
    print(length_table(res, lengths, peak))
    print()
    print(ratio_table(res, lengths[0], lengths[1]))
    print()
    n, p, t = (int(x) for x in pack.split(","))
    print(packed_vs_padded(n, p, t, repeats, args.toy))


if __name__ == "__main__":
    main()
