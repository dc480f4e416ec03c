"""LoRA in the trainer (config `lora`, models/lora.py): the base frozen outside the train state, where it
also serves as the reference (no copy); the adapters as the trained parameters, alone in the state,
the optimizer and the checkpoints; the base's identity recorded with them and checked on resume.

With lora.rank = 0 nothing here changes a run: `split_trainable` returns the parameters as they are.
"""
from __future__ import annotations

import hashlib
import json
import logging

import jax
import ml_collections

from jaxrl_llm import sharding
from jaxrl_llm.checkpoint import checksums
from jaxrl_llm.compile_options import jit
from jaxrl_llm.models import ModelConfig, init_params, lora, param_logical_axes
from jaxrl_llm.models.config import config_to_hf_dict

log = logging.getLogger(__name__)

BASE_KEY = "lora_base"  # checkpoint metadata: the identity of the base the adapters were trained on


def model_fields(c: ml_collections.ConfigDict) -> dict:
    """The `ModelConfig` LoRA fields of the config's `lora` section."""
    if not c.lora.rank:
        return {}
    return {"lora_rank": int(c.lora.rank), "lora_alpha": float(c.lora.alpha), "lora_dropout": float(c.lora.dropout),
            "lora_targets": tuple(t.strip() for t in c.lora.targets.split(","))}


def init_adapters(mc: ModelConfig, mesh, rng):
    """(the adapters' tree on the mesh, its shardings): A random, B zero (models/lora.py). The base that
    `init_params` also draws is dead code to XLA: only the adapters are computed."""
    adapters_of = lambda k: lora.split(init_params(mc, k))[1]
    abstract = jax.eval_shape(adapters_of, rng)
    shardings = sharding.logical_to_sharding(lora.split(param_logical_axes(mc))[1], abstract, mesh, name="lora")
    return jit(adapters_of, out_shardings=shardings)(rng), shardings


def split_trainable(mc: ModelConfig, params, shardings, mesh, rng):
    """(frozen base or None, trained parameters, their shardings): with LoRA the base `params` are
    frozen and fresh adapters are trained; else the parameters themselves are."""
    if not mc.lora_rank:
        return None, params, shardings
    adapters, adapter_shardings = init_adapters(mc, mesh, jax.random.fold_in(rng, 1))
    n, total = lora.num_adapter_params(mc), lora.base_config(mc).num_params()
    log.info("LoRA r=%d on %s: %d trainable parameters (%.3g%% of the base's %d)", mc.lora_rank,
             ",".join(mc.lora_targets), n, 100 * n / total, total)
    return params, adapters, adapter_shardings


def base_rng(seed: int):
    """The key the trainer initializes the policy (a built-in base) from: the first of three from the seed."""
    return jax.random.split(jax.random.PRNGKey(seed), 3)[0]


def base_identity(mc: ModelConfig, base) -> str:
    """A hash of the base's architecture (its config.json fields) and of its arrays' checksums: another
    model, another dtype, or the same shapes with other weights each give another identity."""
    blob = json.dumps([config_to_hf_dict(lora.base_config(mc)), checksums(base)], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def check_base(meta: dict, identity: str | None, where: str) -> None:
    """Refuses adapters trained on another base than the one model.path gives now."""
    saved = meta.get(BASE_KEY)
    if saved is not None and identity is not None and saved != identity:
        raise ValueError(f"the LoRA checkpoint in {where} was trained on another base model (identity {saved}; "
                         f"model.path gives {identity}): point model.path at the base it was trained on")


def restore_policy(mc: ModelConfig, base, ckpt, step: int | None, mesh, where: str):
    """(step, the policy's parameters) of a checkpoint: with LoRA, its adapters joined to `base` (checked
    against the identity saved with them); else the parameters it holds."""
    abstract_params = (lora.split(jax.eval_shape(lambda: init_params(mc, jax.random.PRNGKey(0))))[1]
                       if mc.lora_rank else jax.eval_shape(lambda: init_params(mc, jax.random.PRNGKey(0))))
    axes = lora.split(param_logical_axes(mc))[1] if mc.lora_rank else param_logical_axes(mc)
    shardings = sharding.logical_to_sharding(axes, abstract_params, mesh)
    abstract_params = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                             abstract_params, shardings)
    step, params, meta = ckpt.restore_params(abstract_params, step, with_meta=True)
    if not mc.lora_rank:
        return step, params
    check_base(meta, base_identity(mc, base), where)
    return step, lora.join(base, params)
