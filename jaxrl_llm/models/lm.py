"""Pure functions of (config, params, arrays) over the `Decoder`: logits, chunked log-probs, prompt-shared
completion passes, prefill and decode steps. `config` is static (hashable); everything else is traced.

Shapes: B rows (prompts), T tokens, V vocabulary, D hidden; N = B*G completion rows; P prompt tokens.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.layout import constrain
from jaxrl_llm.models.precision import matmul_precision, precise
from jaxrl_llm.models.decode import decode_layer, decode_weights, left_matmul, weights_on_left
from jaxrl_llm.models.kernels import soft_cap
from jaxrl_llm.models.skip import column_chunks, skip_columns
from jaxrl_llm.models.transformer import Decoder, embed, lm_head_weight, rms_norm, rope_cos_sin


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """(B,T) 0/1 -> (B,T) int32 positions counting only real tokens (0 on left padding)."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def init_params(config: ModelConfig, rng: jax.Array, *, with_lm_head: bool = True):
    """Random parameters (normal 0.02, norms at 1) in `config.param_dtype`, without logical boxes."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    variables = Decoder(config, with_lm_head=with_lm_head).init(rng, tokens, tokens, jnp.ones((1, 1), bool))
    return nn.meta.unbox(variables["params"])


def param_logical_axes(config: ModelConfig, *, with_lm_head: bool = True):
    """Pytree of `PartitionSpec`s of logical axis names, matching `init_params`'s structure."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    abstract = jax.eval_shape(lambda: Decoder(config, with_lm_head=with_lm_head).init(
        jax.random.PRNGKey(0), tokens, tokens, jnp.ones((1, 1), bool)))
    return nn.get_partition_spec(abstract["params"])


@precise
def hidden_states(config: ModelConfig, params, tokens: jax.Array, attention_mask: jax.Array | None = None):
    """Final-norm hidden states (B,T,D) of a left-padded batch; positions come from the mask."""
    mask = jnp.ones_like(tokens) if attention_mask is None else attention_mask
    hidden, _ = Decoder(config, with_lm_head=False).apply(
        {"params": params}, tokens, positions_from_mask(mask), mask.astype(bool))
    return hidden


@precise
def logits_from_hidden(config: ModelConfig, params, hidden: jax.Array) -> jax.Array:
    """(..., D) -> float32 logits (..., V)."""
    return logits_from_weight(config, lm_head_weight(config, params), hidden)


def logits_from_weight(config: ModelConfig, w: jax.Array, hidden: jax.Array) -> jax.Array:
    """(..., D) -> float32 logits (..., V) through the LM head's (D, V) weight `w`."""
    dt = jnp.dtype(config.dtype)
    # On flattened rows: XLA:CPU differentiates a 2-D matmul much faster than an N-D one (transformer.Dense).
    logits = jnp.dot(hidden.reshape(-1, hidden.shape[-1]).astype(dt), w.astype(dt), preferred_element_type=jnp.float32)
    return soft_cap(logits.reshape(*hidden.shape[:-1], w.shape[-1]), config.final_softcap)


@precise
def decode_logits(config: ModelConfig, params, hidden: jax.Array) -> jax.Array:
    """The sampler's LM head: (N,D) -> float32 logits (N,V), as `logits_from_hidden`. With tied embeddings
    and `weights_on_left()`, the (V,D) embedding table is the left operand: no copy, and 1.4-1.7x faster
    at 16 rows (an untied head (D,V) would need a transposed copy: it keeps x @ W)."""
    if not (config.tie_word_embeddings and weights_on_left()):
        return logits_from_hidden(config, params, hidden)
    logits = left_matmul(params["embed"], hidden, jnp.dtype(config.dtype), preferred_element_type=jnp.float32)
    return soft_cap(logits, config.final_softcap)


@functools.partial(jax.jit, static_argnames="config")
def forward(config: ModelConfig, params, tokens: jax.Array, attention_mask: jax.Array | None = None):
    """Logits (B,T,V) float32. Left padding gives, on real tokens, the logits of each sequence alone."""
    return logits_from_hidden(config, params, hidden_states(config, params, tokens, attention_mask))


