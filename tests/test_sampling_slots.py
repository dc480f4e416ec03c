"""The continuous-batching sampler (`decode_slots` = S > 0): against a teacher-forced per-step reference with
the same per-row keys, slot-count invariance, EOS at the first step and at the cap, the trainer's log-probs,
a block of rows sampled alone (`row_block`) as in the whole batch."""
import jax
import numpy as np
import pytest

from fixtures_hf import left_padded_batch, make_hf_model
from jaxrl_llm.models import forward, load_hf, token_logprobs
from jaxrl_llm.sampling import draw_tokens, generate, row_uniforms

PAD = 0
EOS_IDS = [3, 9, 17, 40, 55]  # common enough that rows stop early, rare enough that some run to the cap
B, G, T = 3, 4, 12  # N = 12 rows


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen"))
    make_hf_model(path, "qwen2", seed=1)
    return load_hf(path)


@pytest.fixture(scope="module")
def prompts():
    return left_padded_batch(np.random.default_rng(5), [5, 9, 3], 97, pad=PAD)


def _generate(qwen, prompts, slots, seed=3, **kw):
    config, params = qwen
    args = dict(max_new_tokens=T, num_samples=G, temperature=1.5, eos_ids=EOS_IDS, pad_id=PAD)
    return generate(config, params, *prompts, jax.random.PRNGKey(seed), decode_slots=slots, **{**args, **kw})


@pytest.fixture(scope="module")
def by_slots(qwen, prompts):
    return {s: _generate(qwen, prompts, s) for s in (B * G, B * G // 2, 3)}


def _reference(config, params, tokens, mask, rng, temperature, eos_ids):
    """Token by token with full teacher-forced forwards (no cache, no slots): row n of prompt n // G draws
    token t from `row_uniforms(rng, n, t)`, stops after an EOS. Returns tokens, log-probs, mask (N,T)."""
    n, p = B * G, tokens.shape[1]
    seq = np.concatenate([np.repeat(tokens, G, 0), np.full((n, T), PAD, np.int32)], 1)
    seq_mask = np.concatenate([np.repeat(mask, G, 0), np.zeros((n, T), np.int32)], 1)
    out_lp, alive = np.zeros((n, T), np.float32), np.ones(n, bool)
    for t in range(T):
        logits = forward(config, params, seq, seq_mask)[:, p + t - 1]  # right padding: causal, never seen
        new, lp, _ = draw_tokens(None, logits, temperature, 1.0, top_k=0, greedy=False, nucleus=False,
                                 uniform=row_uniforms(rng, np.arange(n), np.full(n, t)))
        seq[alive, p + t], seq_mask[alive, p + t], out_lp[alive, t] = np.asarray(new)[alive], 1, np.asarray(lp)[alive]
        alive &= ~np.isin(np.asarray(new), eos_ids)
    return np.where(seq_mask[:, p:] == 1, seq[:, p:], PAD), out_lp, seq_mask[:, p:]


def _check_semantics(r, eos_ids):
    tokens, mask, logprobs = map(np.asarray, (r.tokens, r.mask, r.logprobs))
    for n in range(tokens.shape[0]):
        is_eos = np.isin(tokens[n], eos_ids) & (mask[n] == 1)
        length = int(np.argmax(is_eos)) + 1 if is_eos.any() else tokens.shape[1]
        np.testing.assert_array_equal(mask[n], np.arange(tokens.shape[1]) < length)  # EOS included
        assert np.all(tokens[n, length:] == PAD) and np.all(logprobs[n, length:] == 0)
        assert int(r.lengths[n]) == length and bool(r.truncated[n]) == (not is_eos.any())


def test_slots_equal_teacher_forced_reference_with_the_same_row_keys(qwen, prompts, by_slots):
    config, params = qwen
    tokens, logp, mask = _reference(config, params, *prompts, jax.random.PRNGKey(3), 1.5, EOS_IDS)
    r = by_slots[3]
    np.testing.assert_array_equal(np.asarray(r.tokens), tokens)
    np.testing.assert_array_equal(np.asarray(r.mask), mask)
    np.testing.assert_allclose(np.asarray(r.logprobs), logp, atol=1e-5)
    lengths = mask.sum(1)
    assert lengths.min() < T // 2 and lengths.max() == T  # some rows end early (refills), some at the cap


def test_slot_count_invariance_and_semantics(by_slots):
    """Per-row keys: the same rollout for every slot count; each row complete and exactly as long as its
    first EOS (a row never decoded, or cut off by a refill, would break the mask / length check)."""
    ref = by_slots[B * G]
    for s, r in by_slots.items():
        _check_semantics(r, EOS_IDS)
        np.testing.assert_array_equal(np.asarray(r.tokens), np.asarray(ref.tokens), err_msg=f"S={s}")
        np.testing.assert_array_equal(np.asarray(r.mask), np.asarray(ref.mask))
        np.testing.assert_allclose(np.asarray(r.logprobs), np.asarray(ref.logprobs), atol=1e-6)
        np.testing.assert_array_equal(np.asarray(r.truncated), np.asarray(ref.truncated))
        np.testing.assert_array_equal(np.asarray(r.prompt_tokens), np.asarray(ref.prompt_tokens))
    assert np.asarray(ref.truncated).any() and not np.asarray(ref.truncated).all()


def test_greedy_slots_equal_the_static_sampler_with_eos_at_step_0(qwen, prompts):
    """Greedy draws use no key, so the static batch sampler is an independent reference. The EOS is row 0's
    first greedy token: the rows of prompt 0 end at step 0 and never take a slot."""
    static = _generate(qwen, prompts, 0, temperature=0.0, eos_ids=[2])
    eos = [int(static.tokens[0, 0]), int(static.tokens[G, 3])]
    static = _generate(qwen, prompts, 0, temperature=0.0, eos_ids=eos)
    slotted = _generate(qwen, prompts, 2, temperature=0.0, eos_ids=eos)
    np.testing.assert_array_equal(np.asarray(static.tokens), np.asarray(slotted.tokens))
    np.testing.assert_array_equal(np.asarray(static.mask), np.asarray(slotted.mask))
    np.testing.assert_allclose(np.asarray(static.logprobs), np.asarray(slotted.logprobs), atol=1e-5)
    _check_semantics(slotted, eos)
    assert np.all(np.asarray(slotted.lengths[:G]) == 1) and int(slotted.lengths[G]) == 4


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 0.9)])
def test_slot_logprobs_equal_trainer_logprobs(qwen, prompts, top_k, top_p):
    config, params = qwen
    r = _generate(qwen, prompts, 5, temperature=0.7, top_k=top_k, top_p=top_p)
    full = np.concatenate([r.prompt_tokens, r.tokens], 1)
    full_mask = np.concatenate([r.prompt_mask, r.mask], 1)
    p = r.prompt_tokens.shape[1]
    ref = token_logprobs(config, params, full[:, :-1], full_mask[:, :-1], full[:, 1:], 0.7)[:, p - 1:]
    m = np.asarray(r.mask).astype(bool)
    assert np.abs(np.asarray(ref) - np.asarray(r.logprobs))[m].max() <= 1e-4
    assert np.all(np.asarray(r.behavior_logprobs)[~m] == 0) and m.sum() > 2 * B * G


