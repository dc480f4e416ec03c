"""The built-in character tokenizer and `load_tokenizer`."""

import time

import numpy as np
import pytest
import transformers

from jaxrl_llm.data import builtin_tokenizer, has_chat_template, load_tokenizer
from jaxrl_llm.data.tokenizer import BUILTIN_ALPHABET
from fixtures_data import make_tiny_tokenizer


def test_builtin_layout_and_special_tokens():
    tok = builtin_tokenizer()
    assert isinstance(tok, transformers.PreTrainedTokenizerFast)
    assert (tok.pad_token, tok.eos_token, tok.bos_token) == ("<pad>", "<eos>", "<bos>")
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    # Characters follow the specials in alphabet order: digits first.
    assert tok.convert_ids_to_tokens(list(range(3, 13))) == list("0123456789")
    expected = {c: 3 + i for i, c in enumerate(BUILTIN_ALPHABET)}
    assert {c: tok.convert_tokens_to_ids(c) for c in BUILTIN_ALPHABET} == expected
    for c in "+-*/=().,:;?!<>#_'\"[]{}\\^$% \n":
        assert c in BUILTIN_ALPHABET
    assert len(tok) == len(BUILTIN_ALPHABET) + 4
    assert not has_chat_template(tok)


def test_builtin_round_trip_one_token_per_character():
    tok = builtin_tokenizer()
    rng = np.random.default_rng(0)
    samples = [BUILTIN_ALPHABET, "  two  spaces ", "\n\nlines\n", "12 + 30 = 42.", "<eos> is text here"]
    samples += ["".join(rng.choice(list(BUILTIN_ALPHABET), size=n)) for n in (1, 7, 64, 300)]
    for s in samples:
        ids = tok.encode(s)
        # Independent reference: the documented id of each character, no special token added.
        assert ids == [3 + BUILTIN_ALPHABET.index(c) for c in s]
        assert tok.decode(ids) == s
        assert tok(s)["input_ids"] == ids
    assert tok.decode([2, *tok.encode("a b"), 1, 0], skip_special_tokens=True) == "a b"


def test_builtin_unknown_character_maps_to_unk():
    tok = builtin_tokenizer()
    ids = tok.encode("aé")
    assert ids == [tok.convert_tokens_to_ids("a"), tok.unk_token_id]
    assert tok.unk_token_id == len(tok) - 1


def test_builtin_save_and_auto_load(tmp_path):
    tok = builtin_tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "Q: 17 * 3 = ?\nA: 51 {x} [y] \\ ^ $ %"
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.decode(loaded.encode(text)) == text
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.bos_token_id) == (0, 1, 2)
    assert loaded.get_vocab() == tok.get_vocab()
    assert load_tokenizer(str(tmp_path)).encode(text) == tok.encode(text)


def test_load_tokenizer_empty_string_is_builtin():
    tok = load_tokenizer("")
    assert tok.get_vocab() == builtin_tokenizer().get_vocab()


def test_load_tokenizer_local_dir_keeps_chat_template(tmp_path):
    built = make_tiny_tokenizer(tmp_path / "tok")
    tok = load_tokenizer(str(tmp_path / "tok"))
    assert has_chat_template(tok)
    assert tok.eos_token == built.eos_token and tok.pad_token == built.pad_token
    assert tok("the cat")["input_ids"] == built("the cat")["input_ids"]


def test_load_tokenizer_without_eos_is_an_error_naming_it(tmp_path):
    make_tiny_tokenizer(tmp_path / "noeos", eos=False)
    with pytest.raises(ValueError, match=r"tokenizer '.*noeos' has no EOS token"):
        load_tokenizer(str(tmp_path / "noeos"))


def test_load_tokenizer_without_pad_uses_eos(tmp_path):
    make_tiny_tokenizer(tmp_path / "nopad", pad=False)
    tok = load_tokenizer(str(tmp_path / "nopad"))
    assert tok.pad_token == tok.eos_token and tok.pad_token_id == tok.eos_token_id


def test_load_tokenizer_missing_local_path_fails_fast(tmp_path):
    start = time.monotonic()
    with pytest.raises(ValueError, match="is not an existing directory"):
        load_tokenizer(str(tmp_path / "missing"))
    assert time.monotonic() - start < 5  # never a (retried) hub request


def test_load_tokenizer_bad_type():
    with pytest.raises(ValueError, match="must be a string"):
        load_tokenizer(None)


def test_load_tokenizer_hub_name_goes_to_auto_tokenizer(monkeypatch):
    calls = []

    class FakeAuto:
        @staticmethod
        def from_pretrained(name):
            calls.append(name)
            return builtin_tokenizer()

    monkeypatch.setattr(transformers, "AutoTokenizer", FakeAuto)
    assert load_tokenizer("Qwen/Qwen2.5-0.5B-Instruct").eos_token == "<eos>"
    assert calls == ["Qwen/Qwen2.5-0.5B-Instruct"]


def test_load_tokenizer_directory_without_tokenizer_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model directory whose tokenizer lives elsewhere
    with pytest.raises(ValueError, match=r"tokenizer directory '.*' holds none of tokenizer.json, "
                                         r"tokenizer_config.json, .*; set config.tokenizer"):
        load_tokenizer(str(tmp_path))
