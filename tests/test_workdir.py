"""check_workdir's comparison of a workdir's config.json with the new run's config (no training)."""
import json
import logging

import pytest

from jaxrl_llm import config as cfg
from jaxrl_llm.trainer.workdir import check_workdir


def _resolved(**overrides):
    base = {"data": {"task": "digit_puzzles"}, "reward": {"functions": "digit_puzzles"},
            "rollout": {"max_new_tokens": 8}}
    return cfg.prepare(cfg.from_dict({**base, **overrides}))


def _write(tmp_path, resolved, drop=(), saved=True):
    """config.json as an earlier library version would have written it: without the fields in `drop`;
    `saved`: the run committed a checkpoint (step 3)."""
    if saved:
        (tmp_path / "checkpoints" / "3").mkdir(parents=True)
    d = json.loads(resolved.to_json())
    for path in drop:
        *parents, leaf = path.split(".")
        node = d
        for p in parents:
            node = node[p]
        del node[leaf]
    (tmp_path / "config.json").write_text(json.dumps(d))


def test_same_config_resumes(tmp_path):
    _write(tmp_path, _resolved())
    check_workdir(str(tmp_path), _resolved())


@pytest.mark.parametrize("path", ["rollout.temperature", "rollout.top_p", "train.grad_accum"])
def test_a_field_the_old_run_lacked_resumes_at_its_default(tmp_path, path):
    """A run written before a field existed ran with its default: resuming it with the default is the same run."""
    new = _resolved()
    default = json.loads(cfg.base_config().to_json())
    node, newnode = default, json.loads(new.to_json())
    for p in path.split("."):
        node, newnode = node[p], newnode[p]
    if node != newnode:  # only meaningful where the resolved value is the schema's default
        pytest.skip(f"{path} is resolved away from its default")
    _write(tmp_path, new, drop=[path])
    check_workdir(str(tmp_path), new)


def test_a_field_the_old_run_lacked_refuses_when_set_otherwise(tmp_path):
    _write(tmp_path, _resolved(), drop=["rollout.temperature"])
    with pytest.raises(ValueError, match=r"another config \(rollout.temperature: None there, 0.7 now\)"):
        check_workdir(str(tmp_path), _resolved(rollout={"max_new_tokens": 8, "temperature": 0.7}))


def test_a_changed_value_refuses(tmp_path):
    _write(tmp_path, _resolved())
    with pytest.raises(ValueError, match=r"another config \(rollout.top_k: 0 there, 5 now\)"):
        check_workdir(str(tmp_path), _resolved(rollout={"max_new_tokens": 8, "top_k": 5}))


def test_a_run_that_never_saved_a_step_is_replaced(tmp_path, caplog):
    """Before: a start that failed at its first step (a reward raising) left config.json and an empty
    checkpoints/, and the rerun with the fix was refused as "another config"."""
    _write(tmp_path, _resolved(), saved=False)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "replaced-20250101-000000").mkdir()  # an earlier run kept aside stays
    with caplog.at_level(logging.WARNING):
        check_workdir(str(tmp_path), _resolved(rollout={"max_new_tokens": 8, "top_k": 5}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replaced-20250101-000000"]
    assert "(rollout.top_k: 0 there, 5 now) that never saved a step: starting it as new, its files replaced" \
        in caplog.text


def test_an_unsaved_run_that_logged_steps_is_moved_aside(tmp_path):
    _write(tmp_path, _resolved(), saved=False)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    check_workdir(str(tmp_path), _resolved(rollout={"max_new_tokens": 8, "top_k": 5}))
    (aside,) = list(tmp_path.iterdir())
    assert aside.name.startswith("replaced-") and (aside / "metrics.jsonl").read_text() == '{"step": 1}\n'