# Cap on one float32 block of logits (rows x chunk x V): with many rows and a large vocabulary,
# `config.logits_chunk` tokens per row make the block the update's largest temporary (16 rows x 48 tokens x
# 49,152 at SmolLM2-135M's shape: 151 MB, held several times over in the backward: logits, probabilities,
# their gradient). The chunk never falls below LOGITS_MIN_CHUNK tokens, so the LM head's matmul keeps
# rows x 16 lhs rows.
LOGITS_BLOCK_BYTES = 64 * 2 ** 20
LOGITS_MIN_CHUNK = 16


def logits_chunk_for(config: ModelConfig, rows: int) -> int:
    """Tokens per row of one log-prob chunk: `config.logits_chunk`, lowered so that rows x chunk x V float32
    logits stay under LOGITS_BLOCK_BYTES, but not below LOGITS_MIN_CHUNK (nor above logits_chunk)."""
    by_bytes = LOGITS_BLOCK_BYTES // (4 * rows * config.vocab_size)
    return min(config.logits_chunk, max(LOGITS_MIN_CHUNK, by_bytes))


@precise
def logprobs_from_hidden(config: ModelConfig, params, hidden: jax.Array, targets: jax.Array,
                         temperature=1.0, *, with_entropy: bool = False, chunk: int | None = None, active=None):
    """log_softmax(logits/temperature) at `targets`, in equal sequence chunks of at most `chunk` tokens
    (default `logits_chunk_for(config, B)`: `config.logits_chunk`, less for many rows x a large vocabulary).

    hidden (B,T,D) aligned with targets (B,T): hidden[:, t] predicts targets[:, t]. Only a (B,chunk,V)
    float32 block of logits exists at a time, in the backward pass too (each chunk is rematerialized),
    so a 152k vocabulary stays affordable. `active` (int32 scalar, traced): only columns t < active are
    read; a chunk wholly at or past it is skipped at run time (its outputs 0, forward and backward), so a
    static T larger than the tokens costs the LM head nothing. Returns logp (B,T) [and entropy (B,T)] float32.
    """
    chunk = chunk or logits_chunk_for(config, hidden.shape[0])
    temperature = jnp.asarray(temperature, jnp.float32)
    w = lm_head_weight(config, params)
    if active is not None:
        out = skip_columns(functools.partial(_skippable_chunk, config, with_entropy), (w, temperature), hidden,
                           targets, (), chunk, active)
    else:
        split, merge, _ = column_chunks(hidden.shape[1], chunk)
        one = jax.checkpoint(lambda h, tgt: _chunk_logprobs(config, with_entropy, w, h, tgt, temperature))
        _, out = jax.lax.scan(lambda c, xs: (c, one(*xs)), None, (split(hidden), split(targets)))
        out = tuple(merge(x) for x in out)
    return out if with_entropy else out[0]


def _chunk_logprobs(config: ModelConfig, with_entropy: bool, w, h, tgt, temperature) -> tuple:
    """(logp,) or (logp, entropy) of one chunk: h (B,c,D), tgt (B,c) -> each (B,c) float32."""
    logits = logits_from_weight(config, w, h) / temperature
    logz = jax.nn.logsumexp(logits, axis=-1)
    logp = jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0] - logz
    if not with_entropy:
        return (logp,)
    probs = jnp.exp(logits - logz[..., None])
    return logp, logz - jnp.sum(probs * logits, axis=-1)


def _skippable_chunk(config: ModelConfig, with_entropy: bool, shared, h, tgt, fixed) -> tuple:
    """`_chunk_logprobs` as models/skip.py calls it; its backward is traced at transposition, outside
    logprobs_from_hidden's `precise`, so the precision is set here."""
    w, temperature = shared
    with matmul_precision(config):
        return _chunk_logprobs(config, with_entropy, w, h, tgt, temperature)


@functools.partial(jax.jit, static_argnames="config")
def token_logprobs(config: ModelConfig, params, tokens: jax.Array, attention_mask: jax.Array,
                   targets: jax.Array, temperature=1.0):
    """(B,T) float32: log_softmax(logits[:, t] / temperature)[targets[:, t]], computed in chunks."""
    hidden = hidden_states(config, params, tokens, attention_mask)
    return logprobs_from_hidden(config, params, hidden, targets, temperature)


