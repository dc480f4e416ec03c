"""The router's losses of a mixture-of-experts policy and their metrics, from per-layer sums.

Input: `stats`, the per-layer sums of models/moe.py `router_stats` stacked over the L sparse layers:
`probs` (L,E) router probabilities, `counts` (L,E) computed (token, expert) pairs, `z` (L,) of
logsumexp(router logits)^2, `tokens` (L,) real tokens. The tokens are those the forward was given as
real: in the trainer, a micro-batch's completion tokens (prompt tokens are excluded: each prompt is
computed once for its G completions, and its routing is not what the step trains), padding never.

  load-balancing loss (Switch / Mixtral, as transformers' `load_balancing_loss_func`): pooled over the
      layers and tokens, E * sum_e f_e * P_e with f_e = counts_e / (L*T) (a token's k pairs each count,
      so sum_e f_e = k) and P_e = probs_e / (L*T): k when perfectly balanced. Its gradient reaches
      the router through P only; f is a count. Under routing replay the counts are those of the replayed
      experts -- the ones the forward actually computed -- and P this pass's probabilities.
  z-loss (ST-MoE): the mean over (layer, token) of logsumexp(router logits)^2.

Metrics: `moe/load_balance` (the load-balancing loss), `moe/z_loss`, `moe/expert_load_max` (the largest
share of one layer's computed pairs that one expert took, times E: 1 = uniform, E = all on one expert;
the max over layers), `moe/drop_frac` (the fraction of the k pairs per real token that were not computed:
0 for our dropless experts, measured from the counts).
"""
from __future__ import annotations

import jax.numpy as jnp


def router_losses(stats: dict, top_k: int) -> tuple[jnp.ndarray, jnp.ndarray, dict]:
    """(load-balancing loss (), z-loss (), metrics) of one forward's per-layer router sums `stats`."""
    probs, counts = stats["probs"], stats["counts"]
    num_experts = probs.shape[-1]
    total = jnp.maximum(jnp.sum(stats["tokens"]), 1.0)  # L*T (no real token: every sum is 0, the losses 0)
    f = jnp.sum(counts, axis=0) / total
    p = jnp.sum(probs, axis=0) / total
    balance = num_experts * jnp.sum(f * p)
    z = jnp.sum(stats["z"]) / total
    computed = jnp.sum(counts, axis=-1)  # (L,)
    load_max = jnp.max(jnp.max(counts, axis=-1) / jnp.maximum(computed, 1.0)) * num_experts
    drop = 1.0 - jnp.sum(computed) / jnp.maximum(top_k * jnp.sum(stats["tokens"]), 1.0)
    drop = jnp.where(jnp.sum(stats["tokens"]) > 0, drop, 0.0)
    return balance, z, {"moe/load_balance": balance, "moe/z_loss": z, "moe/expert_load_max": load_max,
                        "moe/drop_frac": drop}
