"""Subprocess side of tests/test_moe_mesh.py: a tiny MoE's forward and gradient on meshes of 8 fake CPU
devices (with an `expert` axis) and on one device; writes OUT_DIR/<mesh>.npz for the test to compare.

  python tests/moe_mesh_worker.py OUT_DIR   # XLA_FLAGS=--xla_force_host_platform_device_count=8

Nothing here imports jax at module level: the test imports MESHES alone.
"""
from __future__ import annotations

import os
import sys

# (data, fsdp, expert, tensor); the baseline is (1, 1, 1, 1) on the first device.
MESHES = [(1, 1, 1, 1), (2, 1, 4, 1), (1, 2, 2, 2), (1, 1, 8, 1)]


def main(out: str):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_llm import sharding
    from jaxrl_llm.models.config import ModelConfig
    from jaxrl_llm.models.lm import init_params, param_logical_axes, token_logprobs

    c = ModelConfig(model_type="qwen3_moe", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, num_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=16, norm_topk_prob=True, max_position_embeddings=64)
    rng = np.random.default_rng(0)
    host = jax.tree_util.tree_map(lambda x: rng.normal(0, 0.1, x.shape).astype(np.float32),
                                  init_params(c, jax.random.PRNGKey(0)))
    tokens = rng.integers(1, c.vocab_size, (8, 12)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[:3, :4] = 0  # left padding on some rows

    def loss(params, tokens, mask):
        logp = token_logprobs(c, params, tokens[:, :-1], mask[:, :-1], tokens[:, 1:])
        return jnp.sum(logp * mask[:, 1:]) / jnp.sum(mask[:, 1:]), logp

    for shape in MESHES:
        devices = jax.devices()[:1] if shape == (1, 1, 1, 1) else jax.devices()
        data, fsdp, expert, tensor = shape
        mesh = sharding.make_mesh(data, fsdp, tensor, devices=devices, expert=expert)
        shardings = sharding.logical_to_sharding(param_logical_axes(c), host, mesh)
        params = jax.tree_util.tree_map(jax.device_put, host, shardings)
        batch = sharding.batch_sharding(mesh)
        with sharding.use_mesh(mesh):
            (value, logp), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
                params, jax.device_put(tokens, batch), jax.device_put(mask, batch))
        spec = params["layers"]["moe"]["gate"].sharding.spec
        flat = {jax.tree_util.keystr(p): np.asarray(g) for p, g in jax.tree_util.tree_leaves_with_path(grads)}
        np.savez(os.path.join(out, "x".join(map(str, shape)) + ".npz"), loss=np.asarray(value),
                 logp=np.asarray(logp), gate_spec=str(spec), **flat)


if __name__ == "__main__":
    main(sys.argv[1])
