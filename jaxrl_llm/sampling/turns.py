"""The multi-turn sampler: an episode decodes turn by turn on one KV cache per row, and each observation is
prefilled into its row's cache. Nothing the model generated is ever re-encoded or re-run.

Shapes: B prompts, P prompt tokens (left-padded), G rows per prompt, N = B*G rows, C = the episode's
budget of tokens after the prompt (model and environment tokens), K = one turn's budget, O an
observation chunk.

Three jit-compiled programs over an `Episode` that stays on device between calls. `trainer/episodes.py`
drives them and runs the environment on the host.
  * `start`: prefill the B prompts once (the G rows of a prompt share its keys/values, as in the
    single-turn sampler) and allocate an empty cache of C slots per row;
  * `decode_turn`: a `lax.while_loop` of one decode step per token. Each active row draws a token, feeds
    it into its cache and draws again, until it draws a stop token (the chat template's turn end, EOS) or
    reaches its `limit` for this turn;
  * `append`: the observations (N,O), right-padded, run as one prefill chunk. Each row's chunk attends to
    [its prompt ; its cache]; its keys/values are written after the row's tokens; the hidden state of
    its last token predicts the next turn's first token.
`rewind` (host side) shortens rows whose turn the host cut (a stop string) before their next append.

Invariant between calls: slots 0..length-1 of a row's cache hold the keys/values of every token of its
episode after the prompt, in order. Each drawn token is fed as soon as it is drawn, a turn's last token
too. `hidden` is the final-norm hidden state of the row's last token (the prompt's last before the
first turn), the state the next draw reads. A row that is not drawing writes to the slot just past the
call's window (see Cost), out of bounds: JAX drops out-of-bounds scatter writes. tests/test_sampling_turns.py checks the cache against a
single-shot prefill of the same tokens.

Randomness: the token at offset j of row n's episode is drawn from fold_in(fold_in(rng, n), j)
(`draw.row_uniforms`), one key for the whole episode. A row's draws therefore do not depend on when the
other rows' turns end. Log-probs follow `jaxrl_llm.sampling`'s convention (the full vocabulary at the
temperature, plus behaviour log-probs of the top-k/top-p distribution).

Several processes: every argument the host passes (limits, observations, rewinds) is of all N rows and
the same on every host (`trainer/episodes.py` gathers them), so the programs see one global batch.

Cost: a turn costs one decode step per token of its longest row. An append costs one pass over its
O tokens against the prompt and the cache, against a prefill of the whole episode at every turn for a
loop of single-turn `generate` calls. Each call sees a window of the cache: its first W slots, W the
most any of its rows can reach rounded up to a power of two from 64 (`_window_for`; a handful of
shapes, each compiled once). A step then attends over about the episode so far, not its whole budget C.
The window is copied out and written back once per call; an append also makes transient copies of it
in the prefill layout (about 3x its size).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import distributed as dist
from jaxrl_llm.compile_options import jit
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.lm import (decode_layer_weights, decode_logits, decode_prepare, decode_step, decode_unrolled,
                                 init_cache, prefill)
from jaxrl_llm.models.moe import unrecorded_routes
from jaxrl_llm.models.precision import precise
from jaxrl_llm.models.transformer import Decoder
from jaxrl_llm.sampling.draw import check_penalties, draw_tokens, row_uniforms


@flax.struct.dataclass
class Episode:
    """N episodes on device between turns (see the module docstring). prefix, prefix_mask: the B prompts'
    keys/values in `decode_prepare`'s layout, (B,P) bool; prompt_len (N,) int32; cache: `init_cache(N, C)`;
    length (N,) int32 tokens in the cache; hidden (N,D) float32, the state of each row's last token;
    counts (N,V) int32, how often each token occurs in the row's prompt and cache (the repetition
    penalty's set; counts, not flags, so that `rewind` can take tokens out), or None when off.
    MoE models (else None): routes (L,N,C,k) int32, the experts of cache slot j's token when it was fed
    (decoded or appended; routing replay), prompt_routes (L,B,P,k) those of the prompt tokens."""

    prefix: Any
    prefix_mask: jax.Array
    prompt_len: jax.Array
    cache: Any
    length: jax.Array
    hidden: jax.Array
    counts: Any = None
    routes: Any = None
    prompt_routes: Any = None

    @property
    def capacity(self) -> int:
        return jax.tree_util.tree_leaves(self.cache)[0].shape[-1]  # keys are (..., hd, C)


@flax.struct.dataclass
class Turn:
    """One turn of N rows, K = its budget: tokens (N,K) int32 (0 past `count`); logprobs, behavior_logprobs
    (N,K) float32 (0 past `count`); count (N,) int32 tokens drawn this turn, the stop token included."""

    tokens: jax.Array
    logprobs: jax.Array
    behavior_logprobs: jax.Array
    count: jax.Array


# -------------------------------------------------------------------------------------------- programs
@functools.partial(jit, static_argnames=("config", "num_samples", "capacity", "penalize"))
def _start(config, params, prompts, prompt_mask, *, num_samples, capacity, penalize):
    moe = config.num_experts > 0
    hidden, kv, *prompt_routes = prefill(config, params, prompts, prompt_mask, with_lm_head=False, return_routes=moe)
    _, prefix = decode_prepare(config, params, kv)
    n = prompts.shape[0] * num_samples
    routes = unrecorded_routes(config, n, capacity) if moe else None
    return Episode(prefix=prefix, prefix_mask=prompt_mask.astype(bool),
                   prompt_len=jnp.repeat(jnp.sum(prompt_mask.astype(jnp.int32), -1), num_samples),
                   cache=init_cache(config, n, capacity), length=jnp.zeros((n,), jnp.int32),
                   hidden=jnp.repeat(hidden[:, -1].astype(jnp.float32), num_samples, axis=0),
                   counts=jnp.repeat(_counts(prompts, prompt_mask, config.vocab_size), num_samples, 0) if penalize
                   else None, routes=routes, prompt_routes=prompt_routes[0] if moe else None)


def _counts(ids, mask, vocab):
    """(N,V) int32: occurrences of each token among the real (mask 1) entries of ids (N,L)."""
    n = ids.shape[0]
    where = jnp.where(mask.astype(bool), ids, vocab)
    return jnp.zeros((n, vocab), jnp.int32).at[jnp.arange(n)[:, None], where].add(1, mode="drop")


@functools.partial(jit, static_argnames=("config", "max_tokens", "top_k", "greedy", "nucleus", "stop_ids",
                                         "window", "use_min_p"), donate_argnames=("episode",))
def _decode_turn(config, params, episode, rng, limit, temperature, top_p, penalty, min_p, *, max_tokens, top_k, greedy,
                 nucleus, stop_ids, window, use_min_p):
    e = episode
    n, cap = e.length.shape[0], e.capacity
    rows = jnp.arange(n, dtype=jnp.int32)
    draw = functools.partial(draw_tokens, None, temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy,
                             nucleus=nucleus, penalty=penalty, min_p=min_p if use_min_p else None)
    stop = jnp.asarray(stop_ids, jnp.int32)
    limit = jnp.minimum(limit, cap - e.length)  # never past the cache
    weights = decode_layer_weights(config, params)

    def body(s):
        j, done, length, hidden, cache, tokens, logps, counts, routes = s
        alive = ~done
        new, lp, blp = draw(decode_logits(config, params, hidden), uniform=row_uniforms(rng, rows, length),
                            seen=None if counts is None else counts > 0)
        new = jnp.where(alive, new, 0)
        tokens = jax.lax.dynamic_update_slice(tokens, new[:, None], (0, j))
        both = jnp.where(alive[:, None], jnp.stack([lp, blp], 1), 0.0)
        logps = jax.lax.dynamic_update_slice(logps, both[:, :, None], (0, 0, j))
        index = jnp.where(alive, length, window)  # a row that is not drawing writes outside (dropped)
        h, cache, *experts = decode_step(config, params, weights, new, e.prompt_len + length, cache, index, e.prefix,
                                         e.prefix_mask, return_routes=routes is not None)
        if routes is not None:  # the experts (L,N,k) of the token fed at slot `length` (not drawing: dropped)
            routes = routes.at[:, rows, jnp.where(alive, length, cap)].set(experts[0], mode="drop")
        hidden = jnp.where(alive[:, None], h.astype(jnp.float32), hidden)
        length = length + alive.astype(jnp.int32)
        done = done | jnp.isin(new, stop) | (j + 1 >= limit)
        counts = None if counts is None else counts.at[rows, new].add(alive.astype(jnp.int32))
        return j + 1, done, length, hidden, cache, tokens, logps, counts, routes

    state = (jnp.int32(0), limit <= 0, e.length, e.hidden, _window(config, e.cache, window),
             jnp.zeros((n, max_tokens), jnp.int32), jnp.zeros((n, 2, max_tokens), jnp.float32), e.counts, e.routes)
    _, _, length, hidden, cache, tokens, logps, counts, routes = jax.lax.while_loop(
        lambda s: (s[0] < max_tokens) & ~jnp.all(s[1]), body, state)
    turn = Turn(tokens=tokens, logprobs=logps[:, 0], behavior_logprobs=logps[:, 1], count=length - e.length)
    return e.replace(length=length, hidden=hidden, cache=_put_window(config, e.cache, cache), counts=counts,
                     routes=routes), turn


@functools.partial(jit, static_argnames=("config", "window"), donate_argnames=("episode",))
@precise
def _append(config, params, episode, obs, obs_len, *, window):
    e = episode
    n, o = obs.shape  # the chunk attends to and writes the cache's first `window` slots only
    keys, values = _prefill_layout(config, _window(config, e.cache, window))  # (L,N,W,Hkv,hd)
    pk, pv = _prefill_layout(config, e.prefix)  # (L,B,P,Hkv,hd)
    g = n // pk.shape[1]
    rep = lambda a: jnp.repeat(a, g, axis=1)
    prefix = (jnp.concatenate([rep(pk), keys], 2), jnp.concatenate([rep(pv), values], 2))
    prefix_mask = jnp.concatenate([jnp.repeat(e.prefix_mask, g, 0), jnp.arange(window)[None] < e.length[:, None]], 1)
    j = jnp.arange(o, dtype=jnp.int32)[None]
    mask = j < obs_len[:, None]
    moe = e.routes is not None
    hidden, (ck, cv), *experts = Decoder(config, return_kv=True, with_lm_head=False, return_routes=moe).apply(
        {"params": params}, obs, (e.prompt_len + e.length)[:, None] + j, mask, prefix=prefix, prefix_mask=prefix_mask)
    slot = jnp.where(mask, e.length[:, None] + j, window)  # padding writes outside the window (dropped)
    rows = jnp.arange(n)[:, None]
    routes = (e.routes.at[:, rows, jnp.where(mask, e.length[:, None] + j, e.capacity)].set(experts[0], mode="drop")
              if moe else None)  # the observation tokens' experts (L,N,O,k) at their slots
    keys, values = keys.at[:, rows, slot].set(ck.astype(keys.dtype)), values.at[:, rows, slot].set(cv.astype(values.dtype))
    last = jnp.take_along_axis(hidden, jnp.maximum(obs_len - 1, 0)[:, None, None], 1)[:, 0].astype(jnp.float32)
    counts = None if e.counts is None else e.counts + _counts(obs, mask, config.vocab_size)
    return e.replace(cache=_put_window(config, e.cache, _decode_layout(config, keys, values)),
                     length=e.length + obs_len, hidden=jnp.where((obs_len > 0)[:, None], last, e.hidden),
                     counts=counts, routes=routes)


def _window(config: ModelConfig, cache, w: int):
    """The first `w` slots of every row's cache (keys (..., hd, C), values (..., C, hd)): a copy."""
    cut = lambda kv: (kv[0][..., :w], kv[1][..., :w, :])
    return tuple(cut(layer) for layer in cache) if decode_unrolled(config) else cut(cache)


