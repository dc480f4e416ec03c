"""Routing replay, measured: a bfloat16 sampler against a float32 trainer on a random mixture-of-experts
model, with and without replaying the sampler's experts in the trainer's pass.

    python benchmarks/moe_routing_replay.py               # the table of docs/models.md (MoE section)
    python benchmarks/moe_routing_replay.py --prompts 2   # seconds: keeps the script from rotting
    python benchmarks/moe_routing_replay.py --update      # the update step: MoE against its dense twin
    python benchmarks/moe_routing_replay.py --update --prompts 2 --new-tokens 8 --repeats 1   # its smoke run

The sampler (`sampling.generate`, static batch) computes in bfloat16 and records each token's experts
(`Rollout.routes`, `prompt_routes`); the trainer recomputes the completion log-probs in float32
(`lm.completion_hidden`), routing afresh or replaying. Printed: the fraction of (token, layer) pairs whose
expert set differs between the two passes, the fraction of tokens routed differently in any layer, and
max / mean |sampler log-prob - trainer log-prob| over the generated tokens (`sampler/logp_diff_max`).

--update: the trainer's update step (forward, backward, AdamW: `Trainer.fns.update` on the harness's
batch of full-length random completions, benchmarks/harness/grpo.py) of the same MoE against the dense
model of the same active parameters -- each layer's MLP as wide as the k experts a token uses (k x the
expert width), the router aside -- timed side by side (interleaved) in one process, float32.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np


def random_moe(layers: int, experts: int, k: int, seed: int = 0):
    from jaxrl_llm.models.config import ModelConfig
    from jaxrl_llm.models.lm import init_params
    c = ModelConfig(model_type="qwen3_moe", vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=layers,
                    num_heads=4, num_kv_heads=2, head_dim=32, qk_norm=True, num_experts=experts,
                    num_experts_per_tok=k, moe_intermediate_size=64, norm_topk_prob=True, max_position_embeddings=512)
    params = init_params(c, jax.random.PRNGKey(seed))
    rng = np.random.default_rng(seed)
    # A std of 0.1 (as the parity tests' HF models) rather than 0.02: distinct router logits per token.
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x if "scale" in jax.tree_util.keystr(p) else jnp.asarray(rng.normal(0, 0.1, x.shape), x.dtype),
        params)
    return c, params


def measure(prompts: int, samples: int, new_tokens: int, layers: int, experts: int, k: int) -> dict:
    from jaxrl_llm.models.lm import completion_hidden, logprobs_from_hidden, positions_from_mask
    from jaxrl_llm.models.transformer import Decoder
    from jaxrl_llm.sampling import generate
    config, params = random_moe(layers, experts, k)
    rng = np.random.default_rng(1)
    tokens = rng.integers(3, config.vocab_size, (prompts, 16)).astype(np.int32)
    mask = np.ones_like(tokens)
    sampler = config.replace(dtype="bfloat16")
    r = generate(sampler, params, tokens, mask, jax.random.PRNGKey(0), max_new_tokens=new_tokens,
                 num_samples=samples, eos_ids=[2], pad_id=0)
    full = np.concatenate([r.prompt_tokens, r.tokens], 1)
    full_mask = np.concatenate([r.prompt_mask, r.mask], 1)
    _, _, fresh = Decoder(config, with_lm_head=False, return_routes=True).apply(
        {"params": params}, full, positions_from_mask(full_mask), full_mask.astype(bool))
    valid = full_mask.astype(bool)
    valid[:, -1] = False
    recorded = np.concatenate([r.prompt_routes, r.routes], 2)
    differ = ~np.all(np.sort(recorded, -1) == np.sort(np.asarray(fresh), -1), axis=-1)  # (L,N,P+T)
    m = np.asarray(r.mask).astype(bool)
    out = {"pairs_routed_differently": float(differ[:, valid].mean()),
           "tokens_routed_differently": float(differ.any(0)[valid].mean()), "tokens": int(valid.sum())}
    for replay in (False, True):
        hidden = completion_hidden(config, params, r.prompt_tokens, r.prompt_mask, r.tokens, r.mask,
                                   prompt_routes=r.prompt_routes if replay else None,
                                   routes=r.routes if replay else None)
        gap = np.abs(np.asarray(logprobs_from_hidden(config, params, hidden, r.tokens)) - np.asarray(r.logprobs))[m]
        name = "replay" if replay else "no_replay"
        out[f"{name}/logp_diff_max"], out[f"{name}/logp_diff_mean"] = float(gap.max()), float(gap.mean())
    return out


def dense_twin(config):
    """The dense model of the MoE's active parameters: an MLP of width k x the expert width per layer."""
    return config.replace(model_type="qwen3", intermediate_size=config.num_experts_per_tok * config.moe_intermediate_size,
                          num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0)


