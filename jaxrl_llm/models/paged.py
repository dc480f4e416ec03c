"""A paged key/value cache for the one-token decode step (models/decode.py `decode_layer`): the layout, the
write of a step's key/value, and the attention of one new token per slot over the pages of its row. The
sampler that allocates the pages is sampling/paged.py.

Layout, per layer (`Pool`): k (R, M+1, Hkv, hd, Z) and v (R, M+1, Hkv, Z, hd) -- R row shards (the mesh's
rows: each shard's slots read and write only its own pool, so the gathers below never cross a chip), M
pages of Z tokens per shard, keys transposed as in the unpaged cache (`attend_step`'s layout), and one more
page, index M, that takes the writes of the slots that do not step (it is never read). Stacked over layers
with a leading L axis, or an L-tuple of per-layer pools when the decode step is unrolled.

A slot's logical keys are W = Pp + Wg pages (`View.table`): its prompt's Pp pages (shared by the G rows of
the prompt, never copied) then its own completion's pages, taken as it grows. Key j of page w is logical
key w*Z + j; the sampler gives every logical key its coordinate in [left-padded prompt ; completion] --
prompt key p at p, completion token i at P + i -- and whether the slot may see it, so that masks and
sliding windows are exactly those of `attend_step` (a windowed layer masks old keys; the sampler frees
their pages only when every layer is windowed, and a freed page's logical keys are always masked).

XLA path (`attend`): each slot's pages are gathered a block at a time (one layer at a time) and attended
with an online float32 softmax, block after block, only as far as the longest row in flight; the gathered
block is a transient, what stays allocated between steps is the pool. Pallas paths (models/paged_kernel.py
on TPU, models/paged_kernel_gpu.py in Triton's form on GPU): the same attention by a kernel that reads each
slot's pages through the page table itself and stops at the slot's own length. `attention_impl` chooses between them (models/decode.py `paged_attention` runs
the chosen one).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.models.attention import MASKED_SCORE
from jaxrl_llm.models.kernels import soft_cap


BLOCK_PAGES = 8  # logical pages one step of `attend`'s loop reads
# *_interpret: the kernel in Pallas' interpreter (CPU tests)
PAGED_IMPLS = ("xla", "pallas", "pallas_interpret", "triton", "triton_interpret")


class Pool(NamedTuple):
    """One layer's pages (or the stacked layers', with a leading L axis): k (R,M+1,Hkv,hd,Z), v (R,M+1,Hkv,Z,hd)."""
    k: jax.Array
    v: jax.Array


class View(NamedTuple):
    """What one decode step reads of the page tables, for S = R x s slots (slot i in row shard i // s).

    table (S,W) int32: the pool page of each logical page of the slot (its shard's local index);
    write_page, write_offset (S,) int32: where this step's key/value go (page M for a slot that does not step);
    key_pos (S,W*Z) int32: each logical key's coordinate; key_seen (S,W*Z) bool: real, written and visible
    without a window; query_pos (S,) int32: the new token's coordinate; pages_in_use () int32: the most
    logical pages any stepping slot sees (its prompt's and its completion's so far)."""
    table: jax.Array
    write_page: jax.Array
    write_offset: jax.Array
    key_pos: jax.Array
    key_seen: jax.Array
    query_pos: jax.Array
    pages_in_use: jax.Array


def _per_shard(x, shards: int):
    """(S, ...) -> (R, S/R, ...)."""
    return x.reshape(shards, x.shape[0] // shards, *x.shape[1:])


def write(pool: Pool, k, v, view: View, layer=None) -> Pool:
    """The pool with k (S,Hkv,hd) and v (S,Hkv,hd) written at each slot's (write_page, write_offset) [of
    layer `layer` of a stacked pool]."""
    shards = pool.k.shape[-5]
    page, off = _per_shard(view.write_page, shards), _per_shard(view.write_offset, shards)
    k, v = _per_shard(k.astype(pool.k.dtype), shards), _per_shard(v.astype(pool.v.dtype), shards)
    at = () if layer is None else (layer,)
    axis = 0 if layer is None else 1
    put_k = jax.vmap(lambda pk, p, o, x: pk.at[(*at, p, slice(None), slice(None), o)].set(x),
                     in_axes=(axis, 0, 0, 0), out_axes=axis)
    put_v = jax.vmap(lambda pv, p, o, x: pv.at[(*at, p, slice(None), o)].set(x), in_axes=(axis, 0, 0, 0),
                     out_axes=axis)
    return Pool(put_k(pool.k, page, off, k), put_v(pool.v, page, off, v))


def gather(pool: Pool, table, layer=None):
    """Each slot's pages, in logical order: keys (S,Hkv,hd,W*Z), values (S,Hkv,W*Z,hd)."""
    shards = pool.k.shape[-5]
    tab = _per_shard(table, shards)  # (R,s,W)
    at = () if layer is None else (layer,)
    axis = 0 if layer is None else 1
    take = jax.vmap(lambda a, t: a[(*at, t)], in_axes=(axis, 0))
    k, v = take(pool.k, tab), take(pool.v, tab)  # (R,s,W,Hkv,hd,Z), (R,s,W,Hkv,Z,hd)
    r, s, w, kvh, hd, z = k.shape
    keys = k.transpose(0, 1, 3, 4, 2, 5).reshape(r * s, kvh, hd, w * z)
    values = v.transpose(0, 1, 3, 2, 4, 5).reshape(r * s, kvh, w * z, hd)
    return keys, values


def visible_keys(view: View, window=None):
    """(S, W*Z) bool: the keys each slot attends to -- seen, and within the window by positions."""
    visible = view.key_seen
    if window is not None:
        visible = visible & (view.query_pos[:, None] - view.key_pos < window)
    return visible


def page_counts(visible, page_size: int):
    """(S,) int32: the logical pages through each slot's last visible key, at least 1 (a slot that sees no
    key still reads one page, as the XLA path does, so that its output stays finite)."""
    pages = visible.reshape(visible.shape[0], -1, page_size).any(axis=-1)  # (S,W)
    last = jnp.max(jnp.where(pages, jnp.arange(1, pages.shape[1] + 1, dtype=jnp.int32), 0), axis=1)
    return jnp.maximum(last, 1).astype(jnp.int32)


def triton_fits(head_dim: int, page_size: int) -> bool:
    """Whether the Triton-form kernel (models/paged_kernel_gpu.py) takes these shapes: Triton's block
    shapes are powers of two and its dots at least 16 a side."""
    return all(x >= 16 and x & (x - 1) == 0 for x in (head_dim, page_size))


def attention_impl(name: str, backend: str, head_dim: int = 0, page_size: int = 0) -> str:
    """The paged attention a decode step runs for `model.attention = name` on `backend`, where the other
    passes take the backend's kernel: 'pallas' (models/paged_kernel.py) for auto or splash on a TPU,
    'triton' (models/paged_kernel_gpu.py) for auto or cudnn on a GPU when `triton_fits` the head dim and
    page size; else 'xla' (`attend`): on CPU, for xla and blockwise, and for the other GPU shapes."""
    if backend == "tpu" and name in ("auto", "splash"):
        return "pallas"
    if backend == "gpu" and name in ("auto", "cudnn") and triton_fits(head_dim, page_size):
        return "triton"
    return "xla"


def attend(q, pool: Pool, view: View, layer=None, scale=None, softcap=None, window=None,
           block_pages: int = BLOCK_PAGES):
    """Attention of one new token per slot over its pages. q (S,Hkv,Rq,hd) (Rq query heads per KV head);
    the step's key/value already written; window None or an int32 scalar (key seen only if query_pos -
    key_pos < window). Returns (S,Hkv,Rq,hd) float32, as `attend_step` gives on the unpaged cache.

    The logical pages are read `block_pages` at a time, only as far as `view.pages_in_use` (the most any
    slot has), with an online softmax (running max, sum and output in float32): a step's work follows the
    longest row in flight, not the longest a row may grow to."""
    hd, z, w = q.shape[-1], pool.k.shape[-1], view.table.shape[1]
    scale = hd ** -0.5 if scale is None else scale
    bp = min(block_pages, w)
    pad = -(-w // bp) * bp - w
    spare = pool.k.shape[-4] - 1  # page M: never read as a key (masked here)
    table = jnp.pad(view.table, ((0, 0), (0, pad)), constant_values=spare)
    visible = jnp.pad(visible_keys(view, window), ((0, 0), (0, pad * z)))
    blocks = jnp.clip(-(-view.pages_in_use // bp), 1, table.shape[1] // bp)

    def block(b, carry):
        top, total, out = carry
        keys, values = gather(pool, jax.lax.dynamic_slice_in_dim(table, b * bp, bp, axis=1), layer)
        s = soft_cap(jnp.einsum("nkrd,nkdt->nkrt", q, keys, preferred_element_type=jnp.float32) * scale, softcap)
        seen = jax.lax.dynamic_slice_in_dim(visible, b * bp * z, bp * z, axis=1)
        s = jnp.where(seen[:, None, None, :], s, MASKED_SCORE)
        new_top = jnp.maximum(top, jnp.max(s, axis=-1))
        shrink = jnp.exp(top - new_top)
        e = jnp.exp(s - new_top[..., None])
        out = out * shrink[..., None] + jnp.einsum("nkrt,nktd->nkrd", e.astype(values.dtype), values,
                                                   preferred_element_type=jnp.float32)
        return new_top, total * shrink + jnp.sum(e, axis=-1), out

    start = (jnp.full(q.shape[:3], MASKED_SCORE, jnp.float32), jnp.zeros(q.shape[:3], jnp.float32),
             jnp.zeros(q.shape, jnp.float32))
    _, total, out = jax.lax.fori_loop(0, blocks, block, start)
    return out / total[..., None]
