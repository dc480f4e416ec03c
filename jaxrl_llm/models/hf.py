"""Exact import/export of Hugging Face checkpoints (safetensors, single file or sharded with an index).

Our parameter tree (see `transformer.py`) stacks the L layers on a leading axis and keeps heads as their own
axes; HF stores one (out, in) matrix per layer. The table `_layer_entries` is the whole mapping: each
entry converts one HF tensor to our per-layer layout and back, so a load -> save -> load is exact.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxrl_llm import faults
from jaxrl_llm.fs import atomic_directory
from jaxrl_llm.models import lora, moe_hf
from jaxrl_llm.models.config import ModelConfig, config_to_hf_dict, read_hf_config

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors some checkpoints carry that hold no parameters of ours (recomputed buffers).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A model directory or tensor that does not match what the config says."""


def _layer_entries(c: ModelConfig) -> list[tuple[tuple[str, ...], str, tuple[int, ...], Callable, Callable]]:
    """(our path under 'layers', HF name suffix, HF shape, hf->ours, ours->hf) for every per-layer tensor."""
    d, f, h, k, hd = c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim
    ident = lambda x: x
    # HF linear weight (out, in) -> our kernel (in, *out_shape), and back.
    lin_in = lambda *out: (lambda w: w.T.reshape(w.shape[1], *out))
    lin_out = lambda w: w.reshape(w.shape[0], -1).T
    o_in = lambda w: w.T.reshape(h, hd, d)  # (D, H*hd) -> (H, hd, D)
    o_out = lambda w: w.reshape(h * hd, d).T
    flat = lambda *shape: (lambda b: b.reshape(*shape))
    e = [
        (("input_norm", "scale"), "input_layernorm.weight", (d,), ident, ident),
        (("post_attn_norm", "scale"), "post_attention_layernorm.weight", (d,), ident, ident),
        (("q_proj", "kernel"), "self_attn.q_proj.weight", (h * hd, d), lin_in(h, hd), lin_out),
        (("k_proj", "kernel"), "self_attn.k_proj.weight", (k * hd, d), lin_in(k, hd), lin_out),
        (("v_proj", "kernel"), "self_attn.v_proj.weight", (k * hd, d), lin_in(k, hd), lin_out),
        (("o_proj", "kernel"), "self_attn.o_proj.weight", (d, h * hd), o_in, o_out),
    ]
    if c.num_experts:  # the experts themselves: moe_hf.expert_entries (E HF tensors per layer tensor)
        e.append(moe_hf.router_entry(c))
    if not c.num_experts or c.mixed_mlp:  # mixed: the dense layers' (`layers_holding`)
        e += [(("gate_proj", "kernel"), "mlp.gate_proj.weight", (f, d), lin_in(f), lin_out),
              (("up_proj", "kernel"), "mlp.up_proj.weight", (f, d), lin_in(f), lin_out),
              (("down_proj", "kernel"), "mlp.down_proj.weight", (d, f), lin_in(d), lin_out)]
    if c.qkv_bias:
        e += [(("q_proj", "bias"), "self_attn.q_proj.bias", (h * hd,), flat(h, hd), flat(-1)),
              (("k_proj", "bias"), "self_attn.k_proj.bias", (k * hd,), flat(k, hd), flat(-1)),
              (("v_proj", "bias"), "self_attn.v_proj.bias", (k * hd,), flat(k, hd), flat(-1))]
    if c.o_bias:
        e.append((("o_proj", "bias"), "self_attn.o_proj.bias", (d,), ident, ident))
    if c.mlp_bias:
        e += [(("gate_proj", "bias"), "mlp.gate_proj.bias", (f,), ident, ident),
              (("up_proj", "bias"), "mlp.up_proj.bias", (f,), ident, ident),
              (("down_proj", "bias"), "mlp.down_proj.bias", (d,), ident, ident)]
    if c.qk_norm:
        e += [(("q_norm", "scale"), "self_attn.q_norm.weight", (hd,), ident, ident),
              (("k_norm", "scale"), "self_attn.k_norm.weight", (hd,), ident, ident)]
    if c.sandwich_norm:  # Gemma: post_attention_layernorm is the attention output's norm, not the MLP's input
        e[1] = (("post_attn_norm", "scale"), "pre_feedforward_layernorm.weight", (d,), ident, ident)
        e += [(("attn_out_norm", "scale"), "post_attention_layernorm.weight", (d,), ident, ident),
              (("mlp_out_norm", "scale"), "post_feedforward_layernorm.weight", (d,), ident, ident)]
    return e


