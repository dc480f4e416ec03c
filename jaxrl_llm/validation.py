"""The one validation pass over a run config: fields not in the schema (jaxrl_llm/field_names.py), then
every value, each with a one-line ValueError naming the field. `jaxrl_llm.config.prepare` runs it before
anything is loaded or compiled. The allowed values of the algorithm's choices are the keys of the
registries in `jaxrl_llm.rl`.
"""
from __future__ import annotations

import math
import os

import ml_collections

from jaxrl_llm import rl
from jaxrl_llm.data import reasoning_gym as rgym
from jaxrl_llm.data.config import validate_data_config
from jaxrl_llm.envs.registry import check_env_config, check_env_name
from jaxrl_llm.presets import ALGOS

# model.attention: the names of models.kernels.ATTENTION_IMPLS (config may not import models; a test
# holds the two equal). Whether the backend has the kernel is checked at setup (trainer/setup.py).
ATTENTION_IMPLS = ("auto", "xla", "blockwise", "cudnn", "splash")


def get_path(c, path: str):
    """The value of a dotted field path ("rollout.group_size")."""
    for p in path.split("."):
        c = c[p]
    return c


def reward_specs(config) -> list[tuple[str, float]]:
    """[(spec, weight)] from reward.functions / reward.weights, with DAPO's overlong shaping added."""
    names = [s.strip() for s in config.reward.functions.split(",") if s.strip()]
    weights = [w.strip() for w in config.reward.weights.split(",") if w.strip()]
    if not names and not (config.get("env") and config.env.name):  # an environment's rewards may be the only ones
        raise ValueError("reward.functions is empty; name at least one reward (e.g. 'math_answer')")
    if weights and len(weights) != len(names):
        raise ValueError(f"reward.weights has {len(weights)} entries for {len(names)} reward.functions")
    try:
        weights = [float(w) for w in weights] or [1.0] * len(names)
    except ValueError:
        raise ValueError(f"reward.weights must be comma-separated numbers, got {config.reward.weights!r}") from None
    specs = list(zip(names, weights))
    if config.dapo.overlong_buffer and not any(n == "overlong" for n in names):
        specs.append(("overlong", 1.0))
    return specs


def _fail(field: str, expected: str, value) -> None:
    raise ValueError(f"config.{field} must be {expected}, got {value!r}")


def _check(c, field: str, ok, expected: str):
    value = get_path(c, field)
    try:
        good = ok(value)
    except TypeError:
        good = False
    if not good:
        _fail(field, expected, value)


def _check_choice(c, field: str, allowed) -> None:
    names = tuple(allowed)
    _check(c, field, lambda v: v in names, "one of " + ", ".join(names))


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate(c: ml_collections.ConfigDict) -> None:
    """One-line ValueError naming the first bad field. Expects a resolved config (see `prepare`)."""
    _validate_model_and_data(c)
    _validate_objective(c)
    _validate_training(c)
    _validate_lora(c)
    _validate_io(c)
    reward_specs(c)
    _validate_eval(c)
    _validate_env(c)


