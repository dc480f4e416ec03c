"""The splash and cuDNN kernels under the sequence axis (models/context.py `sequence_attend`, `impl` splash or
cudnn): each shard's two query chunks, chunk i and chunk 2C-1-i of the row (c tokens each), attend to the
gathered row [and the gathered prompt prefix]. Shapes as in context.py.

Both kernels take static masks only, and a chunk's offset in the row depends on the shard index, which is
traced inside shard_map. `by_shard` runs `lax.switch` on the shard index with one branch per shard, each
built with the static offsets of its two chunks (j*c and (2C-1-j)*c): every branch is compiled, one runs.

  * splash: a chunk at offset o is the kernel's (c x keys) `CausalMask` / `LocalMask` with `offset=o` (query
    i stands at key index i + o): block-sparse, the tiles above the chunk's diagonal [and outside its window]
    are skipped, so the zigzag layout's balance holds. Key mask, packing and padding are splash segment ids
    of different lengths for queries and keys (real token of segment s -> s + 1, masked -> 0). A prompt
    prefix is inlined in front of every row's keys (as splash.py does on one device; its real keys last, so
    that index distances are position distances): splash's log-sum-exp (`save_residuals`) has no backward,
    so the prefix cannot be attended apart and merged. Soft caps are the kernel's.
  * cudnn: `jax.nn.dot_product_attention`'s causal flag is aligned top-left (query i sees keys <= i, in
    JAX's reference as in cuDNN) and takes no offset; a right window needs that flag in cuDNN; its
    log-sum-exp residual has no backward (its cotangent is dropped), so parts cannot be merged. What remains
    is the chunk's queries with o zero queries in front (native causal, but (o+c)^2/2 work: the last chunk
    costs a whole row's causal attention, undoing the zigzag balance) or an explicit mask: taken here. The
    chunk reads only keys[: o+c] (a static slice per branch: nothing above its diagonal is computed), under
    an (N,1,c,[P+]o+c) boolean mask holding causality at the offset, the key mask, segment and branch ids
    and the window; summed over a shard's two chunks about 1/(2C) of the one-device (S,S) mask. The prefix
    is inlined as more masked keys. No soft cap (as on one device: choose_attention refuses it).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxrl_llm.models.prefix import with_static_window


def by_shard(shards: int, c: int, axis: str, run):
    """(N,2c,H,hd): run(part, offset) for this shard's query chunks part 0 and 1, each (N,c,H,hd), at their
    static offsets in the row, by `lax.switch` on the shard index (one branch per shard)."""
    def branch(j):
        offsets = (j * c, (2 * shards - 1 - j) * c)
        return lambda: jnp.concatenate([run(part, offsets[part]) for part in (0, 1)], axis=1)
    return lax.switch(lax.axis_index(axis), [branch(j) for j in range(shards)])


def _pad_to(x, length: int):
    return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def _rows(x, n: int):
    """A prompt's (B,...) array repeated for its n // B rows (row n = b*G + g sees prompt b)."""
    return jnp.repeat(x, n // x.shape[0], axis=0)


def splash_chunks(q, k, v, q_ids, kv_ids, prefix=None, *, shards: int, axis: str, window=None, window_size=None,
                  softcap=None, scale=None, interpret: bool = False):
    """q (N,2c,H,hd) this shard's chunks; k, v (N,S,Hkv,hd) the gathered row; q_ids (N,2c), kv_ids (N,S) splash
    segment ids (0 masked, segment + 1 real); prefix None or the gathered (pk, pv, pmask (B,P) bool).
    window: None, an int or a traced scalar (then `window_size` is the static one: prefix.with_static_window).
    `interpret`: Pallas' interpreter (CPU tests). Returns (N,2c,H,hd), zeros at masked queries."""
    from jaxrl_llm.models.splash import BLOCK, splash_kernel  # TPU-only kernel: imported where it runs
    n, s, h, hd = q.shape
    c, p = s // 2, 0
    if prefix is not None:  # real prompt keys last, in their order (prefix.inline_prefix)
        pk, pv, pmask = prefix
        order = jnp.argsort(pmask, axis=1, stable=True)
        pk, pv = (jnp.take_along_axis(x, order[:, :, None, None], axis=1) for x in (pk, pv))
        pmask = jnp.take_along_axis(pmask, order, axis=1)
        k, v = (jnp.concatenate([_rows(a, n).astype(b.dtype), b], axis=1) for a, b in ((pk, k), (pv, v)))
        kv_ids = jnp.concatenate([_rows(pmask.astype(kv_ids.dtype), n), kv_ids], axis=1)
        p = pk.shape[1]
    up = lambda t: -(-t // BLOCK) * BLOCK  # the kernel's tiles divide both lengths
    kp, cp = up(k.shape[1]), up(c)
    kh, vh = (_pad_to(x, kp).transpose(0, 2, 1, 3) for x in (k, v))
    kv_ids = _pad_to(kv_ids, kp)
    q = q * jnp.asarray(hd ** -0.5 if scale is None else scale, q.dtype)  # the kernel does not scale
    cap = None if softcap is None else float(softcap)
    static = (window,) if window is None or isinstance(window, int) else (window_size, None)
    offsets = {o for j in range(shards) for o in (j * c, (2 * shards - 1 - j) * c)}
    # Built before lax.switch / lax.cond trace their branches, which close over them (splash.py).
    kernels = {(o, w): splash_kernel(h, kp, interpret, w, cap, q_length=cp, offset=p + o)
               for o in offsets for w in static}

    def run(part, o):
        qc = _pad_to(q[:, part * c:(part + 1) * c], cp).transpose(0, 2, 1, 3)
        ids = _pad_to(q_ids[:, part * c:(part + 1) * c], cp)

        def one(w):
            kernel, sk = kernels[(o, w)]
            return jax.vmap(kernel)(qc, kh, vh, sk.SegmentIds(q=ids, kv=kv_ids))
        return with_static_window(one, window, window_size).transpose(0, 2, 1, 3)[:, :c]
    out = by_shard(shards, c, axis, run)
    return jnp.where(q_ids[:, :, None, None] > 0, out, 0).astype(q.dtype)


def cudnn_chunks(q, k, v, q_seg, kv_seg, prefix=None, *, shards: int, axis: str, window=None, positions=None,
                 positions_all=None, branch=None, branch_all=None, scale=None, implementation: str = "cudnn"):
    """q (N,2c,H,hd) this shard's chunks; k, v (N,S,Hkv,hd) the gathered row; q_seg (N,2c) the queries'
    segment ids, kv_seg (N,S) the keys' (-1: masked); prefix None or the gathered (pk, pv, pmask (B,P) bool);
    window None or a scalar: by global index, or with branch ids (branch (N,2c), branch_all (N,S)) by
    positions (positions (N,2c), positions_all (N,S)); the prefix's by positions, as kernels.attend.
    `implementation`: 'xla' runs JAX's reference of the same call (CPU tests). Returns (N,2c,H,hd), zeros
    where a query sees no key."""
    n, s = q.shape[:2]
    c = s // 2
    if prefix is not None:
        pk, pv, pmask = prefix
        pk, pv = (_rows(x, n).astype(k.dtype) for x in (pk, pv))
        p_pos = _rows(jnp.cumsum(pmask.astype(jnp.int32), axis=1) - 1, n)  # kernels.prefix_positions
        pmask = _rows(pmask, n)

    def run(part, o):
        cut = lambda x: None if x is None else x[:, part * c:(part + 1) * c]
        keys, q_idx = o + c, o + jnp.arange(c)
        mask = (q_idx[:, None] >= jnp.arange(keys))[None] & (cut(q_seg)[:, :, None] == kv_seg[:, None, :keys])
        if window is not None:
            if branch is None:
                mask = mask & (q_idx[:, None] - jnp.arange(keys) < window)[None]
            else:
                mask = mask & (cut(positions)[:, :, None] - positions_all[:, None, :keys] < window)
        if branch is not None:
            mask = mask & ((branch_all[:, None, :keys] == 0) | (cut(branch)[:, :, None] == branch_all[:, None, :keys]))
        kc, vc = k[:, :keys], v[:, :keys]
        if prefix is not None:
            pvis = jnp.broadcast_to(pmask[:, None, :], (n, c, pmask.shape[1]))
            if window is not None:
                pvis = pvis & (cut(positions)[:, :, None] - p_pos[:, None, :] < window)
            mask = jnp.concatenate([pvis, mask], axis=-1)
            kc, vc = jnp.concatenate([pk, kc], axis=1), jnp.concatenate([pv, vc], axis=1)
        # cuDNN's backward with a mask (a bias) takes even lengths only: one masked query / key more if odd
        t, u = c + c % 2, mask.shape[-1] + mask.shape[-1] % 2
        mask = jnp.pad(mask, ((0, 0), (0, t - c), (0, u - mask.shape[-1])))
        out = jax.nn.dot_product_attention(_pad_to(cut(q), t), _pad_to(kc, u), _pad_to(vc, u), mask=mask[:, None],
                                           scale=scale, implementation=implementation)
        return jnp.where(jnp.any(mask, axis=-1)[..., None, None], out, 0)[:, :c]
    return by_shard(shards, c, axis, run).astype(q.dtype)
