"""LoRA (models/lora.py, trainer/adapters.py): the initial policy is the base, the adapters against a
numpy merge and against PEFT, the sampler with the adapters, and the trainer end to end (only the
adapters train, the reference is the base, adapter-only checkpoints, exact resume, refusal of another
base, both exports)."""
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from fixtures_data import make_tiny_tokenizer
from fixtures_hf import left_padded_batch, make_hf_model
from jaxrl_llm.models import forward, init_params, load_hf, lora, token_logprobs
from jaxrl_llm.models.hf import save_hf, save_peft_adapter
from jaxrl_llm.sampling import generate
from jaxrl_llm.trainer import Trainer
from test_trainer import ROOT, read_jsonl, small_config

TOKENS = np.array([[5, 17, 30, 44, 2, 61], [9, 8, 7, 6, 5, 4]], np.int32)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A random Qwen2 (q/k/v biases) from transformers and our LoRA config of it, every target, r = 4."""
    path = str(tmp_path_factory.mktemp("base"))
    hf = make_hf_model(path, "qwen2")
    mc, params = load_hf(path)
    return path, hf, mc.replace(lora_rank=4, lora_alpha=8.0, lora_targets=lora.TARGETS), params


def adapters_of(mc, b_std=0.0, seed=0):
    """Fresh adapters; with b_std > 0, B drawn normal(b_std) so that they change the model."""
    fresh = lora.split(init_params(mc, jax.random.PRNGKey(seed)))[1]
    if not b_std:
        return fresh
    keys = iter(jax.random.split(jax.random.PRNGKey(seed + 1), 64))
    return jax.tree_util.tree_map_with_path(
        lambda p, x: b_std * jax.random.normal(next(keys), x.shape) if p[-1].key == "lora_b" else x, fresh)


def numpy_merge(mc, params, adapters):
    """Independent reference: each adapted kernel (L, *in, *out) + alpha/r * A B, layer by layer."""
    out = jax.tree_util.tree_map(np.array, params)
    for name, ad in adapters["layers"].items():
        kernel = out["layers"][name]["kernel"]
        a, b = np.asarray(ad["lora_a"], np.float64), np.asarray(ad["lora_b"], np.float64)
        for layer in range(mc.num_layers):
            delta = a[layer].reshape(-1, mc.lora_rank) @ b[layer].reshape(mc.lora_rank, -1)
            kernel[layer] += (mc.lora_alpha / mc.lora_rank * delta).reshape(kernel.shape[1:]).astype(kernel.dtype)
    return out


def test_initial_adapters_leave_the_base_exactly(base):
    _, _, mc, params = base
    fresh = adapters_of(mc)
    np.testing.assert_array_equal(forward(mc, lora.join(params, fresh), TOKENS),
                                  forward(lora.base_config(mc), params, TOKENS))
    q = fresh["layers"]["q_proj"]
    assert not np.any(q["lora_b"]) and q["lora_a"].shape == (mc.num_layers, mc.hidden_size, mc.lora_rank)
    bound = 1 / np.sqrt(mc.hidden_size)  # PEFT's kaiming_uniform(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert np.abs(q["lora_a"]).max() <= bound and np.std(q["lora_a"]) > 0.8 * bound / np.sqrt(3)
    o = fresh["layers"]["o_proj"]["lora_a"]  # fan_in over both input axes (heads, head_dim)
    assert o.shape == (mc.num_layers, mc.num_heads, mc.head_dim, mc.lora_rank)
    assert np.abs(o).max() <= 1 / np.sqrt(mc.num_heads * mc.head_dim)


def test_unmerged_adapters_equal_the_numpy_merge(base):
    _, _, mc, params = base
    ad = adapters_of(mc, 0.1)
    ours = forward(mc, lora.join(params, ad), TOKENS)
    merged = numpy_merge(mc, params, ad)
    np.testing.assert_allclose(ours, forward(lora.base_config(mc), merged, TOKENS), atol=2e-5)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6),
                           lora.merge(mc, lora.join(params, ad)), merged)
    assert np.abs(ours - forward(lora.base_config(mc), params, TOKENS)).max() > 0.1  # the adapters matter
    # A projection that is no target stays the base's: dropping down's adapter = a config without it.
    fewer = mc.replace(lora_targets=tuple(t for t in lora.TARGETS if t != "down"))
    no_down = {"layers": {k: v for k, v in ad["layers"].items() if k != "down_proj"}}
    np.testing.assert_allclose(forward(fewer, lora.join(params, no_down), TOKENS),
                               forward(lora.base_config(mc), numpy_merge(fewer, params, no_down), TOKENS), atol=2e-5)


def test_adapter_gradients_are_the_projected_kernel_gradients(base):
    """dL/dB = s A^T dL/dW and dL/dA = s dL/dW B^T at W' = W + s A B: the unmerged backward against
    the merged model's kernel gradients."""
    from jaxrl_llm.models import completion_hidden, logprobs_from_hidden
    _, _, mc, params = base
    ad = adapters_of(mc, 0.1)
    args = (TOKENS[:1, :3], np.ones((1, 3), np.int32), TOKENS[:2, 3:], np.ones((2, 3), np.int32))
    loss = lambda c, p: logprobs_from_hidden(c, p, completion_hidden(c, p, *args), args[2]).sum()
    g_ad = jax.grad(lambda a: loss(mc, lora.join(params, a)))(ad)["layers"]
    g_w = jax.grad(lambda w: loss(lora.base_config(mc), w))(lora.merge(mc, lora.join(params, ad)))["layers"]
    s, r = mc.lora_alpha / mc.lora_rank, mc.lora_rank
    for name, p in ad["layers"].items():
        a, b = (np.asarray(p[k]).reshape(mc.num_layers, *shape) for k, shape in (("lora_a", (-1, r)), ("lora_b", (r, -1))))
        g = np.asarray(g_w[name]["kernel"]).reshape(mc.num_layers, a.shape[1], b.shape[2])
        np.testing.assert_allclose(np.asarray(g_ad[name]["lora_b"]).reshape(b.shape),
                                   s * np.einsum("lir,lio->lro", a, g), atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(np.asarray(g_ad[name]["lora_a"]).reshape(a.shape),
                                   s * np.einsum("lio,lro->lir", g, b), atol=2e-5, rtol=1e-4)


def test_peft_adapter_gives_our_logits(base, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    path, _, mc, params = base
    ad = adapters_of(mc, 0.1)
    save_peft_adapter(str(tmp_path / "adapter"), mc, ad, path)
    save_hf(str(tmp_path / "merged"), mc, lora.merge(mc, lora.join(params, ad)))
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), str(tmp_path / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    with torch.no_grad():
        theirs = peft_model(torch.as_tensor(TOKENS).long()).logits.numpy()
        theirs_merged = merged(torch.as_tensor(TOKENS).long()).logits.numpy()
    ours = np.asarray(forward(mc, lora.join(params, ad), TOKENS))
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
    np.testing.assert_allclose(theirs_merged, theirs, atol=1e-4)
    assert np.abs(ours - np.asarray(forward(lora.base_config(mc), params, TOKENS))).max() > 0.1


@pytest.mark.parametrize("unrolled", [True, False])
def test_sampler_uses_the_adapters(base, unrolled, monkeypatch):
    """Sampler log-probs = the trainer's teacher-forced ones under base + adapters (merged into the
    unrolled step's weight copies, unmerged in the scanned step), and far from the base's."""
    import jaxrl_llm.models.lm as lm
    _, _, mc, params = base
    if not unrolled:  # another config, so that the unrolled program is not reused from the cache
        monkeypatch.setattr(lm, "DECODE_UNROLL_MAX_LAYERS", 0)
        mc = mc.replace(logits_chunk=64)
    policy = lora.join(params, adapters_of(mc, 0.1))
    prompts, mask = left_padded_batch(np.random.default_rng(0), [5, 3], 97)
    r = generate(mc, policy, prompts, mask, jax.random.PRNGKey(0), max_new_tokens=6, num_samples=2,
                 eos_ids=(2,), pad_id=0)
    full = np.concatenate([r.prompt_tokens, r.tokens], 1)
    full_mask = np.concatenate([r.prompt_mask, r.mask], 1)
    p, m = r.prompt_tokens.shape[1], np.asarray(r.mask).astype(bool)
    gap = lambda pr, c: np.abs(np.asarray(token_logprobs(c, pr, full[:, :-1], full_mask[:, :-1], full[:, 1:])[:, p - 1:])
                               - np.asarray(r.logprobs))[m].max()
    assert gap(policy, mc) <= 1e-4
    assert gap(params, lora.base_config(mc)) > 1e-2  # a sampler without the adapters would fail above


def test_dropout_acts_on_the_adapter_input_only_given_a_dropout_rng(base):
    import flax.linen as nn
    from jaxrl_llm.models import completion_hidden
    from jaxrl_llm.models.transformer import Dense
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 8))
    dense = Dense((6,), ("embed", "mlp"), lora_rank=3, lora_scale=2.0, lora_dropout=0.5)
    v = nn.meta.unbox(dense.init(jax.random.PRNGKey(1), x))
    v = {"params": {**v["params"], "lora_b": jax.random.normal(jax.random.PRNGKey(2), (3, 6))}}
    plain = np.asarray(dense.apply(v, x))  # no rng: the score pass and the sampler
    a, b = (np.asarray(v["params"][k], np.float64) for k in ("lora_a", "lora_b"))
    np.testing.assert_allclose(plain, x @ np.asarray(v["params"]["kernel"]) + 2.0 * x @ a @ b, atol=1e-5)
    draws = jax.vmap(lambda k: dense.apply(v, x, rngs={"dropout": k}))(jax.random.split(jax.random.PRNGKey(3), 4000))
    draws = np.asarray(draws)
    assert np.abs(draws - plain).max() > 0.1  # it drops
    np.testing.assert_allclose(draws.mean(0), plain, atol=0.15)  # inverted dropout: unbiased in expectation
    # In the model: the pass given a key differs, the pass without one is the dropout-free model's.
    _, _, mc, params = base
    policy = lora.join(params, adapters_of(mc, 0.1))
    args = (TOKENS[:1, :3], np.ones((1, 3), np.int32), TOKENS[:2, 3:], np.ones((2, 3), np.int32))
    dropped = mc.replace(lora_dropout=0.3)
    np.testing.assert_array_equal(completion_hidden(dropped, policy, *args), completion_hidden(mc, policy, *args))
    assert np.abs(completion_hidden(dropped, policy, *args, dropout_rng=jax.random.PRNGKey(0))
                  - completion_hidden(mc, policy, *args)).max() > 1e-3


