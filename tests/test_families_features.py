"""Mistral, Gemma 2 and Gemma 3 text with the trainer's features, on the tiny random family configs
(windows shorter than the rows, binding soft caps, both layer kinds): LoRA on every target (Gemma's
sandwich norms and GeGLU included) against the merged model and transformers, packed log-probs and
values against the unpacked padded pass, the value model from a *ForSequenceClassification checkpoint
against transformers' score, and bfloat16 against transformers' float32 with the sampler/trainer gap."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fixtures_families import FAMILIES, hf_family_config, make_family_model
from fixtures_families import exact_float32_matmuls  # noqa: F401  (an autouse fixture)
from fixtures_hf import hf_logits, left_padded_batch
from jaxrl_llm.models import completion_hidden, forward, init_params, load_hf, logprobs_from_hidden, lora, \
    token_logprobs, value_head
from jaxrl_llm.models.hf import save_hf
from jaxrl_llm.models.packing import packed_logprobs, packed_values, plan_packs, sequence_lengths
from jaxrl_llm.models.value import init_value_params, load_hf_value, value_forward

PAD, EOS = 0, 2
B, G, P, T, L = 3, 2, 6, 12, 20
PLENS, CLENS = (2, 6, 4), (1, 12, 3, 0, 7, 2)  # rows up to 18 tokens: longer than every window (5, 8)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    hf = make_family_model(path, request.param, seed=5)
    config, params = load_hf(path, attention="xla")
    return path, hf, config, params


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    pm, cm = np.zeros((B, P), np.int32), np.zeros((B * G, T), np.int32)
    for i, n in enumerate(PLENS):
        pm[i, P - n:] = 1
    for i, n in enumerate(CLENS):
        cm[i, :n] = 1
    return rng.integers(3, 97, (B, P)).astype(np.int32), pm, rng.integers(3, 97, (B * G, T)).astype(np.int32), cm


def _masked_max(a, b, mask):
    return float(np.max(np.abs(np.where(mask > 0, np.asarray(a) - np.asarray(b), 0))))


def test_lora_starts_at_the_base_trains_every_adapter_and_merges_exactly(family, tmp_path):
    """Zero B: the base bit for bit. One Adam step on the adapters alone: every B of every layer (both
    kinds) moves. Merged (lora.merge) = unmerged <= 1e-5, and the export of the merge in transformers."""
    import optax
    import torch
    from transformers import AutoModelForCausalLM
    path, _, config, params = family
    mc = config.replace(lora_rank=4, lora_alpha=8.0, lora_targets=lora.TARGETS)
    adapters = jax.jit(lambda key: lora.split(init_params(mc, key))[1])(jax.random.PRNGKey(0))  # eager init: 4x slower
    tokens, mask = left_padded_batch(np.random.default_rng(1), [18, 11], config.vocab_size)
    np.testing.assert_array_equal(forward(mc, lora.join(params, adapters), tokens, mask),
                                  forward(config, params, tokens, mask))

    targets = np.roll(tokens, -1, axis=1)
    loss = lambda ad: -jnp.sum(token_logprobs(mc, lora.join(params, ad), tokens, mask, targets) * mask)
    opt = optax.adam(1e-2)

    @jax.jit
    def step(ad):
        updates, _ = opt.update(jax.grad(loss)(ad), opt.init(ad), ad)
        return optax.apply_updates(ad, updates)

    trained = step(adapters)
    assert set(trained["layers"]) == {f"{t}_proj" for t in lora.TARGETS}
    for name, ad in trained["layers"].items():  # every layer of every target got a gradient through B
        b = np.asarray(ad["lora_b"]).reshape(mc.num_layers, -1)
        assert np.all(np.abs(b).max(axis=1) > 0), name

    ours = np.asarray(forward(mc, lora.join(params, trained), tokens, mask))
    merged = lora.merge(mc, lora.join(params, trained))
    err = _masked_max(forward(config, merged, tokens, mask), ours, mask[..., None])
    print(f"{config.model_type}: max |merged - adapter logits| = {err:.2e}")
    assert err <= 1e-5
    assert _masked_max(ours, forward(config, params, tokens, mask), mask[..., None]) > 1e-2  # the step mattered
    save_hf(str(tmp_path / "merged"), config, merged)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), attn_implementation="eager",
                                              dtype=torch.float32).eval()
    assert _masked_max(hf_logits(hf, tokens, mask), ours, mask[..., None]) <= 1e-4


def test_packed_logprobs_and_values_equal_unpacked(family, batch):
    """Several rows longer than the window share one packed sequence: a window or a position that leaked
    across segments would change the log-probs of every segment after the first. The unpacked reference
    is left-padded (prompts) and right-padded (completions), the packed rows have no padding inside a
    segment: their equality is the values' (and log-probs') invariance to padding and packing."""
    _, _, config, params = family
    pt, pm, ct, cm = batch
    plan = jax.tree_util.tree_map(lambda x: x[0], plan_packs(np.asarray(sequence_lengths(pm, cm))[None], L))
    assert np.bincount(plan["row"][plan["row"] >= 0]).max() >= 2  # some packed row holds several sequences
    unpacked = lambda p: logprobs_from_hidden(config, p, completion_hidden(config, p, pt, pm, ct, cm), ct, 0.7)
    ref = jax.jit(unpacked)(params)
    for attention in ("xla", "blockwise"):
        mc = config.replace(attention=attention, attention_block=4)
        got = jax.jit(lambda p, plan: packed_logprobs(mc, p, pt, pm, ct, cm, plan, L, 0.7))(params, plan)
        err = _masked_max(got, ref, cm)
        print(f"{config.model_type} {attention}: max |packed - unpacked log-prob| = {err:.2e}")
        assert err <= 1e-5
    vp = init_value_params(config, params, jax.random.PRNGKey(1), head_std=0.5)
    ext_t, ext_m = np.pad(ct, ((0, 0), (0, 1))), np.pad(cm, ((0, 0), (0, 1)), constant_values=1)
    want = jax.jit(lambda v: value_head(config, v, completion_hidden(config, v["backbone"], pt, pm, ext_t, ext_m)))(vp)
    got = jax.jit(lambda v, plan: packed_values(config, v, pt, pm, ct, cm, plan, L, lambda h: value_head(config, v, h),
                                                last=True))(vp, plan)
    err = _masked_max(got[:, :-1], want[:, :-1], cm)
    print(f"{config.model_type}: max |packed - unpacked value| = {err:.2e}")
    assert err <= 1e-5 and abs(float(got[1, -1] - want[1, -1])) <= 1e-5  # V(s_T) of the full-length row
    assert float(np.std(np.asarray(want)[:, :-1][cm > 0])) > 1e-2  # the values are not constant


def test_value_model_from_a_sequence_classification_checkpoint(family, tmp_path):
    """`value.init` of a PPO run: a *ForSequenceClassification of the family loads as our value model,
    whose value at the last token equals transformers' pooled score (it pools the last non-pad token)."""
    import torch
    from transformers import AutoModelForSequenceClassification
    _, hf, config, _ = family
    seq = AutoModelForSequenceClassification.from_config(hf_family_config(config.model_type, num_labels=1),
                                                         attn_implementation="eager").eval()
    with torch.no_grad():
        seq.model.load_state_dict(hf.model.state_dict())
        seq.score.weight.copy_(0.5 * torch.randn_like(seq.score.weight))
    seq.save_pretrained(str(tmp_path / "value"))
    vc, vp = load_hf_value(str(tmp_path / "value"), attention="xla")
    tokens, mask = left_padded_batch(np.random.default_rng(4), [20, 13], config.vocab_size, pad=PAD)
    ours = np.asarray(value_forward(vc, vp, tokens, mask))[:, -1]
    theirs = hf_logits(seq, tokens, mask)[:, 0]
    print(f"{config.model_type}: max |value - transformers score| = {np.abs(ours - theirs).max():.2e}")
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_bfloat16_logits_and_sampler_gap(family):
    """bfloat16 weights and compute against transformers' float32 on the float32 checkpoint, relative to
    the logit scale; and the bfloat16 sampler's log-probs against the bfloat16 trainer's."""
    from jaxrl_llm.sampling import generate
    path, hf, config, _ = family
    c16, p16 = load_hf(path, jnp.bfloat16, attention="xla")
    tokens, mask = left_padded_batch(np.random.default_rng(2), [20, 13], config.vocab_size)
    ref = hf_logits(hf, tokens, mask)
    rel = _masked_max(forward(c16, p16, tokens, mask), ref, mask[..., None]) / float(np.abs(ref).max())
    print(f"{config.model_type} bf16: max |logits - transformers fp32| / max |logits| = {rel:.2e}")
    assert rel <= 0.05

    prompts, pmask = left_padded_batch(np.random.default_rng(0), [5, 9, 3], config.vocab_size, pad=PAD)
    r = generate(c16, p16, prompts, pmask, jax.random.PRNGKey(1), max_new_tokens=14, num_samples=2,
                 temperature=1.0, eos_ids=[EOS], pad_id=PAD)
    full = np.concatenate([r.prompt_tokens, r.tokens], 1)
    full_mask = np.concatenate([r.prompt_mask, r.mask], 1)
    p = r.prompt_tokens.shape[1]
    trainer = token_logprobs(c16, p16, full[:, :-1], full_mask[:, :-1], full[:, 1:])[:, p - 1:]
    m = np.asarray(r.mask).astype(bool)
    assert m.sum(1).max() > 8  # decoding went past the windows
    gap = np.abs(np.asarray(trainer) - np.asarray(r.logprobs))[m]
    print(f"{config.model_type} bf16: sampler - trainer log-prob gap max {gap.max():.2e} mean {gap.mean():.2e}")
    assert gap.max() <= 0.1
