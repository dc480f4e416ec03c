"""`model.attention = splash`: the Pallas TPU splash-attention kernel
(`jax.experimental.pallas.ops.tpu.splash_attention`), called as JAX documents it: a causal
`MultiHeadMask`, `make_splash_mha` (GQA: query heads a multiple of the key/value heads), one kernel per
row through `jax.vmap`, and `SegmentIds` for everything the static causal mask does not say. A sliding
window w is the kernel's `LocalMask` with window (w - 1, 0): key j visible iff i - w + 1 <= j <= i, which
is causal itself and the window of `kernels.attend` by indices; the soft cap is its
`attn_logits_soft_cap` (applied to the scaled scores, forward and backward, as ours).

Shapes as in models/kernels.py. The kernel does not scale the scores (queries are scaled here), wants
head-major (heads, T, hd) operands and T a multiple of its blocks (rows are padded with masked tokens).
Key mask and segment ids are both expressed as splash segment ids: real token of segment s -> s + 1,
masked token -> 0. A masked query then sees only masked keys (itself at least), so no softmax row is
empty (the kernel's requirement), and its output, which every caller ignores, is set to zero here.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.models.prefix import inline_prefix, with_static_window

BLOCK = 128  # splash tile (query, key, and the backward's); sequences are padded to a multiple of it


def splash_kernel(heads: int, length: int, interpret: bool, window: int | None = None,
                  softcap: float | None = None, q_length: int | None = None, offset: int = 0):
    """The splash kernel of one causal (length x length) mask [within the window] [soft-capped], for
    `heads` query heads [(q_length x length), query i at key index i + offset: models/context_kernels.py].
    Built per call, not cached: it holds its mask's arrays, and one built while
    flax's scan traces a layer body holds that trace's values (a cached one leaked into the next trace,
    the model's prefill then completion pass: tests/test_attention_windows_model.py). The windowed mask
    is block-sparse: the kernel skips the tiles wholly outside the window, as those above the diagonal."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    b = BLOCK
    sizes = sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b, block_kv_dkv=b,
                          block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
    return sk.make_splash_mha(splash_mask(heads, length, window, q_length, offset), head_shards=1, q_seq_shards=1,
                              block_sizes=sizes, interpret=interpret, attn_logits_soft_cap=softcap), sk


def splash_mask(heads: int, length: int, window: int | None = None, q_length: int | None = None, offset: int = 0):
    """The kernel's static `MultiHeadMask`: causal, or causal within the window (LocalMask, see above), over
    `length` keys; q_length queries (default `length`), query i standing at key index i + offset."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    shape = (length if q_length is None else q_length, length)
    one = sm.CausalMask(shape, offset=offset) if window is None else \
        sm.LocalMask(shape, window_size=(window - 1, 0), offset=offset)
    return sm.MultiHeadMask([one for _ in range(heads)])


def splash_attend(q, k, v, key_mask, segment_ids=None, prefix=None, *, softcap=None, window=None,
                  window_size=None, interpret: bool = False):
    """Causal attention under the key mask and segment ids [+ prefix] [within the window] [soft-capped]
    by splash attention (softcap, window, window_size as in kernels.attend). `interpret` runs the kernel
    in Pallas' interpreter (CPU tests). Returns (N,S,H,hd) in q.dtype."""
    p = 0
    if prefix is not None:
        q, k, v, key_mask, p = inline_prefix(q, k, v, key_mask, segment_ids, prefix)
    n, s, h, hd = q.shape
    length = -(-s // BLOCK) * BLOCK  # the kernel's tiles must divide T (and be multiples of 128 lanes)
    key_mask = key_mask.astype(bool)
    seg = jnp.zeros((n, s), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    seg = jnp.pad(jnp.where(key_mask, seg + 1, 0), ((0, 0), (0, length - s)))
    heads_first = lambda x: jnp.pad(x, ((0, 0), (0, length - s), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
    qh, kh, vh = heads_first(q * jnp.asarray(hd ** -0.5, q.dtype)), heads_first(k), heads_first(v)
    cap = None if softcap is None else float(softcap)

    # Built before `lax.cond` traces its branches, which close over them.
    static = (window,) if window is None or isinstance(window, int) else (window_size, None)
    kernels = {w: splash_kernel(h, length, interpret, w, cap) for w in static}

    def run(w):
        kernel, sk = kernels[w]
        return jax.vmap(kernel)(qh, kh, vh, sk.SegmentIds(q=seg, kv=seg))

    out = with_static_window(run, window, window_size).transpose(0, 2, 1, 3)[:, :s]
    return jnp.where(key_mask[:, :, None, None], out, 0).astype(q.dtype)[:, p:]
