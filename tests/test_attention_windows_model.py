"""The cuDNN and splash wrappers inside the model: tiny Gemma 3 (windowed and global layers in one scanned
body, the traced window through `lax.cond`) and Gemma 2 (windows and a binding soft cap), the
prompt-shared completion pass, run with `model.attention` forced to cudnn (JAX's reference implementation
of the same call) or splash (Pallas' interpreter) on CPU, against the dense path: hidden states and gradients."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import completion_hidden, init_params, kernels
from jaxrl_llm.models.config import config_from_hf_dict
from fixtures_families import FAMILIES, TINY


def _batch():
    prompts = jnp.asarray(np.arange(12).reshape(2, 6) % 90 + 3)
    prompt_mask = jnp.asarray(np.arange(6)[None] >= np.array([[2], [0]]))  # prompt 0 left-padded
    completions = jnp.asarray(np.arange(40).reshape(4, 10) * 7 % 90 + 3)
    completion_mask = jnp.asarray(np.arange(10)[None] < np.array([[10], [7], [10], [3]]))
    return prompts, prompt_mask, completions, completion_mask


@pytest.mark.parametrize("family,impl", [("gemma3_text", "cudnn"), ("gemma2", "splash")])
def test_kernel_in_the_scanned_model_equals_the_dense_path(family, impl, monkeypatch):
    if impl == "splash":
        pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")
    cfg = config_from_hf_dict({**TINY, **FAMILIES[family], "model_type": family,
                               "hidden_activation": "gelu_pytorch_tanh"}, attention="xla")
    assert len(set(cfg.sliding_layers)) == 2 and cfg.sliding_window < 10  # both kinds; the window binds
    params = init_params(cfg, jax.random.PRNGKey(0))
    batch = _batch()
    real = np.asarray(batch[3])[..., None]
    w = jax.random.normal(jax.random.PRNGKey(1), (4, 10, cfg.hidden_size)) * real

    def run(config):
        loss = lambda p: (lambda h: (jnp.sum(h.astype(jnp.float32) * w), h))(completion_hidden(config, p, *batch))
        (_, h), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        return h, g

    with jax.default_matmul_precision("float32"):
        ref_h, ref_g = run(cfg)
        monkeypatch.setattr(kernels, "resolve_attention", lambda name, **kw: impl)  # as on its backend
        if impl == "cudnn":
            monkeypatch.setattr(kernels, "cudnn_attend", functools.partial(kernels.cudnn_attend, implementation="xla"))
        else:
            from jaxrl_llm.models import splash
            monkeypatch.setattr(splash, "splash_attend", functools.partial(splash.splash_attend, interpret=True))
        h, g = run(cfg.replace(attention=impl))
    np.testing.assert_allclose(np.where(real, h, 0), np.where(real, ref_h, 0), atol=1e-4)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref_g)):
        np.testing.assert_allclose(a, b, atol=1e-4 * max(1.0, float(np.abs(b).max())))
