"""`ModelConfig`: the decoder's hyper-parameters, read from (and written back to) a HF `config.json`.

Nothing here is a preset: every field comes from the checkpoint. Both spellings of the RoPE settings are
read — transformers 4.x (`rope_theta`, `rope_scaling`) as found on the hub, and 5.x (`rope_parameters`) —
and both are written, so either major version of transformers loads an exported model.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from jaxrl_llm.models import families

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "mistral", "gemma2", "gemma3_text")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                  "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
                  "mistral": "MistralForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
# Families read and written by models/families.py (sliding windows, soft caps, Gemma's norms).
_FAMILY_TYPES = ("mistral", "gemma2", "gemma3_text")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding settings (rotate-half convention, as in transformers)."""

    theta: float = 10000.0
    type: str = "default"  # one of SUPPORTED_ROPE_TYPES
    factor: float = 1.0  # linear / llama3 / yarn scaling factor
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int | None = None  # llama3 / yarn
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: multiplies cos/sin; None derives it from factor
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a Llama / Qwen2 / Qwen3 decoder. Frozen and hashable: a static jit argument."""

    model_type: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 32
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    rope: RopeConfig = RopeConfig()
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 always; Llama/Qwen3 when `attention_bias`
    o_bias: bool = False  # Llama/Qwen3 `attention_bias` also biases o_proj; Qwen2 never does
    mlp_bias: bool = False  # Llama `mlp_bias`
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before RoPE
    # Mixture of experts (models/moe.py): every layer's MLP is num_experts SwiGLU experts of width
    # moe_intermediate_size, num_experts_per_tok of them per token; 0 experts = a dense MLP.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalize the selected experts' gate probabilities to sum to 1
    # Qwen3-MoE: layer i has experts when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0,
    # else a dense MLP of intermediate_size (`moe_layers`); such a model holds both kinds in every layer.
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # Mistral / Gemma 2 / Gemma 3 (models/families.py); the defaults leave Llama and Qwen unchanged.
    sliding_window: int | None = None  # a windowed layer's query i sees keys j with i - j < sliding_window
    layer_types: tuple[str, ...] = ()  # per layer "sliding_attention" | "full_attention"; () = all full
    local_rope: RopeConfig | None = None  # RoPE of the sliding layers when it differs (Gemma 3)
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)
    query_pre_attn_scalar: float | None = None  # scores scaled by this ** -0.5 instead of head_dim ** -0.5
    norm_offset: float = 0.0  # RMSNorm multiplies by (norm_offset + scale): Gemma stores w in (1 + w)
    sandwich_norm: bool = False  # norms on the attention and MLP outputs too (Gemma 2 / 3)
    hidden_act: str = "silu"  # silu | gelu_tanh (Gemma's GeGLU)
    embed_scale: bool = False  # embeddings multiplied by sqrt(hidden_size) (Gemma)
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    # Execution settings: not part of the checkpoint, chosen by the user.
    param_dtype: str = "float32"  # dtype parameters are stored and updated in
    dtype: str = "float32"  # compute dtype of matmuls and activations ("bfloat16" on accelerators)
    remat: str = "none"  # "none" | "full" | "dots" (save matmul outputs): memory vs recompute in backward
    logits_chunk: int = 128  # max sequence chunk of token_logprobs (lm.logits_chunk_for): (B, chunk, V) logits
    attention: str = "auto"  # auto | xla | blockwise | cudnn | splash: multi-token attention (models/kernels.py)
    attention_block: int = 256  # blockwise attention's query and key tile (tokens)
    # LoRA adapters (models/lora.py): declared on the `lora_targets` projections when lora_rank > 0.
    lora_rank: int = 0  # 0 = none
    lora_alpha: float = 16.0  # the adapter's output is scaled by lora_alpha / lora_rank
    lora_targets: tuple[str, ...] = ()  # of q, k, v, o, gate, up, down
    lora_dropout: float = 0.0  # dropout on the adapters' input, in passes given a "dropout" rng only

    def __post_init__(self):
        mlp = sorted(set(self.lora_targets) & {"gate", "up", "down"})
        if self.num_experts and self.lora_rank and mlp:
            raise ValueError(f"lora.targets {','.join(mlp)}: adapters on the experts of a mixture-of-experts model are "
                             "not supported; expected attention targets (q, k, v, o)")

    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """Per layer: whether it attends within `sliding_window` (all False without a window)."""
        if self.sliding_window is None:
            return (False,) * self.num_layers
        return tuple(t == "sliding_attention" for t in self.layer_types) if self.layer_types \
            else (True,) * self.num_layers

    @property
    def moe_layers(self) -> tuple[bool, ...]:
        """Per layer: whether its MLP is the experts (transformers' Qwen3MoeDecoderLayer rule)."""
        return tuple(bool(self.num_experts) and i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0
                     for i in range(self.num_layers))

    @property
    def mixed_mlp(self) -> bool:
        """An MoE model with dense MLP layers too: every layer then holds both kinds' parameters (the
        unused kind's zero) and the scanned layer body picks by a per-layer flag (models/transformer.py)."""
        return self.num_experts > 0 and not all(self.moe_layers)

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        d, f, h, k, hd, L, v = (self.hidden_size, self.intermediate_size, self.num_heads, self.num_kv_heads,
                                self.head_dim, self.num_layers, self.vocab_size)
        attn = d * h * hd * 2 + d * k * hd * 2 + (h + 2 * k) * hd * self.qkv_bias + d * self.o_bias
        mlp = 3 * d * f + (2 * f + d) * self.mlp_bias
        if self.num_experts:  # [mixed_mlp: both kinds are stored in every layer]
            mlp = d * self.num_experts + 3 * d * self.moe_intermediate_size * self.num_experts + self.mixed_mlp * 3 * d * f
        per_layer = attn + mlp + 2 * d * (1 + self.sandwich_norm) + 2 * hd * self.qk_norm
        return L * per_layer + d + v * d * (1 if self.tie_word_embeddings else 2)


def _as_tuple(x) -> tuple[int, ...]:
    if x is None:
        return ()
    return tuple(int(i) for i in x) if isinstance(x, (list, tuple)) else (int(x),)


def _rope_from_hf(d: dict[str, Any], source: str) -> RopeConfig:
    """Both spellings: 5.x `rope_parameters` (theta inside) and 4.x `rope_theta` + `rope_scaling`."""
    params = dict(d.get("rope_parameters") or {})
    scaling = dict(d.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = merged.get("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{source}: unsupported rope type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if merged.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{source}: partial_rotary_factor != 1 is not supported")
    omax = merged.get("original_max_position_embeddings")
    if rope_type in ("llama3", "yarn") and omax is None:
        omax = d.get("max_position_embeddings")
    get = lambda k, default: default if merged.get(k) is None else merged[k]
    return RopeConfig(
        theta=float(theta), type=rope_type, factor=float(get("factor", 1.0)),
        low_freq_factor=float(get("low_freq_factor", 1.0)), high_freq_factor=float(get("high_freq_factor", 4.0)),
        original_max_position_embeddings=None if omax is None else int(omax),
        beta_fast=float(get("beta_fast", 32.0)), beta_slow=float(get("beta_slow", 1.0)),
        attention_factor=merged.get("attention_factor"), mscale=merged.get("mscale"),
        mscale_all_dim=merged.get("mscale_all_dim"), truncate=bool(get("truncate", True)))


def config_from_hf_dict(d: dict[str, Any], source: str = "config.json", **overrides) -> ModelConfig:
    """Builds a ModelConfig from a HF config dict; `overrides` set execution fields (dtype, remat, ...)."""
    model_type = d.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{source}: unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads") if k not in d]
    if missing:
        raise ValueError(f"{source}: missing required field(s) {', '.join(missing)}")
    family = {}
    if model_type in _FAMILY_TYPES:
        family = families.fields_from_hf(d, source, _rope_from_hf)
        d = {**d, "hidden_act": "silu", "use_sliding_window": False}  # checked there
    if d.get("use_sliding_window"):
        raise ValueError(f"{source}: use_sliding_window=true is not supported (full attention only)")
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{source}: hidden_act {d['hidden_act']!r} is not supported; expected 'silu'")
    heads = int(d["num_attention_heads"])
    kv_heads = int(d.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise ValueError(f"{source}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    attention_bias = bool(d.get("attention_bias", False))
    kw = dict(
        model_type=model_type,
        vocab_size=int(d["vocab_size"]),
        hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]),
        num_layers=int(d["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(d.get("head_dim") or d["hidden_size"] // heads),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
        rope=_rope_from_hf(d, source),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        qkv_bias=True if model_type == "qwen2" else attention_bias,
        o_bias=False if model_type == "qwen2" else attention_bias,
        mlp_bias=bool(d.get("mlp_bias", False)) if model_type == "llama" else False,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=_as_tuple(d.get("eos_token_id")),
        pad_token_id=d.get("pad_token_id"),
    )
    if model_type in ("qwen3_moe", "mixtral"):
        kw.update(_moe_from_hf(d, source, model_type))
    kw.update(family)
    kw.update(overrides)
    return ModelConfig(**kw)


def _moe_from_hf(d: dict[str, Any], source: str, model_type: str) -> dict[str, Any]:
    """The experts' fields: 4.x spells Qwen3-MoE's count `num_experts`, 5.x `num_local_experts` (Mixtral's)."""
    experts = d.get("num_local_experts", d.get("num_experts"))
    k = d.get("num_experts_per_tok")
    if not experts or not k or not 0 < int(k) <= int(experts):
        raise ValueError(f"{source}: num_experts_per_tok={k} must be in [1, num_experts={experts}]")
    if model_type == "mixtral":
        if d.get("sliding_window") is not None:
            raise ValueError(f"{source}: sliding_window={d['sliding_window']} is not supported (expected null)")
        return dict(num_experts=int(experts), num_experts_per_tok=int(k), norm_topk_prob=True,
                    moe_intermediate_size=int(d["intermediate_size"]))
    layers, step, dense_only = int(d["num_hidden_layers"]), d.get("decoder_sparse_step", 1), d.get("mlp_only_layers") or []
    step = 1 if step is None else step
    if not isinstance(step, int) or step < 1:
        raise ValueError(f"{source}: decoder_sparse_step must be an int >= 1; got {step!r}")
    if any(not isinstance(i, int) or not 0 <= i < layers for i in dense_only):
        raise ValueError(f"{source}: mlp_only_layers must list layer indices in [0, {layers}); got {dense_only!r}")
    if "moe_intermediate_size" not in d:
        raise ValueError(f"{source}: missing required field moe_intermediate_size")
    return dict(num_experts=int(experts), num_experts_per_tok=int(k), norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                moe_intermediate_size=int(d["moe_intermediate_size"]), decoder_sparse_step=step,
                mlp_only_layers=tuple(sorted(set(dense_only))))


def rope_to_hf(r: RopeConfig) -> dict[str, Any]:
    """5.x `rope_parameters` of one RoPE (theta inside)."""
    rope_params: dict[str, Any] = {"rope_type": r.type, "rope_theta": r.theta}
    if r.type == "linear":
        rope_params["factor"] = r.factor
    elif r.type == "llama3":
        rope_params.update(factor=r.factor, low_freq_factor=r.low_freq_factor, high_freq_factor=r.high_freq_factor,
                           original_max_position_embeddings=r.original_max_position_embeddings)
    elif r.type == "yarn":
        rope_params.update(factor=r.factor, beta_fast=r.beta_fast, beta_slow=r.beta_slow, truncate=r.truncate,
                           original_max_position_embeddings=r.original_max_position_embeddings)
        for k in ("attention_factor", "mscale", "mscale_all_dim"):
            if getattr(r, k) is not None:
                rope_params[k] = getattr(r, k)
    return rope_params


def config_to_hf_dict(config: ModelConfig, torch_dtype: str | None = None) -> dict[str, Any]:
    """A config.json that transformers 4.x and 5.x both read back to the same model."""
    r = config.rope
    rope_params = rope_to_hf(r)
    eos = list(config.eos_token_id)
    d = {
        "architectures": [_ARCHITECTURES[config.model_type]],
        "model_type": config.model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": config.pad_token_id,
        # transformers 5.x spelling ...
        "rope_parameters": rope_params,
        # ... and the 4.x spelling, which 5.x also accepts.
        "rope_theta": r.theta,
        "rope_scaling": None if r.type == "default" else {k: v for k, v in rope_params.items() if k != "rope_theta"},
        "use_cache": True,
    }
    if config.model_type == "llama":
        d.update(attention_bias=config.qkv_bias, mlp_bias=config.mlp_bias)
    elif config.model_type in ("qwen3", "qwen3_moe"):
        d.update(attention_bias=config.qkv_bias, use_sliding_window=False)
    if config.model_type == "qwen3_moe":  # both spellings of the count: 4.x num_experts, 5.x num_local_experts
        d.update(num_experts=config.num_experts, num_local_experts=config.num_experts,
                 decoder_sparse_step=config.decoder_sparse_step, mlp_only_layers=list(config.mlp_only_layers),
                 moe_intermediate_size=config.moe_intermediate_size,
                 num_experts_per_tok=config.num_experts_per_tok, norm_topk_prob=config.norm_topk_prob)
    elif config.model_type == "mixtral":
        d.update(num_local_experts=config.num_experts, num_experts_per_tok=config.num_experts_per_tok,
                 sliding_window=None)
        d["intermediate_size"] = config.moe_intermediate_size
    elif config.model_type == "qwen2":
        d.update(use_sliding_window=False)
    if config.model_type in _FAMILY_TYPES:
        d.update(families.fields_to_hf(config, rope_params, rope_to_hf))
    if torch_dtype:
        d["torch_dtype"] = torch_dtype
        d["dtype"] = torch_dtype
    return d


def read_hf_config(path: str, **overrides) -> ModelConfig:
    """Reads `<path>/config.json`; one-line errors for a missing or malformed file."""
    file = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model path {path!r} is not a directory")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file}: not found (a Hugging Face model directory holds config.json)")
    try:
        with open(file, encoding="utf-8") as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: invalid JSON ({e.msg} at line {e.lineno})") from None
    return config_from_hf_dict(d, source=file, **overrides)
