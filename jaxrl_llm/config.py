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
import os
from collections.abc import Mapping
from typing import Any

import ml_collections
from ml_collections.config_dict import placeholder

from jaxrl_llm.data.config import default_data_config
from jaxrl_llm.presets import ALGOS, PRESETS, preset_defaults
from jaxrl_llm.field_names import FREE_FORM, check_fields, suggest_fields
from jaxrl_llm.validation import get_path, reward_specs, validate

__all__ = ["ALGOS", "PRESETS", "base_config", "from_dict", "prepare", "resolve", "reward_specs", "validate"]


def base_config() -> ml_collections.ConfigDict:
    """The full schema with its defaults; see the comment on each field.

    One function per section below, called in the schema's order (the order `to_dict()` keeps): each
    declares its fields in order, every one with the comment that documents it."""
    c = ml_collections.ConfigDict()
    c.algo = "grpo"  # preset: ppo | grpo | dr_grpo | dapo | gspo | gspo_token | sapo | cispo | rloo | reinforce_pp | opd | gkd
    c.seed = 0  # one seed for init, data order and sampling: same seed + config = same run
    c.total_steps = 100  # RL iterations (one rollout batch + its updates each)
    c.force_new = False  # start afresh in a workdir that holds a run with another config (old files kept aside)
    _model(c)
    _data(c)
    _rollout(c)
    _reward(c)
    _env(c)
    _advantage(c)
    _loss(c)
    _dapo(c)
    _value(c)
    _distill(c)
    _ref(c)
    _train(c)
    _mesh(c)
    _outputs(c)
    _eval(c)
    return c


def _model(c: ml_collections.ConfigDict) -> None:
    """The policy model (a checkpoint or the built-in tiny one), its LoRA adapters and the tokenizer."""
    c.model = ml_collections.ConfigDict()
    c.model.path = ""  # local HF directory or hub name; "" builds the built-in tiny model below
    c.model.dtype = "float32"  # parameter dtype
    c.model.routing_replay = True  # mixture-of-experts: the trainer's passes reuse the sampler's experts
    # MoE router losses in the update (rl/router.py), 0 = off as transformers' default (output_router_logits
    # False); the checkpoints' own coefficients: Qwen3-MoE 0.001, Mixtral 0.02
    c.model.router_aux_loss_coef = 0.0  # load-balancing loss (Switch / Mixtral)
    c.model.router_z_loss_coef = 0.0  # router z-loss (ST-MoE)
    c.model.compute_dtype = "float32"  # matmul/activation dtype; "bfloat16" on accelerators
    # "none" | "dots" | "full": what the backward recomputes (the gradients are the same). "dots" keeps the
    # matmul outputs and recomputes the elementwise work: at SmolLM2-135M's shape the update's peak RSS is
    # 4.68 GiB against 6.16 with "none", in the same CPU time; "full" keeps only the layer inputs: 4.41 GiB
    # at +23% update CPU (docs/benchmarks.md, "remat, measured"; TRL's gradient_checkpointing is "full")
    c.model.remat = "dots"
    # tokens per row of a log-prob chunk, at most: fewer when rows x chunk x V float32 logits would pass 64 MiB
    # (models/lm.py logits_chunk_for); (rows, chunk, V) is the largest logits block
    c.model.logits_chunk = 128
    c.model.attention = "auto"  # auto | xla | blockwise | cudnn (GPU) | splash (TPU); docs/attention.md
    c.model.attention_block = 256  # blockwise attention's query and key tile, in tokens
    c.model.hidden_size = 64  # built-in model only (model.path == "") ...
    c.model.num_layers = 2
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.intermediate_size = 128
    c.model.max_position_embeddings = 128

    c.lora = ml_collections.ConfigDict()  # LoRA: adapters on a frozen base (docs/lora.md)
    c.lora.rank = 0  # adapter rank r; 0 = off (full fine-tuning)
    c.lora.alpha = 16.0  # the adapters' output is scaled by alpha / rank
    c.lora.targets = "q,k,v,o,gate,up,down"  # comma-separated projections that get adapters
    c.lora.dropout = 0.0  # dropout on the adapters' input in the update's forward (never when sampling/scoring)

    c.tokenizer = ""  # tokenizer path or hub name; "" = model.path, or the built-in one for the built-in model


