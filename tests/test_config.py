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


@pytest.mark.parametrize("path,message", [
    ("rollout.group_size", None),
    ("reward.kwargs.math_answer.tol", None),  # free-form: the user's keys
    ("rollout.gruop_size", "unknown config field 'rollout.gruop_size'; did you mean 'rollout.group_size'?"),
    ("rolout.group_size", "unknown config field 'rolout'; did you mean 'rollout'?"),
    ("total_step", "unknown config field 'total_step'; did you mean 'total_steps'?"),
    ("vision.patch", "unknown config field 'vision' (no such section; sections: advantage, checkpoint, compilation_cache, correction,"),
    ("rollout.xyzzy", "unknown config field 'rollout.xyzzy' (fields of rollout: batch_prompts, compute_dtype,"),
    ("seed.x", "config field 'seed' is a value, not a section: no field 'seed.x'"),
    ("rollout", "'rollout' is a section, not a field (its fields: batch_prompts,"),
])
def test_unknown_override_paths_name_the_field_and_the_nearest_ones(path, message):
    from jaxrl_llm.field_names import unknown_field
    got = unknown_field(path, config_lib.base_config())
    assert got == message if message is None else got.startswith(message), got


def test_cli_names_the_argument_of_an_unknown_field():
    """ml_collections reported `--config.vision.patch=4 --config.export.plot=False` as "unknown config field
    '' in --config.export.plot=False: vision": the field of one argument against the other."""
    from jaxrl_llm import cli
    argv = ["prog", "--config=configs/tiny.py", "--config.export.plot=False", "--config.vision.patch=4"]
    with pytest.raises(cli.UnknownConfigField, match=r"^--config.vision.patch=4: unknown config field 'vision' "
                                                     r"\(no such section; sections: "):
        cli._check_config_overrides(argv)
    cli._check_config_overrides(["prog", "--config.rollout.group_size=4", "--workdir=x"])  # known: passes
    # A free-form key the config file does not hold: ml_collections raises KeyError("'math_answer'").
    argv = ["prog", "--config.rollout.group_size=4", "--config.reward.kwargs.math_answer.tol=1"]
    assert cli._flag_error(KeyError("'math_answer'"), argv) == (
        "--config.reward.kwargs.math_answer.tol=1: no config field 'math_answer' to override; reward.kwargs "
        "and data.reasoning_gym.options entries must be set in the config file (or through the Python API) first")
