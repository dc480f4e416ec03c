"""The mixture-of-experts MLP (Qwen3-MoE, Mixtral): a top-k softmax router and dropless SwiGLU experts.

Shapes: M tokens (rows x positions, flattened), D hidden, E experts, k experts per token, F expert width.
Parameters of one layer: router (D,E), gate and up (E,D,F), down (E,F,D); the expert axis carries the
logical name "expert" (sharding.py maps it to the `expert` mesh axis).

Dropless: every (token, selected expert) pair is computed -- no capacity, no dropped token. The M*k pairs
are sorted by expert and each expert's contiguous run is multiplied by that expert's matrices with
`jax.lax.ragged_dot` (one grouped product per projection), so the work is that of the k active experts,
never a dense loop over all E. Routing follows transformers: softmax of the router logits in float32, the
top k probabilities [renormalized to sum to 1: `norm_topk_prob`, always for Mixtral], cast to the compute
dtype, and the experts' outputs summed with these weights.

Routing replay: given the experts a token was routed to elsewhere (the sampler), `replay` (M,k) fixes the
selection; the weights are still the softmax probabilities of those experts, so the router gets gradient.
A token without a recorded route (ids < 0, `NO_ROUTE`: the samplers never feed a row's last drawn token)
is routed afresh, never replayed as expert 0.

On a mesh the sort, the grouped products and the sum back run per token shard (`local_grouped_experts`, in
shard_map over the mesh axes the tokens are split over): each chip sorts and computes its own tokens' pairs.
Left to the SPMD partitioner, the sort over all M tokens made every chip hold every token's pairs (8 fake
devices: 46.6 MiB of temporaries per device for 4 MiB of tokens; tests/test_moe_local.py).
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as Spec

from jaxrl_llm.models.config import ModelConfig

NO_ROUTE = -1  # a recorded route's id for a token the sampler never fed: `route` routes it afresh


def unrecorded_routes(config: ModelConfig, rows: int, tokens: int) -> jax.Array:
    """(L, rows, tokens, k) int32 `NO_ROUTE`: a sampler's route record before any token is fed (a row's
    last drawn token never is, and the trainer's replay then routes it afresh)."""
    return jnp.full((config.num_layers, rows, tokens, config.num_experts_per_tok), NO_ROUTE, jnp.int32)


def route(config: ModelConfig, logits: jax.Array, replay: jax.Array | None = None):
    """logits (M,E) -> (weights (M,k), experts (M,k) int32, probs (M,E)), probabilities in float32 (float64
    under a float64 compute dtype, for the tests' references).

    With `replay` (M,k) int the experts are those, not the top k of this pass's probabilities, except on
    a token whose replayed ids are not all recorded (any < 0, `NO_ROUTE`): that one is routed afresh.
    """
    probs = jax.nn.softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1)
    weights, experts = jax.lax.top_k(probs, config.num_experts_per_tok)
    if replay is not None:
        recorded = jnp.all(replay >= 0, axis=-1, keepdims=True)  # (M,1)
        experts = jnp.where(recorded, replay.astype(jnp.int32), experts)
        weights = jnp.take_along_axis(probs, experts, axis=-1)
    if config.norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts.astype(jnp.int32), probs


def grouped_experts(x: jax.Array, experts: jax.Array, weights: jax.Array, gate: jax.Array, up: jax.Array,
                    down: jax.Array, dtype) -> jax.Array:
    """Dropless SwiGLU experts: x (M,D), experts/weights (M,k), gate/up (E,D,F), down (E,F,D) -> (M,D).

    The M*k (token, expert) pairs are sorted by expert (stable: a token's pairs keep their order) and
    each expert's run goes through one `ragged_dot` per projection; the weighted outputs are summed back
    onto their tokens with a scatter-add.
    """
    m, k = experts.shape
    num_experts = gate.shape[0]
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # (M*k,) pair index, grouped by expert
    token = order // k
    sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)  # (E,) sums to M*k
    xs = jnp.take(x, token, axis=0).astype(dtype)
    g = jax.lax.ragged_dot(xs, gate.astype(dtype), sizes)
    u = jax.lax.ragged_dot(xs, up.astype(dtype), sizes)
    y = jax.lax.ragged_dot(nn.silu(g) * u, down.astype(dtype), sizes)  # (M*k, D)
    y = y * jnp.take(weights.reshape(-1), order).astype(dtype)[:, None]
    return jnp.zeros((m, x.shape[-1]), dtype).at[token].add(y)