def _data(c: ml_collections.ConfigDict) -> None:
    """The training prompts: `data.*` of data/config.py, and the built-in synthetic task."""
    c.data = default_data_config()
    c.data.task = ""  # a built-in synthetic task (e.g. "digit_puzzles") instead of data.path
    c.data.task_rows = 4096  # rows generated for the built-in task
    c.data.task_weights = (0.3, 0.3, 0.2, 0.2)  # sampling weight of each difficulty level of the task
    c.data.source = ""  # "" (data.path, or data.task) | "reasoning_gym" (generated rows of data.reasoning_gym's tasks)
    # reasoning-gym tasks as data and reward (pip install reasoning-gym; docs/data.md, "reasoning-gym tasks")
    c.data.reasoning_gym = ml_collections.ConfigDict()
    c.data.reasoning_gym.tasks = ""  # comma-separated task[:weight], e.g. "spell_backward, chain_sum:2"
    c.data.reasoning_gym.options = ml_collections.ConfigDict()  # generator options: options.<task>.<field>
    c.data.reasoning_gym.rows = 4096  # training rows generated from the seed (the held-out ones: eval.num_prompts)
    c.data.reasoning_gym.curriculum = False  # raise a task's difficulty level when its training reward passes the threshold
    c.data.reasoning_gym.curriculum_threshold = 0.7  # mean training reward of a task over the window that raises its level
    c.data.reasoning_gym.curriculum_window = 10  # steps whose mean training reward is compared to the threshold


def _rollout(c: ml_collections.ConfigDict) -> None:
    """Sampling the completions, and the correction between the sampler's policy and the trainer's."""
    c.rollout = ml_collections.ConfigDict()
    c.rollout.batch_prompts = 8  # prompts per RL step (global, across hosts)
    c.rollout.group_size = 8  # completions per prompt (G); >= 2 for group estimators
    c.rollout.max_new_tokens = 64  # completion length T
    c.rollout.temperature = 1.0  # sampling temperature, also used by the trainer's log-probs
    c.rollout.top_k = 0  # 0 = off
    c.rollout.top_p = 1.0  # nucleus; 1.0 = off
    c.rollout.min_p = 0.0  # keep tokens with probability >= min_p x the most likely one's (after top-p); 0 = off
    c.rollout.repetition_penalty = 1.0  # logits of tokens in prompt+completion: /p if > 0, *p if < 0; 1 = off
    c.rollout.decode_slots = 0  # rows decoded at once, a finished row's slot taking the next (0 = all; docs/sampling.md)
    # k >= 2: the static batch's decode goes on over rows/k rows once at most that many are still decoding,
    # then rows/k^2 ... (0 = off): faster decode steps with heavy-tailed lengths, one more compile per phase
    c.rollout.decode_shrink = 0
    # > 0: the slots' KV cache is paged (sampling/paged.py, docs/sampling.md): pages of this many tokens,
    # taken as rows grow and returned when they end (with decode_slots > 0; 0 = off)
    c.rollout.kv_page_size = 0
    c.rollout.kv_pages = 0  # pages per row shard of the mesh (0 = auto: from the memory left, printed at start-up)
    c.rollout.recompute_logprobs = placeholder(bool)  # proximal log-probs from a trainer forward (else = behaviour)
    c.rollout.compute_dtype = ""  # the sampler's compute dtype; "" = model.compute_dtype (e.g. a bfloat16 sampler)
    c.rollout.max_staleness = 0  # k: step i's batch is sampled by the policy after update i-k (0 = synchronous); docs/algorithms/async.md
    # Partial rollouts (docs/algorithms/async.md): the decode goes on across updates, rows in flight continue with
    # each new policy; a batch is the first batch_prompts groups to complete; max_staleness (>= 2) then bounds each
    # row's oldest token (with decode_slots > 0)
    c.rollout.partial = False

    # Rollout correction between the behaviour policy (the sampler's, with its precision, top-k/top-p
    # and staleness) and the proximal one; docs/algorithms/off_policy.md.
    c.correction = ml_collections.ConfigDict()
    c.correction.mode = placeholder(str)  # none (token_truncate when rollout.max_staleness >= 1) | token_truncate | token_mask | sequence_truncate | sequence_mask | geometric_mask
    c.correction.cap = 0.0  # upper bound of the ratio; 0 = the mode's default (2, or 1.001 for geometric_mask)
    c.correction.lower = 0.0  # lower bound of the mask modes; 0 = 1/cap


def _reward(c: ml_collections.ConfigDict) -> None:
    """The reward functions that score the completions."""
    c.reward = ml_collections.ConfigDict()
    c.reward.functions = "math_answer"  # comma-separated registry names or module:function paths
    c.reward.weights = ""  # comma-separated weights, one per function; "" = all 1.0
    c.reward.kwargs = ml_collections.ConfigDict()  # per-function keyword arguments: reward.kwargs.<name>.<arg>
    c.reward.on_error = "raise"  # a reward fn that raises: "raise" (stop, naming fn and row) | "zero"
    c.reward.self_test = "warn"  # start-up reward check on probe completions; one paid like a correct answer: warn | error | off (no check)
    c.reward.completion_format = "auto"  # completions to user reward functions: auto (TRL's message lists for a conversational dataset, else strings) | text | messages