# ------------------------------------------------------------------ prompt-shared passes (sampler, trainer)
@precise
def prefill(config: ModelConfig, params, prompts: jax.Array, prompt_mask: jax.Array, *,
            with_lm_head: bool = True, rngs=None, routes=None, return_routes: bool = False):
    """Runs the prompts once. prompts/prompt_mask (B,P) left-padded. rngs: {"dropout": key} in training
    with LoRA dropout (models/lora.py), else None.

    MoE: `routes` (L,B,P,k) replays the prompt tokens' experts (models/moe.py).

    Returns hidden (B,P,D) and the per-layer prefix (k, v), each (L,B,P,Hkv,hd) [, the experts (L,B,P,k)
    with return_routes].
    """
    out = Decoder(config, return_kv=True, with_lm_head=with_lm_head, return_routes=return_routes).apply(
        {"params": params}, prompts, positions_from_mask(prompt_mask), prompt_mask.astype(bool), rngs=rngs,
        routes=routes)
    return out


@precise
def completion_hidden(config: ModelConfig, params, prompts, prompt_mask, completions, completion_mask,
                      dropout_rng=None, prompt_routes=None, routes=None, router_stats: bool = False):
    """Hidden states that predict each completion token, sharing each prompt across its G completions.

    prompts/prompt_mask (B,P) left-padded; completions/completion_mask (N,T) right-padded, N = B*G,
    rows b*G..b*G+G-1 continue prompt b. Returns (N,T,D) with row n, column t predicting completions[n, t]:
    column 0 is the prompt's last hidden state, column t > 0 the completion's hidden state at t-1.
    Equal (up to float rounding) to running the concatenated [prompt; completion] rows one by one, at
    B*P + N*T token cost instead of N*(P+T). dropout_rng: a key for LoRA dropout (training only).
    MoE routing replay: prompt_routes (L,B,P,k) and routes (L,N,T,k), the experts the sampler chose.
    router_stats: also return the router's per-layer sums (models/moe.py) over the completion tokens of
    `completion_mask` -- the prompts' tokens do not count (rl/router.py); (hidden, stats) then.
    """
    b = prompts.shape[0]
    n, t = completions.shape
    g = n // b
    lengths = jnp.repeat(jnp.sum(prompt_mask.astype(jnp.int32), axis=-1), g)  # (N,)
    positions = lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
    both_routes = None if prompt_routes is None and routes is None else (prompt_routes, routes)
    # One layer scan over both (Decoder `pair`): each layer runs the prompts, then the completions on the
    # prompts' keys/values of that layer.
    (p_hidden, c_hidden), _, *stats = Decoder(config, with_lm_head=False, return_router_stats=router_stats,
                                              pair=True).apply(
        {"params": params}, (prompts, completions), (positions_from_mask(prompt_mask), positions),
        (prompt_mask.astype(bool), completion_mask.astype(bool)),
        rngs=None if dropout_rng is None else {"dropout": dropout_rng}, routes=both_routes)
    first = jnp.repeat(p_hidden[:, -1:], g, axis=0)  # (N,1,D)
    hidden = jnp.concatenate([first, c_hidden[:, :-1]], axis=1)
    return (hidden, stats[0]) if router_stats else hidden


