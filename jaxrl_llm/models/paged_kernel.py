"""The paged decode attention as a Pallas TPU kernel: what models/paged.py `attend` computes (one new token
per slot over the pages of its row; layout and masks there), with the page table read by the kernel itself
instead of gathered by XLA.

Grid (S, Hkv, ceil(W/bp)): slot x KV head x block of bp logical pages (`BLOCK_PAGES`, as the XLA path's
loop). The page table, the layer index and each slot's page count are scalar-prefetched
(`pltpu.PrefetchScalarGridSpec`); the pool is given bp times, key and value operand j's BlockSpec index map
looking page b*bp + j of the slot up in the table, so that the pipeline copies exactly the slot's pages
from HBM, a block at a time, and never another slot's. All Rq query heads of a KV head are one
(Rq, hd) @ (hd, Z) product per page, the keys being stored (hd, Z) for that. The softmax is online: running
max, sum and output in float32 VMEM scratch, page after page (the block axis innermost, "arbitrary").

A slot's own page count (through its last visible key) stops its work: past it the index maps repeat its
last page (the pipeline skips a copy whose block index did not change) and the page's update is skipped,
so a step costs each slot's own length, not the longest row's (the XLA path reads as far as the longest
row in flight).

Masks as in the XLA path: `key_seen`, the sliding window by positions (query_pos - key_pos < window), the
soft cap on the scaled scores; masked scores are MASKED_SCORE, not -inf, so a page whose keys are all
masked (a left-padded prompt's first page) leaves the running sums as the XLA path's do.

On a mesh the kernel runs in shard_map (`mesh_paged_attend`): XLA does not partition a Pallas call.

TPU only (`paged.attention_impl` chooses it there; GPUs get models/paged_kernel_gpu.py, the same
attention in Triton's form). `interpret=True` runs the same kernel in Pallas' interpreter, which with
Pallas' lowering to Mosaic's TPU dialect (`jax.export`, tests/test_paged_kernel.py) is all it has been
through: it has not been compiled by Mosaic nor timed on a TPU. Every block spans the whole trailing two
dims of its array, as Mosaic's block rule allows for any size; whether it compiles the small products of
every shape (Rq = 7 query heads, pages of Z = 16 keys) is untried. The flattened table (S*W int32) sits
in SMEM whole.
"""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as Spec

from jaxrl_llm.models.attention import MASKED_SCORE
from jaxrl_llm.models.kernels import soft_cap
from jaxrl_llm.models.paged import BLOCK_PAGES, View, page_counts, visible_keys


def _online_page(q_ref, k_ref, v_ref, vis_ref, top_ref, total_ref, acc_ref, scale: float, softcap):
    """One page into the running softmax: q_ref (Rq,hd); k_ref (hd,Z); v_ref (Z,hd); vis_ref (1,Z) int32;
    scratch top, total (Rq,1), acc (Rq,hd) float32."""
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


