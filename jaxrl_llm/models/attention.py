"""Blockwise (flash-style) attention in pure JAX: no (rows, heads, T, T) array, forward or backward.

Shapes: N rows, S query tokens, K keys, H query heads, Hkv key/value heads, R = H/Hkv (GQA: query head
h = kv_head*R + r, as in kernels.dense_attend), hd head dim; B prompts with N = B*G (the shared prefix).

The scores exist one (N, Hkv, block_q, R, block_k) float32 tile at a time. The forward keeps an online
softmax over key blocks (running max, sum and float32 accumulator) and saves only the output and the
log-sum-exp per query; the backward (`jax.custom_vjp`) recomputes each tile's scores from q, k and that
log-sum-exp. Causal passes visit only the key blocks at or below the diagonal: the loops over blocks have
data-independent but per-block trip counts, so blocks above the diagonal are never computed.

Which keys a query sees is given by segment ids: query i sees key j iff q_seg[i] == kv_seg[j], kv_seg[j]
>= 0 and (causal) j <= i. A key mask is kv_seg = -1 on masked keys; packing gives each packed
sequence its own id (positions are RoPE's business, supplied separately). Packing that shares a prompt
among its completions (models/packing.py) adds branch ids: key j is then also visible only if its branch
is 0 (the segment's shared prompt) or the query's own. A query with no visible key
(a fully padded row) gets zeros and a log-sum-exp of `EMPTY_LSE`: finite, never NaN, in both passes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import precision

EMPTY_LSE = float(np.finfo(np.float32).min)  # log-sum-exp of a query that sees no key
# The score of a masked key, in every implementation and in decoding: finite, so that the max/exp of an
# all-masked row or tile stays finite (no NaN).
MASKED_SCORE = EMPTY_LSE

DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_K = 256


def _key_block_start(i, bq, bk, causal, window, off=0):
    """First key block query block i needs: 0, or (causal, windowed) the first within the window. off: the
    queries' first index among the keys (a causal pass whose queries are a later slice of the keys)."""
    if not causal or window is None:
        return 0
    return jnp.maximum(0, off + i * bq - window + 1) // bk


