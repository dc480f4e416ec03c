"""Loading prompt datasets: file formats, hub names, chat templates, BOS, length policies, bad input."""

import time

import datasets
import pytest

from jaxrl_llm.data import (
    builtin_tokenizer,
    default_data_config,
    load_prompt_dataset,
    load_raw_dataset,
    load_tokenizer,
    prepare_prompts,
    validate_data_config,
)
from jaxrl_llm.data import prompts as prompts_lib
from fixtures_data import gsm8k_like_rows, make_tiny_tokenizer, write_gsm8k_like


@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "chat"
    make_tiny_tokenizer(path, chat_template=True, add_bos=True)
    return load_tokenizer(str(path))


@pytest.fixture(scope="module")
def raw_bos_tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "raw_bos"
    make_tiny_tokenizer(path, chat_template=False, add_bos=True)
    return load_tokenizer(str(path))


def _config(path, tmp_path, **overrides):
    c = default_data_config()
    c.path = str(path)
    c.cache_dir = str(tmp_path / "hf_cache")
    for key, value in overrides.items():
        c[key] = value
    return c


# ----------------------------------------------------------------------------------------------------
# Formats and sources.


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "csv"])
def test_local_file_formats_load_all_rows(tmp_path, fmt):
    path = tmp_path / f"data.{fmt}"
    rows = write_gsm8k_like(path, 12, fmt)
    tok = builtin_tokenizer()
    ds, stats = load_prompt_dataset(_config(path, tmp_path), tok)
    assert ds.column_names == ["prompt_text", "prompt_ids", "prompt_user", "question", "answer"]  # every column
    assert ds["prompt_text"] == [r["question"] for r in rows]  # no chat template: the raw column
    assert ds["answer"] == [r["answer"] for r in rows]
    assert ds["prompt_ids"] == [tok.encode(r["question"]) for r in rows]
    assert stats == {
        "data/rows_loaded": 12, "data/rows": 12, "data/dropped_too_long": 0, "data/truncated": 0,
        "data/prompt_length_max": max(len(r["question"]) for r in rows),
    }


def test_local_directory_and_save_to_disk(tmp_path):
    rows = gsm8k_like_rows(5)
    (tmp_path / "dir").mkdir()
    write_gsm8k_like(tmp_path / "dir" / "part.jsonl", 5, "jsonl")
    assert load_raw_dataset(_config(tmp_path / "dir", tmp_path))["question"] == [r["question"] for r in rows]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    assert load_raw_dataset(_config(tmp_path / "saved", tmp_path))["answer"] == [r["answer"] for r in rows]


def test_split_slicing_on_a_local_file(tmp_path):
    write_gsm8k_like(tmp_path / "d.jsonl", 10, "jsonl")
    assert len(load_raw_dataset(_config(tmp_path / "d.jsonl", tmp_path, split="train[:4]"))) == 4


def test_hub_name_goes_to_load_dataset(tmp_path, monkeypatch):
    calls = []
    rows = gsm8k_like_rows(6)

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    config = default_data_config()
    config.path, config.name, config.split = "openai/gsm8k", "main", "test"
    ds, stats = load_prompt_dataset(config, builtin_tokenizer())
    assert calls == [("openai/gsm8k", "main", {"split": "test", "cache_dir": None})]
    assert ds["answer"] == [r["answer"] for r in rows] and stats["data/rows"] == 6


def test_missing_local_file_fails_fast_without_the_hub(tmp_path):
    start = time.monotonic()
    with pytest.raises(ValueError, match="does not exist"):
        load_raw_dataset(_config(tmp_path / "nope.jsonl", tmp_path))
    with pytest.raises(ValueError, match="does not exist"):
        load_raw_dataset(_config("./relative/missing_dir", tmp_path))
    assert time.monotonic() - start < 5


