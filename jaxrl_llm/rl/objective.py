"""The objective of an RL step as one value: every choice that decides the math, frozen and hashable.

`Objective.from_config(c)` reads it once from a resolved, validated run config. It is a static argument
of the jitted step functions (hashable, so it keys the compile cache) and exposes the step's pure math:

  prepare(batch, kl_coef)                      -> rollout correction, then advantages: new fields, stats
  advantages(batch, kl_coef)                   -> advantages, returns, KL statistics
  denominators(minibatch)                      -> the global normalisers of one optimizer step
  policy_loss(logp, entropy, mb, kl_coef, den) -> the policy loss of one micro-batch and its metrics
  value_loss(values, mb, den)                  -> the value loss of one micro-batch and its metrics

Estimators live in `ESTIMATORS` and surrogates in `losses.SURROGATES`, keyed by the names the config
takes; config validation reads the same registries, so each allowed-value list exists once. A new
estimator is one `@register_estimator` function in this file (or in a user's module imported before the
run), plus its docs.

Batch keys (N = B·G rows, T tokens, groups of G contiguous rows): `scores` (N,), `mask` (N,T) valid
tokens, `loss_mask` (N,T) tokens that enter the loss, `behavior_logp` (N,T) log-probs of the policy the
sampler drew from, `old_logp` (N,T) the proximal policy's (before this step's updates; the behaviour's
unless recomputed), `ref_logp` (N,T) the reference's (with KL), `old_values`/`returns` (N,T) and
`last_values` (N,) (value model), `process_rewards`/`process_mask` (N,T) (process rewards), and what
`prepare` adds: `is_weights` (N,T), `adv` (N,) or (N,T). `supervised` (N,) 1/0 (gkd with distill.lmbda < 1,
trainer/supervised.py): rows whose completion came from the dataset, trained by the divergence alone and
out of every statistic of the on-policy rows (`on_policy`): advantage whitening and batch std, the value
loss, KL, entropy, their normalisers and metrics.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from jax import lax

from jaxrl_llm.rl.aggregation import AGGREGATE_MODES, aggregate, aggregate_denominator, aggregate_sum
from jaxrl_llm.rl.advantages import (ADVANTAGE_SCALES, adaptive_lam, gae, group_advantages, group_process_advantages,
                                     reinforce_pp_advantages, rloo_advantages, token_rewards, whiten)
from jaxrl_llm.rl.correction import CORRECTION_MODES, rollout_correction
from jaxrl_llm.rl.distill import DISTILL_KINDS, distill_stats, opd_advantages
from jaxrl_llm.rl.kl_control import AdaptiveKLController, FixedKLController
from jaxrl_llm.rl.router import router_losses
from jaxrl_llm.rl.losses import KL_KINDS, LOG_RATIO_CLAMP, RATIOS, SURROGATES, kl_penalty, policy_loss, value_loss

KL_PLACEMENTS = ("loss", "reward")  # β·KL added to the loss (GRPO) or subtracted from token rewards (PPO)


def on_policy(b, mask):
    """`mask` (n,T) without GKD's supervised rows (`b["supervised"]` (n,) 1/0; `mask` itself when absent)."""
    return mask * (1.0 - b["supervised"][:, None]) if "supervised" in b else mask


@dataclasses.dataclass(frozen=True)
class Estimator:
    """An advantage estimator and what it needs from the run.

    fn(objective, batch, penalty) -> (advantages (N,) or (N,T), returns (N,T) or None); `penalty` is
    β·KL per token (N,T) when the KL is placed in the reward and the estimator sees token rewards, else
    None (an estimator of sequence scores gets the row's summed penalty subtracted from its score).
    """

    fn: Callable[..., tuple[Any, Any]]
    group: bool  # a baseline over each prompt's G completions: needs G >= 2
    value: bool  # needs a value model (batch["old_values"])
    token_rewards: bool  # sees per-token rewards (else the KL in the reward is summed into the score)
    process: bool = False  # reads process rewards: batch["process_rewards"], batch["process_mask"] (N,T)
    whitens: bool = False  # honours `advantage.whiten` (Objective.whiten)


ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str, *, group: bool = False, value: bool = False, token_rewards: bool = False,
                       process: bool = False, whitens: bool = False):
    """Registers `fn(objective, batch, penalty)` under `name`, the value `advantage.estimator` takes."""
    def decorator(fn):
        if name in ESTIMATORS and ESTIMATORS[name].fn is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = Estimator(fn, group=group, value=value, token_rewards=token_rewards, process=process,
                                     whitens=whitens)
        return fn
    return decorator


