"""Subprocess side of tests/test_context_kernels.py, on 8 fake CPU devices (XLA_FLAGS set by the test before
jax starts). Prints one JSON line {case: largest absolute difference}.

`context.sequence_attention` with impl splash (Pallas' interpreter) or cudnn (its call through JAX's 'xla'
reference), zigzag layout in shard_map over `sequence`, on meshes (data, sequence) = (4, 2) [and (2, 4)],
against the dense attention of the whole rows on one device (kernels.dense_attend): outputs at the real
queries (a masked query's output is not specified: splash gives zeros) and the gradients of q, k, v [and
the prefix's keys and values] of a loss over the real queries. Rows of 13 tokens (a multiple of no shard
count: padded): a full row, a left-padded prompt followed by right padding, a hole, two packed segments
the second crossing shard boundaries; with a sliding window (traced, as the decoder passes it, with its
static size) [and a soft cap: splash]; and a prompt prefix (one left-padded) shared by G = 2 rows.

    python tests/context_kernels_worker.py splash|cudnn [all|first|last] [mutate]
    python tests/context_kernels_worker.py cudnn-model|splash-model

The -model kinds: the decoder's trainer passes with the kernel forced (`model_cases`). splash-model (the
Gemma-2-like model: windows, soft caps, LoRA; 77 s of CPU) is run by hand, not by the test.

first / last: the first two or the last two of the cases (`CASES`; splash's interpreter is slow).
`mutate`: each shard's first chunk's offset one chunk off (the check that the cases can fail).
"""
from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import sharding
from jaxrl_llm.models import context, context_kernels
from jaxrl_llm.models.kernels import dense_attend, dense_mask

N, S, H, HKV, HD, WINDOW = 4, 13, 4, 2, 8, 5


def inputs():
    rng = np.random.default_rng(0)
    q, ct = (jnp.asarray(rng.normal(size=(N, S, H, HD)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.normal(size=(N, S, HKV, HD)), jnp.float32) for _ in range(2))
    key_mask = np.ones((N, S), bool)
    key_mask[1, :3] = key_mask[1, 10:] = False  # a left-padded prompt, then right padding
    key_mask[2, 4] = False  # a hole
    segments = np.zeros((N, S), np.int32)
    segments[3, 6:] = 1  # two packed sequences, the second crossing shard boundaries
    pk, pv = (jnp.asarray(rng.normal(size=(2, 7, HKV, HD)), jnp.float32) for _ in range(2))
    pmask = np.ones((2, 7), bool)
    pmask[1, :3] = False  # a left-padded prompt
    positions = jnp.asarray(np.arange(S)[None] + np.array([7, 7, 4, 4])[:, None], jnp.int32)
    return q, k, v, jnp.asarray(key_mask), jnp.asarray(segments), ct, (pk, pv, jnp.asarray(pmask)), positions


def run(attention, q, k, v, key_mask, segments, ct, prefix, positions, with_prefix):
    """(outputs at the real queries, gradients) of a loss over the real queries."""
    def loss(q, k, v, pk, pv):
        out = attention(q, k, v, (pk, pv, prefix[2]) if with_prefix else None)
        return jnp.sum(out * ct * key_mask[:, :, None, None]), out
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))(q, k, v, *prefix[:2])
    return out * key_mask[:, :, None, None], grads


# (sequence shards, window, with the prompt prefix)
CASES = ((2, None, False), (4, WINDOW, False), (2, WINDOW, False), (2, WINDOW, True))


def cases(impl: str, which=CASES):
    q, k, v, key_mask, segments, ct, prefix, positions = data = inputs()
    softcap = 30.0 if impl == "splash" else None  # cuDNN has no soft cap (refused, as on one device)
    worst = {}
    for c, window, with_prefix in which:
        seg = None if with_prefix else segments

        def dense(q, k, v, pre):
            return dense_attend(q, k, v, dense_mask(key_mask, seg, window), pre, softcap=softcap, window=window,
                                positions=positions)

        def sharded(q, k, v, pre):
            lay = lambda x: context.to_layout(x, c)
            pre = None if pre is None else tuple(map(lay, pre))
            out = context.sequence_attention(lay(q), lay(k), lay(v), lay(key_mask), None if seg is None else lay(seg),
                                             pre, shards=c, positions=lay(positions), softcap=softcap,
                                             window=None if window is None else jnp.int32(window),
                                             window_size=window, impl=impl, reference=True)
            return context.from_layout(out, c, S)
        want = run(dense, *data, with_prefix)
        with sharding.use_mesh(sharding.make_mesh(data=8 // c, fsdp=1, sequence=c), sequence=True):
            got = run(sharded, *data, with_prefix)
        pairs = zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))
        worst[f"{impl} sequence={c} window={window} softcap={softcap} prefix={with_prefix}"] = max(
            float(jnp.max(jnp.abs(a - b))) for a, b in pairs)
    return worst


def model_cases(impl: str):
    """The decoder's trainer passes (tests/context_worker.py `passes`: prompt-shared completions, packed rows)
    with `model.attention` = impl forced (as on its backend; reference calls) on data 4 x sequence 2, against
    one device without a mesh (dense attention): log-probs, the loss and every gradient."""
    import functools
    from context_worker import DENSE, excess, model_inputs, passes
    from jaxrl_llm.models import kernels, lm
    config = DENSE.replace(attn_softcap=None, final_softcap=None) if impl == "cudnn" else DENSE
    params = jax.tree_util.tree_map(lambda x: x * 4 if x.ndim > 1 else x, lm.init_params(config, jax.random.PRNGKey(3)))
    inputs = model_inputs(config)
    step = jax.jit(lambda p, i: passes(config.replace(attention="xla"), p, i, (None, None)))
    (want, want_aux), want_grads = step(params, inputs)
    kernels.resolve_attention = lambda name, **kw: impl
    context.sequence_attention = functools.partial(context.sequence_attention, reference=True)
    with sharding.use_mesh(sharding.make_mesh(data=4, fsdp=1, sequence=2), sequence=True):
        (got, got_aux), got_grads = jax.jit(lambda p, i: passes(config.replace(attention=impl), p, i, (None, None)))(
            params, inputs)
    tag = f"model {impl} data4xsequence2"
    real = inputs[3]  # a padded query's output is not specified (a query seeing no key: zeros here)
    return {tag + " logp": excess((got_aux[0] * real, got_aux[1]), (want_aux[0] * real, want_aux[1])),
            tag + " loss": excess(got, want),
            tag + " grads": excess(got_grads, want_grads)}


def main():
    assert len(jax.devices()) == 8, jax.devices()
    jax.config.update("jax_default_matmul_precision", "highest")
    which = {"first": CASES[:2], "last": CASES[2:]}.get(sys.argv[2] if len(sys.argv) > 2 else "", CASES)
    if "mutate" in sys.argv[2:]:  # each shard's first chunk attends as if it stood one chunk later
        by_shard = context_kernels.by_shard
        context_kernels.by_shard = lambda shards, c, axis, run: by_shard(
            shards, c, axis, lambda part, o: run(part, o + c if part == 0 else o))
    if sys.argv[1].endswith("-model"):
        print(json.dumps(model_cases(sys.argv[1][:-len("-model")])))
        return
    print(json.dumps(cases(sys.argv[1], which)))


if __name__ == "__main__":
    main()
