"""The run's directory: created and checked before anything is loaded; the files that describe the run.

A workdir holds one run. Starting again with the same config resumes it; with another config it is
refused (or, with `force_new`, the old run is moved aside to `<workdir>/replaced-<time>/`, never deleted),
unless the old run never saved a step: there is nothing to resume, so the workdir is taken as new (the
old files replaced, or moved aside when it logged steps) with a line saying so.
A field the old run's config.json lacks (it was written by an earlier version) counts as its default.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable

import ml_collections
from etils import epath

from jaxrl_llm import distributed as dist
from jaxrl_llm import fs
from jaxrl_llm.config import base_config

log = logging.getLogger(__name__)

# Fields that may change between a run and its resumption (they do not change what is computed; the
# mesh only changes float rounding: a checkpoint restores onto any mesh; evaluation draws from a stream
# of its own and never touches the training state; the compilation cache only saves compiling).
RESUMABLE_FIELDS = ("total_steps", "force_new", "checkpoint", "log", "export", "mesh", "eval", "compilation_cache")
# model.* fields that say how the same function is computed, not what: rematerialisation, the attention
# kernel and the logits chunk change float rounding only (like the mesh), and are what a user changes to
# fit memory on resume (model.remat's default became "dots": a run saved with "none" resumes).
RESUMABLE_MODEL_FIELDS = ("remat", "attention", "logits_chunk")


def prepare_workdir(workdir: str, c: ml_collections.ConfigDict) -> epath.Path:
    """Creates `workdir` (local or a URL etils.epath reads, gs://...) and checks it can hold this run."""
    wd = epath.Path(workdir)
    try:
        wd.mkdir(parents=True, exist_ok=True)
    except Exception as e:  # e.g. gs:// without gcsfs installed, or no permission on the bucket
        raise OSError(f"workdir {workdir} cannot be created: {' '.join(str(e).split())[:200]}") from None
    if not fs.is_url(workdir) and not os.access(workdir, os.W_OK):
        raise PermissionError(f"workdir {workdir} is not writable")
    check_workdir(workdir, c)
    return wd


@contextlib.contextmanager
def undo_on_failure(workdir: str, close: Callable[[], None] = lambda: None):
    """A start that fails (a bad model, dataset, reward...) leaves `workdir` as it found it: created by
    this start, it is removed; otherwise what the start added is removed and a run that `force_new` moved
    aside to replaced-<time>/ is moved back. `close` runs first (open files of the metric writers...)."""
    wd = epath.Path(workdir)
    before = {e.name for e in wd.iterdir()} if wd.is_dir() else None
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            close()
        if dist.is_main():
            _restore(wd, before)
        raise


def _restore(wd: epath.Path, before: set[str] | None) -> None:
    if not wd.exists():
        return
    if before is None:
        wd.rmtree()
        return
    aside = [e for e in wd.iterdir() if e.name.startswith("replaced-") and e.name not in before]
    for entry in wd.iterdir():
        # Everything but earlier replaced-* directories is this start's once the old run was moved aside.
        if entry not in aside and (entry.name not in before or (aside and not entry.name.startswith("replaced-"))):
            entry.rmtree() if entry.is_dir() else entry.unlink()
    for directory in aside:
        for entry in directory.iterdir():
            entry.rename(wd / entry.name)
        directory.rmtree()


def check_workdir(workdir: str, resolved: ml_collections.ConfigDict) -> None:
    """Refuses a workdir holding a run with an incompatible config (unless force_new: then it is moved
    aside to <workdir>/replaced-<time>/, never deleted)."""
    path = epath.Path(workdir) / "config.json"
    if not path.is_file():
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # hand-edited or damaged (the trainer writes it atomically)
        raise ValueError(f"workdir {workdir}: config.json is not valid JSON ({e}); restore it, or use "
                         "another workdir") from None
    new = json.loads(resolved.to_json())
    old = _with_added_defaults(old, new, json.loads(base_config().to_json()))
    for config in (old, new):
        for key in RESUMABLE_MODEL_FIELDS:
            config.get("model", {}).pop(key, None)
    diff = sorted(k for k in set(old) | set(new) if k not in RESUMABLE_FIELDS and old.get(k) != new.get(k))
    if not diff:
        return
    detail = _first_difference(old, new, diff[0])
    if not resolved.force_new and not _saved_a_step(workdir):
        # A start that failed after writing its files (a reward raising at the first step, say) left
        # nothing to resume: the workdir is new, and its rerun with the fix must not be refused.
        if dist.is_main():
            _replace_unsaved(epath.Path(workdir), detail)
        dist.sync("replace_unsaved")
        return
    if not resolved.force_new:
        raise ValueError(f"workdir {workdir} holds a run with another config ({detail}); use another workdir "
                         "or --config.force_new=True to start afresh (the old run is kept aside)")
    if dist.is_main():
        aside = epath.Path(workdir) / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.mkdir(parents=True)
        for entry in epath.Path(workdir).iterdir():
            if not entry.name.startswith("replaced-"):
                entry.rename(aside / entry.name)
    dist.sync("force_new")


def _saved_a_step(workdir: str) -> bool:
    """Whether the workdir's checkpoints/ holds a committed step (Orbax names them by the step)."""
    ckpt = epath.Path(workdir) / "checkpoints"
    return ckpt.is_dir() and any(e.name.isdigit() for e in ckpt.iterdir())


def _replace_unsaved(wd: epath.Path, detail: str) -> None:
    """Removes the files of a run that never saved a step; metrics of the steps it did log are kept
    aside in replaced-<time>/ rather than deleted."""
    metrics = wd / "metrics.jsonl"
    logged = metrics.is_file() and metrics.read_text(encoding="utf-8").strip() != ""
    aside = wd / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}"
    if logged:
        aside.mkdir(parents=True)
    for entry in wd.iterdir():
        if entry.name.startswith("replaced-"):
            continue
        if logged:
            entry.rename(aside / entry.name)
        else:
            entry.rmtree() if entry.is_dir() else entry.unlink()
    where = f"moved to {aside.name}/" if logged else "replaced"
    log.warning("workdir %s holds a run with another config (%s) that never saved a step: starting it as new, "
                "its files %s", wd, detail, where)


def _with_added_defaults(old: dict, new: dict, default: dict) -> dict:
    """`old` with the fields it lacks filled in where `new` holds their default: a run written by an
    earlier version of the library, which had no such field, ran with the feature off, so resuming it
    with the field at its default is the same run. A field the new run sets otherwise stays a difference."""
    out = dict(old)
    for k, v in new.items():
        d = default.get(k) if isinstance(default, dict) else None
        if k not in old:
            if v == d:
                out[k] = v
        elif isinstance(old[k], dict) and isinstance(v, dict):
            out[k] = _with_added_defaults(old[k], v, d if isinstance(d, dict) else {})
    return out


def _first_difference(old, new, key, prefix=""):
    a, b = old.get(key), new.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a, b, k, f"{prefix}{key}.")
    return f"{prefix}{key}: {a!r} there, {b!r} now"


def write_run_files(wd: epath.Path, c: ml_collections.ConfigDict, model_config: dict, tokenizer) -> None:
    """config.json, model_config.json and the tokenizer (process 0). Rewritten at every start,
    atomically: a kill mid-write would otherwise leave a run that cannot resume."""
    if not dist.is_main():
        return
    fs.write_text_atomic(wd / "config.json", c.to_json(indent=2))
    fs.write_text_atomic(wd / "model_config.json", json.dumps(model_config, indent=2))
    fs.write_via_local_dir(wd / "tokenizer", tokenizer.save_pretrained)
