"""A shared prompt prefix for attention kernels that have none (cudnn, splash): the prompt's keys inlined
in front of each row's own. Shapes as in models/kernels.py. Its own module so that kernels.py, which
chooses among the implementations, and splash.py, the TPU-only one it imports lazily, both use it without
importing each other."""
from __future__ import annotations

import jax.numpy as jnp


def inline_prefix(q, k, v, key_mask, segment_ids, prefix):
    """For kernels without a shared prefix: each row gets its prompt's P keys in front of its own, and P
    zero queries (whose outputs are dropped), so that plain causal attention over P+S tokens sees the whole
    prompt from every completion token. Copies the prompt's keys G times (not its scores).
    Returns (q, k, v, key_mask) over P+S tokens and P."""
    if segment_ids is not None:
        raise ValueError("segment ids (packed rows) and a shared prompt prefix do not go together")
    pk, pv, pmask = prefix
    n, (b, p) = q.shape[0], pk.shape[:2]
    rows = lambda x: jnp.repeat(x, n // b, axis=0)
    q = jnp.concatenate([jnp.zeros((n, p, *q.shape[2:]), q.dtype), q], axis=1)
    k = jnp.concatenate([rows(pk).astype(k.dtype), k], axis=1)
    v = jnp.concatenate([rows(pv).astype(v.dtype), v], axis=1)
    return q, k, v, jnp.concatenate([rows(pmask.astype(bool)), key_mask.astype(bool)], axis=1), p
