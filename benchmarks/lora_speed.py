"""LoRA applied unmerged (W x + s B(A x)) against merged on the fly (W + s A B, then one matmul), measured
side by side in one process on the tiny model of configs/tiny.py (or --hidden/--layers), for the two
places that run the policy:

  python benchmarks/lora_speed.py [--hidden 64 --layers 2 --rank 16 --rows 256 --tokens 16 --repeats 20]

  update: forward + backward of the completion log-probs with respect to the adapters (the train step's
          bulk). Merged, the backward forms the full-size gradient of every adapted kernel, then projects it.
  sample: `generate` (prefill + decode loop). Unrolled decode (small models) copies the weights anyway and
          merges into that copy (against the base alone); the scanned decode (large models) reads the parameters in place, and
          either adds s B(A x) per step (unmerged, what the sampler does) or gets a merged copy first.

Prints milliseconds per call and the ratios merged / unmerged (> 1: unmerged is faster).
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.timing import time_interleaved  # noqa: E402

from jaxrl_llm.models import ModelConfig, completion_hidden, init_params, logprobs_from_hidden, lora  # noqa: E402
from jaxrl_llm.models import lm  # noqa: E402
from jaxrl_llm.sampling import generate  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rows", type=int, default=256, help="completion rows N (16 prompts x 16)")
    ap.add_argument("--tokens", type=int, default=16, help="completion tokens T (and prompt tokens)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    h = args.hidden
    mc = ModelConfig(vocab_size=128, hidden_size=h, intermediate_size=2 * h, num_layers=args.layers, num_heads=4,
                     num_kv_heads=2, head_dim=h // 4, max_position_embeddings=256, tie_word_embeddings=True,
                     eos_token_id=(1,), lora_rank=args.rank, lora_alpha=float(args.rank), lora_targets=lora.TARGETS)
    base_mc = lora.base_config(mc)
    params = init_params(mc, jax.random.PRNGKey(0))
    base, adapters = lora.split(params)
    adapters = jax.tree_util.tree_map(lambda x: x + 0.01, adapters)
    b, g, t = args.rows // 16, 16, args.tokens
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(2, 128, (b, t)), jnp.int32)
    pmask = jnp.ones((b, t), jnp.int32)
    comps = jnp.asarray(rng.integers(2, 128, (b * g, t)), jnp.int32)
    cmask = jnp.ones((b * g, t), jnp.int32)

    def loss(ad, merged: bool):
        c, p = (base_mc, lora.merge(mc, lora.join(base, ad))) if merged else (mc, lora.join(base, ad))
        hid = completion_hidden(c, p, prompts, pmask, comps, cmask)
        return -jnp.sum(logprobs_from_hidden(c, p, hid, comps))

    grads = {m: jax.jit(jax.grad(lambda ad, m=m: loss(ad, m))) for m in (False, True)}
    sample = lambda c, p: generate(c, p, prompts, pmask, jax.random.PRNGKey(1), max_new_tokens=t, num_samples=g,
                                   eos_ids=(1,), pad_id=0).tokens
    policy = lora.join(base, adapters)
    for c, p in ((mc, policy), (base_mc, base)):  # the unrolled programs, compiled before the switch below
        jax.block_until_ready(sample(c, p))
    lm.DECODE_UNROLL_MAX_LAYERS = 0  # the scanned decode of large models (new configs: no cached program)
    scan_mc = mc.replace(logits_chunk=mc.logits_chunk + 1)
    merge = jax.jit(lambda p: lora.merge(scan_mc, p))
    # Side by side (round robin), each compiled first: medians in ms.
    timings = time_interleaved({
        "update unmerged": lambda i: grads[False](adapters), "update merged": lambda i: grads[True](adapters),
        "unrolled": lambda i: sample(mc, policy), "unrolled base": lambda i: sample(base_mc, base),
        "scanned unmerged": lambda i: sample(scan_mc, policy),
        "scanned merged": lambda i: sample(lora.base_config(scan_mc), merge(policy))}, repeats=args.repeats)
    ms = {k: 1e3 * t.median for k, t in timings.items()}
    upd = {False: ms["update unmerged"], True: ms["update merged"]}
    unrolled, scanned, scanned_merged = ms["unrolled"], ms["scanned unmerged"], ms["scanned merged"]
    print(f"model: hidden {h}, {args.layers} layers, LoRA r={args.rank} on every projection; "
          f"{args.rows} rows x {t} + {t} tokens; median of {args.repeats} (ms)")
    print(f"update (fwd+bwd)  unmerged {upd[False]:8.1f}  merged {upd[True]:8.1f}  merged/unmerged "
          f"{upd[True] / upd[False]:.2f}")
    print(f"sample, scanned   unmerged {scanned:8.1f}  merged {scanned_merged:8.1f}  merged/unmerged "
          f"{scanned_merged / scanned:.2f}")
    print(f"sample, unrolled  merged into the step's weight copy {unrolled:8.1f}  the base without adapters "
          f"{ms['unrolled base']:8.1f}")


if __name__ == "__main__":
    main()
