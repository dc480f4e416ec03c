"""The one validation pass: unknown fields refused wherever they come from (a config file, a dict, the
command line), with the nearest names; presets resolved; values checked; idempotent."""
import os
import subprocess
import sys

import ml_collections
import pytest

from jaxrl_llm import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_task(c=None):
    c = c or config_lib.base_config()
    c.data.task, c.reward.functions = "digit_puzzles", "digit_puzzles"
    return c


def test_a_typo_set_in_python_is_refused_with_the_nearest_field():
    c = tiny_task()
    c.rollout.gruop_size = 4  # a ConfigDict accepts any new attribute: the run would use the default
    with pytest.raises(ValueError, match=r"^config.rollout.gruop_size is not a config field; did you mean "
                                         r"rollout.group_size\?$"):
        config_lib.prepare(c)


@pytest.mark.parametrize("values, message", [
    ({"rollout": {"gruop_size": 3}}, "config.rollout.gruop_size is not a config field; did you mean rollout.group_size?"),
    ({"rolout.group_size": 3}, "config.rolout is not a config section; did you mean rollout?"),
    ({"optimizer.learning_rat": 1e-3}, "did you mean optimizer.learning_rate?"),
    ({"zzz": 1}, "config.zzz is not a config field (fields of config: advantage, algo,"),
    ({"rollout.group_size": "eight"}, "config.rollout.group_size: Could not override field 'group_size'"),
    ({"reward.kwargz.math_answer.timeout": 1}, "config.reward.kwargz is not a config section; did you mean reward.kwargs?"),
])
def test_from_dict_refuses_unknown_and_mistyped_fields(values, message):
    with pytest.raises(ValueError) as e:
        config_lib.prepare(config_lib.from_dict(values, tiny_task()))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_from_dict_nested_and_dotted_keys_and_free_form_reward_kwargs():
    c = config_lib.from_dict({"algo": "dapo", "rollout": {"group_size": 3, "max_new_tokens": 16},
                              "kl.coef": 0.1, "reward.kwargs.math_answer.timeout": 2.0,
                              "reward": {"kwargs": {"my_fn": {"scale": 3}}}}, tiny_task())
    assert (c.rollout.group_size, c.rollout.max_new_tokens, c.kl.coef) == (3, 16, 0.1)
    assert c.reward.kwargs.math_answer.timeout == 2.0 and c.reward.kwargs.my_fn.scale == 3
    p = config_lib.prepare(c)
    assert p.loss.clip_high == 0.28 and p.dapo.overlong_buffer == 4  # the preset fills what was left unset
    assert config_lib.base_config().rollout.group_size == 8  # the schema itself is untouched


def test_prepare_is_idempotent_and_does_not_change_its_input():
    c = tiny_task()
    c.algo = "ppo"
    p = config_lib.prepare(c)
    assert config_lib.prepare(p) == p
    assert c.advantage.estimator is None and p.advantage.estimator == "gae"


def test_a_config_built_from_scratch_is_checked_against_the_schema():
    """base_config()'s own fields refuse a change of type; a ConfigDict built by hand has no types."""
    with pytest.raises(ValueError, match="config.kl is a section of fields, got 0.1"):
        config_lib.prepare(ml_collections.ConfigDict({"algo": "grpo", "kl": 0.1}))
    with pytest.raises(ValueError, match="config.seed is a field, not a section"):
        config_lib.prepare(ml_collections.ConfigDict({"seed": {"value": 1}}))


def test_a_typo_inside_a_config_file_fails_the_cli_before_anything_loads(tmp_path):
    """The config-file route: only command-line overrides used to be checked."""
    cfg = tmp_path / "typo.py"
    cfg.write_text(f"import sys\nsys.path.insert(0, {os.path.join(ROOT, 'configs')!r})\nimport tiny\n\n"
                   "def get_config(arg=None):\n    c = tiny.get_config()\n    c.rollout.gruop_size = 4\n    return c\n")
    proc = subprocess.run([sys.executable, "-m", "jaxrl_llm.train", f"--config={cfg}", f"--workdir={tmp_path / 'wd'}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "jaxrl_llm.train: error: config.rollout.gruop_size is not a config field; did you mean rollout.group_size?")
    assert not (tmp_path / "wd").exists()  # refused before the workdir was made
