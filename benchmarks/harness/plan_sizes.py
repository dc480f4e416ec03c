"""The memory planner's bookkeeping (benchmarks/memory_plan.py): bytes per chip of sharded abstract trees
and of the decode cache, and the plan's table. No jax at import: the planner sets XLA_FLAGS first."""
from __future__ import annotations

GIB = 2 ** 30
CHIPS = {"v5e": 16 * GIB, "H100": 80 * GIB, "v5p": 95 * GIB}


def per_chip(tree) -> int:
    """Bytes one device holds of a pytree of ShapeDtypeStructs with shardings (the largest shard)."""
    import jax
    import numpy as np
    return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * np.dtype(x.dtype).itemsize
               for x in jax.tree_util.tree_leaves(tree))


def abstract(tree, shardings):
    import jax
    return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def kv_cache_bytes(mc, N: int, T: int, mesh, slots: int = 0, page_size: int = 0, pages: int = 0,
                   prompt: int = 0) -> int:
    """Per-device bytes of the decode cache: keys + values, (L, N, T, Hkv, hd) each, in the compute dtype,
    rows over data x fsdp and KV heads over tensor when it divides them (else replicated). With slots: S
    rows of P + T (their prompt copies included); paged: a row shard's M+1 pages of `page_size` tokens."""
    import jax.numpy as jnp
    from jaxrl_llm import sharding
    tensor = mesh.shape["tensor"]
    heads = mc.num_kv_heads // tensor if mc.num_kv_heads % tensor == 0 else mc.num_kv_heads
    per_token = 2 * mc.num_layers * heads * mc.head_dim * jnp.dtype(mc.dtype).itemsize
    if page_size:
        return (pages + 1) * page_size * per_token
    if slots:
        return slots // sharding.batch_divisor(mesh) * (prompt + T) * per_token
    return N // sharding.batch_divisor(mesh) * T * per_token


def table(results, unit: int = GIB) -> tuple[list[str], list[list]]:
    """Headers and rows of the plan: sizes in `unit` bytes per chip, and whether the peak fits each chip."""
    headers = ["mesh (data x fsdp x tensor [x sequence])", "grad accum", "params", "optimizer", "reference", "value + opt", "teacher",
               "KV cache",
               "sample temp", "score temp", "update temp", "peak / chip", *[f"fits {k} ({v // GIB} GiB)" for k, v in CHIPS.items()]]
    rows = []
    for mesh, r in results:
        g = lambda k: round(r[k] / unit, 2)
        accum = f"{r['micro_batches']} by tokens" if r["micro_batches"] else r["grad_accum"]
        rows.append(["x".join(map(str, mesh)), accum, g("params"), g("opt"), g("ref"), g("value"), g("teacher"), g("kv_cache"),
                     g("sample_temp"), g("score_temp"), g("update_temp"), g("peak"),
                     *["yes" if r["peak"] <= 0.9 * cap else "no" for cap in CHIPS.values()]])
    return headers, rows
