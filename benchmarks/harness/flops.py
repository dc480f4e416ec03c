"""FLOP counts of the benchmarked work (matmuls and attention; elementwise work is not counted): one GRPO
iteration, one policy update, one decode token. The roofline of a measurement is its FLOPs over the matmul
peak measured in the same run (`timing.matmul_peak_flops`)."""
from __future__ import annotations

import math


def _blocks(config, rows: int, start: int, stop: int) -> float:
    """Block FLOPs (no LM head) of `rows` sequences' tokens at positions start..stop-1: attention is linear
    in the context, so the mean context (start+1 + stop)/2 times the count is exact."""
    from jaxrl_llm.metrics import flops_per_token
    count = stop - start
    return 0.0 if count <= 0 else rows * count * flops_per_token(config, (start + stop + 1) / 2, lm_head=False)


def decode_flops_per_token(config, context: float) -> float:
    """Forward FLOPs of one token: 2 per weight of the blocks and the LM head (the embedding is a gather)
    plus attention scores and weighted values over `context` keys (2 * 2 * H * hd per key and layer)."""
    weights = config.num_params() - config.vocab_size * config.hidden_size * (
        0 if config.tie_word_embeddings else 1)
    return 2.0 * weights + 4.0 * config.num_layers * config.num_heads * config.head_dim * context


def iteration_flops(config, batch: int, group: int, prompt_len: int, new_tokens: int, *,
                    prefix_shared: bool = True) -> dict[str, float]:
    """FLOPs of the minimal work of one GRPO iteration, by stage (metrics.flops_per_token per token:
    2 per weight of the blocks [+ LM head] and 4*H*hd per key of attention and layer).

    B prompts of P tokens, N = B*G completions of T tokens. A forward scores T tokens per row: the LM
    head runs N*T times; the blocks run the prompt (B*P tokens, or N*P without prefix sharing) and the
    first T-1 completion tokens (the last token predicts nothing). Generation: the same blocks' work
    (prefill, then T-1 decode steps) and N*T draws' LM head. Returns {'generation', 'reference',
    'policy_fwd_bwd', 'total'}.
    """
    B, G, P, T = batch, group, prompt_len, new_tokens
    if min(B, G, P, T) < 1:
        raise ValueError(f"batch, group, prompt_len and new_tokens must be >= 1, got {B}, {G}, {P}, {T}")
    N = B * G
    head = 2.0 * config.hidden_size * config.vocab_size * N * T
    forward = _blocks(config, B if prefix_shared else N, 0, P) + _blocks(config, N, P, P + T - 1) + head
    return {"generation": forward, "reference": forward, "policy_fwd_bwd": 3 * forward, "total": 6 * forward}


def update_flops(config, batch: int, group: int, prompt_len: int, new_tokens: int, *, logits_chunk: int = 0,
                 remat: str = "none") -> dict[str, float]:
    """FLOPs of one policy update (forward + backward) on B prompts of P tokens x G completions of T tokens.

    Useful (model) FLOPs: 3x a forward (backward = 2x forward: gradients of activations and of weights)
    of the minimal work -- the blocks on the B*P prompt tokens (once per prompt) and on completion tokens
    0..T-2 of the N = B*G rows (token T-1 predicts nothing), the LM head on the N*T completion positions.
    A token at position i attends to i+1 keys. `flops_per_token` counts 2 per weight of the blocks (and
    the LM head) plus 4*H*hd per key and layer.

    Executed FLOPs: what the trainer's program computes: dense (unmasked-square) attention over all P
    prompt keys and all T completion keys, all T completion tokens through the blocks, the LM head on T
    padded to equal chunks of at most `logits_chunk` (0: no chunking), that padded head's forward once more in
    the backward (the chunked log-prob is a `jax.checkpoint`), and with `remat` the blocks' forward
    again ('full') or the attention's batched matmuls again ('dots' saves only unbatched matmuls).

    Returns {'blocks_fwd', 'head_fwd', 'forward', 'useful', 'executed'} (useful = 3 * forward).
    """
    B, G, P, T = batch, group, prompt_len, new_tokens
    if min(B, G, P, T) < 1:
        raise ValueError(f"batch, group, prompt_len and new_tokens must be >= 1, got {B}, {G}, {P}, {T}")
    if remat not in ("none", "full", "dots"):
        raise ValueError(f"remat must be none, full or dots, got {remat!r}")
    from jaxrl_llm.metrics import flops_per_token
    c, N = config, B * G

    blocks = lambda rows, start, stop: _blocks(c, rows, start, stop)
    head_per_token = 2.0 * c.hidden_size * c.vocab_size
    blocks_fwd = blocks(B, 0, P) + blocks(N, P, P + T - 1)
    head_fwd = head_per_token * N * T

    weights_per_token = flops_per_token(c, 0, lm_head=False)
    attn_per_key = 4.0 * c.num_layers * c.num_heads * c.head_dim
    exec_attention = attn_per_key * (B * P * P + N * T * (P + T))
    exec_blocks = weights_per_token * (B * P + N * T) + exec_attention
    chunks = 1 if logits_chunk <= 0 else math.ceil(T / logits_chunk)
    padded_t = chunks * math.ceil(T / chunks)  # lm.logprobs_from_hidden: equal chunks of <= logits_chunk
    exec_head = head_per_token * N * padded_t
    recompute = {"none": 0.0, "full": exec_blocks, "dots": exec_attention}[remat]
    executed = 3 * (exec_blocks + exec_head) + exec_head + recompute
    return {"blocks_fwd": blocks_fwd, "head_fwd": head_fwd, "forward": blocks_fwd + head_fwd,
            "useful": 3 * (blocks_fwd + head_fwd), "executed": executed}


def roofline(c, mc, meshes) -> str:
    """A line for benchmarks/memory_plan.py: the step's minimal model FLOPs (`iteration_flops`: sampling, reference,
    policy forward + backward; matmuls and attention) over each mesh's chips at the bfloat16 datasheet peak
    of a v5p and an H100 chip. A bound no run reaches (decoding is memory-bound), labelled as one."""
    from jaxrl_llm.metrics import PEAK_FLOPS
    flops = iteration_flops(mc, c.rollout.batch_prompts, c.rollout.group_size, c.data.max_prompt_length,
                            c.rollout.max_new_tokens)["total"]
    times = ", ".join(f"{'x'.join(map(str, m))}: {flops / (math.prod(m) * PEAK_FLOPS['TPU v5p']):,.0f} s on v5p, "
                      f"{flops / (math.prod(m) * PEAK_FLOPS['NVIDIA H100']):,.0f} s on H100" for m in meshes)
    return f"Roofline step time (an estimate, not a measurement: {flops / 1e15:,.0f} PFLOP at the chips' peak): {times}"