def _kernel(layer_ref, table_ref, count_ref, q_ref, *refs, block_pages: int, scale: float, softcap):
    """One (slot, KV head, block of pages) step: refs are the block's `block_pages` key, value and
    visibility blocks (`_online_page`), then o_ref (Rq,hd) float32 (written at the last block) and the
    scratch top, total, acc."""
    del layer_ref, table_ref  # read by the index maps
    bp = block_pages
    ks, vs, vis, (o_ref, top_ref, total_ref, acc_ref) = refs[:bp], refs[bp:2 * bp], refs[2 * bp:3 * bp], refs[3 * bp:]
    block = pl.program_id(2)

    @pl.when(block == 0)
    def _():
        top_ref[...] = jnp.full(top_ref.shape, MASKED_SCORE, jnp.float32)
        total_ref[...] = jnp.zeros(total_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    count = count_ref[pl.program_id(0)]
    for j in range(bp):  # static: one page at a time, in logical order, while the slot has pages
        pl.when(block * bp + j < count)(
            functools.partial(_online_page, q_ref, ks[j], vs[j], vis[j], top_ref, total_ref, acc_ref, scale, softcap))

    @pl.when(block == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...] / total_ref[...]


def paged_attend(q, pool, view, layer=None, scale=None, softcap=None, window=None, *,
                 block_pages: int = BLOCK_PAGES, interpret: bool = False):
    """`paged.attend` by the kernel: q (S,Hkv,Rq,hd); pool k (R,M+1,Hkv,hd,Z), v (R,M+1,Hkv,Z,hd) or stacked
    with a leading L axis and `layer` an int32 scalar (traced in the scanned step); view a `paged.View`
    (`pages_in_use` unused: each slot stops at its own count); `block_pages` logical pages per grid step.
    Returns (S,Hkv,Rq,hd) float32."""
    n, kvh, rq, hd = q.shape
    pk, pv = pool.k, pool.v
    if pk.ndim == 5:  # one layer: a unit layer axis (a reshape, no copy)
        pk, pv, layer = pk[None], pv[None], 0
    shards, z, w = pk.shape[1], pk.shape[-1], view.table.shape[1]
    per_shard = n // shards
    bp = min(block_pages, w)
    blocks = -(-w // bp)
    scale = hd ** -0.5 if scale is None else scale
    visible = visible_keys(view, window)
    counts = page_counts(visible, z)
    vis = visible.astype(jnp.int32).reshape(n, w, 1, z)  # (1,Z) blocks: TPU tiles want the last two dims whole

    def logical(i, b, j, count):  # past its count a slot repeats its last page: the pipeline copies nothing new
        return jnp.minimum(b * bp + j, count[i] - 1)

    def kv_spec(shape, j):
        return pl.BlockSpec((None, None, None, None, *shape), lambda i, h, b, layer_ref, table, count: (
            layer_ref[0], i // per_shard, table[i * w + logical(i, b, j, count)], h, 0, 0))

    def vis_spec(j):
        return pl.BlockSpec((None, None, 1, z), lambda i, h, b, _, t, count: (i, logical(i, b, j, count), 0, 0))

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(n, kvh, blocks),
        in_specs=[pl.BlockSpec((None, None, rq, hd), lambda i, h, b, *_: (i, h, 0, 0)),
                  *(kv_spec((hd, z), j) for j in range(bp)), *(kv_spec((z, hd), j) for j in range(bp)),
                  *(vis_spec(j) for j in range(bp))],
        out_specs=pl.BlockSpec((None, None, rq, hd), lambda i, h, b, *_: (i, h, 0, 0)),
        scratch_shapes=[pltpu.VMEM((rq, 1), jnp.float32), pltpu.VMEM((rq, 1), jnp.float32),
                        pltpu.VMEM((rq, hd), jnp.float32)],
    )
    call = pl.pallas_call(
        functools.partial(_kernel, block_pages=bp, scale=float(scale),
                          softcap=None if softcap is None else float(softcap)),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((n, kvh, rq, hd), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )
    layer_arr = jnp.reshape(jnp.asarray(layer, jnp.int32), (1,))
    return call(layer_arr, view.table.reshape(-1).astype(jnp.int32), counts, q, *(pk,) * bp, *(pv,) * bp,
                *(vis,) * bp)


def _rule(name: str) -> tuple:
    """The mesh axes (maybe none) the logical axis `name` maps to under the active rules."""
    axes = dict(nn.get_logical_axis_rules()).get(name)
    return () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))


def mesh_paged_attend(q, pool, view, layer=None, scale=None, softcap=None, window=None, *, kernel=None, **kw):
    """`kernel` (default `paged_attend`; or paged_kernel_gpu's) on the active mesh, in shard_map: XLA cannot partition a Pallas call, and left to
    itself would bring the whole pool to every chip. Slots and the pool's row shards go over the mesh
    axes of the logical `batch` (when they divide both: each chip's slots then read only its own pools,
    as in the sampler's layout), KV heads over those of `act_heads` (when they divide them), the rest
    replicated. Outside a mesh (or on one chip), the kernel itself. Arguments and result as `paged_attend`."""
    mesh = jax.sharding.get_abstract_mesh()
    run = functools.partial(kernel or paged_attend, scale=scale, softcap=softcap, **kw)
    if mesh.empty or mesh.size == 1:
        return run(q, pool, view, layer, window=window)
    size = lambda axes: math.prod(mesh.shape[a] for a in axes)
    rows, heads = _rule("batch"), _rule("act_heads")
    rows = rows if q.shape[0] % size(rows) == 0 and pool.k.shape[-5] % size(rows) == 0 else ()
    heads = heads if q.shape[1] % size(heads) == 0 else ()
    rows, heads = rows or None, heads or None
    lead = (None,) * (pool.k.ndim - 5)  # the stacked pool's layer axis
    slot = Spec(rows)
    specs = (Spec(rows, heads), type(pool)(*(Spec(*lead, rows, None, heads),) * 2),
             View(*(slot,) * 6, Spec()), Spec(), Spec())
    body = lambda q, pool, view, layer, window: run(q, pool, view, layer, window=window)
    # the optional scalars travel as arguments (None is an empty tree: no spec needed)
    return jax.shard_map(body, in_specs=specs, out_specs=Spec(rows, heads), check_vma=False)(
        q, pool, view, layer, window)
