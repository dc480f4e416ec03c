"""Advantage estimators: GAE, whitening, group (GRPO / Dr. GRPO), RLOO and REINFORCE++.

Pure, jit-able functions of float32 arrays. Shapes follow docs/design.md ("Conventions"): N rows (N = B·G, the
G rows of one prompt contiguous), T generated tokens, `mask` (N,T) 1 on generated tokens including
EOS. Masked positions may hold anything (padding, NaN): they are selected away with `where`, never
multiplied by the mask, so garbage cannot leak into valid tokens. Every output is 0 where mask is 0.

Argument errors (shapes, group sizes, out-of-range constants) raise `ValueError` at trace time.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxrl_llm.rl.checks import check_2d, check_range, check_scalar, check_shape

ADVANTAGE_SCALES = ("group", "batch", "none")


# --------------------------------------------------------------------------------------------------
# Argument checks of this module (jaxrl_llm.rl.checks has the shared ones)
# --------------------------------------------------------------------------------------------------


def _check_group_size(fn, group_size, n):
    # group_size reshapes arrays, so it must be a static Python int.
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"{fn}: group_size must be a Python int, got {group_size!r}")
    if group_size <= 0:
        raise ValueError(f"{fn}: group_size must be positive, got {group_size}")
    if group_size < 2:
        raise ValueError(f"{fn}: group_size must be >= 2 (a group of one has no baseline), "
                         f"got {group_size}")
    if n % group_size:
        raise ValueError(f"{fn}: group_size={group_size} does not divide the number of rows N={n}")


def _per_row(fn, name, x, n):
    """A scalar or an (N,) array as an (N,) float32 array (e.g. a per-row λ)."""
    x = jnp.asarray(x, jnp.float32)
    if x.ndim == 0:
        check_range(fn, name, x, 0.0, 1.0)
        return jnp.broadcast_to(x, (n,))
    if x.shape != (n,):
        raise ValueError(f"{fn}: {name} must be a scalar or have shape ({n},), got {x.shape}")
    return x


# --------------------------------------------------------------------------------------------------
# GAE
# --------------------------------------------------------------------------------------------------

def gae(rewards, values, mask, *, gamma, lam, lam_value=None, last_value=None):
    """Generalized advantage estimation over the valid tokens of each row.

    δ_t = r_t + γ·V_{t+1} − V_t,  A_t = δ_t + γ·λ·A_{t+1},  R_t = A^{λ_value}_t + V_t,
    where "t+1" is the next *valid* token (masked steps pass the carry through unchanged) and
    V = A = 0 after the last valid token (the episode ends there), or V = last_value (bootstrap).

    Args:
      rewards: (N,T) per-token rewards (score on the last valid token, −β·KL elsewhere).
      values: (N,T) V(s_t) of the critic at the rollout.
      mask: (N,T) 1 on valid tokens.
      gamma: scalar discount in [0, 1].
      lam: scalar or (N,) λ of the policy advantages (an (N,) array gives the length-adaptive λ of
        VAPO, see `adaptive_lam`).
      lam_value: scalar or (N,) λ used for the returns (value targets); None means `lam`.
        Different values give the decoupled GAE of VAPO.
      last_value: None, or (N,) V of the state after each row's last valid token: nonzero for a row
        cut by the length limit (it did not end: bootstrap), 0 for a row that ended with EOS.

    Returns:
      (advantages, returns), each (N,T) float32, 0 where mask is 0.
    """
    fn = "gae"
    rewards = jnp.asarray(rewards, jnp.float32)
    values = jnp.asarray(values, jnp.float32)
    check_2d(fn, "rewards", rewards)
    check_shape(fn, "values", values, rewards.shape)
    check_shape(fn, "mask", mask, rewards.shape)
    check_scalar(fn, "gamma", gamma)
    check_range(fn, "gamma", gamma, 0.0, 1.0)
    n = rewards.shape[0]
    m = jnp.asarray(mask) != 0
    gamma = jnp.asarray(gamma, jnp.float32)

    # Both λs ride one scan: row 0 is the policy λ, row 1 (if any) the value λ.
    lams = [_per_row(fn, "lam", lam, n)]
    if lam_value is not None:
        lams.append(_per_row(fn, "lam_value", lam_value, n))
    lams = jnp.stack(lams)  # (K,N), K in {1, 2}

    r = jnp.where(m, rewards, 0.0)
    v = jnp.where(m, values, 0.0)

    def step(carry, xs):
        next_v, next_a = carry  # (N,), (K,N): value and advantage at the next valid token
        r_t, v_t, m_t = xs  # (N,) each
        delta = r_t + gamma * next_v - v_t
        a_t = delta + gamma * lams * next_a
        a_t = jnp.where(m_t, a_t, next_a)
        v_next = jnp.where(m_t, v_t, next_v)
        return (v_next, a_t), a_t

    boot = jnp.zeros((n,), jnp.float32) if last_value is None else jnp.asarray(last_value, jnp.float32)
    check_shape(fn, "last_value", boot, (n,))
    init = (boot, jnp.zeros(lams.shape, jnp.float32))
    _, adv = lax.scan(step, init, (r.T, v.T, m.T), reverse=True)  # (T,K,N)
    adv = jnp.transpose(adv, (1, 2, 0))  # (K,N,T)
    advantages = jnp.where(m, adv[0], 0.0)
    returns = jnp.where(m, adv[-1] + v, 0.0)
    return advantages, returns


def adaptive_lam(mask, *, alpha):
    """Length-adaptive GAE λ of VAPO: λ_i = 1 − 1/(α·|o_i|), clipped to [0, 1].

    Args:
      mask: (N,T) valid-token mask.
      alpha: scalar α > 0 (VAPO uses 0.05).

    Returns:
      (N,) float32 λ per row (1 for rows without valid tokens, where it is never used).
    """
    fn = "adaptive_lam"
    check_2d(fn, "mask", mask)
    check_scalar(fn, "alpha", alpha)
    check_range(fn, "alpha", alpha, 0.0, float("inf"), lo_open=True)
    lengths = jnp.sum(jnp.asarray(mask) != 0, axis=1).astype(jnp.float32)
    lam = 1.0 - 1.0 / (jnp.asarray(alpha, jnp.float32) * jnp.maximum(lengths, 1.0))
    return jnp.where(lengths > 0, jnp.clip(lam, 0.0, 1.0), 1.0)


# --------------------------------------------------------------------------------------------------
# Whitening and token rewards
# --------------------------------------------------------------------------------------------------

def whiten(x, mask, shift_mean=True, *, eps=1e-8):
    """Normalize `x` to zero mean and unit variance over its valid entries.

    The variance is unbiased (ddof=1, as TRL's masked_whiten); with `shift_mean=False` the mean is
    added back, so only the scale changes.

    Args:
      x: any shape, e.g. (N,T) advantages.
      mask: same shape as `x`, 1 on valid entries.
      shift_mean: static bool.
      eps: added to the variance before the square root.

    Returns:
      float32 array of x's shape, 0 where mask is 0 (0 everywhere when nothing is valid).
    """
    fn = "whiten"
    x = jnp.asarray(x, jnp.float32)
    check_shape(fn, "mask", mask, x.shape)
    if not isinstance(shift_mean, bool):
        raise ValueError(f"{fn}: shift_mean must be a Python bool, got {shift_mean!r}")
    check_range(fn, "eps", eps, 0.0, float("inf"))
    m = jnp.asarray(mask) != 0
    n = jnp.sum(m).astype(jnp.float32)
    mean = jnp.sum(jnp.where(m, x, 0.0)) / jnp.maximum(n, 1.0)
    var = jnp.sum(jnp.where(m, jnp.square(x - mean), 0.0)) / jnp.maximum(n - 1.0, 1.0)
    out = (x - mean) * lax.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return jnp.where(m, out, 0.0)


def _last_valid_onehot(m):
    """(N,T) bool mask → (N,T) float32 one-hot of the last valid token (all 0 for empty rows)."""
    t = m.shape[1]
    last = t - 1 - jnp.argmax(m[:, ::-1], axis=1)  # argmax finds the first True from the end
    onehot = jnp.arange(t)[None, :] == last[:, None]
    return (onehot & jnp.any(m, axis=1, keepdims=True)).astype(jnp.float32)


def token_rewards(scores, mask, kl=None):
    """Per-token rewards: the sequence score on the last valid token, minus a KL penalty.

    Args:
      scores: (N,) sequence-level scores.
      mask: (N,T) valid-token mask.
      kl: optional (N,T) per-token KL penalty already multiplied by its coefficient β.

    Returns:
      (N,T) float32 rewards r_t = −kl_t + score·[t is the last valid token], 0 where mask is 0.
    """
    fn = "token_rewards"
    scores = jnp.asarray(scores, jnp.float32)
    check_2d(fn, "mask", mask)
    n, t = jnp.shape(mask)
    check_shape(fn, "scores", scores, (n,))
    m = jnp.asarray(mask) != 0
    r = _last_valid_onehot(m) * scores[:, None]
    if kl is not None:
        check_shape(fn, "kl", kl, (n, t))
        r = r - jnp.asarray(kl, jnp.float32)
    return jnp.where(m, r, 0.0)


# --------------------------------------------------------------------------------------------------
# Group baselines: GRPO / Dr. GRPO, RLOO, REINFORCE++
# --------------------------------------------------------------------------------------------------

def _grouped(fn, rewards, group_size):
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 1:
        raise ValueError(f"{fn}: rewards must be 1-D (N,), got shape {rewards.shape}")
    _check_group_size(fn, group_size, rewards.shape[0])
    rg = rewards.reshape(-1, group_size)  # (B,G)
    # A group whose rewards are all equal carries no signal; its float32 mean may still differ from
    # the rewards by an ulp, which the std division would blow up. Force those groups to exactly 0.
    tied = jnp.max(rg, axis=1, keepdims=True) == jnp.min(rg, axis=1, keepdims=True)
    return rewards, rg, tied


def group_advantages(rewards, group_size, *, scale="group", eps=1e-6, row_mask=None):
    """GRPO advantages A_i = (r_i − mean_g(r)) / (std(r) + eps), one per completion.

    Args:
      rewards: (N,) scores, the G = group_size rows of one prompt contiguous.
      group_size: static int G >= 2 dividing N.
      scale: 'group' (std of the group, GRPO), 'batch' (std of all N rewards, as TRL's
        scale_rewards='batch') or 'none' (no division: Dr. GRPO). Stds are unbiased (ddof=1).
      eps: added to the std.
      row_mask: None, or (N,) rows that enter the loss: the 'batch' std is taken over these only (rows
        the loss ignores, e.g. DAPO's filler groups, must not move it), unless fewer than two of them
        differ: then over every row (never a division by eps alone).

    Returns:
      (N,) float32 advantages; a group of equal rewards gives exactly 0.
    """
    fn = "group_advantages"
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"{fn}: scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    check_range(fn, "eps", eps, 0.0, float("inf"))
    rewards, rg, tied = _grouped(fn, rewards, group_size)
    centered = rg - jnp.mean(rg, axis=1, keepdims=True)
    if scale == "group":
        std = jnp.sqrt(jnp.sum(jnp.square(centered), axis=1, keepdims=True) / (group_size - 1))
        adv = centered / (std + eps)
    elif scale == "batch":
        std = _batch_std(rewards, None if row_mask is None else jnp.asarray(row_mask) != 0)
        adv = centered / (std + eps)
    else:
        adv = centered
    return jnp.where(tied, 0.0, adv).reshape(-1)


def _batch_std(rewards, keep):
    """The 'batch' std: over the rows the loss sees (`keep`), or over every row when those are fewer
    than two or all scored alike. Rows outside the loss still move their group's mean, so a kept row
    can be centred away from 0 while the kept rows' std is 0 (one row left after
    `dapo.mask_truncated`, say): dividing by eps alone would make its advantage ~1e6. Every row's std
    is then the scale; it is 0 only when every reward is equal, and then every group is tied (A = 0)."""
    if keep is None:
        return jnp.std(rewards, ddof=1)
    big = jnp.finfo(jnp.float32).max
    alike = jnp.max(jnp.where(keep, rewards, -big)) <= jnp.min(jnp.where(keep, rewards, big))  # also no kept row
    return jnp.where(alike, jnp.std(rewards, ddof=1), _masked_std(rewards, keep))


def _masked_std(x, keep):
    """Unbiased std of x (N,) over `keep` (all rows when None); 0 with fewer than two rows."""
    if keep is None:
        return jnp.std(x, ddof=1)
    count = jnp.sum(keep).astype(jnp.float32)
    mean = jnp.sum(jnp.where(keep, x, 0.0)) / jnp.maximum(count, 1.0)
    var = jnp.sum(jnp.where(keep, jnp.square(x - mean), 0.0)) / jnp.maximum(count - 1.0, 1.0)
    return jnp.sqrt(var)


def group_process_advantages(step_rewards, step_mask, mask, group_size, *, eps=1e-6):
    """GRPO with process rewards: each step reward is normalised by the mean and (unbiased) std of all
    step rewards of its group, and token t of a row gets the sum of its normalised rewards at or after
    t (a step's reward sits at the index of the step's last token).

    Args:
      step_rewards: (N,T) reward of the step ending at each token (0 elsewhere).
      step_mask: (N,T) 1 where a step ends.
      mask: (N,T) valid-token mask.
      group_size: static int G >= 2 dividing N.
      eps: added to the std.

    Returns:
      (N,T) float32 advantages, 0 where mask is 0; a group whose steps are all equal (or that has fewer
      than two steps) gives exactly 0.
    """
    fn = "group_process_advantages"
    check_2d(fn, "mask", mask)
    shape = jnp.shape(mask)
    check_shape(fn, "step_rewards", step_rewards, shape)
    check_shape(fn, "step_mask", step_mask, shape)
    _check_group_size(fn, group_size, shape[0])
    m = jnp.asarray(mask) != 0
    s = (jnp.asarray(step_mask) != 0) & m
    r = jnp.where(s, jnp.asarray(step_rewards, jnp.float32), 0.0)
    rg, sg = r.reshape(-1, group_size * shape[1]), s.reshape(-1, group_size * shape[1])  # (B, G*T)
    count = jnp.sum(sg, axis=1, keepdims=True).astype(jnp.float32)
    mean = jnp.sum(rg, axis=1, keepdims=True) / jnp.maximum(count, 1.0)
    std = jnp.sqrt(jnp.sum(jnp.where(sg, jnp.square(rg - mean), 0.0), axis=1, keepdims=True)
                   / jnp.maximum(count - 1.0, 1.0))
    big, small = jnp.max(jnp.where(sg, rg, -jnp.inf), axis=1, keepdims=True), jnp.min(
        jnp.where(sg, rg, jnp.inf), axis=1, keepdims=True)
    tied = (count < 2) | (big == small)
    norm = jnp.where(sg & ~tied, (rg - mean) / (std + eps), 0.0).reshape(shape)
    # Σ over steps at or after t: a reversed cumulative sum along the tokens.
    adv = jnp.flip(jnp.cumsum(jnp.flip(norm, axis=1), axis=1), axis=1)
    return jnp.where(m, adv, 0.0)


def rloo_advantages(rewards, group_size):
    """RLOO advantages A_i = r_i − (Σ_j r_j − r_i)/(G − 1): the leave-one-out group mean baseline.

    Args:
      rewards: (N,) scores, groups contiguous.
      group_size: static int G >= 2 dividing N.

    Returns:
      (N,) float32; a group of equal rewards gives exactly 0.
    """
    _, rg, tied = _grouped("rloo_advantages", rewards, group_size)
    # r_i − (S − r_i)/(G−1) = (G·r_i − S)/(G−1)
    adv = (group_size * rg - jnp.sum(rg, axis=1, keepdims=True)) / (group_size - 1)
    return jnp.where(tied, 0.0, adv).reshape(-1)


def reinforce_pp_advantages(scores, kl, mask, *, gamma, group_size=None, loss_mask=None):
    """REINFORCE++ advantages: whitened discounted token returns of (score − KL).

    r_t = −kl_t + score·[t is last valid], G_t = r_t + γ·G_{t+1} over valid tokens, A = whiten(G)
    over the valid tokens of the batch. With `group_size` (REINFORCE++-baseline) the group mean of
    the scores is subtracted first.

    Args:
      scores: (N,) sequence scores.
      kl: (N,T) per-token KL penalty already multiplied by its coefficient β.
      mask: (N,T) valid-token mask.
      gamma: scalar discount in [0, 1].
      group_size: None or a static int G >= 2 dividing N.
      loss_mask: None, or (N,T) the tokens that enter the loss (whitening statistics over them).

    Returns:
      (N,T) float32 advantages, 0 where mask is 0.
    """
    fn = "reinforce_pp_advantages"
    scores = jnp.asarray(scores, jnp.float32)
    check_2d(fn, "mask", mask)
    check_shape(fn, "scores", scores, (jnp.shape(mask)[0],))
    check_shape(fn, "kl", kl, jnp.shape(mask))
    if group_size is not None:
        _, sg, tied = _grouped(fn, scores, group_size)
        scores = jnp.where(tied, 0.0, sg - jnp.mean(sg, axis=1, keepdims=True)).reshape(-1)
    rewards = token_rewards(scores, mask, kl)
    # Discounted returns are GAE with V = 0 and λ = 1.
    returns, _ = gae(rewards, jnp.zeros_like(rewards), mask, gamma=gamma, lam=1.0)
    # Whitening statistics over the tokens that enter the loss: excluded rows must not move them.
    return whiten(returns, mask if loss_mask is None else loss_mask)
