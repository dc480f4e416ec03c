"""Run setup: the model path, tokenizer and model config; policy, reference and value parameters on the
mesh; the initial train state with its shardings; reward functions; prompt data.

Everything here runs once, before the first step, and fails with a one-line error naming the field or
file at fault.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxrl_llm import config as config_lib
from jaxrl_llm import sharding
from jaxrl_llm.compile_options import jit
from jaxrl_llm.data import (iterator_from_config, load_prompt_dataset, load_tokenizer, prepare_prompts,
                            split_held_out)
from jaxrl_llm.data.prompts import is_messages
from jaxrl_llm.data import reasoning_gym as rgym
from jaxrl_llm.data.tasks import load_task
from jaxrl_llm.evaluate.evaluator import eval_source
from jaxrl_llm.models import (ModelConfig, init_params, init_value_params, load_hf, load_hf_value, lora,
                              param_logical_axes, value_logical_axes)
from jaxrl_llm.models.config import read_hf_config
from jaxrl_llm.models.kernels import check_attention, explain_attention
from jaxrl_llm.rewards import UserReward, get_reward_fn
from jaxrl_llm.rl import Objective
from jaxrl_llm.sampling import freeing_window, pages_needed
from jaxrl_llm.trainer.adapters import model_fields
from jaxrl_llm.trainer.preflight import local_model_dir
from jaxrl_llm.trainer.state import TrainState, UpdatePlan

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------- model and tokenizer
def resolve_model_path(path: str) -> str:
    """A local directory as is; otherwise a hub name, downloaded (weights, configs, tokenizer) once."""
    local = local_model_dir(path)
    if local:
        return local
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
                       remat=m.remat, logits_chunk=m.logits_chunk, attention=m.attention,
                       attention_block=m.attention_block)


def load_model_config(c: ml_collections.ConfigDict):
    """(model path or "", tokenizer, ModelConfig (with the `lora` section's adapters), EOS ids, pad id),
    checked against the rollout's length."""
    check_attention(c.model.attention)  # a kernel this backend lacks fails here, before any loading
    model_path = resolve_model_path(c.model.path) if c.model.path else ""
    if model_path:  # config.json first: without it the tokenizer fails too, with a message about itself
        mc = read_hf_config(model_path, param_dtype=c.model.dtype, dtype=c.model.compute_dtype,
                            remat=c.model.remat, logits_chunk=c.model.logits_chunk,
                            attention=c.model.attention, attention_block=c.model.attention_block)
        tokenizer = load_tokenizer(c.tokenizer or model_path)
    else:
        tokenizer = load_tokenizer(c.tokenizer)
        mc = builtin_model_config(c, tokenizer)
    eos_ids = eos_ids_of(model_path, tokenizer, mc)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0])
    if c.data.max_prompt_length + c.rollout.max_new_tokens > mc.max_position_embeddings:
        raise ValueError(f"config.data.max_prompt_length + rollout.max_new_tokens = "
                         f"{c.data.max_prompt_length + c.rollout.max_new_tokens} exceeds the model's "
                         f"max_position_embeddings {mc.max_position_embeddings}")
    mc = mc.replace(**model_fields(c))
    for line in explain_attention(mc, jax.default_backend(), c.mesh.sequence > 1):  # one the model cannot use fails
        log.info(line)
    return model_path, tokenizer, mc, eos_ids, pad_id


def check_batch_fits(c: ml_collections.ConfigDict, mesh) -> None:
    """Every micro-batch and the decode slots split evenly over the mesh's data axes, and the batch over the
    processes."""
    divisor, shards = sharding.batch_divisor(mesh), sharding.row_shards(mesh)
    per_micro = c.rollout.batch_prompts // c.train.minibatches // c.train.grad_accum
    if c.rollout.batch_prompts % divisor or per_micro % shards:
        seq = mesh.shape["sequence"]
        raise ValueError(f"config.rollout.batch_prompts={c.rollout.batch_prompts} (per micro-batch: {per_micro}) "
                         f"must be divisible by mesh data*fsdp={shards}"
                         + (f" (the batch by data*fsdp*sequence={divisor}: the sampler's rows)" if seq > 1 else ""))
    if c.rollout.decode_slots % divisor:
        raise ValueError(f"config.rollout.decode_slots={c.rollout.decode_slots} must be divisible by mesh "
                         f"data*fsdp*sequence={divisor} (the decode slots are sharded over them)")
    if c.rollout.batch_prompts % jax.process_count():
        raise ValueError(f"config.rollout.batch_prompts={c.rollout.batch_prompts} must be divisible by the "
                         f"{jax.process_count()} processes")


