"""The continuous-batching sampler (`rollout.decode_slots` = S > 0): S decode slots for N = B*G rows; when a
row ends (EOS, or T tokens) its slot takes the next pending row, so no decode step is spent on a row
that already ended while others still wait.

Shapes as in `sampling.batch`: B prompts, P prompt tokens, G = num_samples, N = B*G rows, T =
max_new_tokens; S slots. One XLA program per (B, P, T, G, S) and sampling mode:
  1. prefill: the B prompts run once (as in the static sampler); a slot refers to its prompt's prefix by
     index and holds a copy of it (S,Hkv,hd,P) per layer, refreshed only on the steps where a slot is
     refilled;
  2. the first token of every row is drawn up front from its prompt's last logits: a row whose first
     token is an EOS (or T = 1) never takes a slot;
  3. a `lax.while_loop`, one decode step of all S slots per iteration, each slot at its own position and
     cache index (models.lm.decode_step with one cache index per row); after the step, finished slots
     take the next pending rows in row order (first token, position and prompt prefix; the slot's cache
     is simply overwritten from index 0: entries past a slot's index are masked). The loop ends when no
     slot holds a row.
MoE models: each fed token's experts are recorded at its row and column (`Rollout.routes`), as the
static sampler records them.
Memory: the cache is S rows x T slots per layer plus the slots' prefix copies, S x P (the static
sampler's is N x T plus B x P); docs/sampling.md.

Randomness is per row: token t of row n is drawn from fold_in(fold_in(rng, n), t) (`draw.row_uniforms`),
so each row's tokens and log-probs are the same for every slot count S (up to float rounding of
differently shaped matrix products) -- but a different stream from the static sampler's, which draws
token t of all rows from one key.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.compile_options import jit
from jaxrl_llm.models.lm import (decode_logits, decode_prepare, decode_rows, decode_step, init_cache,
                                 prefill)
from jaxrl_llm.models.moe import unrecorded_routes
from jaxrl_llm.sampling.batch import Rollout
from jaxrl_llm.sampling.draw import draw_tokens, mark, row_uniforms, seen_tokens


class Start(NamedTuple):
    """What both continuous-batching samplers (this one and sampling/paged.py) start from. Shapes as in the
    module docstring; L layers, V the vocabulary.

    prefix_kv: the prompts' keys/values as `models.lm.prefill` gives them (L,B,P,Hkv,hd) each;
    prompt_routes (L,B,P,k) int32, the prompts' experts (None without MoE); prompt_len (B,) the position of
    each prompt's first new token; first (N,) int32 each row's first token; seen0 (B,V) the repetition
    penalty's set of each prompt's tokens and seen (N,V) each row's with its first token (None: no penalty);
    tokens (N,T), logprobs (N,2,T) float32 [new policy, behaviour], mask (N,T) int32: the records, column 0
    filled; routes (L,N,T,k) the rows' experts, unrecorded (None without MoE)."""
    prefix_kv: tuple
    prompt_routes: jax.Array | None
    prompt_len: jax.Array
    first: jax.Array
    seen0: jax.Array | None
    seen: jax.Array | None
    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array
    routes: jax.Array | None


def prefill_and_first(config, params, prompts, prompt_mask, rng, draw, *, num_samples, max_new_tokens, pad_id,
                      penalize, offset) -> Start:
    """Prefill once per prompt and draw the first token of every row from its prompt's last logits, from
    the row's own stream (`draw.row_uniforms` at t = 0); `draw` is `draw_tokens` with the sampling mode
    bound. prompts, prompt_mask (B,P). The same start for the slots and the paged sampler, so their rows
    agree from the first token."""
    g, t_max = num_samples, max_new_tokens
    n = prompts.shape[0] * g
    moe = config.num_experts > 0  # record each token's experts (Rollout.routes) for routing replay
    hidden, prefix_kv, *prompt_routes = prefill(config, params, prompts, prompt_mask, with_lm_head=False,
                                                return_routes=moe)
    prompt_len = jnp.sum(prompt_mask, axis=-1)  # (B,) position of each prompt's first new token
    last_logits = decode_logits(config, params, hidden[:, -1])  # (B,V)
    rows = jnp.arange(n, dtype=jnp.int32)
    # The repetition penalty's set of every row (None: off): its prompt's tokens, then each token it draws.
    seen0 = seen_tokens(prompts, prompt_mask, config.vocab_size) if penalize else None
    seen = None if seen0 is None else jnp.repeat(seen0, g, axis=0)
    first, logp, blogp = draw(jnp.repeat(last_logits, g, axis=0), uniform=row_uniforms(rng, rows + offset, 0 * rows),
                              seen=seen)
    seen = None if seen is None else mark(seen, rows, first)
    tokens = jnp.full((n, t_max), pad_id, jnp.int32).at[:, 0].set(first)
    logprobs = jnp.zeros((n, 2, t_max), jnp.float32).at[:, :, 0].set(jnp.stack([logp, blogp], 1))
    mask = jnp.zeros((n, t_max), jnp.int32).at[:, 0].set(1)
    routes = unrecorded_routes(config, n, t_max) if moe else None
    return Start(prefix_kv, prompt_routes[0] if moe else None, prompt_len, first, seen0, seen, tokens, logprobs, mask,
                 routes)