def test_local_paths_are_told_from_hub_names_and_every_extension_has_a_builder(tmp_path, monkeypatch):
    """data/files.py's checks (run at start-up, before `datasets` is imported) against the loader's table."""
    from jaxrl_llm.data import files, loading
    assert set(files.DATA_EXTENSIONS) == set(loading._FILE_BUILDERS)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.CSV").write_text("question,answer\n")
    (tmp_path / "dir").mkdir()
    assert files.data_file_extension("d.CSV") == ".csv"  # an existing file, relative, any case
    assert files.data_file_extension(str(tmp_path / "dir")) is None  # a directory: load_dataset(dir)
    assert files.data_file_extension("openai/gsm8k") is None  # a hub name
    for missing in ("train.jsonl", "./nope", str(tmp_path / "nope"), "~/surely/not/here.parquet"):
        with pytest.raises(ValueError, match=r"^eval\.path '.*' does not exist$"):
            files.data_file_extension(missing, "eval.path")
    with pytest.raises(ValueError, match="data.path is empty"):
        files.data_file_extension("")


def test_unsupported_extension(tmp_path):
    (tmp_path / "d.xyz").write_text("question,answer\n")
    with pytest.raises(ValueError, match=r"extension '\.xyz'"):
        load_raw_dataset(_config(tmp_path / "d.xyz", tmp_path))


# ----------------------------------------------------------------------------------------------------
# Prompt text: template, chat template, BOS.


def test_chat_template_with_system_prompt_matches_apply_chat_template(tmp_path, chat_tok):
    rows = write_gsm8k_like(tmp_path / "d.jsonl", 4, "jsonl")
    config = _config(tmp_path / "d.jsonl", tmp_path, system_prompt="Think step by step.")
    ds, _ = load_prompt_dataset(config, chat_tok)
    bos = chat_tok.bos_token_id
    for row, text, ids in zip(rows, ds["prompt_text"], ds["prompt_ids"]):
        messages = [{"role": "system", "content": "Think step by step."}, {"role": "user", "content": row["question"]}]
        expected = chat_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == expected
        assert ids == chat_tok(expected, add_special_tokens=False)["input_ids"]
        # The template writes BOS; the tokenizer would add a second one with special tokens.
        assert ids[0] == bos and ids.count(bos) == 1
        assert chat_tok(expected)["input_ids"][:2] == [bos, bos]
        assert text.endswith("<|im_start|>assistant\n")
    # Rewards (a reward model with its own template) get the user's prompt, not the rendered one.
    assert ds["prompt_user"] == [row["question"] for row in rows]


def test_chat_template_without_system_prompt(tmp_path, chat_tok):
    rows = write_gsm8k_like(tmp_path / "d.jsonl", 2, "jsonl")
    ds, _ = load_prompt_dataset(_config(tmp_path / "d.jsonl", tmp_path), chat_tok)
    expected = chat_tok.apply_chat_template(
        [{"role": "user", "content": rows[1]["question"]}], tokenize=False, add_generation_prompt=True
    )
    assert ds["prompt_text"][1] == expected and "system" not in expected


def test_use_chat_template_false_gives_raw_prompts(tmp_path, chat_tok):
    rows = write_gsm8k_like(tmp_path / "d.jsonl", 3, "jsonl")
    config = _config(tmp_path / "d.jsonl", tmp_path, use_chat_template=False, system_prompt="Sys.")
    ds, _ = load_prompt_dataset(config, chat_tok)
    assert ds["prompt_text"] == [f"Sys.\n\n{r['question']}" for r in rows]
    # This tokenizer prepends BOS on its own, so raw prompts get exactly its encoding.
    assert ds["prompt_ids"] == [chat_tok(f"Sys.\n\n{r['question']}")["input_ids"] for r in rows]


def test_use_chat_template_true_without_template_is_an_error(tmp_path):
    write_gsm8k_like(tmp_path / "d.jsonl", 2, "jsonl")
    with pytest.raises(ValueError, match="use_chat_template=True but tokenizer .* has no chat template"):
        load_prompt_dataset(_config(tmp_path / "d.jsonl", tmp_path, use_chat_template=True), builtin_tokenizer())


