"""tests/test_paged_kernel.py's mesh case, in its own process (4 fake CPU devices from XLA_FLAGS): the TPU
and Triton-form kernels (Pallas' interpreter) in shard_map on data 2 x fsdp 2 (four row shards, a chip
each) and on data 2 x tensor 2 (two row shards, the KV heads split) against the XLA path, one layer's pool
and the stacked pool; with --sampler also the paged sampler with the TPU kernel forced on, on data 2 x
fsdp 2, against the one-device XLA path (25 s more on the 2-core development machine: run by hand, not by
the test). Prints one JSON line."""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import sharding
from jaxrl_llm.models import paged
from jaxrl_llm.models.decode import paged_attention
from jaxrl_llm.sampling import generate, page_shards, pages_needed
from test_paged_kernel import _case
from test_sampling_paged import EOS, PAD, _model


def kernel_diff(mesh, shards: int, layers, kernel: str) -> float:
    q, pool, view, _ = _case(np.random.default_rng(shards), r=shards, s=8 // shards, kvh=2, rq=2, layers=layers,
                             waiting=1)
    layer = None if layers is None else jnp.int32(1)
    call = lambda impl: jax.jit(lambda q, pool, view: paged_attention(impl, q, pool, view, layer, 0.5, 2.0,
                                                                        jnp.int32(9)))(q, pool, view)
    want = call("xla")
    with sharding.use_mesh(mesh):
        got = call(f"{kernel}_interpret")
    return float(np.abs(np.asarray(got) - np.asarray(want)).max())


def sampler(mesh) -> dict:
    config, params = _model()
    rng = np.random.default_rng(0)
    prompts = rng.integers(4, 61, (4, 7)).astype(np.int32)
    mask = np.ones_like(prompts)
    mask[0, :3] = mask[2, :5] = 0
    shards = page_shards(mesh, 4, 8)
    args = dict(max_new_tokens=11, num_samples=3, temperature=1.3, eos_ids=EOS, pad_id=PAD, decode_slots=8,
                kv_page_size=4, kv_pages=pages_needed(7, 11, 4, shards, 4))
    one = generate(config, params, prompts, mask, jax.random.PRNGKey(2), **{**args, "kv_pages": 64})
    paged.attention_impl = lambda *a, **kw: "pallas_interpret"  # as on a TPU (this process only)
    with sharding.use_mesh(mesh):
        rows = sharding.batch_sharding(mesh, 2)
        r = generate(config, params, jax.device_put(prompts, rows), jax.device_put(mask, rows), jax.random.PRNGKey(2),
                     **args)
    return {"shards": shards, "restarts": int(np.asarray(r.page_stats)[0]),
            "tokens_equal": bool((np.asarray(r.tokens) == np.asarray(one.tokens)).all()),
            "mask_equal": bool((np.asarray(r.mask) == np.asarray(one.mask)).all()),
            "logp_max_diff": float(np.abs(np.asarray(r.logprobs) - np.asarray(one.logprobs)).max())}


def main():
    assert jax.device_count() == 4, jax.devices()
    rows, heads = sharding.make_mesh(data=2, fsdp=2), sharding.make_mesh(data=2, tensor=2)
    diffs = {f"{kernel}_{name}_{'stacked' if layers else 'layer'}": kernel_diff(mesh, shards, layers, kernel)
             for kernel in ("pallas", "triton") for name, mesh, shards in (("rows", rows, 4), ("heads", heads, 2))
             for layers in (None, 3)}
    print(json.dumps({"kernel_max_diff": diffs, **(sampler(rows) if "--sampler" in sys.argv else {})}))


if __name__ == "__main__":
    sys.exit(main())
