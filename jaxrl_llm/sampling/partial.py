"""One round of partial rollouts (`rollout.partial`): the continuous-batching sampler run on a table of
rows that may already hold tokens drawn by older policy versions, stopped as soon as enough groups are
complete, the rows still in flight left as they are for the next round (trainer/partial.py keeps the
table between rounds, one round per training step).

Shapes: Q prompts of P tokens (left-padded), G = num_samples rows each, R = Q*G rows in group order
(row r continues prompt r // G); T = max_new_tokens; S slots. Per row: tokens (R,T), logprobs (R,2,T)
(the full-vocabulary log-prob, then the behaviour one, as `Rollout`), versions (R,T) (the policy version
that drew each token), lengths (R,) (tokens drawn so far; 0: not started), done (R,).

A round, with the parameters of policy version `version`:
  1. prefill the Q prompts; every row not started draws its first token from its prompt's last logits;
  2. the rows not done, in row order, are the queue; the first S take the slots. A row that already holds
     n >= 2 tokens needs the keys/values of its tokens 0..n-2 under *this* version's weights: one
     prefill of [prompt ; tokens] for the slots' rows writes them into the slots' cache (`resume`,
     static: the first round of a run has none), and the row goes on at cache index n-1 exactly as if
     it had never stopped -- the decode step, its window and positions are the slots sampler's;
  3. the slots sampler's loop (sampling/slots.py), until at least `need` groups have all their rows done
     and so have the groups `hold` names (or no slot holds a row).
Rows in flight at the stop keep their tokens. Only rows that held a slot hold two tokens or more, and
they are queued first: the next round's first S queued rows include every row that needs its cache.

Randomness: token t of row r is drawn from fold_in(fold_in(keys[r // G], stream[r]), t), a function of
the row's key, stream index and position only: with the same weights in every round, a row's tokens are
the slots sampler's (`slots_program` with rng = its key, row = its stream index) whatever the rounds'
stops (tests/test_sampling_partial.py). The resumed rows' keys/values are a prefill's, not the decode
steps' that drew them: equal up to float rounding.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.compile_options import jit
from jaxrl_llm.models.lm import decode_logits, decode_prepare, decode_rows, decode_step, init_cache, prefill
from jaxrl_llm.sampling.draw import draw_tokens, mark, seen_tokens


def resumes(lengths, done, slots: int) -> bool:
    """Whether a round on rows with these `lengths`, `done` (R,) (host arrays) resumes rows holding two
    tokens or more; refuses more such rows than `slots` (they must all hold a slot at the round's start)."""
    holding = int(np.sum((lengths >= 2) & ~done))
    if holding > slots:
        raise ValueError(f"{holding} rows in flight hold tokens, more than the {slots} slots")
    return bool(np.any(lengths >= 2))


def keyed_uniforms(keys, rows, steps):
    """(S,) float32 uniforms: row i's draw of token steps[i] in the stream rows[i] of key keys[i] (S,2)
    uint32; `draw.row_uniforms` with one key per row."""
    one = lambda k, r, t: jax.random.uniform(jax.random.fold_in(jax.random.fold_in(k, r), t), (), jnp.float32)
    return jax.vmap(one)(keys, rows, steps)


@functools.partial(jit, static_argnames=("config", "num_samples", "slots", "top_k", "greedy", "nucleus", "eos_ids",
                                         "penalize", "use_min_p", "resume"))
def round_program(config, params, prompts, prompt_mask, keys, stream, tokens, logprobs, versions, lengths, done,
                  version, need, hold, temperature, top_p, penalty=1.0, min_p=0.0, routes=None, *, num_samples, slots,
                  top_k, greedy, nucleus, eos_ids, penalize=False, use_min_p=False, resume=False):
    """One round (the module docstring). prompts, prompt_mask (Q,P) int32; keys (Q,2) uint32, each prompt's
    rows' key; stream (R,) int32; tokens, logprobs, versions, lengths, done as in the module docstring;
    version, need int32 scalars; hold (Q,) bool: groups the round may not stop before they are done. routes (L,R,T,k) int32 or None: MoE, the experts each fed token was routed
    to (`moe.unrecorded_routes` where none yet): every token fed in this round records this version's.
    Returns (tokens, logprobs, versions, lengths, done, finish (R,) int32: the loop iteration at which each
    row ended in this round (0: at its first token; -1: not in this round), iterations: the decode steps
    run, routes, prompt_routes (L,Q,P,k): this round's experts of the prompts; both None without routes)."""
    q, p_len = prompts.shape
    r, t_max = tokens.shape
    g, s = num_samples, slots
    draw = functools.partial(draw_tokens, None, temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy,
                             nucleus=nucleus, penalty=penalty, min_p=min_p if use_min_p else None)
    eos = jnp.asarray(eos_ids, jnp.int32)
    rows = jnp.arange(r, dtype=jnp.int32)
    prompt_of = lambda row: jnp.minimum(row, r - 1) // g  # an idle slot (row r) reads some prompt
    row_keys = jnp.take(keys, rows // g, axis=0)
    uniforms = lambda row, t: keyed_uniforms(jnp.take(row_keys, jnp.minimum(row, r - 1), axis=0),
                                             jnp.take(stream, jnp.minimum(row, r - 1)), t)
    drawn = jnp.arange(t_max)[None] < lengths[:, None]  # (R,T) the tokens each row already holds

    # 1. the prompts once; the first token of every row not started.
    moe = routes is not None
    hidden, prefix_kv, *prompt_routes = prefill(config, params, prompts, prompt_mask, with_lm_head=False,
                                                return_routes=moe)
    prefix_mask = prompt_mask.astype(bool)
    prompt_len = jnp.sum(prompt_mask, axis=-1)
    last_logits = decode_logits(config, params, hidden[:, -1])  # (Q,V)
    seen = None
    if penalize:  # the penalty's set: the prompt's tokens and every token the row drew, in any round
        seen = jnp.repeat(seen_tokens(prompts, prompt_mask, config.vocab_size), g, axis=0)
        seen = seen.at[rows[:, None], jnp.where(drawn, tokens, config.vocab_size)].set(True, mode="drop")
    fresh = (lengths == 0) & ~done
    first, logp, blogp = draw(jnp.take(last_logits, rows // g, axis=0), uniform=uniforms(rows, 0 * rows), seen=seen)
    seen = None if seen is None else mark(seen, jnp.where(fresh, rows, r), first)
    tokens = tokens.at[:, 0].set(jnp.where(fresh, first, tokens[:, 0]))
    logprobs = logprobs.at[:, :, 0].set(jnp.where(fresh[:, None], jnp.stack([logp, blogp], 1), logprobs[:, :, 0]))
    versions = versions.at[:, 0].set(jnp.where(fresh, version, versions[:, 0]))
    ended = fresh & (jnp.isin(first, eos) | (t_max == 1))
    done, finish = done | ended, jnp.where(ended, 0, -1).astype(jnp.int32)
    lengths = jnp.where(fresh, 1, lengths)

    # 2. the queue and the slots' first rows: the rows holding n >= 2 tokens (at most S: the rows that held
    # slots when the last round stopped), then the other rows not done, each in row order; then the sentinel r.
    pending = ~done
    rank = jnp.where(pending, jnp.where(lengths >= 2, 0, 1), 2) * r + rows
    queue = jnp.where(rows < jnp.sum(pending), jnp.argsort(rank), r).astype(jnp.int32)
    take_queue = lambda i: jnp.take(queue, i, mode="fill", fill_value=r)
    slot_row = take_queue(jnp.arange(s))
    held = jnp.take(lengths, jnp.minimum(slot_row, r - 1))
    t0 = jnp.where(slot_row < r, held - 1, 0)
    weights, prefix = decode_prepare(config, params, prefix_kv)
    if resume:  # the slots' tokens 0..n-2 under this version's weights, from one prefill
        src = jnp.minimum(slot_row, r - 1)
        both = jnp.concatenate([jnp.take(prompts, prompt_of(slot_row), axis=0), jnp.take(tokens, src, axis=0)], 1)
        kv_mask = jnp.arange(t_max)[None] < t0[:, None]
        both_mask = jnp.concatenate([jnp.take(prompt_mask, prompt_of(slot_row), axis=0), kv_mask.astype(jnp.int32)], 1)
        _, kv = prefill(config, params, both, both_mask, with_lm_head=False)
        _, cache = decode_prepare(config, params, (kv[0][:, :, p_len:], kv[1][:, :, p_len:]))
    else:
        cache = init_cache(config, s, t_max)
    token0 = jnp.take_along_axis(jnp.take(tokens, jnp.minimum(slot_row, r - 1), axis=0), t0[:, None], 1)[:, 0]
    groups_done = lambda d: jnp.sum(jnp.all(d.reshape(q, g), axis=-1))
    state = (slot_row, t0, token0, jnp.int32(s), decode_rows(config, prefix, prompt_of(slot_row)), cache,
             tokens, logprobs, versions, lengths, done, finish, seen, jnp.int32(0), routes)

    def body(state):
        row, t, token, nxt, slot_prefix, cache, tokens, logprobs, versions, lengths, done, finish, seen, it, routes = state
        active, prompt = row < r, prompt_of(row)
        hidden, cache, *experts = decode_step(config, params, weights, token, jnp.take(prompt_len, prompt) + t, cache,
                                              t, slot_prefix, jnp.take(prefix_mask, prompt, axis=0), return_routes=moe)
        if moe:  # the experts (L,S,k) of each slot's token t -> routes[:, row, t] (an idle slot's: dropped)
            routes = routes.at[:, row, t].set(experts[0], mode="drop")
        logits = decode_logits(config, params, hidden)
        new, logp, blogp = draw(logits, uniform=uniforms(row, t + 1),
                                seen=None if seen is None else jnp.take(seen, jnp.minimum(row, r - 1), axis=0))
        seen = None if seen is None else mark(seen, row, new)
        # Token t+1 of each slot's row; an idle slot's row r is out of range and its writes are dropped.
        tokens = tokens.at[row, t + 1].set(new, mode="drop")
        logprobs = logprobs.at[row, :, t + 1].set(jnp.stack([logp, blogp], 1), mode="drop")
        versions = versions.at[row, t + 1].set(version, mode="drop")
        lengths = lengths.at[row].set(t + 2, mode="drop")
        finished = active & (jnp.isin(new, eos) | (t + 2 >= t_max))
        done = done.at[jnp.where(finished, row, r)].set(True, mode="drop")
        finish = finish.at[jnp.where(finished, row, r)].set(it + 1, mode="drop")
        fresh_row = take_queue(nxt + jnp.cumsum(finished) - 1)  # the k-th finished slot takes the k-th next row
        row = jnp.where(finished, fresh_row, row)
        # A row taken from the queue mid-round holds one token (the rows holding more were queued first).
        token = jnp.where(finished, jnp.take(tokens[:, 0], jnp.minimum(fresh_row, r - 1)), new)
        t = jnp.where(finished, 0, jnp.where(active, t + 1, t))
        slot_prefix = jax.lax.cond(jnp.any(finished), lambda p: decode_rows(config, prefix, prompt_of(row)),
                                   lambda p: p, slot_prefix)
        return (row, t, token, nxt + jnp.sum(finished), slot_prefix, cache, tokens, logprobs, versions, lengths,
                done, finish, seen, it + 1, routes)

    held = lambda d: jnp.any(hold & ~jnp.all(d.reshape(q, g), axis=-1))
    go = lambda st: jnp.any(st[0] < r) & ((groups_done(st[10]) < need) | held(st[10]))
    state = jax.lax.while_loop(go, body, state)
    tokens, logprobs, versions, lengths, done, finish, _, iterations, routes = state[6:]
    return tokens, logprobs, versions, lengths, done, finish, iterations, routes, prompt_routes[0] if moe else None


def run_round(config, params, prompts, prompt_mask, keys, table: dict, version: int, need: int, *, max_new_tokens,
              num_samples, slots, eos_ids, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0,
              min_p=0.0, hold=None, resume=None) -> dict:
    """`round_program` on a table of rows (host or device arrays: stream, tokens, logprobs, versions,
    lengths, done; MoE with `routes` (L,R,T,k): recorded) and `hold` (Q,) bool (None: none held); returns
    the table after the round, with `finish` and `iterations`. `resume` (static): whether any row holds two
    tokens or more; None: read from the table (host arrays), which `resumes` checks."""
    if resume is None:
        resume = resumes(np.asarray(table["lengths"]), np.asarray(table["done"]), slots)
    out = round_program(config, params, jnp.asarray(prompts, jnp.int32), jnp.asarray(prompt_mask, jnp.int32),
                        jnp.asarray(keys, jnp.uint32), jnp.asarray(table["stream"], jnp.int32),
                        jnp.asarray(table["tokens"], jnp.int32), jnp.asarray(table["logprobs"], jnp.float32),
                        jnp.asarray(table["versions"], jnp.int32), jnp.asarray(table["lengths"], jnp.int32),
                        jnp.asarray(table["done"], bool), jnp.int32(version), jnp.int32(need),
                        jnp.zeros(len(prompts), bool) if hold is None else jnp.asarray(hold, bool),
                        jnp.float32(max(temperature, 1e-6)), jnp.float32(top_p), jnp.float32(repetition_penalty),
                        jnp.float32(min_p), num_samples=int(num_samples), slots=int(slots), top_k=int(top_k),
                        greedy=temperature == 0, nucleus=top_p < 1.0, eos_ids=tuple(int(e) for e in eos_ids),
                        routes=None if table.get("routes") is None else jnp.asarray(table["routes"], jnp.int32),
                        penalize=repetition_penalty != 1.0, use_min_p=min_p > 0, resume=resume)
    names = ("tokens", "logprobs", "versions", "lengths", "done", "finish", "iterations", "routes", "prompt_routes")
    return {**table, **dict(zip(names, out))}


def empty_rows(rows: int, max_new_tokens: int, pad_id: int) -> dict:
    """A table of `rows` rows not started (NumPy), stream 0..rows-1."""
    return {"stream": np.arange(rows, dtype=np.int32), "tokens": np.full((rows, max_new_tokens), pad_id, np.int32),
            "logprobs": np.zeros((rows, 2, max_new_tokens), np.float32),
            "versions": np.zeros((rows, max_new_tokens), np.int32), "lengths": np.zeros(rows, np.int32),
            "done": np.zeros(rows, bool)}
