"""Subprocess side of tests/test_context.py, on 8 fake CPU devices (XLA_FLAGS set by the test before jax
starts). Prints one JSON line {case: largest absolute difference}.

  attention: `context.sequence_attention` (zigzag layout, shard_map over `sequence`) on meshes (data,
    sequence) = (4, 2), (2, 4), (1, 8) against the dense attention of the whole rows (kernels.dense_attend:
    one (S,S) mask, no blocks, no gather): outputs and the gradients of q, k, v; rows of 13 tokens (a
    multiple of no shard count: padded), a short row, a hole, two packed segments crossing shard
    boundaries, with and without a sliding window and a soft cap; and a prompt prefix shared by G rows.
  model: the trainer's passes through the whole decoder on meshes with a sequence axis of 2, 4 and 8
    beside data / fsdp / tensor, against one device without a mesh: per-token log-probs of the
    prompt-shared pass (lm.completion_hidden, the score/update path), a loss over them and the gradient of
    every parameter; the packed pass (segment ids, lm logprobs on packed rows); a dense model with
    sliding-window layers, a soft cap, Gemma's norms and LoRA adapters, and a mixture-of-experts model (with its
    router's statistics, and replaying its routes); 11-token completions (a multiple of no shard count).

    python tests/context_worker.py attention|dense|moe
"""
from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import sharding
from jaxrl_llm.models import context, lm
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.kernels import dense_attend, dense_mask

N, S, H, HKV, HD = 4, 13, 4, 2, 8  # S = 13: a multiple of no shard count


def attention_inputs():
    rng = np.random.default_rng(0)
    q, ct = (jnp.asarray(rng.normal(size=(N, S, H, HD)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.normal(size=(N, S, HKV, HD)), jnp.float32) for _ in range(2))
    key_mask = np.ones((N, S), bool)
    key_mask[1, 9:] = False  # a short row
    key_mask[2, 4] = False  # a hole
    segments = np.zeros((N, S), np.int32)
    segments[3, 6:] = 1  # two packed sequences in one row, the second crossing shard boundaries
    pk, pv = (jnp.asarray(rng.normal(size=(2, 7, HKV, HD)), jnp.float32) for _ in range(2))
    pmask = np.ones((2, 7), bool)
    pmask[1, :3] = False  # a left-padded prompt
    positions = jnp.asarray(np.arange(S)[None] + np.array([7, 7, 4, 4])[:, None], jnp.int32)
    return q, k, v, jnp.asarray(key_mask), jnp.asarray(segments), ct, (pk, pv, jnp.asarray(pmask)), positions


def attention_reference(q, k, v, key_mask, segments, ct, prefix, positions, window, softcap, with_prefix):
    def loss(q, k, v, pk, pv):
        mask = dense_mask(key_mask, None if with_prefix else segments, window)
        out = dense_attend(q, k, v, mask, (pk, pv, prefix[2]) if with_prefix else None, softcap=softcap,
                           window=window, positions=positions)
        return jnp.sum(out * ct), out
    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)(q, k, v, *prefix[:2])
    return out, grads


def attention_sharded(mesh, q, k, v, key_mask, segments, ct, prefix, positions, window, softcap, with_prefix):
    c = mesh.shape["sequence"]
    lay = lambda x: context.to_layout(x, c)

    def loss(q, k, v, pk, pv):
        pre = (lay(pk), lay(pv), lay(prefix[2])) if with_prefix else None
        out = context.sequence_attention(lay(q), lay(k), lay(v), lay(key_mask), None if with_prefix else lay(segments),
                                         pre, shards=c, positions=lay(positions),
                                         window=None if window is None else jnp.int32(window), softcap=softcap,
                                         block_q=2, block_k=4)
        out = context.from_layout(out, c, S)
        return jnp.sum(out * ct), out
    with sharding.use_mesh(mesh, sequence=True):
        (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))(q, k, v,
                                                                                                    *prefix[:2])
    return out, grads


