"""The public Python API: the README's example runs as written; callables and in-memory rows are
recorded in config.json so a rerun with other inputs is refused; bad inputs are one-line errors."""
import json
import os
import re
import subprocess
import sys

import datasets
import pytest

import jaxrl_llm
from fixtures_data import ARITHMETIC_ROWS, tiny_api_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_example() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        m = re.search(r"<!-- python-api:begin -->\n```python\n(.*?)```\n<!-- python-api:end -->", f.read(), re.S)
    assert m, "README.md lost its Python API example"
    return m.group(1)


def test_readme_python_api_example_runs_as_written(tmp_path):
    (tmp_path / "example.py").write_text(readme_example())
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.fullmatch(r"(\d+) steps: reward (\S+) -> (\S+)", proc.stdout.strip().splitlines()[-1])
    assert m and int(m.group(1)) == 40, proc.stdout
    wd = tmp_path / "runs" / "api_demo"
    rows = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 40 and "reward/digit_then_answer/mean" in rows[0]
    assert float(m.group(3)) == pytest.approx(rows[-1]["reward/mean"], abs=1e-3)
    assert float(m.group(3)) > float(m.group(2))  # the example learns: a digit first is easy to find
    config = json.loads((wd / "config.json").read_text())
    assert config["reward"]["functions"] == "__main__:digit_then_answer"
    assert config["data"]["path"].startswith("<in-memory dataset ")
    assert (wd / "DONE").exists() and (wd / "hf" / "config.json").exists()


def tiny(**fields):
    return tiny_api_config(**fields)


ROWS = ARITHMETIC_ROWS


def echo_length(prompts, completions, **_):
    return [len(c) / 10 for c in completions]


def test_mixed_reward_specs_weights_and_a_datasets_dataset(tmp_path):
    t = jaxrl_llm.Trainer(tiny(), str(tmp_path / "a"), rewards=[(echo_length, 0.5), ("format", 2.0)],
                          dataset=datasets.Dataset.from_list(ROWS))
    assert [(name, w) for name, _, w in t.reward_fns] == [("echo_length", 0.5), ("format", 2.0)]
    assert t.c.reward.functions == f"{__name__}:echo_length,format" and t.c.reward.weights == "0.5,2.0"
    history = t.run()
    assert len(history) == 1 and {"reward/echo_length/mean", "reward/format/mean"} <= set(history[0])


def test_rerun_with_other_rows_or_rewards_is_refused(tmp_path):
    wd = str(tmp_path / "run")
    jaxrl_llm.Trainer(tiny(), wd, rewards=[echo_length], dataset=ROWS)  # writes config.json
    jaxrl_llm.Trainer(tiny(), wd, rewards=[echo_length], dataset=list(ROWS))  # same inputs: resumable
    os.makedirs(os.path.join(wd, "checkpoints", "1"))  # as if it saved a step (before one, a workdir is new)
    with pytest.raises(ValueError, match=r"holds a run with another config \(data.path: '<in-memory dataset"):
        jaxrl_llm.Trainer(tiny(), wd, rewards=[echo_length], dataset=ROWS[:4])
    with pytest.raises(ValueError, match=r"holds a run with another config \(reward.functions:"):
        jaxrl_llm.Trainer(tiny(), wd, rewards=["format"], dataset=ROWS)


@pytest.mark.parametrize("kwargs, message", [
    (dict(config=tiny(**{"rollout.gruop_size": 2}), rewards=["format"], dataset=ROWS),
     "config.rollout.gruop_size is not a config field; did you mean rollout.group_size?"),
    (dict(config=tiny(**{"data.path": "x.jsonl"}), rewards=["format"], dataset=ROWS),
     "pass the prompts either as dataset= or as config.data.path/data.task, not both"),
    (dict(config=tiny(), rewards=["format"], dataset=["not a row"]),
     "dataset must be a datasets.Dataset, a list of row dicts or a dict of columns"),
    (dict(config=tiny(), rewards=[42], dataset=ROWS), "unknown reward '42'"),
    (dict(config=tiny(), rewards=["format"], dataset=[{"prompt": "p"}]),
     "dataset lacks the configured column(s) ['question', 'answer']"),
])
def test_bad_python_inputs_are_one_line_errors(tmp_path, kwargs, message):
    with pytest.raises(ValueError) as e:
        jaxrl_llm.Trainer(workdir=str(tmp_path / "run"), **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_package_exposes_the_api_lazily():
    out = subprocess.run([sys.executable, "-c", "import sys, jaxrl_llm; print('jax' in sys.modules); "
                          "print(sorted(jaxrl_llm.__all__)); jaxrl_llm.Trainer; print('jax' in sys.modules)"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "False" and out[2] == "True"
    assert set(eval(out[1])) >= {"Trainer", "base_config", "from_dict", "register_reward", "Objective"}
