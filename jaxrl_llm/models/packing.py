"""Sequence packing of the trainer's passes: each row's prompt + completion, real tokens only, packed into
rows of `pack_length` tokens with segment ids and per-segment positions, and the results unpacked to the
(N,T) completion layout, so that the loss and every metric read exactly what the unpacked pass gives.

Two halves (docs/design.md, "Sequence packing"):
  * the host plans (numpy, first-fit-decreasing) from `sequence_lengths`: `plan_packs` -> which packed
    row and offset each row of a micro-batch goes to. The plan's packed-row count R is data-dependent, so it is
    decided where the lengths are known and becomes a static shape (one compile per R, see `pack_rows`);
  * the jitted passes gather the tokens into that layout and back (`pack_layout`, `packed_hidden`,
    `packed_logprobs`, `packed_values`): plain gathers and scatters, on device, sharded like any batch.

A plan is {"row": (n,) int32 packed row of each sequence (-1: empty, not packed), "offset": (n,) int32
its first slot, "slots": (R,) int32 occupied slots per packed row (its shape is R)}; with a leading
micro-batch axis when a pass has several. Sequence n of a micro-batch (B' prompts, n = B'·G rows) is
the real tokens of prompt n // G followed by completion n up to its last real token: plen + ext tokens
at positions 0.. (those `positions_from_mask` gives the unpacked row), segment id n + 1.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.lm import logprobs_from_hidden
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


def plan_packs(lengths: np.ndarray, pack_length: int, multiple: int = 1, min_rows: int = 0) -> dict:
    """Plans M micro-batches at once. lengths (M,n) from `sequence_lengths`. All micro-batches get the same
    R (they run in one scan): the largest any needs, rounded by `pack_rows`, and at least `min_rows`
    (a caller may keep R from shrinking so that a run compiles few shapes). Returns the plan with a
    leading M axis (module docstring)."""
    plans = [first_fit_decreasing(np.asarray(l), pack_length) for l in lengths]
    needed = max([len(f) for _, _, f in plans] + [min_rows])
    r = pack_rows(needed, multiple, cap=max(lengths.shape[1], min_rows))
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
    (packed {tokens, positions, mask, segment_ids} each (R,L), source (n,T+1) flat slot of the hidden state
    that predicts completion column t (column T: the state after the row's last real token), valid (n,T+1)
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
    slot = jnp.where(inside, packed_row * length + plan["offset"][:, None] + j, r * length)  # r*L: dropped

    def scatter(values):  # (n,P+T,...) -> (R,L,...)
        rest = values.shape[2:]
        return (jnp.zeros((r * length, *rest), values.dtype).at[slot.reshape(-1)]
                .set(values.reshape(-1, *rest), mode="drop").reshape(r, length, *rest))

    segment = jnp.broadcast_to(jnp.arange(1, n + 1, dtype=jnp.int32)[:, None], tokens.shape)
    packed = {"tokens": scatter(tokens), "positions": scatter(jnp.broadcast_to(j, tokens.shape)),
              "mask": scatter(key & inside), "segment_ids": scatter(jnp.where(inside, segment, 0))}
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
    """Final-norm hidden states (R,L,D) of packed rows: each segment attends only to itself.
    dropout_rng: a key for LoRA dropout (training only). MoE: packed["routes"], when present, is replayed."""
    hidden, _ = Decoder(config, with_lm_head=False).apply(
        {"params": params}, packed["tokens"], packed["positions"], packed["mask"], segment_ids=packed["segment_ids"],
        rngs=None if dropout_rng is None else {"dropout": dropout_rng}, routes=packed.get("routes"))
    return hidden


def unpack(x, source, valid, columns: int):
    """(R,L) per-slot values -> (n, columns) at the completion layout; 0 where not valid."""
    flat = jnp.take(x.reshape(-1), source[:, :columns], axis=0)
    return jnp.where(valid[:, :columns], flat, 0.0)


def packed_logprobs(config: ModelConfig, params, prompts, prompt_mask, completions, completion_mask, plan,
                    pack_length: int, temperature=1.0, *, with_entropy: bool = False, dropout_rng=None,
                    prompt_routes=None, routes=None):
    """`logprobs_from_hidden(completion_hidden(...))` through packed rows: logp (n,T) [and entropy (n,T)],
    equal on every real completion token, 0 elsewhere. The LM head runs on the packed slots only.
    MoE routing replay: prompt_routes (b,P,L,k), routes (n,T,L,k) rows first (`pack_layout`)."""
    packed, source, valid = pack_layout(prompts, prompt_mask, completions, completion_mask, plan, pack_length,
                                        prompt_routes, routes)
    hidden = packed_hidden(config, params, packed, dropout_rng)
    targets = jnp.roll(packed["tokens"], -1, axis=1)  # the slot after each one: the token it predicts
    out = logprobs_from_hidden(config, params, hidden, targets, temperature, with_entropy=with_entropy)
    t = completions.shape[1]
    if with_entropy:
        return unpack(out[0], source, valid, t), unpack(out[1], source, valid, t)
    return unpack(out, source, valid, t)


def packed_values(config: ModelConfig, vparams, prompts, prompt_mask, completions, completion_mask, plan,
                  pack_length: int, head, *, last: bool = False):
    """head(hidden) at the completion layout through packed rows: (n,T), or (n,T+1) with `last` (column T:
    the state after the row's last real token, V(s_T) for a truncated row). `head` maps (...,D) -> (...)."""
    packed, source, valid = pack_layout(prompts, prompt_mask, completions, completion_mask, plan, pack_length)
    values = head(packed_hidden(config, vparams["backbone"], packed))
    return unpack(values, source, valid, completions.shape[1] + (1 if last else 0))