def _query_block_stop(j, bq, bk, nq, causal, window, off=0):
    """One past the last query block key block j is seen by (the transpose of `_key_block_start`)."""
    if not causal or window is None:
        return nq
    return jnp.clip((j * bk + bk + window - 2 - off) // bq + 1, 0, nq)


def _key_block_stop(i, bq, bk, nk, causal, off=0):
    """One past the last key block query block i needs: all of them, or those at or below the diagonal."""
    if not causal:
        return nk
    return jnp.minimum(nk, (off + i * bq + bq - 1) // bk + 1)


def _query_block_start(j, bq, bk, causal, off=0):
    """First query block that needs key block j (the transpose of `_key_block_stop`)."""
    return jnp.maximum(0, j * bk - off) // bq if causal else 0


def _tile(q_blk, k_blk, q_seg, kv_seg, q0, k0, scale, causal, softcap=None, win=None, br=None):
    """Scores of one tile, which of them are visible, and d(capped score)/d(raw score).

    q_blk (N,Hkv,bq,R,hd), k_blk (N,Hkv,bk,hd), q_seg (N,bq), kv_seg (N,bk) int32; q0, k0 the tile's first
    query/key index; win None or (q_idx (N,bq), kv_idx (N,bk), window): key j visible only if
    q_idx - kv_idx < window; br None or (q_branch (N,bq), kv_branch (N,bk)): key j visible only if its
    branch is 0 or the query's. Returns s (N,Hkv,bq,R,bk) float32 (soft-capped) with masked entries at
    MASKED_SCORE, valid broadcastable to it: (N,1,bq,1,bk) bool, and the cap's derivative (1 without cap).
    """
    s = jnp.einsum("nkqrd,nkcd->nkqrc", q_blk, k_blk, preferred_element_type=jnp.float32) * scale
    dcap = 1.0
    if softcap is not None:
        t = jnp.tanh(s / softcap)
        s, dcap = t * softcap, 1.0 - t * t
    valid = (q_seg[:, :, None] == kv_seg[:, None, :]) & (kv_seg[:, None, :] >= 0)
    if br is not None:
        q_br, kv_br = br
        valid = valid & ((kv_br[:, None, :] == 0) | (kv_br[:, None, :] == q_br[:, :, None]))
    if causal:
        qi = q0 + jnp.arange(q_seg.shape[1])
        kj = k0 + jnp.arange(kv_seg.shape[1])
        valid = valid & (qi[:, None] >= kj[None, :])[None]
    if win is not None:
        q_idx, kv_idx, window = win
        valid = valid & (q_idx[:, :, None] - kv_idx[:, None, :] < window)
    valid = valid[:, None, :, None, :]
    return jnp.where(valid, s, MASKED_SCORE), valid, dcap


def _layout(q, k, v, q_seg, kv_seg, bq, bk):
    """Head-major, padded to whole blocks: q (N,Hkv,Sp,R,hd), k/v (N,Hkv,Kp,hd), segs padded (keys with -1)."""
    n, s, h, hd = q.shape
    kvh = k.shape[2]
    sp, kp = -(-s // bq) * bq, -(-k.shape[1] // bk) * bk
    qh = q.reshape(n, s, kvh, h // kvh, hd).transpose(0, 2, 1, 3, 4)
    qh = jnp.pad(qh, ((0, 0), (0, 0), (0, sp - s), (0, 0), (0, 0)))
    pad_k = lambda x: jnp.pad(x.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, kp - x.shape[1]), (0, 0)))
    q_seg = jnp.pad(q_seg.astype(jnp.int32), ((0, 0), (0, sp - s)), constant_values=-2)
    kv_seg = jnp.pad(kv_seg.astype(jnp.int32), ((0, 0), (0, kp - k.shape[1])), constant_values=-1)
    return qh, pad_k(k), pad_k(v), q_seg, kv_seg


def _blocks(q, k, block_q, block_k):
    """(bq, bk, nq, nk): the fewest blocks of at most block_q / block_k tokens, all of one size, so that the
    padding of the last one is < the block count (384 tokens by 256: two blocks of 192, not 2 x 256)."""
    even = lambda t, b: -(-t // -(-t // max(1, b)))
    bq, bk = even(q.shape[1], block_q), even(k.shape[1], block_k)
    return bq, bk, -(-q.shape[1] // bq), -(-k.shape[1] // bk)


def _win_layout(win, s, kp, sp):
    """The window's index arrays padded to whole blocks (padding is masked by the segment ids anyway)."""
    if win is None:
        return None
    q_idx, kv_idx, window = win
    pad = lambda x, t: jnp.pad(x.astype(jnp.int32), ((0, 0), (0, t - x.shape[1])))
    return pad(q_idx, sp), pad(kv_idx, kp), window


def _tile_windows(win, branches, s, bq, bk, nq, nk):
    """(the window that bounds which key blocks a query block visits, or None; tile_win(i, j): tile (i, j)'s
    query and key index slices and the window, or None without a window; tile_br(i, j): its branch ids, or
    None), shared by the forward and the backward pass. With branches a window is measured in positions
    that jump between branches, so no key block is skipped for it (the mask still applies it)."""
    win_p = _win_layout(win, s, nk * bk, nq * bq)
    tile_win = lambda i, j: None if win_p is None else (
        jax.lax.dynamic_slice_in_dim(win_p[0], i * bq, bq, axis=1),
        jax.lax.dynamic_slice_in_dim(win_p[1], j * bk, bk, axis=1), win_p[2])
    br_p = _win_layout(None if branches is None else (*branches, None), s, nk * bk, nq * bq)
    tile_br = lambda i, j: None if br_p is None else (
        jax.lax.dynamic_slice_in_dim(br_p[0], i * bq, bq, axis=1),
        jax.lax.dynamic_slice_in_dim(br_p[1], j * bk, bk, axis=1))
    return (None if win is None or branches is not None else win[2]), tile_win, tile_br


def _forward(q, k, v, q_seg, kv_seg, win, branches, q_offset, causal, block_q, block_k, scale, softcap):
    n, s, h, hd = q.shape
    bq, bk, nq, nk = _blocks(q, k, block_q, block_k)
    qh, kh, vh, q_seg_p, kv_seg_p = _layout(q, k, v, q_seg, kv_seg, bq, bk)
    scale = hd ** -0.5 if scale is None else scale
    window, tile_win, tile_br = _tile_windows(win, branches, s, bq, bk, nq, nk)
    off = 0 if q_offset is None else q_offset
    slice_k = lambda x, j: jax.lax.dynamic_slice_in_dim(x, j * bk, bk, axis=x.ndim - 2 if x.ndim == 4 else 1)

    def query_block(i):
        q_blk = jax.lax.dynamic_slice_in_dim(qh, i * bq, bq, axis=2)
        qs = jax.lax.dynamic_slice_in_dim(q_seg_p, i * bq, bq, axis=1)

        def key_block(j, carry):
            m, l, acc = carry
            sc, valid, _ = _tile(q_blk, slice_k(kh, j), qs, slice_k(kv_seg_p, j), off + i * bq, j * bk, scale, causal,
                                 softcap, tile_win(i, j), tile_br(i, j))
            m_new = jnp.maximum(m, jnp.max(sc, axis=-1))
            p = jnp.where(valid, jnp.exp(sc - m_new[..., None]), 0.0)
            corr = jnp.exp(m - m_new)
            pv = jnp.einsum("nkqrc,nkcd->nkqrd", p.astype(vh.dtype), slice_k(vh, j),
                            preferred_element_type=jnp.float32)
            return m_new, l * corr + jnp.sum(p, axis=-1), acc * corr[..., None] + pv

        shape = q_blk.shape[:-1]
        init = (jnp.full(shape, MASKED_SCORE, jnp.float32), jnp.zeros(shape, jnp.float32),
                jnp.zeros(q_blk.shape, jnp.float32))
        m, l, acc = jax.lax.fori_loop(_key_block_start(i, bq, bk, causal, window, off),
                                      _key_block_stop(i, bq, bk, nk, causal, off), key_block, init)
        seen = l > 0
        out = acc / jnp.where(seen, l, 1.0)[..., None]
        return out.astype(q.dtype), jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), EMPTY_LSE)

    out, lse = jax.lax.map(query_block, jnp.arange(nq))  # (nq,N,Hkv,bq,R,hd), (nq,N,Hkv,bq,R)
    out = out.transpose(1, 0, 3, 2, 4, 5).reshape(n, nq * bq, h, hd)[:, :s]
    lse = lse.transpose(1, 0, 3, 2, 4).reshape(n, nq * bq, h)[:, :s]
    return out, lse


def _backward(causal, block_q, block_k, scale, softcap, res, cotangents):
    q, k, v, q_seg, kv_seg, win, branches, q_offset, out, lse = res
    off = 0 if q_offset is None else q_offset
    d_out, d_lse = cotangents
    n, s, h, hd = q.shape
    kvh, r = k.shape[2], h // k.shape[2]
    bq, bk, nq, nk = _blocks(q, k, block_q, block_k)
    qh, kh, vh, q_seg_p, kv_seg_p = _layout(q, k, v, q_seg, kv_seg, bq, bk)
    scale = hd ** -0.5 if scale is None else scale
    window, tile_win, tile_br = _tile_windows(win, branches, s, bq, bk, nq, nk)
    sp = nq * bq
    rows = lambda x: jnp.pad(x.reshape(n, s, kvh, r, *x.shape[3:]).swapaxes(1, 2),
                             ((0, 0), (0, 0), (0, sp - s), (0, 0)) + ((0, 0),) * (x.ndim - 3))
    doh = rows(d_out.astype(q.dtype))
    # D_i = sum_d dO*O, minus the log-sum-exp's own cotangent: d lse_i / d s_ij = p_ij.
    delta = rows(jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1) - d_lse)
    lse_h = rows(lse)
    q_slice = lambda x, i: jax.lax.dynamic_slice_in_dim(x, i * bq, bq, axis=2)

    def key_block(dq, j):
        k_blk = jax.lax.dynamic_slice_in_dim(kh, j * bk, bk, axis=2)
        v_blk = jax.lax.dynamic_slice_in_dim(vh, j * bk, bk, axis=2)
        ks = jax.lax.dynamic_slice_in_dim(kv_seg_p, j * bk, bk, axis=1)

        def query_block(i, carry):
            dq, dk, dv = carry
            q_blk, do_blk = q_slice(qh, i), q_slice(doh, i)
            qs = jax.lax.dynamic_slice_in_dim(q_seg_p, i * bq, bq, axis=1)
            sc, valid, dcap = _tile(q_blk, k_blk, qs, ks, off + i * bq, j * bk, scale, causal, softcap, tile_win(i, j),
                                    tile_br(i, j))
            p = jnp.where(valid, jnp.exp(sc - q_slice(lse_h, i)[..., None]), 0.0)
            dv = dv + jnp.einsum("nkqrc,nkqrd->nkcd", p.astype(v.dtype), do_blk, preferred_element_type=jnp.float32)
            dp = jnp.einsum("nkqrd,nkcd->nkqrc", do_blk, v_blk, preferred_element_type=jnp.float32)
            ds = (p * (dp - q_slice(delta, i)[..., None]) * dcap * scale).astype(q.dtype)
            dk = dk + jnp.einsum("nkqrc,nkqrd->nkcd", ds, q_blk, preferred_element_type=jnp.float32)
            dq_blk = jnp.einsum("nkqrc,nkcd->nkqrd", ds, k_blk, preferred_element_type=jnp.float32)
            dq = jax.lax.dynamic_update_slice_in_dim(dq, q_slice(dq, i) + dq_blk, i * bq, axis=2)
            return dq, dk, dv

        zeros = jnp.zeros(k_blk.shape, jnp.float32)
        dq, dk, dv = jax.lax.fori_loop(_query_block_start(j, bq, bk, causal, off),
                                       _query_block_stop(j, bq, bk, nq, causal, window, off), query_block,
                                       (dq, zeros, zeros))
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(key_block, jnp.zeros(qh.shape, jnp.float32), jnp.arange(nk))
    dq = dq.transpose(0, 2, 1, 3, 4).reshape(n, sp, h, hd)[:, :s].astype(q.dtype)
    unblock = lambda x, like: x.transpose(1, 0, 3, 2, 4).reshape(n, nk * bk, kvh, hd)[:, :like.shape[1]].astype(like.dtype)
    return dq, unblock(dk, k), unblock(dv, v), None, None, None, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def flash_attention(q, k, v, q_segment_ids, kv_segment_ids, causal=True, block_q=DEFAULT_BLOCK_Q,
                    block_k=DEFAULT_BLOCK_K, scale=None, softcap=None, win=None, branches=None, q_offset=None):
    """Softmax attention by blocks, with GQA; float32 softmax and accumulation.

    q (N,S,H,hd); k, v (N,K,Hkv,hd), same dtype as q; q_segment_ids (N,S) int; kv_segment_ids (N,K) int,
    negative on masked keys. Query i sees key j iff the segment ids are equal, kv_segment_ids[j] >= 0 and,
    when `causal` (S == K), j <= i. Block sizes need not divide S or K; a block larger than the sequence
    is clamped to it. Returns (out (N,S,H,hd) in q.dtype, lse (N,S,H) float32): both differentiable;
    a query that sees no key gets out = 0 and lse = EMPTY_LSE. win: None or (q_idx (N,S), kv_idx (N,K) int,
    window int32 scalar): query i also needs q_idx[i] - kv_idx[j] < window; causal passes take the
    indices to be the positions 0.. and skip the key blocks wholly outside the window. scale: of the
    scores (default hd ** -0.5); softcap: scores -> softcap * tanh(scores / softcap), before the mask.
    branches: None or (q_branch (N,S), kv_branch (N,K) int): key j also needs branch 0 or the query's
    (a prompt shared by its completions in one packed segment); a window then skips no key block.
    q_offset: None or an int32 scalar (traced) o: the queries are the keys o, o+1, .. of a longer row
    (S <= K): causal means j <= o + i, and the causal block skipping follows (models/context.py's
    sequence shards, whose queries are one slice of the gathered row).
    """
    with precision.precision_for(q.dtype):
        return _forward(q, k, v, q_segment_ids, kv_segment_ids, win, branches, q_offset, causal, block_q, block_k, scale,
                        softcap)


# float32 operands get float32 products (models/precision.py). The custom VJP's rules are traced when the
# gradient is taken, after the model function and its precision context returned: they say so themselves.
def _flash_fwd(q, k, v, q_seg, kv_seg, causal, block_q, block_k, scale, softcap, win, branches, q_offset):
    with precision.precision_for(q.dtype):
        out, lse = _forward(q, k, v, q_seg, kv_seg, win, branches, q_offset, causal, block_q, block_k, scale,
                            softcap)
    return (out, lse), (q, k, v, q_seg, kv_seg, win, branches, q_offset, out, lse)


def _flash_bwd(causal, block_q, block_k, scale, softcap, res, cotangents):
    with precision.precision_for(res[0].dtype):
        return _backward(causal, block_q, block_k, scale, softcap, res, cotangents)


flash_attention.defvjp(_flash_fwd, _flash_bwd)


def split_segments(segment_ids):
    """(segment ids or None, branch ids or None) of `segment_ids`: None, an (N,S) array, or a (segment,
    branch) pair for packed rows whose prompt is shared by its completions (models/packing.py)."""
    if isinstance(segment_ids, (tuple, list)):
        return segment_ids[0], segment_ids[1]
    return segment_ids, None


def merge(out_a, lse_a, out_b, lse_b):
    """Softmax over the union of two disjoint key sets from each one's (out (...,hd), lse (...)).

    Exact: out = (out_a e^lse_a + out_b e^lse_b) / (e^lse_a + e^lse_b). Two empty sets give zeros.
    Returns float32 (out, lse)."""
    lse = jnp.logaddexp(lse_a, lse_b)
    wa, wb = jnp.exp(lse_a - lse)[..., None], jnp.exp(lse_b - lse)[..., None]
    return out_a.astype(jnp.float32) * wa + out_b.astype(jnp.float32) * wb, lse


def blockwise_attend(q, k, v, key_mask, segment_ids=None, prefix=None, *, block_q=DEFAULT_BLOCK_Q,
                     block_k=DEFAULT_BLOCK_K, scale=None, softcap=None, window=None, positions=None):
    """Causal self-attention among the S tokens [+ a shared prompt prefix], blockwise. Same contract as
    kernels.dense_attend, with the mask given by its parts instead of a dense (N,S,S) array.

    q (N,S,H,hd); k, v (N,S,Hkv,hd); key_mask (N,S) bool: the real tokens; segment_ids None, (N,S) int
    >= 0 (a query sees only keys of its own segment), or a (segment, branch) pair of them (kernels.py: a
    shared prompt's packed completions; the window then measures `positions`). prefix: None or (pk, pv, pmask), pk/pv (B,P,Hkv,hd),
    pmask (B,P) bool, row n = b*G + g sees prompt b; the G rows' queries are grouped per prompt against
    the prefix keys (never copied G times) and merged with the self part by log-sum-exp. scale, softcap,
    window as in kernels.attend. Returns (N,S,H,hd).
    """
    n, s, h, hd = q.shape
    segment_ids, branch = split_segments(segment_ids)
    seg = jnp.zeros((n, s), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    kv_seg = jnp.where(key_mask.astype(bool), seg, -1)
    idx = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (n, s))
    if branch is not None:  # branches interleave: distances are positions, not indices
        idx = positions.astype(jnp.int32)
    win = None if window is None else (idx, idx, window)
    branches = None if branch is None else (branch.astype(jnp.int32),) * 2
    out, lse = flash_attention(q, k, v, seg, kv_seg, True, block_q, block_k, scale, softcap, win, branches)
    if prefix is None:
        return out
    pk, pv, pmask = prefix
    b = pk.shape[0]
    qg = q.reshape(b, (n // b) * s, h, hd)
    p_win = None if window is None else (  # by positions (kernels.attend): query minus real-prompt position
        positions.reshape(qg.shape[:2]).astype(jnp.int32),
        jnp.cumsum(pmask.astype(jnp.int32), axis=-1) - 1, window)
    p_out, p_lse = flash_attention(qg, pk, pv, jnp.zeros(qg.shape[:2], jnp.int32),
                                   jnp.where(pmask.astype(bool), 0, -1), False, block_q, block_k,
                                   scale, softcap, p_win)
    merged, _ = merge(out, lse, p_out.reshape(n, s, h, hd), p_lse.reshape(n, s, h))
    return merged.astype(q.dtype)
