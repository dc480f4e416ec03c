"""The run configuration: every knob is a field; an algorithm preset only chooses defaults.

`base_config()` returns the full schema. Fields the presets decide are placeholders (None, typed) until
`resolve(config)` fills every one still unset from `PRESETS[config.algo]` -- so a command-line override
always wins, and `--config.algo=ppo` works as well as `configs/tiny.py:algo=ppo`.

`prepare(config)` is the one validation pass, run before anything is loaded or compiled: it rejects
fields that are not in the schema (with the nearest names), resolves the preset and checks every value
with a one-line error naming the field. The allowed values of the algorithm's choices (estimator,
surrogate, ratio, aggregation, KL estimator) are the keys of the registries in `jaxrl_llm.rl`.
`from_dict` builds a config from a Python dict (nested, or with dotted keys).
"""
from __future__ import annotations

import copy
import difflib
import math
from collections.abc import Mapping
from typing import Any

import ml_collections
from ml_collections.config_dict import placeholder

from jaxrl_llm import rl
from jaxrl_llm.data.config import default_data_config, validate_data_config

FREE_FORM = ("reward.kwargs",)  # sections whose keys are the user's (reward.kwargs.<fn>.<arg>)

_COMMON = {
    "loss.ratio": "token", "loss.surrogate": "clip", "loss.clip_low": 0.2, "loss.clip_high": 0.2,
    "loss.dual_clip": 0.0, "loss.aggregate": "seq-mean-token-mean", "loss.norm_length": 0,
    "advantage.estimator": "group", "advantage.scale": "group", "advantage.whiten": False,
    "kl.coef": 0.0, "kl.estimator": "k3", "kl.placement": "loss", "kl.adaptive": False,
    "entropy_coef": 0.0, "dapo.dynamic_sampling": False, "dapo.overlong_buffer": 0,
    "dapo.mask_truncated": False, "value.enabled": False,
}

# Defaults per algorithm, on top of _COMMON; docs/algorithms/ gives the reasons and the papers.
PRESETS = {
    "ppo": {"advantage.estimator": "gae", "advantage.whiten": True, "loss.aggregate": "token-mean",
            "kl.coef": 0.05, "kl.estimator": "k1", "kl.placement": "reward", "value.enabled": True},
    "grpo": {"kl.coef": 0.04},
    "dr_grpo": {"advantage.scale": "none", "loss.aggregate": "seq-mean-token-sum-norm"},
    "dapo": {"loss.clip_high": 0.28, "loss.aggregate": "token-mean", "dapo.dynamic_sampling": True,
             "dapo.overlong_buffer": -1},  # -1: a quarter of max_new_tokens
    "gspo": {"loss.ratio": "sequence", "loss.clip_low": 3e-4, "loss.clip_high": 4e-4},
    "gspo_token": {"loss.ratio": "sequence_token", "loss.clip_low": 3e-4, "loss.clip_high": 4e-4},
    "sapo": {"loss.surrogate": "sapo", "loss.aggregate": "token-mean"},
    "cispo": {"loss.surrogate": "cispo", "loss.aggregate": "token-mean"},
    "rloo": {"advantage.estimator": "rloo", "loss.aggregate": "token-mean"},
    "reinforce_pp": {"advantage.estimator": "reinforce_pp", "loss.aggregate": "token-mean", "kl.coef": 0.01,
                     "kl.estimator": "k1", "kl.placement": "reward"},
}
ALGOS = tuple(PRESETS)


