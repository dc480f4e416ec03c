"""The configuration of an evaluation from the command line's values: a run's config.json with
`--config.eval.*` overrides, or a config file with --model. Apart from `__main__` so that it can be
imported (and tested) without defining the command line's flags."""
from __future__ import annotations

import json

from etils import epath


def eval_overrides(c, overrides):
    """`c` with `--config.eval.X=V` arguments applied (V read as the field's type); anything but an eval.*
    field (or eval.holdout, which decided what the run trained on) is refused in one line."""
    from jaxrl_llm import config as config_lib
    from jaxrl_llm.validation import get_path

    values = {}
    for arg in overrides:
        key, sep, text = arg[len("--config."):].partition("=")
        if not key.startswith("eval.") or key == "eval.holdout" or not sep:
            raise ValueError(f"{arg}: with --workdir only --config.eval.<field>=<value> overrides are accepted (not "
                             "eval.holdout); the rest is the run's config.json")
        try:
            current = get_path(c, key)
        except (KeyError, AttributeError):
            current = None
        if isinstance(current, bool):
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{arg}: config.{key} expects true or false")
            values[key] = text.lower() in ("true", "1")
        else:
            try:
                values[key] = type(current)(text) if isinstance(current, (int, float)) else text
            except ValueError:
                raise ValueError(f"{arg}: config.{key} expects a {type(current).__name__}") from None
    return config_lib.prepare(config_lib.from_dict(values, c)) if values else c


def run_config(workdir: str | None, model: str | None, config, overrides=()):
    """(the prepared config, where the parameters come from) from the flags, checked before any load."""
    from jaxrl_llm import config as config_lib
    from jaxrl_llm.evaluate import eval_source

    if bool(workdir) == bool(model):
        raise ValueError("give either --workdir (a run's checkpoint) or --model with --config (a HF model)")
    if workdir:
        if config is not None:
            raise ValueError("--config goes with --model; with --workdir the run's config.json is used")
        path = epath.Path(workdir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not found; is {workdir} the workdir of a jaxrl_llm run?")
        values = json.loads(path.read_text(encoding="utf-8"))
        run = config_lib.prepare(config_lib.from_dict(values))
        c = eval_overrides(run, overrides)
        if eval_source(c) == "holdout":
            if not run.eval.every_steps:
                raise ValueError("the run did not evaluate periodically (eval.every_steps=0), so it trained on "
                                 "every prompt of data.path: give held-out prompts with --config.eval.path=FILE")
            if run.data.path.startswith("<in-memory"):
                raise ValueError("the run's prompts were given in Python (dataset=): its held-out slice cannot "
                                 "be read back; give held-out prompts with --config.eval.path=FILE")
        return c, "checkpoint"
    if config is None:
        raise ValueError("--model needs --config (the data, rewards and eval section), e.g. --config=configs/tiny.py")
    c = config_lib.from_dict({"model.path": model}, config)
    return config_lib.prepare(c), "model"