# -------------------------------------------------------------------------------------------- remat
REMAT_MODES = ("none", "full", "dots")


@pytest.fixture(scope="module")
def remat_grads(base):
    """{remat: (adapter gradients, full-parameter gradients of the model without adapters, adapters after
    one Adam step)} of a GRPO-like loss: log-probs of the trainer's prompt-shared completion pass (a
    left-padded prompt) weighted by random advantages. All modes' gradients in one program: one compile."""
    import optax
    from jaxrl_llm.models import completion_hidden, logprobs_from_hidden
    _, _, mc, params = base
    ad = adapters_of(mc)  # B = 0: the first step of a LoRA run
    args = (TOKENS[:1, :4], np.array([[0, 1, 1, 1]], np.int32), TOKENS[:, 4:], np.array([[1, 1], [1, 0]], np.int32))
    weight = np.random.default_rng(3).normal(size=(2, 2)).astype(np.float32)
    loss = lambda c, p: (weight * args[3] * logprobs_from_hidden(c, p, completion_hidden(c, p, *args), args[2])).sum()

    def grads(ad, params):
        return {r: (jax.grad(lambda a: loss(mc.replace(remat=r), lora.join(params, a)))(ad),
                    jax.grad(lambda w: loss(lora.base_config(mc).replace(remat=r), w))(params)) for r in REMAT_MODES}

    tx = optax.adam(1e-2)
    step = jax.jit(lambda g: optax.apply_updates(ad, tx.update(g, tx.init(ad), ad)[0]))
    return {r: (g_ad, g_full, step(g_ad)) for r, (g_ad, g_full) in jax.jit(grads)(ad, params).items()}


