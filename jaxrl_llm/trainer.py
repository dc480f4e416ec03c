"""The RL loop (DESIGN section 1), top to bottom:

  setup      mesh -> tokenizer + policy/reference/value parameters on that mesh -> optimizers -> data
             -> rewards -> checkpoint restore (exact resume) -> metric sinks
  each step  sample G completions per prompt (prefill once, decode with a KV cache, reading the policy
             parameters in place) -> rewards on the host -> [DAPO: drop groups with equal rewards and
             resample] -> reference log-probs, old values -> advantages -> E epochs x M minibatches of
             the jitted, state-donating update -> metrics, samples, checkpoint
  end        final checkpoint, Hugging Face export with the tokenizer, PNG of the curves, DONE marker

An algorithm is a preset of config fields (jaxrl_llm/config.py), never a subclass: the estimator and the
surrogate are chosen by strings that select pure functions of `jaxrl_llm.rl`.
Shapes: B prompts, G completions per prompt, N = B*G rows (prompt b owns rows b*G..b*G+G-1), P prompt
tokens (left-padded), T completion tokens (right-padded).
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from etils import epath

from jaxrl_llm import config as config_lib
from jaxrl_llm import distributed as dist
from jaxrl_llm import faults, fs
from jaxrl_llm import metrics as metrics_lib
from jaxrl_llm import rl, sharding
from jaxrl_llm.checkpoint import Checkpointer, abstract_like
from jaxrl_llm.data import iterator_from_config, load_prompt_dataset, load_tokenizer, pad_prompt_batch
from jaxrl_llm.data import prepare_prompts
from jaxrl_llm.data.tasks import load_task
from jaxrl_llm.models import (ModelConfig, completion_hidden, init_params, init_value_params, load_hf,
                              load_hf_value, logprobs_from_hidden, param_logical_axes, save_hf, value_head,
                              value_logical_axes)
from jaxrl_llm.models.config import config_to_hf_dict, read_hf_config
from jaxrl_llm.rewards import compute_rewards, get_reward_fn
from jaxrl_llm.sampling import generate

log = logging.getLogger(__name__)

# Fields that may change between a run and its resumption (they do not change what is computed; the
# mesh only changes float rounding: a checkpoint restores onto any mesh).
RESUMABLE_FIELDS = ("total_steps", "force_new", "checkpoint", "log", "export", "mesh")


# ============================================================================================ state
@flax.struct.dataclass
class TrainState:
    """Everything a step changes; checkpointed whole. Optional parts are None when unused."""

    step: jax.Array  # RL iterations done
    opt_step: jax.Array  # optimizer updates done (drives the lr schedule)
    rng: jax.Array  # split every step: same seed + config = same run
    params: Any  # policy
    opt_state: Any
    ref_params: Any  # reference, only when it is refreshed during the run (else frozen outside)
    value_params: Any  # PPO value model
    value_opt_state: Any
    kl: Any  # KL controller (fixed or adaptive) holding beta
    nonfinite: jax.Array  # consecutive updates skipped for NaN/inf


# ============================================================================================ setup
def make_optimizer(o: ml_collections.ConfigDict, learning_rate: float, total_updates: int):
    """AdamW with linear warmup then constant/cosine/linear decay, after global-norm clipping."""
    decay_steps = max(1, total_updates - o.warmup_steps)
    end = learning_rate * o.min_lr_ratio
    after = {"constant": optax.constant_schedule(learning_rate),
             "cosine": optax.cosine_decay_schedule(learning_rate, decay_steps, alpha=o.min_lr_ratio),
             "linear": optax.linear_schedule(learning_rate, end, decay_steps)}[o.schedule]
    schedule = after if o.warmup_steps == 0 else optax.join_schedules(
        [optax.linear_schedule(0.0, learning_rate, o.warmup_steps), after], [o.warmup_steps])
    chain = [optax.clip_by_global_norm(o.max_grad_norm)] if o.max_grad_norm > 0 else []
    chain.append(optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay))
    return optax.chain(*chain), schedule


def resolve_model_path(path: str) -> str:
    """A local directory as is; otherwise a hub name, downloaded (weights, configs, tokenizer) once."""
    if os.path.isdir(path):
        return path
    if path.startswith(("/", ".", "~")) or os.path.exists(path):
        raise FileNotFoundError(f"model.path {path!r} is not a directory")
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(path, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
    except Exception as e:
        raise FileNotFoundError(f"model.path {path!r} is neither a local directory nor a downloadable hub model "
                                f"({' '.join(str(e).split())[:160]})") from None


def eos_ids_of(model_path: str, tokenizer, mc: ModelConfig) -> tuple[int, ...]:
    """Every id that ends a completion: the tokenizer's EOS, config.json's and generation_config.json's."""
    ids = set(mc.eos_token_id)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = os.path.join(model_path, "generation_config.json") if model_path else ""
    if gen and os.path.isfile(gen):
        with open(gen, encoding="utf-8") as f:
            e = json.load(f).get("eos_token_id")
        ids.update([e] if isinstance(e, int) else (e or []))
    if not ids:
        raise ValueError("the tokenizer has no EOS token and the model config names none; completions could never end")
    return tuple(sorted(ids))