@register_estimator("gae", value=True, token_rewards=True, whitens=True)
def _gae(o: Objective, b, penalty):
    """PPO: GAE over per-token rewards (score on the last token, minus β·KL), optionally whitened."""
    mask = b["mask"]
    rewards = token_rewards(b["scores"], mask, penalty)
    lam = adaptive_lam(mask, alpha=o.adaptive_lam_alpha) if o.adaptive_lam_alpha > 0 else o.lam
    last = b["last_values"] if o.bootstrap_truncated else None  # V(s_T) on truncated rows, 0 elsewhere
    adv, returns = gae(rewards, b["old_values"], mask, gamma=o.gamma, lam=lam, lam_value=o.lam_value, last_value=last)
    if o.whiten:
        adv = whiten(adv, b["loss_mask"])
    return adv, returns


@register_estimator("group", group=True)
def _group(o: Objective, b, penalty):
    """GRPO / Dr. GRPO: score minus the group mean, over the group (or batch) std or not at all."""
    rows = jnp.any(b["loss_mask"] > 0, axis=1)  # a batch-scale std over the rows the loss sees
    return group_advantages(b["scores"], o.group_size, scale=o.scale, eps=o.eps, row_mask=rows), None


@register_estimator("group_process", group=True, process=True)
def _group_process(o: Objective, b, penalty):
    """GRPO with process rewards: step rewards normalised over the group's steps, summed from t on."""
    return group_process_advantages(b["process_rewards"], b["process_mask"], b["mask"], o.group_size, eps=o.eps), None


@register_estimator("rloo", group=True, whitens=True)
def _rloo(o: Objective, b, penalty):
    """RLOO: score minus the mean of the group's other scores [whitened over the rows the loss sees]."""
    adv = rloo_advantages(b["scores"], o.group_size)
    if o.whiten:
        adv = whiten(adv, jnp.any(b["loss_mask"] > 0, axis=1))
    return adv, None


@register_estimator("reinforce_pp", token_rewards=True)
def _reinforce_pp(o: Objective, b, penalty):
    """REINFORCE++: whitened discounted returns of (score − β·KL) [minus the group mean first]."""
    kl = penalty if penalty is not None else jnp.zeros_like(b["old_logp"])
    group = o.group_size if o.reinforce_pp_baseline else None
    return reinforce_pp_advantages(b["scores"], kl, b["mask"], gamma=o.gamma, group_size=group,
                                   loss_mask=b["loss_mask"]), None


@register_estimator("none")
def _none(o: Objective, b, penalty):
    """No advantage from the scores: the distillation term alone (presets opd, gkd)."""
    return jnp.zeros(b["scores"].shape, jnp.float32), None


