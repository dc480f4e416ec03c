"""The paged decode attention as a Pallas kernel in Triton's form, for GPUs: what models/paged.py `attend`
computes, as models/paged_kernel.py does on TPUs, in the shape Pallas' Triton backend takes.

Triton has no scalar prefetch and no pipeline of BlockSpec copies to steer: a program sees whole arrays
and loads what it indexes. Grid (S, Hkv): one program per slot and KV head walks the slot's pages with a
`fori_loop` that stops at the slot's own page count (its work follows its own length), reading the page
table, the layer and the count as scalars and each page's keys (hd, Z) and values (Z, hd) in place from
the pool. All query heads of the KV head are one (Rq', hd) @ (hd, Z) product per page, Rq' = Rq padded to
a power of two of at least 16 (Triton's shapes are powers of two, its dots at least 16 a side). Online
softmax, masks and MASKED_SCORE as in paged_kernel.py.

Shapes it takes (`paged.triton_fits`): head dim and page size powers of two of at least 16; `paged.attention_impl`
leaves the XLA path to the others. Checked only on CPU: in Pallas' interpreter (tests/test_paged_kernel.py)
and lowered to Triton's dialect through `jax.export` for CUDA; it has not been compiled by Triton for, nor
run on, a GPU.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from jaxrl_llm.models.attention import MASKED_SCORE
from jaxrl_llm.models.kernels import soft_cap
from jaxrl_llm.models.paged import page_counts, visible_keys


def _kernel(layer_ref, table_ref, count_ref, q_ref, k_ref, v_ref, vis_ref, o_ref, *, per_shard: int, scale: float,
            softcap):
    """One (slot, KV head) program: q_ref (Rq',hd); k_ref (L,R,M+1,Hkv,hd,Z), v_ref (L,R,M+1,Hkv,Z,hd) and
    vis_ref (S,W,Z) int32 whole; table_ref (S,W), count_ref (S,), layer_ref (1,) int32; o_ref (Rq',hd) float32."""
    slot, head = pl.program_id(0), pl.program_id(1)
    layer, shard = layer_ref[0], slot // per_shard
    q = q_ref[...]

    def page(p, carry):
        top, total, acc = carry
        at = (layer, shard, table_ref[slot, p], head)
        v = v_ref[at]
        s = jnp.dot(q, k_ref[at], preferred_element_type=jnp.float32) * scale  # (Rq',Z)
        s = jnp.where(vis_ref[slot, p][None, :] != 0, soft_cap(s, softcap), MASKED_SCORE)
        new_top = jnp.maximum(top, jnp.max(s, axis=-1))
        shrink = jnp.exp(top - new_top)
        e = jnp.exp(s - new_top[:, None])
        acc = acc * shrink[:, None] + jnp.dot(e.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return new_top, total * shrink + jnp.sum(e, axis=-1), acc

    rows = q.shape[0]
    start = (jnp.full((rows,), MASKED_SCORE, jnp.float32), jnp.zeros((rows,), jnp.float32),
             jnp.zeros(q.shape, jnp.float32))
    _, total, acc = jax.lax.fori_loop(0, count_ref[slot], page, start)
    o_ref[...] = acc / total[:, None]


def triton_paged_attend(q, pool, view, layer=None, scale=None, softcap=None, window=None, *, interpret: bool = False):
    """`paged.attend` by the Triton-form kernel; arguments and result as paged_kernel.paged_attend."""
    n, kvh, rq, hd = q.shape
    pk, pv = pool.k, pool.v
    if pk.ndim == 5:  # one layer: a unit layer axis (a reshape, no copy)
        pk, pv, layer = pk[None], pv[None], 0
    z, w = pk.shape[-1], view.table.shape[1]
    visible = visible_keys(view, window)
    rows = max(16, 1 << (rq - 1).bit_length())
    qp = jnp.pad(q, ((0, 0), (0, 0), (0, rows - rq), (0, 0)))
    whole = lambda x: pl.BlockSpec(x.shape, lambda i, h: (0,) * x.ndim)
    vis = visible.astype(jnp.int32).reshape(n, w, z)
    table, counts = view.table.astype(jnp.int32), page_counts(visible, z)
    layer_arr = jnp.reshape(jnp.asarray(layer, jnp.int32), (1,))
    args = (layer_arr, table, counts, qp, pk, pv, vis)
    call = pl.pallas_call(
        functools.partial(_kernel, per_shard=n // pk.shape[1], scale=float(hd ** -0.5 if scale is None else scale),
                          softcap=None if softcap is None else float(softcap)),
        grid=(n, kvh),
        in_specs=[*(whole(x) for x in args[:3]), pl.BlockSpec((None, None, rows, hd), lambda i, h: (i, h, 0, 0)),
                  *(whole(x) for x in args[4:])],
        out_specs=pl.BlockSpec((None, None, rows, hd), lambda i, h: (i, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((n, kvh, rows, hd), jnp.float32),
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2),
        interpret=interpret,
    )
    return call(*args)[:, :, :rq]