# Whether a decode step unrolls the layer loop or scans over the stacked layers. Unrolled, a step reads
# per-layer copies of the weights (fused q|k|v and gate|up; on CPU laid out (out,in) for `left_matmul`) made
# once per `generate` call; scanned, it reads the parameters in place. On CPU, XLA copies every dynamic slice
# that feeds a matmul, so the scan copies each layer's weights at every token, and its matmuls keep x @ W.
# At Qwen2.5-0.5B's shape (24 layers of 60 MB, larger than the last-level cache) the copy is a DRAM round
# trip per layer per token: unrolled 183 against 262 ms per step before the weights went on the left, 155 ms
# after. At SmolLM2-135M's (30 layers of 14 MB) the copy mostly prefetches a cached layer (unrolled 62
# against 59 ms with x @ W), but with the weights on the left the unrolled step wins, 49.9 against 56.3 ms,
# for 2-3 s more compile once (a rerun reads it from the compilation cache). Models with small layers keep
# the scan: compilation grows with the layer count. Unrolling holds the copy of the layer weights for the
# duration of the call (bounded below). Measured on CPU only; other backends keep the small-model rule.
# docs/benchmarks_history.md ("The sampler at Qwen2.5-0.5B's shape" and the section after it).
DECODE_UNROLL_MAX_LAYERS = 8  # small models unroll, on every backend ...
DECODE_UNROLL_MAX_BYTES = 256 * 2 ** 20  # ... up to this many bytes of layer weights
DECODE_UNROLL_CPU_LAYER_BYTES = 8 * 2 ** 20  # on CPU, deeper models unroll when their layers average this much
DECODE_UNROLL_CPU_MAX_BYTES = 2 * 2 ** 30  # ... up to this many bytes of layer weights


def decode_unrolled(config: ModelConfig) -> bool:
    """Whether decode steps unroll the layer loop (see DECODE_UNROLL_*): small models, and on CPU the
    models whose layers are large enough for the unrolled step's gain to outweigh compiling each layer."""
    c = config
    layer_weights = c.num_params() - c.hidden_size * (1 + c.vocab_size * (1 if c.tie_word_embeddings else 2))
    nbytes = layer_weights * jnp.dtype(c.param_dtype).itemsize
    if c.num_layers <= DECODE_UNROLL_MAX_LAYERS and nbytes <= DECODE_UNROLL_MAX_BYTES:
        return True
    return (jax.default_backend() == "cpu" and nbytes <= DECODE_UNROLL_CPU_MAX_BYTES
            and nbytes >= DECODE_UNROLL_CPU_LAYER_BYTES * c.num_layers)


@precise
def decode_prepare(config: ModelConfig, params, prefix_kv):
    """Once per generation, outside the token loop: the weights of `decode_layer` and the prompt prefix.
    prefix_kv: `prefill`'s (k, v), each (L,B,P,Hkv,hd).

    The prefix is re-laid out head-major, keys transposed: k (L,B,Hkv,hd,P), v (L,B,Hkv,P,hd), the layout
    `attend_step` multiplies without packing (a copy, made once; `prefill`'s arrays die here).
    Returns (weights, prefix). When `decode_unrolled(config)`: L-tuples of per-layer fused weights and of
    per-layer prefixes (k, v) -- copies. Else: views of the stacked parameters and the stacked prefix.
    """
    pk, pv = prefix_kv[0].transpose(0, 1, 3, 4, 2), prefix_kv[1].swapaxes(2, 3)
    prefix = tuple((pk[l], pv[l]) for l in range(config.num_layers)) if decode_unrolled(config) else (pk, pv)
    return decode_layer_weights(config, params), prefix


@precise
def decode_layer_weights(config: ModelConfig, params):
    """The weights `decode_step` reads (see `decode_prepare`): an L-tuple of per-layer fused copies when
    `decode_unrolled(config)`, else views of the stacked parameters."""
    if not decode_unrolled(config):
        return decode_weights(config, params["layers"], fuse=False)
    weights = decode_weights(config, params["layers"], fuse=True)
    return tuple(jax.tree_util.tree_map(lambda a, l=l: a[l], weights) for l in range(config.num_layers))


def decode_rows(config: ModelConfig, tree, rows: jax.Array):
    """Rows `rows` (S,) int of a decode prefix (`decode_prepare`'s, B -> S) or cache (`init_cache`'s, N -> S):
    the same structure, a copy. The continuous-batching sampler's slots each attend to the prefix of their
    own prompt; the static sampler's shrunk phases keep the rows still decoding (sampling/batch.py)."""
    axis = 0 if decode_unrolled(config) else 1  # per-layer arrays, or the stacked (L, rows, ...) ones
    return jax.tree_util.tree_map(lambda a: jnp.take(a, rows, axis=axis), tree)


