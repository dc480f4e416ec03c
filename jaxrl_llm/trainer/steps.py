"""The jitted functions of one RL step, built once per (objective, plan, model, mesh, state layout).

  score(state, ref_params, batch[, pack, base, teacher]) -> reference log-probs, old values [and V(s_T)],
                                      recomputed proximal log-probs, the teacher's log-probs, each (N,T)
  prepare(batch, kl_coef)          -> rollout correction and advantages: new batch fields, statistics
                                      (`Objective.prepare`)
  update(state, batch, prompts[, pack, base, teacher]) -> state after one optimizer step on those prompts' rows, metrics
  update_value(state, batch, prompts[, pack]) -> the same step for the value model alone (VAPO's pretraining)
  refresh_ref(ref, policy)         -> the mixed reference

The math is the `Objective`'s; this module adds the model forwards, the micro-batching, the optimizer
and the NaN guard. `pack` (train.pack_length > 0) is the packing plans of the score chunks or of the
update's micro-batches (trainer/packs.py): the forwards then run on packed rows (models/packing.py).
With LoRA, `base` is the frozen base the trained `state.params` (the adapters) are joined to
(models/lora.py), and `ref_params` is that base itself. `teacher` is the distillation teacher's frozen
parameters (trainer/teacher.py; its ModelConfig `tmc` is the builders'), None without one.
Batch shapes: B prompts, G rows each (N = B*G), P prompt tokens, T completion tokens.
"""
from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxrl_llm import sharding
from jaxrl_llm.compile_options import jit
from jaxrl_llm.models import ModelConfig, completion_hidden, logprobs_from_hidden, lora, value_head
from jaxrl_llm.models.transformer import lm_head_weight
from jaxrl_llm.models.packing import (completion_extent, lm_head_rows, pack_layout, packed_hidden, packed_logprobs,
                                      packed_values)
from jaxrl_llm.models.skip import skip_columns
from jaxrl_llm.rl import Objective, generalized_jsd
from jaxrl_llm.rl.objective import explained_variance
from jaxrl_llm.trainer.microbatches import only_present, row_batch, rows_per_micro, score_by_tokens, strided_rows
from jaxrl_llm.trainer.state import UpdatePlan
from jaxrl_llm.trainer.teacher import shared_vocab

# combined by min/max, not summed; the last only with a MoE router loss
_EXTREMES = ("policy/ratio_min", "policy/ratio_max", "logp_diff_max", "moe/expert_load_max")


@flax.struct.dataclass
class StepFunctions:
    score: Any = flax.struct.field(pytree_node=False)
    prepare: Any = flax.struct.field(pytree_node=False)
    update: Any = flax.struct.field(pytree_node=False)
    update_value: Any = flax.struct.field(pytree_node=False)
    refresh_ref: Any = flax.struct.field(pytree_node=False)


def minibatch(b: dict, pidx: jax.Array, group_size: int) -> dict:
    """The rows of prompts `pidx` (whole groups, so prompts stay shared in the forward pass)."""
    rows = (pidx[:, None] * group_size + jnp.arange(group_size)[None]).reshape(-1)
    return {k: v[pidx] if k in ("prompt_tokens", "prompt_mask", "prompt_routes") else v[rows]
            for k, v in b.items() if v is not None}


def attended(b):
    """The completion tokens a forward attends to: `attention_mask` (multi-turn rows: the environment's
    tokens too, which are context, never trained) or, single-turn, `mask`."""
    return b.get("attention_mask", b["mask"])


def without_routes(b):
    """The batch without the sampler's recorded MoE routes: a teacher (another model) routes its own tokens."""
    return {k: v for k, v in b.items() if k not in ("routes", "prompt_routes")}


def _layers_first(routes):
    """MoE routing replay: a batch's routes (rows, tokens, L, k) as the Decoder takes them, (L, rows, tokens, k);
    None (no routes: a dense model, or replay off) stays None."""
    return None if routes is None else routes.transpose(2, 0, 1, 3)


