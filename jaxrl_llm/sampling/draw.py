"""Drawing one token per row from float32 logits: the sampler's inner step (see `jaxrl_llm.sampling`).

One uniform per row inverts the CDF of softmax(logits / temperature) (`categorical`), instead of
Gumbel-max's V random numbers per row; greedy is an argmax. Both are exact; on CPU they cut the per-token
cost of drawing from more than the whole decoder's to a few percent (docs/benchmarks.md).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def row_uniforms(rng, rows, steps):
    """(S,) float32 uniforms in [0, 1): the draw of token `steps[i]` of row `rows[i]`, from
    fold_in(fold_in(rng, row), step). A function of (rng, row, step) only, so a row's tokens do not depend
    on which decode slot or at which loop iteration they are drawn (the continuous-batching sampler)."""
    one = lambda r, t: jax.random.uniform(jax.random.fold_in(jax.random.fold_in(rng, r), t), (), jnp.float32)
    return jax.vmap(one)(rows, steps)


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


def categorical(key, logits, uniform=None):
    """One draw per row from softmax(logits), logits (N,K) float32 (-inf allowed, >= 1 finite per row).

    Inverts the CDF with ONE uniform per row, in two levels: pick a block of c ~ sqrt(K) entries from the
    block masses, then the entry inside it. Gumbel-max would need N*K random numbers per step, and
    threefry on CPU costs more than the whole decoder layer stack of a small model. The law is exactly
    softmax(logits) up to float32 rounding of the partial sums (~1e-7 relative); an entry of zero
    probability is never drawn. `uniform` (N,) in [0, 1), if given, replaces the draw from `key` (per-row
    streams, `row_uniforms`). Returns (token (N,) int32, log of the normalizer: logsumexp (N,)).
    """
    n, k = logits.shape
    c = 1 << max(math.ceil(math.log2(math.sqrt(k))), 0)
    nb = -(-k // c)
    top = jnp.max(logits, axis=-1, keepdims=True)
    p = jnp.pad(jnp.exp(logits - top), ((0, 0), (0, nb * c - k)))  # (N, nb*c), 0 on -inf and padding
    blocks = p.reshape(n, nb, c)
    mass = jnp.sum(blocks, axis=-1)  # (N, nb)
    cum = jnp.cumsum(mass, axis=-1)
    if uniform is None:
        uniform = jax.random.uniform(key, (n,), jnp.float32)
    target = uniform * cum[:, -1]  # uniform in [0, total mass)

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


def draw_tokens(key, logits, temperature, top_p, *, top_k, greedy, nucleus, uniform=None):
    """Draws one token per row (from `key`, or from the given per-row `uniform` (N,), see `categorical`). logits (N,V) float32 -> (token (N,) int32, logprob (N,), behaviour
    logprob (N,)): the log-prob of the module's convention (full vocabulary at the temperature), and the
    log-prob of the distribution the token was really drawn from (top-k / top-p truncated and
    renormalised; equal to the first without truncation; 0 for greedy, a point mass)."""
    if greedy:
        token = argmax(logits)
        return token, _logp_at(logits, token), jnp.zeros(token.shape, jnp.float32)
    scaled = logits / temperature
    if top_k == 0 and not nucleus:
        token, log_z = categorical(key, scaled, uniform)  # the normalizer of the draw is that of the log-prob
        logp = jnp.take_along_axis(scaled, token[:, None], -1)[:, 0] - log_z
        return token, logp, logp
    # Candidates sorted by descending probability: the top-k, or the whole vocabulary for nucleus.
    k = top_k if top_k > 0 else scaled.shape[-1]
    cand, idx = jax.lax.top_k(scaled, k)
    if nucleus:
        probs = jax.nn.softmax(cand, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs  # keep the smallest prefix with mass >= top_p
        cand = jnp.where(mass_before < top_p, cand, -jnp.inf)
    choice, log_z = categorical(key, cand, uniform)
    token = jnp.take_along_axis(idx, choice[:, None], -1)[:, 0].astype(jnp.int32)
    behavior = jnp.take_along_axis(cand, choice[:, None], -1)[:, 0] - log_z
    return token, _logp_at(scaled, token), behavior