def active_params(config) -> int:
    """Parameters a token uses: all but the experts it is not routed to."""
    idle = config.num_experts - config.num_experts_per_tok
    return config.num_params() - idle * 3 * config.hidden_size * config.moe_intermediate_size * config.num_layers


def update_times(a, workdir: str) -> dict:
    """{name: (config, Timing)} of the update step of the MoE and of its dense twin (module docstring)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from harness.grpo import build_trainer, close_trainer, update_call
    from harness.shapes import make_tokenizer, write_prompts
    from harness.timing import time_interleaved
    from jaxrl_llm.models import save_hf
    moe, params = random_moe(a.layers, a.experts, a.k)
    models = {"moe": (moe, params), "dense": (dense_twin(moe), None)}
    trainers, calls = {}, {}
    for name, (config, p) in models.items():
        ws = os.path.join(workdir, name)
        config = config.replace(eos_token_id=(1,), pad_token_id=0)
        if p is None:
            from jaxrl_llm.models.lm import init_params
            p = init_params(config, jax.random.PRNGKey(0))
        save_hf(os.path.join(ws, "model"), config, p)
        make_tokenizer(config.vocab_size).save_pretrained(os.path.join(ws, "tokenizer"))
        write_prompts(os.path.join(ws, "prompts.jsonl"), config.vocab_size, 4 * a.prompts, 16)
        trainers[name] = build_trainer(ws, None, batch=a.prompts, group=a.samples, prompt_len=16,
                                       new_tokens=a.new_tokens)
        calls[name] = update_call(trainers[name])
    timings = time_interleaved(calls, repeats=a.repeats, warmup=1)
    for t in trainers.values():
        close_trainer(t)
    return {name: (trainers[name].mc, timings[name]) for name in models}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--update", action="store_true", help="time the update step against the dense twin")
    ap.add_argument("--repeats", type=int, default=5, help="--update: timed steps of each model")
    a = ap.parse_args()
    if a.update:
        with tempfile.TemporaryDirectory() as tmp:
            res = update_times(a, tmp)
        print(f"update step, {a.prompts} prompts x {a.samples}, 16 + {a.new_tokens} tokens, float32, "
              f"{jax.devices()[0].platform}; median of {a.repeats}")
        print("| model | parameters | active per token | update (s) | spread |\n|---|---|---|---|---|")
        for name, (config, t) in res.items():
            print(f"| {name} | {config.num_params() / 1e6:.2f}M | {active_params(config) / 1e6:.2f}M | "
                  f"{t.median:.3f} | {t.spread:.0%} |")
        print(f"MoE / dense update time: {res['moe'][1].median / res['dense'][1].median:.2f}x")
        return
    res = measure(a.prompts, a.samples, a.new_tokens, a.layers, a.experts, a.k)
    print(f"MoE {a.layers} layers, {a.experts} experts top-{a.k}; bfloat16 sampler vs float32 trainer, "
          f"{res['tokens']} tokens (prompt + fed completion)")
    print(f"(token, layer) pairs routed differently: {res['pairs_routed_differently']:.3%}; "
          f"tokens routed differently in some layer: {res['tokens_routed_differently']:.3%}")
    print("| trainer pass | logp_diff_max | logp_diff_mean |\n|---|---|---|")
    for name in ("no_replay", "replay"):
        print(f"| {name.replace('_', ' ')} | {res[name + '/logp_diff_max']:.4f} | {res[name + '/logp_diff_mean']:.5f} |")


if __name__ == "__main__":
    main()
