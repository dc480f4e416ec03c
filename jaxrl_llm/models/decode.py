"""The one-token decode step of the sampler: the weights it reads, one layer for one new token per row
against the KV cache, and the cache write. The multi-token passes (prefill, score, update) use
`transformer.Decoder`; the two are held equal by tests/test_models.py and tests/test_sampling.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.models import lora, paged
from jaxrl_llm.models.attention import MASKED_SCORE
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.kernels import soft_cap
from jaxrl_llm.models.layout import constrain
from jaxrl_llm.models.moe import moe_mlp, sparse_mlp
from jaxrl_llm.models.transformer import activation, apply_rope, layer_window, rms_norm


def weights_on_left() -> bool:
    """Whether the decode step multiplies with the weights as the matmul's left operand, (out, in) @ x.T,
    rather than x @ (in, out). With the 16-64 rows of a decode step, XLA:CPU's matmul runs 1.2-1.7x faster
    that way (Qwen2.5-0.5B's shape: its MLP 100 -> 70 ms and its LM head 49 -> 29 ms per step at 16 rows);
    the multi-token passes, with hundreds of rows, run no faster (docs/benchmarks_history.md, "The decode's
    matmuls with the weights on the left"). Measured on CPU only; other backends keep x @ W."""
    return jax.default_backend() == "cpu"


def left_matmul(w_t: jax.Array, x: jax.Array, dt, preferred_element_type=None) -> jax.Array:
    """x (N,in) @ w_t.T (out,in) -> (N,out), computed as (w_t @ x.T).T. The barrier keeps XLA from
    rewriting transpose(w_t @ x.T) back into x @ w_t.T (the slow form this exists to avoid); the transpose
    after it copies only the small (out,N) result."""
    y = jnp.dot(w_t.astype(dt), x.astype(dt).T, preferred_element_type=preferred_element_type)
    return jax.lax.optimization_barrier(y).T


def decode_weights(config: ModelConfig, layer, *, fuse: bool) -> dict:
    """One layer's params (or the stacked (L, ...) tree) -> the weights `decode_layer` reads.

    fuse=False: views of the params (reshapes, no copy): q, k, v (..., D, heads*hd), o (..., H*hd, D),
    gate, up (..., D, F), down (..., F, D), the norm scales, and the biases / q-k norms the architecture
    has. fuse=True: q|k|v concatenated into one qkv matrix and gate|up into gate_up, so a step runs 4
    matmuls per layer instead of 7 -- at the price of a copy of the weights. With `weights_on_left()` that
    copy is laid out (out, in) -- qkv_t, o_t, gate_up_t, down_t -- for `left_matmul`, at no further cost.
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
         }
    if c.num_experts:
        w["moe"] = dict(layer["moe"])  # router (..., D, E), gate, up (..., E, D, F), down (..., E, F, D)
    if not c.num_experts or c.mixed_mlp:
        w.update(gate=layer["gate_proj"]["kernel"], up=layer["up_proj"]["kernel"], down=layer["down_proj"]["kernel"])
    if c.qkv_bias:
        w.update({f"{k}_bias": layer[f"{k}_proj"]["bias"].reshape(*lead, -1) for k in "qkv"})
    if c.o_bias:
        w["o_bias"] = layer["o_proj"]["bias"]
    if c.mlp_bias:
        w.update({f"{k}_bias": layer[f"{k}_proj"]["bias"] for k in ("gate", "up", "down")})
    if c.qk_norm:
        w["q_norm"], w["k_norm"] = layer["q_norm"]["scale"], layer["k_norm"]["scale"]
    if c.sandwich_norm:
        w["attn_out_norm"], w["mlp_out_norm"] = layer["attn_out_norm"]["scale"], layer["mlp_out_norm"]["scale"]
    w.update(lora.decode_adapters(c, layer, lead))  # none left when fused
    if fuse:
        for fused, parts in (("qkv", "qkv"), ("gate_up", ("gate", "up"))):
            for suffix in ("", "_bias"):
                if f"{parts[0]}{suffix}" in w:
                    w[f"{fused}{suffix}"] = jnp.concatenate([w.pop(f"{p}{suffix}") for p in parts], axis=-1)
        if weights_on_left():
            for name in ("qkv", "o", "gate_up", "down"):
                if name in w:
                    w[f"{name}_t"] = jnp.swapaxes(w.pop(name), -1, -2)
    return w


def attend_step(q, cache_k, cache_v, index, prefix_k, prefix_v, prefix_mask, scale=None, softcap=None, window=None):
    """Attention of one new token per row over [its prompt ; cache slots 0..index], softmax in float32.

    q (N,Hkv,R,hd); cache_k (N,Hkv,hd,T) (keys transposed), cache_v (N,Hkv,T,hd), with this step's
    key/value already in slot `index` (a scalar, or (N,) one slot per row); prefix_k (B,Hkv,hd,P), prefix_v (B,Hkv,P,hd) shared by the
    G = N/B rows of each prompt (never copied G times); prefix_mask (B,P) bool. The two score blocks are
    normalized jointly (one max, one sum) without being concatenated. scale, softcap as in kernels.attend;
    window None or an int32 scalar: slot j is seen only if index - j < window, prompt key p only if
    P + index - p < window (the token sits at index P + index of [left-padded prompt ; slots]).
    The cache keeps every slot: a windowed layer masks the old ones rather than overwriting them in a
    ring, so that one cache layout serves both layer kinds of one scanned step (docs/models.md).
    Returns (N,Hkv,R,hd) float32.

    Keys are stored transposed because the products are many tiny batched matrix products (one per row
    and KV head) and XLA:CPU's batched dot repacks a transposed right-hand side for every batch element:
    q.K^T over (T,hd) keys cost 2-3x the (hd,T) layout's product here (docs/benchmarks_history.md, "The decode
    step's attention and RoPE").
    """
    n, kvh, r, hd = q.shape
    b, _, _, p = prefix_k.shape
    g = n // b
    scale = hd ** -0.5 if scale is None else scale
    to_rows = lambda x: x.reshape(b, kvh, g, r, *x.shape[3:]).swapaxes(1, 2).reshape(n, kvh, r, *x.shape[3:])
    to_prompts = lambda x: x.reshape(b, g, kvh, r, *x.shape[3:]).swapaxes(1, 2).reshape(b, kvh, g * r, *x.shape[3:])
    s = soft_cap(jnp.einsum("nkrd,nkdt->nkrt", q, cache_k, preferred_element_type=jnp.float32) * scale, softcap)
    at = jnp.reshape(index, (-1, 1, 1, 1))
    seen = jnp.arange(cache_k.shape[3]) <= at
    if window is not None:
        seen = seen & (at - jnp.arange(cache_k.shape[3]) < window)
    s = jnp.where(seen, s, MASKED_SCORE)
    sp = soft_cap(jnp.einsum("bkqd,bkdp->bkqp", to_prompts(q), prefix_k, preferred_element_type=jnp.float32) * scale,
                  softcap)
    p_seen = prefix_mask[:, None, None, :]
    if window is not None:  # (N,1,1,P) per row, then grouped per prompt as the scores are
        p_rows = jnp.broadcast_to(p + at - jnp.arange(p) < window, (n, 1, 1, p))
        p_seen = p_seen & to_prompts(jnp.broadcast_to(p_rows, (n, kvh, r, p)))
    sp = jnp.where(p_seen, sp, MASKED_SCORE)
    top = jnp.maximum(jnp.max(s, axis=-1), to_rows(jnp.max(sp, axis=-1)))  # (N,Hkv,R)
    e = jnp.exp(s - top[..., None])
    ep = jnp.exp(sp - to_prompts(top)[..., None])
    total = jnp.sum(e, axis=-1) + to_rows(jnp.sum(ep, axis=-1))
    out = jnp.einsum("nkrt,nktd->nkrd", e.astype(cache_v.dtype), cache_v, preferred_element_type=jnp.float32)
    out = out + to_rows(jnp.einsum("bkqp,bkpd->bkqd", ep.astype(prefix_v.dtype), prefix_v,
                                   preferred_element_type=jnp.float32))
    return out / total[..., None]


def decode_layer(config: ModelConfig, w: dict, x, cos, sin, cache, index, prefix, prefix_mask, layer=None,
                 sliding=False, return_routes: bool = False, sparse=True):
    """One layer for one new token per row: x (N,D); cos, sin (N,hd); cache (k (N,Hkv,hd,T), v (N,Hkv,T,hd)),
    or the stacked caches with a leading L axis and `layer` the index of this one; index the slot: a scalar,
    or (N,) one per row -- or a paged cache (`models.paged.Pool`, N slots) with `index` its `paged.View` and
    no prefix (the prompts are in the pages); prefix (k (B,Hkv,hd,P), v (B,Hkv,P,hd)); prefix_mask (B,P) bool.

    Writes this token's key/value into slot `index` and then attends over the updated cache: reading the
    cache before the write would make XLA copy it to keep the old version alive. sliding: whether this
    layer is windowed (a bool, or traced in the scanned step); cos, sin (2,N,hd) with `config.local_rope`
    (global, local). Returns (x (N,D), cache) [, the experts (N,k) this token was routed to: MoE with
    return_routes]. sparse: whether this layer's MLP is the experts, in a model mixing both kinds
    (`ModelConfig.mixed_mlp`; a bool, or traced in the scanned step, as `sliding`).
    """
    c = config
    off = c.norm_offset
    if c.local_rope is not None:
        cos, sin = jnp.where(sliding, cos[1], cos[0]), jnp.where(sliding, sin[1], sin[0])
    dt = jnp.dtype(c.dtype)
    n = x.shape[0]
    h, kvh, hd = c.num_heads, c.num_kv_heads, c.head_dim
    dense = lambda y, name: _dense_step(y, w, name, dt)

    y = rms_norm(x, w["input_norm"], c.rms_norm_eps, off)
    if _has(w, "qkv"):
        q, k, v = jnp.split(dense(y, "qkv"), [h * hd, (h + kvh) * hd], axis=-1)
    else:
        q, k, v = dense(y, "q"), dense(y, "k"), dense(y, "v")
    q, k, v = q.reshape(n, 1, h, hd), k.reshape(n, 1, kvh, hd), v.reshape(n, kvh, 1, hd)
    if c.qk_norm:
        q, k = rms_norm(q, w["q_norm"], c.rms_norm_eps, off), rms_norm(k, w["k_norm"], c.rms_norm_eps, off)
    q, k = apply_rope(q, cos[:, None], sin[:, None]), apply_rope(k, cos[:, None], sin[:, None])
    q = constrain(q, ("batch", "length", "act_heads", "head_dim"))  # as in `Block`
    if isinstance(cache, paged.Pool):  # the paged cache (sampling/paged.py): `index` is its paged.View
        cache = paged.write(cache, k.reshape(n, kvh, hd), v.reshape(n, kvh, hd), index, layer)
        impl = paged.attention_impl(c.attention, jax.default_backend(), hd, cache.k.shape[-1])
        a = paged_attention(impl, q.reshape(n, kvh, h // kvh, hd), cache, index, layer, c.attn_scale,
                            c.attn_softcap, layer_window(c, sliding))
    else:
        ck, cv = _cache_write(cache, k.reshape(n, kvh, hd, 1), v, index, layer)  # keys transposed: (hd, T)
        cache = (ck, cv)
        keys, values = (ck, cv) if layer is None else (jax.lax.dynamic_index_in_dim(a, layer, 0, keepdims=False)
                                                       for a in (ck, cv))
        a = attend_step(q.reshape(n, kvh, h // kvh, hd), keys, values, index, *prefix, prefix_mask, c.attn_scale,
                        c.attn_softcap, layer_window(c, sliding))
    a = dense(a.astype(dt).reshape(n, h * hd), "o")
    x = x + (rms_norm(a, w["attn_out_norm"], c.rms_norm_eps, off) if c.sandwich_norm else a)

    y = rms_norm(x, w["post_attn_norm"], c.rms_norm_eps, off)
    experts = None
    if c.num_experts:
        m, experts, _ = sparse_mlp(c, w["moe"], y, sparse) if c.mixed_mlp else moe_mlp(c, w["moe"], y)
    if not c.num_experts or (c.mixed_mlp and sparse is not True):  # a static True: the experts alone
        gate, up = (jnp.split(dense(y, "gate_up"), 2, axis=-1) if _has(w, "gate_up")
                    else (dense(y, "gate"), dense(y, "up")))
        mid = constrain(activation(c, gate) * up, ("batch", "act_mlp"))
        mlp = dense(mid, "down")
        m = mlp if not c.num_experts or sparse is False else jnp.where(sparse, m, mlp)
    x = constrain(x + (rms_norm(m, w["mlp_out_norm"], c.rms_norm_eps, off) if c.sandwich_norm
                                        else m), ("batch", "act_embed"))
    return (x, cache, experts) if return_routes and c.num_experts else (x, cache)


def paged_attention(impl: str, q, pool: paged.Pool, view: paged.View, layer=None, scale=None, softcap=None,
                    window=None):
    """`paged.attend` by the implementation `impl`, one of paged.PAGED_IMPLS (`paged.attention_impl` chooses):
    the same arguments and result."""
    if impl == "xla":
        return paged.attend(q, pool, view, layer, scale, softcap, window)
    if impl not in paged.PAGED_IMPLS:
        raise ValueError(f"paged attention {impl!r}: expected one of {', '.join(paged.PAGED_IMPLS)}")
    from jaxrl_llm.models.paged_kernel import mesh_paged_attend  # Pallas kernels: imported where they run
    kernel = None
    if impl.startswith("triton"):
        from jaxrl_llm.models.paged_kernel_gpu import triton_paged_attend
        kernel = triton_paged_attend
    return mesh_paged_attend(q, pool, view, layer, scale, softcap, window, kernel=kernel,
                             interpret=impl.endswith("_interpret"))


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


def _has(w, name) -> bool:
    """Whether `decode_weights` gave the weight `name`, in either layout ((in,out), or (out,in) as name_t)."""
    return name in w or f"{name}_t" in w


def _dense_step(x, w, name, dt):
    """x (N,in) -> (N,out) through w[name] (in,out) or, laid out (out,in), w[name + "_t"] (`decode_weights`)."""
    y = left_matmul(w[f"{name}_t"], x, dt) if f"{name}_t" in w else jnp.dot(x.astype(dt), w[name].astype(dt))
    if f"{name}_lora_a" in w:
        y = y + jnp.dot(jnp.dot(x.astype(dt), w[f"{name}_lora_a"].astype(dt)), w[f"{name}_lora_b"].astype(dt))
    bias = w.get(f"{name}_bias")
    return y if bias is None else y + bias.astype(dt)
