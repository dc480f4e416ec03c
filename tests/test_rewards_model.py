"""The reward model against transformers' AutoModelForSequenceClassification: scores at the last valid
token (left and right padding), the text path (chat template, plain text, truncation), compile-once,
the registry factory, sharding, and bad input."""
import dataclasses
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from safetensors.numpy import load_file, save_file

from fixtures_data import make_tiny_tokenizer
from fixtures_hf import make_hf_model, rewrite_config
from jaxrl_llm.models import CheckpointError, value_logical_axes
from jaxrl_llm.rewards import model as rm_module
from jaxrl_llm.rewards.model import RewardModel, last_token_index
from jaxrl_llm.rewards.registry import compute_rewards, get_reward_fn

VOCAB = 300  # holds every id of the tiny tokenizer (~270), so text and token paths share one model
PAD = 0  # the checkpoints' pad_token_id; content tokens are drawn from [3, VOCAB): never equal to it
LENGTHS = [9, 3, 14, 1]
# Compilations dominate this module's time, so tests share shapes: (4, 16) for token batches, and
# texts that all render to 33..64 tokens, i.e. one (4, 64) bucket.
PROMPTS = ["What is 2 + 3?", "Name a colour.", "Say hi", "Count to five, slowly."]
COMPLETIONS = ["It is 5.", "Blue", "hi there, the friend", "one two three four five"]


def _make_seqcls(factory, variant, seed):
    path = str(factory.mktemp(f"rm_{variant}"))
    return path, make_hf_model(path, variant, head="seqcls", vocab_size=VOCAB, seed=seed)


@pytest.fixture(scope="module")
def seqcls_llama(tmp_path_factory):
    """(checkpoint dir, torch model) of a tiny random LlamaForSequenceClassification."""
    return _make_seqcls(tmp_path_factory, "llama", 1)


@pytest.fixture(scope="module")
def seqcls_qwen2(tmp_path_factory):
    return _make_seqcls(tmp_path_factory, "qwen2", 2)


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    return make_tiny_tokenizer(str(tmp_path_factory.mktemp("tok_chat")), chat_template=True)


@pytest.fixture(scope="module")
def llama_rm(seqcls_llama, chat_tokenizer):
    return RewardModel.from_pretrained(seqcls_llama[0], tokenizer=chat_tokenizer, max_length=128, batch_size=4)


def _batches(rng, lengths):
    """The same random rows left-padded and right-padded with PAD: (left, left_mask, right, right_mask)."""
    t = max(lengths) + 2  # every row padded, the longest too
    left, right = np.full((len(lengths), t), PAD, np.int32), np.full((len(lengths), t), PAD, np.int32)
    lmask, rmask = np.zeros_like(left), np.zeros_like(right)
    for i, n in enumerate(lengths):
        row = rng.integers(3, VOCAB, n)
        left[i, t - n:], lmask[i, t - n:] = row, 1
        right[i, :n], rmask[i, :n] = row, 1
    return left, lmask, right, rmask


def _hf_scores(model, tokens, mask=None):
    """transformers' own call: the pooled logit at its last non-pad token."""
    with torch.no_grad():
        kw = {} if mask is None else {"attention_mask": torch.as_tensor(mask).long()}
        out = model(input_ids=torch.as_tensor(np.asarray(tokens)).long(), **kw).logits
    assert out.shape[-1] == 1
    return out[:, 0].float().numpy()


# ------------------------------------------------------------------------------------------- parity
@pytest.fixture(params=["llama", "qwen2"])
def seqcls(request):
    return (request.param, *request.getfixturevalue(f"seqcls_{request.param}"))


def test_scores_match_transformers_left_and_right_padding(seqcls, chat_tokenizer):
    variant, path, hf = seqcls
    rm = RewardModel.from_pretrained(path, tokenizer=chat_tokenizer, max_length=32)
    left, lmask, right, rmask = _batches(np.random.default_rng(0), LENGTHS)
    ours_left, ours_right = rm.score_tokens(left, lmask), rm.score_tokens(right, rmask)
    assert ours_left.shape == (len(LENGTHS),) and ours_left.dtype == jnp.float32
    diff_left = np.abs(np.asarray(ours_left) - _hf_scores(hf, left, lmask)).max()
    diff_right = np.abs(np.asarray(ours_right) - _hf_scores(hf, right, rmask)).max()
    print(f"{variant}: max |score diff| vs transformers: left {diff_left:.1e}, right {diff_right:.1e}")
    assert diff_left <= 1e-4 and diff_right <= 1e-4
    # Each row alone, unpadded, scores what it scores in either padded batch.
    alone = np.array([_hf_scores(hf, right[i:i + 1, :n])[0] for i, n in enumerate(LENGTHS)])
    np.testing.assert_allclose(np.asarray(ours_left), alone, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(ours_right), alone, atol=1e-4, rtol=0)
    assert np.ptp(alone) > 0.1  # distinct rows score differently: the comparison has teeth


