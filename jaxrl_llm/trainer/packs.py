"""The host side of sequence packing (`train.pack_length` > 0): the packing plans of a step's score
chunks and update micro-batches, in the row order the jitted steps select them (steps.minibatch).

The plans are made on the host (numpy first-fit-decreasing over the rows' lengths: 31 ms for 512 rows,
0.24 s for 8 micro-batches of 512 on the loaded 2-core development machine, next to passes of seconds
to minutes) because the number of packed rows R they need is data-dependent and must be a static shape: the host
rounds each step's need up to a bucket (models/packing.pack_rows, four per doubling), and each pass
compiles once per R it runs (the LM-head rows K follow R: every slot, the chunks past the last predictor
skipped at run time). The shapes follow the need, reusing a shape already compiled when it is at most one
bucket above it, until the rows that reuse wastes add up to about a compile (`choose_shape`): a high-water
mark would keep every step at the size of the longest batch seen (measured, heavy-tailed lengths at
SmolLM2-135M's shape: one long batch took R from 4 to 6 rows of 128 for all later steps, score + update
7.0 s against 4.6-5.3 s before it), exact buckets alone compiled a new shape at most steps of a short run,
and reuse without a bound ran a frequent need one bucket high for the rest of a run. Models/packing.py
does the packing itself, on device.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import sharding
from jaxrl_llm.compile_options import jit
from jaxrl_llm.models.kernels import resolve_attention
from jaxrl_llm.models.packing import pack_efficiency, pack_rows, plan_packs, plan_shared_packs, sequence_lengths
from jaxrl_llm.trainer.microbatches import split_plan
from jaxrl_llm.trainer.steps import attended


def trained_lengths(prompt_mask, mask, loss_mask):
    """(N,) packed length of each row (`sequence_lengths`), 0 for a row without loss tokens: DAPO's filler
    rows and masked truncations are not trained, so they are not packed either (their outputs are 0).
    prompt_mask (B,P), mask and loss_mask (N,T)."""
    trained = jnp.any(loss_mask > 0, axis=1, keepdims=True)
    return sequence_lengths(prompt_mask, jnp.where(trained, mask, 0))


def lengths_and_prompts(prompt_mask, mask, loss_mask):
    """((N,) `trained_lengths`, (N,) each row's prompt tokens)."""
    n = mask.shape[0]
    plen = jnp.sum(prompt_mask.astype(bool), axis=1, dtype=jnp.int32)
    return trained_lengths(prompt_mask, mask, loss_mask), jnp.repeat(plen, n // prompt_mask.shape[0])


def shares_prompt(requested: bool, model_config, pack_length: int) -> bool:
    """Whether packed rows hold a prompt once for its completions: as `train.pack_share_prompt` asks, except
    where the packed passes' attention is splash (named, or `auto` on a TPU): its kernel has no mask for a
    shared prompt, so there a packed row keeps a copy of the prompt per completion and splash runs."""
    mc = model_config
    return requested and resolve_attention(mc.attention, backend=jax.default_backend(), dtype=mc.dtype,
                                           head_dim=mc.head_dim, keys=pack_length, segments=True) != "splash"


# How long a need of r rows may run on a compiled shape one bucket above it before r gets its own compile,
# in passes at r's shape: the rows it wastes add up to this, then the need is compiled (ski rental: renting
# costs (R - r) / r of a pass per step, buying is one compile). A new shape's compile took 1.4-1.6 passes
# at SmolLM2-135M's shape on the 2-core CPU (update: trace + compile 5.6 s against 3.4-4 s a pass; score
# 1.5 s against ~1 s). Without the budget a need of 4 rows ran on 5 for the rest of a run once one long
# batch had compiled 5: 69% of the slots real over 300 heavy-tailed steps against 80% with exact shapes.
REUSE_BUDGET = 1.5


def choose_shape(used: set, r: int, multiple: int = 1, wasted: dict | None = None) -> int:
    """The R a pass runs for a need of r packed rows (already a `pack_rows` bucket): the smallest in `used`
    (those it has run) that fits and is at most one bucket above the need (the next `pack_rows` bucket),
    else the need itself. `wasted` (need -> passes wasted so far, updated here): a need reuses a larger
    shape only while what it has wasted that way stays within REUSE_BUDGET; then it compiles its own."""
    fits = sorted(rr for rr in used if r <= rr <= pack_rows(r + 1, multiple, cap=2 ** 62))
    if not fits:
        return r
    shape = fits[0]
    if shape == r or wasted is None:
        return shape
    spent = wasted.get(r, 0.0) + (shape - r) / r
    if spent > REUSE_BUDGET:
        return r
    wasted[r] = spent
    return shape


class Packer:
    """Plans for one run: `score(b)` for the score pass, `update(pidx)` for each optimizer step.
    share_prompt: each prompt shared by its completions in a packed row (models/packing.py
    `first_fit_shared`, train.pack_share_prompt), else a copy of it per completion. microbatch_tokens
    (train.max_tokens_per_microbatch) > 0: each pass packs all its rows at once and splits the packed rows
    into micro-batches of that many tokens per row shard (trainer/microbatches.py), their count M bucketed
    and reused as R is (`choose_shape`)."""

    def __init__(self, pack_length: int, group_size: int, score_chunks: int, grad_accum: int, mesh,
                 share_prompt: bool = True, microbatch_tokens: int = 0):
        self.pack_length, self.group_size, self.share_prompt = pack_length, group_size, share_prompt
        self.score_chunks, self.grad_accum = score_chunks, grad_accum
        self.multiple = sharding.row_shards(mesh)  # packed rows shard over data x fsdp like any trainer rows
        # packed rows per token-budget micro-batch: microbatch_tokens // pack_length on each row shard
        self.rows_per_micro = self.multiple * (microbatch_tokens // pack_length)
        self.lengths_fn = jit(lengths_and_prompts, out_shardings=sharding.replicated(mesh))
        self.lengths = self.prompt_lengths = None
        # the R (by a token budget: the micro-batch counts M) each pass has run, and choose_shape's reuse
        self.shapes: dict[str, set] = {"score": set(), "update": set()}
        self.wasted: dict[str, dict] = {"score": {}, "update": {}}
        self.efficiency: list[float] = []

    def _plan(self, kind: str, prompt_groups: np.ndarray) -> dict:
        """Plans of the micro-batches whose prompts are the rows of `prompt_groups` (M, prompts)."""
        rows = (prompt_groups[:, :, None] * self.group_size + np.arange(self.group_size)).reshape(len(prompt_groups), -1)
        if self.share_prompt:
            plan = plan_shared_packs(self.prompt_lengths[rows], self.lengths[rows], self.group_size, self.pack_length,
                                     self.multiple)
        else:
            plan = plan_packs(self.lengths[rows], self.pack_length, self.multiple)
        if self.rows_per_micro:
            return self._split(kind, plan)
        r = choose_shape(self.shapes[kind], plan["slots"].shape[-1], self.multiple, self.wasted[kind])
        self.shapes[kind].add(r)
        plan["slots"] = np.pad(plan["slots"], ((0, 0), (0, r - plan["slots"].shape[-1])))  # empty rows
        # The LM head runs on the slots that predict a completion token, gathered first; K = every slot of
        # the R rows, since the LM-head chunks past the last predictor are skipped (packing.lm_head_rows):
        # K never needs a compile of its own.
        plan["predict"] = np.zeros((len(rows), r * self.pack_length), np.int32)
        self.efficiency.append(pack_efficiency(plan, self.pack_length))
        return plan

    def _split(self, kind: str, plan: dict) -> dict:
        """A token budget: the one plan of all the pass's rows (leading axis 1) as M micro-batches of
        `rows_per_micro` packed rows (microbatches.split_plan)."""
        used = int(np.sum(plan["slots"] > 0))
        need = pack_rows(-(-used // self.rows_per_micro), 1, cap=2 ** 62)
        micro = choose_shape(self.shapes[kind], need, 1, self.wasted[kind])
        self.shapes[kind].add(micro)
        plan = split_plan(jax.tree_util.tree_map(lambda x: x[0], plan), self.rows_per_micro, micro)
        plan["predict"] = np.zeros((micro, self.rows_per_micro * self.pack_length), np.int32)
        self.efficiency.append(pack_efficiency(plan, self.pack_length))
        return plan

    def score(self, b) -> dict:
        """The score chunks' plans (leading axis k); reads the batch's lengths for the step's updates."""
        self.lengths, self.prompt_lengths = map(np.asarray, self.lengths_fn(b["prompt_mask"], attended(b),
                                                                              b["loss_mask"]))
        self.efficiency = []
        n_prompts = b["prompt_tokens"].shape[0]
        chunks = 1 if self.rows_per_micro else self.score_chunks  # a token budget: all rows, then split
        return self._plan("score", np.arange(n_prompts).reshape(-1, chunks).T)

    def update(self, pidx) -> dict:
        """The plans of the micro-batches of the prompts `pidx` (after `score` of this batch): grad_accum
        groups of prompts, or by a token budget all the rows, split."""
        return self._plan("update", np.asarray(pidx).reshape(1 if self.rows_per_micro else self.grad_accum, -1))

    def metrics(self) -> dict[str, float]:
        """`train/pack_efficiency`: real tokens / packed slots over the step's passes."""
        return {"train/pack_efficiency": float(np.mean(self.efficiency))} if self.efficiency else {}

