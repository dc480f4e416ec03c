"""Micro-batches by a token budget (`train.max_tokens_per_microbatch` = K > 0): which rows each score chunk
and update micro-batch holds, independent of the groups.

K is the tokens one micro-batch holds on each row shard (data x fsdp), so it bounds a chip's activations
whatever the mesh and the batch. A micro-batch is a set of rows, not of prompts: a group's G rows may sit
in different micro-batches (its statistics, the advantages, are computed before the split, by
`Objective.prepare` over the whole batch), and every loss term divides by the whole minibatch's
normalisers (`Objective.denominators`), so the micro-batches' losses and gradients add up to the
minibatch's exactly, as with `train.grad_accum`.

  * Unpacked: a micro-batch is r = shards * floor(K / (P+T)) rows, each with its own copy of its prompt
    (`row_batch`: G = 1 in the forward, so a group's rows need not be together), chosen strided (micro-batch
    m holds rows m, m+M, m+2M, ...: every row shard contributes to every micro-batch). The last
    micro-batches are padded with row 0, absent (`present` False): its masks are zeroed, so it trains
    nothing and counts in no metric. Static: r and M follow from the shapes at trace time.
  * Packed (`train.pack_length` = L): the host packs the whole minibatch (trainer/packs.py) and splits its
    packed rows into micro-batches of shards * floor(K / L) packed rows (`split_plan`); each micro-batch's
    forward reads the whole minibatch's rows through its plan (a row outside it is not packed: outputs 0)
    and its loss reads the rows it packed (`present` = plan row >= 0).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

PROMPT_KEYS = ("prompt_tokens", "prompt_mask", "prompt_routes")  # indexed by prompt, the others by row
MASK_KEYS = ("mask", "loss_mask", "attention_mask")  # zeroed on absent rows: no token attended, trained, counted


def rows_per_micro(budget: int, row_tokens: int, shards: int, rows: int) -> int:
    """Rows of one unpacked micro-batch: `shards` x floor(budget / row_tokens) (K tokens per row shard),
    at most `rows` rounded up to `shards`; at least `shards` (validation refuses a budget below a row)."""
    per_shard = max(budget // row_tokens, 1)
    return min(shards * per_shard, -(-rows // shards) * shards)


def strided_rows(rows: int, per_micro: int) -> tuple[np.ndarray, np.ndarray]:
    """(index (M, r) int32, present (M, r) bool): micro-batch m holds rows m, m+M, ... (< rows); the
    M*r - rows slots past the last row hold row 0, absent. M = ceil(rows / r)."""
    m = -(-rows // per_micro)
    j = np.arange(m * per_micro, dtype=np.int32).reshape(per_micro, m).T
    present = j < rows
    return np.where(present, j, 0).astype(np.int32), present


def row_batch(b: dict, rows, present, group_size: int) -> dict:
    """The rows `rows` (r,) of batch `b` (n rows, n / group_size prompts) as a batch of r rows with one
    prompt each (G = 1); the masks of absent rows (`present` (r,) False) zeroed."""
    out = {k: v[rows // group_size] if k in PROMPT_KEYS else v[rows] for k, v in b.items() if v is not None}
    return only_present(out, present)


def only_present(b: dict, present) -> dict:
    """`b` with the masks of its absent rows (`present` (n,) False) zeroed."""
    keep = jnp.asarray(present)[:, None]
    return {k: (v * keep).astype(v.dtype) if k in MASK_KEYS else v for k, v in b.items()}


def split_plan(plan: dict, per_micro: int, micro: int) -> dict:
    """A packing plan of one pass over all its rows ("row" (n,), "offset" (n,)[, "prompt_offset" (n,)],
    "slots" (R,), packed rows used first to last) as `micro` micro-batches of `per_micro` packed rows each:
    packed row k goes to micro-batch k // per_micro; a row packed elsewhere has row -1 in a micro-batch
    (not packed there). Returns the plan with a leading (micro,) axis; slots (micro, per_micro)."""
    row = np.asarray(plan["row"])
    used = int(np.sum(np.asarray(plan["slots"]) > 0))
    if used > per_micro * micro:
        raise ValueError(f"{used} packed rows do not fit {micro} micro-batches of {per_micro}")
    slots = np.zeros(per_micro * micro, np.int32)
    slots[:used] = np.asarray(plan["slots"])[:used]
    first = np.arange(micro, dtype=np.int32)[:, None] * per_micro
    inside = (row[None] >= first) & (row[None] < first + per_micro)
    out = {"row": np.where(inside, row[None] - first, -1).astype(np.int32),
           "slots": slots.reshape(micro, per_micro)}
    for k in ("offset", "prompt_offset"):
        if k in plan:
            out[k] = np.broadcast_to(np.asarray(plan[k])[None], (micro, len(row))).copy()
    return out


def score_by_tokens(chunk, plan, row_shards: int, b, pack):
    """The score pass's outputs (n, ...) over micro-batches of `plan.microbatch_tokens` tokens per row
    shard (`plan`: the step's UpdatePlan). chunk(batch, pack) -> {name: (rows, ...)}. Unpacked: strided
    chunks of rows, each with its prompt; packed: each chunk's plan over all the rows, its outputs kept on
    the rows it packed (0 elsewhere) and added up."""
    n = b["tokens"].shape[0]
    if pack is None:
        r = rows_per_micro(plan.microbatch_tokens, b["prompt_tokens"].shape[1] + b["tokens"].shape[1], row_shards, n)
        idx, present = strided_rows(n, r)
        outs = jax.lax.map(lambda xs: chunk(row_batch(b, xs[0], xs[1], plan.group_size), None),
                           (jnp.asarray(idx), jnp.asarray(present)))
        # chunk m's row i is row i*M + m: (M, r, ...) -> (r, M, ...) -> rows in order, the padding last
        return {name: x.swapaxes(0, 1).reshape(-1, *x.shape[2:])[:n] for name, x in outs.items()}

    def one(pk):
        present = pk["row"] >= 0
        out = chunk(only_present(b, present), pk)
        return {name: jnp.where(present.reshape(-1, *[1] * (x.ndim - 1)), x, 0.0) for name, x in out.items()}

    acc = one(jax.tree_util.tree_map(lambda x: x[0], pack))
    if pack["row"].shape[0] > 1:
        acc, _ = jax.lax.scan(lambda a, pk: (jax.tree_util.tree_map(jnp.add, a, one(pk)), None), acc,
                              jax.tree_util.tree_map(lambda x: x[1:], pack))
    return acc
