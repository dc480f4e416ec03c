"""Rollout correction: importance weights and rejection masks between the behaviour policy (what the
sampler actually drew from: its precision, its top-k/top-p truncation, its staleness) and the proximal
policy (the trainer's policy before this step's updates).

With log ρ_t = proximal_t − behaviour_t on valid tokens (clamped to ±20):

  none               w = 1,                       keep = mask
  token_truncate     w_t = min(ρ_t, cap),         keep = mask                      (TIS)
  token_mask         w = 1,                       keep_t = mask_t and lower ≤ ρ_t ≤ cap
  sequence_truncate  w = min(Π_t ρ_t, cap) on every valid token of the row, keep = mask
  sequence_mask      w = 1,                       keep the row iff lower ≤ Π_t ρ_t ≤ cap
  geometric_mask     w = 1,                       keep the row iff lower ≤ (Π_t ρ_t)^(1/|o|) ≤ cap

Weights carry no gradient and are 0 off the mask; tokens with keep = 0 leave both the loss and its
normaliser. docs/algorithms/off_policy.md says when to use which.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from jaxrl_llm.rl.checks import check_2d, check_choice, check_shape

CORRECTION_MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "geometric_mask")
# The cap each mode takes when none is given (the lower bound of a mask mode defaults to 1/cap): per-token
# and per-sequence ratios of a healthy run stay within [0.5, 2]; a geometric mean is far tighter.
DEFAULT_CAPS = {"none": 2.0, "token_truncate": 2.0, "token_mask": 2.0, "sequence_truncate": 2.0,
                "sequence_mask": 2.0, "geometric_mask": 1.001}
_LOG_RATIO_CLAMP = 20.0


MASK_MODES = ("token_mask", "sequence_mask", "geometric_mask")  # the modes that read a lower bound


def correction_bounds(mode: str, cap: float | None = None, lower: float | None = None) -> tuple[float, float]:
    """(cap, lower) of `mode`, the defaults filling what is None (or 0). Only the mask modes use `lower`;
    the others (truncation) return 0 for it, so a cap below 1 with no lower bound is valid for them."""
    cap = cap or DEFAULT_CAPS[mode]
    if mode not in MASK_MODES:
        return cap, 0.0
    return cap, (lower if lower else 1.0 / cap)


def rollout_correction(behavior_logp, proximal_logp, mask, *, mode="none", cap=None, lower=None):
    """(weights (N,T) float32, keep (N,T) float32 0/1, metrics) of the rollout correction `mode`.

    Args:
      behavior_logp: (N,T) log-probs of the sampled tokens under the behaviour policy.
      proximal_logp: (N,T) log-probs of the same tokens under the proximal policy.
      mask: (N,T) valid-token mask.
      mode: one of CORRECTION_MODES. cap, lower: the bounds (see `default_bounds`); static floats.

    Returns metrics (float32 scalars): `correction/ess` (normalised effective sample size of the
    applied weights w·keep over valid tokens: 1 when they are all equal, 0 when nothing is kept),
    `correction/mismatch_kl` (token-mean k3 estimate of KL(behaviour ‖ proximal)),
    `correction/kept_frac` (kept valid tokens), `correction/weight_max` (largest applied weight).
    """
    fn = "rollout_correction"
    check_choice(fn, "mode", mode, CORRECTION_MODES)
    check_2d(fn, "behavior_logp", behavior_logp)
    check_shape(fn, "proximal_logp", proximal_logp, jnp.shape(behavior_logp))
    check_shape(fn, "mask", mask, jnp.shape(behavior_logp))
    cap, lower = correction_bounds(mode, cap, lower)
    if mode in MASK_MODES and not 0 < lower <= cap:
        raise ValueError(f"{fn}: the bounds must satisfy 0 < lower <= cap, got lower={lower}, cap={cap}")

    m = jnp.asarray(mask) != 0
    d = jnp.asarray(proximal_logp, jnp.float32) - jnp.asarray(behavior_logp, jnp.float32)
    log_rho = jnp.where(m, jnp.clip(d, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP), 0.0)  # (N,T)
    lengths = jnp.sum(m, axis=1, keepdims=True)
    log_seq = jnp.sum(log_rho, axis=1, keepdims=True)  # (N,1) log Π_t ρ_t
    within = lambda x: (x >= math.log(lower)) & (x <= math.log(cap))
    ones = jnp.ones_like(log_rho)
    if mode == "token_truncate":
        w, keep = jnp.exp(jnp.minimum(log_rho, math.log(cap))), m
    elif mode == "token_mask":
        w, keep = ones, m & within(log_rho)
    elif mode == "sequence_truncate":
        w, keep = jnp.broadcast_to(jnp.exp(jnp.minimum(log_seq, math.log(cap))), log_rho.shape), m
    elif mode == "sequence_mask":
        w, keep = ones, m & within(log_seq)
    elif mode == "geometric_mask":
        w, keep = ones, m & within(log_seq / jnp.maximum(lengths, 1))
    else:
        w, keep = ones, m
    keep = keep.astype(jnp.float32)
    w = jnp.where(m, w, 0.0)
    applied = w * keep
    n = jnp.maximum(jnp.sum(m), 1).astype(jnp.float32)
    sum_w, sum_w2 = jnp.sum(applied), jnp.sum(jnp.square(applied))
    metrics = {
        # Nothing kept: no effective sample at all (0); no valid token: nothing to correct (1).
        "correction/ess": jnp.where(sum_w2 > 0, jnp.square(sum_w) / (n * jnp.maximum(sum_w2, 1e-30)),
                                    jnp.where(jnp.any(m), 0.0, 1.0)),
        "correction/mismatch_kl": jnp.sum(jnp.where(m, jnp.expm1(log_rho) - log_rho, 0.0)) / n,
        "correction/kept_frac": jnp.where(jnp.any(m), jnp.sum(keep) / n, 1.0),
        "correction/weight_max": jnp.max(applied),
    }
    return lax.stop_gradient(w), keep, {k: lax.stop_gradient(v) for k, v in metrics.items()}