def _validate_model_and_data(c) -> None:
    _check(c, "algo", lambda v: v in ALGOS, f"one of {', '.join(ALGOS)}")
    _check(c, "seed", lambda v: _is_int(v) and v >= 0, "a non-negative int")
    _check(c, "total_steps", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    for f in ("model.dtype", "model.compute_dtype"):
        _check(c, f, lambda v: v in ("float32", "bfloat16", "float16"), "float32, bfloat16 or float16")
    _check(c, "model.remat", lambda v: v in ("none", "full", "dots"), "none, full or dots")
    _check(c, "model.routing_replay", lambda v: isinstance(v, bool), "True or False")
    for f in ("model.router_aux_loss_coef", "model.router_z_loss_coef"):  # MoE router losses (rl/router.py)
        _check(c, f, lambda v: _is_num(v) and v >= 0, "a number >= 0 (0 = off)")
    if (c.model.router_aux_loss_coef or c.model.router_z_loss_coef) and c.train.pack_length:
        _fail("train.pack_length", "0 with a router loss (model.router_aux_loss_coef / router_z_loss_coef > 0: "
              "packed rows do not return the router's sums)", c.train.pack_length)
    _check_choice(c, "model.attention", ATTENTION_IMPLS)
    if c.model.attention == "cudnn" and {c.model.compute_dtype, c.rollout.compute_dtype} - {"", "bfloat16", "float16"}:
        _fail("model.attention", "auto, xla or blockwise with a float32 model.compute_dtype or "
              "rollout.compute_dtype (cuDNN attention runs bfloat16/float16 only)", c.model.attention)
    for f in ("model.logits_chunk", "model.attention_block", "model.hidden_size", "model.num_layers", "model.num_heads",
              "model.num_kv_heads", "model.intermediate_size", "model.max_position_embeddings"):
        _check(c, f, lambda v: _is_int(v) and v >= 1, "a positive int")
    if c.model.hidden_size % c.model.num_heads:
        _fail("model.num_heads", f"a divisor of model.hidden_size={c.model.hidden_size}", c.model.num_heads)
    if c.model.num_heads % c.model.num_kv_heads:
        _fail("model.num_kv_heads", f"a divisor of model.num_heads={c.model.num_heads}", c.model.num_kv_heads)
    validate_data_config(c.data)
    _validate_source(c)
    _check(c, "data.task_rows", lambda v: _is_int(v) and v >= 1, "a positive int")
    _check(c, "data.task_weights", lambda v: len(v) == 4 and all(_is_num(x) and x >= 0 for x in v) and sum(v) > 0,
           "4 non-negative level weights with a positive sum")
    r = "rollout."
    _check(c, r + "batch_prompts", lambda v: _is_int(v) and v >= 1, "a positive int")
    _check(c, r + "group_size", lambda v: _is_int(v) and v >= 1, "a positive int")
    _check(c, r + "max_new_tokens", lambda v: _is_int(v) and v >= 1, "a positive int")
    _check(c, r + "temperature", lambda v: _is_num(v) and v > 0, "a number > 0 (RL samples; greedy has no log-probs)")
    _check(c, r + "top_k", lambda v: _is_int(v) and v >= 0, "an int >= 0")
    _check(c, r + "top_p", lambda v: _is_num(v) and 0 < v <= 1, "in (0, 1]")
    _check(c, r + "min_p", lambda v: _is_num(v) and 0 <= v < 1, "in [0, 1) (0 = off)")
    _check(c, r + "repetition_penalty", lambda v: _is_num(v) and v > 0, "a number > 0 (1 = off)")
    rows = c.rollout.batch_prompts * c.rollout.group_size
    _check(c, r + "decode_slots", lambda v: _is_int(v) and 0 <= v <= rows,
           f"an int in [0, batch_prompts x group_size = {rows}] (0 = all rows)")
    axes = (c.mesh.data, c.mesh.fsdp, c.mesh.sequence)
    known = all(_is_int(v) and v > 0 for v in axes)  # -1: checked at start-up
    shards = math.prod(axes) if known else 1
    if c.rollout.decode_slots % shards:
        _fail(r + "decode_slots", f"a multiple of mesh.data x mesh.fsdp x mesh.sequence = {shards} (the slots are "
              "sharded)", c.rollout.decode_slots)
    _check(c, r + "decode_shrink", lambda v: _is_int(v) and (v == 0 or v >= 2), "0 (off) or an int >= 2")
    if c.rollout.decode_shrink and c.rollout.decode_slots:
        _fail(r + "decode_shrink", "0 with rollout.decode_slots > 0 (it shrinks the static batch; the slots "
              "already hold only rows still decoding)", c.rollout.decode_shrink)
    _check(c, r + "kv_page_size", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = no paged cache)")
    _check(c, r + "kv_pages", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = auto)")
    if c.rollout.kv_page_size and not c.rollout.decode_slots:
        _fail(r + "kv_page_size", "0 with rollout.decode_slots = 0 (the paged cache is the continuous-batching "
              "sampler's)", c.rollout.kv_page_size)
    if c.rollout.kv_page_size and c.env.name:
        _fail(r + "kv_page_size", "0 with env.name set (the multi-turn sampler's cache is not paged)",
              c.rollout.kv_page_size)
    if c.rollout.decode_shrink and c.env.name:
        _fail(r + "decode_shrink", "0 with env.name set (episodes decode turn by turn, sampling/turns.py)",
              c.rollout.decode_shrink)


def _validate_source(c) -> None:
    """Where the prompts come from: data.path, data.task or data.source (reasoning-gym tasks, checked with the
    package: installed, the tasks and options known; data/reasoning_gym.py)."""
    _check(c, "data.source", lambda v: v in ("", rgym.SOURCE), f"'' (data.path or data.task) or {rgym.SOURCE!r}")
    if c.data.source == rgym.SOURCE:
        if c.data.path or c.data.task:
            _fail("data.source", "'' with data.path or data.task set (one source of prompts)", c.data.source)
        r = "data.reasoning_gym."
        _check(c, r + "rows", lambda v: _is_int(v) and v >= 1, "a positive int")
        _check(c, r + "curriculum", lambda v: isinstance(v, bool), "True or False")
        _check(c, r + "curriculum_threshold", lambda v: _is_num(v) and 0 < v <= 1, "in (0, 1]")
        _check(c, r + "curriculum_window", lambda v: _is_int(v) and v >= 1, "an int >= 1")
        if c.data.reasoning_gym.curriculum and "reasoning_gym" not in [s for s, _ in reward_specs(c)]:
            _fail(r + "curriculum", "False unless reward.functions has reasoning_gym (the curriculum reads its per-task "
                  "rewards)", True)
        rgym.check_section(c.data.reasoning_gym,
                           curriculum_ok=not c.rollout.max_staleness and not c.mesh.rollout_devices)
    elif not c.data.path and not c.data.task:
        raise ValueError("config.data.path and config.data.task are both empty; set one (or data.source)")


def _validate_objective(c) -> None:
    """The algorithm's fields: allowed names come from the registries of `jaxrl_llm.rl`."""
    _validate_advantage(c)
    _validate_loss(c)
    _validate_kl(c)
    _validate_off_policy(c)
    _validate_distill(c)
    _check(c, "entropy_coef", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    _check(c, "dapo.max_sample_rounds", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    _check(c, "dapo.overlong_buffer", lambda v: _is_int(v) and 0 <= v <= c.rollout.max_new_tokens,
           "an int in [0, rollout.max_new_tokens]")
    if c.dapo.dynamic_sampling and c.rollout.group_size < 2:
        _fail("rollout.group_size", "at least 2 with dapo.dynamic_sampling", c.rollout.group_size)
    names = [spec.split(":")[-1] for spec, _ in reward_specs(c)]
    _check(c, "dapo.filter_on", lambda v: v in ("", "total", *names),
           "'' (the rewards but length shaping), 'total' or one of the reward functions " + ", ".join(names))


def _validate_distill(c) -> None:
    _check_choice(c, "distill.kind", rl.DISTILL_KINDS)
    _check(c, "teacher.dtype", lambda v: v in ("", "float32", "bfloat16", "float16"), "'', float32, bfloat16 or float16")
    _check(c, "distill.coef", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    _check(c, "distill.beta", lambda v: _is_num(v) and 0 <= v <= 1, "in [0, 1] (0 forward KL, 1 reverse KL)")
    _check(c, "distill.gamma", lambda v: _is_num(v) and 0 <= v <= 1, "in [0, 1]")
    _check(c, "distill.vocab_chunk", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    if (c.algo in ("opd", "gkd") or c.advantage.estimator == "none") and not c.teacher.path:
        _fail("teacher.path", f"a teacher model (HF directory or hub name) with algo={c.algo} (advantage.estimator="
              f"{c.advantage.estimator})", c.teacher.path)
    _check(c, "distill.lmbda", lambda v: _is_num(v) and 0 <= v <= 1, "in [0, 1] (the fraction of prompts on-policy)")
    _check(c, "distill.seq_kd", lambda v: v is False, "False (write the teacher's completions to data.completion_column)")
    lmbda, sup = c.distill.lmbda, c.distill.lmbda < 1  # GKD's supervised rows (trainer/supervised.py)
    if sup and not (c.teacher.path and c.distill.kind == "gkd"):
        _fail("distill.lmbda", "1 unless distill.kind='gkd' with a teacher.path (supervised rows train gkd only)", lmbda)
    if sup and not c.data.completion_column:
        _fail("data.completion_column", f"the column of the supervised completions with distill.lmbda={lmbda} < 1", "")
    if sup and (c.env.name or c.dapo.dynamic_sampling):
        _fail("distill.lmbda", "1 with env.name or dapo.dynamic_sampling (supervised rows are single-turn)", lmbda)


def _validate_advantage(c) -> None:
    _check_choice(c, "advantage.estimator", rl.ESTIMATORS)
    estimator = rl.ESTIMATORS[c.advantage.estimator]
    if (estimator.group or c.advantage.reinforce_pp_baseline) and c.rollout.group_size < 2:
        _fail("rollout.group_size", f"at least 2 for algo {c.algo} (group baselines need G >= 2)",
              c.rollout.group_size)
    _check_choice(c, "advantage.scale", rl.ADVANTAGE_SCALES)
    _check(c, "advantage.whiten", lambda v: isinstance(v, bool), "True or False")
    if c.advantage.whiten and not estimator.whitens:
        _fail("advantage.whiten", f"False with the {c.advantage.estimator} estimator (only gae and rloo whiten; "
              "group's batch-scale form is advantage.scale=batch)", True)
    _check(c, "advantage.eps", lambda v: _is_num(v) and v > 0, "a number > 0")
    for f in ("advantage.gamma", "advantage.lam"):
        _check(c, f, lambda v: _is_num(v) and 0 <= v <= 1, "in [0, 1]")
    _check(c, "advantage.lam_value", lambda v: _is_num(v) and (0 <= v <= 1 or v == -1), "in [0, 1], or -1 (= lam)")
    _check(c, "advantage.adaptive_lam_alpha", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    _check(c, "advantage.bootstrap_truncated", lambda v: isinstance(v, bool), "True or False")
    if c.advantage.bootstrap_truncated and not estimator.value:
        _fail("advantage.bootstrap_truncated", f"False with the {c.advantage.estimator} estimator (it has no "
              "value model to bootstrap from)", True)
    _check(c, "value.learning_rate", lambda v: _is_num(v) and v > 0, "a number > 0")
    _check(c, "value.clip", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    if estimator.value and not c.value.enabled:
        _fail("value.enabled", f"True with the {c.advantage.estimator} estimator (it needs a value model)",
              c.value.enabled)
    _check(c, "value.pretrain_steps", lambda v: _is_int(v) and 0 <= v < c.total_steps,
           "an int in [0, total_steps) (steps that train the value model alone)")
    if c.value.pretrain_steps and not c.value.enabled:
        _fail("value.pretrain_steps", "0 without a value model (value.enabled=False)", c.value.pretrain_steps)


def _validate_loss(c) -> None:
    _check_choice(c, "loss.ratio", rl.RATIOS)
    _check_choice(c, "loss.surrogate", rl.SURROGATES)
    _check(c, "loss.clip_low", lambda v: _is_num(v) and 0 <= v < 1, "in [0, 1)")
    _check(c, "loss.clip_high", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    _check(c, "loss.dual_clip", lambda v: _is_num(v) and (v == 0 or v > 1), "0 (off) or a number > 1")
    if c.loss.dual_clip and c.loss.surrogate != "clip":
        _fail("loss.dual_clip", f"0 with surrogate {c.loss.surrogate!r} (dual clip applies to 'clip' only)",
              c.loss.dual_clip)
    for f in ("loss.sapo_tau_pos", "loss.sapo_tau_neg", "loss.cispo_max"):
        _check(c, f, lambda v: _is_num(v) and v > 0, "a number > 0")
    _check_choice(c, "loss.aggregate", rl.AGGREGATE_MODES)
    _check(c, "loss.norm_length", lambda v: _is_int(v) and v >= 1, "a positive int (0 = max_new_tokens)")
    _check(c, "loss.nll_coef", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    _check(c, "loss.nll_threshold", _is_num, "a number")


def _validate_kl(c) -> None:
    _check(c, "kl.coef", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    _check_choice(c, "kl.estimator", rl.KL_KINDS)
    _check_choice(c, "kl.placement", rl.KL_PLACEMENTS)
    _check(c, "kl.target", lambda v: _is_num(v) and v > 0, "a number > 0")
    _check(c, "kl.horizon", lambda v: _is_num(v) and v > 0, "a number > 0")
    _check(c, "kl.importance_weighted", lambda v: isinstance(v, bool), "True or False")
    if c.kl.coef > 0 and c.kl.placement == "loss" and c.kl.estimator == "k1":
        _fail("kl.estimator", "k2, k3 or k3+ with kl.placement='loss' (k1's expected gradient is zero: "
              "E[grad log pi] = 0, so it would not pull towards the reference)", "k1")


def _validate_off_policy(c) -> None:
    _check(c, "rollout.compute_dtype", lambda v: v in ("", "float32", "bfloat16", "float16"),
           "'', float32, bfloat16 or float16")
    _check(c, "rollout.recompute_logprobs", lambda v: isinstance(v, bool), "True or False")
    _check_choice(c, "correction.mode", rl.CORRECTION_MODES)
    _check(c, "correction.cap", lambda v: _is_num(v) and v >= 0, "a number >= 0 (0 = the mode's default)")
    _check(c, "correction.lower", lambda v: _is_num(v) and v >= 0, "a number >= 0 (0 = 1/cap)")
    cap, lower = rl.correction_bounds(c.correction.mode, c.correction.cap, c.correction.lower)
    if c.correction.mode in rl.MASK_MODES and lower > cap:  # truncation modes never read the lower bound
        _fail("correction.lower", f"at most the cap {cap} (0 = 1/cap)", c.correction.lower)
    _check(c, "rollout.max_staleness", lambda v: _is_int(v) and 0 <= v < c.total_steps,
           "an int in [0, total_steps) (updates between the sampling policy and the trained one)")
    _check(c, "mesh.rollout_devices", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = sample on the training mesh)")
    _validate_partial(c)
    if c.rollout.max_staleness and not c.rollout.recompute_logprobs:
        _fail("rollout.recompute_logprobs", "True with rollout.max_staleness >= 1 (the behaviour policy is stale: "
              "the proximal log-probs must come from the trainer)", False)


def _validate_partial(c) -> None:
    """Partial rollouts (trainer/partial.py): what they need, and the options they cannot serve yet."""
    r = "rollout.partial"
    _check(c, r, lambda v: isinstance(v, bool), "True or False")
    if not c.rollout.partial:
        return
    if c.rollout.max_staleness < 2:
        _fail("rollout.max_staleness", "an int >= 2 with rollout.partial (it bounds each row's oldest token; the "
              "batch of step i is drawn by the policy of step i-1, so 1 leaves no update for a row to continue "
              "across)", c.rollout.max_staleness)
    if not c.rollout.decode_slots:
        _fail("rollout.decode_slots", "> 0 with rollout.partial (rows continue in the continuous-batching "
              "sampler's slots)", c.rollout.decode_slots)
    for field, value, why in (
            ("env.name", c.env.name, "multi-turn episodes are sampled turn by turn (sampling/turns.py), not in the "
             "slots partial rounds resume"),
            ("rollout.kv_page_size", c.rollout.kv_page_size, "the paged cache does not resume rows in flight"),
            ("dapo.dynamic_sampling", c.dapo.dynamic_sampling, "a partial batch is the first groups to complete; "
             "resampling rounds do not apply")):
        if value:
            _fail(field, f"off with rollout.partial ({why})", value)
    if c.distill.lmbda < 1:
        _fail("distill.lmbda", "1 with rollout.partial (supervised rows are not sampled)", c.distill.lmbda)


def _validate_training(c) -> None:
    _check(c, "ref.refresh_every", lambda v: _is_int(v) and v >= 0, "an int >= 0")
    _check(c, "ref.mix_alpha", lambda v: _is_num(v) and 0 < v <= 1, "in (0, 1]")
    _check(c, "train.epochs", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    _check(c, "train.minibatches", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    _check(c, "train.grad_accum", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    _check(c, "train.max_nonfinite_steps", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    if c.rollout.batch_prompts % c.train.minibatches:
        _fail("train.minibatches", f"a divisor of rollout.batch_prompts={c.rollout.batch_prompts}",
              c.train.minibatches)
    if (c.rollout.batch_prompts // c.train.minibatches) % c.train.grad_accum:
        _fail("train.grad_accum", "a divisor of the prompts per minibatch "
              f"({c.rollout.batch_prompts // c.train.minibatches})", c.train.grad_accum)
    _check(c, "train.pack_length", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = off)")
    _check(c, "train.pack_share_prompt", lambda v: isinstance(v, bool), "True or False")
    longest = c.data.max_prompt_length + c.rollout.max_new_tokens
    if _is_int(longest) and 0 < c.train.pack_length < longest:
        _fail("train.pack_length", f"0 (off) or at least data.max_prompt_length + rollout.max_new_tokens = {longest}, "
              "the longest prompt + completion", c.train.pack_length)
    _validate_token_budget(c, longest)
    o = "optimizer."
    _check(c, o + "learning_rate", lambda v: _is_num(v) and v > 0, "a number > 0")
    _check(c, o + "warmup_steps", lambda v: _is_int(v) and v >= 0, "an int >= 0")
    _check(c, o + "schedule", lambda v: v in ("constant", "cosine", "linear"), "constant, cosine or linear")
    _check(c, o + "min_lr_ratio", lambda v: _is_num(v) and 0 <= v <= 1, "in [0, 1]")
    _check(c, o + "weight_decay", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    for f in ("b1", "b2"):
        _check(c, o + f, lambda v: _is_num(v) and 0 <= v < 1, "in [0, 1)")
    _check(c, o + "eps", lambda v: _is_num(v) and v > 0, "a number > 0")
    _check(c, o + "max_grad_norm", lambda v: _is_num(v) and v >= 0, "a number >= 0 (0 = off)")


def _validate_token_budget(c, longest) -> None:
    """train.max_tokens_per_microbatch: 0, or room for the longest row (a packed row when packing) on a row
    shard: its mesh.sequence = C chips hold C times the budget (a row's tokens split over them)."""
    budget, pack = c.train.max_tokens_per_microbatch, c.train.pack_length
    seq = c.mesh.sequence if _is_int(c.mesh.sequence) and c.mesh.sequence > 0 else 1
    _check(c, "train.max_tokens_per_microbatch", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = off)")
    if budget and c.train.grad_accum != 1:
        _fail("train.grad_accum", "1 with train.max_tokens_per_microbatch > 0 (the token budget sets the "
              "micro-batches)", c.train.grad_accum)

    def over(tokens: int) -> str:  # a row's tokens split over the sequence axis
        if seq == 1:
            return " (or a mesh.sequence axis to split it over chips)"
        return f" over mesh.sequence = {seq} chips: {-(-tokens // seq)} per chip"
    if budget and pack and budget * seq < pack:
        _fail("train.max_tokens_per_microbatch", f"0 (off) or room for one packed row, train.pack_length = {pack} "
              f"tokens{over(pack)}", budget)
    if budget and not pack and _is_int(longest) and budget * seq < longest:
        _fail("train.max_tokens_per_microbatch", "0 (off) or room for the longest row, data.max_prompt_length + "
              f"rollout.max_new_tokens = {longest} tokens{over(longest)}", budget)


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


def _validate_lora(c) -> None:
    _check(c, "lora.rank", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = off)")
    _check(c, "lora.alpha", lambda v: _is_num(v) and v > 0, "a number > 0")
    _check(c, "lora.dropout", lambda v: _is_num(v) and 0 <= v < 1, "in [0, 1)")
    targets = [t.strip() for t in str(c.lora.targets).split(",")]
    if not all(t in LORA_TARGETS for t in targets) or len(set(targets)) != len(targets):
        _fail("lora.targets", f"distinct comma-separated names of {', '.join(LORA_TARGETS)}", c.lora.targets)
    if c.lora.rank and c.ref.refresh_every:
        _fail("ref.refresh_every", "0 with lora.rank > 0 (the reference is the frozen base itself)",
              c.ref.refresh_every)


def _validate_io(c) -> None:
    for f in ("mesh.data", "mesh.fsdp", "mesh.tensor", "mesh.expert"):
        _check(c, f, lambda v: _is_int(v) and (v >= 1 or v == -1), "a positive int or -1")
    # no -1 here: the token budget per chip and the layout of the rows need C before the devices are known
    _check(c, "mesh.sequence", lambda v: _is_int(v) and v >= 1, "a positive int")
    _check(c, "checkpoint.every_steps", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    _check(c, "checkpoint.max_to_keep", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    _check(c, "log.samples_every", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = never)")
    _check(c, "log.num_samples", lambda v: _is_int(v) and v >= 0, "an int >= 0")
    _check(c, "log.peak_flops", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    _check(c, "log.progress_every_s", lambda v: _is_num(v) and v > 0, "a number of seconds > 0")
    _check(c, "log.wandb", lambda v: isinstance(v, bool), "True or False")
    for f in ("wandb_project", "wandb_name", "wandb_entity"):
        _check(c, "log." + f, lambda v: isinstance(v, str), "a string")
    _check(c, "compilation_cache.dir", lambda v: isinstance(v, str), "a directory path, or '' (off)")
    _check(c, "compilation_cache.max_gb", lambda v: _is_num(v) and v > 0, "a number of GB > 0")
    _check(c, "export.dtype", lambda v: v in ("", "float32", "bfloat16", "float16"), "'', float32, bfloat16 or float16")
    _check(c, "reward.on_error", lambda v: v in ("raise", "zero"), "raise or zero")
    _check(c, "reward.self_test", lambda v: v in ("warn", "error", "off"), "warn, error or off")
    _check(c, "reward.completion_format", lambda v: v in ("auto", "text", "messages"), "auto, text or messages")


def _validate_env(c) -> None:
    check_env_name(c.env.name)
    _check(c, "env.max_turns", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    _check(c, "env.max_turn_tokens", lambda v: _is_int(v) and 0 <= v <= c.rollout.max_new_tokens,
           "an int in [0, rollout.max_new_tokens] (0 = rollout.max_new_tokens)")
    _check(c, "env.max_workers", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    _check(c, "env.stop_strings", lambda v: isinstance(v, (tuple, list)) and all(isinstance(x, str) and x for x in v),
           "a tuple of non-empty strings")
    _check(c, "env.max_failed_frac", lambda v: _is_num(v) and 0 <= v <= 1, "a fraction in [0, 1] (1 = never stop)")
    if c.env.name:
        check_env_config(c.env.name, c.env.kwargs.to_dict())
    if c.env.name and rl.ESTIMATORS.get(c.advantage.estimator) and rl.ESTIMATORS[c.advantage.estimator].process:
        raise ValueError(f"config.advantage.estimator={c.advantage.estimator!r} reads process rewards, which "
                         "index a single-turn completion's tokens; it cannot be used with env.name")


def _validate_eval(c) -> None:
    e = "eval."
    _check(c, e + "every_steps", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = off)")
    _check(c, e + "path", lambda v: isinstance(v, str), "a string")
    _check(c, e + "split", lambda v: isinstance(v, str) and v, "a split name, e.g. 'test'")
    _check(c, e + "num_prompts", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = all)")
    _check(c, e + "k", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    _check(c, e + "temperature", lambda v: _is_num(v) and v >= 0, "a number >= 0 (0 = greedy)")
    _check(c, e + "correct_threshold", _is_num, "a finite number")
    _check(c, e + "rewards", lambda v: isinstance(v, str), "a string of comma-separated reward functions")
    if c.eval.rewards.strip() and not all(s.strip() for s in c.eval.rewards.split(",")):
        _fail(e + "rewards", "comma-separated reward names without empty entries", c.eval.rewards)
    _check(c, e + "holdout", lambda v: _is_int(v) and v >= 0, "an int >= 0 (1 prompt in this many held out; 0 = none)")
    if c.eval.holdout == 1 and not c.eval.path and not c.data.task and not c.data.source:
        _fail(e + "holdout", "an int >= 2 or 0: 1 would hold out every prompt of data.path", c.eval.holdout)
    # A local file has one split ("train", whatever eval.split says): the same file is the training data.
    local = isinstance(c.eval.path, str) and c.eval.path and os.path.isfile(os.path.expanduser(c.eval.path))
    if c.eval.path and c.eval.path == c.data.path and (c.eval.split == c.data.split or local):
        _fail(e + "path", f"other prompts than the training data ({c.data.split!r} of {c.data.path!r}); leave "
              "eval.path empty to hold out 1 prompt in eval.holdout of data.path", c.eval.path)