def base_config() -> ml_collections.ConfigDict:
    """The full schema with its defaults; see the comment on each field."""
    c = ml_collections.ConfigDict()
    c.algo = "grpo"  # preset: ppo | grpo | dr_grpo | dapo | gspo | gspo_token | sapo | cispo | rloo | reinforce_pp
    c.seed = 0  # one seed for init, data order and sampling: same seed + config = same run
    c.total_steps = 100  # RL iterations (one rollout batch + its updates each)
    c.force_new = False  # start afresh in a workdir that holds a run with another config (old files kept aside)

    c.model = ml_collections.ConfigDict()
    c.model.path = ""  # local HF directory or hub name; "" builds the built-in tiny model below
    c.model.dtype = "float32"  # parameter dtype
    c.model.compute_dtype = "float32"  # matmul/activation dtype; "bfloat16" on accelerators
    c.model.remat = "none"  # "none" | "full" | "dots": recompute layers in backward to save memory
    c.model.logits_chunk = 128  # sequence chunk for log-probs: (rows, chunk, V) is the largest logits block
    c.model.hidden_size = 64  # built-in model only (model.path == "") ...
    c.model.num_layers = 2
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.intermediate_size = 128
    c.model.max_position_embeddings = 128

    c.tokenizer = ""  # tokenizer path or hub name; "" = model.path, or the built-in one for the built-in model

    c.data = default_data_config()
    c.data.task = ""  # a built-in synthetic task (e.g. "digit_puzzles") instead of data.path
    c.data.task_rows = 4096  # rows generated for the built-in task
    c.data.task_weights = (0.3, 0.3, 0.2, 0.2)  # sampling weight of each difficulty level of the task

    c.rollout = ml_collections.ConfigDict()
    c.rollout.batch_prompts = 8  # prompts per RL step (global, across hosts)
    c.rollout.group_size = 8  # completions per prompt (G); >= 2 for group estimators
    c.rollout.max_new_tokens = 64  # completion length T
    c.rollout.temperature = 1.0  # sampling temperature, also used by the trainer's log-probs
    c.rollout.top_k = 0  # 0 = off
    c.rollout.top_p = 1.0  # nucleus; 1.0 = off
    c.rollout.recompute_logprobs = False  # old log-probs from a trainer forward instead of the sampler's

    c.reward = ml_collections.ConfigDict()
    c.reward.functions = "math_answer"  # comma-separated registry names or module:function paths
    c.reward.weights = ""  # comma-separated weights, one per function; "" = all 1.0
    c.reward.kwargs = ml_collections.ConfigDict()  # per-function keyword arguments: reward.kwargs.<name>.<arg>
    c.reward.on_error = "raise"  # a reward fn that raises: "raise" (stop, naming fn and row) | "zero"

    c.advantage = ml_collections.ConfigDict()
    c.advantage.estimator = placeholder(str)  # gae | group | rloo | reinforce_pp
    c.advantage.scale = placeholder(str)  # group estimator: group | batch | none (Dr. GRPO)
    c.advantage.eps = 1e-6  # added to the std of group advantages
    c.advantage.whiten = placeholder(bool)  # whiten GAE advantages over the batch's valid tokens
    c.advantage.gamma = 1.0  # discount (GAE, REINFORCE++)
    c.advantage.lam = 0.95  # GAE lambda of the policy advantages
    c.advantage.lam_value = 1.0  # GAE lambda of the value targets (decoupled GAE)
    c.advantage.adaptive_lam_alpha = 0.0  # > 0: length-adaptive lambda = 1 - 1/(alpha*|o|) (VAPO)
    c.advantage.reinforce_pp_baseline = False  # REINFORCE++-baseline: subtract the group mean first

    c.loss = ml_collections.ConfigDict()
    c.loss.ratio = placeholder(str)  # token | sequence (GSPO) | sequence_token (GSPO-token)
    c.loss.surrogate = placeholder(str)  # clip | sapo | cispo
    c.loss.clip_low = placeholder(float)  # ratio clip 1 - clip_low
    c.loss.clip_high = placeholder(float)  # ratio clip 1 + clip_high (clip-higher when > clip_low)
    c.loss.dual_clip = placeholder(float)  # > 1 enables dual clip for negative advantages; 0 = off
    c.loss.sapo_tau_pos = 1.0  # SAPO gate temperature for positive advantages
    c.loss.sapo_tau_neg = 1.05  # SAPO gate temperature for negative advantages
    c.loss.cispo_max = 5.0  # CISPO ratio cap
    c.loss.aggregate = placeholder(str)  # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
    c.loss.norm_length = placeholder(int)  # L of seq-mean-token-sum-norm; 0 = max_new_tokens

    c.kl = ml_collections.ConfigDict()
    c.kl.coef = placeholder(float)  # beta; 0 = no reference model
    c.kl.estimator = placeholder(str)  # k1 | k2 | k3
    c.kl.placement = placeholder(str)  # loss (GRPO) | reward (PPO, REINFORCE++)
    c.kl.adaptive = placeholder(bool)  # adaptive beta (PPO): beta *= 1 + clip(KL/target - 1, +-0.2) * n/horizon
    c.kl.target = 0.1  # adaptive controller target KL
    c.kl.horizon = 10000  # adaptive controller horizon (in samples)

    c.entropy_coef = placeholder(float)  # entropy bonus c_H

    c.dapo = ml_collections.ConfigDict()
    c.dapo.dynamic_sampling = placeholder(bool)  # drop groups with equal rewards and resample to fill the batch
    c.dapo.max_sample_rounds = 4  # bound on sampling rounds per step with dynamic sampling
    c.dapo.overlong_buffer = placeholder(int)  # overlong shaping buffer L_buf in tokens; 0 = off; -1 = T/4
    c.dapo.mask_truncated = placeholder(bool)  # exclude completions without EOS from the loss

    c.value = ml_collections.ConfigDict()
    c.value.enabled = placeholder(bool)  # train a value model (PPO)
    c.value.init = "policy"  # "policy" (copy of the policy backbone) or a HF *ForSequenceClassification dir
    c.value.learning_rate = 1e-5  # value model AdamW learning rate
    c.value.clip = 0.2  # value clipping range around the old values; 0 = off

    c.ref = ml_collections.ConfigDict()
    c.ref.refresh_every = 0  # > 0: every K steps, ref <- mix_alpha*policy + (1 - mix_alpha)*ref
    c.ref.mix_alpha = 1.0  # 1.0 replaces the reference by the policy

    c.train = ml_collections.ConfigDict()
    c.train.epochs = 1  # passes over each rollout batch
    c.train.minibatches = 1  # optimizer steps per epoch (the batch splits into whole prompt groups)
    c.train.grad_accum = 1  # micro-batches per optimizer step; the loss is normalized over the minibatch
    c.train.max_nonfinite_steps = 3  # stop after this many consecutive skipped (NaN/inf) updates

    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.learning_rate = 1e-6  # peak learning rate (AdamW)
    c.optimizer.warmup_steps = 0  # linear warmup, in optimizer steps
    c.optimizer.schedule = "constant"  # after warmup: constant | cosine | linear (to min_lr_ratio)
    c.optimizer.min_lr_ratio = 0.0  # final lr / peak lr for cosine and linear
    c.optimizer.weight_decay = 0.0  # decoupled weight decay
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.999
    c.optimizer.eps = 1e-8
    c.optimizer.max_grad_norm = 1.0  # global-norm clipping; 0 = off

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1  # data-parallel axis; -1 takes the remaining devices
    c.mesh.fsdp = -1  # fully sharded data-parallel axis
    c.mesh.tensor = 1  # tensor-parallel axis

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every_steps = 50  # also saved at the end
    c.checkpoint.max_to_keep = 3
    c.checkpoint.async_save = True  # write in the background while training continues

    c.log = ml_collections.ConfigDict()
    c.log.samples_every = 10  # write a few prompt/completion/reward triples every k steps
    c.log.num_samples = 4
    c.log.tensorboard = True
    c.log.progress = True  # tqdm progress bar
    c.log.peak_flops = 0.0  # per-device peak FLOP/s for perf/mfu; 0 = from the device kind

    c.export = ml_collections.ConfigDict()
    c.export.at_end = True  # write a Hugging Face model (with tokenizer) to <workdir>/hf at the end
    c.export.dtype = ""  # "" = parameter dtype, or e.g. "bfloat16"
    c.export.plot = True  # PNG of reward, KL and length curves at the end
    return c