def test_scanned_decode_path_equals_unrolled(qwen, prompts, by_slots, monkeypatch):
    """Deep models scan the stacked layers (one cache write per row at `layer`): the same rollout."""
    from jaxrl_llm.models import lm
    monkeypatch.setattr(lm, "DECODE_UNROLL_MAX_LAYERS", 0)
    jax.clear_caches()
    try:
        r = _generate(qwen, prompts, 3)
    finally:
        jax.clear_caches()
    np.testing.assert_array_equal(np.asarray(r.tokens), np.asarray(by_slots[3].tokens))
    np.testing.assert_allclose(np.asarray(r.logprobs), np.asarray(by_slots[3].logprobs), atol=1e-5)


def test_one_new_token_and_bad_slot_counts(qwen, prompts):
    r = _generate(qwen, prompts, 4, max_new_tokens=1)  # no decode step at all: every row ends at the cap
    assert np.all(np.asarray(r.lengths) == 1) and r.tokens.shape == (B * G, 1)
    for bad in (-1, B * G + 1, 2.0):
        with pytest.raises(ValueError, match="decode_slots must be an int in"):
            _generate(qwen, prompts, bad)


@pytest.mark.parametrize("slots", [0, 3])
def test_a_block_of_rows_draws_what_it_draws_in_the_whole_batch(qwen, prompts, by_slots, slots):
    """`row_block`: prompts 1-2 sampled alone as rows 4..11 of the 12 (what a host of a rollout mesh across
    hosts does) equal those rows of the whole batch, for the static sampler and the slots one; without
    it the static sampler's block draws other numbers (the property the block exists for)."""
    full = by_slots[3] if slots else _generate(qwen, prompts, 0)
    block = tuple(x[1:] for x in prompts)
    alone = _generate(qwen, block, slots, row_block=(G, B * G))
    np.testing.assert_array_equal(np.asarray(alone.tokens), np.asarray(full.tokens)[G:])
    np.testing.assert_array_equal(np.asarray(alone.mask), np.asarray(full.mask)[G:])
    np.testing.assert_allclose(np.asarray(alone.logprobs), np.asarray(full.logprobs)[G:], atol=1e-6)
    if not slots:
        assert not np.array_equal(np.asarray(_generate(qwen, block, 0).tokens), np.asarray(full.tokens)[G:])
