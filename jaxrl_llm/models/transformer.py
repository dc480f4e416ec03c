"""Flax Linen decoder-only LM reproducing transformers' Llama, Qwen2 and Qwen3 exactly.

Shapes: N rows, S query tokens, K self keys, B prompt rows with N = B*G (G completions per prompt),
P prompt tokens, L layers, D hidden, H heads, Hkv key/value heads, R = H/Hkv, hd head dim, V vocab.

One `Decoder` serves every multi-token pass:
  * plain (training / HF parity): causal attention among the S tokens under the key `mask` (N,S)
    [and `segment_ids` (N,S): a token sees only its own segment's, for packed rows];
  * `prefix`: per-layer keys/values of a shared prompt (L,B,P,Hkv,hd) that every row n = b*G + g also
    attends to -- the prompt is computed once per prompt, not once per completion (sampling and training).
Attention runs by `config.attention` (models/kernels.py: xla, blockwise, cudnn, splash or auto).
Layers are stacked with `nn.scan` (compile time independent of depth) and optionally rematerialized.
The sampler's one-token step is `decode_layer` at the end of this file: the same layer as plain arrays.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import lora
from jaxrl_llm.models.config import ModelConfig, RopeConfig
from jaxrl_llm.models.kernels import attend

_NEG = float(np.finfo(np.float32).min)


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


def rope_cos_sin(config: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """positions (N,S) int -> cos, sin (N,S,hd) float32 (the two halves repeat, rotate-half convention)."""
    inv_freq, scale = rope_inv_freq(config.rope, config.head_dim)
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

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis_name,)),
                           (x.shape[-1],), self.param_dtype)
        return rms_norm(x, scale, self.eps)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis in float32, then `scale * x.astype(input dtype)` as transformers does."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (scale * y.astype(x.dtype)).astype(x.dtype)


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
        lead = x.shape[:x.ndim - self.contract]
        k_in, k_out = math.prod(in_shape), math.prod(self.out_shape)
        y = jnp.dot(x.reshape(-1, k_in).astype(self.dtype), kernel.reshape(k_in, k_out).astype(self.dtype))
        if self.lora_rank and (self.is_initializing() or self.has_variable("params", "lora_a")):
            y = y + self._adapter(x.reshape(-1, k_in), in_shape, k_in, k_out)
        y = y.reshape(*lead, *self.out_shape)
        if self.use_bias:
            bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                   self.axes[self.contract:]),
                              self.out_shape, self.param_dtype)
            y = y + bias.astype(self.dtype)
        return y

    def _adapter(self, x, in_shape, k_in, k_out):
        """lora_scale * B(A x) of rows x (M, k_in) -> (M, k_out), unmerged: the gradient is r-sized."""
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
    """One pre-norm decoder layer; the body of the layer scan. Carry: x; xs: this layer's prefix (k, v)."""

    config: ModelConfig
    return_kv: bool = False  # emit this layer's (k, v) as a scan output (prefill builds the prefix)

    @nn.compact
    def __call__(self, x, prefix_kv, cos, sin, mask, segment_ids, prefix_mask):
        c = self.config
        dt, pdt = jnp.dtype(c.dtype), jnp.dtype(c.param_dtype)
        dense = lambda shape, axes, bias, name, contract=1: Dense(shape, axes, bias, contract, dt, pdt, name=name,
                                                                  **lora.dense_kwargs(c, name))

        h = RMSNorm(c.rms_norm_eps, param_dtype=pdt, name="input_norm")(x)
        q = dense((c.num_heads, c.head_dim), ("embed", "heads", "head_dim"), c.qkv_bias, "q_proj")(h)
        k = dense((c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), c.qkv_bias, "k_proj")(h)
        v = dense((c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), c.qkv_bias, "v_proj")(h)
        if c.qk_norm:
            q = RMSNorm(c.rms_norm_eps, "head_dim", pdt, name="q_norm")(q)
            k = RMSNorm(c.rms_norm_eps, "head_dim", pdt, name="k_norm")(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q = nn.with_logical_constraint(q, ("batch", "length", "act_heads", "head_dim"))
        prefix = None if prefix_kv is None else (*prefix_kv, prefix_mask)
        a = attend(c.attention, q, k, v, mask, segment_ids, prefix, block=c.attention_block)
        x = x + dense((c.hidden_size,), ("heads", "head_dim", "embed"), c.o_bias, "o_proj", contract=2)(a)

        h = RMSNorm(c.rms_norm_eps, param_dtype=pdt, name="post_attn_norm")(x)
        gate = dense((c.intermediate_size,), ("embed", "mlp"), c.mlp_bias, "gate_proj")(h)
        up = dense((c.intermediate_size,), ("embed", "mlp"), c.mlp_bias, "up_proj")(h)
        mid = nn.with_logical_constraint(nn.silu(gate) * up, ("batch", "length", "act_mlp"))
        x = x + dense((c.hidden_size,), ("mlp", "embed"), c.mlp_bias, "down_proj")(mid)
        x = nn.with_logical_constraint(x, ("batch", "length", "act_embed"))
        return x, ((k, v) if self.return_kv else None)


_REMAT_POLICIES = {
    "full": None,  # save nothing, recompute the layer in backward
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep matmul outputs
}


class Decoder(nn.Module):
    """Embedding -> L scanned blocks -> final norm. Returns (hidden (N,S,D), per-layer (k, v) or None).

    The LM head is applied outside (`lm_head_weight`) so that log-probs can be computed in sequence
    chunks and the value model can skip it; `with_lm_head` only declares its parameters (untied models).
    """

    config: ModelConfig
    return_kv: bool = False
    with_lm_head: bool = True

    @nn.compact
    def __call__(self, tokens, positions, mask, prefix=None, prefix_mask=None, segment_ids=None):
        c = self.config
        pdt = jnp.dtype(c.param_dtype)
        embedding = self.param("embed", nn.with_logical_partitioning(_init(), ("vocab", "embed")),
                               (c.vocab_size, c.hidden_size), pdt)
        if self.with_lm_head and not c.tie_word_embeddings:
            self.param("lm_head", nn.with_logical_partitioning(_init(), ("embed", "vocab")),
                       (c.hidden_size, c.vocab_size), pdt)
        x = jnp.take(embedding, tokens, axis=0).astype(jnp.dtype(c.dtype))
        x = nn.with_logical_constraint(x, ("batch", "length", "act_embed"))
        cos, sin = rope_cos_sin(c, positions)

        block = Block
        if c.remat != "none":
            if c.remat not in _REMAT_POLICIES:
                raise ValueError(f"model remat={c.remat!r}; expected one of none, {', '.join(_REMAT_POLICIES)}")
            block = nn.remat(Block, prevent_cse=False, policy=_REMAT_POLICIES[c.remat])
        layers = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                         in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
                         length=c.num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
        x, kv = layers(c, self.return_kv, name="layers")(x, prefix, cos, sin, mask, segment_ids,
                                                          prefix_mask)
        x = RMSNorm(c.rms_norm_eps, param_dtype=pdt, name="final_norm")(x)
        return x, kv


def lm_head_weight(config: ModelConfig, params) -> jax.Array:
    """(D, V) output projection: the transposed embedding when tied."""
    return params["embed"].T if config.tie_word_embeddings else params["lm_head"]


# ------------------------------------------------------------------------ one-token decode step (sampler)
# The sampler's hot loop is a plain function of one layer's arrays rather than the `Block` module, so
# that a step can run either over per-layer arrays in an unrolled loop or over the stacked layers in a
# scan (models/lm.py `decode_step` picks). Same arithmetic as `Block` (float32 norms and softmax); the
# cache is head-major with keys transposed, k (N,Hkv,hd,T) and v (N,Hkv,T,hd), so that both per-step
# attention products are plain (R,hd).(hd,T) and (R,T).(T,hd) matrix products (see `attend_step`).
def decode_weights(config: ModelConfig, layer, *, fuse: bool) -> dict:
    """One layer's params (or the stacked (L, ...) tree) -> the weights `decode_layer` reads.

    fuse=False: views of the params (reshapes, no copy): q, k, v (..., D, heads*hd), o (..., H*hd, D),
    gate, up (..., D, F), down (..., F, D), the norm scales, and the biases / q-k norms the architecture
    has. fuse=True: q|k|v concatenated into one qkv matrix and gate|up into gate_up, so a step runs 4
    matmuls per layer instead of 7 -- at the price of a copy of the weights.
    LoRA adapters in `layer` are merged into that copy when fuse=True, else read as "<t>_lora_a/b" and
    applied unmerged (models/lora.py): a merged copy of the stack would double the weights' memory.
    """
    c = config
    lead = layer["input_norm"]["scale"].shape[:-1]  # () for one layer, (L,) for the stack
    if fuse:
        layer = lora.merge(c, layer)
    flat = lambda kernel: kernel.reshape(*lead, c.hidden_size, -1)
    w = {"input_norm": layer["input_norm"]["scale"], "post_attn_norm": layer["post_attn_norm"]["scale"],
         "q": flat(layer["q_proj"]["kernel"]), "k": flat(layer["k_proj"]["kernel"]),
         "v": flat(layer["v_proj"]["kernel"]),
         "o": layer["o_proj"]["kernel"].reshape(*lead, c.num_heads * c.head_dim, c.hidden_size),
         "gate": layer["gate_proj"]["kernel"], "up": layer["up_proj"]["kernel"], "down": layer["down_proj"]["kernel"]}
    if c.qkv_bias:
        w.update({f"{k}_bias": layer[f"{k}_proj"]["bias"].reshape(*lead, -1) for k in "qkv"})
    if c.o_bias:
        w["o_bias"] = layer["o_proj"]["bias"]
    if c.mlp_bias:
        w.update({f"{k}_bias": layer[f"{k}_proj"]["bias"] for k in ("gate", "up", "down")})
    if c.qk_norm:
        w["q_norm"], w["k_norm"] = layer["q_norm"]["scale"], layer["k_norm"]["scale"]
    w.update(lora.decode_adapters(c, layer, lead))  # none left when fused
    if fuse:
        for fused, parts in (("qkv", "qkv"), ("gate_up", ("gate", "up"))):
            for suffix in ("", "_bias"):
                if f"{parts[0]}{suffix}" in w:
                    w[f"{fused}{suffix}"] = jnp.concatenate([w.pop(f"{p}{suffix}") for p in parts], axis=-1)
    return w


def attend_step(q, cache_k, cache_v, index, prefix_k, prefix_v, prefix_mask):
    """Attention of one new token per row over [its prompt ; cache slots 0..index], softmax in float32.

    q (N,Hkv,R,hd); cache_k (N,Hkv,hd,T) (keys transposed), cache_v (N,Hkv,T,hd), with this step's
    key/value already in slot `index` (a scalar, or (N,) one slot per row); prefix_k (B,Hkv,hd,P), prefix_v (B,Hkv,P,hd) shared by the
    G = N/B rows of each prompt (never copied G times); prefix_mask (B,P) bool. The two score blocks are
    normalized jointly (one max, one sum) without being concatenated. Returns (N,Hkv,R,hd) float32.

    Keys are stored transposed because the products are many tiny batched matrix products (one per row
    and KV head) and XLA:CPU's batched dot repacks a transposed right-hand side for every batch element:
    q.K^T over (T,hd) keys cost 2-3x the (hd,T) layout's product here (docs/benchmarks.md).
    """
    n, kvh, r, hd = q.shape
    b, _, _, p = prefix_k.shape
    g = n // b
    scale = hd ** -0.5
    to_rows = lambda x: x.reshape(b, kvh, g, r, *x.shape[3:]).swapaxes(1, 2).reshape(n, kvh, r, *x.shape[3:])
    to_prompts = lambda x: x.reshape(b, g, kvh, r, *x.shape[3:]).swapaxes(1, 2).reshape(b, kvh, g * r, *x.shape[3:])
    s = jnp.einsum("nkrd,nkdt->nkrt", q, cache_k, preferred_element_type=jnp.float32) * scale
    s = jnp.where(jnp.arange(cache_k.shape[3]) <= jnp.reshape(index, (-1, 1, 1, 1)), s, _NEG)
    sp = jnp.einsum("bkqd,bkdp->bkqp", to_prompts(q), prefix_k, preferred_element_type=jnp.float32) * scale
    sp = jnp.where(prefix_mask[:, None, None, :], sp, _NEG)
    top = jnp.maximum(jnp.max(s, axis=-1), to_rows(jnp.max(sp, axis=-1)))  # (N,Hkv,R)
    e = jnp.exp(s - top[..., None])
    ep = jnp.exp(sp - to_prompts(top)[..., None])
    total = jnp.sum(e, axis=-1) + to_rows(jnp.sum(ep, axis=-1))
    out = jnp.einsum("nkrt,nktd->nkrd", e.astype(cache_v.dtype), cache_v, preferred_element_type=jnp.float32)
    out = out + to_rows(jnp.einsum("bkqp,bkpd->bkqd", ep.astype(prefix_v.dtype), prefix_v,
                                   preferred_element_type=jnp.float32))
    return out / total[..., None]


def decode_layer(config: ModelConfig, w: dict, x, cos, sin, cache, index, prefix, prefix_mask, layer=None):
    """One layer for one new token per row: x (N,D); cos, sin (N,hd); cache (k (N,Hkv,hd,T), v (N,Hkv,T,hd)),
    or the stacked caches with a leading L axis and `layer` the index of this one; index the slot: a scalar,
    or (N,) one per row; prefix (k (B,Hkv,hd,P), v (B,Hkv,P,hd)); prefix_mask (B,P) bool.

    Writes this token's key/value into slot `index` and then attends over the updated cache: reading the
    cache before the write would make XLA copy it to keep the old version alive. Returns (x (N,D), cache).
    """
    c = config
    dt = jnp.dtype(c.dtype)
    n = x.shape[0]
    h, kvh, hd = c.num_heads, c.num_kv_heads, c.head_dim
    dense = lambda y, name: _dense_step(y, w, name, dt)

    y = rms_norm(x, w["input_norm"], c.rms_norm_eps)
    if "qkv" in w:
        q, k, v = jnp.split(dense(y, "qkv"), [h * hd, (h + kvh) * hd], axis=-1)
    else:
        q, k, v = dense(y, "q"), dense(y, "k"), dense(y, "v")
    q, k, v = q.reshape(n, 1, h, hd), k.reshape(n, 1, kvh, hd), v.reshape(n, kvh, 1, hd)
    if c.qk_norm:
        q, k = rms_norm(q, w["q_norm"], c.rms_norm_eps), rms_norm(k, w["k_norm"], c.rms_norm_eps)
    q, k = apply_rope(q, cos[:, None], sin[:, None]), apply_rope(k, cos[:, None], sin[:, None])
    q = nn.with_logical_constraint(q, ("batch", "length", "act_heads", "head_dim"))  # as in `Block`
    ck, cv = _cache_write(cache, k.reshape(n, kvh, hd, 1), v, index, layer)  # keys transposed: (hd, T)
    keys, values = (ck, cv) if layer is None else (jax.lax.dynamic_index_in_dim(a, layer, 0, keepdims=False)
                                                   for a in (ck, cv))
    a = attend_step(q.reshape(n, kvh, h // kvh, hd), keys, values, index, *prefix, prefix_mask)
    x = x + dense(a.astype(dt).reshape(n, h * hd), "o")

    y = rms_norm(x, w["post_attn_norm"], c.rms_norm_eps)
    gate, up = jnp.split(dense(y, "gate_up"), 2, axis=-1) if "gate_up" in w else (dense(y, "gate"), dense(y, "up"))
    mid = nn.with_logical_constraint(nn.silu(gate) * up, ("batch", "act_mlp"))
    x = nn.with_logical_constraint(x + dense(mid, "down"), ("batch", "act_embed"))
    return x, (ck, cv)


def _cache_write(cache, k, v, index, layer):
    """Writes k (N,Hkv,hd,1) and v (N,Hkv,1,hd) into slot `index` of the cache (k (N,Hkv,hd,T), v (N,Hkv,T,hd),
    or stacked with a leading L axis and `layer` the index of this one). A scalar `index` is one slot for
    every row (an in-place slice update); an (N,) index is one slot per row (a scatter: the
    continuous-batching sampler, whose rows are at different steps)."""
    ck, cv = cache
    if jnp.ndim(index) == 0:
        at = () if layer is None else (layer,)
        lead = (lambda a: a) if layer is None else (lambda a: a[None])
        return (jax.lax.dynamic_update_slice(ck, lead(k).astype(ck.dtype), (*at, 0, 0, 0, index)),
                jax.lax.dynamic_update_slice(cv, lead(v).astype(cv.dtype), (*at, 0, 0, index, 0)))
    at = (jnp.arange(k.shape[0]),) if layer is None else (layer, jnp.arange(k.shape[0]))
    return (ck.at[(*at, slice(None), slice(None), index)].set(k[..., 0].astype(ck.dtype)),
            cv.at[(*at, slice(None), index)].set(v[:, :, 0].astype(cv.dtype)))


def _dense_step(x, w, name, dt):
    y = jnp.dot(x.astype(dt), w[name].astype(dt))
    if f"{name}_lora_a" in w:
        y = y + jnp.dot(jnp.dot(x.astype(dt), w[f"{name}_lora_a"].astype(dt)), w[f"{name}_lora_b"].astype(dt))
    bias = w.get(f"{name}_bias")
    return y if bias is None else y + bias.astype(dt)
