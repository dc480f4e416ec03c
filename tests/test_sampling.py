"""The group sampler: greedy parity with transformers, log-prob convention, distribution, EOS semantics."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fixtures_hf import left_padded_batch, make_hf_model
from jaxrl_llm.models import ModelConfig, forward, load_hf, token_logprobs
from jaxrl_llm.models.lm import decode_unrolled as lm_decode_unrolled
from jaxrl_llm.sampling import generate_program, generate

EOS, PAD = 2, 0


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    hf = make_hf_model(path, request.param)
    config, params = load_hf(path)
    return hf, config, params


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen"))
    make_hf_model(path, "qwen2", seed=1)
    return load_hf(path)


def _prompts(seed=0, lengths=(5, 9, 3)):
    return left_padded_batch(np.random.default_rng(seed), list(lengths), 97, pad=PAD)


def _trainer_logprob_gap(config, params, rollout, temperature):
    """Max |sampler log-prob - trainer `token_logprobs`| over the rollout's valid tokens, the trainer
    recomputing teacher-forced on [prompt ; completion]."""
    full = np.concatenate([rollout.prompt_tokens, rollout.tokens], 1)
    full_mask = np.concatenate([rollout.prompt_mask, rollout.mask], 1)
    p = rollout.prompt_tokens.shape[1]
    ref = token_logprobs(config, params, full[:, :-1], full_mask[:, :-1], full[:, 1:], temperature)[:, p - 1:]
    m = np.asarray(rollout.mask).astype(bool)
    return float(np.abs(np.asarray(ref) - np.asarray(rollout.logprobs))[m].max())


def _hf_greedy(hf, tokens, mask, max_new_tokens, eos):
    import torch
    with torch.no_grad():
        out = hf.generate(input_ids=torch.as_tensor(tokens).long(), attention_mask=torch.as_tensor(mask).long(),
                          do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=PAD,
                          min_new_tokens=0)
    return out[:, tokens.shape[1]:].numpy()


def test_greedy_equals_transformers_generate(model):
    hf, config, params = model
    tokens, mask = _prompts()
    T = 12
    # First with an EOS that never occurs, then with one taken from the middle of row 0's greedy
    # output, so transformers and we both stop that row early and pad it.
    free = _hf_greedy(hf, tokens, mask, T, eos=EOS)
    for eos in (EOS, int(free[0, 4])):
        ref = _hf_greedy(hf, tokens, mask, T, eos=eos)
        r = generate(config, params, tokens, mask, jax.random.PRNGKey(0), max_new_tokens=T, temperature=0.0,
                     eos_ids=[eos], pad_id=PAD)
        ours = np.asarray(r.tokens)
        ref = np.pad(ref, ((0, 0), (0, T - ref.shape[1])), constant_values=PAD)  # HF stops when all rows end
        np.testing.assert_array_equal(ours, ref)
    assert int(r.lengths[0]) <= 5 and not bool(r.truncated[0])


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 5, 0.9)])
def test_sampler_logprobs_equal_trainer_logprobs(qwen, temperature, top_k, top_p):
    config, params = qwen
    tokens, mask = _prompts(1)
    r = generate(config, params, tokens, mask, jax.random.PRNGKey(1), max_new_tokens=10, num_samples=4,
                 temperature=temperature, top_k=top_k, top_p=top_p, eos_ids=[EOS, 7, 11], pad_id=PAD)
    assert _trainer_logprob_gap(config, params, r, temperature) <= 1e-4
    assert np.all(np.asarray(r.logprobs)[~np.asarray(r.mask).astype(bool)] == 0)


def test_sampler_logprobs_equal_trainer_logprobs_with_blockwise_attention(qwen):
    """model.attention=blockwise in the sampler's prefill and the trainer's pass (tiles of 4 tokens)."""
    config, params = qwen
    config = config.replace(attention="blockwise", attention_block=4)
    tokens, mask = _prompts(1)
    r = generate(config, params, tokens, mask, jax.random.PRNGKey(1), max_new_tokens=10, num_samples=4,
                 temperature=0.7, eos_ids=[EOS, 7, 11], pad_id=PAD)
    assert _trainer_logprob_gap(config, params, r, 0.7) <= 1e-4


def test_decode_unrolls_small_models_and_on_cpu_large_layers(monkeypatch):
    """`lm.decode_unrolled`, hand-worked at the benchmark shapes (float32 layer weights): on CPU SmolLM2-135M's
    30 layers of 14 MB and Qwen2.5-0.5B's 24 layers of 60 MB unroll (0.4 and 1.43 GB of copies <= 2 GiB),
    but not on another backend; Qwen2.5-1.5B's 5.2 GB do not; a deep model of small layers (30 of 3.4 MB)
    scans; a model of at most 8 layers and 256 MiB unrolls anywhere."""
    from jaxrl_llm.models import lm
    smol = ModelConfig(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                       num_heads=9, num_kv_heads=3, head_dim=64, tie_word_embeddings=True)
    qwen05 = ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                         num_kv_heads=2, head_dim=64, qkv_bias=True, tie_word_embeddings=True)
    qwen15 = qwen05.replace(hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12, head_dim=128)
    layer_mb = lambda c: (c.num_params() - c.vocab_size * c.hidden_size - c.hidden_size) * 4 / c.num_layers / 2 ** 20
    assert 13 < layer_mb(smol) < 14 and 56 < layer_mb(qwen05) < 57 and 178 < layer_mb(qwen15) < 179
    cases = (smol, qwen05, qwen15, smol.replace(num_layers=8), smol.replace(num_layers=9),
             qwen05.replace(num_layers=5),  # 285 MiB: past the small-model bound, but its layers are large
             qwen05.replace(param_dtype="bfloat16"),  # 28 MiB a layer
             smol.replace(param_dtype="bfloat16"),  # 6.7 MiB a layer: scanned
             smol.replace(hidden_size=288, intermediate_size=768, num_heads=6, num_kv_heads=2, head_dim=48))  # 3.4 MB
    assert jax.default_backend() == "cpu"
    assert [lm.decode_unrolled(c) for c in cases] == [True, True, False, True, True, True, True, False, False]
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert [lm.decode_unrolled(c) for c in cases] == [False, False, False, True, False, False, False, False, False]


def test_scanned_decode_path_equals_unrolled(qwen, monkeypatch):
    """Deep or large models decode with a scan over the stacked layers (`lm.decode_unrolled` False) instead
    of the unrolled per-layer loop of small ones: same rollouts, and log-probs equal to the trainer's."""
    from jaxrl_llm.models import lm
    config, params = qwen
    tokens, mask = _prompts(2)
    kw = dict(max_new_tokens=9, num_samples=3, eos_ids=[EOS, 7], pad_id=PAD)
    runs = {}
    for path in ("unrolled", "scanned"):
        if path == "scanned":
            monkeypatch.setattr(lm, "DECODE_UNROLL_MAX_LAYERS", 0)
        assert lm.decode_unrolled(config) == (path == "unrolled")
        jax.clear_caches()  # the jitted sampler's trace depends on the path
        runs[path] = [generate(config, params, tokens, mask, jax.random.PRNGKey(3), temperature=t, **kw)
                      for t in (0.0, 1.0)]
    jax.clear_caches()  # no scanned trace left behind for the other tests of this worker
    for a, b in zip(runs["unrolled"], runs["scanned"]):
        np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
        np.testing.assert_array_equal(np.asarray(a.mask), np.asarray(b.mask))
        np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)
    r = runs["scanned"][1]
    assert int(np.asarray(r.mask).sum()) > 9 and _trainer_logprob_gap(config, params, r, 1.0) <= 1e-4