def builtin_model_config(c: ml_collections.ConfigDict, tokenizer) -> ModelConfig:
    m = c.model
    return ModelConfig(model_type="llama", vocab_size=len(tokenizer), hidden_size=m.hidden_size,
                       intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
                       num_kv_heads=m.num_kv_heads, head_dim=m.hidden_size // m.num_heads,
                       max_position_embeddings=m.max_position_embeddings, tie_word_embeddings=True,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=(tokenizer.eos_token_id,),
                       pad_token_id=tokenizer.pad_token_id, param_dtype=m.dtype, dtype=m.compute_dtype,
                       remat=m.remat, logits_chunk=m.logits_chunk)


def load_dataset_for(c: ml_collections.ConfigDict, tokenizer):
    if c.data.task:
        raw = load_task(c.data.task, c.data.task_rows, c.seed, tuple(c.data.task_weights))
        return prepare_prompts(raw, c.data, tokenizer)
    return load_prompt_dataset(c.data, tokenizer)


def check_workdir(workdir: str, resolved: ml_collections.ConfigDict) -> None:
    """Refuses a workdir holding a run with an incompatible config (unless force_new: then it is moved
    aside to <workdir>/replaced-<time>/, never deleted)."""
    path = epath.Path(workdir) / "config.json"
    if not path.is_file():
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # hand-edited or damaged (the trainer writes it atomically)
        raise ValueError(f"workdir {workdir}: config.json is not valid JSON ({e}); restore it, or use "
                         "another workdir") from None
    new = json.loads(resolved.to_json())
    diff = sorted(k for k in set(old) | set(new) if k not in RESUMABLE_FIELDS and old.get(k) != new.get(k))
    if not diff:
        return
    if not resolved.force_new:
        detail = _first_difference(old, new, diff[0])
        raise ValueError(f"workdir {workdir} holds a run with another config ({detail}); use another workdir "
                         "or --config.force_new=True to start afresh (the old run is kept aside)")
    if dist.is_main():
        aside = epath.Path(workdir) / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.mkdir(parents=True)
        for entry in epath.Path(workdir).iterdir():
            if not entry.name.startswith("replaced-"):
                entry.rename(aside / entry.name)
    dist.sync("force_new")


def _first_difference(old, new, key, prefix=""):
    a, b = old.get(key), new.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a, b, k, f"{prefix}{key}.")
    return f"{prefix}{key}: {a!r} there, {b!r} now"


# ============================================================================ jitted step functions
@flax.struct.dataclass
class StepFunctions:
    score: Any = flax.struct.field(pytree_node=False)  # (state, ref_params, batch) -> ref log-probs, old values
    advantages: Any = flax.struct.field(pytree_node=False)  # (batch, beta) -> advantages, returns, KL stats
    update: Any = flax.struct.field(pytree_node=False)  # (state, batch, prompt indices) -> state, metrics
    refresh_ref: Any = flax.struct.field(pytree_node=False)  # (ref, policy) -> mixed reference


