"""Context parallelism: the tokens of every row split over the `sequence` mesh axis (config `mesh.sequence`)
in the passes that see whole rows (the trainer's score and update: policy, reference, value, teacher).

Where it applies: `sharding.use_mesh(mesh, sequence=True)` maps the logical `length` axis to the mesh's
`sequence` axis; the decoder (models/transformer.py) then reads `sequence_shards()` > 1 and
  * lays each row out in the **zigzag** order (`zigzag_order`): padded to a multiple of 2C tokens and cut
    into 2C chunks, shard i holds chunks i and 2C-1-i. Causal attention's work per query grows with its
    index; chunk i pairs a cheap early chunk with an expensive late one, so every shard does the same
    work (contiguous shards would leave the last with about C times the first's attention);
  * runs every token-wise part (embedding, norms, projections, MLP or MoE, RoPE by the tokens' global
    `positions`) on its 1/C of the tokens, GSPMD placing them by the `length` constraints;
  * runs attention in `shard_map` (`sequence_attention`): each shard keeps its queries and all-gathers
    the row's keys and values; each of its two query chunks attends causally to the whole gathered row
    with the blockwise kernel (models/attention.py `flash_attention`, given the chunk's offset in the row:
    only the key blocks at or below its diagonal are visited), and a prompt prefix (the trainer's
    prompt-shared pass) is gathered and attended the same way, merged by log-sum-exps; or (`impl`) with
    splash or cuDNN, whose masks are static: one `lax.switch` branch per shard index, built with its two
    chunks' static offsets, the prefix inlined as keys (models/context_kernels.py);
  * restores the token order of its outputs (hidden states, keys/values, MoE routes) and removes the padding.

All-gather of keys and values, not a ring: K/V are Hkv*hd wide, H/Hkv times narrower than the queries
(7x for Qwen2.5-7B), so one gather per layer moves less than a ring passing queries or outputs, and its
backward (a reduce-scatter of their gradients) is derived by shard_map. Segment ids (packing, also across
shard boundaries), branch ids (a prompt shared by packed completions), sliding windows (by global index,
or by positions with branches) and soft caps are the blockwise kernel's own. The price: a layer's gathered
K/V (and their gradients) are whole on every shard; the queries, MLP activations and the LM head's
inputs stay 1/C. Decoding is not split along the sequence (the sampler runs under the plain rules).
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as Spec

from jaxrl_llm.models.attention import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, flash_attention, merge, split_segments

AXIS = "sequence"


def _rule(name: str):
    """The mesh axes (a tuple, maybe empty) the logical axis `name` maps to under the active rules."""
    axes = dict(nn.get_logical_axis_rules()).get(name)
    return () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))


def sequence_shards() -> int:
    """How many shards the tokens of a row are split into here: the size of the mesh axis the logical
    `length` maps to under the active rules (`sharding.use_mesh(mesh, sequence=True)`), 1 otherwise."""
    mesh = jax.sharding.get_abstract_mesh()
    axes = _rule("length")
    if mesh.empty or not axes:
        return 1
    if axes != (AXIS,):
        raise ValueError(f"the logical axis 'length' maps to {axes}; context parallelism expects ({AXIS!r},)")
    return int(mesh.shape.get(AXIS, 1))


def padded_length(length: int, shards: int) -> int:
    """`length` rounded up to a multiple of 2 * shards (the zigzag layout's chunks)."""
    return -(-length // (2 * shards)) * 2 * shards


def zigzag_order(length: int, shards: int) -> np.ndarray:
    """(length,) int: the global index of each position of the zigzag layout (length a multiple of
    2 * shards): shard i's contiguous block holds chunks i and 2*shards-1-i of the row, in that order."""
    c = length // (2 * shards)
    chunks = [j for i in range(shards) for j in (i, 2 * shards - 1 - i)]
    return np.concatenate([np.arange(j * c, (j + 1) * c) for j in chunks]).astype(np.int32)


def to_layout(x, shards: int, axis: int = 1, value=0):
    """`x` padded along `axis` to `padded_length` with `value`, its positions put in the zigzag order.
    None stays None; a (segment, branch) pair is laid out member by member."""
    if x is None:
        return None
    if isinstance(x, (tuple, list)):
        return type(x)(to_layout(m, shards, axis, value) for m in x)
    length = padded_length(x.shape[axis], shards)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - x.shape[axis])
    return jnp.take(jnp.pad(x, widths, constant_values=value), zigzag_order(length, shards), axis=axis)


def from_layout(x, shards: int, length: int, axis: int = 1):
    """The inverse of `to_layout`: positions back in row order, the padding removed (to `length`)."""
    if x is None:
        return None
    inverse = np.argsort(zigzag_order(x.shape[axis], shards)).astype(np.int32)
    return lax.slice_in_dim(jnp.take(x, inverse, axis=axis), 0, length, axis=axis)


def sequence_attend(q, k, v, key_mask, segment_ids=None, prefix=None, *, shards: int, positions=None,
                    window=None, softcap=None, scale=None, block_q: int = DEFAULT_BLOCK_Q,
                    block_k: int = DEFAULT_BLOCK_K, axis: str = AXIS, impl: str = "blockwise",
                    window_size=None, reference: bool = False):
    """Causal self-attention of this shard's queries over the whole row, inside shard_map over `axis`.

    Local shapes (this shard's block of the zigzag layout: chunks i and 2C-1-i of the row, c tokens each,
    s = 2c): q (N,s,H,hd); k, v (N,s,Hkv,hd); key_mask (N,s) bool; segment_ids None, (N,s) int or a
    (segment, branch) pair (kernels.py); positions (N,s) int, the tokens' positions (windows with branch
    ids, and the prefix's window); window None or an int32 scalar: query i sees key j only if i - j < window
    (global indices; positions with branches); prefix None or (pk, pv (B,p,Hkv,hd), pmask (B,p)): this
    shard's block of the prompts' zigzag layout, row n = b*G + g seeing prompt b. impl: blockwise, splash
    or cudnn (models/context_kernels.py; window_size: their static window; reference: splash in Pallas'
    interpreter, cuDNN's call through JAX's 'xla' reference, for CPU tests). Returns (N,s,H,hd) in
    q.dtype: what `attention.blockwise_attend` gives these queries on the whole rows (splash: zeros at
    masked queries, whose outputs are not specified).
    """
    n, s = q.shape[:2]
    c = s // 2
    i = lax.axis_index(axis)
    segment_ids, branch = split_segments(segment_ids)
    seg = jnp.zeros((n, s), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    kv_seg = jnp.where(key_mask.astype(bool), seg, -1)

    def gather(x):  # this shard's block -> the whole row, in row order
        whole = lax.all_gather(x, axis, axis=1, tiled=True)
        return jnp.take(whole, np.argsort(zigzag_order(whole.shape[1], shards)).astype(np.int32), axis=1)

    k_all, v_all, seg_all = gather(k), gather(v), gather(kv_seg)
    br_all = None if branch is None else gather(branch.astype(jnp.int32))
    pos_all = None if branch is None or window is None else gather(positions.astype(jnp.int32))
    if impl != "blockwise":
        from jaxrl_llm.models import context_kernels as kernels
        pre = None if prefix is None else (gather(prefix[0]), gather(prefix[1]),
                                           gather(prefix[2].astype(jnp.int32)) > 0)
        if impl == "splash":
            return kernels.splash_chunks(q, k_all, v_all, jnp.where(key_mask.astype(bool), seg + 1, 0), seg_all + 1,
                                         pre, shards=shards, axis=axis, window=window, window_size=window_size,
                                         softcap=softcap, scale=scale, interpret=reference)
        return kernels.cudnn_chunks(q, k_all, v_all, seg, seg_all, pre, shards=shards, axis=axis, window=window,
                                    positions=positions, positions_all=pos_all, branch=branch, branch_all=br_all,
                                    scale=scale, implementation="xla" if reference else "cudnn")
    keys = k_all.shape[1]
    outs, lses = [], []
    for part, chunk in enumerate((i, 2 * shards - 1 - i)):
        part_of = lambda x: None if x is None else x[:, part * c:(part + 1) * c]
        off = (chunk * c).astype(jnp.int32)
        win = None
        if window is not None:
            if branch is None:  # global indices
                q_idx = jnp.broadcast_to(off + jnp.arange(c, dtype=jnp.int32), (n, c))
                win = (q_idx, jnp.broadcast_to(jnp.arange(keys, dtype=jnp.int32), (n, keys)), window)
            else:  # branches interleave: distances are positions
                win = (part_of(positions).astype(jnp.int32), pos_all, window)
        branches = None if branch is None else (part_of(branch).astype(jnp.int32), br_all)
        out, lse = flash_attention(part_of(q), k_all, v_all, part_of(seg), seg_all, True, block_q, block_k, scale,
                                   softcap, win, branches, off)
        outs.append(out)
        lses.append(lse)
    out, lse = jnp.concatenate(outs, axis=1), jnp.concatenate(lses, axis=1)
    if prefix is None:
        return out
    pk, pv, pmask = (gather(x) for x in (prefix[0], prefix[1], prefix[2].astype(jnp.int32)))
    b, h, hd = pk.shape[0], q.shape[2], q.shape[3]
    qg = q.reshape(b, (n // b) * s, h, hd)
    p_win = None if window is None else (  # by positions (kernels.attend): query minus real-prompt position
        positions.reshape(qg.shape[:2]).astype(jnp.int32), jnp.cumsum(pmask, axis=-1) - 1, window)
    p_out, p_lse = flash_attention(qg, pk, pv, jnp.zeros(qg.shape[:2], jnp.int32), jnp.where(pmask > 0, 0, -1),
                                   False, block_q, block_k, scale, softcap, p_win)
    merged, _ = merge(out, lse, p_out.reshape(n, s, h, hd), p_lse.reshape(n, s, h))
    return merged.astype(q.dtype)


def sequence_attention(q, k, v, key_mask, segment_ids=None, prefix=None, *, shards: int, positions=None,
                       window=None, **options):
    """`sequence_attend` on whole (N,S,...) arrays laid out by `to_layout` (S a multiple of 2 * shards),
    run in shard_map over the active mesh: tokens over the `sequence` axis, rows over the mesh axes of
    the logical `batch` (when they divide the rows [and the prompts]), heads over those of `act_heads`
    (when they divide both head counts), everything else replicated. Returns (N,S,H,hd)."""
    mesh = jax.sharding.get_abstract_mesh()
    size = lambda axes: math.prod(mesh.shape[a] for a in axes)
    rows = _rule("batch")
    if q.shape[0] % size(rows) or (prefix is not None and prefix[0].shape[0] % size(rows)):
        rows = ()
    heads = _rule("act_heads")
    if q.shape[2] % size(heads) or k.shape[2] % size(heads):
        heads = ()
    rows, heads = rows or None, heads or None
    tok, tok4 = Spec(rows, AXIS), Spec(rows, AXIS, heads, None)
    args, specs = [q, k, v, key_mask], [tok4, tok4, tok4, tok]
    extras = {"segment_ids": segment_ids, "prefix": prefix, "positions": positions, "window": window}
    spec_of = {"segment_ids": lambda x: jax.tree_util.tree_map(lambda _: tok, x),
               "prefix": lambda _: (tok4, tok4, tok), "positions": lambda _: tok, "window": lambda _: Spec()}
    names = [name for name, x in extras.items() if x is not None]
    args += [extras[name] for name in names]
    specs += [spec_of[name](extras[name]) for name in names]

    def body(q, k, v, key_mask, *rest):
        return sequence_attend(q, k, v, key_mask, shards=shards, **dict(zip(names, rest)), **options)

    # check_vma off: the blockwise kernel's loop carries start from constants (not per-shard values)
    return jax.shard_map(body, in_specs=tuple(specs), out_specs=tok4, check_vma=False)(*args)