def init_cache(config: ModelConfig, rows: int, slots: int):
    """Empty key/value caches for `rows` completions of up to `slots` tokens, head-major, keys transposed:
    k (N,Hkv,hd,T) and v (N,Hkv,T,hd) (see `attend_step`). An L-tuple of (k, v) when
    `decode_unrolled(config)`, else one stacked (k, v) pair with a leading L axis.

    Every buffer is filled with its own constant: XLA merges identical constant arrays into one buffer
    and then copies them apart at every step of the loop. The fill is never seen: a slot is written
    before the step whose attention mask first admits it, and masked slots get exactly zero weight.
    """
    dt = jnp.dtype(config.dtype)
    n, kvh, hd = rows, config.num_kv_heads, config.head_dim
    # rows over data x fsdp, KV heads over tensor
    k_spec = ((n, kvh, hd, slots), ("batch", "act_heads", "head_dim", "length"))
    v_spec = ((n, kvh, slots, hd), ("batch", "act_heads", "length", "head_dim"))

    def full(spec, value, layers=()):
        shape, axes = spec
        return constrain(jnp.full((*layers, *shape), value, dt),
                                          (*(("layers",) if layers else ()), *axes))

    if not decode_unrolled(config):
        return full(k_spec, 0, (config.num_layers,)), full(v_spec, 1, (config.num_layers,))
    return tuple((full(k_spec, 2 * l), full(v_spec, 2 * l + 1)) for l in range(config.num_layers))


@precise
def decode_step(config: ModelConfig, params, weights, tokens, positions, cache, cache_index, prefix, prefix_mask,
                return_routes: bool = False):
    """One decoding step for all N rows. tokens, positions (N,) int; weights, prefix from `decode_prepare`
    (or `decode_rows`); cache from `init_cache` (or a previous step); cache_index the slot t: a
    scalar, or (N,) one per row (rows at different steps); prefix_mask (B,P) bool.

    Returns (hidden (N,D) after the final norm, updated cache) [, MoE with return_routes: the experts
    (L,N,k) each row's token was routed to]. The step sees the prompt plus slots 0..t.
    """
    routed = return_routes and config.num_experts > 0
    c = config
    x = constrain(embed(c, params["embed"], tokens), ("batch", "act_embed"))
    # The barrier materializes cos/sin once per step: otherwise XLA fuses these transcendentals into every
    # layer's q and k fusions and evaluates them once per head element (~0.34 ms per layer of a 30M model
    # on CPU, 10x the rotation itself; docs/benchmarks_history.md, "The decode step's attention and RoPE").
    cos, sin = rope_cos_sin(c, positions[:, None])
    if c.local_rope is not None:  # (2,N,1,hd): global then local (Gemma 3)
        cos_l, sin_l = rope_cos_sin(c, positions[:, None], local=True)
        cos, sin = jnp.stack([cos, cos_l]), jnp.stack([sin, sin_l])
    cos, sin = jax.lax.optimization_barrier((cos[..., 0, :], sin[..., 0, :]))
    sliding, sparse = c.sliding_layers, c.moe_layers
    if decode_unrolled(c):
        new_cache, experts = [], []
        for l, (w, layer_cache, layer_prefix) in enumerate(zip(weights, cache, prefix)):
            x, layer_cache, *e = decode_layer(c, w, x, cos, sin, layer_cache, cache_index, layer_prefix, prefix_mask,
                                              sliding=sliding[l], return_routes=routed, sparse=sparse[l])
            new_cache.append(layer_cache)
            experts += e
        cache = tuple(new_cache)
        experts = jnp.stack(experts) if routed else None
    else:
        def one(carry, xs):
            x, cache = carry
            layer, w, pk, pv = xs
            x, cache, *e = decode_layer(c, w, x, cos, sin, cache, cache_index, (pk, pv), prefix_mask, layer,
                                        sliding=jnp.asarray(sliding)[layer], return_routes=routed,
                                        sparse=jnp.asarray(sparse)[layer])
            return (x, cache), (e[0] if routed else None)

        (x, cache), experts = jax.lax.scan(one, (x, cache), (jnp.arange(c.num_layers), weights, *prefix))
    hidden = rms_norm(x, params["final_norm"]["scale"], c.rms_norm_eps, c.norm_offset)
    return (hidden, cache, experts) if routed else (hidden, cache)
