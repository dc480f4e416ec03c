"""Drawing one token per row from float32 logits: the sampler's inner step (see `jaxrl_llm.sampling`).

One uniform per row inverts the CDF of softmax(logits / temperature) (`categorical`), instead of
Gumbel-max's V random numbers per row; greedy is an argmax. Both are exact; on CPU they cut the per-token
cost of drawing from more than the whole decoder's to a few percent (docs/benchmarks_history.md, "Profile of the
slowest stage").
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


def check_penalties(repetition_penalty, min_p):
    """One-line ValueErrors for the repetition penalty (> 0) and min-p (in [0, 1))."""
    if not repetition_penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {repetition_penalty}")
    if not 0 <= min_p < 1:
        raise ValueError(f"min_p must be in [0, 1) (0 = off), got {min_p}")


def seen_tokens(ids, mask, vocab: int):
    """(N,V) bool: which tokens occur among the real entries of each row. ids, mask (N,L) int (mask 0: padding,
    not counted). The repetition penalty's set; `mark` adds the tokens drawn since."""
    n = ids.shape[0]
    where = jnp.where(mask.astype(bool), ids, vocab)  # padding goes out of range: dropped
    return jnp.zeros((n, vocab), bool).at[jnp.arange(n)[:, None], where].set(True, mode="drop")


def mark(seen, rows, token):
    """`seen` with seen[rows[i], token[i]] set; rows out of range (idle slots) are dropped."""
    return seen.at[rows, token].set(True, mode="drop")


def penalize(logits, seen, penalty):
    """The repetition penalty on raw logits (N,V): a seen token's logit is divided by `penalty` where
    positive and multiplied by it where negative, so penalty > 1 makes it less likely either way."""
    return jnp.where(seen, jnp.where(logits > 0, logits / penalty, logits * penalty), logits)


def draw_tokens(key, logits, temperature, top_p, *, top_k, greedy, nucleus, uniform=None, seen=None, penalty=1.0,
                min_p=None):
    """Draws one token per row (from `key`, or from the given per-row `uniform` (N,), see `categorical`).
    logits (N,V) float32 -> (token (N,) int32, logprob (N,), behaviour logprob (N,)): the log-prob of the
    module's convention (full vocabulary at the temperature, of the model's logits), and the log-prob of
    the distribution the token was really drawn from (equal to the first when nothing below applies; 0
    for greedy, a point mass).

    The distribution drawn from, in this order: the repetition penalty (`seen` (N,V) bool given: the
    tokens already in the row's prompt and completion, see `penalize`), the temperature, top-k, top-p
    (nucleus, renormalised after top-k), then min-p (`min_p` given, traced: keep the tokens whose
    probability is at least min_p times the most likely one's). `seen` and `min_p` being None or not is
    static; `penalty` is traced."""
    model = logits
    if seen is not None:
        logits = penalize(logits, seen, penalty)
    if greedy:
        token = argmax(logits)
        return token, _logp_at(model, token), jnp.zeros(token.shape, jnp.float32)
    scaled = logits / temperature
    if top_k == 0 and not nucleus:
        warped = scaled if min_p is None else _min_p(scaled, jnp.max(scaled, axis=-1, keepdims=True), min_p)
        token, log_z = categorical(key, warped, uniform)
        behaviour = jnp.take_along_axis(warped, token[:, None], -1)[:, 0] - log_z
        if seen is None and min_p is None:  # the normalizer of the draw is that of the log-prob
            return token, behaviour, behaviour
        return token, _logp_at(model / temperature, token), behaviour
    # Candidates sorted by descending probability: the top-k, or the whole vocabulary for nucleus.
    k = top_k if top_k > 0 else scaled.shape[-1]
    cand, idx = jax.lax.top_k(scaled, k)
    if nucleus:
        probs = jax.nn.softmax(cand, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs  # keep the smallest prefix with mass >= top_p
        cand = jnp.where(mass_before < top_p, cand, -jnp.inf)
    if min_p is not None:
        cand = _min_p(cand, cand[:, :1], min_p)
    choice, log_z = categorical(key, cand, uniform)
    token = jnp.take_along_axis(idx, choice[:, None], -1)[:, 0].astype(jnp.int32)
    behavior = jnp.take_along_axis(cand, choice[:, None], -1)[:, 0] - log_z
    return token, _logp_at(model / temperature, token), behavior


def _min_p(scaled, top, min_p):
    """-inf where p < min_p * p_max, i.e. scaled < top + log(min_p); the most likely token always stays."""
    return jnp.where(scaled >= top + jnp.log(min_p), scaled, -jnp.inf)