def token_axes(tokens: int) -> tuple[str, ...]:
    """The mesh axes (size > 1) the M flattened tokens are split over under the active logical rules: those
    of `batch`, then of `length` (the rows are the major dimension of M); () outside a mesh or when they do
    not divide M."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return ()
    rules = dict(nn.get_logical_axis_rules())
    axes = []
    for name in ("batch", "length"):
        named = rules.get(name)
        named = () if named is None else ((named,) if isinstance(named, str) else tuple(named))
        axes += [a for a in named if dict(mesh.shape).get(a, 1) > 1]
    return tuple(axes) if axes and tokens % math.prod(mesh.shape[a] for a in axes) == 0 else ()


def local_grouped_experts(x, experts, weights, gate, up, down, dtype) -> jax.Array:
    """`grouped_experts` with each token shard's pairs sorted and computed on its own chip: shard_map over
    `token_axes` (manual), the expert weights whole along those axes (gathered, as FSDP gathers a layer's
    weights) and left to the partitioner along the others (the `expert` axis, `tensor`). On XLA:CPU in bfloat16
    with such other axes, the global dispatch (see below)."""
    axes = token_axes(x.shape[0])
    mesh = jax.sharding.get_abstract_mesh()
    others = [a for a in mesh.axis_names if a not in axes and mesh.shape[a] > 1]  # e.g. expert, tensor
    # XLA:CPU aborts compiling the backward of a shard_map manual over some axes only in bfloat16 ("Invalid
    # binary instruction opcode copy", jax 0.10.2; tests/test_moe_local.py): there, the global dispatch.
    partial_bf16_cpu = others and jax.default_backend() == "cpu" and jnp.dtype(dtype) != jnp.float32
    if not axes or partial_bf16_cpu:
        return grouped_experts(x, experts, weights, gate, up, down, dtype)
    tok, whole = Spec(axes), Spec()
    manual = {"axis_names": frozenset(axes)} if others else {}  # no other axis: manual over all (size-1 ones too)
    return jax.shard_map(lambda *a: grouped_experts(*a, dtype), in_specs=(tok, tok, tok, whole, whole, whole),
                         out_specs=tok, check_vma=False, **manual)(x, experts, weights, gate, up, down)


def moe_mlp(config: ModelConfig, w: dict, x: jax.Array, replay: jax.Array | None = None,
            return_logits: bool = False):
    """x (M,D) through one layer's experts `w` (router, gate, up, down) -> (y (M,D), experts (M,k), probs (M,E)
    [, router logits (M,E) with return_logits])."""
    dt = jnp.dtype(config.dtype)
    logits = jnp.dot(x.astype(dt), w["router"].astype(dt))
    weights, experts, probs = route(config, logits, replay)
    y = local_grouped_experts(x, experts, weights.astype(dt), w["gate"], w["up"], w["down"], dt)
    return (y, experts, probs, logits) if return_logits else (y, experts, probs)


def sparse_mlp(config: ModelConfig, w: dict, x: jax.Array, sparse, replay: jax.Array | None = None,
               return_logits: bool = False):
    """`moe_mlp` on a layer of a model that mixes dense and sparse MLP layers (Qwen3-MoE's
    `mlp_only_layers`, `decoder_sparse_step`): `sparse` is the layer's kind, a Python bool (the unrolled
    decode step: only that kind is traced) or a traced bool (the layer scan: `lax.cond`, so a dense layer
    does not run the experts). A dense layer gives zeros (expert ids 0), which its caller replaces by
    the dense MLP's output."""
    run = lambda: moe_mlp(config, w, x, replay, return_logits)
    zeros = lambda: jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(run))
    if isinstance(sparse, bool):
        return run() if sparse else zeros()
    return jax.lax.cond(sparse, run, zeros)


def router_stats(logits: jax.Array, probs: jax.Array, experts: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """One layer's sums over its real tokens, from which rl/router.py builds the router's losses and metrics.

    logits, probs (M,E); experts (M,k) the experts the tokens were computed by (replayed ones under
    routing replay); mask (M,) the tokens that count (0 for padding). Returns float32 sums:
    `probs` (E,) of the router probabilities, `counts` (E,) of the (token, expert) pairs the grouped
    product computed (`grouped_experts` computes one per in-range expert id, so an id outside [0, E)
    would be a dropped pair), `z` () of logsumexp(logits)^2, `tokens` () of the mask. Gradients flow
    through `probs` and `z`; `counts` are integers.
    """
    num_experts = probs.shape[-1]
    w = mask.astype(jnp.float32)
    counts = jnp.zeros((num_experts,), jnp.float32).at[experts.reshape(-1)].add(
        jnp.repeat(w, experts.shape[-1]), mode="drop")  # out-of-range ids are dropped, as in the product
    lse = jax.nn.logsumexp(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1)
    return {"probs": jnp.sum(probs * w[:, None], axis=0), "counts": jax.lax.stop_gradient(counts),
            "z": jnp.sum(w * lse * lse), "tokens": jnp.sum(w)}


class MoeMlp(nn.Module):
    """Declares one layer's router and experts and applies `moe_mlp` to x (N,S,D) -> (N,S,D), experts (N,S,k)
    [, `router_stats` over the tokens of `mask` (N,S) when a mask is given]. `sparse`: the layer's kind, a
    traced bool, in a model mixing dense and sparse layers (`sparse_mlp`); None when every layer is sparse."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x, replay=None, mask=None, sparse=None):
        c = self.config
        pdt = jnp.dtype(c.param_dtype)
        d, e, f = c.hidden_size, c.num_experts, c.moe_intermediate_size
        init = nn.initializers.normal(0.02)
        param = lambda name, shape, axes: self.param(name, nn.with_logical_partitioning(init, axes), shape, pdt)
        w = {"router": param("router", (d, e), ("embed", None)),
             "gate": param("gate", (e, d, f), ("expert", "embed", "mlp")),
             "up": param("up", (e, d, f), ("expert", "embed", "mlp")),
             "down": param("down", (e, f, d), ("expert", "mlp", "embed"))}
        n, s = x.shape[:2]
        flat_replay = None if replay is None else replay.reshape(n * s, -1)
        if sparse is None:  # every layer sparse
            y, experts, probs, logits = moe_mlp(c, w, x.reshape(n * s, d), flat_replay, return_logits=True)
        else:  # this layer's kind (a traced flag): a dense layer's experts are not run, nor counted
            y, experts, probs, logits = sparse_mlp(c, w, x.reshape(n * s, d), sparse, flat_replay, return_logits=True)
            mask = None if mask is None else mask * sparse
        out = y.reshape(n, s, d), experts.reshape(n, s, -1)
        if mask is None:
            return out
        return (*out, router_stats(logits, probs, experts, mask.reshape(n * s)))
