"""Rollouts on the host side: sample G completions per prompt, decode them, score them with the reward
functions, [DAPO: drop groups whose rewards are all equal and sample more], and put the batch on the mesh.
With `env.name`, each completion is a multi-turn episode (`trainer/episodes.py`): its rows also carry
`attention_mask` (every real token, environment tokens included), `mask` being the model's tokens.

Rows are this process's: B_local prompts x G completions, prompt b owning rows b*G..b*G+G-1.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import jax
import numpy as np

from jaxrl_llm import distributed as dist
from jaxrl_llm import envs, faults, rl, sharding
from jaxrl_llm.data import pad_prompt_batch, reward_columns
from jaxrl_llm.models import paged
from jaxrl_llm.rewards import TrainerState, generation_fields, score_rewards
from jaxrl_llm.sampling import generate, page_shards, pool_pages
from jaxrl_llm.trainer import supervised
from jaxrl_llm.trainer.episodes import sample_episodes

log = logging.getLogger(__name__)
_PROMPT_KEYS = ("prompt_tokens", "prompt_mask", "prompt_routes")  # indexed by prompt; every other key by row
# Rewards that shape length rather than judge the answer: DAPO's dynamic sampling ignores them by default.
LENGTH_SHAPING = ("overlong", "length_penalty")


class Rollouts:
    """Draws rollout batches from the prompt iterator with the current policy parameters."""

    def __init__(self, c, mc, mesh, data, tokenizer, reward_fns, eos_ids, pad_id, per_host: bool = False):
        # per_host: `mesh` holds only this host's devices, sampling its block of rows alone (a rollout mesh
        # across hosts, under `dist.host_only`); its draws are those of its rows in the global batch.
        self.c, self.mesh, self.data, self.tokenizer, self.per_host = c, mesh, data, tokenizer, per_host
        self.reward_fns, self.eos_ids, self.pad_id = reward_fns, eos_ids, pad_id
        # The sampler may compute in another precision than the trainer (a bfloat16 sampler, as an
        # inference engine would be): the rollout correction then sees the gap.
        self.mc = dataclasses.replace(mc, dtype=c.rollout.compute_dtype) if c.rollout.compute_dtype else mc
        self.process = rl.ESTIMATORS[c.advantage.estimator].process
        self.kv_pages = None  # the paged cache's pool per row shard, set at the first batch (`_pool_pages`)
        self.rows_sharding = sharding.batch_sharding(mesh, 2)
        self.vec_sharding = sharding.batch_sharding(mesh, 1)
        self.env = envs.make_env(c.env.name, c.env.kwargs.to_dict()) if c.env.name else None

    def sample_round(self, params, key, step: int = 0):
        """One batch of prompts sampled and scored at training step `step`: (this host's rows as NumPy,
        its texts and rewards: a dict of prompts, completions, references (the answer column or None) and
        the RewardBatch)."""
        c = self.c
        batch = next(self.data)
        if self.env is not None:
            return self._episode_round(batch, params, key, step)
        tokens, pmask = pad_prompt_batch(batch, c.data.max_prompt_length, self.pad_id)
        if c.distill.lmbda < 1:  # GKD's supervised prompts (trainer/supervised.py)
            sup = supervised.supervised_prompts(key, c.distill.lmbda, len(tokens))
            rows = supervised.encode_completions(self.tokenizer, batch[c.data.completion_column],
                                                 c.rollout.max_new_tokens, self.eos_ids[0], self.pad_id)
            local = None if sup.all() else self._sampled(tokens, pmask, params, key)  # λ·B = 0: nothing sampled
            local = {"prompt_tokens": tokens, "prompt_mask": pmask,
                     **supervised.mix_rows(local, sup, rows, c.rollout.group_size)}
        else:
            local = {"prompt_tokens": tokens, "prompt_mask": pmask, **self._sampled(tokens, pmask, params, key)}
        prompts, columns = self.reward_inputs(batch, local, step)
        return self._score(local, prompts, self.completions(local), columns)

    def _sampled(self, tokens, pmask, params, key) -> dict:
        """This host's rows sampled by the policy from the prompts (B,P): tokens, masks and log-probs."""
        c = self.c
        prompts_g, pmask_g = dist.to_global(tokens, self.rows_sharding), dist.to_global(pmask, self.rows_sharding)
        with sharding.use_mesh(self.mesh):
            r = generate(self.mc, params, prompts_g, pmask_g, key, max_new_tokens=c.rollout.max_new_tokens,
                         num_samples=c.rollout.group_size, temperature=c.rollout.temperature,
                         top_k=c.rollout.top_k, top_p=c.rollout.top_p,
                         repetition_penalty=c.rollout.repetition_penalty, min_p=c.rollout.min_p,
                         eos_ids=self.eos_ids, pad_id=self.pad_id,
                         decode_slots=c.rollout.decode_slots, decode_shrink=c.rollout.decode_shrink,
                         row_block=self._row_block(len(tokens)), kv_page_size=c.rollout.kv_page_size,
                         kv_pages=self._pool_pages(len(tokens)))
        faults.point("sample")  # the sampler is running (dispatch is asynchronous)
        local = {"tokens": dist.to_local(r.tokens), "mask": dist.to_local(r.mask),
                 "sampler_logp": dist.to_local(r.logprobs), "behavior_logp": dist.to_local(r.behavior_logprobs),
                 "lengths": dist.to_local(r.lengths), "truncated": dist.to_local(r.truncated)}
        if r.routes is not None and c.model.routing_replay:  # MoE: the experts the sampler chose, to replay
            local["routes"] = dist.to_local(r.routes.transpose(1, 2, 0, 3))  # (N,T,L,k): rows first
            local["prompt_routes"] = dist.to_local(r.prompt_routes[:, ::c.rollout.group_size].transpose(1, 2, 0, 3))
        return local

    def _pool_pages(self, prompts: int) -> int:
        """rollout.kv_pages, resolved (and logged) once, when parameters and optimizer state are in place:
        auto sizes the pool from the memory they left (sampling/paged.py `pool_pages`)."""
        c = self.c
        if not c.rollout.kv_page_size:
            return 0
        if self.kv_pages is None:
            stats = jax.local_devices()[0].memory_stats() or {}
            free = stats["bytes_limit"] - stats["bytes_in_use"] if "bytes_limit" in stats else None
            self.kv_pages, line = pool_pages(
                self.mc, kv_pages=c.rollout.kv_pages, page_size=c.rollout.kv_page_size,
                prompt_length=c.data.max_prompt_length, max_new_tokens=c.rollout.max_new_tokens, prompts=prompts,
                slots=c.rollout.decode_slots, shards=page_shards(self.mesh, prompts, c.rollout.decode_slots),
                tensor=self.mesh.shape["tensor"], free_bytes=free)
            log.info(line)
            impl = paged.attention_impl(self.mc.attention, jax.default_backend(), self.mc.head_dim,
                                        c.rollout.kv_page_size)
            kind = {"xla": "XLA's (models/paged.py)", "pallas": "the Pallas TPU kernel (models/paged_kernel.py)",
                    "triton": "the Pallas kernel in Triton's form (models/paged_kernel_gpu.py)"}[impl]
            log.info(f"rollout.kv_page_size={c.rollout.kv_page_size}: the decode step's paged attention is {kind}, "
                     f"from model.attention={self.mc.attention} on {jax.default_backend()}")
        return self.kv_pages

    def _row_block(self, prompts: int):
        """(offset, total) of this host's rows in the global batch when it samples them alone, else None."""
        if not self.per_host:
            return None
        n = prompts * self.c.rollout.group_size
        return jax.process_index() * n, jax.process_count() * n

    def _score(self, local, prompts, completions, columns, env_rewards=None, env_metrics=None):
        """Scores the rows with the reward functions (+ the episodes' rewards): (local, scored)."""
        c = self.c
        rewards = score_rewards(self.reward_fns, prompts, completions, columns, on_error=c.reward.on_error)
        if env_rewards is not None:  # the episode's turn rewards (summed) add to the reward functions'
            rewards = dataclasses.replace(rewards, scores=(rewards.scores + env_rewards).astype(np.float32),
                                          components={**rewards.components, "env": env_rewards},
                                          metrics={**rewards.metrics, **env_metrics})
        local["scores"] = rewards.scores
        local["filter_scores"] = self._filter_scores(rewards)
        local["valid"] = np.ones(len(rewards.scores), np.float32)
        if self.process:
            local["process_rewards"], local["process_mask"] = process_arrays(rewards.steps, local["lengths"],
                                                                              local["mask"].shape[1])
        answer = c.data.answer_column
        scored = {"prompts": prompts, "completions": completions, "rewards": rewards,
                  "references": columns.get(answer) if answer else None}
        return local, scored

    def _episode_round(self, batch, params, key, step: int):
        """`sample_round` with `env.name`: G episodes per prompt row under the environment. Rewards: the
        episode's turn rewards (summed) plus the reward functions on its last model turn's text."""
        c, G = self.c, self.c.rollout.group_size
        columns = [k for k in batch if k != "global_max_prompt_length"]
        rows = [{k: batch[k][i] for k in columns} for i in range(len(batch["prompt_ids"])) for _ in range(G)]
        with sharding.use_mesh(self.mesh):
            ep = sample_episodes(self.mc, params, self.tokenizer, self.env, rows, key, max_turns=c.env.max_turns,
                                 max_new_tokens=c.rollout.max_new_tokens, max_turn_tokens=c.env.max_turn_tokens,
                                 temperature=c.rollout.temperature, top_k=c.rollout.top_k, top_p=c.rollout.top_p,
                                 repetition_penalty=c.rollout.repetition_penalty, min_p=c.rollout.min_p,
                                 pad_id=self.pad_id, max_workers=c.env.max_workers, group_size=G,
                                 stop_strings=tuple(c.env.stop_strings), max_failed_frac=c.env.max_failed_frac)
        faults.point("sample")
        local = {"prompt_tokens": ep.prompt_tokens[::G], "prompt_mask": ep.prompt_mask[::G], "tokens": ep.tokens,
                 "mask": ep.mask, "attention_mask": ep.attention_mask, "sampler_logp": ep.logprobs,
                 "behavior_logp": ep.behavior_logprobs, "lengths": ep.attention_mask.sum(1).astype(np.int32),
                 "truncated": ep.truncated}
        if ep.routes is not None and c.model.routing_replay:  # MoE: every token's experts, as the sampler fed it
            local["routes"], local["prompt_routes"] = ep.routes, ep.prompt_routes
        # env/... metrics are over every process's episodes (the same keys on every host).
        prompts, columns = self.reward_inputs(batch, local, step)
        local, scored = self._score(local, prompts, ep.finals(), columns, ep.rewards, ep.metrics)
        # The log shows the whole episode after the prompt reset() gave it (the rewards get the column).
        scored["completions"], scored["prompts"] = ep.decoded(self.tokenizer), ep.prompts
        return local, scored

    def _filter_scores(self, rewards):
        """What DAPO's dynamic sampling compares within a group (`dapo.filter_on`): by default the
        rewards but length shaping, so a group that is all wrong is dropped whatever its lengths."""
        on = self.c.dapo.filter_on
        if on == "total":
            return rewards.scores
        if on:
            return rewards.components[on]
        judged = [v for name, v in rewards.components.items() if name not in LENGTH_SHAPING]
        return np.sum(judged, axis=0).astype(np.float32) if judged else rewards.scores

    def completions(self, local) -> list[str]:
        """Each row's completion text as the reward functions receive it: up to its EOS, excluded."""
        ends = local["lengths"] - (~local["truncated"]).astype(np.int64)  # the EOS is not part of the text
        return self.tokenizer.batch_decode([row[:e] for row, e in zip(local["tokens"], ends)],
                                           skip_special_tokens=False)

    def reward_inputs(self, batch, local, step: int, repeat: int = 0):
        """(prompts, columns) of every row, as the reward functions receive them: every dataset column
        repeated over its group (`repeat` rows per batch row, the group size by default), and the
        trainer fields."""
        G = repeat or self.c.rollout.group_size
        # Rewards see the user's prompt (a reward model applies its own chat template); the rendered
        # prompt is the `prompt_text` column.
        prompts = [p for p in batch["prompt_user"] for _ in range(G)]
        columns = {k: [v for v in batch[k] for _ in range(G)] for k in reward_columns(batch)}
        columns.update(generation_fields(local["tokens"], local["lengths"], local["truncated"],
                                         self.c.rollout.max_new_tokens, TrainerState(step, self.c.total_steps)))
        return prompts, columns

    def collect(self, params, key, step: int = 0):
        """One batch of B prompts x G completions (with DAPO's dynamic sampling when enabled), at training
        step `step` (what rewards see as trainer_state.global_step).

        Returns (rows for the update, the first round's rows (what metrics describe), info)."""
        c = self.c
        G, B_local = c.rollout.group_size, c.rollout.batch_prompts // jax.process_count()
        t0 = time.perf_counter()
        local, scored = self.sample_round(params, jax.random.fold_in(key, 0), step)
        first = dict(local)
        gen_tokens = local["lengths"].sum()
        info = {**scored, "reward_metrics": scored["rewards"].metrics, "rounds": 1}
        if c.dapo.dynamic_sampling:
            kept, spare = split_groups(local, G)
            rounds = 1
            while dist.allgather_rows(np.array([len(kept) < B_local])).any() and rounds < c.dapo.max_sample_rounds:
                more, _ = self.sample_round(params, jax.random.fold_in(key, rounds), step)
                gen_tokens += more["lengths"].sum()
                k2, s2 = split_groups(more, G)
                kept, spare, rounds = kept + k2, spare + s2, rounds + 1
            fill = [dict(g, valid=np.zeros_like(g["valid"])) for g in spare]  # zero-weight groups keep shapes
            local = join_groups((kept + fill)[:B_local])
            info.update(rounds=rounds, kept_groups=min(len(kept), B_local) / B_local)
        info["sample_s"] = time.perf_counter() - t0
        info["gen_tokens"] = float(gen_tokens)
        return local, first, info

    def device_batch(self, local):
        """Global arrays of the update batch from this host's rows."""
        loss_mask = local["mask"] * local["valid"][:, None]
        if self.c.dapo.mask_truncated:
            loss_mask = loss_mask * (~local["truncated"])[:, None]
        put = lambda x, dtype: dist.to_global(np.asarray(x, dtype),
                                              self.rows_sharding if np.ndim(x) == 2 else self.vec_sharding)
        out = {"prompt_tokens": put(local["prompt_tokens"], np.int32), "prompt_mask": put(local["prompt_mask"], np.int32),
               "tokens": put(local["tokens"], np.int32), "mask": put(local["mask"], np.int32),
               "loss_mask": put(loss_mask, np.float32), "sampler_logp": put(local["sampler_logp"], np.float32),
               "behavior_logp": put(local["behavior_logp"], np.float32), "scores": put(local["scores"], np.float32),
               "truncated": put(local["truncated"], np.int32)}
        for k in ("routes", "prompt_routes"):  # MoE routing replay: (rows, tokens, L, k)
            if k in local:
                out[k] = dist.to_global(np.asarray(local[k], np.int32), sharding.batch_sharding(self.mesh, 4))
        if "supervised" in local:  # GKD's supervised rows (distill.lmbda < 1): the divergence alone
            out["supervised"] = put(local["supervised"], np.float32)
        if "attention_mask" in local:  # multi-turn: the forward attends to environment tokens too
            out["attention_mask"] = put(local["attention_mask"], np.int32)
        if self.process:
            out.update(process_rewards=put(local["process_rewards"], np.float32),
                       process_mask=put(local["process_mask"], np.float32))
        return out