def test_raw_prompt_bos_rule(tmp_path, raw_bos_tok):
    write_gsm8k_like(tmp_path / "d.jsonl", 3, "jsonl")
    bos = raw_bos_tok.bos_token_id
    # A tokenizer that prepends BOS: one BOS, also when the template already starts with "<s>".
    for template in ("Q: {question}\nA:", "<s>Q: {question}\nA:"):
        ds, _ = load_prompt_dataset(_config(tmp_path / "d.jsonl", tmp_path, prompt_template=template), raw_bos_tok)
        for ids in ds["prompt_ids"]:
            assert ids[0] == bos and ids.count(bos) == 1
    # The built-in tokenizer adds nothing: no BOS.
    ds, _ = load_prompt_dataset(_config(tmp_path / "d.jsonl", tmp_path), builtin_tokenizer())
    assert all(2 not in ids for ids in ds["prompt_ids"])
    assert prompts_lib.tokenizer_adds_bos(raw_bos_tok) and not prompts_lib.tokenizer_adds_bos(builtin_tokenizer())


def test_prompt_template_and_every_column_kept(tmp_path):
    rows = [{"q": f"{i}+{i}", "answer": str(2 * i), "level": i % 3, "unused": "x", "prompt_text": "theirs"}
            for i in range(5)]
    datasets.Dataset.from_list(rows).to_json(str(tmp_path / "d.jsonl"))
    config = _config(tmp_path / "d.jsonl", tmp_path, prompt_template="Compute {q}.\nAnswer:", extra_columns=("level",))
    ds, _ = load_prompt_dataset(config, builtin_tokenizer())
    # Every column reaches the rewards; a column named like a generated one is replaced by it.
    assert ds.column_names == ["prompt_text", "prompt_ids", "prompt_user", "q", "answer", "level", "unused"]
    assert ds["unused"] == ["x"] * 5
    assert ds["prompt_text"] == [f"Compute {r['q']}.\nAnswer:" for r in rows]
    assert ds["level"] == [r["level"] for r in rows]


def test_conversational_prompt_column(tmp_path, chat_tok):
    convs = [[{"role": "user", "content": f"What is {i}+1?"}] for i in range(3)]
    dataset = datasets.Dataset.from_dict({"prompt": convs, "answer": ["1", "2", "3"]})
    config = _config("unused", tmp_path, prompt_column="prompt", system_prompt="S")
    ds, _ = prepare_prompts(dataset, config, chat_tok)
    expected = chat_tok.apply_chat_template(
        [{"role": "system", "content": "S"}, *convs[2]], tokenize=False, add_generation_prompt=True
    )
    assert ds["prompt_text"][2] == expected
    assert ds["prompt_user"] == [f"What is {i}+1?" for i in range(3)]  # the last user turn
    with pytest.raises(ValueError, match="row 0 holds chat messages but tokenizer"):
        prepare_prompts(dataset, config, builtin_tokenizer())


# ----------------------------------------------------------------------------------------------------
# max_prompt_length policies (built-in tokenizer: one token per character, so lengths are len(text)).


def _lengths(rows, template="{question}"):
    return [len(template.format(**r)) for r in rows]


def test_policy_drop_counts_and_keeps_short_rows(tmp_path):
    rows = write_gsm8k_like(tmp_path / "d.jsonl", 20, "jsonl")
    lengths = _lengths(rows)
    limit = sorted(lengths)[12]
    config = _config(tmp_path / "d.jsonl", tmp_path, max_prompt_length=limit)
    ds, stats = load_prompt_dataset(config, builtin_tokenizer())
    kept = [r for r, n in zip(rows, lengths) if n <= limit]
    assert 0 < len(kept) < len(rows)
    assert ds["prompt_text"] == [r["question"] for r in kept]
    assert ds["answer"] == [r["answer"] for r in kept]
    assert stats["data/dropped_too_long"] == len(rows) - len(kept)
    assert stats["data/rows"] == len(kept) and stats["data/truncated"] == 0
    assert stats["data/prompt_length_max"] == max(n for n in lengths if n <= limit)


