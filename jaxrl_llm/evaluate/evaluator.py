"""Held-out evaluation of a policy: k samples for each of a fixed list of prompts, scored by the
evaluation's reward functions, summarized as pass@k, mean reward, maj@k and a per-level (the built-in
task's `level` column) or per-task (a `task` column, reasoning-gym's rows) breakdown.

What makes the numbers reproducible: the prompts are the first `eval.num_prompts` held-out rows in their
order, and batch i samples with `fold_in(fold_in(PRNGKey(seed), EVAL_STREAM), i)`, never the training
key. An evaluation of the same parameters under the same config and mesh therefore gives the same
numbers in the loop and from `python -m jaxrl_llm.evaluate`, and successive evaluations of one run
draw the same random numbers (their differences are the policy's, not the sampler's).

Cost: a sampler call takes as many rows as a training rollout, rollout.batch_prompts x group_size:
`eval_batch_prompts` prompts of k samples each. With eval.k = group_size that is the training rollout's
shape and the sampler program compiled for training is reused (for prompts of the same length bucket,
rollout.top_k/top_p as in training); other k's compile one program more.
"""
from __future__ import annotations

import copy
import math
import os
import time

import jax
import numpy as np

from jaxrl_llm import distributed as dist
from jaxrl_llm import envs
from jaxrl_llm import sharding
from jaxrl_llm.data import bucket_length, left_pad, reward_columns
from jaxrl_llm.data.reasoning_gym import TASK_COLUMN
from jaxrl_llm.evaluate.estimators import majority_vote, summarize
from jaxrl_llm.rewards import TrainerState, check_reward_parameters, compute_rewards, generation_fields
from jaxrl_llm.sampling import freeing_window, generate, page_shards, pages_needed, pool_pages

EVAL_STREAM = 0x6576616C  # "eval": the evaluation's random numbers, apart from every training stream


def eval_samples(c) -> int:
    """Samples per prompt: eval.k, or 1 when greedy (its samples would all be the same)."""
    return 1 if c.eval.temperature == 0 else c.eval.k