def _put_window(config: ModelConfig, cache, window):
    """`cache` with its first slots replaced by `window` (`_window`'s shape)."""
    put = lambda kv, win: (kv[0].at[..., :win[0].shape[-1]].set(win[0]), kv[1].at[..., :win[1].shape[-2], :].set(win[1]))
    if decode_unrolled(config):
        return tuple(put(kv, win) for kv, win in zip(cache, window))
    return put(cache, window)


def bucket(n: int, smallest: int = 8) -> int:
    """The power of two from `smallest` at or above n: the padded sizes a run compiles for."""
    return max(smallest, 1 << (max(int(n), 1) - 1).bit_length())


def _window_for(episode: Episode, need) -> int:
    """The cache slots a call must see: `need` (the most slots any row may reach) rounded up to a power of two
    from 64, at most the capacity -- a handful of shapes, each compiled once, so that a step attends over
    about the episode so far rather than its whole budget."""
    return min(episode.capacity, bucket(need, 64))


def _prefill_layout(config: ModelConfig, kv):
    """A cache or prefix in `decode_prepare`'s layout (per layer, or stacked; keys (..., Hkv, hd, S), values
    (..., Hkv, S, hd)) -> stacked (k, v), each (L, rows, S, Hkv, hd): the layout `Decoder` reads."""
    k, v = (tuple(jnp.stack([layer[i] for layer in kv]) for i in (0, 1)) if decode_unrolled(config) else kv)
    return k.transpose(0, 1, 4, 2, 3), v.swapaxes(2, 3)


