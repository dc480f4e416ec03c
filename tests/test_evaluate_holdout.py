"""Evaluation with your own data: the held-out slice of data.path (1 prompt in eval.holdout by CRC-32,
never drawn by training), the data's own errors first, evaluation off with one warning, a local file's
one split, and `python -m jaxrl_llm.evaluate --workdir` with `--config.eval.*` overrides."""
import json
import logging
import zlib

import pytest

from jaxrl_llm import config as config_lib
from jaxrl_llm.data import builtin_tokenizer
from jaxrl_llm.data.tasks import digit_puzzles
from jaxrl_llm.evaluate import load_eval_data
from jaxrl_llm.evaluate.overrides import run_config
from jaxrl_llm.trainer import Trainer

from test_evaluate import run_cli
from test_trainer import read_jsonl, small_config

HOLDOUT = {"eval.every_steps": 2, "eval.num_prompts": 0, "eval.k": 2, "total_steps": 2}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def own_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("own")
    # " " + the task's prompts: the task's own train split avoids the prompts that hash to 0 mod 8.
    rows = [{"prompt": " " + p, "answer": a}
            for p, a in zip(*(digit_puzzles(96, seed=3)[k] for k in ("prompt", "answer")))]
    rows = list({r["prompt"]: r for r in rows}.values())  # distinct prompts
    return _write(d / "mine.jsonl", rows), [r["prompt"] for r in rows]


def _config(path, **over):
    return small_config(**{"data.task": "", "data.path": path, "data.extra_columns": (), **HOLDOUT, **over})


@pytest.fixture(scope="module")
def holdout_run(own_data, tmp_path_factory):
    path, prompts = own_data
    wd = tmp_path_factory.mktemp("holdout_run")
    trainer = Trainer(_config(path), str(wd))
    trainer.run()
    return trainer, wd


def test_a_run_on_its_own_data_holds_out_one_prompt_in_eight_and_never_trains_on_it(own_data, holdout_run):
    _, prompts = own_data
    trainer, wd = holdout_run
    held = {p for p in prompts if zlib.crc32(p.encode()) % 8 == 0}  # independent of data/holdout.py
    assert 3 <= len(held) < len(prompts) // 4
    assert set(trainer.evaluator.rows["prompt"]) == held
    rows = read_jsonl(wd / "metrics.jsonl")
    assert [r["step"] for r in rows if "eval/pass@1" in r] == [0, 2]
    assert rows[1]["data/held_out"] == len(held) and rows[1]["data/rows"] == len(prompts) - len(held)
    drawn = set()
    for _ in range(3 * len(prompts) // 4):  # three epochs of the training iterator
        drawn |= set(next(trainer.data)["prompt"])
    assert drawn == set(prompts) - held


def test_the_datas_own_errors_come_first(tmp_path, own_data):
    cases = [(str(tmp_path / "missing.jsonl"), "does not exist"),
             (_write(tmp_path / "q.jsonl", [{"question": "max(1,2)=", "answer": "2"}]), "lacks the configured column"),
             (_write(tmp_path / "empty.jsonl", []), "has no rows")]
    for path, message in cases:
        with pytest.raises(ValueError, match=message):
            Trainer(_config(path), str(tmp_path / "wd"))


def test_no_held_out_source_turns_evaluation_off_with_one_warning(tmp_path, own_data, caplog):
    with caplog.at_level(logging.WARNING):
        trainer = Trainer(_config(own_data[0], **{"eval.holdout": 0, "total_steps": 1}), str(tmp_path))
    warnings = [r.getMessage() for r in caplog.records if "periodic evaluation is off" in r.getMessage()]
    assert len(warnings) == 1 and trainer.evaluator is None
    trainer.run()
    assert not any("eval/pass@1" in r for r in read_jsonl(tmp_path / "metrics.jsonl"))


def test_a_local_file_s_one_split_is_used_and_its_errors_say_it_once(tmp_path, own_data):
    c = config_lib.prepare(small_config(**{"eval.path": own_data[0], "eval.num_prompts": 5,
                                                 "data.extra_columns": ()}))
    assert c.eval.split == "test"  # the default: a local file's one split is read
    assert load_eval_data(c, builtin_tokenizer())["prompt"] == own_data[1][:5]
    c.eval.split = "validation"
    with pytest.raises(ValueError) as e:
        load_eval_data(c, builtin_tokenizer())
    message = str(e.value)
    assert message.count(own_data[0]) == 1 and "leave eval.split at its default" in message, message


def test_command_line_evaluates_the_held_out_slice_with_eval_overrides(holdout_run, tmp_path):
    trainer, wd = holdout_run
    proc = run_cli(f"--workdir={wd}", "--config.eval.num_prompts=3", "--config.eval.k=1",
                   f"--out={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "step_2.json").read_text())
    assert report["num_prompts"] == 3 and report["eval"]["k"] == 1 and "eval/pass@1" in report["metrics"]
    samples = read_jsonl(tmp_path / "step_2.samples.jsonl")
    assert {s["prompt"] for s in samples} <= set(trainer.evaluator.rows["prompt_text"])
    with pytest.raises(ValueError, match="only --config.eval"):
        run_config(str(wd), None, None, ["--config.rollout.top_k=3"])
    with pytest.raises(ValueError, match="only --config.eval"):
        run_config(str(wd), None, None, ["--config.eval.holdout=4"])
    with pytest.raises(ValueError, match="eval.kk is not a config field"):
        run_config(str(wd), None, None, ["--config.eval.kk=3"])


def test_command_line_refuses_the_slice_of_a_run_that_trained_on_it(own_data, tmp_path):
    c = _config(own_data[0], **{"eval.every_steps": 0})
    (tmp_path / "config.json").write_text(json.dumps(config_lib.prepare(c).to_dict()))
    with pytest.raises(ValueError, match="trained on every prompt of data.path"):
        run_config(str(tmp_path), None, None)
    c2, _ = run_config(str(tmp_path), None, None, [f"--config.eval.path={own_data[0]}x"])
    assert c2.eval.path == own_data[0] + "x"