def test_policy_truncate_left_keeps_the_end(tmp_path):
    rows = write_gsm8k_like(tmp_path / "d.jsonl", 10, "jsonl")
    limit = 90
    config = _config(tmp_path / "d.jsonl", tmp_path, max_prompt_length=limit, max_prompt_length_policy="truncate_left")
    tok = builtin_tokenizer()
    ds, stats = load_prompt_dataset(config, tok)
    assert ds["prompt_text"] == [r["question"][-limit:] for r in rows]
    assert ds["prompt_ids"] == [tok.encode(r["question"])[-limit:] for r in rows]
    assert stats["data/truncated"] == sum(len(r["question"]) > limit for r in rows) > 0
    assert stats["data/rows"] == 10 and stats["data/dropped_too_long"] == 0
    assert stats["data/prompt_length_max"] == limit


def test_truncate_left_keeps_a_leading_bos(tmp_path, raw_bos_tok):
    rows = write_gsm8k_like(tmp_path / "d.jsonl", 6, "jsonl")
    limit = 40
    config = _config(tmp_path / "d.jsonl", tmp_path, max_prompt_length=limit, max_prompt_length_policy="truncate_left")
    ds, _ = load_prompt_dataset(config, raw_bos_tok)
    for row, ids, text in zip(rows, ds["prompt_ids"], ds["prompt_text"]):
        full = raw_bos_tok(row["question"])["input_ids"]
        expected = full if len(full) <= limit else [full[0]] + full[len(full) - limit + 1:]
        assert ids == expected and len(ids) <= limit
        assert text == raw_bos_tok.decode(ids)


def test_policy_error_names_the_row_and_length(tmp_path):
    rows = write_gsm8k_like(tmp_path / "d.jsonl", 10, "jsonl")
    lengths = _lengths(rows)
    limit = sorted(lengths)[5]
    first = next(i for i, n in enumerate(lengths) if n > limit)
    config = _config(tmp_path / "d.jsonl", tmp_path, max_prompt_length=limit, max_prompt_length_policy="error")
    message = rf"prompt of row {first} has {lengths[first]} tokens > data.max_prompt_length={limit}"
    with pytest.raises(ValueError, match=message):
        load_prompt_dataset(config, builtin_tokenizer())


def test_all_rows_dropped_is_an_error(tmp_path):
    write_gsm8k_like(tmp_path / "d.jsonl", 4, "jsonl")
    with pytest.raises(ValueError, match="no prompts left: all 4 rows are longer"):
        load_prompt_dataset(_config(tmp_path / "d.jsonl", tmp_path, max_prompt_length=5), builtin_tokenizer())


# ----------------------------------------------------------------------------------------------------
# Bad input.


def test_missing_column_lists_available_columns(tmp_path):
    write_gsm8k_like(tmp_path / "d.jsonl", 3, "jsonl")
    available = r"available columns: \['question', 'answer'\]"
    with pytest.raises(ValueError, match=r"lacks the configured column\(s\) \['problem'\]; " + available):
        load_prompt_dataset(_config(tmp_path / "d.jsonl", tmp_path, prompt_column="problem"), builtin_tokenizer())
    with pytest.raises(ValueError, match=r"\['solution'\]; available columns"):
        load_prompt_dataset(_config(tmp_path / "d.jsonl", tmp_path, answer_column="solution"), builtin_tokenizer())
    with pytest.raises(ValueError, match=r"\['topic'\]; available columns"):
        config = _config(tmp_path / "d.jsonl", tmp_path, prompt_template="{topic}: {question}")
        load_prompt_dataset(config, builtin_tokenizer())


