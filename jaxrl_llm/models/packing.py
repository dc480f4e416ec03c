"""Sequence packing of the trainer's passes: each row's prompt + completion, real tokens only, packed into
rows of `pack_length` tokens with segment ids and per-segment positions, and the results unpacked to the
(N,T) completion layout, so that the loss and every metric read exactly what the unpacked pass gives.

Two halves (docs/design.md, "Sequence packing"):
  * the host plans (numpy, first-fit-decreasing) from `sequence_lengths`: `plan_packs` -> which packed
    row and offset each row of a micro-batch goes to. The plan's packed-row count R is data-dependent, so it is
    decided where the lengths are known and becomes a static shape (one compile per bucket of R, `pack_rows`);
  * the jitted passes gather the tokens into that layout and back (`pack_layout`, `packed_hidden`,
    `packed_logprobs`, `packed_values`): plain gathers and scatters, on device, sharded like any batch.

A plan is {"row": (n,) int32 packed row of each sequence (-1: empty, not packed), "offset": (n,) int32
its first slot, "slots": (R,) int32 occupied slots per packed row (its shape is R)}; with a leading
micro-batch axis when a pass has several. Sequence n of a micro-batch (B' prompts, n = B'·G rows) is
the real tokens of prompt n // G followed by completion n up to its last real token: plen + ext tokens
at positions 0.. (those `positions_from_mask` gives the unpacked row), segment id n + 1.

Shared prompts (`plan_shared_packs`, train.pack_share_prompt): the completions of one prompt that go to
the same packed row form one segment, [the prompt's first plen - 1 tokens ; branch ; branch ; ...], each
branch the prompt's last token again followed by one completion (1 + ext tokens). A branch sees the
prompt and itself (branch ids: 0 on the prompt, n + 1 on completion n's branch; kernels.py), so every
token has the context, position and hidden state it has unpacked, and each branch's first slot predicts
its completion's first token, as the prompt's last slot does unpacked: the prompt is computed once per
row, not once per completion, and a one-completion segment is exactly the unshared sequence. The plan
then also has "prompt_offset": (n,) int32 the first slot of sequence n's prompt copy, and "offset" is
where position 0 would be for its branch (its first slot minus plen - 1): sequence position j sits at
slot prompt_offset + j below plen - 1 and at offset + j from there.

A plan may also carry "predict": (K,) zeros whose shape is the number of LM-head rows (K >= the completion
tokens up to each row's last real one; the trainer sets K = R·L): the log-prob passes then run the LM head
on the slots that predict a completion token, gathered first, and skip its chunks past the last of them
(`lm_head_rows`) -- prompt copies and the padding after each row's last segment predict nothing used.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.lm import LOGITS_MIN_CHUNK, logprobs_from_hidden
from jaxrl_llm.models.precision import precise
from jaxrl_llm.models.transformer import Decoder


# ------------------------------------------------------------------------------------------ lengths
def completion_extent(mask):
    """(N,) int32: the completion columns up to and including each row's last real token (0: none).
    mask (N,T). Column `extent` of the (N,T+1) completion layout is the state after the last real token."""
    t = mask.shape[1]
    cm = mask.astype(bool)
    return jnp.where(cm.any(axis=1), t - jnp.argmax(cm[:, ::-1], axis=1), 0).astype(jnp.int32)


def _parts(prompt_mask, mask):
    """(plen (N,), ext (N,)) int32: the prompt's real tokens, and the completion up to its last real token."""
    n = mask.shape[0]
    plen = jnp.repeat(jnp.sum(prompt_mask.astype(bool), axis=1, dtype=jnp.int32), n // prompt_mask.shape[0])
    return plen, completion_extent(mask)


def sequence_lengths(prompt_mask, mask):
    """(N,) int32 packed length of each row: its prompt's real tokens + its completion up to the last real
    token; 0 for a row without completion tokens (DAPO's zero-weight filler rows), which is not packed.
    prompt_mask (B,P), mask (N,T), N = B·G. Traceable (the host runs it jitted, on the global arrays)."""
    plen, ext = _parts(prompt_mask, mask)
    return jnp.where(ext > 0, plen + ext, 0)


# ------------------------------------------------------------------------------------------ host side
def first_fit_decreasing(lengths: np.ndarray, pack_length: int):
    """(row (n,), offset (n,), fills list) of a first-fit-decreasing packing; empty sequences get row -1.
    Ties keep the input order (a stable sort), so the plan is a function of the lengths alone."""
    if np.any(lengths > pack_length):
        raise ValueError(f"a sequence of {int(lengths.max())} tokens does not fit in train.pack_length={pack_length}")
    row, offset = np.full(len(lengths), -1, np.int32), np.zeros(len(lengths), np.int32)
    fills, used = np.zeros(len(lengths), np.int64), 0  # at most one packed row per sequence
    for i in np.argsort(-lengths, kind="stable"):
        if lengths[i] == 0:
            break
        j = int(np.argmax(fills[:used + 1] + lengths[i] <= pack_length))  # the first with room (row `used` is empty)
        used = max(used, j + 1)
        row[i], offset[i] = j, fills[j]
        fills[j] += lengths[i]
    fills = [int(f) for f in fills[:used]]
    return row, offset, fills


def pack_rows(needed: int, multiple: int, cap: int) -> int:
    """The static packed-row count for `needed` rows: a multiple of `multiple` (the batch shards, so that
    packed rows shard over data x fsdp), rounded up to m·2^e (m in 4..7) to bound the number of compiled
    shapes to four per doubling, and at most `cap` (one row per sequence: never worse than unpacked)."""
    units = -(-max(needed, 1) // multiple)
    e = max(units.bit_length() - 3, 0)  # m = ceil(units / 2^e) in 4..7 (or units itself below 8)
    units = -(-units // 2 ** e) * 2 ** e
    return max(min(units * multiple, -(-cap // multiple) * multiple), -(-needed // multiple) * multiple)


def plan_packs(lengths: np.ndarray, pack_length: int, multiple: int = 1) -> dict:
    """Plans M micro-batches at once. lengths (M,n) from `sequence_lengths`. All micro-batches get the same
    R (they run in one scan): the largest any needs, rounded by `pack_rows`. Returns the plan with a
    leading M axis (module docstring)."""
    return _stack([first_fit_decreasing(np.asarray(l), pack_length) for l in lengths], lengths.shape[1], multiple)


def first_fit_shared(prompt_lengths: np.ndarray, lengths: np.ndarray, group_size: int, pack_length: int):
    """(row (n,), offset (n,), prompt_offset (n,), fills list) of a packing that shares each prompt among its
    completions in a packed row (module docstring). prompt_lengths (n,) each row's prompt tokens, lengths
    (n,) from `sequence_lengths` (0: not packed). Groups are placed largest first, each whole into the
    first row with room; a group no row has room for goes completion by completion (longest first): into
    the group's segment of a row it already uses, else as a new segment (a copy of its prompt) into the
    first row with room, opening a row only when none has room. Deterministic: a function of the lengths."""
    n = len(lengths)
    if np.any(lengths > pack_length):
        raise ValueError(f"a sequence of {int(lengths.max())} tokens does not fit in train.pack_length={pack_length}")
    row, offset, prompt_offset = (np.full(n, -1, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int32))
    fills: list[int] = []
    share = np.maximum(prompt_lengths.astype(np.int64) - 1, 0)  # the prompt tokens a segment holds once
    branch = np.where(lengths > 0, lengths - share, 0)  # 1 + ext: the prompt's last token and the completion
    groups = np.arange(n).reshape(-1, group_size)
    sizes = np.array([share[g[0]] + branch[g].sum() if branch[g].any() else 0 for g in groups])

    def first_with_room(size):
        j = next((j for j, f in enumerate(fills) if f + size <= pack_length), len(fills))
        if j == len(fills):
            fills.append(0)
        return j

    for b in np.argsort(-sizes, kind="stable"):
        if sizes[b] == 0:
            break
        members = [int(i) for i in groups[b][np.argsort(-branch[groups[b]], kind="stable")] if branch[i] > 0]
        segments: dict[int, int] = {}  # packed row -> first slot of this group's segment there (the row's last)
        whole = next((j for j, f in enumerate(fills) if f + sizes[b] <= pack_length), None)
        for i in members:
            if whole is not None:
                j = whole
            else:
                j = next((j for j in segments if fills[j] + branch[i] <= pack_length), None)
                if j is None:
                    j = first_with_room(share[i] + branch[i])
            if j not in segments:
                segments[j] = fills[j]
                fills[j] += int(share[i])
            row[i], prompt_offset[i] = j, segments[j]
            offset[i] = fills[j] - share[i]  # position plen - 1 (the branch's first slot) at fills[j]
            fills[j] += int(branch[i])
    return row, offset, prompt_offset, fills


def plan_shared_packs(prompt_lengths: np.ndarray, lengths: np.ndarray, group_size: int, pack_length: int,
                      multiple: int = 1) -> dict:
    """`plan_packs` for shared prompts (`first_fit_shared`): prompt_lengths and lengths (M,n). The plan has
    "prompt_offset" besides "row", "offset" and "slots" (module docstring)."""
    plans = [first_fit_shared(np.asarray(p), np.asarray(l), group_size, pack_length)
             for p, l in zip(prompt_lengths, lengths)]
    plan = _stack([(p[0], p[1], p[3]) for p in plans], lengths.shape[1], multiple)
    plan["prompt_offset"] = np.stack([p[2] for p in plans])
    return plan


def _stack(plans, n: int, multiple: int) -> dict:
    """The (row, offset, fills) plans of M micro-batches as one plan with a common, rounded R."""
    needed = max(len(f) for _, _, f in plans)
    r = pack_rows(needed, multiple, cap=n)
    slots = np.zeros((len(plans), r), np.int32)
    for k, (_, _, fills) in enumerate(plans):
        slots[k, :len(fills)] = fills
    return {"row": np.stack([p[0] for p in plans]), "offset": np.stack([p[1] for p in plans]), "slots": slots}


def pack_efficiency(plan: dict, pack_length: int) -> float:
    """Real tokens / packed slots of a plan (1 = no padding at all)."""
    return float(np.sum(plan["slots"]) / max(plan["slots"].size * pack_length, 1))


# ------------------------------------------------------------------------------------------ device side
def pack_layout(prompts, prompt_mask, completions, completion_mask, plan, pack_length: int, prompt_routes=None,
                routes=None):
    """The packed rows of a micro-batch and the way back.

    prompts/prompt_mask (b,P), completions/completion_mask (n,T), plan for these n rows. MoE routing
    replay: prompt_routes (b,P,L,k) and routes (n,T,L,k), rows first, go to packed["routes"] (Lyr,R,L,k),
    each token's experts at its slot (the layout `Decoder` replays). Returns
    (packed {tokens, positions, mask, segment_ids [, branch_ids: shared prompts]} each (R,L), source (n,T+1)
    flat slot of the hidden state that predicts completion column t (column T: the state after the row's last real token), valid (n,T+1)
    bool: up to the row's last real token, and column T of every packed row).
    """
    b, p = prompts.shape
    n, t = completions.shape
    r, length = plan["slots"].shape[-1], pack_length
    pm, cm = prompt_mask.astype(bool), completion_mask.astype(bool)
    plen, ext = _parts(prompt_mask, completion_mask)  # (n,) each
    real_first = jnp.repeat(jnp.argsort(~pm, axis=1, stable=True), n // b, axis=0)  # prompt's real columns first
    j = jnp.arange(p + t, dtype=jnp.int32)[None]  # (1,P+T): index within the sequence = its position
    in_prompt = j < plen[:, None]
    pcol = jnp.take_along_axis(real_first, jnp.clip(j, 0, p - 1), axis=1)
    ccol = jnp.clip(j - plen[:, None], 0, t - 1)
    row_prompts = jnp.repeat(prompts, n // b, axis=0)
    tokens = jnp.where(in_prompt, jnp.take_along_axis(row_prompts, pcol, axis=1),
                       jnp.take_along_axis(completions, ccol, axis=1))
    key = in_prompt | jnp.take_along_axis(cm, ccol, axis=1)
    packed_row = plan["row"][:, None]
    inside = (j < (plen + ext)[:, None]) & (packed_row >= 0) & (ext[:, None] > 0)
    shared = "prompt_offset" in plan
    in_copy = j < plen[:, None] - 1 if shared else jnp.zeros_like(in_prompt)  # in the segment's prompt copy
    start = jnp.where(in_copy, plan["prompt_offset"][:, None], plan["offset"][:, None]) if shared \
        else plan["offset"][:, None]
    # r*L: dropped. A shared prompt copy is written by each of its completions, with the same values.
    slot = jnp.where(inside, packed_row * length + start + j, r * length)

    def scatter(values):  # (n,P+T,...) -> (R,L,...)
        rest = values.shape[2:]
        return (jnp.zeros((r * length, *rest), values.dtype).at[slot.reshape(-1)]
                .set(values.reshape(-1, *rest), mode="drop").reshape(r, length, *rest))

    ids = jnp.arange(1, n + 1, dtype=jnp.int32)[:, None]
    # shared: one segment per prompt copy (its first slot + 1 is unique in the row), a branch per completion
    segment = jnp.broadcast_to(plan["prompt_offset"][:, None] + 1 if shared else ids, tokens.shape)
    packed = {"tokens": scatter(tokens), "positions": scatter(jnp.broadcast_to(j, tokens.shape)),
              "mask": scatter(key & inside), "segment_ids": scatter(jnp.where(inside, segment, 0))}
    if shared:
        packed["branch_ids"] = scatter(jnp.where(inside & ~in_copy, ids, 0))
    if routes is not None:  # each token's recorded experts, gathered as its token id is
        row_proutes = jnp.repeat(prompt_routes, n // b, axis=0)  # (n,P,Lyr,k)
        take = lambda a, col: jnp.take_along_axis(a, col[:, :, None, None], axis=1)
        packed["routes"] = scatter(jnp.where(in_prompt[:, :, None, None], take(row_proutes, pcol),
                                             take(routes, ccol)).astype(jnp.int32)).transpose(2, 0, 1, 3)
    col = jnp.arange(t + 1, dtype=jnp.int32)[None]  # hidden at position plen-1+col predicts column col
    # Real tokens, and column T: the state after the row's last real token (V(s_T)), i.e. the hidden state
    # at that token, also on a row cut short of T (a multi-turn episode whose next observation did not
    # fit); never the slot after a segment, which belongs to the next one.
    valid = ((col < ext[:, None]) | (col == t)) & (packed_row >= 0)
    at = jnp.where(col == t, ext[:, None], col)
    source = jnp.where(valid, packed_row * length + plan["offset"][:, None] + plen[:, None] - 1 + at, 0)
    return packed, source, valid


@precise
def packed_hidden(config: ModelConfig, params, packed, dropout_rng=None):
    """Final-norm hidden states (R,L,D) of packed rows: each segment attends only to itself (a branch of a
    shared prompt's segment: to the prompt and itself).
    dropout_rng: a key for LoRA dropout (training only). MoE: packed["routes"], when present, is replayed."""
    segments = packed["segment_ids"]
    if "branch_ids" in packed:  # a prompt shared by its completions (kernels.py: segment and branch ids)
        segments = (segments, packed["branch_ids"])
    hidden, _ = Decoder(config, with_lm_head=False).apply(
        {"params": params}, packed["tokens"], packed["positions"], packed["mask"], segment_ids=segments,
        rngs=None if dropout_rng is None else {"dropout": dropout_rng}, routes=packed.get("routes"))
    return hidden


# Rows of one LM-head chunk over the predictor slots: the chunks past a pass's last predictor are skipped
# (lm.logprobs_from_hidden `active`), so this is the granularity of that saving; 256 rows keep the head's
# matmul efficient on a CPU (the (rows, D) x (D, V) product reads the whole head once per chunk). With many
# gathered rows g (a pod's packed rows), a chunk keeps at least LOGITS_MIN_CHUNK columns of each, as the
# unpacked chunks do.
PREDICT_CHUNK_ROWS = 256


def lm_head_rows(plan, completion_mask, source, valid):
    """(take, back, head) for the LM head of a packed pass: take maps per-slot (R,L,...) arrays to the rows
    the LM head runs on, back maps its (rows...) outputs to the (n,T) completion layout, 0 where not valid,
    and head is the `logprobs_from_hidden` keywords for those rows. With "predict" (K,) in the plan those
    rows are the K slots that predict a completion token (up to a row's last real one, row by row, column
    by column), laid column-major over (g, K/g) with g = gcd(R, K) (so that predictors fill the leading
    columns and each of the g rows, which shard like packed rows, holds an equal share); entries past the
    tokens read slot 0 (computed only within the last active chunk, never read back), and the chunks past
    the last predictor are skipped: K can exceed the tokens at no LM-head cost. Without it, every slot."""
    n, t = completion_mask.shape
    if "predict" not in plan:
        return (lambda x: x), (lambda y: unpack(y, source, valid, t)), {}
    k = plan["predict"].shape[-1]
    ext = jnp.where(plan["row"] >= 0, completion_extent(completion_mask), 0)
    col = jnp.arange(t, dtype=jnp.int32)[None]
    at = jnp.where(col < ext[:, None], (jnp.cumsum(ext) - ext)[:, None] + col, k)  # (n,T): index in the K rows
    slots = jnp.zeros((k,), jnp.int32).at[at.reshape(-1)].set(source[:, :t].reshape(-1), mode="drop")
    g = math.gcd(plan["slots"].shape[-1], k)

    def take(x):
        flat = jnp.take(x.reshape(-1, *x.shape[2:]), slots, axis=0)
        return flat.reshape(k // g, g, *x.shape[2:]).swapaxes(0, 1)

    def back(y):
        flat = y.swapaxes(0, 1).reshape(-1)
        return jnp.where(at < k, jnp.take(flat, jnp.minimum(at, k - 1)), 0.0)
    head = {"chunk": max(PREDICT_CHUNK_ROWS // g, min(LOGITS_MIN_CHUNK, k // g)), "active": -(-jnp.sum(ext) // g)}
    return take, back, head


def unpack(x, source, valid, columns: int):
    """(R,L) per-slot values -> (n, columns) at the completion layout; 0 where not valid."""
    flat = jnp.take(x.reshape(-1), source[:, :columns], axis=0)
    return jnp.where(valid[:, :columns], flat, 0.0)


def packed_logprobs(config: ModelConfig, params, prompts, prompt_mask, completions, completion_mask, plan,
                    pack_length: int, temperature=1.0, *, with_entropy: bool = False, dropout_rng=None,
                    prompt_routes=None, routes=None):
    """`logprobs_from_hidden(completion_hidden(...))` through packed rows: logp (n,T) [and entropy (n,T)],
    equal on every real completion token, 0 elsewhere. The LM head runs on the packed slots only (with
    "predict" in the plan: on those that predict a completion token).
    MoE routing replay: prompt_routes (b,P,L,k), routes (n,T,L,k) rows first (`pack_layout`)."""
    packed, source, valid = pack_layout(prompts, prompt_mask, completions, completion_mask, plan, pack_length,
                                        prompt_routes, routes)
    hidden = packed_hidden(config, params, packed, dropout_rng)
    targets = jnp.roll(packed["tokens"], -1, axis=1)  # the slot after each one: the token it predicts
    take, back, head = lm_head_rows(plan, completion_mask, source, valid)
    out = logprobs_from_hidden(config, params, take(hidden), take(targets), temperature, with_entropy=with_entropy,
                               **head)
    return (back(out[0]), back(out[1])) if with_entropy else back(out)


def packed_values(config: ModelConfig, vparams, prompts, prompt_mask, completions, completion_mask, plan,
                  pack_length: int, head, *, last: bool = False):
    """head(hidden) at the completion layout through packed rows: (n,T), or (n,T+1) with `last` (column T:
    the state after the row's last real token, V(s_T) for a truncated row). `head` maps (...,D) -> (...)."""
    packed, source, valid = pack_layout(prompts, prompt_mask, completions, completion_mask, plan, pack_length)
    values = head(packed_hidden(config, vparams["backbone"], packed))
    return unpack(values, source, valid, completions.shape[1] + (1 if last else 0))
