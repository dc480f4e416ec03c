"""The attention implementations behind `model.attention`, and the choice among them.

Shapes as in transformer.py: q (N,S,H,hd); k, v (N,S,Hkv,hd); key_mask (N,S) bool (the real tokens);
segment_ids None, (N,S) int >= 0, or a (segment, branch) pair of them (packed rows whose prompt its
completions share: a key is also visible only if its branch is 0, the prompt, or the query's own; windows
then measure positions); prefix None or (pk, pv (B,P,Hkv,hd), pmask (B,P) bool), row
n = b*G + g seeing prompt b. Every implementation is causal self-attention among the S tokens under the
key mask and segment ids [+ the prefix], and returns (N,S,H,hd):

  * xla: the dense path, (N,Hkv,R,S,S+P) float32 scores (`dense_attend`; today's arithmetic, exactly);
  * blockwise: models/attention.py, the flash-style pure-JAX path: no T x T array, causal blocks skipped;
  * cudnn: `jax.nn.dot_product_attention(implementation='cudnn')`, GPU only; windows, no soft cap;
  * splash: the Pallas splash-attention kernel, TPU only; windows (LocalMask) and soft caps;
  * auto: cudnn on GPU where it applies (`choose_attention` says why not), splash on TPU, and on CPU xla
    below `CPU_BLOCKWISE_MIN_KEYS` keys per query and blockwise from there (measured:
    benchmarks/attention.py, docs/attention.md);
  * with a `sequence` mesh axis (`attend(sequence=C)`): blockwise, splash or cudnn per shard, on its query
    chunks against the gathered row (models/context.py, models/context_kernels.py); xla runs as
    blockwise there, and auto takes splash on TPU, blockwise on GPU and CPU.

Outputs at query positions whose own mask is 0 are not specified (padding; every caller ignores them)
except that they are finite; a query that sees no key gets zeros in blockwise, cudnn and splash.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.models.attention import MASKED_SCORE, blockwise_attend, split_segments
from jaxrl_llm.models.prefix import inline_prefix, with_static_window

ATTENTION_IMPLS = ("auto", "xla", "blockwise", "cudnn", "splash")
_BACKEND_OF = {"cudnn": ("gpu", "a GPU (cuDNN)"), "splash": ("tpu", "a TPU (Pallas splash attention)")}
# On CPU, blockwise beats the dense path from this many keys per query (self tokens + prefix) on:
# benchmarks/attention.py on the 2-core development machine (docs/attention.md).
CPU_BLOCKWISE_MIN_KEYS = 384


def check_attention(name: str, backend: str | None = None) -> None:
    """One-line ValueError when `model.attention` names no implementation or one this backend lacks."""
    if name not in ATTENTION_IMPLS:
        raise ValueError(f"config.model.attention={name!r}: expected one of {', '.join(ATTENTION_IMPLS)}")
    backend = backend or jax.default_backend()
    if name in _BACKEND_OF and backend != _BACKEND_OF[name][0]:
        raise ValueError(f"config.model.attention={name!r} needs {_BACKEND_OF[name][1]}, but JAX runs on "
                         f"{backend}; use auto, xla or blockwise")


def cudnn_supports(dtype, head_dim: int) -> bool:
    """cuDNN flash attention's own limits: half precision, head dim a multiple of 8 up to 128."""
    return jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)) and head_dim % 8 == 0 \
        and head_dim <= 128


