"""float32 compute means float32 products on every backend: every matmul the model traces -- forward,
backward, sampler (prefill and decode) and value head -- asks for 'highest' precision, which XLA's default
does not give on GPU (TF32) or TPU (bfloat16 passes). A CPU computes float32 products in float32 either
way, so the check is on the traced programs, where a missing precision would show on any machine."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import ModelConfig, init_params, init_value_params, token_logprobs, value_forward
from jaxrl_llm.sampling import generate

CONFIG = ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=4, qkv_bias=True, max_position_embeddings=32)


def dot_precisions(jaxpr) -> list:
    """The `precision` of every dot_general in a jaxpr and all its sub-jaxprs (jit, scan, while, remat...)."""
    found = []

    def walk(jx):
        for eqn in jx.eqns:
            if eqn.primitive.name == "dot_general":
                found.append(eqn.params["precision"])
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        walk(sub)
    walk(jaxpr.jaxpr)
    return found


def traced_programs(config):
    params = init_params(config, jax.random.PRNGKey(0))
    tokens = jnp.ones((2, 6), jnp.int32)
    mask = jnp.ones((2, 6), jnp.int32)

    def loss(p):
        return token_logprobs(config, p, tokens, mask, tokens, 1.0).sum()

    def sample(p):
        return generate(config, p, tokens, mask, jax.random.PRNGKey(1), max_new_tokens=3, num_samples=2,
                        eos_ids=[1], pad_id=0).logprobs

    value_params = init_value_params(config, params)
    return {"logprobs + gradient": jax.make_jaxpr(jax.value_and_grad(loss))(params),
            "sampler": jax.make_jaxpr(sample)(params),
            "value": jax.make_jaxpr(lambda v: value_forward(config, v, tokens, mask))(value_params)}


@pytest.mark.parametrize("attention", ["xla", "blockwise"])
def test_float32_compute_traces_every_matmul_at_highest_precision(attention):
    """Blockwise attention's backward is a custom VJP, traced when the gradient is taken: it too."""
    highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    for name, jaxpr in traced_programs(CONFIG.replace(attention=attention, attention_block=2)).items():
        precisions = dot_precisions(jaxpr)
        assert len(precisions) >= 4, (name, precisions)  # the walk reached the model's matmuls
        assert all(p == highest for p in precisions), (name, precisions)


def test_bfloat16_compute_keeps_the_callers_precision():
    config = CONFIG.replace(dtype="bfloat16")
    jaxpr = traced_programs(config)["logprobs + gradient"]
    assert all(p is None for p in dot_precisions(jaxpr))
    with jax.default_matmul_precision("tensorfloat32"):  # a caller's own choice still applies
        inner = jax.make_jaxpr(lambda p: token_logprobs(config, p, jnp.ones((1, 4), jnp.int32),
                                                        jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32), 1.0))
        precisions = dot_precisions(inner(init_params(config, jax.random.PRNGKey(0))))
    assert precisions and all(p is not None and p != (jax.lax.Precision.HIGHEST,) * 2 for p in precisions)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_precision_changes_no_float32_result_on_cpu(dtype):
    """The decorator only adds a precision request: results on CPU are bit-identical to an explicit
    global 'highest' setting (the mutation check: removing it would change the traced programs above)."""
    config = CONFIG.replace(dtype=dtype)
    params = init_params(config, jax.random.PRNGKey(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 7)), jnp.int32)
    mask = jnp.ones_like(tokens)
    a = token_logprobs(config, params, tokens, mask, tokens, 1.0)
    with jax.default_matmul_precision("highest"):
        b = token_logprobs(config, params, tokens, mask, tokens, 1.0)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
