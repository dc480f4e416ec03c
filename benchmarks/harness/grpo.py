"""One GRPO iteration's settings on both sides: the reward, the workspace (random checkpoint of a shape,
word tokenizer, prompts, optional heavy-tailed stop ids), our config with TRL's settings, and our trainer's
setup and update batch for the update-only benchmarks (mfu, compile time, the GPU suite).

Imported by the TRL and Tunix workers, which have no jax: top-level imports are the standard library's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import time

WORD = re.compile(r"w(\d+)")
REWARD = "harness.grpo:even_words"  # importable in every worker: they run in benchmarks/


def even_words(prompts, completions, **_):
    """Fraction of the completion's words with an even id: differs between the samples of a group, so
    every group has a nonzero advantage. Same signature in jaxrl_llm and TRL: lists of texts -> floats."""
    out = []
    for text in completions:
        ids = [int(m) for m in WORD.findall(text)]
        out.append(sum(1 for i in ids if i % 2 == 0) / max(len(ids), 1))
    return out


def make_workspace(path: str, size, *, num_prompts: int, prompt_len: int, max_positions: int, torch_side: bool,
                   seed: int = 0) -> None:
    """model/ (random checkpoint of `size`), tokenizer/ and prompts.jsonl under `path`. `torch_side`: saved
    by transformers (the same weights TRL loads; needs torch), else by our `save_hf` (no torch)."""
    from harness.shapes import build_models, make_tokenizer, save_random_checkpoint, write_prompts
    if torch_side:
        build_models(os.path.join(path, "model"), size, seed=seed, max_positions=max_positions)
    else:
        save_random_checkpoint(os.path.join(path, "model"), size, max_positions=max_positions, seed=seed)
    make_tokenizer(size.vocab_size).save_pretrained(os.path.join(path, "tokenizer"))
    write_prompts(os.path.join(path, "prompts.jsonl"), size.vocab_size, num_prompts, prompt_len, seed)


def heavy_tailed_stop_ids(path: str, median: float) -> list[int]:
    """Writes EOS and a stop set calibrated for geometric lengths of `median` tokens (`eos_set_for_median`
    on the mean next-token probabilities over 16 prompts) into the workspace model's generation config."""
    import jax
    import numpy as np

    from harness.shapes import eos_set_for_median, write_stop_ids
    from jaxrl_llm.models import forward, load_hf
    config, params = load_hf(os.path.join(path, "model"))
    with open(os.path.join(path, "prompts.jsonl")) as f:
        prompts = np.array([[int(w) for w in WORD.findall(json.loads(line)["prompt"])] for line in f][:16])
    probs = jax.nn.softmax(forward(config, params, prompts, np.ones_like(prompts)), -1).mean((0, 1))
    stop = sorted({1, *eos_set_for_median(np.asarray(probs), median, exclude=(0,))})  # 1 is <eos>
    write_stop_ids(os.path.join(path, "model"), stop)
    return stop


def ours_config(workspace: str, args):
    """The GRPO preset on the workspace, with TRL's settings where they differ from our defaults."""
    from jaxrl_llm.config import base_config
    c = base_config()
    c.algo = "grpo"  # kl.coef 0.04, seq-mean-token-mean ('grpo' in TRL), group-scaled advantages
    c.model.path = os.path.join(workspace, "model")
    c.tokenizer = os.path.join(workspace, "tokenizer")
    c.data.path = os.path.join(workspace, "prompts.jsonl")
    c.data.prompt_column, c.data.answer_column = "prompt", ""
    c.data.use_chat_template = False
    c.data.max_prompt_length = args.prompt_len
    c.model.compute_dtype = getattr(args, "dtype", "float32")
    c.reward.functions = REWARD
    c.rollout.batch_prompts, c.rollout.group_size = args.batch, args.group
    c.rollout.max_new_tokens = args.new_tokens
    c.rollout.decode_slots = getattr(args, "decode_slots", 0)
    c.rollout.decode_shrink = getattr(args, "decode_shrink", 0)
    c.train.pack_length = getattr(args, "pack_length", 0)
    c.optimizer.learning_rate = 1e-6
    c.total_steps = 10 ** 6
    c.checkpoint.every_steps, c.checkpoint.async_save = 10 ** 6, False
    c.log.progress, c.log.tensorboard = False, False
    c.export.at_end, c.export.plot = False, False
    return c


def build_trainer(workspace: str, size, *, batch: int, group: int, prompt_len: int, new_tokens: int,
                  compute_dtype: str = "float32", remat: str = "none", logits_chunk: int = 128, run: str = "run",
                  param_dtype: str = "float32", grad_accum: int = 1):
    """A GRPO `Trainer` (`ours_config`) on a random checkpoint of `size`, written under `workspace` on first
    use. `run` names the workdir (one per set of execution settings: a workdir refuses another config)."""
    from jaxrl_llm.trainer import Trainer
    if not os.path.exists(os.path.join(workspace, "prompts.jsonl")):
        make_workspace(workspace, size, num_prompts=4 * batch, prompt_len=prompt_len,
                       max_positions=prompt_len + new_tokens, torch_side=False)
    c = ours_config(workspace, argparse.Namespace(prompt_len=prompt_len, batch=batch, group=group,
                                                  new_tokens=new_tokens))
    c.model.compute_dtype, c.model.remat, c.model.logits_chunk = compute_dtype, remat, logits_chunk
    c.model.dtype, c.train.grad_accum = param_dtype, grad_accum
    return Trainer(c, os.path.join(workspace, run))


