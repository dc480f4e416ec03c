"""The MoE router's losses (rl/router.py): the load-balancing loss against transformers'
`load_balancing_loss_func` (routing afresh, and under routing replay of a float32 sampler's routes, where a
row's last drawn token -- never fed, so without a recorded route -- is routed afresh), the z-loss against a
float64 loop, the router's gradient against float64 finite differences, and the replayed experts' counts
against a brute-force count."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fixtures_hf import left_padded_batch
from fixtures_moe import make_moe_model
from jaxrl_llm.models import load_hf
from jaxrl_llm.models.lm import positions_from_mask
from jaxrl_llm.models.transformer import Decoder
from jaxrl_llm.rl.router import router_losses
from jaxrl_llm.sampling import generate
from jaxrl_llm.trainer.steps import logp_of

LENGTHS = [11, 4, 1]


@pytest.fixture(scope="module", params=["qwen3_moe_top2", "mixtral_top2", "qwen3_moe_mixed"])
def routed(request, tmp_path_factory):
    """(config, params, tokens, mask, transformers' router logits per layer (B*S,E) float64, its aux loss)."""
    import torch
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    path = str(tmp_path_factory.mktemp(request.param))
    model = make_moe_model(path, request.param)
    config, params = load_hf(path)
    tokens, mask = left_padded_batch(np.random.default_rng(1), LENGTHS, config.vocab_size)
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(tokens, dtype=torch.long), attention_mask=torch.as_tensor(mask),
                    position_ids=torch.as_tensor(positions, dtype=torch.long), output_router_logits=True)
        aux = float(load_balancing_loss_func(out.router_logits, config.num_experts, config.num_experts_per_tok,
                                             torch.as_tensor(mask)))
    logits = [r.double().numpy() for r in out.router_logits]
    # the sparse layers' (a model with dense MLP layers too: those have no router)
    assert len(logits) == sum(config.moe_layers) and abs(float(out.aux_loss) - aux) < 1e-6  # the model's own term
    return config, params, tokens, mask, logits, aux


def _stats(config, params, tokens, mask, routes=None):
    return Decoder(config, with_lm_head=False, return_routes=True, return_router_stats=True).apply(
        {"params": params}, tokens, positions_from_mask(mask), mask.astype(bool), routes=routes)


def test_load_balance_and_z_loss_match_transformers_and_a_float64_loop(routed):
    config, params, tokens, mask, hf_router_logits, hf_aux = routed
    _, _, routes, stats = jax.jit(_stats, static_argnums=0)(config, params, tokens, mask)
    balance, z, metrics = router_losses(stats, config.num_experts_per_tok)
    print(f"{config.model_type}: load balance {float(balance):.6f} vs transformers {hf_aux:.6f}")
    np.testing.assert_allclose(float(balance), hf_aux, rtol=1e-5)
    flat = mask.reshape(-1).astype(bool)
    total = n = 0.0
    for layer in hf_router_logits:  # z-loss: mean over (layer, real token) of logsumexp^2, in float64
        for row in layer[flat]:
            lse = np.log(np.sum(np.exp(row - row.max()))) + row.max()
            total, n = total + lse * lse, n + 1
    np.testing.assert_allclose(float(z), total / n, rtol=1e-5)
    assert float(metrics["moe/drop_frac"]) == 0.0  # dropless: every (token, expert) pair computed
    sparse = [l for l in range(config.num_layers) if config.moe_layers[l]]
    counts = np.zeros((len(sparse), config.num_experts))  # brute force: the heaviest expert's share x E
    for i, l in enumerate(sparse):
        np.add.at(counts[i], np.asarray(routes[l])[mask.astype(bool)].reshape(-1), 1)
    load = (counts.max(-1) / counts.sum(-1)).max() * config.num_experts
    np.testing.assert_allclose(float(metrics["moe/expert_load_max"]), load, rtol=1e-6)
    assert 1.0 <= load <= config.num_experts


@pytest.mark.parametrize("k,norm", [(2, True), (4, False)])
def test_router_losses_gradient_matches_finite_differences(k, norm):
    """d(balance + 0.1 z)/d(routers) of two layers' routers along a random direction, in float64, against
    central differences (the top-k selection is fixed by the step being small: the counts are piecewise
    constant), with a padding token; the losses' gradient reaches the router through the probabilities."""
    from jaxrl_llm.models.config import ModelConfig
    from jaxrl_llm.models.moe import moe_mlp, router_stats
    jax.config.update("jax_enable_x64", True)
    try:
        rng = np.random.default_rng(k)
        m, d, e, f = 9, 6, 8, 3
        c = ModelConfig(num_experts=e, num_experts_per_tok=k, norm_topk_prob=norm, dtype="float64")
        xs = rng.normal(size=(2, m, d))
        w = lambda: {"gate": rng.normal(size=(e, d, f)), "up": rng.normal(size=(e, d, f)), "down": rng.normal(size=(e, f, d))}
        experts = [w(), w()]
        routers, direction = rng.normal(size=(2, d, e)), rng.normal(size=(2, d, e))
        mask = np.concatenate([np.ones(m - 1), [0.0]])  # the last token is padding

        def loss(t):
            per_layer = []
            for l in range(2):
                _, ex, probs, logits = moe_mlp(c, {**experts[l], "router": routers[l] + t * direction[l]}, xs[l],
                                               return_logits=True)
                per_layer.append(router_stats(logits, probs, ex, jnp.asarray(mask)))
            stats = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *per_layer)
            balance, z, _ = router_losses(stats, k)
            return balance + 0.1 * z
        grad = float(jax.grad(loss)(0.0))
        eps = 1e-6
        fd = float((loss(eps) - loss(-eps)) / (2 * eps))
        assert abs(grad) > 1e-3
        np.testing.assert_allclose(grad, fd, rtol=1e-7)
    finally:
        jax.config.update("jax_enable_x64", False)