def check_pool(c: ml_collections.ConfigDict, mesh, mc: ModelConfig) -> None:
    """A set rollout.kv_pages holds what the paged sampler needs of a row shard (sampling/paged.py
    `pages_needed`); fewer with a model whose every layer is windowed, so checked once the model is known."""
    if not (c.rollout.kv_page_size and c.rollout.kv_pages):
        return
    divisor = sharding.batch_divisor(mesh)
    shards = divisor if c.rollout.batch_prompts % divisor == 0 else 1
    window = freeing_window(mc)
    need = pages_needed(c.data.max_prompt_length, c.rollout.max_new_tokens, c.rollout.batch_prompts, shards,
                        c.rollout.kv_page_size, window)
    if c.rollout.kv_pages < need:
        raise ValueError(f"config.rollout.kv_pages={c.rollout.kv_pages} is fewer than the {need} pages of "
                         f"{c.rollout.kv_page_size} tokens a row shard needs: its {c.rollout.batch_prompts // shards} "
                         f"prompts of up to {c.data.max_prompt_length} tokens and one row of "
                         f"{c.rollout.max_new_tokens} new tokens"
                         + (f" (with the pages every layer's sliding window of {window} has passed freed)"
                            if window else ""))


# ------------------------------------------------------------------------------------------ parameters
def load_params(c, mc: ModelConfig, model_path: str, mesh, init_rng):
    """(policy parameters on the mesh, their shardings): from the checkpoint, or initialized from the seed.
    With LoRA, those of the base (no adapters)."""
    mc = lora.base_config(mc)
    abstract = jax.eval_shape(lambda: init_params(mc, init_rng))
    shardings = sharding.logical_to_sharding(param_logical_axes(mc), abstract, mesh)
    if model_path:
        _, params = load_hf(model_path, jnp.dtype(c.model.dtype), compute_dtype=c.model.compute_dtype,
                            shardings=shardings, remat=c.model.remat, logits_chunk=c.model.logits_chunk,
                            attention=c.model.attention, attention_block=c.model.attention_block)
    else:
        params = jit(lambda k: init_params(mc, k), out_shardings=shardings)(init_rng)
    return params, shardings


def load_value_params(c, mc: ModelConfig, params, mesh):
    """(value parameters, their shardings): a copy of the policy backbone with a fresh head, or a
    *ForSequenceClassification checkpoint whose backbone matches the policy's. Trained in full, also
    when the policy is LoRA-adapted."""
    mc = lora.base_config(mc)
    vabstract = jax.eval_shape(lambda p: init_value_params(mc, p), params)
    shardings = sharding.logical_to_sharding(value_logical_axes(mc), vabstract, mesh, name="value")
    if c.value.init == "policy":
        return jit(lambda p: init_value_params(mc, p), out_shardings=shardings)(params), shardings
    vmc, value_params = load_hf_value(c.value.init, jnp.dtype(c.model.dtype), shardings=shardings)
    if (vmc.hidden_size, vmc.num_layers) != (mc.hidden_size, mc.num_layers):
        raise ValueError(f"config.value.init {c.value.init}: its backbone differs from the policy's")
    return value_params, shardings


def copy_params(params, shardings):
    """A copy of the parameter tree laid out by `shardings`: the reference's own buffers, so that the update
    donating the policy's leaves the reference intact."""
    return jit(lambda t: jax.tree_util.tree_map(jnp.copy, t), out_shardings=shardings)(params)


def init_train_state(objective: Objective, plan: UpdatePlan, params, param_shardings, value, mesh, state_rng,
                     refresh: bool):
    """(the initial TrainState on the mesh, its shardings). `value` is (params, shardings) or None;
    `refresh`: the reference is refreshed during the run, so it lives in the state. The optimizers are
    the plan's, those the update steps apply."""
    tx, _ = plan.optimizer.build()
    value_tx, _ = plan.value_optimizer.build()
    kl_ctl = objective.kl_controller()
    value_params, value_shardings = value if value is not None else (None, None)
    # Optimizer states are laid out like their parameters (FSDP shards Adam's moments too).
    opt_shardings = sharding.optimizer_shardings(tx, jax.eval_shape(tx.init, params), param_shardings, mesh)
    value_opt_shardings = None if value_params is None else sharding.optimizer_shardings(
        value_tx, jax.eval_shape(value_tx.init, value_params), value_shardings, mesh)
    state = TrainState(
        step=np.int32(0), opt_step=np.int32(0), rng=np.asarray(state_rng), params=params,
        opt_state=jit(tx.init, out_shardings=opt_shardings)(params),
        ref_params=copy_params(params, param_shardings) if refresh else None, value_params=value_params,
        value_opt_state=None if value_params is None else jit(
            value_tx.init, out_shardings=value_opt_shardings)(value_params),
        kl=jax.tree_util.tree_map(np.asarray, kl_ctl), nonfinite=np.int32(0))
    replicate = sharding.replicated(mesh)
    shardings = TrainState(
        step=replicate, opt_step=replicate, rng=replicate, params=param_shardings, opt_state=opt_shardings,
        ref_params=param_shardings if refresh else None, value_params=value_shardings,
        value_opt_state=value_opt_shardings, kl=jax.tree_util.tree_map(lambda _: replicate, kl_ctl),
        nonfinite=replicate)
    # Host scalars (step, rng, KL coefficient) become global replicated arrays; the rest is in place.
    return jax.device_put(state, shardings), shardings


