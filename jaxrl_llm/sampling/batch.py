"""The static-batch sampler (`rollout.decode_slots` = 0): prefill each prompt once, then decode all N rows
together with a KV cache until the last one is done.

Shapes: B prompts, P prompt tokens (left-padded), G = num_samples, N = B*G rows (the G completions of
prompt b are rows b*G .. b*G+G-1), T = max_new_tokens, V vocabulary, L layers.

One XLA program per (B, P, T, G) and sampling mode:
  1. prefill: the B prompts run once; their per-layer keys/values (L,B,P,Hkv,hd) are the shared prefix
     that all G completions of a prompt attend to -- never copied G times;
  2. the first token of every row is drawn from its prompt's last logits;
  3. a `lax.while_loop` decodes one token per step for all N rows into per-layer caches (keys
     (N,Hkv,hd,T), values (N,Hkv,T,hd)) that the loop carries and XLA updates in place, and exits as
     soon as every row has emitted an EOS
     (`models.lm.decode_step`: layer weights fused and sliced once per call, not once per token);
     with `phases` (m1 > m2 > ...; `shrink_phases`), the loop also exits once at most m1 rows are still
     decoding, and the decode goes on over m1 rows -- the alive ones, their caches gathered, each with a
     copy of its prompt's prefix -- and so on: on a CPU a decode step's cost grows with its rows (at
     SmolLM2-135M's shape 55 ms at 16 rows, 37 ms at 4), and with heavy-tailed lengths most steps have few
     rows left.
Token t of all rows is drawn from one key, fold_in(rng, t): N uniforms, row n taking the n-th (with
`row_block` (offset, total), the rows' block of the `total` uniforms the whole batch draws), in every
phase: the phases change which rows a step computes, not the draws (the tokens are the same up to float
rounding of differently shaped matrix products).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from jaxrl_llm.compile_options import jit
from jaxrl_llm.models.lm import decode_logits, decode_prepare, decode_rows, decode_step, init_cache, prefill
from jaxrl_llm.models.moe import unrecorded_routes
from jaxrl_llm.sampling.draw import draw_tokens, mark, seen_tokens


@flax.struct.dataclass
class Rollout:
    """Completions of a batch of prompts, N = B*G rows, completions of one prompt contiguous.

    tokens (N,T) int32 -- pad_id after EOS;  logprobs (N,T) float32 -- 0 where mask is 0 (the trainer's
    convention: full vocabulary);  behavior_logprobs (N,T) float32 -- of the distribution each token was
    drawn from (top-k/top-p truncated and renormalised; = logprobs without truncation), 0 where mask is 0;
    mask (N,T) int32 -- 1 on generated tokens including the EOS;  lengths (N,) int32 = mask.sum(1);
    truncated (N,) bool -- no EOS within T;  prompt_tokens / prompt_mask (N,P) -- each prompt repeated G times.
    MoE models (both samplers): routes (L,N,T,k) int32 -- the experts token t was routed to when fed
    (`models.moe.NO_ROUTE` for the last token, never fed); prompt_routes (L,N,P,k) those of the prompt tokens; else None.
    page_stats (2,) int32, the paged sampler's only (sampling/paged.py): [rows restarted because a pool ran
    out of pages, most pages in use at once in one row shard's pool]; else None.
    """

    tokens: jax.Array
    logprobs: jax.Array
    behavior_logprobs: jax.Array
    mask: jax.Array
    lengths: jax.Array
    truncated: jax.Array
    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    routes: jax.Array | None = None
    prompt_routes: jax.Array | None = None
    page_stats: jax.Array | None = None

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]



def shrink_phases(rows: int, shrink: int, multiple: int = 1) -> tuple[int, ...]:
    """The row counts the static decode shrinks to (`generate(decode_shrink=k)`): rows/k, rows/k^2, ...,
    each rounded up to a multiple of `multiple` (the mesh's batch shards), while it is below the last and
    at least k rows (under k rows a decode step reads the same weights for nearly no work, and each phase
    is one more compiled decode step). shrink 0: () (off)."""
    phases, m = [], rows
    while shrink >= 2:
        m = -(-m // shrink)
        m = -(-m // multiple) * multiple
        if m < shrink or m >= (phases[-1] if phases else rows):
            break
        phases.append(m)
    return tuple(phases)


def _record(tokens, logprobs, mask, routes, rows, t, new, both, alive, experts):
    """One decode step's outputs written at token t + 1 (the experts at t, the token fed): new (M,), both
    (M,2) log-probs, alive (M,) int, experts (L,M,k) or None, for `rows` (M,) of the (N,...) outputs, or
    for all N rows in order when rows is None (in-place column writes)."""
    if rows is None:
        if experts is not None:
            routes = jax.lax.dynamic_update_slice(routes, experts[:, :, None], (0, 0, t, 0))
        return (jax.lax.dynamic_update_slice(tokens, new[:, None], (0, t + 1)),
                jax.lax.dynamic_update_slice(logprobs, both[:, :, None], (0, 0, t + 1)),
                jax.lax.dynamic_update_slice(mask, alive[:, None], (0, t + 1)), routes)
    if experts is not None:
        routes = routes.at[:, rows, t].set(experts)
    return (tokens.at[rows, t + 1].set(new), logprobs.at[rows, :, t + 1].set(both), mask.at[rows, t + 1].set(alive),
            routes)


@functools.partial(jit, static_argnames=("config", "max_new_tokens", "num_samples", "top_k", "greedy",
                                         "nucleus", "eos_ids", "pad_id", "penalize", "use_min_p", "row_block",
                                         "phases"))
def generate_program(config, params, prompts, prompt_mask, rng, temperature, top_p, penalty=1.0, min_p=0.0, *,
                     max_new_tokens, num_samples, top_k, greedy, nucleus, eos_ids, pad_id, penalize=False,
                     use_min_p=False, row_block=None, phases=()):
    b, _ = prompts.shape
    g, t_max = num_samples, max_new_tokens
    n = b * g
    rows = jnp.arange(n)
    warps = dict(temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy, nucleus=nucleus, penalty=penalty,
                 min_p=min_p if use_min_p else None)
    draw = functools.partial(_draw, warps=warps, row_block=row_block, n=n)
    # The repetition penalty's set per row: its prompt's tokens, then each token it draws (None: off).
    seen = (jnp.repeat(seen_tokens(prompts, prompt_mask, config.vocab_size), g, axis=0) if penalize else None)
    eos = jnp.asarray(eos_ids, jnp.int32)

    # 1. prefill once per prompt.
    moe = config.num_experts > 0
    hidden, prefix_kv, *prompt_routes = prefill(config, params, prompts, prompt_mask, with_lm_head=False,
                                                return_routes=moe)
    prefix_mask = prompt_mask.astype(bool)
    last_logits = decode_logits(config, params, hidden[:, -1])  # (B,V)
    start = jnp.repeat(jnp.sum(prompt_mask, axis=-1), g)  # (N,) position of the first new token

    # 2. first token of every row from its prompt's logits (independent draws per row).
    token, logp, blogp = draw(jax.random.fold_in(rng, 0), jnp.repeat(last_logits, g, axis=0), seen=seen)
    seen = None if seen is None else mark(seen, rows, token)
    tokens = jnp.full((n, t_max), pad_id, jnp.int32).at[:, 0].set(token)
    logprobs = jnp.zeros((n, 2, t_max), jnp.float32).at[:, :, 0].set(jnp.stack([logp, blogp], 1))
    mask = jnp.zeros((n, t_max), jnp.int32).at[:, 0].set(1)
    done = jnp.isin(token, eos)

    # 3. decode: step t feeds token t (cache slot t) and draws token t+1. Weights are fused and the prompt
    # prefix re-laid out once here, outside the loop.
    weights, prefix = decode_prepare(config, params, prefix_kv)
    cache = init_cache(config, n, t_max)
    routes = unrecorded_routes(config, n, t_max) if moe else None
    dec = _Decoder(config=config, params=params, weights=weights, prefix=prefix, prefix_mask=prefix_mask, start=start,
                   rng=rng, draw=draw, eos=eos, pad_id=pad_id, t_max=t_max, g=g, n=n, moe=moe)

    # All n rows decode together; with `phases`, once at most phases[0] rows are alive the decode goes on
    # over phases[0] rows (the alive ones first, their caches gathered), and so on: a decode step's cost
    # grows with its rows (on a CPU nearly in proportion), and with heavy-tailed lengths most steps have
    # few rows left. Every row draws the uniforms it draws in the full batch: the same tokens (up to rounding).
    until = (*phases, 0)  # each loop's exit: at most this many rows alive (0: every row has ended)
    state = _decode(dec, (jnp.int32(0), tokens, logprobs, mask, done, cache, token, seen, routes), until[0])
    kept = None
    for i, m in enumerate(phases):
        state, kept = _shrink(config, state, kept, m)
        state = _decode(dec, state, until[i + 1], kept)
    _, tokens, logprobs, mask, _, _, _, _, routes = state
    return _assemble(tokens, logprobs, mask, routes, prompts, prompt_mask, prompt_routes[0] if moe else None, g, eos)


def _draw(key, logits, seen, rows=None, *, warps, row_block, n):
    """Token, log-prob and behaviour log-prob of each row, (M,) each, from `logits` (M,V) warped by `warps`;
    `rows` (M,): the rows of `logits`, which draw the uniforms these rows draw in the whole batch (None: all
    n rows, in order)."""
    if row_block is None and rows is None:  # categorical draws (n,) uniforms from `key`
        return draw_tokens(key, logits, seen=seen, **warps)
    offset, total = row_block or (0, n)  # the same uniforms as the whole batch's, this block of them
    uniform = jax.lax.dynamic_slice_in_dim(jax.random.uniform(key, (total,), jnp.float32), offset, n)
    return draw_tokens(key, logits, seen=seen, uniform=uniform if rows is None else jnp.take(uniform, rows),
                       **warps)


class _Decoder(NamedTuple):
    """What every decode step of one `generate_program` trace reads: fixed for the whole program."""

    config: Any
    params: Any
    weights: Any  # the layer weights fused once (decode_prepare)
    prefix: Any  # the prompts' keys/values (L,B,...), laid out once (decode_prepare)
    prefix_mask: jax.Array  # (B,P) bool
    start: jax.Array  # (N,) position of each row's first new token
    rng: jax.Array  # token t is drawn from fold_in(rng, t)
    draw: Callable  # _draw with the program's warps and row block
    eos: jax.Array  # (E,) int32
    pad_id: int
    t_max: int
    g: int
    n: int
    moe: bool


def _decode(d: _Decoder, state, until, kept=None):
    """Decode steps while a row is alive, until at most `until` are. kept None: all n rows in order
    (their prompts' shared prefix, in-place column writes); else the (M,) rows `kept` (each with a copy
    of its prompt's prefix; writes scattered to its row), state over those M rows."""
    prompt = None if kept is None else kept // d.g
    pre = d.prefix if kept is None else decode_rows(d.config, d.prefix, prompt)
    pre_mask = d.prefix_mask if kept is None else jnp.take(d.prefix_mask, prompt, axis=0)
    at = d.start if kept is None else jnp.take(d.start, kept)
    m = d.n if kept is None else kept.shape[0]

    def body(state):
        return _decode_step(d, pre, pre_mask, at, kept, m, state)

    def cond(state):
        t, done = state[0], state[4]
        return (t < d.t_max - 1) & (jnp.sum(~done) > until)

    return jax.lax.while_loop(cond, body, state)


def _decode_step(d: _Decoder, pre, pre_mask, at, kept, m, state):
    """The decode loop's body: feeds token t of the M rows (cache slot t, position `at` (M,) + t, the
    prompt prefix `pre` / `pre_mask`), draws and records token t+1, and marks the rows that drew an EOS."""
    t, tokens, logprobs, mask, done, cache, token, seen, routes = state
    with jax.named_scope("layers"):  # the scopes name the stages in profiles (docs/benchmarks_history.md)
        hidden, cache, *experts = decode_step(d.config, d.params, d.weights, token, at + t, cache, t, pre,
                                              pre_mask, return_routes=d.moe)
    with jax.named_scope("lm_head"):
        logits = decode_logits(d.config, d.params, hidden)
    with jax.named_scope("draw"):
        key = jax.random.fold_in(d.rng, t + 1)
        new, logp, blogp = d.draw(key, logits, seen=seen, rows=kept)  # kept rows: their own uniforms
    alive = ~done
    new = jnp.where(alive, new, d.pad_id)
    both = jnp.where(alive[:, None], jnp.stack([logp, blogp], 1), 0.0)  # (M,2): one update for the pair
    tokens, logprobs, mask, routes = _record(tokens, logprobs, mask, routes, kept, t, new, both,
                                             alive.astype(jnp.int32), experts[0] if d.moe else None)
    done = done | jnp.isin(new, d.eos)
    seen = None if seen is None else mark(seen, jnp.arange(m), new)
    return t + 1, tokens, logprobs, mask, done, cache, new, seen, routes


def _shrink(config, state, kept, m):
    """(state over m rows, kept (m,)): the decode `state` cut to its alive rows, moved first (at most m:
    the loop ran until then), their caches gathered; `kept` maps them to their rows of the N (None: all)."""
    t, tokens, logprobs, mask, done, cache, token, seen, routes = state
    sel = jnp.argsort(done, stable=True)[:m]  # the alive rows first (at most m: the loop ran until then)
    kept = sel if kept is None else jnp.take(kept, sel)
    state = (t, tokens, logprobs, mask, jnp.take(done, sel), decode_rows(config, cache, sel), jnp.take(token, sel),
             None if seen is None else jnp.take(seen, sel, axis=0), routes)
    return state, kept


def _assemble(tokens, logprobs, mask, routes, prompts, prompt_mask, prompt_routes, g, eos):
    """The Rollout of the decode's outputs: tokens (N,T), logprobs (N,2,T) (trainer's, behaviour), mask (N,T),
    routes (L,N,T,k) or None; prompts / prompt_mask (B,P) and prompt_routes (L,B,P,k) or None, repeated G times."""
    # Ended: an EOS among its tokens (a loop that stops at T may leave more alive rows than a phase keeps).
    done = jnp.any(jnp.isin(tokens, eos) & (mask == 1), axis=-1)
    return Rollout(tokens=tokens, logprobs=logprobs[:, 0], behavior_logprobs=logprobs[:, 1], mask=mask,
                   lengths=jnp.sum(mask, axis=-1),
                   truncated=~done, prompt_tokens=jnp.repeat(prompts, g, axis=0),
                   prompt_mask=jnp.repeat(prompt_mask, g, axis=0), routes=routes,
                   prompt_routes=None if prompt_routes is None else jnp.repeat(prompt_routes, g, axis=1))