def device_batch(trainer, seed: int = 0) -> dict:
    """The host rows of a rollout in which every completion runs to T tokens, as `Rollouts.device_batch` puts
    them on the devices (no reference log-probs or advantages yet). Executes nothing."""
    c, mc = trainer.c, trainer.mc
    B, G, P, T = c.rollout.batch_prompts, c.rollout.group_size, c.data.max_prompt_length, c.rollout.max_new_tokens
    N = B * G
    import numpy as np
    rng = np.random.default_rng(seed)
    local = {"prompt_tokens": rng.integers(2, mc.vocab_size, (B, P)), "prompt_mask": np.ones((B, P), np.int32),
             "tokens": rng.integers(2, mc.vocab_size, (N, T)), "mask": np.ones((N, T), np.int32),
             "sampler_logp": np.full((N, T), -math.log(mc.vocab_size), np.float32),
             "behavior_logp": np.full((N, T), -math.log(mc.vocab_size), np.float32),
             "lengths": np.full(N, T), "truncated": np.ones(N, bool), "scores": rng.random(N).astype(np.float32),
             "valid": np.ones(N, np.float32)}
    return trainer.rollouts.device_batch(local)


def update_batch(trainer, state, seed: int = 0) -> dict:
    """The update's batch as `Trainer.train_step` builds it: reference log-probs (`fns.score`), the
    policy's own log-probs as the sampler's (ratios 1), correction and advantages (`fns.prepare`)."""
    from jaxrl_llm import sharding
    b = device_batch(trainer, seed)
    ref = state.ref_params if state.ref_params is not None else trainer.frozen_ref
    with sharding.use_mesh(trainer.mesh):
        b.update(trainer.fns.score(state, ref, b))
        if "ref_logp" in b:  # the reference is the initial policy: its log-probs are the sampler's
            b["sampler_logp"] = b["behavior_logp"] = b["ref_logp"]
        b.setdefault("old_logp", b["behavior_logp"])
        b.update(trainer.fns.prepare(b, state.kl.value)[0])
    return b


def close_trainer(trainer) -> None:
    """Stops the trainer's checkpointer and metric writer threads (nothing was written to them)."""
    trainer.ckpt.close()
    trainer.writer.close()


def update_call(trainer):
    """A function i -> (params, metrics) running the trainer's update on `update_batch` and keeping the new
    state in `trainer.state` (each call donates the previous one)."""
    import jax.numpy as jnp

    from jaxrl_llm import sharding
    b = update_batch(trainer, trainer.state)
    pidx = jnp.arange(trainer.c.rollout.batch_prompts)

    def update(_i):
        with sharding.use_mesh(trainer.mesh):
            trainer.state, metrics = trainer.fns.update(trainer.state, b, pidx)
        return trainer.state.params, metrics
    return update


def measure_update(trainer, *, repeats: int, extra: dict | None = None):
    """Times the trainer's update (donating its state each call) side by side with `extra` functions.
    Returns (update Timing, {name: Timing})."""
    from harness.timing import time_interleaved
    timings = time_interleaved({"update": update_call(trainer), **(extra or {})}, repeats=repeats, warmup=1)
    close_trainer(trainer)
    return timings.pop("update"), timings


def stage_times(ours, repeats: int) -> dict[str, float]:
    """Median seconds of each stage of `train_step`, each synchronized: rollout (generation + rewards on
    the host), [the packing plans,] reference log-probs, advantages, the update. Uses the trainer's own
    jitted functions and, with train.pack_length, its packer; then each pass also runs once untimed before
    it is timed, since a step's packed shape may be new to it (a compile, not the pass's time)."""
    import jax
    t = ours.trainer
    rows: dict[str, list[float]] = {}

    def timed(name, fn):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn())
        rows.setdefault(name, []).append(time.perf_counter() - t0)
        return out

    state = ours.state
    for i in range(repeats + 1):
        key = jax.random.fold_in(state.rng, i)
        local, _, _ = timed("generate + rewards", lambda: t.rollouts.collect(state.params, key))
        b = timed("to device", lambda: t.rollouts.device_batch(local))
        ref = state.ref_params if state.ref_params is not None else t.frozen_ref
        pack = timed("packing plans (host)", lambda: t.packer.score(b)) if t.packer else None
        if pack is not None:
            jax.block_until_ready(t.fns.score(state, ref, b, pack))
        b.update(timed("reference log-probs", lambda: t.fns.score(state, ref, b, pack)))
        b.setdefault("old_logp", b["behavior_logp"])
        b.update(timed("advantages", lambda: t.fns.prepare(b, state.kl.value))[0])
        pidx = jax.numpy.arange(t.c.rollout.batch_prompts)
        plan = t.packer.update(pidx) if t.packer else None
        if plan is not None:  # a second update step, not a copy of the state: the update donates it
            state, _ = jax.block_until_ready(t.fns.update(state, b, pidx, plan))
        state, _ = timed("update (fwd + bwd + AdamW)", lambda: t.fns.update(state, b, pidx, plan))
        if i == 0:
            rows = {}
    ours.state = state
    return {k: statistics.median(v) for k, v in rows.items()}


def length_line(name, means, mins, maxs, cap) -> str:
    """One framework's completion lengths over all its iterations: the per-iteration means, the extremes."""
    valid = [x for x in mins if x is not None], [x for x in maxs if x is not None]
    return (f"{name} completion lengths: mean per iteration {min(means):.1f}..{max(means):.1f} (overall "
            f"{sum(means) / len(means):.1f}), min {min(valid[0], default=float('nan')):.0f}, max "
            f"{max(valid[1], default=float('nan')):.0f} of {cap}")