def test_empty_dataset_is_an_error(tmp_path):
    (tmp_path / "empty.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match="has no rows"):
        load_prompt_dataset(_config(tmp_path / "empty.csv", tmp_path), builtin_tokenizer())


def test_empty_prompt_is_an_error(tmp_path):
    dataset = datasets.Dataset.from_dict({"question": ["ok", ""], "answer": ["1", "2"]})
    with pytest.raises(ValueError, match="prompt of row 1 is empty"):
        prepare_prompts(dataset, _config("unused", tmp_path), builtin_tokenizer())


def test_non_string_prompt_column_is_an_error(tmp_path):
    dataset = datasets.Dataset.from_dict({"question": [3, 4], "answer": ["1", "2"]})
    with pytest.raises(ValueError, match="prompt_column 'question' of row 0 holds int"):
        prepare_prompts(dataset, _config("unused", tmp_path), builtin_tokenizer())


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("path", "", "data.path is empty"),
        ("split", "", "data.split must name a split"),
        ("max_prompt_length", 0, "data.max_prompt_length must be a positive int"),
        ("max_prompt_length_policy", "clip", "data.max_prompt_length_policy must be one of"),
        ("use_chat_template", "maybe", "data.use_chat_template must be 'auto', True or False"),
        ("shuffle_seed", -1, "data.shuffle_seed must be a non-negative int"),
        ("num_epochs", -2, "data.num_epochs must be >= 0"),
        ("extra_columns", ("answer",), "repeat a column"),
        ("extra_columns", ("prompt_ids",), "reserved names"),
        ("prompt_template", "Q: {}", "positional field"),
        ("prompt_template", "Q: {question", "not a valid format string"),
    ],
)
def test_config_validation(tmp_path, field, value, message):
    config = _config(tmp_path / "d.jsonl", tmp_path)
    config[field] = value
    with pytest.raises(ValueError, match=message):
        validate_data_config(config)
        load_raw_dataset(config)


def test_use_chat_template_accepts_bools_and_strings(tmp_path):
    config = _config(tmp_path / "d.jsonl", tmp_path)
    for value in ("auto", True, False, "true", "False"):
        config.use_chat_template = value
        validate_data_config(config)


def test_empty_in_memory_dataset_is_an_error(tmp_path):
    dataset = datasets.Dataset.from_dict({"question": [], "answer": []})
    with pytest.raises(ValueError, match="has no rows"):
        prepare_prompts(dataset, _config("unused", tmp_path), builtin_tokenizer())


def test_unknown_split_of_a_local_file(tmp_path):
    write_gsm8k_like(tmp_path / "d.jsonl", 3, "jsonl")
    with pytest.raises(ValueError, match=r"split 'test'\) could not be loaded"):
        load_raw_dataset(_config(tmp_path / "d.jsonl", tmp_path, split="test"))


def test_chat_template_failure_names_the_row(tmp_path, chat_tok):
    rows = [{"question": "fine", "answer": "1"}, {"question": "BAD", "answer": "2"}]
    tok = load_tokenizer(chat_tok.name_or_path)
    tok.chat_template = (
        "{% for m in messages %}{% if m['content'] == 'BAD' %}{{ raise_exception('cannot render') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(ValueError, match="the chat template failed on row 1: cannot render"):
        prepare_prompts(datasets.Dataset.from_list(rows), _config("unused", tmp_path), tok)


def test_gsm8k_size_tokenizes_quickly(tmp_path, chat_tok):
    write_gsm8k_like(tmp_path / "d.parquet", 7473, "parquet")
    start = time.monotonic()
    ds, stats = load_prompt_dataset(_config(tmp_path / "d.parquet", tmp_path, system_prompt="Be brief."), chat_tok)
    # A few seconds on a shared 2-core machine; the bound only catches a per-row slow path.
    assert time.monotonic() - start < 30
    assert stats["data/rows"] == len(ds) == 7473


def test_prompt_helpers():
    assert prompts_lib.template_fields("{a.b} and {c[0]} then {a}{{literal}}") == ["a", "c"]
    conversation = [{"role": "system", "content": "own"}, {"role": "user", "content": "hi"}]
    assert prompts_lib.to_messages(conversation, "ignored") == conversation
    assert prompts_lib.to_messages("hi", "S") == [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    assert prompts_lib.raw_prompt_text("Q", "") == "Q"
    ids = [9, 1, 2, 3, 4, 5]
    for limit in range(1, 8):
        keep_bos = ids if len(ids) <= limit else ([9] + ids[len(ids) - limit + 1:] if limit > 1 else ids[-1:])
        assert prompts_lib.truncate_left(ids, limit, bos_id=9) == keep_bos
        assert prompts_lib.truncate_left(ids, limit, bos_id=None) == ids[-limit:]