@dataclasses.dataclass(frozen=True)
class Objective:
    """Every option that decides the math of a step (defaults: GRPO without KL); see docs/algorithms/."""

    group_size: int  # G completions per prompt
    # ---- advantages
    estimator: str = "group"  # a key of ESTIMATORS
    scale: str = "group"  # group estimator's std: one of ADVANTAGE_SCALES
    eps: float = 1e-6  # added to that std
    whiten: bool = False  # GAE's advantages whitened over the loss tokens, RLOO's over the rows with loss tokens
    gamma: float = 1.0
    lam: float = 0.95
    lam_value: float | None = None  # λ of the value targets; None = lam (decoupled GAE when set)
    adaptive_lam_alpha: float = 0.0  # > 0: λ = 1 − 1/(α·|o|) (VAPO)
    reinforce_pp_baseline: bool = False
    bootstrap_truncated: bool = False  # GAE: V(s_T) after a truncated row's last token (batch["last_values"])
    # ---- policy surrogate
    ratio: str = "token"  # one of RATIOS
    surrogate: str = "clip"  # a key of SURROGATES
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    cispo_max: float = 5.0
    aggregate: str = "seq-mean-token-mean"  # one of AGGREGATE_MODES
    norm_length: int | None = None  # L of seq-mean-token-sum-norm
    nll_coef: float = 0.0  # VAPO: NLL of completions scoring >= nll_threshold, token-mean over them
    nll_threshold: float = 1.0
    # ---- KL to the reference and entropy
    kl_coef: float = 0.0  # initial β; 0 = no reference model
    kl_estimator: str = "k3"  # one of KL_KINDS
    kl_placement: str = "loss"  # one of KL_PLACEMENTS
    kl_adaptive: bool = False
    kl_target: float = 0.1
    kl_horizon: float = 10000.0
    kl_importance_weighted: bool = False  # KL-in-loss term times sg(current/proximal)
    entropy_coef: float = 0.0
    # ---- rollout correction between the behaviour and proximal policies
    correction_mode: str = "none"  # one of CORRECTION_MODES
    correction_cap: float | None = None  # None: the mode's default
    correction_lower: float | None = None
    # ---- value model
    value: bool = False
    value_clip: float | None = None
    # ---- on-policy distillation from a teacher (rl/distill.py)
    distill: str = ""  # "" (no teacher) or a key of DISTILL_KINDS
    distill_coef: float = 1.0  # weight of the distillation advantage (opd) or loss term (gkd)
    distill_beta: float = 0.5  # gkd: 0 forward KL, 1 reverse KL
    distill_gamma: float = 0.0  # opd: discount of the per-token rewards (0: each token's own)
    distill_chunk: int = 4096  # gkd: vocabulary columns per chunk
    # ---- mixture-of-experts router (rl/router.py)
    router_aux_coef: float = 0.0  # load-balancing loss
    router_z_coef: float = 0.0  # router z-loss

    def __post_init__(self):
        for field, value, allowed in (("estimator", self.estimator, ESTIMATORS), ("scale", self.scale, ADVANTAGE_SCALES),
                                      ("ratio", self.ratio, RATIOS), ("surrogate", self.surrogate, SURROGATES),
                                      ("aggregate", self.aggregate, AGGREGATE_MODES),
                                      ("kl_estimator", self.kl_estimator, KL_KINDS),
                                      ("kl_placement", self.kl_placement, KL_PLACEMENTS),
                                      ("correction_mode", self.correction_mode, CORRECTION_MODES),
                                      ("distill", self.distill, ("", *DISTILL_KINDS))):
            if value not in allowed:
                raise ValueError(f"Objective.{field} must be one of {', '.join(allowed)}, got {value!r}")
        if ESTIMATORS[self.estimator].value and not self.value:
            raise ValueError(f"Objective: the {self.estimator} estimator needs a value model (value=True)")
        if self.whiten and not ESTIMATORS[self.estimator].whitens:
            raise ValueError(f"Objective: the {self.estimator} estimator ignores whiten (only gae and rloo whiten)")

    @classmethod
    def from_config(cls, c) -> Objective:
        """From a resolved, validated run config (`jaxrl_llm.config.prepare`)."""
        a, loss, kl = c.advantage, c.loss, c.kl
        return cls(
            group_size=c.rollout.group_size, estimator=a.estimator, scale=a.scale, eps=a.eps, whiten=a.whiten,
            gamma=a.gamma, lam=a.lam, lam_value=None if a.lam_value < 0 else a.lam_value, adaptive_lam_alpha=a.adaptive_lam_alpha,
            reinforce_pp_baseline=a.reinforce_pp_baseline, bootstrap_truncated=a.bootstrap_truncated,
            ratio=loss.ratio, surrogate=loss.surrogate, nll_coef=loss.nll_coef, nll_threshold=loss.nll_threshold,
            clip_low=loss.clip_low, clip_high=loss.clip_high, dual_clip=loss.dual_clip or None,
            sapo_tau_pos=loss.sapo_tau_pos, sapo_tau_neg=loss.sapo_tau_neg, cispo_max=loss.cispo_max,
            aggregate=loss.aggregate, norm_length=loss.norm_length, kl_coef=kl.coef, kl_estimator=kl.estimator,
            kl_placement=kl.placement, kl_adaptive=kl.adaptive, kl_target=kl.target, kl_horizon=kl.horizon,
            kl_importance_weighted=kl.importance_weighted, entropy_coef=c.entropy_coef,
            correction_mode=c.correction.mode, correction_cap=c.correction.cap or None,
            correction_lower=c.correction.lower or None, value=c.value.enabled, value_clip=c.value.clip or None,
            distill=c.distill.kind if c.teacher.path else "", distill_coef=c.distill.coef, distill_beta=c.distill.beta,
            distill_gamma=c.distill.gamma, distill_chunk=c.distill.vocab_chunk,
            router_aux_coef=c.model.router_aux_loss_coef, router_z_coef=c.model.router_z_loss_coef)

    @property
    def uses_ref(self) -> bool:
        """Whether a reference model (and its log-probs) is needed."""
        return self.kl_coef > 0

    @property
    def uses_teacher(self) -> bool:
        """Whether a teacher model (its log-probs, with gkd its full distributions) is needed."""
        return bool(self.distill)

    def kl_controller(self):
        """The initial KL coefficient state (a pytree kept in the train state)."""
        if self.kl_adaptive:
            return AdaptiveKLController.create(max(self.kl_coef, 1e-8), self.kl_target, self.kl_horizon)
        return FixedKLController.create(self.kl_coef)

    def prepare(self, b, kl_coef):
        """(new batch fields, statistics) of a scored rollout batch, before its updates: the rollout
        correction (`is_weights`, and `loss_mask` without the rejected tokens), then the advantages
        (`adv`, `returns`) on what is kept."""
        # Rows without loss tokens (DAPO's fillers, masked truncations) are not trained, and with sequence
        # packing not even scored (their log-probs are 0): the statistics read the other rows alone.
        # GKD's supervised rows (`supervised`, distill.lmbda < 1) have no sampler log-probs: they stay out
        # of the correction and of what reads the sampler (kept whole; the divergence alone trains them).
        sup = b["supervised"][:, None] > 0 if "supervised" in b else None
        seen_rows = jnp.any(b["loss_mask"] > 0, axis=1) & (True if sup is None else ~sup[:, 0])
        seen = b["mask"] * seen_rows[:, None]
        weights, keep, stats = rollout_correction(b["behavior_logp"], b["old_logp"], seen,
                                                  mode=self.correction_mode, cap=self.correction_cap,
                                                  lower=self.correction_lower)
        if sup is not None:
            weights, keep = jnp.where(sup, 1.0, weights), jnp.where(sup, 1.0, keep)
        loss_mask = b["loss_mask"] * keep
        # the estimators pool (whitening, a batch std) over the on-policy loss tokens alone
        adv, returns, kl_stats = self.advantages({**b, "loss_mask": on_policy(b, loss_mask)}, kl_coef, seen)
        return ({"adv": adv, "returns": returns, "loss_mask": loss_mask, "is_weights": weights,
                 "seen_rows": seen_rows.astype(jnp.float32)}, {**stats, **kl_stats})

    def advantages(self, b, kl_coef, seen=None):
        """(advantages (N,) or (N,T), returns (N,T) or None, KL statistics) of a scored rollout batch.

        kl_coef: the current β (traced). seen: (N,T) the tokens the KL reads (default `mask`; `prepare`
        passes those of the rows with loss tokens). Statistics: `kl/ref` (token-mean k3 of the rollout against the
        reference) and `kl/seq_sum` (mean over rows of the summed estimator: the adaptive controller's
        input); empty without a reference. A KL in the reward reaches an estimator of sequence scores
        (group, RLOO) as score − β·Σ_t KL_t.
        """
        mask, stats, penalty = (b["mask"] if seen is None else seen), {}, None
        estimator = ESTIMATORS[self.estimator]
        if self.uses_ref:
            k3 = kl_penalty(b["old_logp"], b["ref_logp"], "k3")
            stats["kl/ref"] = aggregate(k3, mask, "token-mean")
            kl_tok = jnp.where(mask > 0, kl_penalty(b["old_logp"], b["ref_logp"], self.kl_estimator), 0.0)
            rows = jnp.maximum(jnp.sum(jnp.any(mask > 0, axis=1)), 1)
            stats["kl/seq_sum"] = jnp.sum(kl_tok) / rows  # mean over the rows it reads of the summed estimator
            if self.kl_placement == "reward":
                penalty = kl_coef * kl_tok
                if not estimator.token_rewards:
                    b, penalty = {**b, "scores": b["scores"] - jnp.sum(penalty, axis=1)}, None
        adv, returns = estimator.fn(self, b, penalty)
        if self.uses_teacher:  # the teacher's log-probs of the proximal policy's tokens
            stats.update(distill_stats(b["old_logp"], b["teacher_logp"], mask))
        if self.distill == "opd":  # the estimator's advantage (per row or token) plus the dense one
            d = opd_advantages(b["old_logp"], b["teacher_logp"], mask, self.distill_gamma)
            adv = (adv[:, None] if adv.ndim == 1 else adv) + self.distill_coef * d
        return adv, returns, stats

    def denominators(self, mb):
        """The normalisers of one optimizer step, over all its micro-batches (`mb` is the step's whole
        minibatch): {'policy', 'value', 'tokens', 'distill'[, 'nll']}. The policy's and the value's are over
        the on-policy loss tokens; the divergence's (`distill`, gkd) and `tokens` (every loss token: the
        router's weights, the divergence's metric) count GKD's supervised rows too."""
        loss_mask, rl_mask = mb["loss_mask"], on_policy(mb, mb["loss_mask"])
        den = {"policy": aggregate_denominator(rl_mask, self.aggregate, norm_length=self.norm_length),
               "value": aggregate_denominator(rl_mask, "token-mean"), "tokens": jnp.sum(loss_mask),
               "distill": aggregate_denominator(loss_mask, self.aggregate, norm_length=self.norm_length)}
        if self.nll_coef > 0:
            den["nll"] = jnp.sum(self._nll_mask(mb))
        # Counts of tokens or rows, hence >= 1 unless the minibatch has no loss token, whose sums are 0:
        # at least 1, an empty minibatch contributes 0 (every term's 0/0 would be NaN).
        return {k: jnp.maximum(v, 1.0) for k, v in den.items()}

    def _nll_mask(self, mb):
        """(n,T) the loss tokens of completions whose score reaches nll_threshold."""
        return on_policy(mb, mb["loss_mask"]) * (mb["scores"] >= self.nll_threshold)[:, None]

    def policy_loss(self, logp, entropy, mb, kl_coef, den, divergence=None):
        """Surrogate [+ β·KL in the loss] [− c_H·entropy] [+ NLL] of one micro-batch, over the step's
        normalisers.

        logp, entropy: (n,T) of the policy being trained; mb: the micro-batch (old_logp, adv, loss_mask,
        is_weights, scores, ref_logp when the KL is in the loss). Returns (loss, metrics): sums are
        weighted by the micro-batch's loss tokens (`ntok`) so that micro-batches combine by addition;
        ratio extremes apart. divergence: (n,T) gkd's per-token generalized JSD to the teacher (its
        gradient reaches the student), added as distill_coef·aggregate(divergence).
        """
        m = mb["loss_mask"]
        mp = on_policy(mb, m)  # supervised rows: the divergence only
        pl, pm = policy_loss(
            logp, mb["old_logp"], mb["adv"], mp, ratio=self.ratio, surrogate=self.surrogate,
            clip_low=self.clip_low, clip_high=self.clip_high, dual_clip=self.dual_clip,
            sapo_tau_pos=self.sapo_tau_pos, sapo_tau_neg=self.sapo_tau_neg, cispo_max=self.cispo_max,
            aggregate=self.aggregate, norm_length=self.norm_length, denominator=den["policy"],
            weights=mb.get("is_weights"))  # absent: a batch that did not go through `prepare`
        loss = pl
        if self.uses_ref and self.kl_placement == "loss":
            kl = kl_penalty(logp, mb["ref_logp"], self.kl_estimator)
            if self.kl_importance_weighted:  # tokens come from the proximal policy, the term is at θ
                ratio = jnp.exp(jnp.clip(logp - mb["old_logp"], -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
                kl = kl * lax.stop_gradient(ratio)
            loss = loss + kl_coef * aggregate_sum(kl, mp, self.aggregate) / den["policy"]
        if divergence is not None:
            loss = loss + self.distill_coef * aggregate_sum(divergence, m, self.aggregate) / den["distill"]
        if self.entropy_coef > 0:
            loss = loss - self.entropy_coef * aggregate_sum(entropy, mp, self.aggregate) / den["policy"]
        ntok = jnp.sum(mp)  # the "_sum" metrics are over the on-policy loss tokens
        metrics = {"policy/loss": pl, "policy/entropy_sum": jnp.sum(jnp.where(mp > 0, entropy, 0.0)), "ntok": ntok,
                   **{f"policy/{k}_sum": v * ntok for k, v in pm.items() if k not in ("ratio_min", "ratio_max")},
                   "policy/ratio_min": pm["ratio_min"], "policy/ratio_max": pm["ratio_max"]}
        if divergence is not None:  # over every loss token, supervised rows too: micro-batch shares add up
            metrics["distill/jsd"] = jnp.sum(jnp.where(m > 0, divergence, 0.0)) / den["tokens"]
        if self.nll_coef > 0:
            nll = -jnp.sum(jnp.where(self._nll_mask(mb) > 0, logp, 0.0)) / den["nll"]
            loss = loss + self.nll_coef * nll
            metrics["policy/nll"] = nll  # micro-batch shares of the step's NLL: they add up
        return loss, metrics

    @property
    def uses_router(self) -> bool:
        """Whether the update's forward returns the MoE router's sums (a router loss is on)."""
        return self.router_aux_coef > 0 or self.router_z_coef > 0

    def router_loss(self, stats, top_k, mb, den):
        """aux_coef * load-balancing loss + z_coef * z-loss of one micro-batch (rl/router.py), weighted by
        its share of the step's loss tokens (every row is routed, supervised ones too) so that micro-batches
        add up to their token-weighted mean (with one micro-batch: the loss itself), and its metrics
        (weighted alike, the load max an extreme)."""
        balance, z, m = router_losses(stats, top_k)
        share = jnp.sum(mb["loss_mask"]) / den["tokens"]
        loss = (self.router_aux_coef * balance + self.router_z_coef * z) * share
        metrics = {k: v * share for k, v in m.items() if k != "moe/expert_load_max"}
        return loss, {**metrics, "moe/expert_load_max": m["moe/expert_load_max"]}

    def value_loss(self, values, mb, den):
        """Clipped value loss of one micro-batch (token-mean over the step's loss tokens) and metrics. The
        explained variance is returned as additive parts (`value/ev_parts`): micro-batches add them and
        `explained_variance` finishes it over the whole minibatch (a ratio of variances does not average)."""
        mask = on_policy(mb, mb["loss_mask"])  # a supervised row has no return of the policy's
        vl, vm = value_loss(values, mb["old_values"], mb["returns"], mask, clip=self.value_clip,
                            aggregate="token-mean", denominator=den["value"])
        ntok = jnp.sum(mask)
        return vl, {"value/loss": vl, **{f"value/{k}_sum": v * ntok for k, v in vm.items() if k != "explained_var"},
                    "value/ev_parts": explained_variance_parts(values, mb["returns"], mask)}


def explained_variance_parts(values, returns, mask):
    """(5,) float32 additive parts of 1 − Var(R−V)/Var(R) over the mask's tokens: [n, ΣR, ΣR², Σe, Σe²]
    with e = R − V. values, returns, mask: (n,T)."""
    m = (mask > 0).astype(jnp.float32)
    r = jnp.where(m > 0, returns.astype(jnp.float32), 0.0)
    e = jnp.where(m > 0, r - values.astype(jnp.float32), 0.0)
    return lax.stop_gradient(jnp.stack([jnp.sum(m), jnp.sum(r), jnp.sum(r * r), jnp.sum(e), jnp.sum(e * e)]))


def explained_variance(parts):
    """1 − Var(R−V)/Var(R) from the summed `explained_variance_parts` (0 when Var(R) = 0 or no token)."""
    n = jnp.maximum(parts[0], 1.0)
    var_r = jnp.maximum(parts[2] / n - jnp.square(parts[1] / n), 0.0)
    var_e = jnp.maximum(parts[4] / n - jnp.square(parts[3] / n), 0.0)
    return jnp.where(var_r > 0, 1.0 - var_e / jnp.where(var_r > 0, var_r, 1.0), 0.0)