def logp_of(mc: ModelConfig, params, b, temperature, with_entropy=False, pack=None, pack_length=0,
            dropout_rng=None, router_stats=False):
    """Log-probs (N,T) [and entropies] of the batch's completions under `params`; through packed rows
    when a packing plan is given (models/packing.py: equal on real tokens, 0 on padding).
    dropout_rng: a key for LoRA dropout (the update only). router_stats: MoE, also the router's per-layer
    sums over the attended completion tokens (models/moe.py; unpacked only), last in the tuple."""
    if pack is not None:
        return packed_logprobs(mc, params, b["prompt_tokens"], b["prompt_mask"], b["tokens"], attended(b), pack,
                               pack_length, temperature, with_entropy=with_entropy, dropout_rng=dropout_rng,
                               prompt_routes=b.get("prompt_routes"), routes=b.get("routes"))
    hidden = completion_hidden(mc, params, b["prompt_tokens"], b["prompt_mask"], b["tokens"], attended(b),
                               dropout_rng, prompt_routes=_layers_first(b.get("prompt_routes")),
                               routes=_layers_first(b.get("routes")), router_stats=router_stats)
    hidden, stats = hidden if router_stats else (hidden, None)
    out = logprobs_from_hidden(mc, params, hidden, b["tokens"], temperature, with_entropy=with_entropy)
    if not router_stats:
        return out
    return (*out, stats) if with_entropy else (out, stats)  # a bare (N,T) array is not unpacked by rows


def values_of(mc: ModelConfig, vparams, b, pack=None, pack_length=0, last=False):
    """Values (N,T) of the batch's completion tokens [(N,T+1) with `last`: column T is V(s_T), the
    state after the row's last real (attended) token, which is column T−1's token only on a row that
    fills all T: a multi-turn episode cut because its next observation did not fit ends earlier];
    through packed rows when a packing plan is given."""
    if pack is not None:
        return packed_values(mc, vparams, b["prompt_tokens"], b["prompt_mask"], b["tokens"], attended(b), pack,
                             pack_length, lambda h: value_head(mc, vparams, h), last=last)
    if not last:
        hidden = completion_hidden(mc, vparams["backbone"], b["prompt_tokens"], b["prompt_mask"], b["tokens"],
                                   attended(b))
        return value_head(mc, vparams, hidden)
    # One more column, so that a row filling all T has the state after its last token (the dummy token fed
    # at T is seen by no earlier position); column `extent` is then the state after each row's last real
    # token, whose causal hidden state no padding after it changes.
    extent = completion_extent(attended(b))  # (N,)
    pad = lambda x, v: jnp.pad(x, ((0, 0), (0, 1)), constant_values=v)
    hidden = completion_hidden(mc, vparams["backbone"], b["prompt_tokens"], b["prompt_mask"], pad(b["tokens"], 0),
                               pad(attended(b), 1))
    values = value_head(mc, vparams, hidden)  # (N,T+1)
    after_last = jnp.take_along_axis(values, extent[:, None], axis=1)[:, 0]
    return values.at[:, -1].set(jnp.where(extent > 0, after_last, 0.0))  # no token: 0, as packed