def test_score_is_the_head_at_the_last_valid_token(seqcls_llama, llama_rm):
    """Reference: transformers' head applied at every position (positions from the mask, as ours), read
    at the last mask==1 column found by a Python loop; masks with holes and an empty row included."""
    _, hf = seqcls_llama
    rng = np.random.default_rng(1)
    tokens = rng.integers(3, VOCAB, (4, 16)).astype(np.int32)
    mask = (rng.random((4, 16)) < 0.6).astype(np.int32)
    mask[2] = 0  # no valid token
    mask[3] = 1  # no padding at all
    with torch.no_grad():
        h = hf.model(input_ids=torch.as_tensor(tokens).long(), attention_mask=torch.as_tensor(mask).long(),
                     position_ids=torch.as_tensor(np.maximum(np.cumsum(mask, -1) - 1, 0))).last_hidden_state
        per_position = hf.score(h)[..., 0].numpy()  # (4, 16)
    scores = np.asarray(llama_rm.score_tokens(tokens, mask))
    last = np.asarray(last_token_index(jnp.asarray(mask)))
    for b in range(4):
        valid = [t for t in range(16) if mask[b, t]]
        assert last[b] == (valid[-1] if valid else -1)
        expected = per_position[b, valid[-1]] if valid else 0.0
        assert abs(scores[b] - expected) <= 1e-4, b


def test_pad_equal_to_eos_scores_the_last_attended_token(seqcls_llama, llama_rm):
    """Documented difference: with pad == eos and a text ending in EOS, transformers' `input_ids !=
    pad_token_id` heuristic scores the token before the EOS; we score the EOS (the mask says it is real)."""
    _, hf = seqcls_llama
    eos = 2
    row = np.random.default_rng(2).integers(3, VOCAB, 6)
    tokens = np.full((4, 16), eos, np.int32)
    mask = np.zeros_like(tokens)
    for b in (0, 2):  # left-padded with eos, ending with eos
        tokens[b, 9:15], mask[b, 9:] = row, 1
    for b in (1, 3):  # right-padded with eos, ending with eos
        tokens[b, :6], mask[b, :7] = row, 1
    ours = np.asarray(llama_rm.score_tokens(tokens, mask))
    with torch.no_grad():
        h = hf.model(input_ids=torch.as_tensor(tokens[1:2, :7]).long()).last_hidden_state
        per_position = hf.score(h)[0, :, 0].numpy()  # (7,) the head at every position of the row alone
        saved, hf.config.pad_token_id = hf.config.pad_token_id, eos
        try:
            theirs = _hf_scores(hf, tokens, mask)
        finally:
            hf.config.pad_token_id = saved
    np.testing.assert_allclose(ours, per_position[6], atol=1e-4, rtol=0)  # at the EOS
    np.testing.assert_allclose(theirs, per_position[5], atol=1e-4, rtol=0)  # transformers: before it
    assert abs(per_position[6] - per_position[5]) > 1e-3


# ------------------------------------------------------------------------------------------- text path
def _right_padded(rows, length):
    tokens, mask = np.zeros((len(rows), length), np.int32), np.zeros((len(rows), length), np.int32)
    for i, ids in enumerate(rows):
        tokens[i, :len(ids)], mask[i, :len(ids)] = ids, 1
    return tokens, mask


