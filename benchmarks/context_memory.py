"""The update's per-device memory and time per token with each row's tokens split over C devices
(`mesh.sequence`, models/context.py), on fake CPU devices, against C = 1 (one device, no mesh).

    python benchmarks/context_memory.py                              # toy model, T = 2k, 8k, 32k; C = 1, 2, 4, 8
    python benchmarks/context_memory.py --size 30M --no-time         # memory only (compiled, not run)
    python benchmarks/context_memory.py --lengths 4096 --shards 1,8

The program is the update's core: the prompt-shared pass of the decoder (lm.completion_hidden: each
layer runs the prompt, then the completions on its keys/values), chunked log-probs, a policy-gradient
loss over them, and the gradient of every parameter, on one prompt of 64 tokens and G = 1 completion of
T tokens (a row), model.remat = full, float32. "memory" is XLA's memory_analysis of the compiled program
per device (arguments + temporaries; the parameters are replicated here, as the sequence axis leaves
them to fsdp); "ms / token" the wall time of one call (after a warm-up) over the T tokens. The C
devices are fake: they share this machine's cores, so the time is the whole mesh's work on one CPU --
its growth with C is the sharded program's overhead (the all-gathers of keys/values, the layout's
permutations, the extra key blocks of the zigzag chunks), not a speed-up.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="toy", help="a model of benchmarks/harness/shapes.py SIZES (toy, 3M, 30M)")
    p.add_argument("--lengths", default="2048,8192,32768", help="completion tokens per row (T)")
    p.add_argument("--shards", default="1,2,4,8", help="sequence shard counts (C); 1 = one device, no mesh")
    p.add_argument("--no-time", dest="time", action="store_false", help="compile only: memory, no run")
    p.add_argument("--block", type=int, default=512, help="model.attention_block")
    args = p.parse_args(argv)
    shards = [int(c) for c in args.shards.split(",")]
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={max(shards)}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import contextlib

    import jax
    import jax.numpy as jnp
    import numpy as np
    from harness.report import markdown_table
    from harness.shapes import SIZES, hf_dict

    from jaxrl_llm import sharding
    from jaxrl_llm.models import lm
    from jaxrl_llm.models.config import config_from_hf_dict

    mc = config_from_hf_dict(hf_dict(SIZES[args.size], max_positions=65536), source="context_memory", param_dtype="float32",
                             dtype="float32", remat="full", attention="blockwise", attention_block=args.block)
    params = lm.init_params(mc, jax.random.PRNGKey(0))
    P = 64

    def loss(params, prompt, pmask, tokens, mask, adv):
        hidden = lm.completion_hidden(mc, params, prompt, pmask, tokens, mask)
        logp = lm.logprobs_from_hidden(mc, params, hidden, tokens)
        return -jnp.sum(logp * adv * mask) / jnp.sum(mask)

    rows = []
    for t in (int(x) for x in args.lengths.split(",")):
        rng = np.random.default_rng(t)
        inputs = (jnp.asarray(rng.integers(1, mc.vocab_size, (1, P)), jnp.int32), jnp.ones((1, P), bool),
                  jnp.asarray(rng.integers(1, mc.vocab_size, (1, t)), jnp.int32), jnp.ones((1, t), bool),
                  jnp.asarray(rng.normal(size=(1, t)), jnp.float32))
        base_ms = None
        for c in shards:
            mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:c], sequence=c) if c > 1 else None
            with sharding.use_mesh(mesh, sequence=True) if mesh is not None else contextlib.nullcontext():
                fn = jax.jit(jax.grad(loss))
                compiled = fn.lower(params, *inputs).compile()
                m = compiled.memory_analysis()
                mib = (m.argument_size_in_bytes + m.temp_size_in_bytes) / 2 ** 20
                ms = float("nan")
                if args.time:
                    jax.block_until_ready(compiled(params, *inputs))
                    t0 = time.perf_counter()
                    jax.block_until_ready(compiled(params, *inputs))
                    ms = (time.perf_counter() - t0) * 1e3 / t
            base_ms = ms if c == 1 else base_ms
            ratio = ms / base_ms if base_ms else float("nan")
            rows.append([t, c, round(m.temp_size_in_bytes / 2 ** 20, 1), round(mib, 1), round(ms, 3), round(ratio, 2)])
            print(f"T={t} C={c}: temporaries {m.temp_size_in_bytes / 2 ** 20:.1f} MiB, arguments + temporaries "
                  f"{mib:.1f} MiB per device, {ms:.3f} ms/token ({ratio:.2f}x C=1)", file=sys.stderr, flush=True)
    print(f"{args.size} model ({mc.num_layers} layers, hidden {mc.hidden_size}, {mc.num_heads}/{mc.num_kv_heads} "
          f"heads), one row of {P} + T tokens, float32, remat full, blockwise {args.block}:\n")
    print(markdown_table(["T", "C", "temporaries / device (MiB)", "arguments + temporaries / device (MiB)",
                          "ms / token (all C devices on this CPU)", "time vs C = 1"], rows))


if __name__ == "__main__":
    main()
