"""HF tensor names of the mixture-of-experts layers (Qwen3-MoE, Mixtral) for models/hf.py.

Hub checkpoints (and transformers 4.x and 5.x `save_pretrained`) hold one matrix per expert:
Qwen3-MoE `mlp.gate.weight` (E,D) and `mlp.experts.{j}.{gate,up,down}_proj.weight`, Mixtral
`block_sparse_moe.gate.weight` and `block_sparse_moe.experts.{j}.{w1,w3,w2}.weight` (gate, up, down).
transformers 5.x holds them fused in memory, `mlp.experts.gate_up_proj` (E,2F,D) and
`mlp.experts.down_proj` (E,D,F); a checkpoint written that way is read through `fused_aliases`, which
names each expert's slice as if it were stored per expert. We always write the per-expert names.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from jaxrl_llm.models.config import ModelConfig


def _prefix(c: ModelConfig) -> str:
    return "block_sparse_moe" if c.model_type == "mixtral" else "mlp"


def _names(c: ModelConfig) -> dict[str, str]:
    """Our expert param -> the HF per-expert name template ({j} the expert)."""
    p = _prefix(c)
    if c.model_type == "mixtral":
        return {"gate": f"{p}.experts.{{j}}.w1.weight", "up": f"{p}.experts.{{j}}.w3.weight",
                "down": f"{p}.experts.{{j}}.w2.weight"}
    return {k: f"{p}.experts.{{j}}.{k}_proj.weight" for k in ("gate", "up", "down")}


def router_entry(c: ModelConfig):
    """(our path, HF suffix, HF shape, hf->ours, ours->hf) of the router: HF (E,D) -> ours (D,E)."""
    return (("moe", "router"), f"{_prefix(c)}.gate.weight", (c.num_experts, c.hidden_size),
            lambda w: w.T, lambda w: w.T)


def expert_entries(c: ModelConfig) -> list[tuple[tuple[str, ...], list[str], tuple[int, ...], Callable, Callable]]:
    """(our path, the E HF suffixes, one HF tensor's shape, hf stack (E,out,in) -> ours, ours -> hf stack)."""
    d, f, e = c.hidden_size, c.moe_intermediate_size, c.num_experts
    to_ours = lambda w: np.swapaxes(w, 1, 2)  # E linear weights (out, in) -> our (E, in, out)
    return [(("moe", name), [tmpl.format(j=j) for j in range(e)], (d, f) if name == "down" else (f, d),
             to_ours, to_ours) for name, tmpl in _names(c).items()]


def fused_aliases(c: ModelConfig, layer_names) -> dict[str, tuple[str, Callable]]:
    """Per-expert name -> (fused tensor name, slice of it) for the layers whose experts are stored fused.

    `layer_names`: every tensor name in the checkpoint. gate_up_proj (E,2F,D) holds gate then up on the
    middle axis; down_proj (E,D,F).
    """
    f = c.moe_intermediate_size
    aliases = {}
    names = _names(c)
    for i in range(c.num_layers):
        fused = f"model.layers.{i}.mlp.experts."
        if fused + "gate_up_proj" not in layer_names or fused + "down_proj" not in layer_names:
            continue
        for j in range(c.num_experts):
            layer = f"model.layers.{i}."
            aliases[layer + names["gate"].format(j=j)] = (fused + "gate_up_proj", lambda w, j=j: w[j, :f])
            aliases[layer + names["up"].format(j=j)] = (fused + "gate_up_proj", lambda w, j=j: w[j, f:])
            aliases[layer + names["down"].format(j=j)] = (fused + "down_proj", lambda w, j=j: w[j])
        router = f"model.layers.{i}.mlp.gate.weight"  # 5.x renames Mixtral's block_sparse_moe to mlp
        if c.model_type == "mixtral" and router in layer_names:
            aliases[f"model.layers.{i}.block_sparse_moe.gate.weight"] = (router, lambda w: w)
    return aliases