def process_arrays(steps, lengths, T: int):
    """(step rewards (N,T), step mask (N,T)) from each row's (token index, reward) steps; an index past
    the row's completion is an error naming the row."""
    rewards, mask = np.zeros((len(steps), T), np.float32), np.zeros((len(steps), T), np.float32)
    for i, row in enumerate(steps):
        for t, r in row:
            if t >= lengths[i]:
                raise ValueError(f"a process reward put a step at token index {t} on row {i}, whose completion "
                                 f"has {int(lengths[i])} tokens")
            rewards[i, t] += r  # several process rewards may close a step at one token
            mask[i, t] = 1.0
    return rewards, mask


def split_groups(local: dict, G: int):
    """This host's rollout rows -> (groups with reward variance, groups without), one dict per group."""
    kept, spare = [], []
    for g in range(len(local["scores"]) // G):
        rows = slice(g * G, (g + 1) * G)
        group = {k: (v[g:g + 1] if k in _PROMPT_KEYS else v[rows]) for k, v in local.items()}
        (kept if np.ptp(group["filter_scores"]) > 0 else spare).append(group)
    return kept, spare


def join_groups(groups: list[dict]) -> dict:
    """Concatenates groups, left-padding prompts of different buckets to the longest."""
    P = max(g["prompt_tokens"].shape[1] for g in groups)
    out = {}
    for k in groups[0]:
        parts = [g[k] for g in groups]
        if k in _PROMPT_KEYS:
            parts = [np.pad(p, ((0, 0), (P - p.shape[1], 0), *[(0, 0)] * (p.ndim - 2))) for p in parts]  # masked out
        out[k] = np.concatenate(parts)
    return out
