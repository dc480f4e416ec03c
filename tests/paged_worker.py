"""tests/test_sampling_paged.py's mesh case, in its own process (4 fake CPU devices from XLA_FLAGS): the paged
sampler on data 2 x fsdp 2 (four row shards, each with its own pool) against the unpaged sampler on one
device. Prints one JSON line."""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import sharding
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.lm import init_params
from jaxrl_llm.sampling import generate, page_shards, pages_needed

B, G, T, S, Z = 4, 3, 11, 8, 4


def main():
    assert jax.device_count() == 4, jax.devices()
    c = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=8, max_position_embeddings=128, dtype="float32", param_dtype="float32", sliding_window=4,
                    layer_types=("sliding_attention", "full_attention"))
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x if "scale" in jax.tree_util.keystr(p) else jnp.asarray(rng.normal(0, 0.3, x.shape), x.dtype),
        init_params(c, jax.random.PRNGKey(0)))
    prompts = rng.integers(4, 61, (B, 7)).astype(np.int32)
    mask = np.ones_like(prompts)
    mask[0, :3] = mask[2, :5] = 0
    args = dict(max_new_tokens=T, num_samples=G, temperature=1.3, eos_ids=(3, 9, 17), pad_id=0, decode_slots=S)
    key = jax.random.PRNGKey(2)
    one = generate(c, params, prompts, mask, key, **args)
    mesh = sharding.make_mesh(data=2, fsdp=2)
    shards = page_shards(mesh, B, S)
    with sharding.use_mesh(mesh):
        rows = sharding.batch_sharding(mesh, 2)
        r = generate(c, params, jax.device_put(prompts, rows), jax.device_put(mask, rows), key, kv_page_size=Z,
                     kv_pages=pages_needed(7, T, B, shards, Z), **args)
    print(json.dumps({"shards": shards, "restarts": int(np.asarray(r.page_stats)[0]),
                      "tokens_equal": bool((np.asarray(r.tokens) == np.asarray(one.tokens)).all()),
                      "mask_equal": bool((np.asarray(r.mask) == np.asarray(one.mask)).all()),
                      "logp_max_diff": float(np.abs(np.asarray(r.logprobs) - np.asarray(one.logprobs)).max())}))


if __name__ == "__main__":
    sys.exit(main())