def _decode_layout(config: ModelConfig, k, v):
    """The inverse of `_prefill_layout`."""
    k, v = k.transpose(0, 1, 3, 4, 2), v.swapaxes(2, 3)
    return tuple((k[l], v[l]) for l in range(config.num_layers)) if decode_unrolled(config) else (k, v)


# ------------------------------------------------------------------------------------------ entry points
def start(config: ModelConfig, params, prompts, prompt_mask, *, capacity: int, num_samples: int = 1,
          repetition_penalty: bool = False) -> Episode:
    """N = B*num_samples episodes of up to `capacity` tokens after their prompt. prompts, prompt_mask (B,P)
    left-padded; rows b*G .. b*G+G-1 continue prompt b. repetition_penalty: keep the token counts that
    `decode_turn`'s repetition penalty reads."""
    prompts, prompt_mask = np.asarray(prompts), np.asarray(prompt_mask)
    if prompts.ndim != 2 or prompt_mask.shape != prompts.shape:
        raise ValueError(f"prompts and prompt_mask must be (B, P) of one shape, got {prompts.shape} and "
                         f"{prompt_mask.shape}")
    if capacity < 1 or num_samples < 1:
        raise ValueError(f"capacity and num_samples must be >= 1, got {capacity} and {num_samples}")
    longest = int(prompt_mask.sum(-1).max()) + capacity
    if longest > config.max_position_embeddings:
        raise ValueError(f"a prompt of {longest - capacity} tokens + an episode of {capacity} exceeds the model's "
                         f"max_position_embeddings {config.max_position_embeddings}")
    return _start(config, params, jnp.asarray(prompts, jnp.int32), jnp.asarray(prompt_mask, jnp.int32),
                  num_samples=int(num_samples), capacity=int(capacity), penalize=bool(repetition_penalty))