def eval_batch_prompts(c, mesh, num_prompts: int) -> int:
    """Prompts per sampler call: the training rollout's rows (batch_prompts x group_size) in groups of k,
    a multiple of the mesh's batch divisor and of the process count, no more than the prompts need."""
    unit = math.lcm(sharding.batch_divisor(mesh), jax.process_count())
    per_call = c.rollout.batch_prompts * c.rollout.group_size // eval_samples(c)
    return max(unit, min(per_call, -(-num_prompts // unit) * unit) // unit * unit)


def reward_config(c):
    """A copy of the config whose reward section is the evaluation's: eval.rewards (weights 1), or the
    training's reward.functions and weights without DAPO's overlong shaping (a training device that
    would make a correct answer score below 1)."""
    e = copy.deepcopy(c)
    if c.eval.rewards.strip():
        e.reward.functions, e.reward.weights = c.eval.rewards, ""
    e.dapo.overlong_buffer = 0
    return e


def eval_source(c) -> str | None:
    """Where the held-out prompts come from: "path" (eval.path), "task" (the test split of the built-in task or
    of data.source's generated tasks),
    "holdout" (the rows of data.path whose prompt hashes to 0 mod eval.holdout: data/holdout.py), or
    None (nowhere: periodic evaluation is off)."""
    if c.eval.path:
        return "path"
    if c.data.task or c.data.get("source"):
        return "task"
    return "holdout" if c.eval.holdout else None


def load_eval_data(c, tokenizer, held_out=None):
    """The held-out prompts, tokenized like the training data: the first eval.num_prompts rows of
    eval.path/eval.split (a local file's one split when eval.split is left at "test"), of the held-out
    "test" split of the built-in data.task (its `level` column kept for the per-level breakdown), or of
    the held-out slice of data.path (`held_out`, the trainer's, when given)."""
    from jaxrl_llm.data import load_prompt_dataset, prepare_prompts, split_held_out
    from jaxrl_llm.data.tasks import load_task

    d = copy.deepcopy(c.data)
    d.completion_column = ""  # held-out prompts are sampled, never supervised
    n = c.eval.num_prompts
    source = eval_source(c)
    if source == "path":
        local = os.path.isfile(os.path.expanduser(c.eval.path))
        d.path, d.split = c.eval.path, "train" if local and c.eval.split == "test" else c.eval.split
        try:
            dataset, _ = load_prompt_dataset(d, tokenizer)
        except (ValueError, FileNotFoundError) as e:  # name the eval fields, not the data ones
            message = " ".join(str(e).split()).replace("data.path", "eval.path").replace("data.split", "eval.split")
            hint = (" (a local file has one split, 'train': leave eval.split at its default)"
                    if local and "split" in message.replace(f"(split {d.split!r})", "") else "")
            prefix = ("config." if message.startswith("eval.") else
                      f"config.eval.path {c.eval.path!r} (split {d.split!r}): ")
            raise ValueError(f"{prefix}{message}{hint}") from None
    elif source == "task" and c.data.get("source"):  # reasoning-gym's tasks, at their configured options
        from jaxrl_llm.data import reasoning_gym as rgym
        section = c.data.reasoning_gym  # the held-out rows stay at the start's levels under a curriculum
        raw = rgym.generate(section, c.seed, n or section.rows, split="test", levels=rgym.start_levels(section))
        dataset, _ = prepare_prompts(raw, d, tokenizer)
    elif source == "task":
        raw = load_task(c.data.task, n or c.data.task_rows, c.seed, tuple(c.data.task_weights), split="test")
        if "level" in raw.column_names and "level" not in d.extra_columns:
            d.extra_columns = (*d.extra_columns, "level")
        dataset, _ = prepare_prompts(raw, d, tokenizer)
    elif source == "holdout":
        if held_out is None:
            held_out = split_held_out(load_prompt_dataset(d, tokenizer)[0], d.prompt_column, c.eval.holdout, d.path)[1]
        dataset = held_out
    else:
        raise ValueError("config.eval.path is empty, there is no data.task and eval.holdout is 0: name the held-out "
                         "prompts with eval.path")
    return dataset.select(range(min(n, len(dataset)))) if n else dataset


def vote_key(completion: str, builtin_task: bool, extract: str | None = None) -> str | None:
    """The answer a completion votes for: the stripped completion for the built-in task, the answer the
    reasoning_gym reward extracts under `extract` (reasoning-gym's tasks), else its final answer as the math
    reward extracts and normalizes it (None when it gives none)."""
    if builtin_task:
        return completion.strip() or None
    if extract is not None:
        from jaxrl_llm.rewards.reasoning_gym import extract as extract_answer
        return extract_answer(completion, extract) or None
    from jaxrl_llm.rewards.math import final_answer, normalize_answer
    text = final_answer(completion).text
    return normalize_answer(text) if text is not None else None


class Evaluator:
    """`evaluator(params) -> (metrics, samples)`: held-out metrics (`eval/...`, the same on every process)
    and this process's (prompt, completion, score) rows. A collective: every process calls it."""

    def __init__(self, c, mc, mesh, tokenizer, reward_fns, eos_ids, pad_id, dataset):
        self.c, self.mc, self.mesh, self.tokenizer = c, mc, mesh, tokenizer
        self.reward_fns, self.eos_ids, self.pad_id = reward_fns, tuple(eos_ids), pad_id
        check_reward_parameters(reward_fns, reward_columns(dataset.column_names))
        self.rows = dataset.with_format(None)[:]  # column -> list, read once
        self.num_prompts = len(dataset)
        self.k = eval_samples(c)
        self.batch = eval_batch_prompts(c, mesh, self.num_prompts)
        self.vote = bool(c.data.answer_column) and c.data.answer_column in self.rows
        self.builtin = bool(c.data.task and not c.eval.path)
        # A per-level breakdown where the rows have integer levels (the built-in task's `level` column).
        self.levels = "level" in self.rows and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                                   for v in self.rows["level"])
        # A per-task breakdown where the rows name their task (reasoning-gym's `task` column): eval/task/<name>/.
        self.tasks = (sorted(set(self.rows[TASK_COLUMN])) if TASK_COLUMN in self.rows
                      and all(isinstance(v, str) and v for v in self.rows[TASK_COLUMN]) else None)
        # The answer a sample votes for in maj@k: reasoning-gym's rows vote on the answer their reward extracts.
        self.extract = (c.reward.kwargs.get("reasoning_gym", {}).get("extract", "answer_tag")
                        if c.data.get("source") and not c.eval.path else None)
        self.key = jax.random.fold_in(jax.random.PRNGKey(c.seed), EVAL_STREAM)
        self.rows_sharding = sharding.batch_sharding(mesh, 2)
        self.env = envs.make_env(c.env.name, c.env.kwargs.to_dict()) if c.env.name else None

    def __call__(self, params, step: int = 0) -> tuple[dict[str, float], list[dict]]:
        """`step`: the training step the parameters are from (rewards see it as trainer_state.global_step)."""
        t0 = time.perf_counter()
        stats, samples = [], []
        for i, start in enumerate(range(0, self.num_prompts, self.batch)):
            s, rows = self._batch(params, i, start, step)
            stats.append(dist.allgather_rows(s))
            samples += rows
        s = np.concatenate(stats)
        s = s[s[:, 0] > 0]  # the padding of the last batch
        m = summarize(self.k, s[:, 1].astype(np.int64), s[:, 2], s[:, 3] if self.vote else None,
                      s[:, 4].astype(np.int64) if self.levels else None,
                      [self.tasks[int(t)] for t in s[:, 6]] if self.tasks else None)
        if self.env is not None:
            m["eval/env/turns/mean"] = float(np.mean(s[:, 5]))
        m["eval/time_s"] = time.perf_counter() - t0
        return m, samples

    def _batch(self, params, i: int, start: int, step: int):
        """Samples and scores global batch i (prompts start.. of the held-out list): per-prompt stats
        (valid, correct, mean score, vote correct, level) of this process's prompts, and its rows."""
        c, k, B = self.c, self.k, self.batch
        index = np.arange(start, start + B)
        longest = max(len(self.rows["prompt_ids"][j % self.num_prompts]) for j in index)
        index = index[dist.host_rows(B)]  # this process's block, as the training iterator splits a batch
        valid = index < self.num_prompts
        index = index % self.num_prompts  # the last batch is filled with repeats, dropped from the metrics
        batch = {col: [vals[j] for j in index] for col, vals in self.rows.items()}
        sample = self._sample if self.env is None else self._episodes
        completions, out, lengths, truncated, extra, turns, shown = sample(params, i, batch, longest)
        prompts = [p for p in batch["prompt_user"] for _ in range(k)]
        columns = {col: [v for v in batch[col] for _ in range(k)] for col in reward_columns(batch)}
        columns.update(generation_fields(out, lengths, truncated, c.rollout.max_new_tokens,
                                         TrainerState(step, c.total_steps)))
        scores, _ = compute_rewards(self.reward_fns, prompts, completions, columns, on_error=c.reward.on_error)
        if extra is not None:  # the episodes' turn rewards add to the reward functions', as in training
            scores = scores + extra
        correct = (scores >= c.eval.correct_threshold).reshape(-1, k)
        votes = [majority_vote([vote_key(t, self.builtin, self.extract) for t in completions[b * k:(b + 1) * k]],
                               correct[b])[1] if self.vote else False for b in range(len(index))]
        level = batch["level"] if self.levels else [0] * len(index)
        task = [self.tasks.index(t) for t in batch[TASK_COLUMN]] if self.tasks else [0] * len(index)
        stats = np.stack([valid, correct.sum(1), scores.reshape(-1, k).astype(np.float64).mean(1), votes, level,
                          np.reshape(turns, (-1, k)).mean(1), task], axis=1).astype(np.float64)
        rows = [{"prompt": prompts[n], "completion": completions[n], "score": float(scores[n]),
                 "correct": bool(correct.flat[n]), "prompt_index": int(index[n // k]), "sample": n % k, **shown[n]}
                for n in range(len(prompts)) if valid[n // k]]
        return stats, rows

    def _paging(self, prompts: int, prompt_length: int) -> dict:
        """The paged cache as in training (rollout.kv_page_size), its pool at least what this batch needs."""
        c = self.c
        if not c.rollout.kv_page_size:
            return {}
        slots = min(c.rollout.decode_slots, prompts * self.k)
        shards = page_shards(self.mesh, prompts, slots)
        pages, _ = pool_pages(self.mc, kv_pages=c.rollout.kv_pages, page_size=c.rollout.kv_page_size,
                              prompt_length=prompt_length, max_new_tokens=c.rollout.max_new_tokens, prompts=prompts,
                              slots=slots, shards=shards)
        need = pages_needed(prompt_length, c.rollout.max_new_tokens, prompts, shards, c.rollout.kv_page_size,
                            freeing_window(self.mc))
        return {"kv_page_size": c.rollout.kv_page_size, "kv_pages": max(pages, need)}

    def _sample(self, params, i: int, batch, longest: int):
        """Single-turn: k completions per prompt. Returns (completion texts, tokens, lengths, truncated,
        extra scores (None), model turns (1 each), extra fields of each sample row (none))."""
        c, k = self.c, self.k
        tokens, pmask = left_pad(batch["prompt_ids"], bucket_length(longest, c.data.max_prompt_length), self.pad_id)
        prompts_g, pmask_g = dist.to_global(tokens, self.rows_sharding), dist.to_global(pmask, self.rows_sharding)
        with sharding.use_mesh(self.mesh):
            r = generate(self.mc, params, prompts_g, pmask_g, jax.random.fold_in(self.key, i),
                         max_new_tokens=c.rollout.max_new_tokens, num_samples=k, temperature=c.eval.temperature,
                         top_k=c.rollout.top_k, top_p=c.rollout.top_p,
                         repetition_penalty=c.rollout.repetition_penalty, min_p=c.rollout.min_p,
                         eos_ids=self.eos_ids, pad_id=self.pad_id,
                         decode_slots=min(c.rollout.decode_slots, self.batch * k),  # a smaller batch: all its rows
                         decode_shrink=c.rollout.decode_shrink, **self._paging(*prompts_g.shape))
        out, lengths, truncated = dist.to_local(r.tokens), dist.to_local(r.lengths), dist.to_local(r.truncated)
        ends = lengths - (~truncated).astype(np.int64)  # the EOS is not part of the text
        completions = self.tokenizer.batch_decode([row[:e] for row, e in zip(out, ends)], skip_special_tokens=False)
        return completions, out, lengths, truncated, None, np.ones(len(out)), [{}] * len(out)

    def _episodes(self, params, i: int, batch, longest: int):
        """Multi-turn (env.name): k episodes per prompt under the environment, as in training. The
        completion the reward functions judge is the last model turn; the extra scores are the episodes'
        turn rewards; each sample row also shows the whole episode (observations included) and its turns."""
        from jaxrl_llm.trainer.episodes import sample_episodes  # the trainer package imports this module

        c, k = self.c, self.k
        rows = [{col: vals[b] for col, vals in batch.items()} for b in range(len(batch["prompt_ids"]))
                for _ in range(k)]
        with sharding.use_mesh(self.mesh):
            ep = sample_episodes(self.mc, params, self.tokenizer, self.env, rows, jax.random.fold_in(self.key, i),
                                 max_turns=c.env.max_turns, max_new_tokens=c.rollout.max_new_tokens,
                                 max_turn_tokens=c.env.max_turn_tokens, temperature=c.eval.temperature,
                                 top_k=c.rollout.top_k, top_p=c.rollout.top_p,
                                 repetition_penalty=c.rollout.repetition_penalty, min_p=c.rollout.min_p,
                                 pad_id=self.pad_id,
                                 max_workers=c.env.max_workers, group_size=k,
                                 stop_strings=tuple(c.env.stop_strings), max_failed_frac=c.env.max_failed_frac)
        turns = [len(t) for t in ep.texts]
        shown = [{"episode": text, "turns": n} for text, n in zip(ep.decoded(self.tokenizer), turns)]
        return (ep.finals(), ep.tokens, ep.attention_mask.sum(1), ep.truncated, ep.rewards,
                np.asarray(turns, np.float64), shown)
