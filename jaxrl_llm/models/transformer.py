"""Flax Linen decoder-only LM reproducing transformers' Llama, Qwen2 and Qwen3 exactly.

Shapes: N rows, S query tokens, K self keys, B prompt rows with N = B*G (G completions per prompt),
P prompt tokens, L layers, D hidden, H heads, Hkv key/value heads, R = H/Hkv, hd head dim, V vocab.

One `Decoder` serves every multi-token pass:
  * plain (training / HF parity): causal attention among the S tokens under the key `mask` (N,S)
    [and `segment_ids` (N,S): a token sees only its own segment's, for packed rows; or a (segment, branch)
    pair: a prompt shared by its packed completions, models/kernels.py];
  * `prefix`: per-layer keys/values of a shared prompt (L,B,P,Hkv,hd) that every row n = b*G + g also
    attends to -- the prompt is computed once per prompt, not once per completion (sampling and training).
Attention runs by `config.attention` (models/kernels.py: xla, blockwise, cudnn, splash or auto).
Layers are stacked with `nn.scan` (compile time independent of depth) and optionally rematerialized.
The sampler's one-token step is `decode.decode_layer`: the same layer as plain arrays.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import context, lora
from jaxrl_llm.models.config import ModelConfig, RopeConfig
from jaxrl_llm.models.kernels import attend
from jaxrl_llm.models.layout import constrain
from jaxrl_llm.models.moe import MoeMlp


# ---------------------------------------------------------------------------------------------- RoPE
def rope_inv_freq(rope: RopeConfig, head_dim: int) -> tuple[np.ndarray, float]:
    """Inverse frequencies (head_dim/2,) float32 and the cos/sin scale, as transformers computes them."""
    dim = head_dim
    inv_freq = np.float32(1.0) / _theta_powers(rope.theta, dim)
    scale = 1.0
    if rope.type == "linear":
        inv_freq = inv_freq / np.float32(rope.factor)
    elif rope.type == "llama3":
        old_len = rope.original_max_position_embeddings
        low_wavelen = old_len / rope.low_freq_factor
        high_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = np.where(medium, smoothed, scaled).astype(np.float32)
    elif rope.type == "yarn":
        inv_freq, scale = _yarn(rope, dim)
    return inv_freq.astype(np.float32), float(scale)


def _theta_powers(theta: float, dim: int) -> np.ndarray:
    """theta ** (2i/dim), i < dim/2, float32: transformers' `base ** (arange(0, dim, 2).float() / dim)`.

    The exponents are float32 as there; the power is taken in float64 and rounded once. numpy's float32
    power is off by an ulp in most (theta, dim) (e.g. 2 of Qwen2's 32 frequencies), where torch's is
    the correctly rounded value in ~99% of entries: an ulp of a frequency is an angle error that grows with
    the position (1e-5 rad at 256, cos/sin 5e-4 off at 8k); it took the 0.5B model's float32 logits from
    1.2e-4 to 1.6e-4 off transformers' float64 ones (tests/test_rope_precision.py).
    """
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (np.float64(np.float32(theta)) ** exponents.astype(np.float64)).astype(np.float32)


def _yarn(rope: RopeConfig, dim: int) -> tuple[np.ndarray, float]:
    base, factor = rope.theta, rope.factor

    def mscale(s, m=1.0):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim)
        else:
            attention_factor = mscale(factor)

    def correction_dim(rot):
        return dim * math.log(rope.original_max_position_embeddings / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    pos_freqs = _theta_powers(base, dim)
    extrapolation = 1.0 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq.astype(np.float32), float(attention_factor)


def rope_cos_sin(config: ModelConfig, positions: jax.Array, local: bool = False) -> tuple[jax.Array, jax.Array]:
    """positions (N,S) int -> cos, sin (N,S,hd) float32 (the two halves repeat, rotate-half convention).
    local: the sliding layers' RoPE (`config.local_rope`, Gemma 3)."""
    inv_freq, scale = rope_inv_freq(config.local_rope if local else config.rope, config.head_dim)
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * scale, jnp.sin(emb) * scale


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x (N,S,heads,hd); cos/sin (N,S,hd). Same arithmetic order as transformers' apply_rotary_pos_emb."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin


# ------------------------------------------------------------------------------------------ layers
def _init(std: float = 0.02):
    return nn.initializers.normal(std)


class RMSNorm(nn.Module):
    """RMSNorm in float32, then `scale * x.astype(input dtype)` as transformers does."""

    eps: float
    axis_name: str = "embed"
    param_dtype: jnp.dtype = jnp.float32
    offset: float = 0.0  # Gemma: the weight w multiplies as (1 + w), and starts at 0

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.zeros if self.offset else nn.initializers.ones
        scale = self.param("scale", nn.with_logical_partitioning(init, (self.axis_name,)),
                           (x.shape[-1],), self.param_dtype)
        return rms_norm(x, scale, self.eps, self.offset)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, offset: float = 0.0) -> jax.Array:
    """RMSNorm over the last axis in float32, then `scale * x.astype(input dtype)` as transformers does;
    with an offset (Gemma), `(x * (offset + scale)).astype(input dtype)` in float32, as Gemma's norm does."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if offset:
        return (y * (offset + scale.astype(jnp.float32))).astype(x.dtype)
    return (scale * y.astype(x.dtype)).astype(x.dtype)


def activation(config: ModelConfig, gate: jax.Array) -> jax.Array:
    """The MLP's gate activation: SiLU (SwiGLU) or tanh-approximated GELU (Gemma's GeGLU)."""
    return nn.gelu(gate, approximate=True) if config.hidden_act == "gelu_tanh" else nn.silu(gate)


def layer_window(config: ModelConfig, sliding) -> jax.Array | None:
    """A layer's window (int32 scalar) from its traced `sliding` flag: the layer kinds share one scanned
    body, so the window is data, not a static shape. None when the model has no windowed layer."""
    if not any(config.sliding_layers):
        return None
    return jnp.where(sliding, config.sliding_window, FULL_WINDOW).astype(jnp.int32)


FULL_WINDOW = 2 ** 30  # the window of a full-attention layer: longer than any sequence


class Dense(nn.Module):
    """y = x . kernel (+ bias) contracting the last `contract` input axes; logical axis names on params.

    With lora_rank > 0 it also declares the adapters `lora_a`, `lora_b` (models/lora.py) and adds
    lora_scale * B(A x) wherever they are in the params (the base tree alone runs without them).
    """

    out_shape: tuple[int, ...]
    axes: tuple[str, ...]  # logical names of kernel axes: contracted input axes, then output axes
    use_bias: bool = False
    contract: int = 1
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    lora_rank: int = 0
    lora_scale: float = 0.0
    lora_dropout: float = 0.0  # on the adapters' input, only when the pass has a "dropout" rng

    @nn.compact
    def __call__(self, x):
        in_shape = x.shape[-self.contract:]
        kernel = self.param("kernel", nn.with_logical_partitioning(_init(), self.axes),
                            (*in_shape, *self.out_shape), self.param_dtype)
        # A plain 2-D matmul (rows x features): XLA:CPU runs the backward of N-D dot_generals ~3x slower
        # than that of the same product on flattened operands. The reshapes are free (row-major).
        # With the tokens of each row split over a `sequence` axis, several rows stay apart: (N, S/C) shards
        # of a flattened N x S dimension are not contiguous, and XLA gathered whole rows for every weight
        # gradient (30M model, 2 rows of 8k over 8 shards: 611 -> 227 MiB of temporaries per device).
        lead = x.shape[:x.ndim - self.contract]
        rows = (-1,) if context.sequence_shards() == 1 or lead[0] == 1 else lead
        k_in, k_out = math.prod(in_shape), math.prod(self.out_shape)
        x2 = x.reshape(*rows, k_in)
        y = jnp.dot(x2.astype(self.dtype), kernel.reshape(k_in, k_out).astype(self.dtype))
        if self.lora_rank and (self.is_initializing() or self.has_variable("params", "lora_a")):
            y = y + self._adapter(x2, in_shape, k_in, k_out)
        y = y.reshape(*lead, *self.out_shape)
        if self.use_bias:
            bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                   self.axes[self.contract:]),
                              self.out_shape, self.param_dtype)
            y = y + bias.astype(self.dtype)
        return y

    def _adapter(self, x, in_shape, k_in, k_out):
        """lora_scale * B(A x) of rows x (..., k_in) -> (..., k_out), unmerged: the gradient is r-sized."""
        r, dt = self.lora_rank, self.dtype
        a = self.param("lora_a", nn.with_logical_partitioning(lora.a_init(self.contract),
                                                              (*self.axes[:self.contract], None)),
                       (*in_shape, r), self.param_dtype)
        b = self.param("lora_b", nn.with_logical_partitioning(nn.initializers.zeros, (None, *self.axes[self.contract:])),
                       (r, *self.out_shape), self.param_dtype)
        if self.lora_dropout and self.has_rng("dropout"):
            x = nn.Dropout(self.lora_dropout, deterministic=False)(x)
        xa = jnp.dot(x.astype(dt), a.reshape(k_in, r).astype(dt))
        return jnp.dot(xa, b.reshape(r, k_out).astype(dt)) * jnp.asarray(self.lora_scale, dt)


class Block(nn.Module):
    """One pre-norm decoder layer; the body of the layer scan. Carry: x; xs: this layer's prefix (k, v) and
    [MoE] replayed experts (N,S,k); ys: its (k, v) when return_kv, and [MoE] the experts it routed to and
    [router_stats] its router's sums (models/moe.py `router_stats`).

    `pair`: the layer of a prompt and its completions in one scan (`Decoder(pair=True)`): the carry is
    (prompt x (B,P,D), completion x (N,T,D)) and `routes`, `cos`, `sin`, `mask`, `positions` are such pairs;
    the prompt stream runs first and its (k, v) are this layer's prefix of the completion stream (whose
    prefix mask is the prompt's mask). ys: (None, the completions' experts, their router sums)."""

    config: ModelConfig
    return_kv: bool = False  # emit this layer's (k, v) as a scan output (prefill builds the prefix)
    router_stats: bool = False  # MoE: emit `moe.router_stats` over the tokens of `mask` as a scan output
    pair: bool = False
    sequence: int = 1  # > 1: the tokens are the zigzag layout split over the `sequence` axis (models/context.py)

    @nn.compact
    def __call__(self, x, prefix_kv, routes, cos, sin, mask, segment_ids, prefix_mask, positions, sliding, sparse):
        # The submodules are made once (one set of parameters); `layer` applies them to one stream:
        # (x, prefix (k, v) or None, ...) -> (x, its (k, v), [MoE] experts, [router sums]).
        c = self.config
        off = c.norm_offset
        dt, pdt = jnp.dtype(c.dtype), jnp.dtype(c.param_dtype)
        norm = lambda name, axis="embed": RMSNorm(c.rms_norm_eps, axis, pdt, off, name=name)
        dense = lambda shape, axes, bias, name, contract=1: Dense(shape, axes, bias, contract, dt, pdt, name=name,
                                                                  **lora.dense_kwargs(c, name))
        input_norm = norm("input_norm")
        q_proj = dense((c.num_heads, c.head_dim), ("embed", "heads", "head_dim"), c.qkv_bias, "q_proj")
        k_proj = dense((c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), c.qkv_bias, "k_proj")
        v_proj = dense((c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), c.qkv_bias, "v_proj")
        qk_norms = (norm("q_norm", "head_dim"), norm("k_norm", "head_dim")) if c.qk_norm else None
        o_proj = dense((c.hidden_size,), ("heads", "head_dim", "embed"), c.o_bias, "o_proj", contract=2)
        attn_out_norm = norm("attn_out_norm") if c.sandwich_norm else None
        post_attn_norm = norm("post_attn_norm")  # the MLP's input norm (Gemma's pre_feedforward_layernorm)
        moe = MoeMlp(c, name="moe") if c.num_experts else None
        mlp_proj = None
        if not c.num_experts or c.mixed_mlp:  # [mixed_mlp: both kinds' parameters in every layer]
            mlp_proj = (dense((c.intermediate_size,), ("embed", "mlp"), c.mlp_bias, "gate_proj"),
                        dense((c.intermediate_size,), ("embed", "mlp"), c.mlp_bias, "up_proj"),
                        dense((c.hidden_size,), ("mlp", "embed"), c.mlp_bias, "down_proj"))
        mlp_out_norm = norm("mlp_out_norm") if c.sandwich_norm else None

        def layer(x, prefix_kv, routes, cos, sin, mask, segment_ids, prefix_mask, positions, sliding, sparse,
                  router_stats):
            if c.local_rope is not None:  # cos/sin: (2,N,S,hd), global then local
                cos, sin = jnp.where(sliding, cos[1], cos[0]), jnp.where(sliding, sin[1], sin[0])
            x = constrain(x, ("batch", "length", "act_embed"))
            h = input_norm(x)
            q, k, v = q_proj(h), k_proj(h), v_proj(h)
            if qk_norms:
                q, k = qk_norms[0](q), qk_norms[1](k)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            q = constrain(q, ("batch", "length", "act_heads", "head_dim"))
            prefix = None if prefix_kv is None else (*prefix_kv, prefix_mask)
            a = attend(c.attention, q, k, v, mask, segment_ids, prefix, block=c.attention_block, scale=c.attn_scale,
                       softcap=c.attn_softcap, window=layer_window(c, sliding), window_size=c.sliding_window,
                       positions=positions, sequence=self.sequence)
            a = o_proj(a)
            x = x + (attn_out_norm(a) if attn_out_norm else a)

            h = post_attn_norm(x)
            experts = stats = None
            if moe is not None:  # [mixed_mlp: the traced `sparse` picks]
                m, experts, *stats = moe(h, routes, mask if router_stats else None, sparse if c.mixed_mlp else None)
                stats = stats[0] if stats else None
            if mlp_proj is not None:
                gate_proj, up_proj, down_proj = mlp_proj
                mid = constrain(activation(c, gate_proj(h)) * up_proj(h), ("batch", "length", "act_mlp"))
                mlp = down_proj(mid)
                m = jnp.where(sparse, m, mlp) if moe is not None else mlp
            x = x + (mlp_out_norm(m) if mlp_out_norm else m)
            x = constrain(x, ("batch", "length", "act_embed"))
            return x, (k, v), experts, stats
        if not self.pair:
            x, kv, experts, stats = layer(x, prefix_kv, routes, cos, sin, mask, segment_ids, prefix_mask, positions,
                                          sliding, sparse, self.router_stats)
            return x, (kv if self.return_kv else None, experts, stats)
        (xp, xc), (rp, rc) = x, routes if routes is not None else (None, None)
        xp, kv, _, _ = layer(xp, None, rp, cos[0], sin[0], mask[0], None, None, positions[0], sliding, sparse, False)
        xc, _, experts, stats = layer(xc, kv, rc, cos[1], sin[1], mask[1], None, mask[0], positions[1], sliding,
                                      sparse, self.router_stats)
        return (xp, xc), (None, experts, stats)


_REMAT_POLICIES = {
    "full": None,  # save nothing, recompute the layer in backward
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep matmul outputs
}


class Decoder(nn.Module):
    """Embedding -> L scanned blocks -> final norm. Returns (hidden (N,S,D), per-layer (k, v) or None
    [, experts (L,N,S,k) when return_routes] [, router sums, each with a leading L axis, over the tokens of
    `mask` when return_router_stats]). `routes` (L,N,S,k): MoE experts to replay (models/moe.py).

    The LM head is applied outside (`lm_head_weight`) so that log-probs can be computed in sequence
    chunks and the value model can skip it; `with_lm_head` only declares its parameters (untied models).

    `pair`: prompts and their completions in one layer scan (models/lm.py `completion_hidden`): `tokens`,
    `positions`, `mask` [and `routes`] are (prompt, completion) pairs, the completions attend to their
    prompt's keys/values of the same layer under the prompts' mask (no `prefix`, `prefix_mask`), and the hidden
    states are a (prompt (B,P,D), completion (N,T,D)) pair. One scan, not a prefill scan then a completion
    scan: its backward accumulates one set of layer gradients, where two scans held two until their sum
    (1.2 GiB of the update's temporaries at Qwen2.5-0.5B's shape).
    """

    config: ModelConfig
    return_kv: bool = False
    with_lm_head: bool = True
    return_routes: bool = False  # MoE: also return the selected experts (L,N,S,k) int32
    return_router_stats: bool = False  # MoE: also return `moe.router_stats` per layer (the router's losses)
    pair: bool = False

    @nn.compact
    def __call__(self, tokens, positions, mask, prefix=None, prefix_mask=None, segment_ids=None, routes=None):
        c = self.config
        pdt = jnp.dtype(c.param_dtype)
        embedding = self.param("embed", nn.with_logical_partitioning(_init(), ("vocab", "embed")),
                               (c.vocab_size, c.hidden_size), pdt)
        if self.with_lm_head and not c.tie_word_embeddings:
            self.param("lm_head", nn.with_logical_partitioning(_init(), ("embed", "vocab")),
                       (c.hidden_size, c.vocab_size), pdt)

        def inputs(tokens, positions):
            x = constrain(embed(c, embedding, tokens), ("batch", "length", "act_embed"))
            cos, sin = rope_cos_sin(c, positions)
            if c.local_rope is not None:
                cos_l, sin_l = rope_cos_sin(c, positions, local=True)
                cos, sin = jnp.stack([cos, cos_l]), jnp.stack([sin, sin_l])
            return x, cos, sin
        if self.pair and (any(a is not None for a in (prefix, prefix_mask, segment_ids)) or self.return_kv
                          or self.return_routes):
            raise ValueError("Decoder(pair=True) takes no prefix, prefix_mask or segment_ids and returns no kv "
                             "or routes: the completions' prefix is their prompts' keys/values")
        shards = context.sequence_shards()
        if shards > 1:  # context parallelism: each row in the zigzag layout, its tokens split over the axis
            if prefix is not None or prefix_mask is not None:
                raise ValueError("a sequence-sharded pass takes no prefix (keys/values of earlier tokens): the "
                                 "sampler runs under the plain rules (sharding.use_mesh(mesh))")
            lengths = jax.tree_util.tree_map(lambda t: t.shape[1], tokens)
            def layout(x, axis=1, value=0):
                x = context.to_layout(x, shards, axis, value)
                return x if x is None or isinstance(x, tuple) or axis != 1 else constrain(x, ("batch", "length"))
            if self.pair:
                tokens, positions, mask = (tuple(map(layout, pair)) for pair in (tokens, positions, mask))
                routes = None if routes is None else tuple(layout(r, 2) for r in routes)
            else:
                tokens, positions, mask, segment_ids = (layout(x) for x in (tokens, positions, mask, segment_ids))
                routes = layout(routes, 2)
        if self.pair:  # each a (prompt, completion) pair
            x, cos, sin = zip(inputs(tokens[0], positions[0]), inputs(tokens[1], positions[1]))
        else:
            x, cos, sin = inputs(tokens, positions)

        block = Block
        if c.remat != "none":
            if c.remat not in _REMAT_POLICIES:
                raise ValueError(f"model remat={c.remat!r}; expected one of none, {', '.join(_REMAT_POLICIES)}")
            block = nn.remat(Block, prevent_cse=False, policy=_REMAT_POLICIES[c.remat])
        layers = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                         in_axes=(0, 0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast,
                                  nn.broadcast, 0, 0),
                         length=c.num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
        sliding = jnp.asarray(c.sliding_layers, bool)  # (L,): the two layer kinds are data of one scan body
        sparse = jnp.asarray(c.moe_layers, bool)  # (L,): so are dense and sparse MLP layers (mixed_mlp)
        stats = self.return_router_stats and c.num_experts > 0
        x, (kv, experts, router) = layers(c, self.return_kv, stats, self.pair, shards, name="layers")(
            x, prefix, routes, cos, sin, mask, segment_ids, prefix_mask, positions, sliding, sparse)
        final_norm = RMSNorm(c.rms_norm_eps, param_dtype=pdt, offset=c.norm_offset, name="final_norm")
        x = tuple(map(final_norm, x)) if self.pair else final_norm(x)
        if shards > 1:  # back to row order: hidden (N,S,D), keys/values (L,N,S,..), experts (L,N,S,k)
            if self.pair:
                x = tuple(context.from_layout(h, shards, t) for h, t in zip(x, lengths))
            else:
                x = context.from_layout(x, shards, lengths)
                kv = jax.tree_util.tree_map(lambda a: context.from_layout(a, shards, lengths, 2), kv)
                experts = context.from_layout(experts, shards, lengths, 2)
        return (x, kv) + ((experts,) if self.return_routes else ()) + ((router,) if self.return_router_stats else ())


def embed(config: ModelConfig, embedding: jax.Array, tokens: jax.Array) -> jax.Array:
    """Token embeddings in the compute dtype [times sqrt(hidden) rounded to it, as Gemma does]."""
    x = jnp.take(embedding, tokens, axis=0).astype(jnp.dtype(config.dtype))
    return x * jnp.asarray(config.hidden_size ** 0.5, x.dtype) if config.embed_scale else x


def lm_head_weight(config: ModelConfig, params) -> jax.Array:
    """(D, V) output projection: the transposed embedding when tied."""
    return params["embed"].T if config.tie_word_embeddings else params["lm_head"]


# ------------------------------------------------------------------------ one-token decode step (sampler)
# The sampler's hot loop is a plain function of one layer's arrays rather than the `Block` module, so
# that a step can run either over per-layer arrays in an unrolled loop or over the stacked layers in a
# scan (models/lm.py `decode_step` picks). Same arithmetic as `Block` (float32 norms and softmax); the
# cache is head-major with keys transposed, k (N,Hkv,hd,T) and v (N,Hkv,T,hd), so that both per-step
# attention products are plain (R,hd).(hd,T) and (R,T).(T,hd) matrix products (see `attend_step`).