def test_remat_modes_are_all_covered():
    from jaxrl_llm.models.transformer import _REMAT_POLICIES
    assert set(REMAT_MODES) == {"none", *_REMAT_POLICIES}


@pytest.mark.parametrize("remat", REMAT_MODES[1:])
def test_remat_gives_the_gradients_of_no_remat(remat_grads, remat):
    """Adapter and full-parameter gradients under each remat policy = remat none's (float32)."""
    close = lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6, rtol=1e-5)
    for got, want in zip(remat_grads[remat], remat_grads["none"]):
        jax.tree_util.tree_map(close, got, want)


@pytest.mark.parametrize("remat", REMAT_MODES)
def test_one_adapter_step_moves_b_under_every_remat(remat_grads, remat):
    g_ad, g_full, stepped = remat_grads[remat]
    for name, p in stepped["layers"].items():
        g = np.abs(g_ad["layers"][name]["lora_b"])
        assert g.reshape(len(g), -1).max(axis=1).min() > 1e-6, name  # every layer's B has a gradient
        assert np.all(np.abs(p["lora_b"]) > 0), name  # Adam's first step moves every entry of B off zero
    assert all(np.abs(g).max() > 1e-6 for g in jax.tree_util.tree_leaves(g_full))


# ------------------------------------------------------------------------------------- trainer end to end
def lora_config(model_path, total_steps=2, **kw):
    """remat "dots" (saves the matmul outputs) and a reward that varies within every group: LoRA trains
    under remat from the first step (a reward constant in a group leaves only the KL term, whose gradient
    is zero at the first step: B would then move only by float noise in the ratio, scaled up by Adam)."""
    return small_config(total_steps=total_steps, **{"model.path": model_path, "lora.rank": 4, "lora.alpha": 8.0,
                                                    "optimizer.learning_rate": 1e-2, "model.remat": "dots",
                                                    "reward.functions": "fixtures_rewards:char_code", **kw})