def _env(c: ml_collections.ConfigDict) -> None:
    """Multi-turn episodes."""
    # Multi-turn episodes with an environment (jaxrl_llm/envs, docs/environments.md); off by default.
    c.env = ml_collections.ConfigDict()
    c.env.name = ""  # "" = off (single turn); a registered environment (guess_digit, tools, openenv, agent, verifiers) or "module:Class"
    c.env.kwargs = ml_collections.ConfigDict()  # keyword arguments of the environment: env.kwargs.<arg>
    c.env.max_turns = 4  # model turns per episode at most; rollout.max_new_tokens bounds all its tokens
    c.env.max_turn_tokens = 0  # tokens of one model turn at most; 0 = rollout.max_new_tokens
    c.env.max_workers = 8  # threads running the environment's steps of a batch (slow tools)
    # A model turn also ends where its text first contains one of these (e.g. "</answer>", ReAct's
    # "Observation:"); the string stays in the turn, the tokens drawn after it are dropped.
    c.env.stop_strings = ()
    # An episode that failed (the environment or agent raised, hung past its timeout, returned something the
    # runner cannot use, lost its server: a named status, docs/environments.md "Failed episodes") keeps its
    # turns' rewards so far and counts in env/failed/<status>_frac; more than this fraction of a batch's
    # episodes failing stops the run with one line naming the cause (1 = never stop).
    c.env.max_failed_frac = 0.5


def _advantage(c: ml_collections.ConfigDict) -> None:
    """The advantage estimator."""
    c.advantage = ml_collections.ConfigDict()
    c.advantage.estimator = placeholder(str)  # gae | group | group_process | rloo | reinforce_pp | none (distillation alone)
    c.advantage.scale = placeholder(str)  # group estimator: group | batch | none (Dr. GRPO)
    c.advantage.eps = 1e-6  # added to the std of group advantages
    c.advantage.whiten = placeholder(bool)  # whiten over the batch: GAE's per token, RLOO's per row
    c.advantage.gamma = 1.0  # discount (GAE, REINFORCE++)
    c.advantage.lam = 0.95  # GAE lambda of the policy advantages
    c.advantage.lam_value = 1.0  # GAE lambda of the value targets (decoupled GAE); -1 = advantage.lam (classic PPO)
    c.advantage.adaptive_lam_alpha = 0.0  # > 0: length-adaptive lambda = 1 - 1/(alpha*|o|) (VAPO)
    c.advantage.reinforce_pp_baseline = False  # REINFORCE++-baseline: subtract the group mean first
    c.advantage.bootstrap_truncated = False  # GAE: V(s_T) at the cut of a truncated completion instead of 0


def _loss(c: ml_collections.ConfigDict) -> None:
    """The policy loss: ratio, surrogate, clipping and aggregation; the KL penalty; the entropy bonus."""
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
    c.loss.nll_coef = 0.0  # VAPO: weight of the negative log-likelihood of completions that score well
    c.loss.nll_threshold = 1.0  # ... those whose score is at least this

    c.kl = ml_collections.ConfigDict()
    c.kl.coef = placeholder(float)  # beta; 0 = no reference model
    c.kl.estimator = placeholder(str)  # k1 | k2 | k3 | k3+ (k3's value, k2's gradient)
    c.kl.placement = placeholder(str)  # loss (GRPO) | reward (PPO, REINFORCE++)
    c.kl.adaptive = placeholder(bool)  # adaptive beta (PPO): beta *= 1 + clip(KL/target - 1, +-0.2) * n/horizon
    c.kl.target = 0.1  # adaptive controller target KL
    c.kl.horizon = 10000  # adaptive controller horizon (in samples)
    c.kl.importance_weighted = False  # weight the KL-in-loss term by current/proximal (exact on later minibatches)

    c.entropy_coef = placeholder(float)  # entropy bonus c_H


def _dapo(c: ml_collections.ConfigDict) -> None:
    """DAPO's sampling and length knobs."""
    c.dapo = ml_collections.ConfigDict()
    c.dapo.dynamic_sampling = placeholder(bool)  # drop groups with equal rewards and resample to fill the batch
    c.dapo.max_sample_rounds = 4  # bound on sampling rounds per step with dynamic sampling
    c.dapo.overlong_buffer = placeholder(int)  # overlong shaping buffer L_buf in tokens; 0 = off; -1 = T/4
    c.dapo.mask_truncated = placeholder(bool)  # exclude completions without EOS from the loss
    c.dapo.filter_on = ""  # what dynamic sampling filters on: "" = the rewards but length shaping | total | <fn>