def test_call_with_chat_template_equals_the_token_path(seqcls_llama, llama_rm, chat_tokenizer):
    _, hf = seqcls_llama
    tok = chat_tokenizer
    scores = llama_rm(PROMPTS, COMPLETIONS, answer=["5", "x", "y", "z"])  # unknown columns are ignored
    assert isinstance(scores, list) and len(scores) == len(PROMPTS) and all(type(s) is float for s in scores)
    # The direct path, written out: render with the template (no generation prompt), tokenize without
    # special tokens (the template writes BOS), right-pad (the text path left-pads), score.
    rows = []
    for p, c in zip(PROMPTS, COMPLETIONS):
        text = tok.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": c}],
                                       tokenize=False, add_generation_prompt=False)
        assert text == f"<s><|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n{c}<|im_end|>\n"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
        rows.append(ids)
    assert 32 < max(map(len, rows)) <= 64  # one bucket: the shape is shared with other tests
    direct = np.asarray(llama_rm.score_tokens(*_right_padded(rows, 64)))
    np.testing.assert_allclose(scores, direct, atol=1e-5, rtol=0)
    np.testing.assert_allclose(scores, [_hf_scores(hf, [ids])[0] for ids in rows], atol=1e-4, rtol=0)
    # Row order does not matter (rows are sorted by length internally).
    perm = [2, 0, 3, 1]
    again = llama_rm([PROMPTS[i] for i in perm], [COMPLETIONS[i] for i in perm])
    np.testing.assert_allclose(again, [scores[i] for i in perm], atol=1e-5, rtol=0)


def test_call_without_template_scores_the_plain_concatenation(seqcls_llama, llama_rm, tmp_path):
    tok = make_tiny_tokenizer(str(tmp_path / "tok"), chat_template=False, add_bos=True)
    rm = RewardModel.from_pretrained(seqcls_llama[0], tokenizer=str(tmp_path / "tok"), max_length=64, batch_size=4)
    assert not rm.use_chat and rm.prepend_bos
    scores = rm(PROMPTS, COMPLETIONS)
    rows = [[tok.bos_token_id] + tok(p + c, add_special_tokens=False)["input_ids"]
            for p, c in zip(PROMPTS, COMPLETIONS)]
    assert 32 < max(map(len, rows)) <= 64
    np.testing.assert_allclose(scores, np.asarray(rm.score_tokens(*_right_padded(rows, 64))), atol=1e-5, rtol=0)
    # The chat template renders different text, hence different scores.
    assert np.abs(np.array(llama_rm(PROMPTS, COMPLETIONS)) - scores).max() > 1e-3


def test_long_rows_keep_their_last_tokens_and_bos(llama_rm, chat_tokenizer, caplog):
    rm = dataclasses.replace(llama_rm, max_length=64)
    prompts, completions = [PROMPTS[0], PROMPTS[1]], ["the answer is in the end " * 8 + "42", "ok"]
    ids, cut = rm.encode(prompts, completions)
    assert cut == 1 and len(ids[0]) == 64 and len(ids[1]) < 64
    text = chat_tokenizer.apply_chat_template([{"role": "user", "content": prompts[0]},
                                               {"role": "assistant", "content": completions[0]}], tokenize=False)
    full = chat_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(full) > 64 and ids[0] == [full[0]] + full[-63:]  # BOS in front, then the last 63 tokens
    assert ids[1] == llama_rm.encode(prompts[1:], completions[1:])[0][0]  # a short row is untouched
    with caplog.at_level(logging.WARNING, logger=rm_module.__name__):
        scores = rm(prompts, completions)
    assert "1 of 2 rows longer than max_length=64" in caplog.text
    direct = np.asarray(rm.score_tokens(*_right_padded(ids + ids, 64)))  # (4, 64): shape shared
    np.testing.assert_allclose(scores, direct[:2], atol=1e-5, rtol=0)


def test_equal_shapes_compile_once(llama_rm, monkeypatch):
    """`hidden_states` runs only while jit traces: count its calls. (3, 64) is used by no other test."""
    traces = []
    original = rm_module.hidden_states
    monkeypatch.setattr(rm_module, "hidden_states", lambda *a, **k: traces.append(1) or original(*a, **k))
    rng = np.random.default_rng(3)
    for _ in range(3):
        llama_rm.score_tokens(rng.integers(3, VOCAB, (3, 64)), (rng.random((3, 64)) < 0.8).astype(np.int32))
    assert len(traces) == 1
    # The text path pads every batch to (batch_size, bucket): texts of the 64 bucket, a full batch and a
    # batch with filler rows, reuse that one compilation.
    rm = dataclasses.replace(llama_rm, batch_size=3)
    rm(PROMPTS[:3], COMPLETIONS[:3])
    rm(PROMPTS + ["Say it again"], COMPLETIONS + ["one two three"])
    assert len(traces) == 1