def gkd_divergence(mc: ModelConfig, tmc: ModelConfig, objective: Objective, policy, teacher, b, temperature,
                   dropout_rng=None, pack=None, pack_length=0, router_stats=False):
    """(log-probs (n,T), entropies (n,T), generalized JSD (n,T) [, MoE router sums]) of the student `policy`
    on the batch's completions, the divergence to the teacher over the shared vocabulary in chunks
    (rl/distill.py; trainer/teacher.shared_vocab: the first min(V_s, V_t) ids). With a
    packing plan both models read the same packed rows (models/packing.py) and the three are unpacked to
    the completion layout: equal on every real completion token, 0 elsewhere (no router sums: validation
    refuses a router loss with packing)."""
    jsd_with = functools.partial(generalized_jsd, beta=objective.distill_beta, chunk=objective.distill_chunk,
                                 dtype=jnp.dtype(mc.dtype), teacher_dtype=jnp.dtype(tmc.dtype),
                                 vocab=shared_vocab(mc, tmc))
    jsd = lambda h, th: jsd_with(h, lm_head_weight(mc, policy), jax.lax.stop_gradient(th),
                                 lm_head_weight(tmc, teacher), temperature=temperature)
    if pack is not None:
        packed, source, valid = pack_layout(b["prompt_tokens"], b["prompt_mask"], b["tokens"], attended(b), pack,
                                            pack_length, prompt_routes=b.get("prompt_routes"), routes=b.get("routes"))
        hidden = packed_hidden(mc, policy, packed, dropout_rng)  # (R,L,D): the slots (MoE: the sampler's routes)
        packed = {k: v for k, v in packed.items() if k != "routes"}  # the teacher routes its own tokens
        targets = jnp.roll(packed["tokens"], -1, axis=1)  # the token each slot predicts
        take, back, head = lm_head_rows(pack, attended(b), source, valid)  # [the slots that predict a token only]
        hidden, targets, teacher_hidden = take(hidden), take(targets), take(packed_hidden(tmc, teacher, packed))
        logp, ent = logprobs_from_hidden(mc, policy, hidden, targets, temperature, with_entropy=True, **head)
        if head:  # the divergence skips the chunks past the last predictor too
            div = skip_columns(lambda w, h, th, fixed: jsd_with(h, w, th, fixed[0], temperature=fixed[1]),
                               lm_head_weight(mc, policy), hidden, teacher_hidden,
                               (lm_head_weight(tmc, teacher), jnp.asarray(temperature, jnp.float32)), **head)
        else:
            div = jsd(hidden, teacher_hidden)
        return tuple(back(x) for x in (logp, ent, div))
    hidden = completion_hidden(mc, policy, b["prompt_tokens"], b["prompt_mask"], b["tokens"], attended(b),
                               dropout_rng, prompt_routes=_layers_first(b.get("prompt_routes")),
                               routes=_layers_first(b.get("routes")), router_stats=router_stats)
    hidden, stats = hidden if router_stats else (hidden, None)
    logp, ent = logprobs_from_hidden(mc, policy, hidden, b["tokens"], temperature, with_entropy=True)
    t_hidden = completion_hidden(tmc, teacher, b["prompt_tokens"], b["prompt_mask"], b["tokens"], attended(b))
    div = jsd(hidden, t_hidden)
    return (logp, ent, div, stats) if router_stats else (logp, ent, div)