def _top_entries(c: ModelConfig, with_lm_head: bool):
    e = [(("embed",), "model.embed_tokens.weight", (c.vocab_size, c.hidden_size), lambda x: x, lambda x: x),
         (("final_norm", "scale"), "model.norm.weight", (c.hidden_size,), lambda x: x, lambda x: x)]
    if with_lm_head and not c.tie_word_embeddings:
        e.append((("lm_head",), "lm_head.weight", (c.vocab_size, c.hidden_size), lambda w: w.T, lambda w: w.T))
    return e


# ------------------------------------------------------------------------------------------- reading
class TensorIndex:
    """Name -> file over a single or sharded safetensors checkpoint; tensors read lazily (mmap)."""

    def __init__(self, path: str):
        self.path = path
        index_file = os.path.join(path, INDEX_FILE)
        single = os.path.join(path, SINGLE_FILE)
        if os.path.isfile(index_file):
            try:
                with open(index_file, encoding="utf-8") as f:
                    weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index_file}: invalid index ({e})") from None
            files = sorted(set(weight_map.values()))
        elif os.path.isfile(single):
            weight_map, files = None, [SINGLE_FILE]
        else:
            raise FileNotFoundError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE} (expected safetensors weights)")
        self.handles, self.where = {}, {}
        for name in files:
            file = os.path.join(path, name)
            if not os.path.isfile(file):
                raise FileNotFoundError(f"{file}: listed in {INDEX_FILE} but missing")
            try:
                handle = safe_open(file, framework="numpy")
            except Exception as e:  # safetensors raises its own error types for corrupt headers
                raise CheckpointError(f"{file}: not a valid safetensors file ({_one_line(e)})") from None
            self.handles[name] = handle
            for key in handle.keys():
                self.where[key] = name
        if weight_map is not None:
            missing = [k for k, fname in weight_map.items() if self.where.get(k) != fname]
            if missing:
                raise CheckpointError(f"{path}: tensor {missing[0]} listed in {INDEX_FILE} is not in {weight_map[missing[0]]}")

        self.aliases: dict[str, tuple[str, Callable]] = {}  # name -> (stored name, slice of it)

    def alias(self, aliases: dict[str, tuple[str, Callable]]):
        """Names read as a slice of another tensor (5.x fused experts: models/moe_hf.py)."""
        self.aliases.update({k: v for k, v in aliases.items() if k not in self.where})
        self.where.update({k: self.where[v[0]] for k, v in self.aliases.items()})

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.aliases:  # the slice of a zero-stride view of the stored shape: no tensor is read
            stored, part = self.aliases[name]
            return tuple(part(np.broadcast_to(np.zeros((), np.uint8), self.shape(stored))).shape)
        return tuple(self.handles[self.where[name]].get_slice(name).get_shape())

    def read(self, name: str) -> np.ndarray:
        if name in self.aliases:
            stored, part = self.aliases[name]
            return part(self.read(stored))
        file = os.path.join(self.path, self.where[name])
        try:
            return self.handles[self.where[name]].get_tensor(name)
        except Exception as e:
            raise CheckpointError(f"{file}: cannot read tensor {name} ({_one_line(e)})") from None


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:200]


def _check_files_complete(path: str):
    """A truncated safetensors file must fail here, before any tensor is memory-mapped (no SIGBUS)."""
    for name in os.listdir(path):
        if not name.endswith(".safetensors"):
            continue
        file = os.path.join(path, name)
        size = os.path.getsize(file)
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{file}: truncated safetensors file ({size} bytes)")
            n = int.from_bytes(head, "little")
            if n <= 0 or 8 + n > size:
                raise CheckpointError(f"{file}: truncated or corrupt safetensors header")
            try:
                header = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise CheckpointError(f"{file}: corrupt safetensors header (invalid JSON)") from None
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + n + end != size:
            raise CheckpointError(f"{file}: truncated safetensors file ({size} bytes, header says {8 + n + end})")


def _set(tree: dict, path: tuple[str, ...], value):
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


def _get(tree: dict, path: tuple[str, ...]):
    for p in path:
        tree = tree[p]
    return tree


def layers_holding(c: ModelConfig, ours: tuple[str, ...]) -> list[int]:
    """The layers whose checkpoint holds the tensor of our path `ours`: every layer, but in a model mixing
    dense and sparse MLPs (`ModelConfig.mixed_mlp`) the experts are the sparse layers' and the dense MLP
    the others'; the other layers hold zeros in our stacked params, and export skips them."""
    layers = range(c.num_layers)
    if not c.mixed_mlp or ours[0] not in ("moe", "gate_proj", "up_proj", "down_proj"):
        return list(layers)
    return [i for i in layers if c.moe_layers[i] == (ours[0] == "moe")]


