"""Mistral, Gemma 2 and Gemma 3 text against transformers: float32 logits of left-padded batches longer
than the sliding window (xla and blockwise attention), both config spellings, the export round trip, and
that the soft caps bind. Sampler parity is in test_families_sampling.py."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fixtures_families import FAMILIES, make_family_model
from fixtures_families import exact_float32_matmuls  # noqa: F401  (an autouse fixture)
from fixtures_hf import hf_logits, left_padded_batch
from jaxrl_llm.models import forward, load_hf, save_hf
from jaxrl_llm.models.config import config_from_hf_dict


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    return request.param, path, make_family_model(path, request.param)


@pytest.mark.parametrize("length", [12, 40])
@pytest.mark.parametrize("attention", ["xla", "blockwise"])
def test_logits_match_transformers_beyond_the_window(family, attention, length):
    name, path, model = family
    config, params = load_hf(path, attention=attention, attention_block=8)
    assert config.sliding_window < length and config.head_dim * config.num_heads != config.hidden_size
    assert len(set(config.sliding_layers)) == (1 if name == "mistral" else 2)
    tokens, mask = left_padded_batch(np.random.default_rng(1), [length, length - 7], config.vocab_size)
    ours = np.asarray(forward(config, params, jnp.asarray(tokens), jnp.asarray(mask)))
    ref = hf_logits(model, tokens, mask)
    err = np.max(np.abs(np.where(mask[..., None] > 0, ours - ref, 0)))
    print(f"{name} {attention} T={length}: max |logits - transformers| = {err:.2e}")
    assert err <= 1e-4


def test_soft_caps_and_windows_bind(family):
    """Each feature changes the logits: without it they are far from transformers' (so the test above
    could fail), and the final cap bounds them."""
    name, path, model = family
    config, params = load_hf(path, attention="xla")
    tokens, mask = left_padded_batch(np.random.default_rng(2), [24], config.vocab_size)
    ref = hf_logits(model, tokens, mask)
    off = {"sliding_window": None}
    if name == "gemma2":
        off.update(attn_softcap=None, final_softcap=None)
        assert np.max(np.abs(ref)) < config.final_softcap
    if name == "gemma3_text":
        off.update(local_rope=None)
    for field, value in off.items():
        changed = np.asarray(forward(config.replace(**{field: value}), params, jnp.asarray(tokens), jnp.asarray(mask)))
        assert np.max(np.abs(changed - ref)) > 1e-2, field


def test_transformers_4x_spelling_reads_the_same_config(family):
    name, path, _ = family
    with open(os.path.join(path, "config.json")) as f:
        d = json.load(f)
    new = config_from_hf_dict(d)
    old = {k: v for k, v in d.items() if k not in ("layer_types", "rope_parameters")}
    if name == "gemma3_text":
        rp = d["rope_parameters"]
        old.update(rope_theta=rp["full_attention"]["rope_theta"], sliding_window_pattern=6,
                   rope_scaling={k: v for k, v in rp["full_attention"].items() if k != "rope_theta"},
                   rope_local_base_freq=rp["sliding_attention"]["rope_theta"])
    else:
        old["rope_theta"] = d["rope_parameters"]["rope_theta"]
    assert config_from_hf_dict(old) == new


def test_export_loads_in_transformers_with_our_logits(family, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM
    name, path, _ = family
    config, params = load_hf(path, attention="xla")
    save_hf(str(tmp_path / "out"), config, params)
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    assert type(again).__name__ == {"mistral": "MistralForCausalLM", "gemma2": "Gemma2ForCausalLM",
                                    "gemma3_text": "Gemma3ForCausalLM"}[name]
    tokens, mask = left_padded_batch(np.random.default_rng(3), [20, 14], config.vocab_size)
    ours = np.asarray(forward(config, params, jnp.asarray(tokens), jnp.asarray(mask)))
    err = np.max(np.abs(np.where(mask[..., None] > 0, ours - hf_logits(again, tokens, mask), 0)))
    assert err <= 1e-4
    config2, params2 = load_hf(str(tmp_path / "out"), attention="xla")
    assert config2 == config
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a, b), params, params2)


def test_bad_family_fields_fail_with_one_line():
    base = dict(model_type="gemma2", vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=2,
                num_attention_heads=2)
    with pytest.raises(ValueError, match="hidden activation 'relu' is not supported"):
        config_from_hf_dict({**base, "hidden_activation": "relu"})
    with pytest.raises(ValueError, match="layer_types must list 2 of sliding_attention, full_attention"):
        config_from_hf_dict({**base, "sliding_window": 4, "layer_types": ["sliding_attention"]})
    with pytest.raises(ValueError, match="sliding_window must be a positive integer"):
        config_from_hf_dict({**base, "sliding_window": 0})
