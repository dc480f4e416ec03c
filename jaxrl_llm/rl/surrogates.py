"""Policy surrogates by name: (ρ, logp, A) -> (per-token loss, clipped, clipped_low, clipped_high).

`SURROGATES` is the registry `policy_loss(surrogate=)` and the config's `loss.surrogate` read. Each
surrogate takes (N,T) float32 ratios ρ, log-probs and advantages (0 on masked positions) and every
option as a keyword (it reads its own): `lo`, `hi` = 1 − clip_low, 1 + clip_high, `dual_clip`,
`sapo_tau_pos`, `sapo_tau_neg`, `cispo_max`. `clipped_low`/`clipped_high` mark where PPO's hard clip
would zero the gradient (A < 0 and ρ < lo; A > 0 and ρ > hi); `clipped` is what `clipfrac` counts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def _clip_surrogate(rho, logp, adv, *, lo, hi, dual_clip, **_):
    """PPO: −min(ρA, clip(ρ, lo, hi)·A); with dual clip c and A < 0, capped at −c·A."""
    clipped_low, clipped_high = (adv < 0) & (rho < lo), (adv > 0) & (rho > hi)
    per_token = jnp.maximum(-adv * rho, -adv * jnp.clip(rho, lo, hi))
    clipped = clipped_low | clipped_high
    if dual_clip is not None:
        c = jnp.asarray(dual_clip, jnp.float32)
        # For A < 0 the unclipped loss −ρA grows without bound in ρ; cap it at −c·A.
        per_token = jnp.where(adv < 0, jnp.minimum(per_token, -c * adv), per_token)
        clipped = clipped | ((adv < 0) & (rho > c))
    return per_token, clipped, clipped_low, clipped_high


def _sapo_surrogate(rho, logp, adv, *, lo, hi, sapo_tau_pos, sapo_tau_neg, **_):
    """SAPO: −σ(τ(ρ−1))·(4/τ)·A, τ by the sign of A; clip counts are those of the hard clip."""
    clipped_low, clipped_high = (adv < 0) & (rho < lo), (adv > 0) & (rho > hi)
    tau = jnp.where(adv > 0, jnp.asarray(sapo_tau_pos, jnp.float32), jnp.asarray(sapo_tau_neg, jnp.float32))
    # The 4/τ factor makes d/dρ of the gate equal 1 at ρ = 1 (σ'(0) = 1/4).
    per_token = -jax.nn.sigmoid(tau * (rho - 1.0)) * (4.0 / tau) * adv
    return per_token, clipped_low | clipped_high, clipped_low, clipped_high


def _cispo_surrogate(rho, logp, adv, *, cispo_max, **_):
    """CISPO: −sg(min(ρ, cap))·A·logp; 'clipped' is ρ > cap."""
    cap = jnp.asarray(cispo_max, jnp.float32)
    per_token = -lax.stop_gradient(jnp.minimum(rho, cap)) * adv * logp
    clipped_high = rho > cap
    return per_token, clipped_high, jnp.zeros_like(clipped_high), clipped_high


# The surrogates by the name `policy_loss(surrogate=)` and the config's `loss.surrogate` take.
SURROGATES = {"clip": _clip_surrogate, "sapo": _sapo_surrogate, "cispo": _cispo_surrogate}