def attention_cases():
    data = attention_inputs()
    worst = {}
    for with_prefix in (False, True):
        for window, softcap in ((None, None), (5, 30.0)):
            want, want_grads = attention_reference(*data, window, softcap, with_prefix)
            for c in (2, 4, 8):
                mesh = sharding.make_mesh(data=8 // c, fsdp=1, sequence=c)
                got, got_grads = attention_sharded(mesh, *data, window, softcap, with_prefix)
                diffs = [float(jnp.max(jnp.abs(a - b))) for a, b in zip((got, *got_grads), (want, *want_grads))]
                worst[f"attention sequence={c} window={window} softcap={softcap} prefix={with_prefix}"] = max(diffs)
    return worst


DENSE = ModelConfig(model_type="gemma2", vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=3,
                    num_heads=4, num_kv_heads=2, head_dim=8, sliding_window=5,
                    layer_types=("sliding_attention", "full_attention", "sliding_attention"), attn_softcap=20.0,
                    final_softcap=15.0, norm_offset=1.0, sandwich_norm=True, hidden_act="gelu_tanh",
                    embed_scale=True, tie_word_embeddings=True, attention="blockwise", attention_block=4,
                    logits_chunk=4, lora_rank=2, lora_alpha=4.0, lora_targets=("q", "v", "o", "gate", "down"))
MOE = ModelConfig(model_type="qwen3_moe", vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=16, norm_topk_prob=True, qk_norm=True, attention="blockwise",
                  attention_block=4, logits_chunk=4)
B, G, P, T = 2, 2, 6, 11


def model_inputs(config):
    rng = np.random.default_rng(1)
    prompts = jnp.asarray(rng.integers(1, config.vocab_size, (B, P)), jnp.int32)
    pmask = np.ones((B, P), bool)
    pmask[1, :2] = False  # left padding
    completions = jnp.asarray(rng.integers(1, config.vocab_size, (B * G, T)), jnp.int32)
    cmask = np.ones((B * G, T), bool)
    cmask[1, 7:] = False  # right padding
    cmask[3, 4:] = False
    weights = jnp.asarray(rng.normal(size=(B * G, T)), jnp.float32) * cmask
    # packed rows: two sequences in one row (segment ids), positions restarting at the second
    packed = jnp.asarray(rng.integers(1, config.vocab_size, (2, 2 * T)), jnp.int32)
    seg = np.zeros((2, 2 * T), np.int32)
    seg[:, 9:] = 1
    pos = np.where(seg == 0, np.arange(2 * T), np.arange(2 * T) - 9).astype(np.int32)
    pk_mask = np.ones((2, 2 * T), bool)
    pk_mask[1, 19:] = False
    return (prompts, jnp.asarray(pmask), completions, jnp.asarray(cmask), weights,
            (packed, jnp.asarray(seg), jnp.asarray(pos), jnp.asarray(pk_mask)))


def passes(config, params, inputs, replay):
    """(log-probs of the prompt-shared pass, of the packed pass, the loss, router sums or None) and the
    gradient of the loss."""
    from jaxrl_llm.models.transformer import Decoder
    prompts, pmask, completions, cmask, weights, (packed, seg, pos, pk_mask) = inputs
    moe = config.num_experts > 0

    def loss(params):
        out = lm.completion_hidden(config, params, prompts, pmask, completions, cmask, router_stats=moe,
                                   prompt_routes=replay[0], routes=replay[1])
        hidden, stats = out if moe else (out, None)
        logp = lm.logprobs_from_hidden(config, params, hidden, completions)
        h2, _ = Decoder(config, with_lm_head=False).apply({"params": params}, packed, pos, pk_mask, segment_ids=seg)
        logp_packed = lm.logprobs_from_hidden(config, params, h2[:, :-1], packed[:, 1:]) * pk_mask[:, 1:]
        value = jnp.sum(logp * weights) / jnp.sum(cmask) + jnp.sum(logp_packed) / jnp.sum(pk_mask)
        if moe:  # the router's losses are functions of these sums (rl/router.py)
            value = value + 0.01 * sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(stats)) / jnp.sum(cmask)
        return value, (logp, logp_packed, stats)
    return jax.value_and_grad(loss, has_aux=True)(params)