def make_score(objective: Objective, plan: UpdatePlan, mc: ModelConfig, tmc: ModelConfig | None = None,
               row_shards: int = 1):
    def score_chunk(state, ref_params, b, pack, base, teacher):
        out, packing = {}, {"pack": pack, "pack_length": plan.pack_length}
        if objective.uses_ref:
            out["ref_logp"] = logp_of(mc, ref_params, b, plan.temperature, **packing)
        if objective.uses_teacher:  # the teacher reads the student's token ids, routing them itself (MoE)
            out["teacher_logp"] = jnp.where(b["mask"] > 0, logp_of(tmc, teacher, without_routes(b), plan.temperature,
                                                                   **packing), 0.0)
        if objective.value and objective.bootstrap_truncated:
            values = values_of(mc, state.value_params, b, last=True, **packing)
            out["old_values"] = jnp.where(b["mask"] > 0, values[:, :-1], 0.0)
            out["last_values"] = jnp.where(b["truncated"] > 0, values[:, -1], 0.0)
        elif objective.value:
            out["old_values"] = jnp.where(b["mask"] > 0, values_of(mc, state.value_params, b, **packing), 0.0)
        if plan.recompute_logprobs:
            policy = lora.join(base, state.params)
            out["old_logp"] = jnp.where(b["mask"] > 0, logp_of(mc, policy, b, plan.temperature, **packing), 0.0)
        return out

    def score(state, ref_params, b, pack=None, base=None, teacher=None):
        """Each output (N,T), computed `plan.score_chunks` groups of prompts at a time. Chunk j holds
        prompts j, j+k, j+2k.. (k chunks): strided, so every data shard contributes to every chunk.
        `pack`: None, or the chunks' packing plans (leading axis k; trainer/packs.py). With a token budget
        (plan.microbatch_tokens), chunks of rows by tokens instead (`score_by_tokens`)."""
        if plan.microbatch_tokens:
            return score_by_tokens(lambda sub, pk: score_chunk(state, ref_params, sub, pk, base, teacher), plan,
                                   row_shards, b, pack)
        k, G = plan.score_chunks, plan.group_size
        if k == 1:
            return score_chunk(state, ref_params, b, None if pack is None else jax.tree_util.tree_map(lambda x: x[0], pack),
                               base, teacher)
        n_prompts = b["prompt_tokens"].shape[0]
        chunks = jnp.arange(n_prompts).reshape(-1, k).T  # (k, B/k): chunk j = j, j+k, ...
        outs = jax.lax.map(lambda xs: score_chunk(state, ref_params, minibatch(b, xs[0], G), xs[1], base, teacher),
                           (chunks, pack))
        # (k, B/k*G, ...) -> (B/k, k, G, ...) -> (N, ...): prompt i*k + j is row block (i, j).
        return {name: x.reshape(k, n_prompts // k, G, *x.shape[2:]).swapaxes(0, 1).reshape(n_prompts * G, *x.shape[2:])
                for name, x in outs.items()}
    return score


def micro_batch_loss(objective: Objective, plan: UpdatePlan, mc: ModelConfig, tmc: ModelConfig | None, router: bool,
                     params, vparams, kl_coef, mb, den, pack, base, teacher, dropout_rng):
    """(loss, metrics) of one micro-batch `mb`: policy (+ value) [+ router] loss, normalized by the whole
    minibatch's denominators `den`, and `logp_diff_max` (trainer against sampler on the scored rows)."""
    packing, div, stats = {"pack": pack, "pack_length": plan.pack_length}, None, ()
    # router sums come unpacked only (validation refuses a router loss with packing)
    if objective.distill == "gkd":
        logp, ent, div, *stats = gkd_divergence(mc, tmc, objective, lora.join(base, params), teacher, mb,
                                                plan.temperature, dropout_rng, router_stats=router, **packing)
    else:
        logp, ent, *stats = logp_of(mc, lora.join(base, params), mb, plan.temperature, with_entropy=True,
                                    dropout_rng=dropout_rng, router_stats=router, **packing)
    loss, aux = objective.policy_loss(logp, ent, mb, kl_coef, den, divergence=div)
    if stats:
        rl_, raux = objective.router_loss(stats[0], mc.num_experts_per_tok, mb, den)
        loss, aux = loss + rl_, {**aux, **raux}
    seen = mb["mask"] * mb["seen_rows"][:, None] if "seen_rows" in mb else mb["mask"]  # unscored rows: logp 0
    aux["logp_diff_max"] = jnp.max(jnp.where(seen > 0, jnp.abs(logp - mb["sampler_logp"]), 0.0))
    if objective.value:
        vl, vaux = objective.value_loss(values_of(mc, vparams, mb, **packing), mb, den)
        loss, aux = loss + vl, {**aux, **vaux}
    return loss, aux


def micro_inputs(plan: UpdatePlan, b, mb, pidx, pack, row_shards: int):
    """(xs, select): the micro-batches of the minibatch `mb` (the prompts `pidx` of `b`) as arrays with a
    leading micro-batch axis, and select(x) -> (its batch, its packing plan or None, its LoRA dropout
    index). grad_accum: whole groups of prompts; a token budget: rows (trainer/microbatches.py)."""
    G = plan.group_size
    if not plan.microbatch_tokens:
        return (pidx.reshape(plan.grad_accum, -1), pack), lambda x: (minibatch(b, x[0], G), x[1], x[0][0])
    if pack is not None:  # the plans' rows index the minibatch's; a row is in the micro-batch that packed it
        index = jnp.arange(pack["row"].shape[0])
        return (pack, index), lambda x: (only_present(mb, x[0]["row"] >= 0), x[0], x[1])
    n = mb["tokens"].shape[0]
    r = rows_per_micro(plan.microbatch_tokens, mb["prompt_tokens"].shape[1] + mb["tokens"].shape[1], row_shards, n)
    idx, present = strided_rows(n, r)
    xs = (jnp.asarray(idx), jnp.asarray(present), jnp.arange(len(idx)))
    return xs, lambda x: (row_batch(mb, x[0], x[1], G), None, x[2])


def accumulate(objective: Objective, plan: UpdatePlan, mc: ModelConfig, loss_fn, train_policy: bool, state, b, pidx,
               pack, base, teacher, row_shards: int = 1):
    """((loss, gradients, summed metrics), extremes (M,) each, empty) of the prompts `pidx`: `loss_fn`
    (`micro_batch_loss`'s arguments from params on) over M micro-batches (`micro_inputs`: grad_accum, or a
    token budget), each normalized by the whole minibatch's denominators, so that the sums are the
    minibatch's; `empty` when the minibatch has no loss token. `pack`: None, or the micro-batches' packing
    plans (leading axis M)."""
    mb = minibatch(b, pidx, plan.group_size)
    den = objective.denominators(mb)
    # Value pretraining differentiates the value parameters alone: the policy's backward is skipped.
    grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1) if train_policy else (1,), has_aux=True)
    micro, select = micro_inputs(plan, b, mb, pidx, pack, row_shards)

    def one(xs):
        sub, pk, index = select(xs)
        # LoRA dropout: a key per micro-batch (its first prompt, or its index) and optimizer step; None when off.
        key = jax.random.fold_in(jax.random.fold_in(state.rng, state.opt_step), index) if mc.lora_dropout else None
        (loss, aux), grads = grad_fn(state.params, state.value_params, state.kl.value, sub, den, pk, base, teacher,
                                     key)
        summed = {k: v for k, v in aux.items() if k not in _EXTREMES}
        return (loss, grads, summed), {k: aux[k] for k in _EXTREMES if k in aux}

    acc, extremes = one(jax.tree_util.tree_map(lambda x: x[0], micro))
    if jax.tree_util.tree_leaves(micro)[0].shape[0] > 1:
        def body(acc, xs):
            out, ext = one(xs)
            return jax.tree_util.tree_map(jnp.add, acc, out), ext
        acc, more = jax.lax.scan(body, acc, jax.tree_util.tree_map(lambda x: x[1:], micro))
        extremes = jax.tree_util.tree_map(lambda a, m: jnp.concatenate([a[None], m]), extremes, more)
    return acc, extremes, jnp.sum(mb["loss_mask"]) == 0


