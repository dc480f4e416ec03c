"""Mistral, Gemma 2 and Gemma 3 text in the samplers and the prompt-shared pass: greedy decoding equals
transformers' generate past the sliding window, sampler log-probs equal the trainer's (static sampler and
continuous batching), and the prompt-shared completion pass equals full sequences (xla and blockwise)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fixtures_families import FAMILIES, make_family_model
from fixtures_families import exact_float32_matmuls  # noqa: F401  (an autouse fixture)
from fixtures_hf import left_padded_batch
from jaxrl_llm.models import completion_hidden, load_hf, logprobs_from_hidden, token_logprobs
from jaxrl_llm.sampling import generate

PAD, EOS = 0, 2
T = 14  # new tokens: prompts (5, 9, 3) + 14 > every window (5, 8)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    hf = make_family_model(path, request.param, seed=4)
    config, params = load_hf(path, attention="xla")
    return hf, config, params


def _prompts():
    return left_padded_batch(np.random.default_rng(0), [5, 9, 3], 97, pad=PAD)


def test_greedy_equals_transformers_generate(family):
    import torch
    hf, config, params = family
    tokens, mask = _prompts()
    with torch.no_grad():
        ref = hf.generate(input_ids=torch.as_tensor(tokens).long(), attention_mask=torch.as_tensor(mask).long(),
                          do_sample=False, max_new_tokens=T, min_new_tokens=T, eos_token_id=EOS, pad_token_id=PAD)
    r = generate(config, params, tokens, mask, jax.random.PRNGKey(0), max_new_tokens=T, temperature=0.0,
                 eos_ids=[EOS], pad_id=PAD)
    np.testing.assert_array_equal(np.asarray(r.tokens)[np.asarray(r.mask) > 0],
                                  ref[:, tokens.shape[1]:].numpy()[np.asarray(r.mask) > 0])


@pytest.mark.parametrize("slots,scanned", [(None, False), (3, False), (None, True)])
def test_sampler_logprobs_equal_trainer_logprobs(family, slots, scanned, monkeypatch):
    """The static sampler, continuous batching, and the scanned decode step (layer kinds as data)."""
    from jaxrl_llm.models import lm
    _, config, params = family
    if scanned:
        monkeypatch.setattr(lm, "DECODE_UNROLL_MAX_LAYERS", 0)
        config = config.replace(logits_chunk=config.logits_chunk + 1)  # a fresh compile under the patch
    tokens, mask = _prompts()
    r = generate(config, params, tokens, mask, jax.random.PRNGKey(1), max_new_tokens=T, num_samples=2,
                 temperature=1.0, eos_ids=[EOS], pad_id=PAD, **({} if slots is None else {"decode_slots": slots}))
    full = np.concatenate([r.prompt_tokens, r.tokens], 1)
    full_mask = np.concatenate([r.prompt_mask, r.mask], 1)
    p = r.prompt_tokens.shape[1]
    ref = token_logprobs(config, params, full[:, :-1], full_mask[:, :-1], full[:, 1:])[:, p - 1:]
    m = np.asarray(r.mask).astype(bool)
    assert m.sum(1).max() > 8  # decoding went past the windows
    gap = float(np.abs(np.asarray(ref) - np.asarray(r.logprobs))[m].max())
    print(f"{config.model_type} slots={slots}: max |sampler - trainer log-prob| = {gap:.2e}")
    assert gap <= 1e-4


@pytest.mark.parametrize("attention", ["xla", "blockwise"])
def test_prompt_shared_completion_pass_equals_full_sequences(family, attention):
    _, config, params = family
    config = config.replace(attention=attention, attention_block=4)
    rng = np.random.default_rng(8)
    B, G, L = 2, 3, 11
    prompts, pmask = left_padded_batch(rng, [7, 3], config.vocab_size)
    comps = rng.integers(3, config.vocab_size, (B * G, L)).astype(np.int32)
    cmask = (np.arange(L)[None] < np.array([11, 4, 1, 11, 2, 9])[:, None]).astype(np.int32)
    shared = logprobs_from_hidden(config, params, completion_hidden(config, params, prompts, pmask, comps, cmask),
                                  comps)
    full = np.concatenate([np.repeat(prompts, G, 0), comps], 1)
    full_mask = np.concatenate([np.repeat(pmask, G, 0), cmask], 1)
    P = prompts.shape[1]
    ref = token_logprobs(config, params, full[:, :-1], full_mask[:, :-1], full[:, 1:])[:, P - 1:]
    assert float(np.abs(np.asarray(shared) - np.asarray(ref))[cmask > 0].max()) <= 1e-5