def check_checkpoint(path: str, config: ModelConfig, *, with_lm_head: bool = True,
                     extra: dict[str, tuple[int, ...]] | None = None) -> TensorIndex:
    """The safetensors checkpoint in `path`, checked from its files' headers alone (no tensor is read):
    every file complete, every expected tensor of `config` [and `extra`, by name] present with its shape.
    Returns its index. Cheap enough to run at start-up, before any data or model loads."""
    _check_files_complete(path)
    index = TensorIndex(path)
    expert_entries = moe_hf.expert_entries(config) if config.num_experts else []
    if expert_entries:
        index.alias(moe_hf.fused_aliases(config, set(index.where)))
    expected = {name: shape for _, name, shape, _, _ in _top_entries(config, with_lm_head)}
    expected.update({f"model.layers.{i}.{suffix}": shape for ours, suffix, shape, _, _ in _layer_entries(config)
                     for i in layers_holding(config, ours)})
    expected.update({f"model.layers.{i}.{suffix}": shape for ours, suffixes, shape, _, _ in expert_entries
                     for suffix in suffixes for i in layers_holding(config, ours)})
    expected.update(extra or {})
    for name, shape in expected.items():
        if name not in index.where:
            raise CheckpointError(f"{path}: missing tensor {name} (expected shape {shape})")
        got = index.shape(name)
        if got != tuple(shape):
            raise CheckpointError(f"{path}: tensor {name} has shape {got}, expected {tuple(shape)}")
    return index


def read_checkpoint(path: str, config: ModelConfig, dtype, *, with_lm_head: bool = True,
                    extra: dict[str, tuple[int, ...]] | None = None, shardings=None):
    """Reads the decoder parameters [and `extra` HF tensors by name, with their expected shapes].

    Every expected tensor's presence and shape is checked before any array is built. With `shardings`
    (a pytree of `jax.sharding.Sharding` matching the parameters) each device's slice is read on demand,
    so a host never holds more than one full layer tensor beyond its own shards.
    Returns (params, extras) with extras as numpy arrays.
    """
    index = check_checkpoint(path, config, with_lm_head=with_lm_head, extra=extra)
    expert_entries = moe_hf.expert_entries(config) if config.num_experts else []
    np_dtype = np.dtype(jnp.dtype(dtype))
    L = config.num_layers
    layer_entries = _layer_entries(config)
    top = _top_entries(config, with_lm_head)

    params: dict[str, Any] = {}
    specs = []  # (path, our full shape, callback giving the array for an index)
    for ours, name, shape, to_ours, _ in top:
        our_shape = to_ours(np.empty(shape, np.uint8)).shape
        specs.append((ours, our_shape, lambda idx, n=name, f=to_ours: f(index.read(n))[idx]))
    for ours, suffix, shape, to_ours, _ in layer_entries:
        our_shape = (L, *to_ours(np.empty(shape, np.uint8)).shape)

        def cb(idx, suffix=suffix, f=to_ours, shape=shape, held=set(layers_holding(config, ours))):
            read = lambda i: index.read(f"model.layers.{i}.{suffix}") if i in held else np.zeros(shape, np_dtype)
            return np.stack([f(read(i))[idx[1:]] for i in range(L)[idx[0]]])
        specs.append((("layers", *ours), our_shape, cb))
    for ours, suffixes, shape, to_ours, _ in expert_entries:
        our_shape = (L, *to_ours(np.empty((len(suffixes), *shape), np.uint8)).shape)

        def cb(idx, suffixes=suffixes, f=to_ours, shape=shape, held=set(layers_holding(config, ours))):
            read = lambda i: (np.stack([index.read(f"model.layers.{i}.{s}") for s in suffixes]) if i in held
                              else np.zeros((len(suffixes), *shape), np_dtype))
            return np.stack([f(read(i))[idx[1:]] for i in range(L)[idx[0]]])
        specs.append((("layers", *ours), our_shape, cb))

    for ours, shape, cb in specs:
        if shardings is None:
            arr = jnp.asarray(cb(tuple(slice(None) for _ in shape)).astype(np_dtype, copy=False))
        else:
            arr = jax.make_array_from_callback(shape, _get(shardings, ours),
                                               lambda idx, cb=cb: cb(idx).astype(np_dtype, copy=False))
        _set(params, ours, arr)
    extras = {name: index.read(name) for name in (extra or {})}
    return params, extras


