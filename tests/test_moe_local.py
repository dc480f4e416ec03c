"""The MoE layer's dispatch stays on each chip (models/moe.py `local_grouped_experts`): on 8 fake devices
(rows over fsdp, float32; rows over fsdp and tokens over sequence, bfloat16), the compiled forward +
backward of one layer holds fewer temporary bytes per device than ONE copy of all the tokens' (token,
expert) pairs -- the partitioner's global sort held several (46.6 MiB here, for a 16 MiB copy). The
bfloat16 case also compiles at all: a shard_map manual over some mesh axes only made XLA:CPU abort. Its values and gradients against one device: tests/test_moe_mesh.py and
tests/test_context.py (MoE on data, fsdp, expert, tensor and sequence meshes)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from xla_flags import with_flags  # noqa: E402

SCRIPT = r"""
import sys
import jax, jax.numpy as jnp
sys.path.insert(0, sys.argv[1])
from harness.grouped_proxy import grouped_products_as_on_accelerators
from jaxrl_llm import sharding
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.moe import MoeMlp
for dt, fsdp, seq in (("float32", 8, 1), ("bfloat16", 4, 2)):  # rows over fsdp; then tokens over sequence too
    c = ModelConfig(model_type="qwen3_moe", vocab_size=100, hidden_size=64, intermediate_size=64, num_layers=1,
                    num_heads=4, num_kv_heads=2, head_dim=16, num_experts=16, num_experts_per_tok=4,
                    moe_intermediate_size=32, max_position_embeddings=4096, dtype=dt, param_dtype=dt)
    mesh, m = sharding.make_mesh(fsdp=fsdp, sequence=seq), MoeMlp(c)
    x = jax.ShapeDtypeStruct((fsdp, 8 * 2048 // fsdp, 64), jnp.dtype(dt))
    with sharding.use_mesh(mesh, sequence=seq > 1), grouped_products_as_on_accelerators():
        params = jax.eval_shape(lambda: m.init(jax.random.PRNGKey(0), jnp.zeros(x.shape, x.dtype)))
        f = jax.jit(lambda p, x: jax.grad(lambda p: m.apply(p, x)[0].astype(jnp.float32).sum())(p))
        print(dt, f.lower(params, x).compile().memory_analysis().temp_size_in_bytes)
"""


def test_the_dispatch_of_a_sharded_batch_stays_local():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=with_flags("--xla_force_host_platform_device_count=8"),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, os.path.join(ROOT, "benchmarks")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    temps = dict(line.split() for line in proc.stdout.strip().splitlines()[-2:])
    for dt in ("float32", "bfloat16"):  # (XLA:CPU computes bfloat16 products in float32: 4 bytes each)
        all_pairs = 8 * 2048 * 4 * 64 * 4  # every token's 4 pairs of 64 float32: one global copy
        assert int(temps[dt]) < all_pairs, (dt, int(temps[dt]) / 2 ** 20, all_pairs / 2 ** 20)