# ------------------------------------------------------------------------------------------- registry, sharding
def test_registry_factory(seqcls_llama, llama_rm, chat_tokenizer, tmp_path):
    tok_dir = str(tmp_path / "tok")
    chat_tokenizer.save_pretrained(tok_dir)
    name, fn = get_reward_fn("reward_model", path=seqcls_llama[0], tokenizer=tok_dir, max_length=64, batch_size=4)
    assert name == "reward_model" and isinstance(fn, RewardModel) and fn.batch_size == 4
    expected = llama_rm(PROMPTS, COMPLETIONS)
    scores, metrics = compute_rewards([(name, fn, 2.0)], PROMPTS, COMPLETIONS, {"answer": ["1"] * 4})
    assert scores.dtype == np.float32
    np.testing.assert_allclose(scores, 2.0 * np.array(expected), atol=1e-5, rtol=0)
    assert abs(metrics["reward/reward_model/mean"] - float(np.mean(expected))) <= 1e-5
    # The import path resolves to the same factory; a misspelt option is a one-line error.
    name, fn = get_reward_fn("jaxrl_llm.rewards.model:reward_model", path=seqcls_llama[0], tokenizer=tok_dir,
                             dtype="float32", max_length=64)
    assert name == "reward_model" and isinstance(fn, RewardModel)
    with pytest.raises(ValueError, match="unknown option.*max_len"):
        get_reward_fn("reward_model", path=seqcls_llama[0], max_len=64)


