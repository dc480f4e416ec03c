"""The decoder against transformers: logits, export, round trips, chunked log-probs, value head, bad input."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fixtures_hf import VARIANTS, hf_logits, left_padded_batch, make_hf_model, rewrite_config
from jaxrl_llm.models import (CheckpointError, completion_hidden, forward, init_value_params, load_hf,
                              load_hf_value, logprobs_from_hidden, save_hf, token_logprobs, value_forward)
from jaxrl_llm.models.config import ModelConfig, config_from_hf_dict

LENGTHS = [37, 20, 5, 1]  # long rows reach the scaled llama3 frequencies; a 1-token row is all padding


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def hf_model(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    model = make_hf_model(path, request.param)
    return request.param, path, model


def _masked_max(a, b, mask):
    return float(np.abs(np.asarray(a) - np.asarray(b))[np.asarray(mask).astype(bool)].max())


@pytest.mark.parametrize("attention", ["xla", "blockwise"])
def test_logits_match_transformers_left_padded(hf_model, attention):
    variant, path, model = hf_model
    config, params = load_hf(path, attention=attention, attention_block=8)  # blockwise: several tiles
    tokens, mask = left_padded_batch(np.random.default_rng(0), LENGTHS, config.vocab_size)
    ours = forward(config, params, tokens, mask)
    assert ours.dtype == jnp.float32 and ours.shape == (*tokens.shape, config.vocab_size)
    diff = _masked_max(ours, hf_logits(model, tokens, mask), mask)
    print(f"{variant}: max |logit diff| vs transformers = {diff:.2e}")
    assert diff <= 1e-4
    # Each sequence alone (no padding) gives the logits of its row in the padded batch.
    for i, n in enumerate(LENGTHS):
        alone = forward(config, params, tokens[i:i + 1, -n:])
        np.testing.assert_allclose(alone[0], ours[i, -n:], atol=1e-5)


def test_transformers_4x_rope_spelling_loads_same_model(hf_model, tmp_path):
    variant, path, model = hf_model
    config, params = load_hf(path)
    old = str(tmp_path / "old")
    shutil.copytree(path, old)
    with open(os.path.join(path, "config.json")) as f:
        rope = dict(json.load(f)["rope_parameters"])
    theta = rope.pop("rope_theta")
    rope_type = rope.pop("rope_type")
    scaling = None if rope_type == "default" else {"type": rope_type, **rope}  # 4.x used "type"
    rewrite_config(old, rope_parameters=None, rope_theta=theta, rope_scaling=scaling)
    config_old, params_old = load_hf(old)
    assert config_old == config
    tokens, mask = left_padded_batch(np.random.default_rng(1), LENGTHS, config.vocab_size)
    np.testing.assert_array_equal(forward(config_old, params_old, tokens, mask), forward(config, params, tokens, mask))


def test_save_hf_loads_in_transformers_with_identical_logits(hf_model, tmp_path):
    from transformers import AutoModelForCausalLM
    variant, path, _ = hf_model
    config, params = load_hf(path)
    out = str(tmp_path / "export")
    save_hf(out, config, params)
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    from safetensors import safe_open
    with safe_open(os.path.join(out, "model.safetensors"), "numpy") as f:
        assert ("lm_head.weight" in f.keys()) == (not config.tie_word_embeddings)
    tokens, mask = left_padded_batch(np.random.default_rng(2), LENGTHS, config.vocab_size)
    assert _masked_max(hf_logits(model.eval(), tokens, mask), forward(config, params, tokens, mask), mask) <= 1e-4


def test_load_save_load_is_exact_and_sharded_export(hf_model, tmp_path):
    variant, path, _ = hf_model
    config, params = load_hf(path)
    out = str(tmp_path / "sharded")
    save_hf(out, config, params, max_shard_bytes=20_000)  # forces several shards + index
    files = os.listdir(out)
    assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 2
    config2, params2 = load_hf(out)
    assert config2 == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, params2)


def test_sharded_hf_checkpoint_loads(tmp_path):
    path = str(tmp_path / "m")
    model = make_hf_model(path, "qwen2", max_shard_size="20KB")
    assert os.path.isfile(os.path.join(path, "model.safetensors.index.json"))
    config, params = load_hf(path)
    tokens, mask = left_padded_batch(np.random.default_rng(3), [6, 11], config.vocab_size)
    assert _masked_max(forward(config, params, tokens, mask), hf_logits(model, tokens, mask), mask) <= 1e-4


def test_bfloat16_checkpoint_and_compute(tmp_path):
    import torch
    path = str(tmp_path / "bf16")
    model = make_hf_model(path, "llama")
    model.to(torch.bfloat16).save_pretrained(path)
    config, params = load_hf(path, jnp.bfloat16)
    assert params["embed"].dtype == jnp.bfloat16 and config.dtype == "bfloat16"
    tokens, mask = left_padded_batch(np.random.default_rng(4), [9, 4], config.vocab_size)
    logits = forward(config, params, tokens, mask)
    assert logits.dtype == jnp.float32
    ref = hf_logits(model.float(), tokens, mask)  # bf16 weights, float32 compute
    config32, params32 = load_hf(path)
    assert _masked_max(forward(config32, params32, tokens, mask), ref, mask) <= 1e-4
    # bfloat16 compute stays close to float32 compute on the same bf16 weights.
    assert _masked_max(logits, ref, mask) < 0.1 * np.abs(ref).max()


def test_chunked_logprobs_equal_unchunked_with_gradients(tmp_path):
    path = str(tmp_path / "m")
    make_hf_model(path, "qwen3")
    config, params = load_hf(path, logits_chunk=4)  # 13 tokens: 4 chunks, the last one padded
    tokens, mask = left_padded_batch(np.random.default_rng(5), [13, 7], config.vocab_size)
    targets = np.roll(tokens, -1, axis=1)

    def full(params, temperature):
        logits = forward(config, params, tokens, mask) / temperature
        return jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]

    for temperature in (1.0, 0.7):
        chunked = token_logprobs(config, params, tokens, mask, targets, temperature)
        np.testing.assert_allclose(chunked, full(params, temperature), atol=2e-5)
    loss = lambda f: lambda p: jnp.sum(f(p) * mask)
    g1 = jax.grad(loss(lambda p: token_logprobs(config, p, tokens, mask, targets, 0.7)))(params)
    g2 = jax.grad(loss(lambda p: full(p, 0.7)))(params)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4), g1, g2)


def test_entropy_from_hidden_matches_full_softmax(tmp_path):
    path = str(tmp_path / "m")
    make_hf_model(path, "llama")
    config, params = load_hf(path, logits_chunk=3)
    tokens, mask = left_padded_batch(np.random.default_rng(6), [8, 5], config.vocab_size)
    from jaxrl_llm.models import hidden_states
    hidden = hidden_states(config, params, tokens, mask)
    _, ent = logprobs_from_hidden(config, params, hidden, tokens, 0.8, with_entropy=True)
    p = jax.nn.softmax(forward(config, params, tokens, mask) / 0.8)
    np.testing.assert_allclose(ent, -jnp.sum(p * jnp.log(p), -1), atol=1e-5)


def test_prompt_shared_completion_pass_equals_full_sequences(tmp_path):
    path = str(tmp_path / "m")
    make_hf_model(path, "qwen3")
    config, params = load_hf(path)
    rng = np.random.default_rng(8)
    B, G, T = 2, 3, 6
    prompts, pmask = left_padded_batch(rng, [5, 3], config.vocab_size)
    comps = rng.integers(3, config.vocab_size, (B * G, T)).astype(np.int32)
    cmask = (np.arange(T)[None] < np.array([6, 4, 1, 6, 2, 5])[:, None]).astype(np.int32)
    hidden = completion_hidden(config, params, prompts, pmask, comps, cmask)
    shared = logprobs_from_hidden(config, params, hidden, comps)
    full_tokens = np.concatenate([np.repeat(prompts, G, 0), comps], 1)
    full_mask = np.concatenate([np.repeat(pmask, G, 0), cmask], 1)
    P = prompts.shape[1]
    ref = token_logprobs(config, params, full_tokens[:, :-1], full_mask[:, :-1], full_tokens[:, 1:])[:, P - 1:]
    assert _masked_max(shared, ref, cmask) <= 1e-5


def test_prompt_and_completions_share_one_layer_scan_and_one_set_of_layer_gradients():
    """completion_hidden runs each layer on the prompts, then on their completions (`Decoder(pair=True)`).
    Its parameter gradients equal those of the full [prompt; completion] sequences; and XLA's memory
    analysis of the compiled gradient, on a model whose layer weights dominate (wide MLP, few tokens),
    shows at least 0.8x the layer parameters' bytes fewer temporaries than the two-scan form (the prompts'
    scan, then the completions' scan on its stacked keys/values), whose backward held two sets of layer
    gradients until their sum (at Qwen2.5-0.5B's shape: 1.2 GiB of the update's temporaries)."""
    from jaxrl_llm.models import init_params, lm
    from jaxrl_llm.models.transformer import Decoder
    config = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=2048, num_layers=4, num_heads=4,
                         num_kv_heads=2, head_dim=16, max_position_embeddings=64)
    params = init_params(config, jax.random.PRNGKey(0))
    rng = np.random.default_rng(12)
    G, T = 2, 5
    prompts, pmask = left_padded_batch(rng, [6, 3], config.vocab_size)
    comps = rng.integers(3, config.vocab_size, (2 * G, T)).astype(np.int32)
    cmask = (np.arange(T)[None] < np.array([5, 2, 1, 4])[:, None]).astype(np.int32)

    def two_scans(p):
        p_hidden, kv = lm.prefill(config, p, prompts, pmask, with_lm_head=False)
        positions = np.repeat(pmask.sum(-1), G)[:, None] + np.arange(T)[None]
        c_hidden, _ = Decoder(config, with_lm_head=False).apply({"params": p}, comps, positions, cmask.astype(bool),
                                                                 prefix=kv, prefix_mask=pmask.astype(bool))
        return jnp.concatenate([jnp.repeat(p_hidden[:, -1:], G, axis=0), c_hidden[:, :-1]], axis=1)

    def loss(hidden_of):
        return lambda p: jnp.sum(logprobs_from_hidden(config, p, hidden_of(p), comps) * cmask)

    one_scan = jax.jit(jax.grad(loss(lambda p: completion_hidden(config, p, prompts, pmask, comps, cmask))))
    full_tokens = np.concatenate([np.repeat(prompts, G, 0), comps], 1)
    full_mask = np.concatenate([np.repeat(pmask, G, 0), cmask], 1)
    P = prompts.shape[1]
    full = jax.grad(lambda p: jnp.sum(token_logprobs(config, p, full_tokens[:, :-1], full_mask[:, :-1],
                                                     full_tokens[:, 1:])[:, P - 1:] * cmask))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4), one_scan(params),
                           full(params))
    temps = {name: fn.lower(params).compile().memory_analysis().temp_size_in_bytes
             for name, fn in (("one", one_scan), ("two", jax.jit(jax.grad(loss(two_scans)))))}
    layer_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(params["layers"]))
    assert temps["two"] - temps["one"] >= 0.8 * layer_bytes, (temps, layer_bytes)


def test_blockwise_attention_equals_xla_logits_and_gradients(tmp_path):
    """model.attention=blockwise against the dense path on a whole model: logits, log-prob gradients w.r.t.
    the parameters, and the prompt-shared completion pass (prefix merged by log-sum-exp), float32."""
    path = str(tmp_path / "m")
    make_hf_model(path, "qwen2")
    xla, params = load_hf(path, attention="xla")
    blockwise = xla.replace(attention="blockwise", attention_block=4)
    rng = np.random.default_rng(10)
    tokens, mask = left_padded_batch(rng, [13, 6, 1], xla.vocab_size)
    assert _masked_max(forward(blockwise, params, tokens, mask), forward(xla, params, tokens, mask), mask) <= 1e-5
    prompts, pmask = left_padded_batch(rng, [5, 3], xla.vocab_size)
    comps = rng.integers(3, xla.vocab_size, (4, 9)).astype(np.int32)
    cmask = (np.arange(9)[None] < np.array([9, 4, 1, 7])[:, None]).astype(np.int32)

    def loss(config):
        def f(p):
            full = jnp.sum(token_logprobs(config, p, tokens, mask, tokens) * mask)
            hidden = completion_hidden(config, p, prompts, pmask, comps, cmask)
            return full + jnp.sum(logprobs_from_hidden(config, p, hidden, comps) * cmask)
        return jax.value_and_grad(f)

    (v1, g1), (v2, g2) = loss(blockwise)(params), loss(xla)(params)
    assert abs(float(v1) - float(v2)) <= 1e-5 * max(1.0, abs(float(v2)))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g1, g2)


def test_value_model_from_policy_and_from_sequence_classification(tmp_path):
    import torch
    path = str(tmp_path / "policy")
    make_hf_model(path, "llama")
    config, params = load_hf(path)
    vparams = init_value_params(config, params)
    assert "lm_head" not in vparams["backbone"] and vparams["head"]["kernel"].shape == (config.hidden_size,)
    tokens, mask = left_padded_batch(np.random.default_rng(9), [7, 4], config.vocab_size)
    values = value_forward(config, vparams, tokens, mask)
    assert values.shape == tokens.shape and values.dtype == jnp.float32
    np.testing.assert_array_equal(values, 0.0)  # zero head

    rm_path = str(tmp_path / "rm")
    rm = make_hf_model(rm_path, "qwen2", head="seqcls")
    config, vparams = load_hf_value(rm_path)
    values = value_forward(config, vparams, tokens, mask)
    with torch.no_grad():
        positions = torch.as_tensor(np.maximum(np.cumsum(mask, -1) - 1, 0))
        h = rm.model(input_ids=torch.as_tensor(tokens).long(), attention_mask=torch.as_tensor(mask).long(),
                     position_ids=positions).last_hidden_state
        ref = rm.score(h)[..., 0].numpy()
    assert _masked_max(values, ref, mask) <= 1e-4


# ------------------------------------------------------------------------------------------- bad input
@pytest.fixture
def llama_dir(tmp_path):
    path = str(tmp_path / "llama")
    make_hf_model(path, "llama")
    return path


def test_missing_dir_and_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_hf(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="config.json: not found"):
        load_hf(str(tmp_path))


def test_unsupported_model_type_names_supported(llama_dir):
    rewrite_config(llama_dir, model_type="gpt2")
    with pytest.raises(ValueError, match=r"unsupported model_type 'gpt2'; supported: llama, qwen2, qwen3"):
        load_hf(llama_dir)


def test_unsupported_rope_and_sliding_window():
    base = dict(model_type="qwen2", vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                num_attention_heads=2)
    with pytest.raises(ValueError, match="unsupported rope type 'longrope'"):
        config_from_hf_dict({**base, "rope_scaling": {"type": "longrope"}})
    with pytest.raises(ValueError, match="use_sliding_window"):
        config_from_hf_dict({**base, "use_sliding_window": True})
    with pytest.raises(ValueError, match="missing required field"):
        config_from_hf_dict({"model_type": "llama"})


def test_missing_and_misshaped_tensors(llama_dir):
    from safetensors.numpy import load_file, save_file
    file = os.path.join(llama_dir, "model.safetensors")
    tensors = load_file(file)
    bad = dict(tensors)
    del bad["model.layers.1.mlp.up_proj.weight"]
    save_file(bad, file, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"missing tensor model.layers.1.mlp.up_proj.weight \(expected shape \(64, 32\)\)"):
        load_hf(llama_dir)
    bad = dict(tensors)
    bad["model.norm.weight"] = np.ones(31, np.float32)
    save_file(bad, file, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"tensor model.norm.weight has shape \(31,\), expected \(32,\)"):
        load_hf(llama_dir)


def test_truncated_and_corrupt_safetensors(llama_dir):
    file = os.path.join(llama_dir, "model.safetensors")
    data = open(file, "rb").read()
    open(file, "wb").write(data[:-100])
    with pytest.raises(CheckpointError, match="model.safetensors: truncated safetensors file"):
        load_hf(llama_dir)
    open(file, "wb").write(data[:4])
    with pytest.raises(CheckpointError, match="truncated"):
        load_hf(llama_dir)
    open(file, "wb").write(b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"not json at all!" + data[24:])
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        load_hf(llama_dir)
    os.remove(file)
    with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index.json"):
        load_hf(llama_dir)


def test_remat_dots_keeps_only_matmul_outputs_for_backward():
    """`model.remat="dots"` saves each layer's matmul outputs and recomputes the elementwise ones (norms,
    RoPE, SiLU): at SmolLM2-135M's shape that took the update's temporaries from 3.36 to 1.91 GiB
    (docs/benchmarks.md). Here: XLA's own memory analysis of the compiled gradient, on a deep, narrow model
    where the saved activations dominate, against remat "none"; gradients equal."""
    from jaxrl_llm.models import init_params
    policy = "dots"
    base = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=256, num_layers=8, num_heads=4,
                       num_kv_heads=2, head_dim=8, max_position_embeddings=256, remat="none")
    params = init_params(base, jax.random.PRNGKey(0))
    tokens, mask = left_padded_batch(np.random.default_rng(8), [96] * 8, base.vocab_size)
    temps, grads = {}, {}
    for remat in ("none", policy):
        config = base.replace(remat=remat)
        grad = jax.jit(jax.grad(lambda p: jnp.sum(token_logprobs(config, p, tokens, mask, tokens) * mask)))
        temps[remat] = grad.lower(params).compile().memory_analysis().temp_size_in_bytes
        grads[remat] = grad(params)
    assert temps[policy] < 0.7 * temps["none"], temps
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), grads["none"],
                           grads[policy])


def test_logits_chunk_shrinks_for_many_rows_and_a_large_vocabulary(monkeypatch):
    """`logits_chunk_for`: hand-worked at SmolLM2-135M's update (16 rows, V=49,152: 64 MiB / (4 x 16 x 49,152)
    = 21 tokens), floored at LOGITS_MIN_CHUNK, never above `logits_chunk`; and where the cap binds (made
    small here) the chunked log-probs and entropies equal the full softmax's to 1e-6."""
    from jaxrl_llm.models import init_params, lm
    big = ModelConfig(vocab_size=49152, logits_chunk=128)
    assert lm.logits_chunk_for(big, 16) == 21
    assert lm.logits_chunk_for(big, 4096) == lm.LOGITS_MIN_CHUNK
    assert lm.logits_chunk_for(big.replace(logits_chunk=8), 16) == 8
    config = ModelConfig(vocab_size=96, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=8, max_position_embeddings=64, logits_chunk=128)
    monkeypatch.setattr(lm, "LOGITS_MIN_CHUNK", 1)
    monkeypatch.setattr(lm, "LOGITS_BLOCK_BYTES", 4 * 3 * 5 * config.vocab_size)  # 5 tokens of 3 rows
    assert lm.logits_chunk_for(config, 3) == 5
    params = init_params(config, jax.random.PRNGKey(1))
    hidden = jax.random.normal(jax.random.PRNGKey(2), (3, 13, 16))  # 13 tokens: 3 chunks of 5, padded
    targets = jax.random.randint(jax.random.PRNGKey(3), (3, 13), 0, config.vocab_size)
    logp, ent = lm.logprobs_from_hidden(config, params, hidden, targets, 0.7, with_entropy=True)  # not jitted
    full = jax.nn.log_softmax(lm.logits_from_hidden(config, params, hidden) / 0.7)
    np.testing.assert_allclose(logp, jnp.take_along_axis(full, targets[..., None], -1)[..., 0], atol=1e-6)
    np.testing.assert_allclose(ent, -jnp.sum(jnp.exp(full) * full, -1), atol=1e-6)