# ----------------------------------------------------------------------------------- rewards and data
def build_rewards(c, mesh, callables: Sequence[Callable[..., Any]] = ()) -> list[tuple[str, Any, float]]:
    """(name, fn, weight) of every reward of `reward.functions`; `callables` are the Python API's
    functions, named in the config by their `module:qualname`."""
    by_name = {reward_name(fn): fn for fn in callables}
    out = []
    for spec, weight in config_lib.reward_specs(c):
        fn = by_name.get(spec)
        kwargs = dict(c.reward.kwargs.get(fn.__name__ if fn is not None else spec.split(":")[-1], {}))
        if spec == "reasoning_gym" and c.data.source == rgym.SOURCE:  # every task's metrics, for the curriculum
            kwargs.setdefault("tasks", [name for name, _ in rgym.parse_tasks(c.data.reasoning_gym.tasks)])
        if spec == "overlong" and c.dapo.overlong_buffer:  # DAPO's buffer, unless reward.kwargs says otherwise
            kwargs.setdefault("buffer", c.dapo.overlong_buffer)
        if spec == "reward_model":  # scored on the training mesh with the same sharding rules
            # Each host scores only its own rows: across hosts, on a mesh of this host's devices (the
            # global mesh would take every host's different rows for one global batch).
            kwargs.setdefault("mesh", mesh if jax.process_count() == 1 else
                              sharding.make_mesh(1, -1, 1, devices=jax.local_devices()))
            kwargs.setdefault("rules", sharding.LOGICAL_RULES)
        out.append((*get_reward_fn(spec if fn is None else fn, **kwargs), weight))
    return out


def user_rewards(c, reward_fns: list, dataset) -> list[tuple[str, Any, float]]:
    """`reward_fns` with the user's functions (callables, `module:function` paths) as `UserReward`s taking
    their completions in `reward.completion_format`'s form: with `auto`, TRL's message lists when the
    dataset's prompt column holds conversations, else strings. The registry's rewards parse text: they
    keep strings."""
    fmt, d = c.reward.completion_format, c.data
    conversational = (not d.prompt_template and d.prompt_column in dataset.column_names and len(dataset) > 0
                      and is_messages(dataset[0][d.prompt_column]))
    messages = fmt == "messages" or (fmt == "auto" and conversational)
    column = d.prompt_column if conversational else ""
    return [(name, UserReward(fn, messages, column) if ":" in spec else fn, weight)
            for (spec, _), (name, fn, weight) in zip(config_lib.reward_specs(c), reward_fns)]


def reward_name(fn: Callable[..., Any]) -> str:
    """How the config records a reward passed as a callable: its import path `module:qualname`."""
    return f"{getattr(fn, '__module__', None) or 'callable'}:{getattr(fn, '__qualname__', type(fn).__name__)}"


def load_data(c, tokenizer, dataset=None, levels=None):
    """(tokenized prompt dataset, its counts, the held-out rows or None): from `dataset` (the Python API's
    rows), the built-in task, reasoning-gym's tasks (`levels`: their curriculum levels, or None), or
    `data.path`. With periodic evaluation and no eval.path or data.task, the
    held-out slice of the data (data/holdout.py, 1 prompt in eval.holdout) leaves the training rows; with
    no held-out source at all, evaluation is off (one warning)."""
    if dataset is not None:
        data, stats = prepare_prompts(dataset, c.data, tokenizer)
    elif c.data.task:
        raw = load_task(c.data.task, c.data.task_rows, c.seed, tuple(c.data.task_weights))
        data, stats = prepare_prompts(raw, c.data, tokenizer)
    elif c.data.source == rgym.SOURCE:
        rows = rgym.generate(c.data.reasoning_gym, c.seed, c.data.reasoning_gym.rows,
                             levels=levels if levels is not None else rgym.start_levels(c.data.reasoning_gym))
        data, stats = prepare_prompts(rows, c.data, tokenizer)
    else:
        data, stats = load_prompt_dataset(c.data, tokenizer)
    source = eval_source(c)
    if not c.eval.every_steps or source != "holdout":
        if c.eval.every_steps and source is None:
            log.warning("eval.every_steps=%d, but there are no held-out prompts (eval.path empty, no data.task, "
                        "eval.holdout=0): periodic evaluation is off", c.eval.every_steps)
        return data, stats, None
    data, held = split_held_out(data, c.data.prompt_column, c.eval.holdout, c.data.path)
    log.info("eval: %d of the %d prompts of data.path are held out for evaluation (CRC-32 of the prompt %% %d "
             "== 0; eval.holdout) and never trained on", len(held), len(held) + len(data), c.eval.holdout)
    return data, {**stats, "data/rows": len(data), "data/held_out": len(held)}, held


def data_iterator(c, dataset):
    """This process's shard of the prompt batches."""
    return iterator_from_config(dataset, c.data, c.rollout.batch_prompts, shard_index=jax.process_index(),
                                shard_count=jax.process_count())