def test_replayed_experts_are_the_ones_counted(routed):
    """Under routing replay the load counts the replayed experts (those the forward computed), the
    probabilities stay this pass's: the first sparse layer's are the same as without replay."""
    config, params, tokens, mask, _, _ = routed
    run = jax.jit(_stats, static_argnums=0)
    _, _, _, free = run(config, params, tokens, mask)
    rng = np.random.default_rng(3)
    k, e = config.num_experts_per_tok, config.num_experts
    replay = np.stack([np.stack([rng.permutation(e)[:k] for _ in range(tokens.size)])
                       for _ in range(config.num_layers)]).reshape(config.num_layers, *tokens.shape, k)
    _, _, routes, stats = run(config, params, tokens, mask, jnp.asarray(replay, jnp.int32))
    sparse = np.asarray(config.moe_layers)
    np.testing.assert_array_equal(np.asarray(routes)[sparse], replay[sparse])
    assert not np.asarray(routes)[~sparse].any()  # a dense layer (mixed model) routes nothing
    counts = np.zeros((config.num_layers, e))  # a dense layer (mixed model) counts nothing
    for l in (l for l in range(config.num_layers) if config.moe_layers[l]):
        np.add.at(counts[l], replay[l][mask.astype(bool)].reshape(-1), 1)
    np.testing.assert_array_equal(np.asarray(stats["counts"]), counts)
    first = config.moe_layers.index(True)
    np.testing.assert_allclose(np.asarray(stats["probs"][first]), np.asarray(free["probs"][first]), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(stats["tokens"]), [mask.sum() * s for s in config.moe_layers])


@pytest.mark.parametrize("variant,slots", [("qwen3_moe_top2", 0), ("mixtral_top2", 3)])
def test_load_balance_under_replay_of_the_samplers_routes_matches_transformers(variant, slots, tmp_path):
    """The update's router sums (`logp_of(..., router_stats=True)`, replaying the float32 sampler's routes,
    static or continuous batching) give transformers' load-balancing loss of a full forward of [prompt;
    completion] over the completion tokens, 1e-5: the last token of each row, which the sampler never fed,
    is routed afresh, not counted as expert 0 k times."""
    import torch
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    model = make_moe_model(str(tmp_path), variant)
    config, params = load_hf(str(tmp_path))
    g = 2
    prompts, pmask = left_padded_batch(np.random.default_rng(5), [7, 3, 5], config.vocab_size)
    r = generate(config, params, prompts, pmask, jax.random.PRNGKey(2), max_new_tokens=6, num_samples=g,
                 eos_ids=[1], pad_id=0, decode_slots=slots)
    b = {"prompt_tokens": prompts, "prompt_mask": pmask, "tokens": r.tokens, "mask": r.mask,
         "routes": r.routes.transpose(1, 2, 0, 3), "prompt_routes": r.prompt_routes[:, ::g].transpose(1, 2, 0, 3)}
    logp, stats = jax.jit(lambda p, b: logp_of(config, p, b, 1.0, router_stats=True))(params, b)
    assert logp.shape == r.tokens.shape  # (N,T), not unpacked row by row
    balance, _, _ = router_losses(stats, config.num_experts_per_tok)
    full = np.concatenate([np.repeat(prompts, g, 0), np.asarray(r.tokens)], 1)
    full_mask = np.concatenate([np.repeat(pmask, g, 0), np.asarray(r.mask)], 1)
    counted = np.concatenate([np.zeros_like(np.repeat(pmask, g, 0)), np.asarray(r.mask)], 1)  # completions only
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(full, dtype=torch.long), attention_mask=torch.as_tensor(full_mask),
                    position_ids=torch.as_tensor(np.maximum(np.cumsum(full_mask, -1) - 1, 0), dtype=torch.long),
                    output_router_logits=True)
        hf = float(load_balancing_loss_func(out.router_logits, config.num_experts, config.num_experts_per_tok,
                                            torch.as_tensor(counted)))
    np.testing.assert_allclose(np.asarray(logp)[np.asarray(r.mask) > 0], np.asarray(r.logprobs)[np.asarray(r.mask) > 0],
                               atol=1e-5)
    np.testing.assert_allclose(float(balance), hf, rtol=1e-5)
    assert (np.asarray(r.routes) < 0).any()  # the never-fed last tokens carry no route


@pytest.mark.parametrize("change,message", [
    ({"model.router_aux_loss_coef": -0.1}, "config.model.router_aux_loss_coef must be a number >= 0"),
    ({"model.router_z_loss_coef": -1.0}, "config.model.router_z_loss_coef must be a number >= 0"),
    ({"model.router_z_loss_coef": 0.1, "train.pack_length": 4096}, "config.train.pack_length must be 0 with a router loss"),
])
def test_bad_router_loss_settings_fail_in_one_line(change, message):
    from jaxrl_llm import config as config_lib
    with pytest.raises(ValueError, match=message):
        config_lib.prepare(config_lib.from_dict({"data.task": "digit_puzzles", **change}))


def test_a_router_loss_on_a_dense_model_fails_in_one_line():
    from jaxrl_llm.models.config import ModelConfig
    from jaxrl_llm.rl import Objective
    from jaxrl_llm.trainer.steps import make_update
    with pytest.raises(ValueError, match="router_z_loss_coef > 0 need a mixture-of-experts model"):
        make_update(Objective(group_size=2, router_z_coef=0.1), None, ModelConfig(model_type="llama"))