def routes_of(config, params, inputs):
    """The experts the prompt and completion tokens pick (replayed by the sharded passes)."""
    prompts, pmask, completions, cmask = inputs[:4]
    _, _, p_routes = lm.prefill(config, params, prompts, pmask, return_routes=True)
    from jaxrl_llm.models.transformer import Decoder
    full = jnp.concatenate([jnp.repeat(prompts, G, axis=0), completions], axis=1)
    fmask = jnp.concatenate([jnp.repeat(pmask, G, axis=0), cmask], axis=1)
    _, _, routes = Decoder(config, with_lm_head=False, return_routes=True).apply(
        {"params": params}, full, lm.positions_from_mask(fmask), fmask)
    return p_routes, routes[:, :, P:]


# meshes (over the 8 devices or fewer) of each case; "replay": the MoE's routes replayed
MESHES = {"dense": [dict(sequence=2, data=4), dict(sequence=4, fsdp=2), dict(sequence=8),
                    dict(sequence=2, fsdp=2, tensor=2)],
          # data 4 x tensor 2 without a sequence axis: 2 prompts over 4 row shards (models/layout.py)
          "moe": [dict(sequence=2, data=2, tensor=2), dict(sequence=8), dict(data=4, tensor=2)],
          "moe replay": [dict(sequence=4, fsdp=2)]}


def excess(a, b, rtol: float = 1e-5) -> float:
    """max |a - b| - rtol |b| over every leaf: <= atol is numpy's allclose(a, b, rtol, atol)."""
    pairs = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    return max([float(jnp.max(jnp.abs(x - y) - rtol * jnp.abs(y))) for x, y in pairs] or [0.0])


def model_cases(kind: str):
    worst = {}
    config = DENSE if kind == "dense" else MOE
    params = lm.init_params(config, jax.random.PRNGKey(3))
    # sharper attention; the MoE less (at 4x its tensor-parallel gradients alone, without a sequence axis,
    # differ from one device's by 2.1e-5 past rtol 1e-5: float sums in another order, amplified)
    scale = 2 if config.num_experts else 4
    params = jax.tree_util.tree_map(lambda x: x * scale if x.ndim > 1 else x, params)
    if config.lora_rank:  # adapters that act (B starts at zero): their gradients and the base's both compared
        params = jax.tree_util.tree_map_with_path(
            lambda p, x: x + 0.1 if "lora_b" in jax.tree_util.keystr(p) else x, params)
    inputs = model_inputs(config)
    for name in [k for k in MESHES if k.startswith(kind)]:
        replay = routes_of(config, params, inputs) if name.endswith("replay") else (None, None)
        (want, want_aux), want_grads = jax.jit(lambda p, i, rp: passes(config, p, i, rp))(params, inputs, replay)
        for shape in MESHES[name]:
            mesh = sharding.make_mesh(**{"data": 1, "fsdp": 1, **shape})
            with sharding.use_mesh(mesh, sequence=True):
                (got, got_aux), got_grads = jax.jit(lambda p, i, rp: passes(config, p, i, rp))(params, inputs,
                                                                                                replay)
            tag = f"model {name} {'x'.join(f'{k}{v}' for k, v in shape.items())}"
            worst[tag + " logp"] = excess(got_aux[:2], want_aux[:2])
            worst[tag + " loss"] = excess(got, want)
            worst[tag + " grads"] = excess(got_grads, want_grads)
            if config.num_experts:
                worst[tag + " router"] = excess(got_aux[2], want_aux[2])
    return worst


def main():
    assert len(jax.devices()) == 8, jax.devices()
    jax.config.update("jax_default_matmul_precision", "highest")
    out = attention_cases() if sys.argv[1] == "attention" else model_cases(sys.argv[1])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