def make_base_dir(path, seed=0):
    make_hf_model(str(path), "llama", seed=seed, vocab_size=300)
    make_tiny_tokenizer(str(path), chat_template=False)
    return str(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step LoRA GRPO run on a transformers base, exported at the end."""
    root = tmp_path_factory.mktemp("lora_run")
    path = make_base_dir(root / "base")
    t = Trainer(lora_config(path, **{"export.at_end": True}), str(root / "work"))
    t.run()
    return path, root / "work", t


def test_only_the_adapters_train_and_the_reference_is_the_base(run):
    path, work, t = run
    _, fresh_base = load_hf(path)
    jax.tree_util.tree_map(np.testing.assert_array_equal, t.base, fresh_base)  # bit-identical after 2 steps
    leaves = jax.tree_util.tree_flatten_with_path(t.state.params)[0]
    assert {p[-1].key for p, _ in leaves} == {"lora_a", "lora_b"}  # the state's parameters: adapters only
    assert all(np.any(p["lora_b"]) for p in t.state.params["layers"].values())  # B left zero: they trained
    first = read_jsonl(work / "metrics.jsonl")[0]  # a real gradient, not float noise (~1e-8 at zero advantages)
    assert first["reward/std"] > 0 and first["policy/grad_norm"] > 1e-4
    sizes = lambda tree: sum(x.size for x in jax.tree_util.tree_leaves(tree) if np.ndim(x))
    assert sizes(t.state.opt_state) == 2 * sizes(t.state.params)  # Adam's moments of the adapters alone
    d, f, q, kv = (t.mc.hidden_size, t.mc.intermediate_size, t.mc.num_heads * t.mc.head_dim,
                   t.mc.num_kv_heads * t.mc.head_dim)  # counted by hand: r * (in + out) of the 7 targets
    per_layer = 4 * ((d + q) + 2 * (d + kv) + (q + d) + 2 * (d + f) + (f + d))
    assert sizes(t.state.params) == lora.num_adapter_params(t.mc) == t.mc.num_layers * per_layer
    assert t.frozen_ref is t.base and t.state.ref_params is None  # the reference is no copy
    # The score pass's reference log-probs are the base's, computed here independently.
    local, _, _ = t.rollouts.collect(t.policy(t.state), jax.random.PRNGKey(5), 0)
    b = t.rollouts.device_batch(local)
    ref_logp = np.asarray(t.fns.score(t.state, t.frozen_ref, b, None, t.base)["ref_logp"])
    full = np.concatenate([np.repeat(local["prompt_tokens"], 2, 0), local["tokens"]], 1)
    full_mask = np.concatenate([np.repeat(local["prompt_mask"], 2, 0), local["mask"]], 1)
    p, m = local["prompt_tokens"].shape[1], local["mask"].astype(bool)
    args = (full[:, :-1], full_mask[:, :-1], full[:, 1:], t.plan.temperature)
    expected = np.asarray(token_logprobs(lora.base_config(t.mc), fresh_base, *args))[:, p - 1:]
    np.testing.assert_allclose(ref_logp[m], expected[m], atol=1e-5)
    policy_logp = np.asarray(token_logprobs(t.mc, t.policy(t.state), *args))[:, p - 1:]
    assert np.abs(policy_logp - expected)[m].max() > 1e-3


def test_exports_load_in_transformers_and_peft(run, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from safetensors.numpy import load_file
    path, work, t = run
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(str(work / "hf")).eval()(torch.as_tensor(TOKENS).long()).logits
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), str(work / "hf_adapter"))
        adapted = adapted.eval()(torch.as_tensor(TOKENS).long()).logits
    ours = np.asarray(forward(t.mc, t.policy(t.state), TOKENS))
    np.testing.assert_allclose(merged.numpy(), ours, atol=1e-4)
    np.testing.assert_allclose(adapted.numpy(), ours, atol=1e-4)
    # The export command gives the same two directories from the checkpoint.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]))
    proc = subprocess.run([sys.executable, "-m", "jaxrl_llm.export", f"--workdir={work}", f"--out={tmp_path / 'hf'}"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"its LoRA adapter (PEFT) to {tmp_path / 'hf_adapter'}" in proc.stdout
    for name, file in (("hf", "model.safetensors"), ("hf_adapter", "adapter_model.safetensors")):
        a, b = load_file(str(work / name / file)), load_file(str(tmp_path / "hf" if name == "hf" else
                                                                     tmp_path / "hf_adapter") + "/" + file)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in b


def test_resume_is_exact_and_another_base_is_refused(run, tmp_path):
    _, straight, t_straight = run
    path = make_base_dir(tmp_path / "base")  # the same weights (seed 0) at another path
    work = tmp_path / "work"
    Trainer(lora_config(path, total_steps=1, **{"export.at_end": True}), str(work)).run()
    t = Trainer(lora_config(path, **{"export.at_end": True}), str(work))
    assert t.start_step == 1
    t.run()
    a, b = read_jsonl(straight / "metrics.jsonl"), read_jsonl(work / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2]
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if not k.startswith("perf/")} == \
               {k: v for k, v in rb.items() if not k.startswith("perf/")}
    jax.tree_util.tree_map(np.testing.assert_array_equal, t_straight.state, t.state)
    shutil.rmtree(path)
    make_base_dir(path, seed=1)  # same architecture and files, other weights
    with pytest.raises(ValueError, match="trained on another base model"):
        Trainer(lora_config(path, **{"export.at_end": True}), str(work))


@pytest.mark.parametrize("field,value,message", [
    ("lora.rank", -1, "lora.rank must be an int >= 0"), ("lora.alpha", 0.0, "lora.alpha must be a number > 0"),
    ("lora.dropout", 1.0, r"lora.dropout must be in \[0, 1\)"), ("lora.targets", "q,mlp", "lora.targets must be"),
    ("ref.refresh_every", 2, "ref.refresh_every must be 0 with lora.rank > 0")])
def test_lora_config_validation(field, value, message):
    from jaxrl_llm import config as config_lib
    c = small_config(**{"lora.rank": 4, field: value})
    with pytest.raises(ValueError, match=message):
        config_lib.prepare(c)