def apply_if(ok, tx, value_tx, train_policy: bool, with_value: bool, state, g, vg):
    """(params, opt_state, value_params, value_opt_state) after one optimizer step of the policy (when
    train_policy) and of the value model (when with_value) with gradients g, vg, when `ok`; as they are
    otherwise. A conditional, not a select of new and old values: with the select XLA computed the new
    parameters from the old moments after updating them in place, so it copied both moments first (two
    parameter-sized temporaries: the update's temporaries at Qwen2.5-0.5B's shape 5.07 -> 3.68 GiB)."""
    def step(trained):
        params, opt_state, value_params, value_opt_state = trained
        if train_policy:
            updates, opt_state = tx.update(g, opt_state, params)
            params = optax.apply_updates(params, updates)
        if with_value:
            vupdates, value_opt_state = value_tx.update(vg, value_opt_state, value_params)
            value_params = optax.apply_updates(value_params, vupdates)
        return params, opt_state, value_params, value_opt_state

    trained = (state.params, state.opt_state, state.value_params, state.value_opt_state)
    return jax.lax.cond(ok, step, lambda t: t, trained)


def step_metrics(aux: dict, extremes: dict, gnorm, finite, empty, lr, nonfinite) -> dict:
    """The step's metrics: `aux`'s token-weighted sums ("<name>_sum") back to per-token means over its
    `ntok`, the other entries as they are, the extremes over the micro-batches, and the step's own figures."""
    metrics = {}
    if "value/ev_parts" in aux:  # over the whole minibatch, whatever grad_accum
        metrics["value/explained_var"] = explained_variance(aux.pop("value/ev_parts"))
    ntok = jnp.maximum(aux.pop("ntok"), 1.0)
    for k, v in aux.items():
        metrics[k[:-4] if k.endswith("_sum") else k] = v / ntok if k.endswith("_sum") else v
    rmin, rmax, diff = (extremes.pop(k) for k in _EXTREMES[:3])
    metrics.update({"policy/grad_norm": gnorm, "policy/ratio_min": jnp.min(rmin), "policy/ratio_max": jnp.max(rmax),
                    "sampler/logp_diff_max": jnp.max(diff), "lr": lr,
                    "train/skipped_updates": (~finite & ~empty).astype(jnp.float32),
                    "train/empty_updates": empty.astype(jnp.float32),
                    "train/nonfinite_streak": nonfinite.astype(jnp.float32),
                    **{k: jnp.max(v) for k, v in extremes.items()}})  # the MoE load max
    return metrics


