"""The paged decode attention as a Pallas TPU kernel: what models/paged.py `attend` computes (one new token
per slot over the pages of its row; layout and masks there), with the page table read by the kernel itself
instead of gathered by XLA.

Grid (S, Hkv, W): slot x KV head x logical page, one page (Z keys) per step. The page table, the layer index
and each slot's page count are scalar-prefetched (`pltpu.PrefetchScalarGridSpec`): the key and value
BlockSpecs' index maps look the pool page up in the table, so the pipeline copies exactly the slot's pages
from HBM, in logical order, and never the pages of other slots. All Rq query heads of a KV head are one
(Rq, hd) @ (hd, Z) product per page, the keys being stored (hd, Z) for that. The softmax is online: running
max, sum and output in float32 VMEM scratch, across the page axis (the innermost, "arbitrary").

A slot's own page count (through its last visible key) stops its work: past it the index maps repeat the
last page (the pipeline skips a copy whose block index did not change) and the body is skipped, so a step
costs each slot's own length, not the longest row's (the XLA path reads as far as the longest row in flight).

Masks as in the XLA path: `key_seen`, the sliding window by positions (query_pos - key_pos < window), the
soft cap on the scaled scores; masked scores are MASKED_SCORE, not -inf, so a page whose keys are all
masked (a left-padded prompt's first page) leaves the running sums as the XLA path's do.

TPU only, as a compiled kernel (`paged.attention_impl` chooses it, on one chip); `interpret=True` runs the same kernel
in Pallas' interpreter (CPU tests; it has not been run on a TPU here). No GPU (Triton) formulation: Triton
has no scalar prefetch, and Rq query heads below 16 rows fit none of its dot shapes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxrl_llm.models.attention import MASKED_SCORE
from jaxrl_llm.models.kernels import soft_cap
from jaxrl_llm.models.paged import visible_keys


def page_counts(visible, page_size: int):
    """(S,) int32: the logical pages through each slot's last visible key, at least 1 (a slot that sees no
    key still reads one page, as the XLA path does, so that its output stays finite)."""
    pages = visible.reshape(visible.shape[0], -1, page_size).any(axis=-1)  # (S,W)
    last = jnp.max(jnp.where(pages, jnp.arange(1, pages.shape[1] + 1, dtype=jnp.int32), 0), axis=1)
    return jnp.maximum(last, 1).astype(jnp.int32)


def _kernel(layer_ref, table_ref, count_ref, q_ref, k_ref, v_ref, vis_ref, o_ref, top_ref, total_ref, acc_ref,
            *, scale: float, softcap):
    """One (slot, KV head, page) step. q_ref (Rq,hd); k_ref (hd,Z); v_ref (Z,hd); vis_ref (1,Z) int32;
    o_ref (Rq,hd) float32, written at the last page step; scratch top, total (Rq,1), acc (Rq,hd) float32."""
    del layer_ref, table_ref  # read by the index maps
    page = pl.program_id(2)

    @pl.when(page == 0)
    def _():
        top_ref[...] = jnp.full(top_ref.shape, MASKED_SCORE, jnp.float32)
        total_ref[...] = jnp.zeros(total_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(page < count_ref[pl.program_id(0)])
    def _():
        v = v_ref[...]
        s = jnp.dot(q_ref[...], k_ref[...], preferred_element_type=jnp.float32) * scale  # (Rq,Z)
        s = jnp.where(vis_ref[...] != 0, soft_cap(s, softcap), MASKED_SCORE)
        top = top_ref[...]
        new_top = jnp.maximum(top, jnp.max(s, axis=-1, keepdims=True))
        shrink = jnp.exp(top - new_top)
        e = jnp.exp(s - new_top)
        total_ref[...] = total_ref[...] * shrink + jnp.sum(e, axis=-1, keepdims=True)
        acc_ref[...] = acc_ref[...] * shrink + jnp.dot(e.astype(v.dtype), v, preferred_element_type=jnp.float32)
        top_ref[...] = new_top

    @pl.when(page == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...] / total_ref[...]


def paged_attend(q, pool, view, layer=None, scale=None, softcap=None, window=None, *, interpret: bool = False):
    """`paged.attend` by the kernel: q (S,Hkv,Rq,hd); pool k (R,M+1,Hkv,hd,Z), v (R,M+1,Hkv,Z,hd) or stacked
    with a leading L axis and `layer` an int32 scalar (traced in the scanned step); view a `paged.View`
    (`pages_in_use` unused: each slot stops at its own count). Returns (S,Hkv,Rq,hd) float32."""
    n, kvh, rq, hd = q.shape
    pk, pv = pool.k, pool.v
    if pk.ndim == 5:  # one layer: a unit layer axis (a reshape, no copy)
        pk, pv, layer = pk[None], pv[None], 0
    shards, z, w = pk.shape[1], pk.shape[-1], view.table.shape[1]
    per_shard = n // shards
    scale = hd ** -0.5 if scale is None else scale
    visible = visible_keys(view, window)
    counts = page_counts(visible, z)
    vis = visible.astype(jnp.int32).reshape(n, w, 1, z)  # (1,Z) blocks: TPU tiles want the last two dims whole

    def page_of(i, p, table, count):  # past its count, a slot repeats its last page: no new copy
        return table[i * w + jnp.minimum(p, count[i] - 1)]

    def kv_map(i, h, p, layer_ref, table, count):
        return layer_ref[0], i // per_shard, page_of(i, p, table, count), h, 0, 0

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(n, kvh, w),
        in_specs=[
            pl.BlockSpec((None, None, rq, hd), lambda i, h, p, *_: (i, h, 0, 0)),
            pl.BlockSpec((None, None, None, None, hd, z), kv_map),
            pl.BlockSpec((None, None, None, None, z, hd), kv_map),
            pl.BlockSpec((None, None, 1, z), lambda i, h, p, _, t, count: (i, jnp.minimum(p, count[i] - 1), 0, 0)),
        ],
        out_specs=pl.BlockSpec((None, None, rq, hd), lambda i, h, p, *_: (i, h, 0, 0)),
        scratch_shapes=[pltpu.VMEM((rq, 1), jnp.float32), pltpu.VMEM((rq, 1), jnp.float32),
                        pltpu.VMEM((rq, hd), jnp.float32)],
    )
    call = pl.pallas_call(
        functools.partial(_kernel, scale=float(scale), softcap=None if softcap is None else float(softcap)),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((n, kvh, rq, hd), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )
    layer_arr = jnp.reshape(jnp.asarray(layer, jnp.int32), (1,))
    return call(layer_arr, view.table.reshape(-1).astype(jnp.int32), counts, q, pk, pv, vis)
