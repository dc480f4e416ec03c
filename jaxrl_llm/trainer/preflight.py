"""The local files a run reads, checked in a fraction of a second before anything else loads.

A missing weight file, a truncated shard, a checkpoint whose shapes disagree with its config.json, a
misspelled data path: each would otherwise surface only after the tokenizer, the rewards and the whole
dataset have loaded (minutes, for a large dataset). `check_inputs` reads directory listings, config.json
and the safetensors headers (no tensor), with no import of `datasets` or `transformers`: the training
command line runs it before it imports the trainer, and `Trainer` first thing. Hub names pass here; they
are downloaded, and checked the same way, when the model loads.
"""
from __future__ import annotations

import os

import ml_collections

from jaxrl_llm.data.files import check_tokenizer_path, data_file_extension
from jaxrl_llm.models.config import read_hf_config
from jaxrl_llm.models.hf import check_checkpoint


def local_model_dir(path: str, field: str = "model.path") -> str | None:
    """`path` when it is a local directory; None for a hub name. A path meant as local (absolute,
    starting with '.' or '~', or existing as a file) that is no directory is an error naming `field`."""
    if os.path.isdir(path):
        return path
    if path.startswith(("/", ".", "~")) or os.path.exists(path):
        raise FileNotFoundError(f"{field} {path!r} is not a directory")
    return None


def check_model_dir(path: str, tokenizer: str | None) -> None:
    """A local Hugging Face model directory: config.json readable and of a supported architecture, the
    tokenizer's files (from `tokenizer`, when it is this directory or another local one), and the
    safetensors weights complete with every tensor the config implies, at its shape."""
    config = read_hf_config(path)
    if tokenizer:
        check_tokenizer_path(tokenizer)
    check_checkpoint(path, config)


def check_inputs(c: ml_collections.ConfigDict, *, rows_given: bool = False) -> None:
    """The model (model.path, teacher.path), tokenizer, value model and data files (data.path unless
    `rows_given`, data.task or data.source; eval.path) of the prepared config `c`, where they are local."""
    if c.model.path and (model := local_model_dir(c.model.path)):
        check_model_dir(model, c.tokenizer or model)
    elif c.tokenizer:
        check_tokenizer_path(c.tokenizer)
    if c.teacher.path and (teacher := local_model_dir(c.teacher.path, "teacher.path")):
        check_model_dir(teacher, teacher)
    if c.value.enabled and c.value.init != "policy" and not os.path.isdir(c.value.init):
        raise FileNotFoundError(f"config.value.init {c.value.init!r} is neither 'policy' nor a directory (a Hugging "
                                "Face *ForSequenceClassification model)")
    if not rows_given and not c.data.task and not c.data.source:
        data_file_extension(c.data.path)
    if c.eval.every_steps and c.eval.path:
        data_file_extension(c.eval.path, "config.eval.path")  # named as evaluate/evaluator.py names it