def choose_attention(name: str, *, backend: str, dtype, head_dim: int, keys: int, segments: bool,
                     windowed: bool = False, softcap: bool = False, branches: bool = False,
                     sequence: bool = False) -> tuple[str, str]:
    """(the implementation `name` runs as, why `auto` did not take the backend's kernel or ""). `auto`
    becomes a concrete one, the others are checked (a one-line ValueError).
    branches: packed rows whose prompt its completions share (segment and branch ids): splash has no
    such mask (auto takes blockwise on a TPU; naming splash is an error).
    windowed / softcap: the layer has a sliding window / an attention soft cap. Every implementation takes
    windows; cuDNN (as `jax.nn.dot_product_attention` exposes it) has no soft cap, so `auto` takes
    blockwise for Gemma 2 on a GPU and naming cudnn there is an error.
    sequence: the rows are split over a `sequence` mesh axis (models/context.py): xla runs as blockwise
    there, and `auto` on a GPU takes blockwise, cuDNN needing an explicit mask per query chunk
    (models/context_kernels.py; naming cudnn takes it)."""
    check_attention(name, backend)
    if name == "cudnn" and softcap:
        raise ValueError("config.model.attention='cudnn' does not support an attention soft cap (Gemma 2: "
                         "jax.nn.dot_product_attention has none); use auto, xla or blockwise")
    if name == "cudnn" and not cudnn_supports(dtype, head_dim):
        raise ValueError(f"config.model.attention='cudnn' needs bfloat16/float16 compute and a head dim that is a "
                         f"multiple of 8 up to 128; got {jnp.dtype(dtype).name}, {head_dim}: use auto or blockwise")
    if name == "splash" and branches:  # (the trainer does not share prompts where splash runs: packs.shares_prompt)
        raise ValueError("config.model.attention='splash' has no mask for a prompt shared by its packed "
                         "completions: set train.pack_share_prompt=false, or use auto or blockwise")
    if name != "auto":
        return ("blockwise" if sequence and name == "xla" else name), ""
    if backend == "gpu" and sequence and not softcap and cudnn_supports(dtype, head_dim):
        return "blockwise", "a sequence shard's query chunks would need a dense mask in cuDNN (no causal offset)"
    if backend == "gpu":
        if softcap:
            return "blockwise", "cuDNN has no attention soft cap"
        if not cudnn_supports(dtype, head_dim):
            return "blockwise", (f"cuDNN needs bfloat16/float16 and a head dim that is a multiple of 8 up to 128 "
                                 f"(got {jnp.dtype(dtype).name}, {head_dim})")
        # cuDNN has no segment ids: with them (packing) it needs a dense mask, which blockwise avoids.
        return ("blockwise", "packed rows would need a dense (T, T) mask in cuDNN") if segments else ("cudnn", "")
    if backend == "tpu":
        return ("blockwise", "splash has no mask for a prompt shared by packed completions") if branches \
            else ("splash", "")  # (the trainer shares no prompt where auto gives splash: packs.shares_prompt)
    return "blockwise" if keys >= CPU_BLOCKWISE_MIN_KEYS or sequence else "xla", ""


def resolve_attention(name: str, **kw) -> str:
    """The implementation `name` runs as (`choose_attention` without the reason)."""
    return choose_attention(name, **kw)[0]


def explain_attention(config, backend: str, sequence: bool = False) -> list[str]:
    """One line per layer kind of `config` (a ModelConfig: attention, dtype, head_dim, sliding_layers,
    attn_softcap) saying which implementation long unpacked sequences take [split over a `sequence` mesh
    axis] and why `auto` fell back.
    Raises the one-line error of an implementation the model cannot use (setup calls it before loading)."""
    kinds = sorted({"sliding" if s else "full" for s in config.sliding_layers}, reverse=True)
    lines = []
    for kind in kinds:  # the kinds share one scanned body: a window on one means a (traced) window on all
        impl, why = choose_attention(config.attention, backend=backend, dtype=config.dtype,
                                     head_dim=config.head_dim, keys=CPU_BLOCKWISE_MIN_KEYS, segments=False,
                                     windowed="sliding" in kinds, softcap=config.attn_softcap is not None,
                                     sequence=sequence)
        lines.append(f"model.attention={config.attention} on {backend}, {kind}-attention layers: {impl}"
                     + (f" ({why})" if why else ""))
    return lines