def _set_path(c, path: str, value):
    *parents, leaf = path.split(".")
    for p in parents:
        c = c[p]
    c[leaf] = value


def _get_path(c, path: str):
    for p in path.split("."):
        c = c[p]
    return c


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy with every placeholder still None filled from the preset of `config.algo`."""
    if config.algo not in PRESETS:
        raise ValueError(f"algo {config.algo!r} is unknown; expected one of {', '.join(ALGOS)}")
    c = copy.deepcopy(config)
    for path, value in {**_COMMON, **PRESETS[c.algo]}.items():
        if _get_path(c, path) is None:
            _set_path(c, path, value)
    if c.dapo.overlong_buffer == -1:
        c.dapo.overlong_buffer = max(1, c.rollout.max_new_tokens // 4)
    if c.loss.norm_length == 0:
        c.loss.norm_length = c.rollout.max_new_tokens
    return c


def reward_specs(config) -> list[tuple[str, float]]:
    """[(spec, weight)] from reward.functions / reward.weights, with DAPO's overlong shaping added."""
    names = [s.strip() for s in config.reward.functions.split(",") if s.strip()]
    weights = [w.strip() for w in config.reward.weights.split(",") if w.strip()]
    if not names:
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
    value = _get_path(c, field)
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
    _validate_io(c)
    reward_specs(c)


