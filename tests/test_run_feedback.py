"""What a run tells its user: TRL-style rewards fed every dataset column through the trainer, samples
from several prompts with the reference and each reward's part, the data counters, the end-of-run
summary, an ETA that leaves out compilation, and a failed start that leaves the workdir as it found it."""
import contextlib
import io
import json
import math
import os
import time

import datasets
import pytest

import jaxrl_llm
from jaxrl_llm.data import PromptIterator, builtin_tokenizer, default_data_config, prepare_prompts
from jaxrl_llm.trainer import feedback, report

ROWS = [{"question": f"max({a},{b})=", "answer": str(max(a, b)), "solution": str(max(a, b)), "difficulty": a % 3}
        for a in range(4) for b in range(8)]  # 32 rows; `solution` and `difficulty` are in no config field
B, G, STEPS = 4, 2, 2
CALLS = []


def accuracy(completions, solution, trainer_state, **kwargs):
    """TRL-style: declares the dataset column it reads and the trainer state; **kwargs takes the rest."""
    CALLS.append({"solution": list(solution), "step": trainer_state.global_step, "max": trainer_state.max_steps,
                  "kwargs": sorted(kwargs)})
    return [float(c.strip() == s) for c, s in zip(completions, solution)]


def length(completion_ids, completion_lengths, **kw):
    assert [len(ids) for ids in completion_ids] == completion_lengths
    return [-0.1 * n for n in completion_lengths]


def needs_a_missing_column(completions, rubric, **kwargs):
    return [0.0] * len(completions)


def _config(**overrides):
    return jaxrl_llm.from_dict({
        "algo": "grpo", "total_steps": STEPS, "model.max_position_embeddings": 32, "model.hidden_size": 32,
        "model.num_layers": 1, "model.intermediate_size": 64, "data.max_prompt_length": 16,
        "rollout": {"batch_prompts": B, "group_size": G, "max_new_tokens": 3}, "log.progress": False,
        "log.samples_every": 1, "log.num_samples": 4, "log.tensorboard": False, "export.at_end": False,
        "export.plot": False, "checkpoint.async_save": False, **overrides})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("feedback") / "run"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        history = jaxrl_llm.Trainer(_config(), str(wd), rewards=[accuracy, (length, 0.5)], dataset=ROWS).run()
    return wd, history, out.getvalue()


def _jsonl(path):
    return [json.loads(line) for line in open(path)]


def test_trl_style_rewards_get_every_column_per_row_and_the_trainer_state(run):
    # The first call is the start-up reward check's (trainer/reward_check.py), on probe completions of a
    # few rows, through the same inputs as training: every column, every trainer field.
    assert [(c["step"], c["max"]) for c in CALLS] == [(0, STEPS), (0, STEPS), (1, STEPS)]
    check, *training = CALLS
    assert check["kwargs"] == training[0]["kwargs"] and set(check["solution"]) <= {r["solution"] for r in ROWS}
    for call in training:
        groups = [call["solution"][i:i + G] for i in range(0, B * G, G)]
        assert len(groups) == B and all(len(set(g)) == 1 for g in groups)  # one prompt's value, repeated
        # **kwargs holds every input the function did not name: each dataset column and trainer field.
        assert call["kwargs"] == sorted({"question", "answer", "difficulty", "prompt_text", "prompts",
                                         "completion_ids", "completion_lengths", "truncated", "max_completion_length"})


def test_samples_cover_several_prompts_with_reference_and_reward_parts(run):
    wd, _, _ = run
    rows = _jsonl(wd / "samples.jsonl")
    answers = {r["question"]: r["answer"] for r in ROWS}
    assert [r["step"] for r in rows] == [1] * 4 + [2] * 4
    for step in (1, 2):
        step_rows = [r for r in rows if r["step"] == step]
        assert len({r["prompt"] for r in step_rows}) == 4  # four prompts, not one prompt's group
    for r in rows:
        assert r["reference"] == answers[r["prompt"]]
        assert set(r["rewards"]) == {"accuracy", "length"}
        assert math.isclose(sum(r["rewards"].values()), r["reward"], rel_tol=1e-6, abs_tol=1e-6)
        assert r["rewards"]["accuracy"] == float(r["completion"].strip() == r["reference"])


def test_sample_rows_take_one_completion_of_each_prompt_first():
    assert report.sample_rows(8, 2, 4) == [0, 2, 4, 6]
    assert report.sample_rows(6, 3, 4) == [0, 3, 1, 4]  # more samples than prompts: the second of each next
    assert report.sample_rows(4, 4, 2) == [0, 1]


def test_data_counters_are_in_the_metrics(run):
    wd, history, _ = run
    rows = [r for r in _jsonl(wd / "metrics.jsonl") if r["step"] > 0]
    assert [r["data/rows_seen"] for r in rows] == [4.0, 8.0]
    assert [r["data/epoch"] for r in rows] == [4 / 32, 8 / 32]
    assert rows[-1]["data/rows"] == rows[-1]["data/rows_loaded"] == 32.0
    assert rows[-1]["data/dropped_too_long"] == rows[-1]["data/truncated"] == 0.0
    assert rows[-1]["data/rows_skipped_per_epoch"] == 0.0
    assert rows[-1]["data/prompt_length_max"] == max(len(r["question"]) for r in ROWS)


