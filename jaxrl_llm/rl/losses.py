"""Losses: KL estimators, the policy loss (PPO-clip, GSPO, SAPO, CISPO surrogates) and the value loss.

Pure, jit-able functions of float32 arrays; the formulas are those of docs/design.md ("The math"). Shapes:
N rows, T tokens, V vocabulary; `mask` (N,T) is 1 on valid tokens. Masked positions may hold
anything: they are selected away with `where` before any arithmetic, so they contribute neither to
values nor to gradients, and a row with zero valid tokens never divides by zero.

Each loss is reduced to a scalar by jaxrl_llm.rl.aggregation, over the mask alone or over the trainer's
global `denominator=` of the whole optimizer batch (so minibatch losses add up to the batch loss).

Argument errors (shapes, unknown mode strings, out-of-range constants) raise `ValueError` at trace
time, naming the argument.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxrl_llm.rl.aggregation import (AGGREGATE_MODES, check_denominator, check_norm_length, reduce_tokens,
                                     token_mean, token_var)
from jaxrl_llm.rl.checks import check_2d, check_choice, check_positive, check_shape, static_float
from jaxrl_llm.rl.surrogates import SURROGATES

KL_KINDS = ("k1", "k2", "k3", "k3+")
RATIOS = ("token", "sequence", "sequence_token")

LOG_RATIO_CLAMP = 20.0  # per-token |log ρ| bound: exp(20) ≈ 5e8 is finite in float32
SEQ_LOG_RATIO_MAX = 10.0  # upper bound of GSPO's log s_i


# --------------------------------------------------------------------------------------------------
# KL estimators
# --------------------------------------------------------------------------------------------------

def kl_penalty(logp, ref_logp, kind="k3"):
    """Per-token estimator of KL(π_θ ‖ π_ref) from tokens sampled from π_θ (Schulman, 2020).

    With d = ref_logp − logp: k1 = −d (unbiased, can be negative), k2 = d²/2 (biased, low
    variance), k3 = e^d − d − 1 (unbiased, ≥ 0). For k3, d is clamped to ±20 so e^d stays finite.
    k3+ has k3's value and k2's gradient: as a loss term its expected gradient is that of the reverse
    KL(π_θ ‖ π_ref) it reports (k3's own is the forward KL's; k1's is zero in expectation).

    Args:
      logp: (...) log π_θ of the sampled tokens.
      ref_logp: same shape, log π_ref of the same tokens.
      kind: 'k1' | 'k2' | 'k3' | 'k3+'.

    Returns:
      float32 array of logp's shape (not masked: aggregate it with `aggregate`).
    """
    fn = "kl_penalty"
    check_choice(fn, "kind", kind, KL_KINDS)
    check_shape(fn, "ref_logp", ref_logp, jnp.shape(logp))
    d = jnp.asarray(ref_logp, jnp.float32) - jnp.asarray(logp, jnp.float32)
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * jnp.square(d)
    k2 = 0.5 * jnp.square(d)
    d = jnp.clip(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # expm1 keeps k3 accurate (and ≥ 0) when d is tiny, where e^d − 1 would cancel.
    k3 = jnp.expm1(d) - d
    if kind == "k3":
        return k3
    # k3+: k3's value with k2's gradient (straight-through). Differentiated in the loss, k3's gradient
    # E_π[(1 − π_ref/π)∇log π] is that of the forward KL(π_ref ‖ π); k2's, E_π[(log π − log π_ref)∇log π],
    # is the reverse KL(π ‖ π_ref) that k3 reports.
    return k2 - lax.stop_gradient(k2) + lax.stop_gradient(k3)


# --------------------------------------------------------------------------------------------------
# Policy loss
# --------------------------------------------------------------------------------------------------

def _check_policy_args(logp, old_logp, advantages, mask, *, ratio, surrogate, clip_low, clip_high, dual_clip,
                       sapo_tau_pos, sapo_tau_neg, cispo_max, aggregate, norm_length, denominator):
    """policy_loss's trace-time checks: shapes, mode names, and the constants known at trace time."""
    fn = "policy_loss"
    check_choice(fn, "ratio", ratio, RATIOS)
    check_choice(fn, "surrogate", surrogate, SURROGATES)
    check_choice(fn, "aggregate", aggregate, AGGREGATE_MODES)
    check_2d(fn, "logp", logp)
    shape = jnp.shape(logp)
    check_shape(fn, "old_logp", old_logp, shape)
    check_shape(fn, "mask", mask, shape)
    if jnp.shape(advantages) not in (shape, shape[:1]):
        raise ValueError(f"{fn}: advantages must have shape {shape[:1]} or {shape}, "
                         f"got {jnp.shape(advantages)}")
    for name, value in (("clip_low", clip_low), ("clip_high", clip_high)):
        if jnp.ndim(value) != 0:
            raise ValueError(f"{fn}: {name} must be a scalar, got shape {jnp.shape(value)}")
    lo_v, hi_v = static_float(clip_low), static_float(clip_high)
    if lo_v is not None and not 0.0 <= lo_v < 1.0:
        raise ValueError(f"{fn}: clip_low must be in [0, 1), got {lo_v}")
    if hi_v is not None and not hi_v >= 0.0:
        raise ValueError(f"{fn}: clip_high must be >= 0, got {hi_v}")
    if dual_clip is not None:
        if surrogate != "clip":
            raise ValueError(f"{fn}: dual_clip applies only to surrogate='clip', "
                             f"got surrogate={surrogate!r}")
        if jnp.ndim(dual_clip) != 0:
            raise ValueError(f"{fn}: dual_clip must be a scalar, got shape {jnp.shape(dual_clip)}")
        c = static_float(dual_clip)
        if c is not None and not c > 1.0:
            raise ValueError(f"{fn}: dual_clip must be > 1, got {c}")
    check_positive(fn, "sapo_tau_pos", sapo_tau_pos)
    check_positive(fn, "sapo_tau_neg", sapo_tau_neg)
    check_positive(fn, "cispo_max", cispo_max)
    check_norm_length(fn, norm_length)
    check_denominator(fn, denominator)


def policy_loss(logp, old_logp, advantages, mask, *, ratio="token", surrogate="clip",
                clip_low=0.2, clip_high=0.2, dual_clip=None, sapo_tau_pos=1.0, sapo_tau_neg=1.05,
                cispo_max=5.0, aggregate="token-mean", norm_length=None, denominator=None, weights=None):
    """Policy-gradient surrogate loss (to minimize) and its diagnostics.

    Importance ratio (ℓ_t = logp_t − old_logp_t clamped to ±20, |o_i| = Σ_t m_it):
      'token'          ρ_it = exp(ℓ_it)                                 PPO, GRPO, DAPO, Dr. GRPO
      'sequence'       ρ_it = s_i, log s_i = min(Σ_t m·ℓ / |o_i|, 10)   GSPO (gradient through
                                                                        the mean)
      'sequence_token' log ρ_it = logp_t − sg(logp_t) + sg(log s_i)     GSPO-token
    Surrogate per token (A the advantage):
      'clip'   −min(ρA, clip(ρ, 1−clip_low, 1+clip_high)·A); with dual_clip c > 1 and A < 0,
               min(that, −c·A)
      'sapo'   −σ(τ(ρ−1))·(4/τ)·A, τ = sapo_tau_pos if A > 0 else sapo_tau_neg
      'cispo'  −sg(min(ρ, cispo_max))·A·logp
    then reduced with `aggregate` (or divided by the global `denominator`).

    Args:
      logp: (N,T) log π_θ of the sampled tokens (differentiated).
      old_logp: (N,T) log π_old of the same tokens (the rollout's; not differentiated).
      advantages: (N,) per sequence (broadcast over tokens) or (N,T) per token.
      mask: (N,T) valid-token mask.
      ratio, surrogate, aggregate: mode strings above / AGGREGATE_MODES.
      clip_low: in [0, 1). clip_high: >= 0 (clip-higher when > clip_low). dual_clip: None or > 1
        ('clip' only). sapo_tau_pos, sapo_tau_neg, cispo_max: > 0.
      norm_length: L of 'seq-mean-token-sum-norm'.
      denominator: None, or a scalar aggregate_denominator(...) over the whole optimizer batch: the
        loss is then aggregate_sum(...) / denominator, so minibatch losses add up to the batch loss.
      weights: None, or (N,T) per-token weights of the surrogate, not differentiated (rollout
        correction's importance weights, see `rollout_correction`).

    Returns:
      (loss, metrics): loss a float32 scalar; metrics a dict of float32 scalars (no gradient), all
      over valid tokens of this call: 'clipfrac' (tokens where any clip is active, dual clip
      included), 'clipfrac_low' (A < 0 and ρ < 1−clip_low), 'clipfrac_high' (A > 0 and ρ >
      1+clip_high); for 'sapo' these count the tokens the hard clip would clip, for 'cispo'
      'clipfrac' = 'clipfrac_high' is the fraction with ρ > cispo_max and 'clipfrac_low' is 0;
      'approx_kl' (token-mean k3 estimate of KL(π_old ‖ π_θ) from per-token ratios), 'ratio_mean',
      'ratio_min', 'ratio_max' (of the ρ used; 1 for an empty batch). They ignore `denominator`:
      to combine micro-batches, weight each by its number of valid tokens.
    """
    _check_policy_args(logp, old_logp, advantages, mask, ratio=ratio, surrogate=surrogate, clip_low=clip_low,
                       clip_high=clip_high, dual_clip=dual_clip, sapo_tau_pos=sapo_tau_pos,
                       sapo_tau_neg=sapo_tau_neg, cispo_max=cispo_max, aggregate=aggregate,
                       norm_length=norm_length, denominator=denominator)
    shape = jnp.shape(logp)
    m = jnp.asarray(mask) != 0
    logp, old_logp, adv = _masked_inputs(logp, old_logp, advantages, m)
    log_ratio, rho = _importance_ratio(logp, old_logp, m, ratio)

    lo = 1.0 - jnp.asarray(clip_low, jnp.float32)
    hi = 1.0 + jnp.asarray(clip_high, jnp.float32)
    per_token, clipped, clipped_low, clipped_high = SURROGATES[surrogate](
        rho, logp, adv, lo=lo, hi=hi, dual_clip=dual_clip, sapo_tau_pos=sapo_tau_pos,
        sapo_tau_neg=sapo_tau_neg, cispo_max=cispo_max)
    if weights is not None:
        check_shape("policy_loss", "weights", weights, shape)
        per_token = per_token * lax.stop_gradient(jnp.where(m, jnp.asarray(weights, jnp.float32), 0.0))

    loss = reduce_tokens(per_token, m, aggregate, norm_length, denominator)
    return loss, _policy_metrics(clipped, clipped_low, clipped_high, log_ratio, rho, m)


def _masked_inputs(logp, old_logp, advantages, m):
    """(logp, old_logp, adv): float32 (N,T) each, the (N,) advantages broadcast over tokens, all 0
    where `m` (N,T) is False."""
    # Sanitize first: masked positions become 0 and cannot put NaN/inf into values or gradients.
    logp = jnp.where(m, jnp.asarray(logp, jnp.float32), 0.0)
    old_logp = jnp.where(m, jnp.asarray(old_logp, jnp.float32), 0.0)
    adv = jnp.asarray(advantages, jnp.float32)
    adv = jnp.where(m, adv[:, None] if adv.ndim == 1 else adv, 0.0)
    return logp, old_logp, adv


def _importance_ratio(logp, old_logp, m, ratio):
    """(log_ratio, rho), both (N,T): the per-token log ratio ℓ clamped to ±20, and the ρ of the `ratio`
    mode (see `policy_loss`), 1 on masked positions. `logp`, `old_logp` already masked to 0."""
    log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (N,T)
    if ratio == "token":
        log_rho = log_ratio
    else:
        lengths = jnp.sum(m, axis=1).astype(jnp.float32)
        # The mean of per-token values in [−20, 20] is itself ≥ −20, where exp underflows
        # harmlessly to ~2e-9; only the upper side can overflow and needs the tighter clamp.
        log_s = jnp.minimum(jnp.sum(log_ratio, axis=1) / jnp.maximum(lengths, 1.0),
                            SEQ_LOG_RATIO_MAX)[:, None]  # (N,1)
        if ratio == "sequence":
            log_rho = jnp.broadcast_to(log_s, jnp.shape(logp))
        else:
            log_rho = logp - lax.stop_gradient(logp) + lax.stop_gradient(log_s)
    rho = jnp.exp(jnp.where(m, log_rho, 0.0))  # (N,T), 1 on masked positions
    return log_ratio, rho


def _policy_metrics(clipped, clipped_low, clipped_high, log_ratio, rho, m):
    """policy_loss's diagnostics over the valid tokens of `m` (N,T), from the surrogate's (N,T) clip
    flags, ℓ and ρ (N,T): a dict of float32 scalars, gradient stopped (see `policy_loss`)."""
    any_valid = jnp.any(m)
    one = jnp.float32(1.0)
    metrics = {
        "clipfrac": token_mean(clipped.astype(jnp.float32), m),
        "clipfrac_low": token_mean(clipped_low.astype(jnp.float32), m),
        "clipfrac_high": token_mean(clipped_high.astype(jnp.float32), m),
        "approx_kl": token_mean(jnp.expm1(log_ratio) - log_ratio, m),
        "ratio_mean": jnp.where(any_valid, token_mean(rho, m), one),
        "ratio_min": jnp.where(any_valid, jnp.min(jnp.where(m, rho, jnp.inf)), one),
        "ratio_max": jnp.where(any_valid, jnp.max(jnp.where(m, rho, -jnp.inf)), one),
    }
    return jax.tree_util.tree_map(lax.stop_gradient, metrics)


# --------------------------------------------------------------------------------------------------
# Value loss
# --------------------------------------------------------------------------------------------------

def value_loss(values, old_values, returns, mask, *, clip=None, aggregate="token-mean",
               norm_length=None, denominator=None):
    """Clipped value loss ½·aggregate(max((V−R)², (clip(V, V_old ± c) − R)²)) and diagnostics.

    Args:
      values: (N,T) V_φ(s_t) being trained (differentiated).
      old_values: (N,T) values at the rollout.
      returns: (N,T) value targets (GAE returns).
      mask: (N,T) valid-token mask.
      clip: None (plain squared error) or c > 0.
      aggregate: one of AGGREGATE_MODES; norm_length: L of 'seq-mean-token-sum-norm'.
      denominator: None, or the global aggregate_denominator of the optimizer batch (see
        `policy_loss`).

    Returns:
      (loss, metrics): metrics over valid tokens: 'clipfrac' (the clipped branch is larger),
      'explained_var' 1 − Var(R−V)/Var(R) (0 when Var(R) = 0), 'mean' (mean of V).
    """
    fn = "value_loss"
    check_choice(fn, "aggregate", aggregate, AGGREGATE_MODES)
    check_2d(fn, "values", values)
    shape = jnp.shape(values)
    check_shape(fn, "old_values", old_values, shape)
    check_shape(fn, "returns", returns, shape)
    check_shape(fn, "mask", mask, shape)
    if clip is not None:
        check_positive(fn, "clip", clip)
    check_norm_length(fn, norm_length)
    check_denominator(fn, denominator)

    m = jnp.asarray(mask) != 0
    v = jnp.where(m, jnp.asarray(values, jnp.float32), 0.0)
    v_old = jnp.where(m, jnp.asarray(old_values, jnp.float32), 0.0)
    r = jnp.where(m, jnp.asarray(returns, jnp.float32), 0.0)

    err = jnp.square(v - r)
    if clip is None:
        per_token = err
        clipfrac = jnp.float32(0.0)
    else:
        c = jnp.asarray(clip, jnp.float32)
        err_clipped = jnp.square(v_old + jnp.clip(v - v_old, -c, c) - r)
        per_token = jnp.maximum(err, err_clipped)
        clipfrac = token_mean((err_clipped > err).astype(jnp.float32), m)
    loss = 0.5 * reduce_tokens(per_token, m, aggregate, norm_length, denominator)

    var_r = token_var(r, m)
    explained = jnp.where(var_r > 0, 1.0 - token_var(r - v, m) / jnp.where(var_r > 0, var_r, 1.0),
                          0.0)
    metrics = {"clipfrac": clipfrac, "explained_var": explained, "mean": token_mean(v, m)}
    return loss, jax.tree_util.tree_map(lax.stop_gradient, metrics)