def _decode_dot_shapes(config, params, tokens, mask, rng, **kw):
    """Result shapes of the 2-D matmuls of the compiled sampler's decode loop (its layers and LM head), the
    program `generate(config, params, tokens, mask, rng, temperature=1.0, **kw)` runs (its compilation reused)."""
    f32, i32 = jnp.float32, lambda a: jnp.asarray(a, jnp.int32)
    text = generate_program.lower(
        config, params, i32(tokens), i32(mask), rng, f32(1.0), f32(1.0), f32(1.0), f32(0.0),
        max_new_tokens=kw["max_new_tokens"], num_samples=kw["num_samples"], top_k=0, greedy=False, nucleus=False,
        eos_ids=tuple(kw["eos_ids"]), pad_id=kw["pad_id"], penalize=False, use_min_p=False).compile().as_text()
    dots = [line for line in text.splitlines() if " dot(" in line and "batch_dims" not in line
            and re.search(r"while/body/(layers|lm_head)/", line)]
    return [tuple(int(d) for d in re.search(r"= f32\[(\d+),(\d+)\]", line).groups()) for line in dots]


@pytest.mark.parametrize("variant", ["qwen3", "qwen2"])  # tied embeddings and q/k norms; untied, q/k/v biases
def test_decode_with_weights_on_left_equals_x_times_w(variant, tmp_path, monkeypatch):
    """On CPU the decode step multiplies with the weights as the left operand, (out,in) @ x.T (models/decode.py
    `weights_on_left`: the fused per-layer copies laid out (out,in), and a tied LM head on the (V,D) table),
    the form XLA:CPU runs fastest at a few rows -- and the compiled loop keeps it: XLA rewrites transpose(W @
    x.T) into x @ W.T unless a barrier stops it, so every layer and LM-head matmul must give (out, N).
    Other backends keep x @ W: the same rollouts, log-probs equal to each other and to the trainer's."""
    import jaxrl_llm.models.decode as decode
    make_hf_model(str(tmp_path), variant, seed=2)
    config, params = load_hf(str(tmp_path))
    tokens, mask = _prompts(4)
    n, rng = 6, jax.random.PRNGKey(5)  # 3 prompts x 2
    kw = dict(max_new_tokens=9, num_samples=2, eos_ids=[EOS, 7], pad_id=PAD)
    assert decode.weights_on_left() and lm_decode_unrolled(config)
    runs = {"left": generate(config, params, tokens, mask, rng, temperature=1.0, **kw)}
    left_shapes = _decode_dot_shapes(config, params, tokens, mask, rng, **kw)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # the tiny model stays unrolled
    jax.clear_caches()
    assert not decode.weights_on_left() and lm_decode_unrolled(config)
    runs["right"] = generate(config, params, tokens, mask, rng, temperature=1.0, **kw)
    right_shapes = _decode_dot_shapes(config, params, tokens, mask, rng, **kw)
    jax.clear_caches()
    # 4 matmuls a layer (qkv, o, gate|up, down) and the LM head, as (rows, cols) of their results
    head_left = config.tie_word_embeddings  # an untied (D,V) head keeps x @ W: no copy of it
    assert len(left_shapes) == 4 * config.num_layers + 1 == len(right_shapes)
    assert all(r == n for o, r in left_shapes if (o, r) != (n, config.vocab_size) or head_left), left_shapes
    assert ((config.vocab_size, n) in left_shapes) == head_left
    assert all(o == n for o, r in right_shapes), right_shapes  # (N, out) everywhere
    outs = lambda shapes: sorted(r if o == n else o for o, r in shapes)
    assert outs(left_shapes) == outs(right_shapes)
    assert set(outs(left_shapes)) == {config.hidden_size, 2 * config.intermediate_size, config.vocab_size,
                                      (config.num_heads + 2 * config.num_kv_heads) * config.head_dim}
    a, b = runs["left"], runs["right"]
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)
    assert _trainer_logprob_gap(config, params, a, 1.0) <= 1e-4 and int(np.asarray(a.mask).sum()) > 9