def test_rows_served_counts_epochs_and_survives_a_resume():
    ds, _ = prepare_prompts(datasets.Dataset.from_list(ROWS[:10]), _data_config(), builtin_tokenizer())
    it = PromptIterator(ds, 4, seed=0)  # 2 batches per epoch, 2 rows skipped each epoch
    for _ in range(3):
        next(it)
    assert (it.rows_per_epoch, it.rows_served) == (8, 12)
    again = PromptIterator.from_state(ds, 4, it.state())
    assert again.rows_served == 12


def _data_config():
    c = default_data_config()
    c.max_prompt_length = 16
    return c


def test_the_reward_self_test_is_printed_first_and_logged_in_the_first_row(run):
    wd, history, out = run
    assert out.startswith("reward self-test: mean score of each probe over 4 dataset rows")
    table = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:10]}
    assert table["reference"] == ["1.000", "-0.200"] and table["empty"] == ["0.000", "-0.100"]
    assert history[0]["reward/self_test/accuracy/reference"] == 1.0 and history[0]["reward/self_test/flagged"] == 0.0
    assert not any(k.startswith("reward/self_test/") for k in history[1])
    assert _jsonl(wd / "metrics.jsonl")[0]["reward/self_test/length/empty"] == pytest.approx(-0.1)


def test_summary_is_printed_at_the_end(run):
    wd, history, out = run
    assert f"grpo: trained steps 1-{STEPS} of {STEPS}" in out
    assert f"reward      {history[-1]['reward/mean']:.3f} (mean of the last 1 step;" in out
    assert str(wd / "checkpoints" / str(STEPS)) in out and "export      off" in out


def test_summary_smooths_the_reward_and_reports_the_held_out_score(tmp_path):
    history = [{"reward/mean": i / 20} for i in range(20)]
    history[-1].update({"eval/pass@1": 0.5, "eval/mean_reward": 0.625})
    c = _config(**{"export.at_end": True, "export.plot": True, "eval.every_steps": 10})
    text = feedback.summary(c, str(tmp_path), history, 20, {"eval/pass@1": 0.125}, 3.0, 40.0)
    assert f"reward      {(18 + 19) / 40:.3f} (mean of the last 2 steps; 0.000 at step 1)" in text
    assert "held-out    pass@1 0.125 -> 0.500, mean reward 0.625" in text
    assert f"export      {tmp_path / 'hf'}" in text and "in 40 s (setup 3 s)" in text


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_eta_leaves_out_the_first_step():
    out = _Terminal()  # a terminal: the tqdm bar (a log file gets lines: tests/test_feedback_lines.py)
    progress = feedback.Progress(10, 0, "grpo", file=out)
    time.sleep(0.5)  # the first step: compilation
    m = {"reward/mean": 0.0, "perf/sample_tokens_per_s": 1.0}
    progress.update(m)
    progress.update(m)
    fmt = progress.bar.format_dict
    assert fmt["n"] == 2 and fmt["initial"] == 1  # the rate counts the steps after the first ...
    assert fmt["elapsed"] < 0.4  # ... over the time after it
    progress.close()


# ------------------------------------------------------------------ a failed start leaves the workdir alone
def _failing_start(wd):
    with pytest.raises(ValueError, match="reward 'needs_a_missing_column' declares the parameter 'rubric'"):
        jaxrl_llm.Trainer(_config(), str(wd), rewards=[needs_a_missing_column], dataset=ROWS)


def test_a_failed_start_removes_the_workdir_it_created(tmp_path):
    _failing_start(tmp_path / "new")
    assert not os.path.exists(tmp_path / "new")


def test_a_failed_start_leaves_an_existing_workdir_as_it_was(tmp_path):
    wd = tmp_path / "old"
    os.makedirs(wd / "notes")
    (wd / "notes" / "a.txt").write_text("mine")
    _failing_start(wd)
    assert sorted(os.listdir(wd)) == ["notes"] and (wd / "notes" / "a.txt").read_text() == "mine"


def test_a_failed_force_new_start_puts_the_old_run_back(tmp_path):
    wd = tmp_path / "run"
    os.makedirs(wd / "checkpoints" / "7")
    old = json.loads(_config(**{"rollout.max_new_tokens": 5}).to_json())
    (wd / "config.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="declares the parameter 'rubric'"):
        jaxrl_llm.Trainer(_config(force_new=True), str(wd), rewards=[needs_a_missing_column], dataset=ROWS)
    assert sorted(os.listdir(wd)) == ["checkpoints", "config.json"]
    assert json.loads((wd / "config.json").read_text()) == old and os.listdir(wd / "checkpoints") == ["7"]
