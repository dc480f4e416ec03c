"""Partial rollouts (`rollout.partial`): the decode goes on across training steps, and every batch is made
of the first groups to complete, so the longest rows of a batch no longer set its time.

The table: 2B groups (B = rollout.batch_prompts, G rows each, R = 2BG rows) in the order their prompts
were drawn; each row holds the tokens drawn so far, with each token's policy version and behaviour
log-prob. The round of step i (one per training step, in step order; trainer/async_rollout.py requests
it at step i-1 with that step's policy, version i-1, or 0 for the first two):
  1. the table is filled up to 2B groups with the next prompts (two batches in the first round, then one);
     their rows' key is step i's sampling key, their stream index their place among the rows drawn in
     this round (sampling/partial.py);
  2. the groups whose oldest token would be more than k = rollout.max_staleness versions behind step i + 1
     are held: step i's batch must take them, so the round may not stop before they are done
     (`rollout/partial/held` counts those not done yet; they are among the B groups left from earlier
     rounds, so never more than B);
  3. one decode round (sampling/partial.py `round_program`) with this version's weights: every row not
     done goes on from its last token, until B groups have all their rows done and so have the held ones;
  4. the held groups, then the other complete groups in the order they completed (earlier rounds first,
     then by the decode step of their last row, then table order), B in all, are the batch of step i,
     scored by the reward functions now; the other rows stay in the table, in flight.
So every token of step i's batch was drawn by a version in [i-k, i-1] (for the first steps, 0) -- no row is
ever dropped or restarted, a long row at worst makes the round of its last allowed step wait -- and the
batch's `policy_version` per row is its oldest token's; `token_versions` (N,T) feeds the per-token
staleness metrics, and the rollout correction reads each token's own behaviour log-prob.

Several processes (mesh.rollout_devices = 0): the table is the same on every host (each round gathers the
hosts' new prompts and the table's rows after the round), the round runs on the global mesh, and each
host scores and trains its block of the batch, as the synchronous path does: 2 processes equal 1
(tests/test_pods.py).

Deterministic: the swaps happen at fixed steps and the rounds stop on a count of groups, not on a clock.
Exact resume: the table (tokens, versions, log-probs, keys, the prompts and their dataset columns) is in
the checkpoint (`state`/`restore`); every round rebuilds its rows' caches by a prefill anyway, so a
resumed round is the uninterrupted one.
"""
from __future__ import annotations

import base64
import io
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import distributed as dist
from jaxrl_llm import faults, sharding
from jaxrl_llm.data.padding import left_pad
from jaxrl_llm.models.moe import NO_ROUTE
from jaxrl_llm.sampling.partial import empty_rows, resumes, run_round

_GROUP_KEYS = ("prompt_tokens", "prompt_mask", "keys", "done_at", "prompt_routes")  # per group


def _key_data(key) -> np.ndarray:
    """A PRNG key's raw (2,) uint32 words (typed keys unwrapped)."""
    data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return np.asarray(data, np.uint32)