def _first_token_probs(config, params, tokens, mask, temperature):
    logits = np.asarray(forward(config, params, tokens, mask)[0, -1], np.float64) / temperature
    p = np.exp(logits - logits.max())
    return p / p.sum()


def _chi_square_ok(counts, probs, z=3.719):  # z for p = 1e-4: a fixed seed, essentially never flaky
    n = counts.sum()
    expected = probs * n
    big = expected >= 5  # merge the sparse bins into one
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    stat = np.sum((obs[keep] - exp[keep]) ** 2 / exp[keep])
    k = keep.sum() - 1
    critical = k * (1 - 2 / (9 * k) + z * np.sqrt(2 / (9 * k))) ** 3  # Wilson-Hilferty
    return stat, critical


def _first_tokens(config, params, tokens, mask, n, seed, **kw):
    r = generate(config, params, tokens, mask, jax.random.PRNGKey(seed), max_new_tokens=1, num_samples=n,
                 eos_ids=[EOS], pad_id=PAD, **kw)
    return np.asarray(r.tokens[:, 0])


def test_first_token_frequencies_match_softmax(qwen):
    config, params = qwen
    tokens, mask = _prompts(2, lengths=(6,))
    probs = _first_token_probs(config, params, tokens, mask, 0.8)
    drawn = _first_tokens(config, params, tokens, mask, 4096, 0, temperature=0.8)
    stat, critical = _chi_square_ok(np.bincount(drawn, minlength=config.vocab_size), probs)
    assert stat < critical, (stat, critical)
    # top-k: only the k most likely tokens, with their renormalized probabilities.
    drawn = _first_tokens(config, params, tokens, mask, 4096, 1, temperature=0.8, top_k=5)
    top5 = np.argsort(-probs)[:5]
    assert set(drawn) <= set(top5)
    renorm = np.zeros_like(probs)
    renorm[top5] = probs[top5] / probs[top5].sum()
    stat, critical = _chi_square_ok(np.bincount(drawn, minlength=config.vocab_size), renorm)
    assert stat < critical, (stat, critical)


