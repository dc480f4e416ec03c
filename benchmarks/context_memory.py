"""Per-device memory of one attention layer's forward + backward with the sequence split over C devices
(models/context.py `sequence_attend`), from the compiled program (XLA's memory_analysis), on fake CPU
devices: nothing runs, so long rows cost only the compile.

    python benchmarks/context_memory.py                         # T = 2k, 8k, 32k; C = 1, 2, 4, 8
    python benchmarks/context_memory.py --lengths 4096 --shards 1,8

One row, H query heads, Hkv key/value heads of hd (the defaults: Qwen2.5-7B's 28 and 4 of 128), bfloat16.
"arguments" are the layer's inputs per device (q, k, v, masks; 1/C of them), "temporaries" what the
program holds besides (the gathered K/V of the whole row, the kernel's blocks, the gradients). Only the
attention: the rest of a layer (projections, MLP) holds 1/C of its activations by construction.
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="2048,8192,32768", help="tokens per row (T)")
    p.add_argument("--shards", default="1,2,4,8", help="sequence shard counts (C)")
    p.add_argument("--heads", type=int, default=28)
    p.add_argument("--kv_heads", type=int, default=4)
    p.add_argument("--head_dim", type=int, default=128)
    args = p.parse_args(argv)
    shards = [int(c) for c in args.shards.split(",")]
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={max(shards)}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax
    import jax.numpy as jnp
    from harness.report import markdown_table
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as Spec

    from jaxrl_llm.models.context import sharded_attention

    rows = []
    for t in (int(x) for x in args.lengths.split(",")):
        for c in shards:
            mesh = jax.make_mesh((c,), ("sequence",), devices=jax.devices()[:c])
            attn = sharded_attention(mesh, "sequence", block_q=512, block_k=512)
            loss = lambda q, k, v, m, s: jnp.sum(attn(q, k, v, m, s).astype(jnp.float32))
            split = lambda n: NamedSharding(mesh, Spec(None, "sequence", *[None] * (n - 2)))  # tokens over C
            shape = lambda *s, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(s, dtype, sharding=split(len(s)))
            inputs = (shape(1, t, args.heads, args.head_dim), shape(1, t, args.kv_heads, args.head_dim),
                      shape(1, t, args.kv_heads, args.head_dim), shape(1, t, dtype=jnp.bool_),
                      shape(1, t, dtype=jnp.int32))
            m = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*inputs).compile().memory_analysis()
            arg, temp = m.argument_size_in_bytes, m.temp_size_in_bytes  # per device, after partitioning
            rows.append([t, c, round(arg / 2 ** 20, 1), round(temp / 2 ** 20, 1)])
            print(f"T={t} C={c}: arguments {arg / 2 ** 20:.1f} MiB, temporaries {temp / 2 ** 20:.1f} MiB per device",
                  file=sys.stderr, flush=True)
    print(markdown_table(["T", "C", "arguments / device (MiB)", "temporaries / device (MiB)"], rows))


if __name__ == "__main__":
    main()
