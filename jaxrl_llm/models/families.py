"""The HF config fields of Mistral, Gemma 2 and Gemma 3 (text): sliding windows, layer kinds, soft caps,
Gemma's (1 + w) norms, sandwich norms, GeGLU, embedding scale and Gemma 3's per-kind RoPE.

Read in both spellings: transformers 5.x (`layer_types`, `rope_parameters`, for Gemma 3 one dict per
layer kind) and 4.x (`rope_theta` + `rope_scaling` on the global layers, `rope_local_base_freq`,
`sliding_window_pattern`, no `layer_types`); written in both, so either version loads an export.
"""
from __future__ import annotations

from typing import Any, Callable

# Imported by models/config.py, so it imports nothing of it: the RoPE reader / writer come as arguments.

LAYER_KINDS = ("sliding_attention", "full_attention")
_GEMMA = ("gemma2", "gemma3_text")


def _layer_types(d: dict[str, Any], model_type: str, layers: int, source: str) -> tuple[str, ...]:
    types = d.get("layer_types")
    if types is None:
        if model_type == "mistral":
            return ("sliding_attention",) * layers
        # Gemma 2: every other layer from the first; Gemma 3: `sliding_window_pattern` (5 local : 1 global).
        period = 2 if model_type == "gemma2" else int(d.get("sliding_window_pattern") or 6)
        return tuple("sliding_attention" if (i + 1) % period else "full_attention" for i in range(layers))
    types = tuple(types)
    if len(types) != layers or any(t not in LAYER_KINDS for t in types):
        raise ValueError(f"{source}: layer_types must list {layers} of {', '.join(LAYER_KINDS)}; got {list(types)}")
    return types


def fields_from_hf(d: dict[str, Any], source: str, rope_from_hf: Callable) -> dict[str, Any]:
    """The ModelConfig fields of a Mistral / Gemma 2 / Gemma 3 text config.json beyond Llama's;
    rope_from_hf(config dict, source) -> RopeConfig is config.py's reader."""
    model_type = d["model_type"]
    act = d.get("hidden_activation") or d.get("hidden_act") or ("gelu_pytorch_tanh" if model_type in _GEMMA else "silu")
    acts = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
    if act not in acts:
        raise ValueError(f"{source}: hidden activation {act!r} is not supported; expected silu or gelu_pytorch_tanh")
    layers = int(d["num_hidden_layers"])
    window = d.get("sliding_window")
    if window is not None and int(window) < 1:
        raise ValueError(f"{source}: sliding_window must be a positive integer or null; got {window!r}")
    if d.get("use_bidirectional_attention"):
        raise ValueError(f"{source}: use_bidirectional_attention=true is not supported (causal LMs only)")
    kw: dict[str, Any] = dict(
        sliding_window=None if window is None else int(window),
        layer_types=() if window is None else _layer_types(d, model_type, layers, source),
        hidden_act=acts[act])
    if model_type == "mistral":
        return kw
    cap = lambda k: None if d.get(k) is None else float(d[k])
    kw.update(attn_softcap=cap("attn_logit_softcapping"), final_softcap=cap("final_logit_softcapping"),
              query_pre_attn_scalar=float(d.get("query_pre_attn_scalar") or 256), norm_offset=1.0,
              sandwich_norm=True, embed_scale=True, tie_word_embeddings=bool(d.get("tie_word_embeddings", True)))
    if model_type == "gemma3_text":
        kw["qk_norm"] = True
        params = d.get("rope_parameters") or {}
        if "full_attention" in params or "sliding_attention" in params:  # 5.x: one RoPE per layer kind
            one = lambda kind, theta: rope_from_hf({"max_position_embeddings": d.get("max_position_embeddings"),
                                                     "rope_parameters": {"rope_theta": theta, **(params.get(kind) or {})}},
                                                    source)
            kw.update(rope=one("full_attention", 1e6), local_rope=one("sliding_attention", 1e4))
        else:  # 4.x: rope_theta + rope_scaling are the global layers', rope_local_base_freq the local ones'
            kw["rope"] = rope_from_hf({**d, "rope_theta": d.get("rope_theta", 1e6)}, source)
            kw["local_rope"] = rope_from_hf({"rope_theta": d.get("rope_local_base_freq", 1e4)}, source)
    return kw


def fields_to_hf(c, rope_params: dict[str, Any], rope_to_hf: Callable) -> dict[str, Any]:
    """config.json fields of the family (both spellings) of ModelConfig `c`, beyond those
    `config_to_hf_dict` writes; rope_to_hf(RopeConfig) -> dict is config.py's writer."""
    out: dict[str, Any] = {"sliding_window": c.sliding_window, "attention_bias": False,
                           "hidden_act": "silu" if c.hidden_act == "silu" else "gelu_pytorch_tanh"}
    if c.sliding_window is not None and c.model_type != "mistral":  # Mistral: every layer (no such field)
        out["layer_types"] = list(c.layer_types) or ["sliding_attention"] * c.num_layers
    if c.model_type == "mistral":
        return out
    scalar = c.query_pre_attn_scalar
    out.update(hidden_activation=out["hidden_act"],  # transformers 5.x types it int
               query_pre_attn_scalar=int(scalar) if scalar is not None and scalar == int(scalar) else scalar,
               attn_logit_softcapping=c.attn_softcap, final_logit_softcapping=c.final_softcap)
    if c.model_type == "gemma3_text":
        local = rope_to_hf(c.local_rope or c.rope)
        out.update(rope_parameters={"full_attention": rope_params, "sliding_attention": local},
                   rope_local_base_freq=local["rope_theta"])
    return out