@functools.lru_cache(maxsize=16)
def step_functions(config_json: str, total_updates: int, mc: ModelConfig, mesh, state_treedef,
                   state_sharding_leaves) -> StepFunctions:
    """The jitted functions of one step, built once per (config, model, mesh, state layout) so that a
    resumed or repeated run in the same process reuses the compiled programs. `config_json` leaves
    out the fields that do not change what is computed (see `_compute_key`)."""
    c = ml_collections.ConfigDict(json.loads(config_json))
    uses_ref = c.kl.coef > 0
    tx, schedule = make_optimizer(c.optimizer, c.optimizer.learning_rate, total_updates)
    value_tx, _ = make_optimizer(c.optimizer, c.value.learning_rate, total_updates)
    G = c.rollout.group_size
    temperature = c.rollout.temperature
    mode, norm_length = c.loss.aggregate, c.loss.norm_length

    def logp_of(params, b, with_entropy=False):
        hidden = completion_hidden(mc, params, b["prompt_tokens"], b["prompt_mask"], b["tokens"], b["mask"])
        return logprobs_from_hidden(mc, params, hidden, b["tokens"], temperature, with_entropy=with_entropy)

    def values_of(vparams, b):
        hidden = completion_hidden(mc, vparams["backbone"], b["prompt_tokens"], b["prompt_mask"], b["tokens"],
                                   b["mask"])
        return value_head(mc, vparams, hidden)

    # The score pass runs in as many chunks as the update has micro-batches: a chunk is no larger than
    # what one forward + backward of the update holds, so scoring never sets the memory peak.
    score_chunks = c.train.minibatches * c.train.grad_accum

    def score_chunk(state, ref_params, b):
        out = {}
        if uses_ref:
            out["ref_logp"] = logp_of(ref_params, b)
        if c.value.enabled:
            out["old_values"] = jnp.where(b["mask"] > 0, values_of(state.value_params, b), 0.0)
        if c.rollout.recompute_logprobs:
            out["old_logp"] = jnp.where(b["mask"] > 0, logp_of(state.params, b), 0.0)
        return out

    def score(state, ref_params, b):
        """Reference log-probs, old values and (option) recomputed old log-probs of the rollout, each
        (N,T), computed `score_chunks` groups of prompts at a time. Chunk j holds prompts j, j+k, j+2k..
        (k chunks): strided, so that every data shard of the batch contributes its share to every chunk."""
        if score_chunks == 1:
            return score_chunk(state, ref_params, b)
        n_prompts = b["prompt_tokens"].shape[0]
        chunks = jnp.arange(n_prompts).reshape(-1, score_chunks).T  # (k, B/k): chunk j = j, j+k, ...
        outs = jax.lax.map(lambda pidx: score_chunk(state, ref_params, minibatch(b, pidx)), chunks)
        # (k, B/k*G, T) -> (B/k, k, G, T) -> (N, T): prompt i*k + j is row block (i, j).
        return {name: x.reshape(score_chunks, n_prompts // score_chunks, G, -1).swapaxes(0, 1).reshape(
            n_prompts * G, -1) for name, x in outs.items()}

    def advantages(b, kl_coef):
        """(advantages (N,) or (N,T), returns (N,T) or None, kl statistics)."""
        mask, old_logp = b["mask"], b["old_logp"]
        stats = {}
        kl_tok = None
        if uses_ref:
            k3 = rl.kl_penalty(old_logp, b["ref_logp"], "k3")
            stats["kl/ref"] = rl.aggregate(k3, mask, "token-mean")
            kl_tok = jnp.where(mask > 0, rl.kl_penalty(old_logp, b["ref_logp"], c.kl.estimator), 0.0)
            stats["kl/seq_sum"] = jnp.mean(jnp.sum(kl_tok, axis=1))
        penalty = kl_coef * kl_tok if (kl_tok is not None and c.kl.placement == "reward") else None
        est, returns = c.advantage.estimator, None
        if est == "gae":
            rewards = rl.token_rewards(b["scores"], mask, penalty)
            lam = rl.adaptive_lam(mask, alpha=c.advantage.adaptive_lam_alpha) \
                if c.advantage.adaptive_lam_alpha > 0 else c.advantage.lam
            adv, returns = rl.gae(rewards, b["old_values"], mask, gamma=c.advantage.gamma, lam=lam,
                                  lam_value=c.advantage.lam_value)
            if c.advantage.whiten:
                adv = rl.whiten(adv, b["loss_mask"])
        elif est == "group":
            adv = rl.group_advantages(b["scores"], G, scale=c.advantage.scale, eps=c.advantage.eps)
        elif est == "rloo":
            adv = rl.rloo_advantages(b["scores"], G)
        else:
            adv = rl.reinforce_pp_advantages(
                b["scores"], penalty if penalty is not None else jnp.zeros_like(old_logp), mask,
                gamma=c.advantage.gamma, group_size=G if c.advantage.reinforce_pp_baseline else None)
        return adv, returns, stats

    def minibatch(b, pidx):
        """The rows of prompts `pidx` (whole groups, so prompts stay shared in the forward pass)."""
        rows = (pidx[:, None] * G + jnp.arange(G)[None]).reshape(-1)
        out = {}
        for k, v in b.items():
            if v is None:
                continue
            out[k] = v[pidx] if k in ("prompt_tokens", "prompt_mask") else v[rows]
        return out

    def losses(params, vparams, kl_coef, mb, den):
        """Policy (+ value) loss of one micro-batch, normalized by the whole minibatch's denominator."""
        logp, ent = logp_of(params, mb, with_entropy=True)
        m = mb["loss_mask"]
        pl, pm = rl.policy_loss(
            logp, mb["old_logp"], mb["adv"], m, ratio=c.loss.ratio, surrogate=c.loss.surrogate,
            clip_low=c.loss.clip_low, clip_high=c.loss.clip_high,
            dual_clip=c.loss.dual_clip or None, sapo_tau_pos=c.loss.sapo_tau_pos,
            sapo_tau_neg=c.loss.sapo_tau_neg, cispo_max=c.loss.cispo_max, aggregate=mode,
            norm_length=norm_length, denominator=den["policy"])
        loss = pl
        if uses_ref and c.kl.placement == "loss":
            kl = rl.kl_penalty(logp, mb["ref_logp"], c.kl.estimator)
            loss = loss + kl_coef * rl.aggregate_sum(kl, m, mode) / den["policy"]
        if c.entropy_coef > 0:
            loss = loss - c.entropy_coef * rl.aggregate_sum(ent, m, mode) / den["policy"]
        valid = mb["mask"] > 0
        ntok = jnp.sum(m)
        aux = {"policy/loss": pl, "policy/entropy_sum": jnp.sum(jnp.where(m > 0, ent, 0.0)), "ntok": ntok,
               "logp_diff_max": jnp.max(jnp.where(valid, jnp.abs(logp - mb["sampler_logp"]), 0.0)),
               **{f"policy/{k}_sum": v * ntok for k, v in pm.items() if k not in ("ratio_min", "ratio_max")},
               "policy/ratio_min": pm["ratio_min"], "policy/ratio_max": pm["ratio_max"]}
        if c.value.enabled:
            values = values_of(vparams, mb)
            vl, vm = rl.value_loss(values, mb["old_values"], mb["returns"], m, clip=c.value.clip or None,
                                   aggregate="token-mean", denominator=den["value"])
            loss = loss + vl
            aux.update({"value/loss": vl, **{f"value/{k}_sum": v * ntok for k, v in vm.items()}})
        return loss, aux

    def update(state, b, pidx):
        """One optimizer step on the prompts `pidx`, accumulated over `grad_accum` micro-batches."""
        mb_full = minibatch(b, pidx)
        den = {"policy": rl.aggregate_denominator(mb_full["loss_mask"], mode, norm_length=norm_length),
               "value": rl.aggregate_denominator(mb_full["loss_mask"], "token-mean")}
        micro = pidx.reshape(c.train.grad_accum, -1)
        grad_fn = jax.value_and_grad(losses, argnums=(0, 1), has_aux=True)

        def one(p):
            (loss, aux), grads = grad_fn(state.params, state.value_params, state.kl.value, minibatch(b, p), den)
            extremes = (aux["policy/ratio_min"], aux["policy/ratio_max"], aux["logp_diff_max"])
            return (loss, grads, _summable(aux)), extremes

        acc, extremes = one(micro[0])
        if c.train.grad_accum > 1:  # sums of micro-batch losses/grads = the minibatch's (global denominator)
            def body(acc, p):
                out, ext = one(p)
                return jax.tree_util.tree_map(jnp.add, acc, out), ext
            acc, more = jax.lax.scan(body, acc, micro[1:])
            extremes = jax.tree_util.tree_map(lambda a, m: jnp.concatenate([a[None], m]), extremes, more)
        (loss, (g, vg), aux), (rmin, rmax, diff) = acc, extremes
        gnorm = optax.global_norm(g)
        ok = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        updates, opt_state = tx.update(g, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        value_params, value_opt_state = state.value_params, state.value_opt_state
        metrics = {}
        if c.value.enabled:
            vupdates, value_opt_state = value_tx.update(vg, state.value_opt_state, state.value_params)
            value_params = optax.apply_updates(state.value_params, vupdates)
            ok = ok & jnp.isfinite(optax.global_norm(vg))
            metrics["value/grad_norm"] = optax.global_norm(vg)
        keep = lambda new, old: jax.tree_util.tree_map(lambda a, b_: jnp.where(ok, a, b_), new, old)
        new_state = state.replace(
            params=keep(params, state.params), opt_state=keep(opt_state, state.opt_state),
            value_params=keep(value_params, state.value_params),
            value_opt_state=keep(value_opt_state, state.value_opt_state),
            opt_step=state.opt_step + ok.astype(jnp.int32),
            nonfinite=jnp.where(ok, 0, state.nonfinite + 1))
        ntok = jnp.maximum(aux.pop("ntok"), 1.0)
        for k, v in aux.items():
            metrics[k[:-4] if k.endswith("_sum") else k] = v / ntok if k.endswith("_sum") else v
        metrics.update({"policy/grad_norm": gnorm, "policy/ratio_min": jnp.min(rmin),
                        "policy/ratio_max": jnp.max(rmax), "sampler/logp_diff_max": jnp.max(diff),
                        "lr": schedule(state.opt_step), "train/skipped_updates": 1.0 - ok.astype(jnp.float32),
                        "train/nonfinite_streak": new_state.nonfinite.astype(jnp.float32)})
        return new_state, metrics

    replicate = sharding.replicated(mesh)
    state_shardings = jax.tree_util.tree_unflatten(state_treedef, state_sharding_leaves)
    return StepFunctions(
        score=jax.jit(score), advantages=jax.jit(advantages),
        update=jax.jit(update, donate_argnums=(0,), out_shardings=(state_shardings, replicate)),
        refresh_ref=jax.jit(lambda ref, p: jax.tree_util.tree_map(
            lambda r, q: (1 - c.ref.mix_alpha) * r + c.ref.mix_alpha * q, ref, p), donate_argnums=(0,)))


# ============================================================================================ trainer
class Trainer:
    """Builds everything from a config, then `run()` trains to `total_steps` (resuming if possible)."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str, *, devices=None):
        """workdir: a local path or a URL that etils.epath and Orbax read (gs://...); devices: those of
        the mesh, all of `jax.devices()` by default."""
        c = config_lib.resolve(config)
        config_lib.validate(c)
        self.c, self.workdir = c, workdir
        self.mesh = sharding.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor, devices=devices)
        divisor = sharding.batch_divisor(self.mesh)
        if c.rollout.batch_prompts % divisor or (c.rollout.batch_prompts // c.train.minibatches
                                                 // c.train.grad_accum) % divisor:
            raise ValueError(f"config.rollout.batch_prompts={c.rollout.batch_prompts} (per micro-batch: "
                             f"{c.rollout.batch_prompts // c.train.minibatches // c.train.grad_accum}) must be "
                             f"divisible by mesh data*fsdp={divisor}")
        if c.rollout.batch_prompts % jax.process_count():
            raise ValueError(f"config.rollout.batch_prompts={c.rollout.batch_prompts} must be divisible by the "
                             f"{jax.process_count()} processes")
        wd = epath.Path(workdir)
        try:
            wd.mkdir(parents=True, exist_ok=True)
        except Exception as e:  # e.g. gs:// without gcsfs installed, or no permission on the bucket
            raise OSError(f"workdir {workdir} cannot be created: {' '.join(str(e).split())[:200]}") from None
        if not fs.is_url(workdir) and not os.access(workdir, os.W_OK):
            raise PermissionError(f"workdir {workdir} is not writable")
        check_workdir(workdir, c)
        self.reward_fns = []
        for spec, weight in config_lib.reward_specs(c):
            kwargs = dict(c.reward.kwargs.get(spec.split(":")[-1], {}))
            if spec == "reward_model":  # scored on the training mesh with the same sharding rules
                # Each host scores only its own rows: across hosts, on a mesh of this host's devices (the
                # global mesh would take every host's different rows for one global batch).
                kwargs.setdefault("mesh", self.mesh if jax.process_count() == 1 else
                                  sharding.make_mesh(1, -1, 1, devices=jax.local_devices()))
                kwargs.setdefault("rules", sharding.LOGICAL_RULES)
            self.reward_fns.append((*get_reward_fn(spec, **kwargs), weight))

        # ---- tokenizer and models (policy, reference, value) on the one mesh
        model_path = resolve_model_path(c.model.path) if c.model.path else ""
        self.tokenizer = load_tokenizer(c.tokenizer or model_path)
        if model_path:
            mc = read_hf_config(model_path, param_dtype=c.model.dtype, dtype=c.model.compute_dtype,
                                remat=c.model.remat, logits_chunk=c.model.logits_chunk)
        else:
            mc = builtin_model_config(c, self.tokenizer)
        self.mc = mc
        self.eos_ids = eos_ids_of(model_path, self.tokenizer, mc)
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0])
        if c.data.max_prompt_length + c.rollout.max_new_tokens > mc.max_position_embeddings:
            raise ValueError(f"config.data.max_prompt_length + rollout.max_new_tokens = "
                             f"{c.data.max_prompt_length + c.rollout.max_new_tokens} exceeds the model's "
                             f"max_position_embeddings {mc.max_position_embeddings}")
        rng = jax.random.PRNGKey(c.seed)
        init_rng, value_rng, state_rng = jax.random.split(rng, 3)
        abstract = jax.eval_shape(lambda: init_params(mc, init_rng))
        self.param_shardings = sharding.logical_to_sharding(param_logical_axes(mc), abstract, self.mesh)
        if model_path:
            _, params = load_hf(model_path, jnp.dtype(c.model.dtype), compute_dtype=c.model.compute_dtype,
                                shardings=self.param_shardings, remat=c.model.remat,
                                logits_chunk=c.model.logits_chunk)
        else:
            params = jax.jit(lambda k: init_params(mc, k), out_shardings=self.param_shardings)(init_rng)
        self.uses_ref = c.kl.coef > 0
        refresh = self.uses_ref and c.ref.refresh_every > 0
        copy = jax.jit(lambda t: jax.tree_util.tree_map(jnp.copy, t), out_shardings=self.param_shardings)
        self.frozen_ref = copy(params) if self.uses_ref and not refresh else None
        value_params, self.value_shardings = None, None
        if c.value.enabled:
            vabstract = jax.eval_shape(lambda p: init_value_params(mc, p), abstract)
            self.value_shardings = sharding.logical_to_sharding(value_logical_axes(mc), vabstract, self.mesh, name="value")
            if c.value.init == "policy":
                value_params = jax.jit(lambda p: init_value_params(mc, p), out_shardings=self.value_shardings)(params)
            else:
                vmc, value_params = load_hf_value(c.value.init, jnp.dtype(c.model.dtype),
                                                  shardings=self.value_shardings)
                if (vmc.hidden_size, vmc.num_layers) != (mc.hidden_size, mc.num_layers):
                    raise ValueError(f"config.value.init {c.value.init}: its backbone differs from the policy's")

        # ---- optimizers
        total_updates = c.total_steps * c.train.epochs * c.train.minibatches
        tx, _ = make_optimizer(c.optimizer, c.optimizer.learning_rate, total_updates)
        value_tx, _ = make_optimizer(c.optimizer, c.value.learning_rate, total_updates)
        if c.kl.adaptive:
            kl_ctl = rl.AdaptiveKLController.create(max(c.kl.coef, 1e-8), c.kl.target, c.kl.horizon)
        else:
            kl_ctl = rl.FixedKLController.create(c.kl.coef)
        # Optimizer states are laid out like their parameters (FSDP shards Adam's moments too).
        opt_shardings = sharding.optimizer_shardings(tx, jax.eval_shape(tx.init, abstract), self.param_shardings,
                                                     self.mesh)
        value_opt_shardings = None if value_params is None else sharding.optimizer_shardings(
            value_tx, jax.eval_shape(value_tx.init, value_params), self.value_shardings, self.mesh)
        state = TrainState(
            step=np.int32(0), opt_step=np.int32(0), rng=np.asarray(state_rng), params=params,
            opt_state=jax.jit(tx.init, out_shardings=opt_shardings)(params),
            ref_params=copy(params) if refresh else None, value_params=value_params,
            value_opt_state=None if value_params is None else jax.jit(
                value_tx.init, out_shardings=value_opt_shardings)(value_params),
            kl=jax.tree_util.tree_map(np.asarray, kl_ctl), nonfinite=np.int32(0))
        replicate = sharding.replicated(self.mesh)
        self.state_shardings = TrainState(
            step=replicate, opt_step=replicate, rng=replicate, params=self.param_shardings,
            opt_state=opt_shardings, ref_params=self.param_shardings if refresh else None,
            value_params=self.value_shardings, value_opt_state=value_opt_shardings,
            kl=jax.tree_util.tree_map(lambda _: replicate, kl_ctl), nonfinite=replicate)
        # Host scalars (step, rng, KL coefficient) become global replicated arrays; the rest is in place.
        self.state = jax.device_put(state, self.state_shardings)

        # ---- data
        dataset, self.data_stats = load_dataset_for(c, self.tokenizer)
        self.data = iterator_from_config(dataset, c.data, c.rollout.batch_prompts,
                                         shard_index=jax.process_index(), shard_count=jax.process_count())

        # ---- checkpoint restore (exact resume) and metric sinks
        self.ckpt = Checkpointer(str(wd / "checkpoints"), max_to_keep=c.checkpoint.max_to_keep,
                                 async_save=c.checkpoint.async_save)
        restored = self.ckpt.restore(abstract_like(self.state))
        start = 0
        if restored is not None:
            start, self.state, meta = restored
            self.data.restore(meta["data"])
            log.info("resumed from step %d in %s", start, workdir)
        self.start_step = start
        if dist.is_main():
            # Rewritten at every start: atomically, or a kill mid-write would leave a run that cannot resume.
            fs.write_text_atomic(wd / "config.json", c.to_json(indent=2))
            fs.write_text_atomic(wd / "model_config.json", json.dumps(config_to_hf_dict(mc, c.model.dtype), indent=2))
            fs.write_via_local_dir(wd / "tokenizer", self.tokenizer.save_pretrained)
        self.writer = metrics_lib.MetricsWriter(workdir, enabled=dist.is_main(), tensorboard=c.log.tensorboard,
                                                resume_step=start)
        leaves, treedef = jax.tree_util.tree_flatten(self.state_shardings)
        # The schedule's length only matters when it decays; a constant one compiles once for any length.
        self.fns = step_functions(_compute_key(c), 0 if c.optimizer.schedule == "constant" else total_updates,
                                  mc, self.mesh, treedef, tuple(leaves))
        self._rows_sharding = sharding.batch_sharding(self.mesh, 2)
        self._vec_sharding = sharding.batch_sharding(self.mesh, 1)

    # ======================================================================== rollout (host side)
    def _sample_round(self, params, key):
        """Samples one batch of prompts; returns this host's rows as NumPy plus their texts and columns."""
        c = self.c
        batch = next(self.data)
        tokens, pmask = pad_prompt_batch(batch, c.data.max_prompt_length, self.pad_id)
        prompts_g = dist.to_global(tokens, self._rows_sharding)
        pmask_g = dist.to_global(pmask, self._rows_sharding)
        with sharding.use_mesh(self.mesh):
            r = generate(self.mc, params, prompts_g, pmask_g, key, max_new_tokens=c.rollout.max_new_tokens,
                         num_samples=c.rollout.group_size, temperature=c.rollout.temperature,
                         top_k=c.rollout.top_k, top_p=c.rollout.top_p, eos_ids=self.eos_ids, pad_id=self.pad_id)
        faults.point("sample")  # the sampler is running (dispatch is asynchronous)
        local = {"prompt_tokens": tokens, "prompt_mask": pmask, "tokens": dist.to_local(r.tokens),
                 "mask": dist.to_local(r.mask), "sampler_logp": dist.to_local(r.logprobs),
                 "lengths": dist.to_local(r.lengths), "truncated": dist.to_local(r.truncated)}
        G = c.rollout.group_size
        ends = local["lengths"] - (~local["truncated"]).astype(np.int64)  # the EOS is not part of the text
        completions = self.tokenizer.batch_decode([row[:e] for row, e in zip(local["tokens"], ends)],
                                                  skip_special_tokens=False)
        # Rewards see the user's prompt (a reward model applies its own chat template); the rendered
        # prompt is the `prompt_text` column.
        prompts = [p for p in batch["prompt_user"] for _ in range(G)]
        skip = {"prompt_user", "prompt_ids", "global_max_prompt_length"}
        columns = {k: [v for v in vals for _ in range(G)] for k, vals in batch.items() if k not in skip}
        columns.update(completion_lengths=local["lengths"].tolist(), truncated=local["truncated"].tolist(),
                       max_completion_length=c.rollout.max_new_tokens)
        scores, reward_metrics = compute_rewards(self.reward_fns, prompts, completions, columns,
                                                 on_error=c.reward.on_error)
        local["scores"] = scores
        local["valid"] = np.ones(len(scores), np.float32)
        return local, prompts, completions, reward_metrics

    def _rollout(self, params, key):
        """One batch of B prompts x G completions (with DAPO's dynamic sampling when enabled)."""
        c = self.c
        G, B_local = c.rollout.group_size, c.rollout.batch_prompts // jax.process_count()
        t0 = time.perf_counter()
        local, prompts, completions, reward_metrics = self._sample_round(params, jax.random.fold_in(key, 0))
        first = dict(local)
        gen_tokens = local["lengths"].sum()
        info = {"prompts": prompts, "completions": completions, "reward_metrics": reward_metrics, "rounds": 1}
        if c.dapo.dynamic_sampling:
            kept, spare = _split_groups(local, G)
            rounds = 1
            while dist.allgather_rows(np.array([len(kept) < B_local])).any() and rounds < c.dapo.max_sample_rounds:
                more, _, _, _ = self._sample_round(params, jax.random.fold_in(key, rounds))
                gen_tokens += more["lengths"].sum()
                k2, s2 = _split_groups(more, G)
                kept, spare, rounds = kept + k2, spare + s2, rounds + 1
            fill = [dict(g, valid=np.zeros_like(g["valid"])) for g in spare]  # zero-weight groups keep shapes
            local = _join_groups((kept + fill)[:B_local])
            info.update(rounds=rounds, kept_groups=min(len(kept), B_local) / B_local)
        info["sample_s"] = time.perf_counter() - t0
        info["gen_tokens"] = float(gen_tokens)
        return local, first, info

    def _device_batch(self, local):
        """Global arrays of the update batch from this host's rows."""
        c = self.c
        loss_mask = local["mask"] * local["valid"][:, None]
        if c.dapo.mask_truncated:
            loss_mask = loss_mask * (~local["truncated"])[:, None]
        put = lambda x, dtype: dist.to_global(np.asarray(x, dtype),
                                              self._rows_sharding if np.ndim(x) == 2 else self._vec_sharding)
        return {"prompt_tokens": put(local["prompt_tokens"], np.int32), "prompt_mask": put(local["prompt_mask"], np.int32),
                "tokens": put(local["tokens"], np.int32), "mask": put(local["mask"], np.int32),
                "loss_mask": put(loss_mask, np.float32), "sampler_logp": put(local["sampler_logp"], np.float32),
                "scores": put(local["scores"], np.float32)}

    # ======================================================================== the loop
    def train_step(self, state: TrainState):
        """One RL iteration. Returns (new state, metrics dict of floats, samples for logging)."""
        c = self.c
        G = c.rollout.group_size
        t_step = time.perf_counter()
        faults.point("step", state.step)  # read only under fault injection: no host sync otherwise
        rng, sample_key, shuffle_key = jax.random.split(state.rng, 3)
        local, first, info = self._rollout(state.params, sample_key)
        b = self._device_batch(local)

        t_upd = time.perf_counter()
        ref = state.ref_params if state.ref_params is not None else self.frozen_ref
        with sharding.use_mesh(self.mesh):
            b.update(self.fns.score(state, ref, b))
            b.setdefault("old_logp", b["sampler_logp"])
            adv, returns, kl_stats = self.fns.advantages(b, state.kl.value)
            b["adv"], b["returns"] = adv, returns
            B = c.rollout.batch_prompts
            per_mb = B // c.train.minibatches
            step_metrics = []
            state = state.replace(rng=rng)
            for epoch in range(c.train.epochs):
                perm = jax.random.permutation(jax.random.fold_in(shuffle_key, epoch), B)
                for m in range(c.train.minibatches):
                    state, mm = self.fns.update(state, b, perm[m * per_mb:(m + 1) * per_mb])
                    faults.point("update")  # the update is running on the donated state
                    step_metrics.append(mm)
            if state.ref_params is not None and (int(state.step) + 1) % c.ref.refresh_every == 0:
                state = state.replace(ref_params=self.fns.refresh_ref(state.ref_params, state.params))
            kl_value = kl_stats.get("kl/seq_sum", jnp.float32(0.0))
            state = state.replace(step=state.step + 1, kl=state.kl.update(kl_value, jnp.float32(B * G)))
        step_metrics = jax.device_get(step_metrics)
        update_s = time.perf_counter() - t_upd

        # ---- metrics (DESIGN section 4 names)
        m: dict[str, float] = {}
        for k in step_metrics[0]:
            vals = [float(x[k]) for x in step_metrics]
            m[k] = min(vals) if k.endswith("ratio_min") else max(vals) if k.endswith("max") else float(np.mean(vals))
        # Updates of this step skipped for a NaN/inf loss or gradient, and the consecutive ones so far
        # (the run stops when they reach train.max_nonfinite_steps).
        m["train/skipped_updates"] = float(sum(float(x["train/skipped_updates"]) for x in step_metrics))
        m["train/nonfinite_streak"] = float(step_metrics[-1]["train/nonfinite_streak"])
        # Before the first update the policy is the sampler's: that step's difference is the sampler's.
        m["sampler/logp_diff_max"] = float(step_metrics[0]["sampler/logp_diff_max"])
        if c.rollout.recompute_logprobs:
            valid = b["mask"] > 0
            m["sampler/logp_diff_max"] = float(jnp.max(jnp.where(valid, jnp.abs(b["old_logp"] - b["sampler_logp"]), 0)))
        m.update({k: float(v) for k, v in jax.device_get(kl_stats).items() if k != "kl/seq_sum"})
        m["kl/coef"] = float(state.kl.value)
        scores = dist.allgather_rows(first["scores"])
        groups = scores.reshape(-1, G)
        lengths = dist.allgather_rows(first["lengths"]).astype(np.float64)
        truncated = dist.allgather_rows(first["truncated"])
        m.update({"reward/mean": float(scores.mean()), "reward/std": float(scores.std()),
                  "reward/frac_zero_std": float(np.mean(groups.std(axis=1) == 0)) if G > 1 else 0.0,
                  "response_length/mean": float(lengths.mean()), "response_length/max": float(lengths.max()),
                  "response_length/min": float(lengths.min()), "response_length/clip_ratio": float(truncated.mean())})
        for k, v in info["reward_metrics"].items():
            m[k] = float(np.mean(dist.allgather_rows(np.array([v]))))
        if c.dapo.dynamic_sampling:
            m["dapo/sample_rounds"] = float(info["rounds"])
            m["dapo/kept_groups"] = float(info["kept_groups"])
        step_s = time.perf_counter() - t_step
        P, T = local["prompt_tokens"].shape[1], c.rollout.max_new_tokens
        N = c.rollout.batch_prompts * G
        gen_tokens = float(np.sum(dist.allgather_rows(np.array([info["gen_tokens"]]))))
        update_tokens = c.train.epochs * (c.rollout.batch_prompts * P + N * T)
        m.update({"perf/step_s": step_s, "perf/sample_tokens_per_s": gen_tokens / max(info["sample_s"], 1e-9),
                  "perf/update_tokens_per_s": update_tokens / max(update_s, 1e-9),
                  "perf/mfu": self._flops(P) / step_s / (self._peak * jax.device_count()), "step": float(state.step)})
        samples = [{"prompt": info["prompts"][i], "completion": info["completions"][i],
                    "reward": float(first["scores"][i])} for i in range(min(c.log.num_samples, len(info["prompts"])))]
        return state, m, samples

    def _flops(self, P: int) -> float:
        """FLOPs of one step: sampling + reference/value forwards + forward+backward of every update."""
        c, mc = self.c, self.mc
        B, G, T = c.rollout.batch_prompts, c.rollout.group_size, c.rollout.max_new_tokens
        prompt = B * metrics_lib.flops_per_token(mc, P / 2, lm_head=False)
        completion = B * G * T * metrics_lib.flops_per_token(mc, P + T / 2)
        sample = prompt + completion
        forwards = (int(self.uses_ref) + int(c.rollout.recompute_logprobs) + int(c.value.enabled)) * (prompt + completion)
        train = 3 * c.train.epochs * (prompt + completion) * (2 if c.value.enabled else 1)
        return sample + forwards + train

    @functools.cached_property
    def _peak(self) -> float:
        return self.c.log.peak_flops or metrics_lib.peak_flops(jax.devices()[0])

    def save(self, state, *, force=False):
        self.ckpt.save(int(state.step), state, {"data": self.data.state(), "step": int(state.step)}, force=force)
        self.writer.flush()  # metrics up to a checkpoint are durable, also where files cannot be appended to
        faults.point("checkpoint", int(state.step))  # Orbax's asynchronous write is in flight

    def run(self) -> list[dict]:
        """Trains from the restored step to total_steps; returns this run's metrics rows."""
        c = self.c
        state, history = self.state, []
        progress = contextlib.nullcontext()
        if c.log.progress and dist.is_main():
            from tqdm import tqdm
            progress = tqdm(total=c.total_steps, initial=self.start_step, desc=f"{c.algo}", dynamic_ncols=True)
        with progress as bar:
            for step in range(self.start_step, c.total_steps):
                state, m, samples = self.train_step(state)
                self.writer.write(step + 1, m)
                if c.log.samples_every and (step + 1) % c.log.samples_every == 0:
                    self.writer.write_samples(step + 1, samples)
                history.append(m)
                if bar is not None and hasattr(bar, "update"):
                    bar.set_postfix(reward=f"{m['reward/mean']:.3f}", kl=f"{m.get('kl/ref', 0):.4f}",
                                    tok_s=f"{m['perf/sample_tokens_per_s']:.0f}", refresh=False)
                    bar.update(1)
                if int(state.nonfinite) >= c.train.max_nonfinite_steps:
                    self.ckpt.wait()
                    raise FloatingPointError(
                        f"{int(state.nonfinite)} consecutive updates had NaN/inf loss or gradients (step {step + 1}); "
                        f"stopped with the last good checkpoint intact (train.max_nonfinite_steps="
                        f"{c.train.max_nonfinite_steps})")
                if (step + 1) % c.checkpoint.every_steps == 0 and step + 1 < c.total_steps:
                    self.save(state)
        self.state = state
        if self.ckpt.latest_step() != int(state.step):
            self.save(state, force=True)
        self.ckpt.wait()
        self.writer.flush()
        self.finish()
        return history

    def finish(self):
        """Export, plot and the DONE marker (process 0)."""
        c = self.c
        wd = epath.Path(self.workdir)
        # Every process takes part in gathering the sharded parameters; process 0 writes them.
        params = jax.tree_util.tree_map(dist.to_host, self.state.params) if c.export.at_end else None
        if dist.is_main():
            if c.export.at_end:
                export = lambda out: save_hf(out, self.mc, params, tokenizer=self.tokenizer, dtype=c.export.dtype or None)
                if fs.is_url(self.workdir):
                    fs.write_via_local_dir(wd / "hf", export)
                else:
                    export(str(wd / "hf"))  # atomic in place
            metrics_path = wd / "metrics.jsonl"
            if c.export.plot and metrics_path.exists():
                metrics_lib.plot_curves(str(metrics_path), str(wd / "curves.png"))
            (wd / "DONE").write_text(f"{int(self.state.step)}\n", encoding="utf-8")  # last: the run is complete
        self.writer.close()
        self.ckpt.close()


def _compute_key(c: ml_collections.ConfigDict) -> str:
    """The config as JSON without the fields that cannot change a compiled step."""
    d = json.loads(c.to_json())
    for k in RESUMABLE_FIELDS:
        d.pop(k, None)
    return json.dumps(d, sort_keys=True)


def _summable(aux):
    """The parts of the update's aux that add up across micro-batches (min/max are collected apart)."""
    return {k: v for k, v in aux.items() if not k.endswith(("ratio_min", "ratio_max")) and k != "logp_diff_max"}


def _split_groups(local: dict, G: int):
    """This host's rollout rows -> (groups with reward variance, groups without), one dict per group."""
    n_groups = len(local["scores"]) // G
    kept, spare = [], []
    for g in range(n_groups):
        rows = slice(g * G, (g + 1) * G)
        group = {k: (v[g:g + 1] if k in ("prompt_tokens", "prompt_mask") else v[rows]) for k, v in local.items()}
        (kept if np.ptp(group["scores"]) > 0 else spare).append(group)
    return kept, spare


def _join_groups(groups: list[dict]) -> dict:
    """Concatenates groups, left-padding prompts of different buckets to the longest."""
    P = max(g["prompt_tokens"].shape[1] for g in groups)
    out = {}
    for k in groups[0]:
        parts = [g[k] for g in groups]
        if k in ("prompt_tokens", "prompt_mask"):
            parts = [np.pad(p, ((0, 0), (P - p.shape[1], 0))) for p in parts]  # masked out: any id will do
        out[k] = np.concatenate(parts)
    return out