def load_hf(path: str, dtype=jnp.float32, *, compute_dtype=None, shardings=None, **config_overrides):
    """Loads a local HF Llama / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral checkpoint directory -> (ModelConfig, params).

    `dtype` is the parameter dtype, `compute_dtype` that of matmuls and activations (default: `dtype`);
    `config_overrides` set other execution fields (remat, logits_chunk). Errors are one line, name the
    file or tensor, and come before any computation.
    """
    config = read_hf_config(path, param_dtype=jnp.dtype(dtype).name,
                            dtype=jnp.dtype(compute_dtype or dtype).name, **config_overrides)
    params, _ = read_checkpoint(path, config, dtype, shardings=shardings)
    return config, params


# ------------------------------------------------------------------------------------------- writing
def hf_state_dict(config: ModelConfig, params, dtype=None, *, with_lm_head: bool = True) -> dict[str, np.ndarray]:
    """Our parameters -> {HF tensor name: numpy array} (gathered to the host, cast to `dtype`)."""
    np_dtype = np.dtype(jnp.dtype(dtype or config.param_dtype))
    host = jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x)), params)
    out = {}
    for ours, name, _, _, to_hf in _top_entries(config, with_lm_head):
        out[name] = to_hf(_get(host, ours))
    for ours, suffix, _, _, to_hf in _layer_entries(config):
        stacked = _get(host["layers"], ours)
        for i in layers_holding(config, ours):
            out[f"model.layers.{i}.{suffix}"] = to_hf(stacked[i])
    for ours, suffixes, _, _, to_hf in (moe_hf.expert_entries(config) if config.num_experts else []):
        stacked = _get(host["layers"], ours)
        for i in layers_holding(config, ours):
            out.update({f"model.layers.{i}.{s}": w for s, w in zip(suffixes, to_hf(stacked[i]))})
    return {k: np.ascontiguousarray(v.astype(np_dtype)) for k, v in out.items()}


def write_safetensors(path: str, tensors: dict[str, np.ndarray], max_shard_bytes: int):
    """One `model.safetensors`, or `model-0000k-of-0000n.safetensors` + index above `max_shard_bytes`."""
    total = sum(t.nbytes for t in tensors.values())
    if total <= max_shard_bytes:
        save_file(tensors, os.path.join(path, SINGLE_FILE), metadata={"format": "pt"})
        return
    shards, current, size = [], {}, 0
    for name, t in tensors.items():
        if current and size + t.nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += t.nbytes
    shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    with open(os.path.join(path, INDEX_FILE), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)


def _generation_config(config: ModelConfig) -> dict[str, Any]:
    eos = list(config.eos_token_id)
    return {"bos_token_id": config.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "pad_token_id": config.pad_token_id, "do_sample": True}


def save_hf(path: str, config: ModelConfig, params, *, tokenizer=None, dtype=None,
            max_shard_bytes: int = 5 * 2**30):
    """Writes config.json, generation_config.json, safetensors weights [and the tokenizer] atomically.

    `transformers.AutoModelForCausalLM.from_pretrained(path)` loads it with no missing or unexpected
    keys; tied embeddings write no `lm_head.weight`. `dtype` casts the weights (default: as stored).
    """
    tensors = hf_state_dict(config, params, dtype)
    dtype_name = str(next(iter(tensors.values())).dtype)

    def write(tmp):
        write_safetensors(tmp, tensors, max_shard_bytes)
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config_to_hf_dict(config, dtype_name), f, indent=2)
        with open(os.path.join(tmp, "generation_config.json"), "w", encoding="utf-8") as f:
            json.dump(_generation_config(config), f, indent=2)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        faults.point("export")  # every file written, not yet renamed into place

    atomic_directory(path, write)


def save_peft_adapter(path: str, config: ModelConfig, adapters, base_path: str = "", dtype=None):
    """Writes a PEFT LoRA adapter directory atomically: adapter_config.json and adapter_model.safetensors
    (models/lora.py's names and layout). `PeftModel.from_pretrained(<the base>, path)` then gives the
    merged model's logits."""
    tensors = lora.peft_state_dict(config, adapters, dtype)

    def write(tmp):
        save_file(tensors, os.path.join(tmp, "adapter_model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "adapter_config.json"), "w", encoding="utf-8") as f:
            json.dump(lora.peft_config(config, base_path), f, indent=2)

    atomic_directory(path, write)
