"""Attention over a sequence sharded along a mesh axis (context parallelism): the building block of a
`sequence` mesh axis for the passes that see whole rows (score, update, prefill). Not yet wired into the
model or the trainer (docs/scaling.md, "A sequence axis: what exists").

Design: all-gather of keys and values, local queries. Shard i of C holds the tokens [i*s, (i+1)*s) of
every row (s = S / C; the caller pads S to a multiple of C, padding keys masked). Its queries attend
  * to every key of the earlier shards, non-causally (they are all before the queries), and
  * to the keys of its own shard, causally,
each part with the blockwise kernel (models/attention.py `flash_attention`: float32 softmax, custom VJP,
GQA, segment ids, soft cap, sliding window by global index), merged exactly by their log-sum-exps
(`attention.merge`). The keys and values of the whole row are gathered once per layer (K/V are
Hkv*hd wide, H/Hkv times narrower than the queries, so the gather moves less than a ring of queries
would), and the backward's transpose of the gather is a reduce-scatter of their gradients, which
shard_map derives. Activations (queries, MLP, LM head) stay 1/C per shard; only a layer's K/V are whole.

Load balance: with contiguous shards, shard i's non-causal part covers i*s keys, so the last shard works
about C times the first. A zigzag layout (shard i holding chunks i and 2C-1-i) evens that out; it is a
permutation of the tokens before the model and is not done here.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxrl_llm.models.attention import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, flash_attention, merge


def sequence_attend(q, k, v, key_mask, segment_ids=None, *, axis: str, window=None, softcap=None, scale=None,
                    block_q: int = DEFAULT_BLOCK_Q, block_k: int = DEFAULT_BLOCK_K):
    """Causal self-attention of this shard's queries over the whole row, inside shard_map over `axis`.

    Local shapes (shard i of C along `axis`, s tokens each, global positions i*s ..): q (N,s,H,hd); k, v
    (N,s,Hkv,hd); key_mask (N,s) bool, the real tokens; segment_ids None or (N,s) int (a query sees only
    keys of its own segment, across shard boundaries too); window None or an int: a query also needs
    query index - key index < window (global indices); softcap, scale as in models/kernels.py.
    Returns (N,s,H,hd) in q.dtype: what `attention.blockwise_attend` gives these queries on the whole row.
    """
    n, s = q.shape[:2]
    i = lax.axis_index(axis)
    seg = jnp.zeros((n, s), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    kv_seg = jnp.where(key_mask.astype(bool), seg, -1)
    gather = lambda x: lax.all_gather(x, axis, axis=1, tiled=True)
    k_all, v_all, seg_all = gather(k), gather(v), gather(kv_seg)  # (N, C*s, ...)
    q_idx = jnp.broadcast_to(i * s + jnp.arange(s, dtype=jnp.int32), (n, s))
    kv_idx = jnp.broadcast_to(jnp.arange(k_all.shape[1], dtype=jnp.int32), (n, k_all.shape[1]))
    earlier = jnp.where(kv_idx < i * s, seg_all, -1)  # keys of the shards before this one: all visible
    win = None if window is None else jnp.int32(window)
    out_a, lse_a = flash_attention(q, k_all, v_all, seg, earlier, False, block_q, block_k, scale, softcap,
                                   None if win is None else (q_idx, kv_idx, win))
    out_b, lse_b = flash_attention(q, k, v, seg, kv_seg, True, block_q, block_k, scale, softcap,
                                   None if win is None else (q_idx, q_idx, win))
    out, _ = merge(out_a, lse_a, out_b, lse_b)
    return out.astype(q.dtype)


def pad_to_shards(x, shards: int, axis: int = 1, value=0):
    """`x` padded along `axis` to a multiple of `shards` (a sequence the axis does not divide is padded,
    not refused; the caller masks the padding keys)."""
    extra = -x.shape[axis] % shards
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def sharded_attention(mesh, axis: str, row_axes=None, **options):
    """A function (q, k, v, key_mask, segment_ids) -> out of whole (N,S,...) arrays that runs
    `sequence_attend` with the sequence dimension split over the mesh axis `axis` and the rows over
    `row_axes` (None: replicated over the other axes). S must be a multiple of the axis size
    (`pad_to_shards`)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as Spec
    specs = (Spec(row_axes, axis, None, None),) * 3 + (Spec(row_axes, axis),) * 2
    body = lambda q, k, v, m, sg: sequence_attend(q, k, v, m, sg, axis=axis, **options)
    # check_vma off: the blockwise kernel's loop carries start from constants (not per-shard values)
    run = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=specs[0], check_vma=False)
    return lambda *xs: run(*(jax.reshard(x, NamedSharding(mesh, s)) for x, s in zip(xs, specs)))
