"""Loss aggregation: reduce a per-token quantity over a (N,T) mask to a scalar, in the four modes of
docs/design.md ("Aggregation"), and the masked token statistics the losses report.

Global normalization. Every aggregation is `aggregate_sum / aggregate_denominator`, and both parts
are additive over rows. With minibatches or gradient accumulation, the trainer computes the
denominator once over the whole optimizer batch and passes it as `denominator=`; the minibatch
losses (and gradients) then sum exactly to those of the full batch.

Masked positions may hold anything: they are selected away with `where` before any arithmetic, and a
row with zero valid tokens never divides by zero. Argument errors raise `ValueError` at trace time,
naming the argument.
"""
from __future__ import annotations

import jax.numpy as jnp

from jaxrl_llm.rl.checks import check_2d, check_choice, check_positive, check_shape

AGGREGATE_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                   "seq-mean-token-sum-norm")
TINY = float(jnp.finfo(jnp.float32).tiny)


# --------------------------------------------------------------------------------------------------
# Argument checks of the aggregation (jaxrl_llm.rl.checks has the shared ones)
# --------------------------------------------------------------------------------------------------


def check_denominator(fn, denominator):
    if denominator is not None and jnp.ndim(denominator) != 0:
        raise ValueError(f"{fn}: denominator must be a scalar, got shape {jnp.shape(denominator)}")


# --------------------------------------------------------------------------------------------------
# Small masked statistics (over valid tokens)
# --------------------------------------------------------------------------------------------------

def token_mean(x, m):
    return jnp.sum(jnp.where(m, x, 0.0)) / jnp.maximum(jnp.sum(m), 1).astype(jnp.float32)


def token_var(x, m):
    """Population variance over valid tokens (0 when nothing is valid)."""
    mean = token_mean(x, m)
    return token_mean(jnp.square(x - mean), m)


# --------------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------------

def _agg_args(fn, x, mask, mode):
    check_choice(fn, "mode", mode, AGGREGATE_MODES)
    check_2d(fn, "mask", mask)
    if x is not None:
        check_shape(fn, "x", x, jnp.shape(mask))
    return jnp.asarray(mask) != 0


def _sum(x, m, mode):
    xm = jnp.where(m, jnp.asarray(x, jnp.float32), 0.0)
    if mode == "seq-mean-token-mean":
        lengths = jnp.sum(m, axis=1).astype(jnp.float32)
        # Empty rows have row sum 0, so dividing them by 1 adds nothing.
        return jnp.sum(jnp.sum(xm, axis=1) / jnp.maximum(lengths, 1.0))
    # token-mean, seq-mean-token-sum and seq-mean-token-sum-norm share the plain masked sum.
    return jnp.sum(xm)


def _denominator(m, mode, norm_length):
    if mode == "token-mean":
        return jnp.sum(m).astype(jnp.float32)
    if mode == "seq-mean-token-sum-norm":
        length = m.shape[1] if norm_length is None else norm_length
        return jnp.asarray(m.shape[0] * length, jnp.float32)
    return jnp.sum(jnp.any(m, axis=1)).astype(jnp.float32)  # non-empty rows


def check_norm_length(fn, norm_length):
    if norm_length is not None:
        check_positive(fn, "norm_length", norm_length)


def aggregate_sum(x, mask, mode):
    """Numerator of `aggregate`: additive over rows, so minibatch sums add up to the batch sum.

    token-mean, seq-mean-token-sum, seq-mean-token-sum-norm: Σ_it x·m;
    seq-mean-token-mean: Σ_i (Σ_t x·m)/|o_i| over non-empty rows.

    Args:
      x: (N,T) per-token quantity.
      mask: (N,T) valid-token mask.
      mode: one of AGGREGATE_MODES.

    Returns:
      float32 scalar.
    """
    m = _agg_args("aggregate_sum", x, mask, mode)
    return _sum(x, m, mode)


def aggregate_denominator(mask, mode, *, norm_length=None):
    """Denominator of `aggregate` for this mask: additive over rows.

    token-mean: Σ m; seq-mean-*: number of rows with at least one valid token;
    seq-mean-token-sum-norm: N·L with L = norm_length (default T).

    Args:
      mask: (N,T) valid-token mask.
      mode: one of AGGREGATE_MODES.
      norm_length: L > 0 for seq-mean-token-sum-norm (ignored by the other modes).

    Returns:
      float32 scalar.
    """
    fn = "aggregate_denominator"
    m = _agg_args(fn, None, mask, mode)
    check_norm_length(fn, norm_length)
    return _denominator(m, mode, norm_length)


def aggregate_parts(x, mask, mode, *, norm_length=None):
    """The (sum, denominator) form of `aggregate`: both float32 scalars."""
    fn = "aggregate_parts"
    m = _agg_args(fn, x, mask, mode)
    check_norm_length(fn, norm_length)
    return _sum(x, m, mode), _denominator(m, mode, norm_length)


def aggregate(x, mask, mode, *, norm_length=None):
    """Reduce a per-token quantity to a scalar (docs/design.md, "Aggregation").

    token-mean: Σ x·m / Σ m (DAPO); seq-mean-token-mean: mean over non-empty rows of the row's
    token mean (GRPO, GSPO); seq-mean-token-sum: mean over non-empty rows of the row's token sum;
    seq-mean-token-sum-norm: Σ x·m / (N·L) (Dr. GRPO).

    Args:
      x: (N,T) per-token quantity.
      mask: (N,T) valid-token mask.
      mode: one of AGGREGATE_MODES.
      norm_length: L for seq-mean-token-sum-norm, default T.

    Returns:
      float32 scalar, aggregate_sum / max(aggregate_denominator, tiny): 0 for an empty batch.
    """
    s, d = aggregate_parts(x, mask, mode, norm_length=norm_length)
    return s / jnp.maximum(d, TINY)


def reduce_tokens(per_token, m, mode, norm_length, denominator):
    """Aggregate `per_token`, dividing by the trainer's global `denominator` when given."""
    s = _sum(per_token, m, mode)
    d = _denominator(m, mode, norm_length) if denominator is None else jnp.asarray(
        denominator, jnp.float32)
    return s / jnp.maximum(d, TINY)
