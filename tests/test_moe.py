"""Mixture-of-experts models (Qwen3-MoE, Mixtral) against transformers, and the dropless grouped experts
against a float64 loop over experts."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fixtures_hf import hf_logits, left_padded_batch, rewrite_config
from fixtures_moe import MOE_VARIANTS, make_moe_model
from jaxrl_llm.models import forward, load_hf, save_hf
from jaxrl_llm.models.config import ModelConfig, config_from_hf_dict
from jaxrl_llm.models.moe import grouped_experts, moe_mlp, route

LENGTHS = [23, 9, 1]


@pytest.fixture(scope="module", params=sorted(MOE_VARIANTS))
def moe_model(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    return request.param, path, make_moe_model(path, request.param)


def _masked_max(a, b, mask):
    return float(np.abs(np.asarray(a) - np.asarray(b))[np.asarray(mask).astype(bool)].max())


def test_moe_logits_match_transformers_and_export_round_trips(moe_model, tmp_path):
    from transformers import AutoModelForCausalLM
    variant, path, model = moe_model
    config, params = load_hf(path)
    assert config.num_experts == model.config.num_local_experts and config.num_experts_per_tok > 0
    tokens, mask = left_padded_batch(np.random.default_rng(0), LENGTHS, config.vocab_size)
    ours = forward(config, params, tokens, mask)
    diff = _masked_max(ours, hf_logits(model, tokens, mask), mask)
    print(f"{variant}: max |logit diff| vs transformers = {diff:.2e}")
    assert diff <= 1e-4
    out = str(tmp_path / "export")
    save_hf(out, config, params)
    back, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert _masked_max(hf_logits(back.eval(), tokens, mask), ours, mask) <= 1e-4
    config2, params2 = load_hf(out)
    assert config2 == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, params2)


def test_transformers_4x_config_and_5x_fused_experts_load_the_same(moe_model, tmp_path):
    """4.x spells Qwen3-MoE's count num_experts and RoPE as rope_theta; a checkpoint may hold the
    experts fused as transformers 5.x holds them in memory (gate_up_proj, down_proj)."""
    import torch
    from safetensors.torch import save_file
    variant, path, model = moe_model
    config, params = load_hf(path)
    old = str(tmp_path / "old")
    shutil.copytree(path, old)
    with open(os.path.join(path, "config.json")) as f:
        d = json.load(f)
    count = {"num_experts": d["num_local_experts"]} if d["model_type"] == "qwen3_moe" else {}
    rewrite_config(old, rope_parameters=None, rope_theta=d["rope_parameters"]["rope_theta"],
                   num_local_experts=None if count else d["num_local_experts"], **count)
    config_old, params_old = load_hf(old)
    assert config_old == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, params_old)
    fused = str(tmp_path / "fused")
    shutil.copytree(path, fused)
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()  # 5.x in-memory (fused) names
             if not (k == "lm_head.weight" and config.tie_word_embeddings)}
    assert any(k.endswith("experts.gate_up_proj") for k in state)
    save_file(state, os.path.join(fused, "model.safetensors"), metadata={"format": "pt"})
    _, params_fused = load_hf(fused)
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, params_fused)
    # The start-up check reads the per-expert shapes of the fused tensors without reading them.
    from jaxrl_llm.models import hf, moe_hf
    index = hf.TensorIndex(fused)
    index.alias(moe_hf.fused_aliases(config, set(index.where)))
    want = {name: index.read(name).shape for name in index.aliases}
    index.read = None  # any read now fails
    assert want and {name: index.shape(name) for name in index.aliases} == want


def _dense_reference(x, router, gate, up, down, k, norm):
    """float64 loop over experts: every expert on every token, weighted by the (renormalized) top-k gates."""
    logits = x @ router
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    top = np.argsort(-p, axis=-1)[:, :k]
    w = np.zeros_like(p)
    np.put_along_axis(w, top, np.take_along_axis(p, top, -1), -1)
    if norm:
        w = w / w.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for e in range(gate.shape[0]):
        g, u = x @ gate[e], x @ up[e]
        out += w[:, e:e + 1] * (((g / (1 + np.exp(-g))) * u) @ down[e])
    return out


@pytest.mark.parametrize("k,norm", [(2, True), (8, False)])
def test_grouped_experts_and_gradients_match_float64_loop(k, norm):
    jax.config.update("jax_enable_x64", True)
    try:
        rng = np.random.default_rng(k)
        m, d, e, f = 13, 6, 16, 5
        x, router = rng.normal(size=(m, d)), rng.normal(size=(d, e))
        gate, up, down = rng.normal(size=(e, d, f)) * 0.5, rng.normal(size=(e, d, f)) * 0.5, rng.normal(size=(e, f, d))
        c = ModelConfig(num_experts=e, num_experts_per_tok=k, norm_topk_prob=norm, dtype="float64")
        ours = lambda *a: moe_mlp(c, dict(zip(("router", "gate", "up", "down"), a[1:])), a[0])[0]
        args = (x, router, gate, up, down)
        np.testing.assert_allclose(ours(*args), _dense_reference(*args, k, norm), rtol=1e-10, atol=1e-10)
        ct = rng.normal(size=(m, d))
        g_ours = jax.jit(jax.grad(lambda *a: jnp.sum(ours(*a) * ct), argnums=range(5)))(*args)

        def loop(*a):  # the same loop in jax (float64): top-k fixed by the values, so differentiable
            xx, rr, gg, uu, dd = a
            w, ex, _ = route(c, xx @ rr)
            dense = jnp.zeros((m, e)).at[jnp.arange(m)[:, None], ex].set(w)
            out = sum(dense[:, j:j + 1] * ((jax.nn.silu(xx @ gg[j]) * (xx @ uu[j])) @ dd[j]) for j in range(e))
            return jnp.sum(out * ct)
        g_ref = jax.jit(jax.grad(loop, argnums=range(5)))(*args)
        for a, b in zip(g_ours, g_ref):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10)
        assert np.abs(g_ours[1]).max() > 0  # the router learns through the gate probabilities
    finally:
        jax.config.update("jax_enable_x64", False)


def test_grouped_experts_never_loop_over_experts():
    """The jaxpr holds one ragged_dot per projection whatever E: no per-expert matmul."""
    for e in (4, 32):
        c = ModelConfig(num_experts=e, num_experts_per_tok=2, hidden_size=8, moe_intermediate_size=4)
        w = {"router": jnp.ones((8, e)), "gate": jnp.ones((e, 8, 4)), "up": jnp.ones((e, 8, 4)),
             "down": jnp.ones((e, 4, 8))}
        eqns = jax.make_jaxpr(lambda x: moe_mlp(c, w, x)[0])(jnp.ones((5, 8))).jaxpr.eqns
        names = [q.primitive.name for q in eqns]
        assert names.count("ragged_dot_general") == 3 and names.count("dot_general") == 1  # + the router


def test_replayed_routes_give_the_same_model_and_router_gradients(tmp_path):
    from jaxrl_llm.models.transformer import Decoder
    from jaxrl_llm.models.lm import positions_from_mask
    make_moe_model(str(tmp_path), "qwen3_moe_top2")
    config, params = load_hf(str(tmp_path))
    tokens, mask = left_padded_batch(np.random.default_rng(4), LENGTHS, config.vocab_size)
    run = jax.jit(lambda p, routes=None: Decoder(config, with_lm_head=False, return_routes=True).apply(
        {"params": p}, tokens, positions_from_mask(mask), mask.astype(bool), routes=routes))
    hidden, _, routes = run(params)
    assert routes.shape == (config.num_layers, *tokens.shape, config.num_experts_per_tok)
    hidden2, _, routes2 = run(params, routes)
    np.testing.assert_array_equal(routes2, routes)
    np.testing.assert_allclose(hidden2, hidden, atol=1e-6)
    other = (routes + 1) % config.num_experts  # other experts: another model
    assert np.abs(np.asarray(run(params, other)[0] - hidden)).max() > 1e-3
    grad = jax.grad(lambda p: jnp.sum(run(p, routes)[0] ** 2))(params)
    assert np.abs(np.asarray(grad["layers"]["moe"]["router"])).max() > 0


@pytest.mark.parametrize("change,message", [
    (dict(mlp_only_layers=[2]), "mlp_only_layers must list layer indices in [0, 2"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step must be an int >= 1; got 0"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok=9"),
])
def test_unsupported_moe_configs_fail_in_one_line(change, message):
    d = dict(model_type="qwen3_moe", vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=2,
             num_attention_heads=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=4)
    d.update(change)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        config_from_hf_dict(d)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_moe"))
    make_moe_model(path, "qwen3_moe_top2")
    return load_hf(path)


def _trainer_pass(config, params, r, replay: bool):
    """Teacher-forced log-probs (N,T) of the rollout's tokens [replaying the sampler's experts]."""
    from jaxrl_llm.models.lm import completion_hidden, logprobs_from_hidden
    hidden = completion_hidden(config, params, r.prompt_tokens, r.prompt_mask, r.tokens, r.mask,
                               prompt_routes=r.prompt_routes if replay else None,
                               routes=r.routes if replay else None)
    return logprobs_from_hidden(config, params, hidden, r.tokens)


def test_static_sampler_records_the_experts_the_trainer_routes_to(tiny_moe):
    """float32 sampler and trainer: the recorded routes are the trainer's own, so replaying them changes
    nothing, and the sampler's log-probs equal the trainer's (the decode step's MoE is the Decoder's)."""
    from jaxrl_llm.models.lm import positions_from_mask
    from jaxrl_llm.models.transformer import Decoder
    from jaxrl_llm.sampling import generate
    config, params = tiny_moe
    tokens, mask = left_padded_batch(np.random.default_rng(5), [7, 3], config.vocab_size)
    r = generate(config, params, tokens, mask, jax.random.PRNGKey(0), max_new_tokens=6, eos_ids=[2], pad_id=0)
    assert r.routes.shape == (config.num_layers, 2, 6, 2) and r.prompt_routes.shape == (config.num_layers, 2, 7, 2)
    full = np.concatenate([r.prompt_tokens, r.tokens], 1)
    full_mask = np.concatenate([r.prompt_mask, r.mask], 1)
    _, _, trainer_routes = jax.jit(lambda f, m: Decoder(config, with_lm_head=False, return_routes=True).apply(
        {"params": params}, f, positions_from_mask(m), m.astype(bool)))(full, full_mask)
    valid = full_mask.astype(bool)
    valid[:, -1] = False  # the last drawn token is never fed to the sampler's model
    recorded = np.concatenate([r.prompt_routes, r.routes], 2)
    same = np.all(np.sort(recorded, -1) == np.sort(np.asarray(trainer_routes), -1), axis=-1)  # (L,N,P+T)
    assert same[:, valid].all()
    run = jax.jit(_trainer_pass, static_argnums=(0, 3))
    plain, replayed = run(config, params, r, False), run(config, params, r, True)
    m = np.asarray(r.mask).astype(bool)
    assert np.abs(np.asarray(replayed) - np.asarray(r.logprobs))[m].max() <= 1e-4
    assert np.abs(np.asarray(replayed) - np.asarray(plain))[m].max() <= 1e-5


def test_lora_on_attention_of_moe_and_expert_adapters_refused(tiny_moe):
    from jaxrl_llm.models import lora
    from jaxrl_llm.models.lm import init_params
    config, params = tiny_moe
    with pytest.raises(ValueError, match="lora.targets gate,up: adapters on the experts"):
        config.replace(lora_rank=4, lora_targets=("q", "gate", "up"))
    lc = config.replace(lora_rank=4, lora_targets=("q", "v"))
    _, adapters = lora.split(init_params(lc, jax.random.PRNGKey(0)))
    assert set(adapters["layers"]) == {"q_proj", "v_proj"}
    tokens, mask = left_padded_batch(np.random.default_rng(6), [5, 3], config.vocab_size)
    fwd = jax.jit(forward, static_argnums=0)
    # B = 0 at init: the adapted model is the base; a nonzero B changes it (the adapters are applied).
    merged = {**params, "layers": {**params["layers"], **{k: {**params["layers"][k], **v}
                                                           for k, v in adapters["layers"].items()}}}
    np.testing.assert_allclose(fwd(lc, merged, tokens, mask), fwd(config, params, tokens, mask), atol=1e-6)
    bumped = jax.tree_util.tree_map_with_path(
        lambda p, x: x + 0.1 if "lora_b" in jax.tree_util.keystr(p) else x, merged)
    assert np.abs(np.asarray(fwd(lc, bumped, tokens, mask) - fwd(lc, merged, tokens, mask))).max() > 1e-4


def test_trainer_logp_pass_replays_the_batch_routes(tiny_moe):
    """steps.logp_of reads `routes` / `prompt_routes` (rows first) from the batch: other experts there give
    other log-probs; the sampler's own give the sampler's log-probs."""
    from jaxrl_llm.sampling import generate
    from jaxrl_llm.trainer.steps import logp_of
    config, params = tiny_moe
    tokens, mask = left_padded_batch(np.random.default_rng(7), [6, 4], config.vocab_size)
    r = generate(config, params, tokens, mask, jax.random.PRNGKey(2), max_new_tokens=5, num_samples=2,
                 eos_ids=[2], pad_id=0)
    b = {"prompt_tokens": tokens, "prompt_mask": mask, "tokens": r.tokens, "mask": r.mask,
         "routes": r.routes.transpose(1, 2, 0, 3), "prompt_routes": r.prompt_routes[:, ::2].transpose(1, 2, 0, 3)}
    m = np.asarray(r.mask).astype(bool)
    logp = jax.jit(lambda b: logp_of(config, params, b, 1.0))
    assert np.abs(np.asarray(logp(b)) - np.asarray(r.logprobs))[m].max() <= 1e-4
    shifted = {**b, "routes": (b["routes"] + 1) % config.num_experts}
    assert np.abs(np.asarray(logp(shifted)) - np.asarray(r.logprobs))[m].max() > 1e-3


@pytest.mark.parametrize("unrolled", [True, False])
def test_dense_and_sparse_layers_decode_as_the_trainer_computes(moe_model, unrolled, monkeypatch):
    """A model mixing dense and sparse MLP layers (decoder_sparse_step, mlp_only_layers): the sampler's
    decode step, unrolled (each layer's kind static) or scanned (the kind a traced flag), gives the
    trainer's log-probs and routes; the dense layers record no expert."""
    from jaxrl_llm.models import lm
    from jaxrl_llm.sampling import generate
    variant, path, _ = moe_model
    if variant != "qwen3_moe_mixed":
        pytest.skip("the mixed model only")
    config, params = load_hf(path)
    assert config.moe_layers == (False, True, False, False, False, True) and config.mixed_mlp
    monkeypatch.setattr(lm, "DECODE_UNROLL_MAX_LAYERS", 8 if unrolled else 0)
    assert lm.decode_unrolled(config) == unrolled
    tokens, mask = left_padded_batch(np.random.default_rng(8), [6, 3], config.vocab_size)
    r = generate(config, params, tokens, mask, jax.random.PRNGKey(1), max_new_tokens=5, eos_ids=[2], pad_id=0)
    hidden = lm.completion_hidden(config, params, r.prompt_tokens, r.prompt_mask, r.tokens, r.mask,
                                  prompt_routes=r.prompt_routes, routes=r.routes)
    trainer = lm.logprobs_from_hidden(config, params, hidden, r.tokens)
    m = np.asarray(r.mask).astype(bool)
    assert np.abs(np.asarray(trainer) - np.asarray(r.logprobs))[m].max() <= 1e-4
    dense = np.asarray(r.routes)[[0, 2, 3, 4]]
    assert not (dense > 0).any() and np.asarray(r.routes)[[1, 5]][:, m].any()  # never fed: NO_ROUTE (-1)