def test_top_k_1_is_greedy_and_nucleus_stays_in_nucleus(qwen):
    config, params = qwen
    tokens, mask = _prompts(3)
    kw = dict(max_new_tokens=8, eos_ids=[EOS], pad_id=PAD)
    greedy = generate(config, params, tokens, mask, jax.random.PRNGKey(0), temperature=0.0, **kw)
    top1 = generate(config, params, tokens, mask, jax.random.PRNGKey(5), temperature=0.9, top_k=1, **kw)
    np.testing.assert_array_equal(greedy.tokens, top1.tokens)

    tokens, mask = _prompts(4, lengths=(7,))
    probs = _first_token_probs(config, params, tokens, mask, 1.0)
    order = np.argsort(-probs)
    for top_p in (0.3, 0.6):
        mass_before = np.cumsum(probs[order]) - probs[order]
        nucleus = set(order[mass_before < top_p])
        drawn = set(_first_tokens(config, params, tokens, mask, 2048, 2, temperature=1.0, top_p=top_p))
        assert len(nucleus) > 1 and len(nucleus) < 0.5 * config.vocab_size  # a test that can fail
        assert drawn <= nucleus and len(drawn) > 1


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.6), (6, 0.7)])
def test_behaviour_logprobs_are_the_drawn_frequencies(qwen, top_k, top_p):
    """With top-k/top-p on, the reported behaviour probability of each drawn token is the frequency
    with which it is drawn (chi-square over many draws), the full-vocabulary log-prob stays the
    trainer's, and the two differ by exactly the log of the kept mass."""
    config, params = qwen
    tokens, mask = _prompts(5, lengths=(6,))
    r = generate(config, params, tokens, mask, jax.random.PRNGKey(7), max_new_tokens=1, num_samples=4096,
                 eos_ids=[EOS], pad_id=PAD, temperature=0.9, top_k=top_k, top_p=top_p)
    drawn, behaviour, full = (np.asarray(x[:, 0]) for x in (r.tokens, r.behavior_logprobs, r.logprobs))
    reported = np.zeros(config.vocab_size)
    for tok in np.unique(drawn):  # one probability per token, whichever row drew it
        assert np.ptp(behaviour[drawn == tok]) < 1e-5
        reported[tok] = np.exp(behaviour[drawn == tok][0])
    probs = _first_token_probs(config, params, tokens, mask, 0.9)
    np.testing.assert_allclose(full, np.log(probs[drawn]), atol=1e-4)  # the trainer's convention
    kept_mass = np.exp(full - behaviour)  # p_full / p_behaviour: the same for every drawn token
    assert np.ptp(kept_mass) < 1e-4 and 0.05 < kept_mass[0] < 0.999
    assert reported.sum() == pytest.approx(1.0, abs=0.02)  # every kept token was drawn at least once
    stat, critical = _chi_square_ok(np.bincount(drawn, minlength=config.vocab_size), reported / reported.sum())
    assert stat < critical, (stat, critical)


def test_behaviour_logprobs_equal_logprobs_without_truncation_and_zero_for_greedy(qwen):
    config, params = qwen
    tokens, mask = _prompts(6)
    kw = dict(max_new_tokens=6, num_samples=3, eos_ids=[EOS], pad_id=PAD)
    r = generate(config, params, tokens, mask, jax.random.PRNGKey(1), temperature=0.8, **kw)
    np.testing.assert_array_equal(r.behavior_logprobs, r.logprobs)
    g = generate(config, params, tokens, mask, jax.random.PRNGKey(1), temperature=0.0, **kw)
    assert not np.any(np.asarray(g.behavior_logprobs))


def _check_semantics(r, eos_ids, pad_id):
    tokens, mask, logprobs = map(np.asarray, (r.tokens, r.mask, r.logprobs))
    for n in range(tokens.shape[0]):
        is_eos = np.isin(tokens[n], eos_ids) & (mask[n] == 1)
        length = int(np.argmax(is_eos)) + 1 if is_eos.any() else tokens.shape[1]
        np.testing.assert_array_equal(mask[n], np.arange(tokens.shape[1]) < length)  # EOS included
        assert np.all(tokens[n, length:] == pad_id) and np.all(logprobs[n, length:] == 0)
        assert not np.isin(tokens[n, :length - 1], eos_ids).any()
        assert int(r.lengths[n]) == length and bool(r.truncated[n]) == (not is_eos.any())


