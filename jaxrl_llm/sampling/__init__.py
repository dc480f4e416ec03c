"""The group sampler: prefill each prompt once, decode G completions per prompt with a KV cache.

Two jit-compiled programs behind one entry point, `generate`:
  * `batch.generate_program` (decode_slots = 0, the default): all N = B*G rows decode together until the
    last one ends (with `decode_shrink`, on fewer rows once most have ended);
  * `slots.slots_program` (decode_slots = S): continuous batching, S rows in flight, a finished row's
    slot taking the next pending row -- for heavy-tailed completion lengths (docs/sampling.md).
Drawing one token per row: `draw` (one uniform per row inverts the CDF; greedy is an argmax).

Log-prob convention (the trainer's, docs/design.md "Conventions"): `logprobs[n, t]` is
log_softmax(logits / temperature) over the FULL vocabulary at the drawn token, in float32. `top_k`,
`top_p`, `min_p` and `repetition_penalty` only change which token is drawn, never this number, so the
trainer recomputes exactly what the sampler reports; `behavior_logprobs` is the log-prob of the
penalised, truncated, renormalised distribution the token was really drawn from, which every importance
ratio against the sampler needs (docs/algorithms/off_policy.md). With temperature=0 (greedy) the
reported log-prob is that of log_softmax(logits) (temperature 1).

Prompt lengths: callers pad each batch to a length bucket (see docs/data.md) so that variable prompt
lengths compile only a handful of shapes.
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.sampling.batch import Rollout, generate_program, shrink_phases
from jaxrl_llm.sampling.draw import (argmax, categorical, check_penalties, draw_tokens, mark, penalize, row_uniforms,
                                     seen_tokens)
from jaxrl_llm.sampling.paged import freeing_window, paged_program, pages_needed, pool_pages
from jaxrl_llm.sampling.slots import slots_program
from jaxrl_llm.sharding import batch_divisor

__all__ = ["Rollout", "generate", "generate_program", "shrink_phases", "slots_program", "paged_program", "freeing_window", "pages_needed", "pool_pages", "page_shards", "argmax", "categorical",
           "draw_tokens", "row_uniforms", "seen_tokens", "mark", "penalize", "check_penalties"]


def _check(config, prompts, prompt_mask, max_new_tokens, num_samples, temperature, top_k, top_p, eos_ids,
           pad_id, decode_slots, decode_shrink=0, kv_page_size=0, kv_pages=0, shards=1):
    """One-line ValueErrors before anything is compiled."""
    if prompts.ndim != 2:
        raise ValueError(f"prompts must be (B, P), got shape {prompts.shape}")
    if prompt_mask.shape != prompts.shape:
        raise ValueError(f"prompt_mask shape {prompt_mask.shape} != prompts shape {prompts.shape}")
    if not jnp.issubdtype(prompts.dtype, jnp.integer):
        raise ValueError(f"prompts must be integer token ids, got dtype {prompts.dtype}")
    if not (jnp.issubdtype(prompt_mask.dtype, jnp.integer) or prompt_mask.dtype == jnp.bool_):
        raise ValueError(f"prompt_mask must be int or bool, got dtype {prompt_mask.dtype}")
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0, got {top_k!r}")
    if top_k > config.vocab_size:
        raise ValueError(f"top_k={top_k} exceeds the vocabulary size {config.vocab_size}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if not eos_ids:
        raise ValueError("eos_ids must name at least one end-of-sequence token id")
    for t in (*eos_ids, pad_id):
        if not 0 <= int(t) < config.vocab_size:
            raise ValueError(f"token id {t} (eos_ids/pad_id) is outside the vocabulary [0, {config.vocab_size})")
    rows = prompts.shape[0] * num_samples
    if not isinstance(decode_slots, (int, np.integer)) or not 0 <= decode_slots <= rows:
        raise ValueError(f"decode_slots must be an int in [0, {rows}] (the number of rows), got {decode_slots!r}")
    if not isinstance(decode_shrink, (int, np.integer)) or decode_shrink < 0 or decode_shrink == 1:
        raise ValueError(f"decode_shrink must be 0 (off) or an int >= 2, got {decode_shrink!r}")
    if decode_shrink and decode_slots:
        raise ValueError("decode_shrink shrinks the static batch (decode_slots = 0); with decode_slots > 0 the "
                         "slots already hold only rows still decoding")
    if not isinstance(kv_page_size, (int, np.integer)) or kv_page_size < 0:
        raise ValueError(f"kv_page_size must be an int >= 0 (0: no paged cache), got {kv_page_size!r}")
    if kv_page_size and not decode_slots:
        raise ValueError("kv_page_size > 0 pages the continuous-batching sampler's cache: it needs decode_slots > 0")
    if kv_page_size:
        window = freeing_window(config)
        need = pages_needed(prompts.shape[1], max_new_tokens, prompts.shape[0], shards, kv_page_size, window)
        if not isinstance(kv_pages, (int, np.integer)) or kv_pages < need:
            raise ValueError(f"kv_pages={kv_pages!r} per row shard is fewer than the {need} pages of {kv_page_size} "
                             f"tokens its {prompts.shape[0] // shards} prompts of {prompts.shape[1]} tokens and one "
                             f"row of {max_new_tokens} new tokens need"
                             + (f" (with the pages every layer's sliding window of {window} has passed freed)"
                                if window else ""))
    total = prompts.shape[1] + max_new_tokens
    if total > config.max_position_embeddings:
        raise ValueError(f"prompt length {prompts.shape[1]} + max_new_tokens {max_new_tokens} = {total} exceeds "
                         f"the model's max_position_embeddings {config.max_position_embeddings}")


def page_shards(mesh, prompts: int, slots: int) -> int:
    """The row shards of a paged cache on `mesh` (data x fsdp x sequence; 1 outside a mesh, or when the
    prompts or slots do not split evenly over them: one pool then)."""
    shards = 1 if mesh.empty else batch_divisor(mesh)
    return shards if prompts % shards == 0 and slots % shards == 0 else 1


def generate(config: ModelConfig, params, prompts, prompt_mask, rng, *, max_new_tokens: int, num_samples: int = 1,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, eos_ids: Sequence[int],
             pad_id: int, decode_slots: int = 0, repetition_penalty: float = 1.0, min_p: float = 0.0,
             row_block: tuple[int, int] | None = None, decode_shrink: int = 0, kv_page_size: int = 0,
             kv_pages: int = 0) -> Rollout:
    """Samples `num_samples` completions for each left-padded prompt (see the module docstring).

    prompts, prompt_mask (B,P) int; rng a PRNG key. Same key -> same rollout; rows of a group differ.
    `temperature` and `top_p` are traced (changing them does not recompile); `top_k`, the shapes and the
    greedy / nucleus switches are static. decode_slots: 0 decodes all N rows as one static batch
    (`batch.generate_program`); S in [1, N] keeps S rows in flight with continuous batching
    (`slots.slots_program`, per-row random streams: the same rollout for every S, a different one from 0).
    repetition_penalty (1 = off) and min_p (0 = off) change the distribution drawn from, hence the behaviour
    log-probs, never `logprobs` (`draw.draw_tokens`); their values are traced, on/off is static.
    row_block (offset, total), static: these N rows are rows offset..offset+N-1 of a batch of `total` rows,
    and draw the random numbers those rows draw in it (a host sampling its block of the global batch
    alone; None: the rows are the whole batch).
    decode_shrink k >= 2 (0 = off; the static batch only): once at most N/k rows are still decoding, the
    decode goes on over N/k rows, then N/k^2, ... (`batch.shrink_phases`); the same draws, each phase one
    more compiled decode step.
    kv_page_size Z > 0 (with decode_slots): the slots' cache is paged (`paged.paged_program`), kv_pages
    pages of Z tokens per row shard of the mesh in context (`page_shards`); the same rollout as without.
    """
    prompts, prompt_mask = jnp.asarray(prompts), jnp.asarray(prompt_mask)
    eos_ids = tuple(int(e) for e in (eos_ids if isinstance(eos_ids, (list, tuple)) else [eos_ids]))
    mesh = jax.sharding.get_abstract_mesh()
    shards = page_shards(mesh, prompts.shape[0], int(decode_slots)) if kv_page_size else 1
    _check(config, prompts, prompt_mask, max_new_tokens, num_samples, temperature, top_k, top_p, eos_ids, pad_id,
           decode_slots, decode_shrink, kv_page_size, kv_pages, shards)
    check_penalties(repetition_penalty, min_p)
    if decode_slots and kv_page_size:
        program = functools.partial(paged_program, slots=int(decode_slots), page_size=int(kv_page_size),
                                    pages=int(kv_pages), shards=shards)
    elif decode_slots:
        program = functools.partial(slots_program, slots=int(decode_slots))
    else:  # the phases' rows stay a multiple of the batch shards of the mesh in context (sharding.use_mesh)
        multiple = 1 if mesh.empty else batch_divisor(mesh)
        phases = shrink_phases(prompts.shape[0] * num_samples, int(decode_shrink), multiple)
        program = functools.partial(generate_program, phases=phases)
    return program(config, params, prompts.astype(jnp.int32), prompt_mask.astype(jnp.int32), rng,
                   jnp.float32(max(temperature, 1e-6)), jnp.float32(top_p), jnp.float32(repetition_penalty),
                   jnp.float32(min_p), max_new_tokens=int(max_new_tokens), num_samples=int(num_samples),
                   top_k=int(top_k), greedy=temperature == 0, nucleus=top_p < 1.0, eos_ids=eos_ids, pad_id=int(pad_id),
                   penalize=repetition_penalty != 1.0, use_min_p=min_p > 0,
                   row_block=None if row_block is None else (int(row_block[0]), int(row_block[1])))
