"""What the cudnn and splash kernels lack natively, shared by kernels.py, which chooses among the
implementations, and splash.py, the TPU-only one it imports lazily (so neither imports the other): a shared
prompt prefix (the prompt's keys inlined in front of each row's own) and a traced sliding window (their
windows are static mask shapes). Shapes as in models/kernels.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def inline_prefix(q, k, v, key_mask, segment_ids, prefix):
    """For kernels without a shared prefix: each row gets its prompt's P keys in front of its own, and P
    zero queries (whose outputs are dropped), so that plain causal attention over P+S tokens sees the whole
    prompt from every completion token. Copies the prompt's keys G times (not its scores).

    Each prefix row's real keys are moved to its end, in their order (a stable sort; attention does not
    depend on the keys' order): a prefix with holes (the multi-turn sampler's prompt + cache slots) then
    reads as a left-padded prompt, so that the index distance from real prefix key p to self query i is
    (real prefix keys) - (p's position among them) + i = positions[i] - p's position, the distance the
    dense path's window measures (kernels.attend), whenever the self rows' real tokens start at index 0.
    Returns (q, k, v, key_mask) over P+S tokens and P."""
    if segment_ids is not None:
        raise ValueError("segment ids (packed rows) and a shared prompt prefix do not go together")
    pk, pv, pmask = prefix
    n, (b, p) = q.shape[0], pk.shape[:2]
    pmask = pmask.astype(bool)
    order = jnp.argsort(pmask, axis=1, stable=True)  # masked first, then the real keys in their order
    pk, pv = (jnp.take_along_axis(x, order[:, :, None, None], axis=1) for x in (pk, pv))
    pmask = jnp.take_along_axis(pmask, order, axis=1)
    rows = lambda x: jnp.repeat(x, n // b, axis=0)
    q = jnp.concatenate([jnp.zeros((n, p, *q.shape[2:]), q.dtype), q], axis=1)
    k = jnp.concatenate([rows(pk).astype(k.dtype), k], axis=1)
    v = jnp.concatenate([rows(pv).astype(v.dtype), v], axis=1)
    return q, k, v, jnp.concatenate([rows(pmask), key_mask.astype(bool)], axis=1), p


def with_static_window(run, window, window_size):
    """run(w) -> attention with the static window w (None: none). `window` is None, a Python int, or the
    traced int32 scalar of transformer.layer_window, which equals the static `window_size` on windowed
    layers and exceeds every sequence on full layers (the layer kinds share one scanned body): both
    kernels are then compiled and `lax.cond` runs the layer's own."""
    if window is None or isinstance(window, int):
        return run(window)
    if window_size is None:
        raise ValueError("a traced attention window needs window_size (the windowed layers' static window)")
    return jax.lax.cond(window == window_size, lambda: run(int(window_size)), lambda: run(None))