def _validate_model_and_data(c) -> None:
    _check(c, "algo", lambda v: v in ALGOS, f"one of {', '.join(ALGOS)}")
    _check(c, "seed", lambda v: _is_int(v) and v >= 0, "a non-negative int")
    _check(c, "total_steps", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    for f in ("model.dtype", "model.compute_dtype"):
        _check(c, f, lambda v: v in ("float32", "bfloat16", "float16"), "float32, bfloat16 or float16")
    _check(c, "model.remat", lambda v: v in ("none", "full", "dots"), "none, full or dots")
    for f in ("model.logits_chunk", "model.hidden_size", "model.num_layers", "model.num_heads",
              "model.num_kv_heads", "model.intermediate_size", "model.max_position_embeddings"):
        _check(c, f, lambda v: _is_int(v) and v >= 1, "a positive int")
    if c.model.num_heads % c.model.num_kv_heads or c.model.hidden_size % c.model.num_heads:
        _fail("model.num_kv_heads", "a divisor of model.num_heads (which must divide hidden_size)",
              c.model.num_kv_heads)
    validate_data_config(c.data)
    if not c.data.path and not c.data.task:
        raise ValueError("config.data.path and config.data.task are both empty; set one")
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


def _validate_objective(c) -> None:
    """The algorithm's fields: allowed names come from the registries of `jaxrl_llm.rl`."""
    _check_choice(c, "advantage.estimator", rl.ESTIMATORS)
    estimator = rl.ESTIMATORS[c.advantage.estimator]
    if (estimator.group or c.advantage.reinforce_pp_baseline) and c.rollout.group_size < 2:
        _fail("rollout.group_size", f"at least 2 for algo {c.algo} (group baselines need G >= 2)",
              c.rollout.group_size)
    _check_choice(c, "advantage.scale", rl.ADVANTAGE_SCALES)
    _check(c, "advantage.eps", lambda v: _is_num(v) and v > 0, "a number > 0")
    for f in ("advantage.gamma", "advantage.lam", "advantage.lam_value"):
        _check(c, f, lambda v: _is_num(v) and 0 <= v <= 1, "in [0, 1]")
    _check(c, "advantage.adaptive_lam_alpha", lambda v: _is_num(v) and v >= 0, "a number >= 0")
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
    _check(c, "kl.coef", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    _check_choice(c, "kl.estimator", rl.KL_KINDS)
    _check_choice(c, "kl.placement", rl.KL_PLACEMENTS)
    _check(c, "kl.target", lambda v: _is_num(v) and v > 0, "a number > 0")
    _check(c, "kl.horizon", lambda v: _is_num(v) and v > 0, "a number > 0")
    if c.kl.placement == "reward" and not estimator.token_rewards and c.kl.coef > 0:
        _fail("kl.placement", f"'loss' with the {c.advantage.estimator} estimator (it only sees sequence scores)",
              c.kl.placement)
    _check(c, "entropy_coef", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    _check(c, "dapo.max_sample_rounds", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    _check(c, "dapo.overlong_buffer", lambda v: _is_int(v) and 0 <= v <= c.rollout.max_new_tokens,
           "an int in [0, rollout.max_new_tokens]")
    if c.dapo.dynamic_sampling and c.rollout.group_size < 2:
        _fail("rollout.group_size", "at least 2 with dapo.dynamic_sampling", c.rollout.group_size)
    _check(c, "value.learning_rate", lambda v: _is_num(v) and v > 0, "a number > 0")
    _check(c, "value.clip", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    if estimator.value and not c.value.enabled:
        _fail("value.enabled", f"True with the {c.advantage.estimator} estimator (it needs a value model)",
              c.value.enabled)


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


def _validate_io(c) -> None:
    for f in ("mesh.data", "mesh.fsdp", "mesh.tensor"):
        _check(c, f, lambda v: _is_int(v) and (v >= 1 or v == -1), "a positive int or -1")
    _check(c, "checkpoint.every_steps", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    _check(c, "checkpoint.max_to_keep", lambda v: _is_int(v) and v >= 1, "an int >= 1")
    _check(c, "log.samples_every", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = never)")
    _check(c, "log.num_samples", lambda v: _is_int(v) and v >= 0, "an int >= 0")
    _check(c, "log.peak_flops", lambda v: _is_num(v) and v >= 0, "a number >= 0")
    _check(c, "export.dtype", lambda v: v in ("", "float32", "bfloat16", "float16"), "'', float32, bfloat16 or float16")
    _check(c, "reward.on_error", lambda v: v in ("raise", "zero"), "raise or zero")


# ------------------------------------------------------------------------- the schema's own fields
def check_fields(c: ml_collections.ConfigDict, schema: ml_collections.ConfigDict | None = None, prefix: str = "") -> None:
    """Rejects any field that is not in the schema of `base_config()` (a typo in a config file or dict
    would otherwise be kept silently while the run used the default), naming the nearest fields."""
    schema = base_config() if schema is None else schema
    for key in c.keys():
        path = prefix + key
        if path in FREE_FORM:
            continue
        if key not in schema:
            raise ValueError(f"config.{path} is not a config field{_suggest(key, schema, prefix)}")
        sub, want = c[key], schema[key]
        if isinstance(want, ml_collections.ConfigDict):
            if not isinstance(sub, (ml_collections.ConfigDict, Mapping)):
                raise ValueError(f"config.{path} is a section of fields, got {sub!r}")
            check_fields(sub if isinstance(sub, ml_collections.ConfigDict) else ml_collections.ConfigDict(sub),
                         want, path + ".")
        elif isinstance(sub, ml_collections.ConfigDict):
            raise ValueError(f"config.{path} is a field, not a section")


def _suggest(key: str, schema: ml_collections.ConfigDict, prefix: str) -> str:
    close = difflib.get_close_matches(key, list(schema.keys()), n=3, cutoff=0.6)
    if not close:
        return f" (fields of config{'.' + prefix[:-1] if prefix else ''}: {', '.join(sorted(schema.keys()))})"
    return "; did you mean " + " or ".join(f"{prefix}{k}" for k in close) + "?"


def from_dict(values: Mapping[str, Any], base: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
    """`base` (default `base_config()`) with `values` set on a copy: a nested dict, dotted keys
    ("rollout.group_size"), or both. An unknown field is an error naming the nearest ones."""
    c = copy.deepcopy(base_config() if base is None else base)
    for key, value in _flatten(values):
        *parents, leaf = key.split(".")
        node, path = c, ""
        for p in parents:
            if p not in node:
                if not _free_form(path + p):
                    raise ValueError(f"config.{path + p} is not a config section{_suggest(p, node, path)}")
                node[p] = ml_collections.ConfigDict()
            node, path = node[p], path + p + "."
        if leaf not in node and not _free_form(path + leaf):
            raise ValueError(f"config.{path + leaf} is not a config field{_suggest(leaf, node, path)}")
        try:
            node[leaf] = value
        except TypeError as e:  # a typed field given another type
            raise ValueError(f"config.{path + leaf}: {' '.join(str(e).split())}") from None
    return c


def _free_form(path: str) -> bool:
    return any(path.startswith(f + ".") for f in FREE_FORM)


def _flatten(values: Mapping[str, Any], prefix: str = ""):
    for key, value in values.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"config keys must be non-empty strings, got {key!r}")
        if isinstance(value, Mapping) and value:  # a ConfigDict is no Mapping: it is set whole
            yield from _flatten(value, prefix + key + ".")
        else:
            yield prefix + key, value


def prepare(config: ml_collections.ConfigDict | Mapping[str, Any]) -> ml_collections.ConfigDict:
    """The one validation pass: schema fields, then the preset, then every value. Returns the resolved
    copy that the run uses. A dict is read with `from_dict`. Idempotent."""
    c = config if isinstance(config, ml_collections.ConfigDict) else from_dict(config)
    check_fields(c)
    c = resolve(c)
    validate(c)
    return c