def attend(name: str, q, k, v, key_mask, segment_ids=None, prefix=None, *, block: int = 256, scale=None,
           softcap=None, window=None, window_size=None, positions=None, sequence: int = 1):
    """Attention by the implementation `name` (config.model.attention), resolved at trace time; `block`
    is blockwise's query and key tile (config.model.attention_block). scale: of the scores (default
    hd ** -0.5); softcap: scores -> softcap * tanh(scores / softcap); window: None or an int32 scalar
    (traced): query i sees key j only if i - j < window (indices, as transformers' mask), and the prefix's
    key p only if positions[i] - (its position among the real prompt tokens) < window: the prefix may hold
    more than a left-padded prompt (the multi-turn sampler's cache slots). window_size: the static window
    of the windowed layers, which a traced `window` equals or exceeds every sequence (cudnn and splash
    build static masks: prefix.with_static_window). positions (N,S) int: the queries'.
    sequence > 1: the rows are in models/context.py's zigzag layout, their tokens split over the `sequence`
    mesh axis: each shard's query chunks attend to the gathered keys/values by blockwise (`xla` runs as
    it; `auto` takes it on CPU and GPU), splash or cudnn (models/context_kernels.py: static masks at each
    shard's chunk offsets). prefix is then the prompts in the same layout."""
    keys = q.shape[1] + (0 if prefix is None else prefix[0].shape[1])
    impl = resolve_attention(name, backend=jax.default_backend(), dtype=q.dtype, head_dim=q.shape[-1],
                             keys=keys, segments=segment_ids is not None, windowed=window is not None,
                             softcap=softcap is not None, branches=split_segments(segment_ids)[1] is not None,
                             sequence=sequence > 1)
    if sequence > 1:
        from jaxrl_llm.models.context import sequence_attention  # (context imports this module's neighbours)
        return sequence_attention(q, k, v, key_mask, segment_ids, prefix, shards=sequence, positions=positions,
                                  window=window, block_q=block, block_k=block, scale=scale, softcap=softcap,
                                  impl="blockwise" if impl == "xla" else impl, window_size=window_size)
    if impl == "xla":
        return dense_attend(q, k, v, dense_mask(key_mask, segment_ids, window, positions), prefix, scale=scale,
                            softcap=softcap, window=window, positions=positions)
    if impl == "blockwise":
        return blockwise_attend(q, k, v, key_mask, segment_ids, prefix, block_q=block, block_k=block,
                                scale=scale, softcap=softcap, window=window, positions=positions)
    if scale is not None and scale != q.shape[-1] ** -0.5:  # these two scale by hd ** -0.5 themselves
        q = q * jnp.asarray(scale * q.shape[-1] ** 0.5, q.dtype)
    if impl == "cudnn":
        return cudnn_attend(q, k, v, key_mask, segment_ids, prefix, window=window, window_size=window_size,
                            positions=positions)
    from jaxrl_llm.models.splash import splash_attend  # TPU-only module: imported where it runs
    return splash_attend(q, k, v, key_mask, segment_ids, prefix, softcap=softcap, window=window,
                         window_size=window_size)


def dense_mask(key_mask, segment_ids=None, window=None, positions=None):
    """(N,S) key mask [+ segment ids] -> (N,S,S) bool: query t sees real keys <= t [of its segment]
    [and > t - window]. With (segment, branch) ids, also only keys of branch 0 or the query's, and the
    window measures positions (N,S) (a branch's tokens follow other branches, not their prompt)."""
    t = key_mask.shape[-1]
    segment_ids, branch = split_segments(segment_ids)
    mask = jnp.tril(jnp.ones((t, t), bool))[None] & key_mask.astype(bool)[:, None, :]
    if window is not None:
        if branch is None:
            mask = mask & (jnp.arange(t)[:, None] - jnp.arange(t)[None, :] < window)[None]
        else:
            mask = mask & (positions[:, :, None] - positions[:, None, :] < window)
    if segment_ids is not None:
        mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
    if branch is not None:
        mask = mask & ((branch[:, None, :] == 0) | (branch[:, :, None] == branch[:, None, :]))
    return mask


def soft_cap(scores, cap):
    """cap * tanh(scores / cap) (Gemma 2's attention and final logits); identity when cap is None."""
    return scores if cap is None else jnp.tanh(scores / cap) * cap


def prefix_positions(pmask):
    """(B,P) bool -> (B,P) int32: each prefix key's position among its row's real prefix tokens."""
    return jnp.cumsum(pmask.astype(jnp.int32), axis=-1) - 1