def decode_turn(config: ModelConfig, params, episode: Episode, rng, limit, *, max_tokens: int,
                stop_ids: Sequence[int], temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0, repetition_penalty: float = 1.0, min_p: float = 0.0) -> tuple[Episode, Turn]:
    """One model turn of every row: row n draws at most limit[n] tokens (0: it sits this turn out;
    never past its cache), ending at the first of `stop_ids`. limit (N,) int, each <= `max_tokens` (the
    static turn budget: one compile per value). `rng`: the episode's key, the same for every turn.
    Sampling arguments as `sampling.generate` (repetition_penalty != 1 needs an episode `start`ed with
    `repetition_penalty=True`). The old `episode` is donated: use the returned one."""
    limit = np.asarray(limit)
    n = episode.length.shape[0]
    if limit.shape != (n,) or limit.min(initial=0) < 0 or limit.max(initial=0) > max_tokens:
        raise ValueError(f"limit must be ({n},) ints in [0, max_tokens={max_tokens}], got shape {limit.shape} "
                         f"and range [{limit.min(initial=0)}, {limit.max(initial=0)}]")
    if not stop_ids:
        raise ValueError("stop_ids must name at least one token id")
    check_penalties(repetition_penalty, min_p)
    if repetition_penalty != 1.0 and episode.counts is None:
        raise ValueError("repetition_penalty: the episode was started without repetition_penalty=True")
    length = dist.fetch(episode.length)  # global: the same on every host
    window = _window_for(episode, (length + np.minimum(limit, episode.capacity - length))[limit > 0].max(initial=1))
    return _decode_turn(config, params, episode, rng, jnp.asarray(limit, jnp.int32),
                        jnp.float32(max(temperature, 1e-6)), jnp.float32(top_p), jnp.float32(repetition_penalty),
                        jnp.float32(min_p), max_tokens=int(max_tokens), top_k=int(top_k), greedy=temperature == 0,
                        nucleus=top_p < 1.0, stop_ids=tuple(int(s) for s in stop_ids), window=window,
                        use_min_p=min_p > 0)


