"""LoRA adapters on the decoder's projections: y = W x + (alpha/r) * B (A x).

Parameters: in the scope of each targeted projection (`ModelConfig.lora_targets`), beside its `kernel`
(*in, *out), `lora_a` (*in, r) and `lora_b` (r, *out), stacked over layers by the layer scan like the
kernel (e.g. q_proj: kernel (L,D,H,hd), lora_a (L,D,r), lora_b (L,r,H,hd)). A starts as PEFT's does
(uniform in +-1/sqrt(fan_in)) and B at zero, so the adapted model starts equal to its base.

A parameter tree "with adapters" is the base tree with these leaves added (`join`). The model applies
them unmerged where they are (`transformer.Dense`) and not where they are not, so the base tree alone
is the model with its adapters off: the RL reference, with no copy. The sampler merges them into the
per-layer weight copies it makes anyway, and applies them unmerged where it reads the parameters in
place (`decode_weights`). `merge` folds them into the kernels (the Hugging Face export).
"""
from __future__ import annotations

from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models.config import ModelConfig

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
ADAPTER_KEYS = ("lora_a", "lora_b")
HF_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
              "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def scale(config: ModelConfig) -> float:
    """alpha / r: the factor of the adapters' output."""
    return config.lora_alpha / config.lora_rank if config.lora_rank else 0.0


def dense_kwargs(config: ModelConfig, name: str) -> dict:
    """The LoRA fields of the `Dense` named `name` ("q_proj", ...): rank 0 where it is no target."""
    if not config.lora_rank or name.removesuffix("_proj") not in config.lora_targets:
        return {}
    return {"lora_rank": config.lora_rank, "lora_scale": scale(config), "lora_dropout": config.lora_dropout}


def a_init(contract: int):
    """PEFT's A init, kaiming_uniform(a=sqrt(5)): uniform in +-1/sqrt(fan_in), fan_in over the input axes."""
    return nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform", in_axis=tuple(range(contract)), out_axis=-1)


def base_config(config: ModelConfig) -> ModelConfig:
    """The same model without adapters (what loads from model.path)."""
    return config.replace(lora_rank=0, lora_targets=(), lora_dropout=0.0)


# ------------------------------------------------------------------------------------------ trees
def split(params) -> tuple[dict, dict]:
    """A tree with adapters -> (the base tree, the adapters' tree (same nesting, adapter leaves only))."""
    base, adapters = {}, {}
    for k, v in params.items():
        if isinstance(v, Mapping):
            b, a = split(v)
            base[k] = b
            if a:
                adapters[k] = a
        elif k in ADAPTER_KEYS:
            adapters[k] = v
        else:
            base[k] = v
    return base, adapters


def join(base, adapters):
    """The base tree with the adapters' leaves added (no copy of any array); `adapters` itself when
    `base` is None (full fine-tuning: the trained tree is the whole model)."""
    if base is None:
        return adapters
    out = dict(base)
    for k, v in adapters.items():
        out[k] = join(base[k], v) if isinstance(v, Mapping) else v
    return out


def delta(a: jax.Array, b: jax.Array, kernel_shape: tuple[int, ...], factor: float) -> jax.Array:
    """factor * A B in float32, shaped like the kernel: a (*lead, *in, r), b (*lead, r, *out)."""
    lead = a.shape[:a.ndim + b.ndim - 2 - len(kernel_shape)]
    a2 = a.reshape(*lead, -1, a.shape[-1]).astype(jnp.float32)
    b2 = b.reshape(*lead, b.shape[len(lead)], -1).astype(jnp.float32)
    return (factor * jnp.matmul(a2, b2, precision=jax.lax.Precision.HIGHEST)).reshape(kernel_shape)


def merge(config: ModelConfig, params):
    """A tree with adapters -> the base tree with W + (alpha/r) A B in each adapted kernel (its dtype)."""
    if not isinstance(params, Mapping):
        return params
    out = {k: merge(config, v) for k, v in params.items() if k not in ADAPTER_KEYS}
    if "lora_a" in params:
        kernel = params["kernel"]
        out["kernel"] = (kernel.astype(jnp.float32) + delta(params["lora_a"], params["lora_b"], kernel.shape,
                                                            scale(config))).astype(kernel.dtype)
    return out


def decode_adapters(config: ModelConfig, layer, lead: tuple[int, ...]) -> dict:
    """For `decode_weights` reading the parameters in place: {"<t>_lora_a": (*lead, in, r), "<t>_lora_b":
    (*lead, r, out) times alpha/r} of each adapted projection t (views but for B's scaling, r x out)."""
    w = {}
    for t in TARGETS:
        p = layer.get(f"{t}_proj", {})
        if "lora_a" in p:
            r = p["lora_a"].shape[-1]
            w[f"{t}_lora_a"] = p["lora_a"].reshape(*lead, -1, r)
            w[f"{t}_lora_b"] = (p["lora_b"] * scale(config)).astype(p["lora_b"].dtype).reshape(*lead, r, -1)
    return w


def num_adapter_params(config: ModelConfig) -> int:
    """Trainable parameters of the adapters: r * (in + out) per targeted projection per layer."""
    c = config
    d, f, q, kv = c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d), "gate": (d, f), "up": (d, f), "down": (f, d)}
    return c.num_layers * c.lora_rank * sum(sum(shapes[t]) for t in c.lora_targets) if c.lora_rank else 0


# ---------------------------------------------------------------------------------------- PEFT export
def peft_state_dict(config: ModelConfig, adapters, dtype=None) -> dict[str, np.ndarray]:
    """The adapters' tree -> {PEFT tensor name: array}: per layer l and target, lora_A.weight (r, in) and
    lora_B.weight (out, r) under `base_model.model.model.layers.<l>.<module>` (PEFT's unscaled B)."""
    host = jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x)), adapters["layers"])
    out = {}
    for t in TARGETS:
        p = host.get(f"{t}_proj")
        if p is None:
            continue
        a, b = p["lora_a"], p["lora_b"]
        r = a.shape[-1]
        for i in range(config.num_layers):
            prefix = f"base_model.model.model.layers.{i}.{HF_MODULES[t]}"
            out[f"{prefix}.lora_A.weight"] = a[i].reshape(-1, r).T
            out[f"{prefix}.lora_B.weight"] = b[i].reshape(r, -1).T
    np_dtype = np.dtype(jnp.dtype(dtype or config.param_dtype))
    return {k: np.ascontiguousarray(v.astype(np_dtype)) for k, v in out.items()}


def peft_config(config: ModelConfig, base_path: str) -> dict:
    """adapter_config.json of a PEFT LoRA adapter for a causal LM."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_path or None,
            "r": config.lora_rank, "lora_alpha": config.lora_alpha, "lora_dropout": config.lora_dropout,
            "target_modules": sorted(HF_MODULES[t].split(".")[1] for t in config.lora_targets),
            "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "modules_to_save": None, "init_lora_weights": True, "inference_mode": True}
