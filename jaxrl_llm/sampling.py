"""Jit-compiled group sampler: prefill each prompt once, decode G completions per prompt with a KV cache.

Shapes: B prompts, P prompt tokens (left-padded), G = num_samples, N = B*G rows (the G completions of
prompt b are rows b*G .. b*G+G-1), T = max_new_tokens, V vocabulary, L layers.

One XLA program per (B, P, T, G) and sampling mode:
  1. prefill: the B prompts run once; their per-layer keys/values (L,B,P,Hkv,hd) are the shared prefix
     that all G completions of a prompt attend to -- never copied G times;
  2. the first token of every row is drawn from its prompt's last logits;
  3. a `lax.while_loop` decodes one token per step for all N rows into per-layer caches (keys
     (N,Hkv,hd,T), values (N,Hkv,T,hd)) that the loop carries and XLA updates in place, and exits as
     soon as every row has emitted an EOS
     (`models.lm.decode_step`: layer weights fused and sliced once per call, not once per token).

Drawing: one uniform per row inverts the CDF of softmax(logits / temperature) (`categorical`), instead
of Gumbel-max's V random numbers per row; greedy is an argmax. Both are exact; on CPU they cut the
per-token cost of drawing from more than the whole decoder's to a few percent (docs/benchmarks.md).

Log-prob convention (the trainer's, docs/design.md "Conventions"): `logprobs[n, t]` is
log_softmax(logits / temperature) over the FULL vocabulary at the drawn token, in float32. `top_k` and
`top_p` only change which token is drawn (nucleus on the temperature-scaled distribution after top-k),
never this number, so the trainer recomputes exactly what the sampler reports; `behavior_logprobs` is
the log-prob of the truncated, renormalised distribution the token was really drawn from, which every
importance ratio against the sampler needs (docs/algorithms/off_policy.md). With temperature=0
(greedy) the reported log-prob is that of log_softmax(logits) (temperature 1).

Prompt lengths: callers pad each batch to a length bucket (see docs/data.md) so that variable prompt
lengths compile only a handful of shapes.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.lm import decode_prepare, decode_step, init_cache, logits_from_hidden, prefill


@flax.struct.dataclass
class Rollout:
    """Completions of a batch of prompts, N = B*G rows, completions of one prompt contiguous.

    tokens (N,T) int32 -- pad_id after EOS;  logprobs (N,T) float32 -- 0 where mask is 0 (the trainer's
    convention: full vocabulary);  behavior_logprobs (N,T) float32 -- of the distribution each token was
    drawn from (top-k/top-p truncated and renormalised; = logprobs without truncation), 0 where mask is 0;
    mask (N,T) int32 -- 1 on generated tokens including the EOS;  lengths (N,) int32 = mask.sum(1);
    truncated (N,) bool -- no EOS within T;  prompt_tokens / prompt_mask (N,P) -- each prompt repeated G times.
    """

    tokens: jax.Array
    logprobs: jax.Array
    behavior_logprobs: jax.Array
    mask: jax.Array
    lengths: jax.Array
    truncated: jax.Array
    prompt_tokens: jax.Array
    prompt_mask: jax.Array

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]


def _check(config, prompts, prompt_mask, max_new_tokens, num_samples, temperature, top_k, top_p, eos_ids,
           pad_id):
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
    total = prompts.shape[1] + max_new_tokens
    if total > config.max_position_embeddings:
        raise ValueError(f"prompt length {prompts.shape[1]} + max_new_tokens {max_new_tokens} = {total} exceeds "
                         f"the model's max_position_embeddings {config.max_position_embeddings}")


def generate(config: ModelConfig, params, prompts, prompt_mask, rng, *, max_new_tokens: int, num_samples: int = 1,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, eos_ids: Sequence[int],
             pad_id: int) -> Rollout:
    """Samples `num_samples` completions for each left-padded prompt (see the module docstring).

    prompts, prompt_mask (B,P) int; rng a PRNG key. Same key -> same rollout; rows of a group differ.
    `temperature` and `top_p` are traced (changing them does not recompile); `top_k`, the shapes and the
    greedy / nucleus switches are static.
    """
    prompts, prompt_mask = jnp.asarray(prompts), jnp.asarray(prompt_mask)
    eos_ids = tuple(int(e) for e in (eos_ids if isinstance(eos_ids, (list, tuple)) else [eos_ids]))
    _check(config, prompts, prompt_mask, max_new_tokens, num_samples, temperature, top_k, top_p, eos_ids, pad_id)
    return generate_program(config, params, prompts.astype(jnp.int32), prompt_mask.astype(jnp.int32), rng,
                     jnp.float32(max(temperature, 1e-6)), jnp.float32(top_p), max_new_tokens=int(max_new_tokens),
                     num_samples=int(num_samples), top_k=int(top_k), greedy=temperature == 0,
                     nucleus=top_p < 1.0, eos_ids=eos_ids, pad_id=int(pad_id))


def argmax(x):
    """First index of the maximum over the last axis, as `jnp.argmax`. (..., V) -> (...) int32.

    Written as two single-operand reductions (max, then min of the matching indices) because XLA:CPU
    runs argmax's (value, index) pair reduction unvectorized: ~20x slower over a vocabulary.
    """
    v = x.shape[-1]
    top = jnp.max(x, axis=-1, keepdims=True)
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.minimum(jnp.min(jnp.where(x == top, iota, v), axis=-1), v - 1)  # NaN row: v - 1


def _logp_at(logits, token):
    """log_softmax(logits) at `token`, float32: logits (N,V), token (N,) -> (N,)."""
    picked = jnp.take_along_axis(logits, token[:, None], -1)[:, 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def categorical(key, logits):
    """One draw per row from softmax(logits), logits (N,K) float32 (-inf allowed, >= 1 finite per row).

    Inverts the CDF with ONE uniform per row, in two levels: pick a block of c ~ sqrt(K) entries from the
    block masses, then the entry inside it. Gumbel-max would need N*K random numbers per step, and
    threefry on CPU costs more than the whole decoder layer stack of a small model. The law is exactly
    softmax(logits) up to float32 rounding of the partial sums (~1e-7 relative); an entry of zero
    probability is never drawn. Returns (token (N,) int32, log of the normalizer: logsumexp (N,)).
    """
    n, k = logits.shape
    c = 1 << max(math.ceil(math.log2(math.sqrt(k))), 0)
    nb = -(-k // c)
    top = jnp.max(logits, axis=-1, keepdims=True)
    p = jnp.pad(jnp.exp(logits - top), ((0, 0), (0, nb * c - k)))  # (N, nb*c), 0 on -inf and padding
    blocks = p.reshape(n, nb, c)
    mass = jnp.sum(blocks, axis=-1)  # (N, nb)
    cum = jnp.cumsum(mass, axis=-1)
    target = jax.random.uniform(key, (n,), jnp.float32) * cum[:, -1]  # uniform in [0, total mass)

    def first_above(cum_row, x, weights):
        """Index of the first cum > x (zero-weight entries have cum equal to their predecessor's, so they
        are never chosen), clipped to the last positive entry against rounding at the top end."""
        iota = jax.lax.broadcasted_iota(jnp.int32, weights.shape, 1)
        last = jnp.max(jnp.where(weights > 0, iota, 0), axis=-1)
        return jnp.minimum(jnp.sum((cum_row <= x[:, None]).astype(jnp.int32), axis=-1), last)

    b = first_above(cum, target, mass)  # (N,) block
    before = jnp.where(b > 0, jnp.take_along_axis(cum, jnp.maximum(b - 1, 0)[:, None], -1)[:, 0], 0.0)
    row = jnp.take_along_axis(blocks, b[:, None, None], 1)[:, 0]  # (N, c)
    w = first_above(jnp.cumsum(row, axis=-1), target - before, row)
    return (b * c + w).astype(jnp.int32), top[:, 0] + jnp.log(cum[:, -1])


def draw_tokens(key, logits, temperature, top_p, *, top_k, greedy, nucleus):
    """Draws one token per row. logits (N,V) float32 -> (token (N,) int32, logprob (N,), behaviour
    logprob (N,)): the log-prob of the module's convention (full vocabulary at the temperature), and the
    log-prob of the distribution the token was really drawn from (top-k / top-p truncated and
    renormalised; equal to the first without truncation; 0 for greedy, a point mass)."""
    if greedy:
        token = argmax(logits)
        return token, _logp_at(logits, token), jnp.zeros(token.shape, jnp.float32)
    scaled = logits / temperature
    if top_k == 0 and not nucleus:
        token, log_z = categorical(key, scaled)  # the normalizer of the draw is that of the log-prob
        logp = jnp.take_along_axis(scaled, token[:, None], -1)[:, 0] - log_z
        return token, logp, logp
    # Candidates sorted by descending probability: the top-k, or the whole vocabulary for nucleus.
    k = top_k if top_k > 0 else scaled.shape[-1]
    cand, idx = jax.lax.top_k(scaled, k)
    if nucleus:
        probs = jax.nn.softmax(cand, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs  # keep the smallest prefix with mass >= top_p
        cand = jnp.where(mass_before < top_p, cand, -jnp.inf)
    choice, log_z = categorical(key, cand)
    token = jnp.take_along_axis(idx, choice[:, None], -1)[:, 0].astype(jnp.int32)
    behavior = jnp.take_along_axis(cand, choice[:, None], -1)[:, 0] - log_z
    return token, _logp_at(scaled, token), behavior


@functools.partial(jax.jit, static_argnames=("config", "max_new_tokens", "num_samples", "top_k", "greedy",
                                             "nucleus", "eos_ids", "pad_id"))
def generate_program(config, params, prompts, prompt_mask, rng, temperature, top_p, *, max_new_tokens, num_samples,
              top_k, greedy, nucleus, eos_ids, pad_id):
    b, _ = prompts.shape
    g, t_max = num_samples, max_new_tokens
    n = b * g
    draw = functools.partial(draw_tokens, temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy,
                             nucleus=nucleus)
    eos = jnp.asarray(eos_ids, jnp.int32)

    # 1. prefill once per prompt.
    hidden, prefix_kv = prefill(config, params, prompts, prompt_mask, with_lm_head=False)
    prefix_mask = prompt_mask.astype(bool)
    last_logits = logits_from_hidden(config, params, hidden[:, -1])  # (B,V)
    start = jnp.repeat(jnp.sum(prompt_mask, axis=-1), g)  # (N,) position of the first new token

    # 2. first token of every row from its prompt's logits (independent draws per row).
    token, logp, blogp = draw(jax.random.fold_in(rng, 0), jnp.repeat(last_logits, g, axis=0))
    tokens = jnp.full((n, t_max), pad_id, jnp.int32).at[:, 0].set(token)
    logprobs = jnp.zeros((n, 2, t_max), jnp.float32).at[:, :, 0].set(jnp.stack([logp, blogp], 1))
    mask = jnp.zeros((n, t_max), jnp.int32).at[:, 0].set(1)
    done = jnp.isin(token, eos)

    # 3. decode: step t feeds token t (cache slot t) and draws token t+1. Weights are fused and the prompt
    # prefix re-laid out once here, outside the loop.
    weights, prefix = decode_prepare(config, params, prefix_kv)
    cache = init_cache(config, n, t_max)

    def cond(state):
        t, _, _, _, done, _, _ = state
        return (t < t_max - 1) & ~jnp.all(done)

    def body(state):
        t, tokens, logprobs, mask, done, cache, token = state
        with jax.named_scope("layers"):  # the scopes name the stages in profiles (docs/benchmarks.md)
            hidden, cache = decode_step(config, params, weights, token, start + t, cache, t, prefix, prefix_mask)
        with jax.named_scope("lm_head"):
            logits = logits_from_hidden(config, params, hidden)
        with jax.named_scope("draw"):
            new, logp, blogp = draw(jax.random.fold_in(rng, t + 1), logits)
        alive = ~done
        new = jnp.where(alive, new, pad_id)
        tokens = jax.lax.dynamic_update_slice(tokens, new[:, None], (0, t + 1))
        both = jnp.where(alive[:, None], jnp.stack([logp, blogp], 1), 0.0)  # (N,2): one update for the pair
        logprobs = jax.lax.dynamic_update_slice(logprobs, both[:, :, None], (0, 0, t + 1))
        mask = jax.lax.dynamic_update_slice(mask, alive.astype(jnp.int32)[:, None], (0, t + 1))
        done = done | jnp.isin(new, eos)
        return t + 1, tokens, logprobs, mask, done, cache, new

    state = (jnp.int32(0), tokens, logprobs, mask, done, cache, token)
    _, tokens, logprobs, mask, done, _, _ = jax.lax.while_loop(cond, body, state)
    return Rollout(tokens=tokens, logprobs=logprobs[:, 0], behavior_logprobs=logprobs[:, 1], mask=mask,
                   lengths=jnp.sum(mask, axis=-1),
                   truncated=~done, prompt_tokens=jnp.repeat(prompts, g, axis=0),
                   prompt_mask=jnp.repeat(prompt_mask, g, axis=0))