def test_eos_pad_mask_lengths_truncated(qwen):
    config, params = qwen
    tokens, mask = _prompts(5)
    eos_ids = [3, 9, 17, 40, 55]  # common enough that some rows stop early, others run to T
    r = generate(config, params, tokens, mask, jax.random.PRNGKey(3), max_new_tokens=16, num_samples=8,
                 temperature=1.5, eos_ids=eos_ids, pad_id=PAD)
    _check_semantics(r, eos_ids, PAD)
    lengths = np.asarray(r.lengths)
    assert lengths.min() < 16 and np.asarray(r.truncated).any() and r.tokens.shape == (24, 16)
    np.testing.assert_array_equal(r.prompt_tokens, np.repeat(tokens, 8, 0))


def test_eos_on_first_step_and_pad_equal_to_eos(qwen):
    config, params = qwen
    tokens, mask = _prompts(6)
    first = np.asarray(generate(config, params, tokens, mask, jax.random.PRNGKey(0), max_new_tokens=1,
                                temperature=0.0, eos_ids=[EOS], pad_id=PAD).tokens[:, 0])
    eos = int(first[0])
    for pad in (PAD, eos):  # pad == eos must not drop the EOS from the mask
        r = generate(config, params, tokens, mask, jax.random.PRNGKey(0), max_new_tokens=6, temperature=0.0,
                     eos_ids=[eos], pad_id=pad)
        _check_semantics(r, [eos], pad)
        assert int(r.lengths[0]) == 1 and int(r.mask[0, 0]) == 1 and not bool(r.truncated[0])
        assert int(r.tokens[0, 0]) == eos


def test_rng_determinism_and_group_diversity(qwen):
    config, params = qwen
    tokens, mask = _prompts(7)
    kw = dict(max_new_tokens=8, num_samples=4, eos_ids=[EOS], pad_id=PAD)
    a = generate(config, params, tokens, mask, jax.random.PRNGKey(11), **kw)
    b = generate(config, params, tokens, mask, jax.random.PRNGKey(11), **kw)
    c = generate(config, params, tokens, mask, jax.random.PRNGKey(12), **kw)
    jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)
    assert not np.array_equal(a.tokens, c.tokens)
    rows = np.asarray(a.tokens).reshape(3, 4, -1)
    for group in rows:
        assert len({tuple(r) for r in group}) == 4  # the G rows of one prompt are different samples


def test_no_retrace_for_same_shapes(qwen):
    config, params = qwen
    tokens, mask = _prompts(8)
    kw = dict(max_new_tokens=5, num_samples=2, eos_ids=[EOS], pad_id=PAD)
    generate(config, params, tokens, mask, jax.random.PRNGKey(0), temperature=1.0, **kw)
    before = generate_program._cache_size()
    for i, (temperature, top_p) in enumerate([(0.7, 1.0), (1.3, 1.0), (0.5, 1.0)]):
        generate(config, params, tokens + 1, mask, jax.random.PRNGKey(i), temperature=temperature, top_p=top_p, **kw)
    assert generate_program._cache_size() == before


@pytest.mark.parametrize("kwargs,message", [
    (dict(max_new_tokens=300), "exceeds the model's max_position_embeddings"),
    (dict(num_samples=0), "num_samples must be an int >= 1"),
    (dict(temperature=-0.1), "temperature must be >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(top_k=-1), "top_k must be an int >= 0"),
    (dict(max_new_tokens=0), "max_new_tokens must be an int >= 1"),
    (dict(eos_ids=[]), "eos_ids must name at least one"),
    (dict(eos_ids=[1000]), "outside the vocabulary"),
])
def test_bad_input_raises_before_compiling(qwen, kwargs, message):
    config, params = qwen
    tokens, mask = _prompts(9)
    args = {**dict(max_new_tokens=4, eos_ids=[EOS], pad_id=PAD), **kwargs}
    with pytest.raises(ValueError, match=message):
        generate(config, params, tokens, mask, jax.random.PRNGKey(0), **args)


def test_bad_shapes_and_dtypes(qwen):
    config, params = qwen
    tokens, mask = _prompts(10)
    kw = dict(max_new_tokens=4, eos_ids=[EOS], pad_id=PAD)
    with pytest.raises(ValueError, match="prompt_mask shape"):
        generate(config, params, tokens, mask[:, 1:], jax.random.PRNGKey(0), **kw)
    with pytest.raises(ValueError, match="prompts must be integer token ids"):
        generate(config, params, tokens.astype(np.float32), mask, jax.random.PRNGKey(0), **kw)
    with pytest.raises(ValueError, match=r"prompts must be \(B, P\)"):
        generate(config, params, tokens[0], mask[0], jax.random.PRNGKey(0), **kw)