def dense_attend(q, k, v, self_mask, prefix=None, *, scale=None, softcap=None, window=None, positions=None):
    """Softmax attention over [prefix keys ; self keys] with GQA, softmax in float32.

    q (N,S,H,hd); k, v (N,K,Hkv,hd); self_mask (N,S,K) bool.
    prefix: None or (pk, pv, pmask) with pk, pv (B,P,Hkv,hd), pmask (B,P) bool; row n = b*G + g sees
    prompt b. The prompt keys are never copied G times: queries are grouped as (B,G,...) instead.
    scale, softcap, window as in `attend` (self_mask already holds the window of the self keys).
    Returns (N,S,H,hd).
    """
    n, s, h, hd = q.shape
    kvh = k.shape[2]
    r = h // kvh
    scale = hd ** -0.5 if scale is None else scale
    q = q.reshape(n, s, kvh, r, hd)
    scores = soft_cap(jnp.einsum("nskrd,ntkd->nkrst", q, k, preferred_element_type=jnp.float32) * scale, softcap)
    scores = jnp.where(self_mask[:, None, None], scores, MASKED_SCORE)
    if prefix is not None:
        pk, pv, pmask = prefix
        pk_mask = pmask
        b, p = pk.shape[:2]
        qg = q.reshape(b, n // b, s, kvh, r, hd)
        pscores = soft_cap(jnp.einsum("bgskrd,bpkd->bgkrsp", qg, pk, preferred_element_type=jnp.float32) * scale,
                           softcap)
        pmask = pmask.astype(bool)[:, None, None, None, None, :]
        if window is not None:  # (B,G,1,1,S,P): by positions (see `attend`)
            near = positions.reshape(b, n // b, s)[..., None] - prefix_positions(pk_mask)[:, None, None] < window
            pmask = pmask & near[:, :, None, None]
        pscores = jnp.where(pmask, pscores, MASKED_SCORE)
        scores = jnp.concatenate([pscores.reshape(n, kvh, r, s, p), scores], axis=-1)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    if prefix is None:
        out = jnp.einsum("nkrst,ntkd->nskrd", weights, v)
    else:
        wp, ws = weights[..., :p], weights[..., p:]
        out = jnp.einsum("nkrst,ntkd->nskrd", ws, v)
        out = out + jnp.einsum("bgkrsp,bpkd->bgskrd", wp.reshape(b, n // b, kvh, r, s, p),
                               pv).reshape(n, s, kvh, r, hd)
    return out.reshape(n, s, h, hd)


def cudnn_attend(q, k, v, key_mask, segment_ids=None, prefix=None, *, window=None, window_size=None,
                 implementation="cudnn", positions=None):
    """cuDNN flash attention (`implementation` is a parameter so that CPU tests can run the same wrapper
    through JAX's reference 'xla' implementation). window, window_size as in `attend`.

    cuDNN knows causal masks and per-row lengths of right-padded rows, not arbitrary key masks. A stable
    sort moves each row's real tokens to the front in their order: causal attention among them is then
    exactly causal attention under the key mask, for every real query (left or right padding, holes).
    Padded queries land past the row's length and get zeros. A window, `local_window_size=(w - 1, 0)`
    (JAX: key j visible iff i - j <= w - 1; cuDNN's exclusive left bound w), then counts real tokens: it
    equals `attend`'s (indices for the self keys, positions for the prefix's) whenever each row's real
    self tokens are contiguous (every row the library builds: left-padded prompts, right-padded
    completions and turns), not across holes in the key mask. With segment ids cuDNN needs the dense
    (N,1,S,S) boolean mask, which holds the window by indices (jax.nn.dot_product_attention has no
    segment ids): use blockwise for packing. Shared-prompt packing's (segment, branch) ids go into that
    mask too (its window by `positions`).
    """
    p = 0
    if prefix is not None:
        q, k, v, key_mask, p = inline_prefix(q, k, v, key_mask, segment_ids, prefix)
    s = q.shape[1]
    if s % 2:  # cuDNN's backward takes even lengths only: one masked token more
        q, k, v, key_mask = (jnp.pad(x, ((0, 0), (0, 1)) + ((0, 0),) * (x.ndim - 2)) for x in (q, k, v, key_mask))
        pad = lambda x: None if x is None else jnp.pad(x, ((0, 0), (0, 1)))
        segment_ids = None if segment_ids is None else jax.tree_util.tree_map(pad, segment_ids)
        positions = pad(positions)
    key_mask = key_mask.astype(bool)
    if segment_ids is not None:
        mask = dense_mask(key_mask, segment_ids, window, positions)
        out = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation=implementation)
        return jnp.where(jnp.any(mask, axis=-1)[..., None, None], out, 0).astype(q.dtype)[:, :s]
    order = jnp.argsort(~key_mask, axis=1, stable=True)  # real tokens first, in their order
    lengths = jnp.sum(key_mask, axis=1, dtype=jnp.int32)
    gather = lambda x, idx: jnp.take_along_axis(x, idx[:, :, None, None], axis=1)
    qs, ks, vs = gather(q, order), gather(k, order), gather(v, order)
    run = lambda w: jax.nn.dot_product_attention(
        qs, ks, vs, is_causal=True, query_seq_lengths=lengths, key_value_seq_lengths=lengths,
        local_window_size=None if w is None else (w - 1, 0), implementation=implementation)
    out = gather(with_static_window(run, window, window_size), jnp.argsort(order, axis=1))
    return jnp.where(key_mask[:, :, None, None], out, 0).astype(q.dtype)[:, p:s]
