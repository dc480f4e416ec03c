"""Subprocess side of tests/test_context.py: on 8 fake CPU devices (XLA_FLAGS set by the test before jax
starts), `models/context.sequence_attend` on meshes (data, sequence) = (4, 2), (2, 4), (1, 8) against the
dense attention of the whole rows (kernels.dense_attend: one (S,S) mask, no blocks, no gather), outputs and
the gradients of q, k, v; prints one JSON line {case: largest absolute difference}.

    python tests/context_worker.py
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as Spec

from jaxrl_llm.models.context import pad_to_shards, sharded_attention
from jaxrl_llm.models.kernels import dense_attend, dense_mask

N, S, H, HKV, HD = 4, 13, 4, 2, 8  # S = 13: a multiple of no shard count


def inputs():
    rng = np.random.default_rng(0)
    q, ct = (jnp.asarray(rng.normal(size=(N, S, H, HD)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.normal(size=(N, S, HKV, HD)), jnp.float32) for _ in range(2))
    key_mask = np.ones((N, S), bool)
    key_mask[1, 9:] = False  # a short row
    key_mask[2, 4] = False  # a hole
    segments = np.zeros((N, S), np.int32)
    segments[3, 6:] = 1  # two packed sequences in one row, the second crossing shard boundaries
    return q, k, v, jnp.asarray(key_mask), jnp.asarray(segments), ct


def reference(q, k, v, key_mask, segments, ct, window, softcap):
    def loss(q, k, v):
        out = dense_attend(q, k, v, dense_mask(key_mask, segments, window), softcap=softcap, window=window)
        return jnp.sum(out * ct), out
    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return out, grads


def sharded(mesh, q, k, v, key_mask, segments, ct, window, softcap):
    c = mesh.shape["sequence"]
    attn = sharded_attention(mesh, "sequence", row_axes="data", window=window, softcap=softcap, block_q=4,
                             block_k=4)
    pad = lambda x, value=0: pad_to_shards(x, c, value=value)

    def loss(q, k, v):
        out = attn(pad(q), pad(k), pad(v), pad(key_mask, False), pad(segments))
        out = jax.reshard(out, NamedSharding(mesh, Spec()))[:, :S]  # whole again, then the padding cut
        return jnp.sum(out * ct), out
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def main():
    assert len(jax.devices()) == 8, jax.devices()
    data = inputs()
    worst = {}
    for window, softcap in ((None, None), (5, 30.0)):
        want, want_grads = reference(*data, window, softcap)
        for c in (2, 4, 8):
            mesh = jax.make_mesh((8 // c, c), ("data", "sequence"))
            got, got_grads = sharded(mesh, *data, window, softcap)
            diffs = [float(jnp.max(jnp.abs(a - b))) for a, b in zip((got, *got_grads), (want, *want_grads))]
            worst[f"sequence={c} window={window} softcap={softcap}"] = max(diffs)
    print(json.dumps(worst))


if __name__ == "__main__":
    main()