def rewind(episode: Episode, tokens, dropped_ids=None) -> Episode:
    """Drops the last tokens[n] tokens of row n's cache (tokens (N,) ints; a turn cut short on the host, at
    a stop string). The row's hidden state is then stale: its next call must be an `append` of at least
    one token -- re-feeding the last kept token restores it. dropped_ids (N lists of those tokens' ids)
    takes them out of the repetition penalty's counts; needed when the episode keeps counts."""
    tokens = np.asarray(tokens)
    length = dist.fetch(episode.length)  # global: the same on every host
    if tokens.shape != length.shape or (tokens < 0).any() or (tokens > length).any():
        raise ValueError(f"rewind: tokens must be ({len(length)},) ints in [0, the row's length], got {tokens}")
    counts = episode.counts
    if counts is not None:
        if dropped_ids is None or [len(d) for d in dropped_ids] != tokens.tolist():
            raise ValueError("rewind: an episode with repetition-penalty counts needs dropped_ids, tokens[n] ids "
                             "for row n")
        ids = np.zeros((len(tokens), max(tokens.max(initial=0), 1)), np.int32)
        mask = np.arange(ids.shape[1])[None] < tokens[:, None]
        for i, d in enumerate(dropped_ids):
            ids[i, :len(d)] = d
        counts = counts - _counts(jnp.asarray(ids), jnp.asarray(mask), counts.shape[1])
    return episode.replace(length=jnp.asarray(length - tokens, jnp.int32), counts=counts)


def append(config: ModelConfig, params, episode: Episode, observations: Sequence[Sequence[int]], *,
           pad_id: int = 0) -> Episode:
    """Prefills each row's observation ids (N lists; empty: nothing to add) into its cache after its tokens.
    The chunk is padded to a power of two from 8, so a run compiles a handful of shapes. The old
    `episode` is donated: use the returned one."""
    n = episode.length.shape[0]
    if len(observations) != n:
        raise ValueError(f"{len(observations)} observations for {n} episode rows")
    lens = np.asarray([len(o) for o in observations], np.int32)
    length = dist.fetch(episode.length)  # global: the same on every host
    room = episode.capacity - length
    if (lens > room).any():
        i = int(np.argmax(lens > room))
        raise ValueError(f"row {i}: an observation of {lens[i]} tokens does not fit the {room[i]} left in its cache")
    obs = np.full((n, bucket(lens.max(initial=1))), pad_id, np.int32)
    for i, ids in enumerate(observations):
        obs[i, :len(ids)] = ids
    window = _window_for(episode, (length + lens)[lens > 0].max(initial=1))
    return _append(config, params, episode, jnp.asarray(obs), jnp.asarray(lens), window=window)