@functools.partial(jit, static_argnames=("config", "max_new_tokens", "num_samples", "slots", "top_k", "greedy",
                                         "nucleus", "eos_ids", "pad_id", "penalize", "use_min_p", "row_block"))
def slots_program(config, params, prompts, prompt_mask, rng, temperature, top_p, penalty=1.0, min_p=0.0, *,
                  max_new_tokens, num_samples, slots, top_k, greedy, nucleus, eos_ids, pad_id, penalize=False,
                  use_min_p=False, row_block=None):
    """`generate` with `slots` decode slots (see the module docstring); arguments as `batch.generate_program`
    (`row_block`'s offset is added to the row index of each draw's stream)."""
    b, _ = prompts.shape
    g, t_max, s = num_samples, max_new_tokens, slots
    n = b * g
    draw = functools.partial(draw_tokens, None, temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy,
                             nucleus=nucleus, penalty=penalty, min_p=min_p if use_min_p else None)
    eos = jnp.asarray(eos_ids, jnp.int32)

    # 1-2. prefill once per prompt; the first token of every row.
    moe = config.num_experts > 0  # record each token's experts (Rollout.routes) for routing replay
    offset = 0 if row_block is None else row_block[0]
    prefix_kv, prompt_routes, prompt_len, first, _, seen, tokens, logprobs, mask, routes = prefill_and_first(
        config, params, prompts, prompt_mask, rng, draw, num_samples=g, max_new_tokens=t_max, pad_id=pad_id,
        penalize=penalize, offset=offset)
    prefix_mask = prompt_mask.astype(bool)
    rows = jnp.arange(n, dtype=jnp.int32)

    # The rows still to decode, in row order, then the sentinel n ("no row": an idle slot).
    pending = ~jnp.isin(first, eos) & (t_max > 1)
    queue = jnp.where(rows < jnp.sum(pending), jnp.argsort(~pending, stable=True), n).astype(jnp.int32)
    take_queue = lambda i: jnp.take(queue, i, mode="fill", fill_value=n)
    prompt_of = lambda row: jnp.minimum(row, n - 1) // g  # an idle slot keeps reading some prompt

    weights, prefix = decode_prepare(config, params, prefix_kv)
    slot_row = take_queue(jnp.arange(s))
    state = (slot_row, jnp.zeros((s,), jnp.int32), jnp.take(first, jnp.minimum(slot_row, n - 1)), jnp.int32(s),
             decode_rows(config, prefix, prompt_of(slot_row)), init_cache(config, s, t_max),
             tokens, logprobs, mask, seen, routes)

    def body(state):
        row, t, token, nxt, slot_prefix, cache, tokens, logprobs, mask, seen, routes = state
        active, prompt = row < n, prompt_of(row)
        with jax.named_scope("layers"):
            hidden, cache, *experts = decode_step(config, params, weights, token, jnp.take(prompt_len, prompt) + t,
                                                  cache, t, slot_prefix, jnp.take(prefix_mask, prompt, axis=0),
                                                  return_routes=moe)
        if moe:  # the experts (L,S,k) of each slot's token t -> routes[:, row, t] (an idle slot's: dropped)
            routes = routes.at[:, row, t].set(experts[0], mode="drop")
        with jax.named_scope("lm_head"):
            logits = decode_logits(config, params, hidden)
        with jax.named_scope("draw"):
            new, logp, blogp = draw(logits, uniform=row_uniforms(rng, row + offset, t + 1),
                                    seen=None if seen is None else jnp.take(seen, jnp.minimum(row, n - 1), axis=0))
        seen = None if seen is None else mark(seen, row, new)
        # Token t+1 of each slot's row; an idle slot's row n is out of range and its writes are dropped.
        tokens = tokens.at[row, t + 1].set(new, mode="drop")
        logprobs = logprobs.at[row, :, t + 1].set(jnp.stack([logp, blogp], 1), mode="drop")
        mask = mask.at[row, t + 1].set(1, mode="drop")
        finished = active & (jnp.isin(new, eos) | (t + 2 >= t_max))
        # Refill: the k-th finished slot (in slot order) takes the k-th next pending row.
        fresh = take_queue(nxt + jnp.cumsum(finished) - 1)
        row = jnp.where(finished, fresh, row)
        token = jnp.where(finished, jnp.take(first, jnp.minimum(fresh, n - 1)), new)
        t = jnp.where(finished, 0, jnp.where(active, t + 1, t))
        slot_prefix = jax.lax.cond(jnp.any(finished), lambda p: decode_rows(config, prefix, prompt_of(row)),
                                   lambda p: p, slot_prefix)
        return row, t, token, nxt + jnp.sum(finished), slot_prefix, cache, tokens, logprobs, mask, seen, routes

    state = jax.lax.while_loop(lambda st: jnp.any(st[0] < n), body, state)
    tokens, logprobs, mask, _, routes = state[-5:]
    ended = jnp.any(jnp.isin(tokens, eos) & (mask == 1), axis=-1)
    return Rollout(tokens=tokens, logprobs=logprobs[:, 0], behavior_logprobs=logprobs[:, 1], mask=mask,
                   lengths=jnp.sum(mask, axis=-1), truncated=~ended, prompt_tokens=jnp.repeat(prompts, g, axis=0),
                   prompt_mask=jnp.repeat(prompt_mask, g, axis=0), routes=routes,
                   prompt_routes=jnp.repeat(prompt_routes, g, axis=1) if moe else None)