class PartialRollouts:
    """The table of rows in flight across rounds, drawing prompts from `rollouts.data` and scoring with
    `rollouts` (trainer/rollout.py `Rollouts`). `collect(params, key, step, version)` runs step's round."""

    def __init__(self, c, rollouts):
        if jax.process_count() > 1 and c.mesh.rollout_devices:
            raise ValueError("config.mesh.rollout_devices must be 0 with rollout.partial on several processes (a "
                             "round gathers every host's rows, which a host's rollout mesh sampling alone cannot)")
        self.c, self.rollouts = c, rollouts
        mc = rollouts.mc
        # MoE routing replay: each fed token's experts under the version that fed it; a group's prompt's
        # under the version of the round it entered the table.
        self.route_shape = ((mc.num_layers, mc.num_experts_per_tok) if mc.num_experts and c.model.routing_replay
                            else None)
        self.B, self.G = c.rollout.batch_prompts, c.rollout.group_size
        self.groups: list[dict] = []  # each group's dataset columns (what rewards see), in table order
        self.rows: dict | None = None
        self.per_group: dict | None = None
        self.round = 0

    # ------------------------------------------------------------------ the table
    def _add(self, batch: dict, key, stream0: int) -> None:
        """Appends a batch of prompts (every host's: `batch` is this host's block; their G rows each, not
        started) to the table."""
        c, G = self.c, self.G
        columns = [k for k in batch if k != "global_max_prompt_length"]
        groups = _gather_groups([{k: batch[k][i] for k in columns} for i in range(len(batch["prompt_ids"]))])
        n = len(groups)
        tokens, mask = left_pad([g["prompt_ids"] for g in groups], c.data.max_prompt_length, self.rollouts.pad_id)
        rows = empty_rows(n * G, c.rollout.max_new_tokens, self.rollouts.pad_id)
        rows["stream"] += stream0
        group = {"prompt_tokens": tokens, "prompt_mask": mask, "keys": np.stack([_key_data(key)] * n),
                 "done_at": np.full(n, -1, np.int64)}
        if self.route_shape:
            rows["routes"] = np.full((n * G, c.rollout.max_new_tokens, *self.route_shape), NO_ROUTE, np.int32)
            group["prompt_routes"] = np.full((n, tokens.shape[1], *self.route_shape), NO_ROUTE, np.int32)
        self.groups += groups
        if self.rows is None:
            self.rows, self.per_group = rows, group
        else:
            self.rows = {k: np.concatenate([self.rows[k], rows[k]]) for k in rows}
            self.per_group = {k: np.concatenate([self.per_group[k], group[k]]) for k in group}

    def _keep(self, groups: np.ndarray) -> None:
        """Keeps only `groups` (indices, in table order) in the table."""
        rows = (groups[:, None] * self.G + np.arange(self.G)).ravel()
        self.rows = {k: v[rows] for k, v in self.rows.items()}
        self.per_group = {k: v[groups] for k, v in self.per_group.items()}
        self.groups = [self.groups[i] for i in groups]

    def _held(self, step: int, version: int) -> np.ndarray:
        """(Q,) bool: the groups whose oldest token would be more than k versions behind step + 1, so this
        round's batch must take them. A group's rows all draw their first token in the round it entered
        the table, by that round's version (`version` for the groups not started)."""
        r, G = self.rows, self.G
        head = np.where(r["lengths"] > 0, r["versions"][:, 0], version).reshape(-1, G).min(axis=1)
        return step + 1 - head > self.c.rollout.max_staleness

    def _device(self, x: np.ndarray):
        """A host array of the table (rows or groups first; the same on every host) as a global array, rows
        over the rollout mesh's row shards."""
        return dist.to_global(x[dist.host_rows(len(x))], sharding.batch_sharding(self.rollouts.mesh, x.ndim))

    # ------------------------------------------------------------------ one round
    def collect(self, params, key, step: int, version: int):
        """The round of `step` with `params` (after `version` updates) and step's sampling key `key`:
        (rows of the batch, the same rows (what the metrics describe), info), as `Rollouts.collect`."""
        c, ro, B, G = self.c, self.rollouts, self.B, self.G
        t0 = time.perf_counter()
        added, old = 0, len(self.groups)
        while len(self.groups) < 2 * B:
            self._add(next(ro.data), key, added * G)
            added += B
        hold = self._held(step, version)
        if hold.sum() > B:  # the table holds B groups from earlier rounds: never more to take
            raise RuntimeError(f"partial rollouts: {int(hold.sum())} groups must be in step {step}'s batch of {B}")
        complete = self.rows["done"].reshape(-1, G).all(axis=1)
        waited = int((hold & ~complete).sum())
        before = int(self.rows["lengths"].sum())
        resume = resumes(self.rows["lengths"], self.rows["done"], c.rollout.decode_slots)
        with sharding.use_mesh(ro.mesh):
            table = {k: self._device(v) for k, v in self.rows.items()}
            if "routes" in table:  # rows first on the host, layers first in the program
                table["routes"] = table["routes"].transpose(2, 0, 1, 3)
            g = {k: self._device(self.per_group[k]) for k in ("prompt_tokens", "prompt_mask", "keys")}
            out = run_round(ro.mc, params, g["prompt_tokens"], g["prompt_mask"], g["keys"], table, version, B,
                            max_new_tokens=c.rollout.max_new_tokens, num_samples=G, slots=c.rollout.decode_slots,
                            eos_ids=ro.eos_ids, temperature=c.rollout.temperature, top_k=c.rollout.top_k,
                            top_p=c.rollout.top_p, repetition_penalty=c.rollout.repetition_penalty,
                            min_p=c.rollout.min_p, hold=self._device(hold), resume=resume)
        faults.point("sample")  # the round is running (dispatch is asynchronous)
        # The whole table back on every host (a gather on several processes): every host keeps it whole.
        self.rows = {k: np.array(dist.fetch(out[k])) for k in self.rows}
        if "routes" in self.rows:
            self.rows["routes"] = self.rows["routes"].transpose(1, 2, 0, 3)
            self.per_group["prompt_routes"][old:] = dist.fetch(out["prompt_routes"]).transpose(1, 2, 0, 3)[old:]
        finish, steps = dist.fetch(out["finish"]).reshape(-1, G), int(dist.fetch(out["iterations"]))
        complete = self.rows["done"].reshape(-1, G).all(axis=1)
        done_at = self.per_group["done_at"]
        new = complete & (done_at < 0)
        done_at[new] = self.round * 2 ** 31 + finish[new].max(axis=1).astype(np.int64)  # completes with its last row
        order = sorted(np.nonzero(complete)[0], key=lambda i: (not hold[i], done_at[i], i))
        take = np.asarray(order[:B], np.int64)
        local, batch = self._batch(take[dist.host_rows(B)])  # this host's block of the batch, as Rollouts'
        drawn = int(self.rows["lengths"].reshape(-1, G)[take].sum())  # the batch's tokens, every host's
        self._keep(np.asarray([i for i in range(len(self.groups)) if i not in set(take.tolist())], np.int64))
        self.round += 1
        prompts, columns = ro.reward_inputs(batch, local, step)
        local, scored = ro._score(local, prompts, ro.completions(local), columns)
        in_flight = int(((self.rows["lengths"] > 0) & ~self.rows["done"]).sum())
        info = {**scored, "reward_metrics": scored["rewards"].metrics, "rounds": 1,
                "sample_s": time.perf_counter() - t0,
                "gen_tokens": float(int(self.rows["lengths"].sum()) + drawn - before) / jax.process_count(),
                "partial": {"rollout/partial/held": float(waited), "rollout/partial/in_flight": float(in_flight),
                            "rollout/partial/decode_steps": float(steps)}}
        return local, dict(local), info

    def _batch(self, groups: np.ndarray):
        """(rows of the batch, its dataset columns) of the table's `groups`."""
        G, eos = self.G, np.asarray(self.rollouts.eos_ids)
        rows = (groups[:, None] * G + np.arange(G)).ravel()
        r = {k: v[rows] for k, v in self.rows.items()}
        T = r["tokens"].shape[1]
        mask = (np.arange(T)[None] < r["lengths"][:, None]).astype(np.int32)
        last = np.take_along_axis(r["tokens"], np.maximum(r["lengths"] - 1, 0)[:, None], 1)[:, 0]
        local = {"prompt_tokens": self.per_group["prompt_tokens"][groups],
                 "prompt_mask": self.per_group["prompt_mask"][groups],
                 "tokens": np.where(mask == 1, r["tokens"], self.rollouts.pad_id).astype(np.int32), "mask": mask,
                 "sampler_logp": r["logprobs"][:, 0] * mask, "behavior_logp": r["logprobs"][:, 1] * mask,
                 "lengths": r["lengths"].astype(np.int32), "truncated": ~np.isin(last, eos),
                 "policy_version": r["versions"][:, 0].astype(np.int32),
                 "token_versions": np.where(mask == 1, r["versions"], 0).astype(np.int32)}
        if "routes" in r:  # MoE routing replay: (rows, tokens, L, k), as Rollouts' rows
            local["routes"], local["prompt_routes"] = r["routes"], self.per_group["prompt_routes"][groups]
        columns = self.groups[0].keys() if self.groups else ()
        batch = {k: [self.groups[i][k] for i in groups] for k in columns}
        return local, batch

    # ------------------------------------------------------------------ checkpoint
    def state(self) -> dict:
        """The table as JSON: its arrays as a base64 .npz (no pickle), the groups' dataset columns as JSON."""
        if self.rows is None:
            return {"round": self.round}
        buf = io.BytesIO()
        np.savez_compressed(buf, **self.rows, **self.per_group)
        return {"round": self.round, "arrays": base64.b64encode(buf.getvalue()).decode("ascii"),
                "groups": self.groups}

    def restore(self, state: dict) -> None:
        self.round = int(state["round"])
        if "arrays" not in state:
            return
        with np.load(io.BytesIO(base64.b64decode(state["arrays"])), allow_pickle=False) as z:
            self.rows = {k: z[k] for k in z.files if k not in _GROUP_KEYS}
            self.per_group = {k: z[k] for k in z.files if k in _GROUP_KEYS}
        self.groups = list(state["groups"])


def _gather_groups(local: list[dict]) -> list[dict]:
    """Every process's groups (dataset columns per prompt), in process order, on every process: the table
    is the same on every host. Through JSON, as a resumed run reads them from the checkpoint, so both
    runs' rewards see the same values; a column JSON cannot hold is refused by name."""
    try:
        text = json.dumps(local, default=_plain)
    except TypeError as e:
        raise ValueError(f"rollout.partial checkpoints the prompts in flight with their dataset columns as JSON: "
                         f"{e}") from None
    return [g for words in dist.allgather_lists([list(text.encode())]) for g in json.loads(bytes(words).decode())]


def _plain(x):
    """JSON for NumPy values in dataset columns; anything else is refused by name."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"a column holds a {type(x).__name__}, which JSON cannot store")