def _value(c: ml_collections.ConfigDict) -> None:
    """The value model (PPO, VAPO)."""
    c.value = ml_collections.ConfigDict()
    c.value.enabled = placeholder(bool)  # train a value model (PPO)
    c.value.init = "policy"  # "policy" (copy of the policy backbone) or a HF *ForSequenceClassification dir
    c.value.learning_rate = 1e-5  # value model AdamW learning rate
    c.value.clip = 0.2  # value clipping range around the old values; 0 = off
    c.value.pretrain_steps = 0  # VAPO: first steps train only the value model (on the returns), policy frozen


def _distill(c: ml_collections.ConfigDict) -> None:
    """On-policy distillation: the teacher and the distillation objective."""
    # On-policy distillation (docs/algorithms/distillation.md): on when teacher.path is set.
    c.teacher = ml_collections.ConfigDict()
    c.teacher.path = ""  # the teacher: local HF directory or hub name (same tokenizer as the policy); "" = none
    c.teacher.dtype = ""  # the teacher's parameter dtype; "" = model.dtype (frozen, never checkpointed)
    c.distill = ml_collections.ConfigDict()
    c.distill.kind = placeholder(str)  # opd (reverse KL of sampled tokens as advantage) | gkd (generalized JSD over the vocabulary, in the loss)
    c.distill.coef = 1.0  # weight of the distillation advantage (opd) or loss term (gkd) next to the rewards' advantage
    c.distill.beta = 0.5  # gkd: 0 = forward KL(teacher||student), 1 = reverse KL(student||teacher)
    c.distill.gamma = 0.0  # opd: discount of the per-token rewards (0 = each token's own)
    c.distill.vocab_chunk = 4096  # gkd: vocabulary columns per chunk ((rows, T, chunk) is the largest block)
    c.distill.lmbda = 1.0  # gkd: fraction of each batch's prompts on-policy (TRL's lmbda); the others supervised
    c.distill.seq_kd = False  # TRL's seq_kd (teacher-sampled supervised rows): refused, see distillation.md


def _ref(c: ml_collections.ConfigDict) -> None:
    """The reference model's refresh."""
    c.ref = ml_collections.ConfigDict()
    c.ref.refresh_every = 0  # > 0: every K steps, ref <- mix_alpha*policy + (1 - mix_alpha)*ref
    c.ref.mix_alpha = 1.0  # 1.0 replaces the reference by the policy


def _train(c: ml_collections.ConfigDict) -> None:
    """The updates on each rollout batch, and the optimizer."""
    c.train = ml_collections.ConfigDict()
    c.train.epochs = 1  # passes over each rollout batch
    c.train.minibatches = 1  # optimizer steps per epoch (the batch splits into whole prompt groups)
    c.train.grad_accum = 1  # micro-batches per optimizer step; the loss is normalized over the minibatch
    c.train.pack_length = 0  # >0: score/update passes pack prompt+completion rows into rows of this many tokens; 0 = off
    c.train.max_tokens_per_microbatch = 0  # >0: score/update micro-batches of rows by this many tokens per data*fsdp
    # shard (prompt + completion slots; packed rows of pack_length when packing), groups split freely; 0 = off
    c.train.pack_share_prompt = True  # packed rows hold a prompt once for its completions in that row (else once
    # each); where the attention is splash (TPU) the trainer keeps a copy each: the kernel has no mask for it
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


def _mesh(c: ml_collections.ConfigDict) -> None:
    """The device mesh."""
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1  # data-parallel axis; -1 takes the remaining devices
    c.mesh.fsdp = -1  # fully sharded data-parallel axis
    c.mesh.tensor = 1  # tensor-parallel axis
    c.mesh.expert = 1  # expert-parallel axis: shards the experts of mixture-of-experts models
    c.mesh.sequence = 1  # context-parallel axis: splits each row's tokens in the score/update passes (docs/scaling.md)
    c.mesh.rollout_devices = 0  # r > 0: the last r devices sample while the others train (r/P per host on P processes); docs/algorithms/async.md