def make_update(objective: Objective, plan: UpdatePlan, mc: ModelConfig, train_policy: bool = True,
                tmc: ModelConfig | None = None, row_shards: int = 1):
    """The update step; with train_policy=False the policy (and its optimizer and schedule) stays as is
    and only the value model learns (VAPO's value pretraining)."""
    router = objective.uses_router and train_policy  # MoE router losses (rl/router.py)
    if router and not mc.num_experts:
        raise ValueError("model.router_aux_loss_coef / router_z_loss_coef > 0 need a mixture-of-experts model "
                         f"(model_type {mc.model_type} has no experts); expected 0")
    tx, schedule = plan.optimizer.build()
    value_tx, _ = plan.value_optimizer.build()
    loss_fn = functools.partial(micro_batch_loss, objective, plan, mc, tmc, router)

    def update(state, b, pidx, pack=None, base=None, teacher=None):
        """One optimizer step on the prompts `pidx`; skipped whole when the loss or a gradient is not finite
        (counted towards train.max_nonfinite_steps) or when the minibatch has no loss token (an empty
        update: DAPO kept no group, every row masked; it carries no gradient, and even a zero gradient
        would move AdamW's moments and weight decay, so nothing changes and nothing is counted).
        `pack`: None (unpacked), or the packing plans of its micro-batches (trainer/packs.py)."""
        (loss, grads, aux), extremes, empty = accumulate(objective, plan, mc, loss_fn, train_policy, state, b, pidx,
                                                         pack, base, teacher, row_shards)
        (g, vg) = grads if train_policy else (None, grads[0])
        gnorm = optax.global_norm(g) if train_policy else jnp.float32(0.0)
        finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        value_norm = {}
        if objective.value:
            value_norm["value/grad_norm"] = optax.global_norm(vg)
            finite = finite & jnp.isfinite(value_norm["value/grad_norm"])
        ok = finite & ~empty
        params, opt_state, value_params, value_opt_state = apply_if(ok, tx, value_tx, train_policy, objective.value,
                                                                    state, g, vg)
        new_state = state.replace(
            params=params, opt_state=opt_state, value_params=value_params, value_opt_state=value_opt_state,
            opt_step=state.opt_step + (ok & train_policy).astype(jnp.int32),
            nonfinite=jnp.where(empty, state.nonfinite, jnp.where(finite, 0, state.nonfinite + 1)))
        metrics = step_metrics(aux, extremes, gnorm, finite, empty, schedule(state.opt_step), new_state.nonfinite)
        return new_state, {**value_norm, **metrics}
    return update


@functools.lru_cache(maxsize=16)
def step_functions(objective: Objective, plan: UpdatePlan, mc: ModelConfig, mesh, state_treedef,
                   state_sharding_leaves, tmc: ModelConfig | None = None) -> StepFunctions:
    """Cached on its (hashable) arguments, so a resumed or repeated run in the same process reuses the
    compiled programs."""
    state_shardings = jax.tree_util.tree_unflatten(state_treedef, state_sharding_leaves)
    alpha, shards = plan.ref_mix_alpha, sharding.row_shards(mesh)
    out_shardings = (state_shardings, sharding.replicated(mesh))
    jit_update = lambda train_policy: jit(make_update(objective, plan, mc, train_policy, tmc, shards),
                                          donate_argnums=(0,), out_shardings=out_shardings)
    return StepFunctions(
        score=jit(make_score(objective, plan, mc, tmc, shards)), prepare=jit(objective.prepare),
        update=jit_update(True), update_value=jit_update(False) if objective.value else None,
        refresh_ref=jit(lambda ref, p: jax.tree_util.tree_map(lambda r, q: (1 - alpha) * r + alpha * q, ref, p),
                        donate_argnums=(0,)))