def test_mesh_placement_rules_and_explicit_shardings(seqcls_llama, llama_rm, chat_tokenizer):
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "tensor"))
    rules = [("batch", "data"), ("mlp", "tensor"), ("heads", "tensor"), ("vocab", "tensor")]
    left, lmask, _, _ = _batches(np.random.default_rng(4), LENGTHS)
    expected = np.asarray(llama_rm.score_tokens(left, lmask))
    replicated = RewardModel.from_pretrained(seqcls_llama[0], tokenizer=chat_tokenizer, max_length=64, mesh=mesh)
    ruled = RewardModel.from_pretrained(seqcls_llama[0], tokenizer=chat_tokenizer, max_length=64, mesh=mesh,
                                        rules=rules, batch_size=4)
    for rm, gate_spec in ((replicated, PartitionSpec()), (ruled, PartitionSpec(None, None, "tensor"))):
        gate = rm.params["backbone"]["layers"]["gate_proj"]["kernel"]  # logical (layers, embed, mlp)
        assert isinstance(gate.sharding, NamedSharding) and gate.sharding.spec == gate_spec
        assert all(isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
                   for x in jax.tree_util.tree_leaves(rm.params))
    assert replicated.input_sharding.spec == PartitionSpec()
    assert ruled.input_sharding.spec == PartitionSpec("data", None)
    np.testing.assert_allclose(np.asarray(ruled.score_tokens(left, lmask)), expected, atol=1e-6, rtol=0)
    # An explicit pytree of shardings wins over mesh and rules.
    explicit = jax.tree_util.tree_map(lambda x: x.sharding, ruled.params)
    rm = RewardModel.from_pretrained(seqcls_llama[0], tokenizer=chat_tokenizer, max_length=64, shardings=explicit)
    assert jax.tree_util.tree_map(lambda x: x.sharding, rm.params) == explicit
    np.testing.assert_allclose(np.asarray(rm.score_tokens(left, lmask)), expected, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------- bad input
def _copy(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def test_causal_lm_directory_is_refused(tmp_path, chat_tokenizer):
    path = str(tmp_path / "causal")
    make_hf_model(path, "llama", head="causal")
    with pytest.raises(ValueError, match=r"config\.json: architectures \['LlamaForCausalLM'\] is a causal LM"):
        RewardModel.from_pretrained(path, tokenizer=chat_tokenizer)
    rewrite_config(path, architectures=None)  # no architectures to go by: the tensors tell
    with pytest.raises(CheckpointError, match=r"no tensor score\.weight \(it holds lm_head\.weight: a causal LM\)"):
        RewardModel.from_pretrained(path, tokenizer=chat_tokenizer)


def test_checkpoint_without_one_label_score_is_refused(seqcls_llama, tmp_path, chat_tokenizer):
    labels = _copy(seqcls_llama[0], tmp_path / "labels")
    rewrite_config(labels, id2label={"0": "bad", "1": "good"}, label2id={"bad": 0, "good": 1})
    with pytest.raises(ValueError, match=r"config\.json: num_labels=2; a reward model has exactly one label"):
        RewardModel.from_pretrained(labels, tokenizer=chat_tokenizer)

    two_rows = _copy(seqcls_llama[0], tmp_path / "two_rows")
    file = os.path.join(two_rows, "model.safetensors")
    tensors = load_file(file)
    tensors["score.weight"] = np.concatenate([tensors["score.weight"]] * 2)
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"tensor score\.weight has shape \(2, 32\); a reward model has one"):
        RewardModel.from_pretrained(two_rows, tokenizer=chat_tokenizer)

    no_score = _copy(seqcls_llama[0], tmp_path / "no_score")
    file = os.path.join(no_score, "model.safetensors")
    tensors = load_file(file)
    del tensors["score.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"no_score: no tensor score\.weight; a reward model is"):
        RewardModel.from_pretrained(no_score, tokenizer=chat_tokenizer)
    with pytest.raises(FileNotFoundError, match="reward model path .*missing' is not a directory"):
        RewardModel.from_pretrained(str(tmp_path / "missing"), tokenizer=chat_tokenizer)


def test_hub_names_are_downloaded_once_then_loaded(seqcls_llama, chat_tokenizer, monkeypatch):
    """A name that is not a local path goes to `snapshot_download` (stubbed: no network in tests)."""
    import huggingface_hub
    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda name, **kw: calls.append(name) or seqcls_llama[0])
    rm = RewardModel.from_pretrained("org/tiny-rm", tokenizer=chat_tokenizer, max_length=64)
    assert calls == ["org/tiny-rm"] and rm.config.vocab_size == VOCAB

    def offline(name, **kw):
        raise OSError("We couldn't connect to\n'https://huggingface.co'")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(FileNotFoundError, match=r"'org/tiny-rm' is neither a local directory nor a downloadable "
                                                r"hub model \(We couldn't connect to 'https://huggingface.co'\)"):
        RewardModel.from_pretrained("org/tiny-rm", tokenizer=chat_tokenizer)


def test_bad_arguments(seqcls_llama, llama_rm, chat_tokenizer, tmp_path):
    path = seqcls_llama[0]
    cases = [
        (dict(batch_size=0), "batch_size must be a positive int"),
        (dict(max_length=2.5), "max_length must be a positive int"),
        (dict(use_chat_template="yes"), "use_chat_template must be 'auto', True or False"),
        (dict(rules=[("batch", "data")]), "rules need a mesh"),
        (dict(shardings={"backbone": None}), "shardings must be a pytree of jax.sharding.Sharding"),
        (dict(shardings=value_logical_axes(llama_rm.config)), "shardings must be a pytree of jax.sharding.Sharding"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            RewardModel.from_pretrained(path, tokenizer=chat_tokenizer, **kwargs)
    no_template = make_tiny_tokenizer(str(tmp_path / "plain"), chat_template=False, add_bos=False)
    with pytest.raises(ValueError, match="use_chat_template=True but tokenizer .* has no chat template"):
        RewardModel.from_pretrained(path, tokenizer=no_template, use_chat_template=True)
    small_vocab = str(tmp_path / "small")
    make_hf_model(small_vocab, "qwen2", head="seqcls")  # vocab 97 < the tokenizer's pad id
    with pytest.raises(ValueError, match=r"pad id \d+ is outside the model's vocabulary \(vocab_size=97\)"):
        RewardModel.from_pretrained(small_vocab, tokenizer=chat_tokenizer)

    tokens = np.full((2, 4), 5, np.int32)
    with pytest.raises(ValueError, match=r"tokens and mask must both be \(B, T\)"):
        llama_rm.score_tokens(tokens, tokens[:, :3])
    with pytest.raises(ValueError, match="tokens must be integer ids"):
        llama_rm.score_tokens(tokens.astype(np.float32), tokens)
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 300\)"):
        llama_rm.score_tokens(tokens + VOCAB, tokens)
    with pytest.raises(ValueError, match="prompts has 2 rows but completions has 1"):
        llama_rm(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="completions must be a list of strings"):
        llama_rm(["a"], [3])
    plain = RewardModel.from_pretrained(path, tokenizer=no_template, max_length=64)
    with pytest.raises(ValueError, match="row 1: prompt and completion render to no tokens"):
        plain(["a", ""], ["b", ""])