def _outputs(c: ml_collections.ConfigDict) -> None:
    """What a run writes: checkpoints, logs, the exported model, the compilation cache."""
    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every_steps = 50  # also saved at the end
    c.checkpoint.max_to_keep = 3
    c.checkpoint.async_save = True  # write in the background while training continues

    c.log = ml_collections.ConfigDict()
    c.log.samples_every = 10  # write a few prompt/completion/reward triples every k steps
    c.log.num_samples = 4
    c.log.tensorboard = True
    c.log.progress = True  # tqdm progress bar on a terminal; otherwise one line every log.progress_every_s
    c.log.progress_every_s = 30.0  # seconds between progress lines when stderr is not a terminal (a log file)
    c.log.wandb = False  # also log the scalars and the samples (a table) to Weights & Biases (pip install wandb)
    c.log.wandb_project = "jaxrl_llm"  # W&B project
    c.log.wandb_name = ""  # W&B run name; "" = W&B's own
    c.log.wandb_entity = ""  # W&B entity (user or team); "" = your default
    c.log.peak_flops = 0.0  # per-device peak FLOP/s for perf/mfu; 0 = from the device kind

    c.export = ml_collections.ConfigDict()
    c.export.at_end = True  # write a Hugging Face model (with tokenizer) to <workdir>/hf at the end
    c.export.dtype = ""  # "" = parameter dtype, or e.g. "bfloat16"
    c.export.plot = True  # PNG of reward, KL and length curves at the end

    # JAX's persistent compilation cache, set by the command lines (train, evaluate) only: a rerun, a resume
    # or another run at the same shapes reads its programs instead of compiling them (programs that compile
    # in under a second are not kept). From Python: jax.config.update("jax_compilation_cache_dir", DIR).
    c.compilation_cache = ml_collections.ConfigDict()
    c.compilation_cache.dir = "~/.cache/jaxrl_llm/jax"  # "" = off; $XDG_CACHE_HOME replaces ~/.cache; JAX_COMPILATION_CACHE_DIR wins
    c.compilation_cache.max_gb = 10.0  # beyond this the least recently used programs are evicted


def _eval(c: ml_collections.ConfigDict) -> None:
    """Held-out evaluation."""
    c.eval = ml_collections.ConfigDict()  # held-out evaluation (jaxrl_llm/evaluate), also `python -m jaxrl_llm.evaluate`
    c.eval.every_steps = 0  # evaluate before the first step, every k steps and at the end; 0 = off
    c.eval.path = ""  # held-out prompts, read like data.path (same columns); "" = the held-out split of data.task or data.source
    c.eval.split = "test"  # split of eval.path; a local file's one split is used when left at "test"
    c.eval.holdout = 8  # data.path, no eval.path: 1 prompt in this many (by hash) held out, never trained; 0 = eval off
    c.eval.num_prompts = 128  # the first n held-out prompts, always the same ones; 0 = all
    c.eval.k = 8  # samples per prompt: pass@1, pass@2, pass@4, ..., pass@k and maj@k
    c.eval.temperature = 1.0  # 0 = greedy, then one sample per prompt (k = 1)
    c.eval.correct_threshold = 1.0  # a sample is correct when its score reaches this
    c.eval.rewards = ""  # comma-separated reward functions scoring the samples; "" = reward.functions/weights


def _set_path(c, path: str, value):
    *parents, leaf = path.split(".")
    for p in parents:
        c = c[p]
    c[leaf] = value


def from_file(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """`get_config(arg)` of the config file at `path` (config files are not a package: one config builds on
    another, e.g. configs/tiny_multiturn.py on configs/tiny.py, by loading it by path)."""
    import importlib.util
    import os
    name = "_config_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"config file {path!r} cannot be loaded (expected a Python file with get_config)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy with every placeholder still None filled from the preset of `config.algo`."""
    if config.algo not in PRESETS:
        raise ValueError(f"algo {config.algo!r} is unknown; expected one of {', '.join(ALGOS)}")
    c = copy.deepcopy(config)
    for path, value in preset_defaults(c.algo, c.rollout.max_staleness).items():
        if get_path(c, path) is None:
            _set_path(c, path, value)
    if c.dapo.overlong_buffer == -1:
        c.dapo.overlong_buffer = max(1, c.rollout.max_new_tokens // 4)
    if c.loss.norm_length == 0:
        c.loss.norm_length = c.rollout.max_new_tokens
    return c


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
                    raise ValueError(f"config.{path + p} is not a config section{suggest_fields(p, node, path)}")
                node[p] = ml_collections.ConfigDict()
            node, path = node[p], path + p + "."
        if leaf not in node and not _free_form(path + leaf):
            raise ValueError(f"config.{path + leaf} is not a config field{suggest_fields(leaf, node, path)}")
        if isinstance(value, os.PathLike):  # a pathlib.Path for model.path, data.path, ...: its string
            value = os.fspath(value)
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
    check_fields(c, base_config())
    c = resolve(c)
    validate(c)
    return c
