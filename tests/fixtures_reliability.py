"""Helpers of the reliability tests: the training/export CLIs as subprocesses, and reward functions that
break their contract (addressable as `fixtures_reliability:<name>` with tests/ on PYTHONPATH).

Every CLI run gets `JAX_COMPILATION_CACHE_DIR` (a directory per test session) in its environment: the
runs share the tiny shapes below, so only the first one compiles; the others load the executables,
which are the same programs (the numbers do not change). This is set per subprocess, never globally.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")

# tests/test_trainer.py's small_config as command-line overrides of configs/tiny.py (every checkpoint kept).
SMALL = {
    "total_steps": 4, "model.hidden_size": 32, "model.num_layers": 1, "model.intermediate_size": 64,
    "rollout.batch_prompts": 4, "rollout.group_size": 2, "rollout.max_new_tokens": 3, "train.minibatches": 1,
    "reward.functions": "fixtures_rewards:digit_fraction", "data.task_rows": 64, "checkpoint.every_steps": 1,
    "checkpoint.max_to_keep": 10, "log.progress": False, "log.samples_every": 1, "log.tensorboard": False,
    "export.at_end": False, "export.plot": False, "eval.every_steps": 0,
}


def train_args(workdir, **overrides) -> list[str]:
    """Arguments of `python -m jaxrl_llm.train` for the small config; keys use '.' or '__' for nesting."""
    fields = {**SMALL, **{k.replace("__", "."): v for k, v in overrides.items()}}
    return [f"--config={ROOT}/configs/tiny.py", f"--workdir={workdir}",
            *(f"--config.{k}={v}" for k, v in fields.items())]


def cli_env(cache_dir=None, fault: str = "", **extra) -> dict:
    """The CLI's environment: the compilation cache (`cache_dir`; this process's when None), the fault point,
    and the test run's XLA flags after the case's own (`XLA_FLAGS` in `extra`: a fake device count), so that
    the CLI compiles as this process does."""
    env = {k: v for k, v in os.environ.items() if k != "JAXRL_LLM_FAULT"}
    if cache_dir is not None:
        env.update(JAX_COMPILATION_CACHE_DIR=str(cache_dir), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    env.update(PYTHONPATH=os.pathsep.join([ROOT, TESTS]), JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false",
               **extra)
    env["XLA_FLAGS"] = xla_flags.with_flags(extra.get("XLA_FLAGS", ""))
    if fault:
        env["JAXRL_LLM_FAULT"] = fault
    return env


def run_cli(module: str, args: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m jaxrl_llm.<module> ARGS`, run from the repository root, output captured as text."""
    return subprocess.run([sys.executable, "-m", f"jaxrl_llm.{module}", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout)


def learning_run(config: str, workdir, **overrides) -> list[dict]:
    """`python -m jaxrl_llm.train --config=configs/CONFIG --workdir=WORKDIR --config.KEY=VALUE...` as the README
    runs it, with XLA's default optimization (a learning run executes hundreds of steps: there the test
    run's unoptimized code, tests/xla_flags.py, costs more than it saves); its metrics rows."""
    env = dict(cli_env(), XLA_FLAGS="")
    args = [f"--config={ROOT}/configs/{config}", f"--workdir={workdir}",
            *(f"--config.{k.replace('__', '.')}={v}" for k, v in overrides.items())]
    proc = run_cli("train", args, env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_jsonl(os.path.join(workdir, "metrics.jsonl"))


def error_lines(stderr: str, prog: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"{prog}: error:")]


def read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def without_perf(rows: list[dict]) -> list[dict]:
    """Metric rows without the wall-clock ones (perf/*), which differ between any two runs."""
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def committed_steps(workdir) -> list[int]:
    """Checkpoint steps committed in `workdir` (Orbax names a finished step by its number alone)."""
    d = os.path.join(workdir, "checkpoints")
    return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def read_state(workdir, step: int) -> dict[str, np.ndarray]:
    """The whole train state of checkpoint `step`, flattened to {path: array}, read without a target."""
    import warnings

    import jax
    import orbax.checkpoint as ocp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sharding info not provided": the test reads on one CPU device
        tree = ocp.PyTreeCheckpointer().restore(os.path.join(workdir, "checkpoints", str(step), "state"))
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def truncate_largest_file(directory, keep: float = 0.5) -> str:
    """Cuts the largest file under `directory` (a model's or checkpoint's array data) to `keep` of its
    size, as a torn write leaves it; returns its path."""
    files = [os.path.join(r, f) for r, _, fs in os.walk(directory) for f in fs]
    path = max(files, key=os.path.getsize)
    with open(path, "r+b") as f:
        f.truncate(int(os.path.getsize(path) * keep))
    return path


def flip_a_parameter_bit(state_dir) -> str:
    """Rewrites the Orbax `state` item of a checkpoint with one bit of one policy parameter flipped and
    its metadata (checksums) left as saved: the silent damage that only the checksums can see, wherever
    Orbax puts the bytes. Returns the damaged array's path."""
    import shutil

    import jax
    import orbax.checkpoint as ocp

    checkpointer = ocp.StandardCheckpointer()
    tree = checkpointer.restore(str(state_dir))
    (path, leaf), *_ = jax.tree_util.tree_leaves_with_path(tree["params"])
    words = np.array(leaf).reshape(-1).view(np.uint32 if leaf.dtype.itemsize == 4 else np.uint16)
    words[0] ^= 1
    flipped = words.view(leaf.dtype).reshape(leaf.shape)
    tree["params"] = jax.tree_util.tree_map_with_path(lambda p, x: flipped if p == path else x, tree["params"])
    shutil.rmtree(state_dir)
    checkpointer.save(str(state_dir), tree)
    checkpointer.wait_until_finished()
    return jax.tree_util.keystr(path)


# ---------------------------------------------------------------------------- broken reward functions
def always_raises(prompts, completions, **_):
    raise ZeroDivisionError("the grader divided by zero")


def returns_strings(prompts, completions, **_):
    return ["high"] * len(completions)


# --------------------------------------------------------------------------- poisoned training CLI
POISON_ENV = "RELIABILITY_POISON"


def poisoned_train(spec: str) -> None:
    """The training CLI (`jaxrl_llm.train`'s absl main, same flags) with the scores of chosen steps
    poisoned after the reward functions ran: spec "2:nan,4:inf" sets row 0's score of step 2 to NaN and
    of step 4 to +inf (steps counted from 1 in this process, i.e. a run started afresh).

    Why poison scores: the reward API rejects non-finite rewards, so a NaN can only come from the
    numerics after it (an overflow in the model, a bf16 underflow...). A non-finite score reaches the
    jitted update through the real advantage and loss code and makes the loss and gradients NaN.
    """
    import dataclasses
    import itertools

    from absl import app

    from jaxrl_llm import train
    from jaxrl_llm.trainer import rollout
    poison = {int(s): float(v) for s, v in (p.split(":") for p in spec.split(","))}
    score_rewards, calls = rollout.score_rewards, itertools.count(1)

    def poisoned(*args, **kwargs):
        batch = score_rewards(*args, **kwargs)
        value = poison.get(next(calls))
        if value is not None:
            scores = np.array(batch.scores, np.float32)
            scores[0] = value
            batch = dataclasses.replace(batch, scores=scores)
        return batch

    rollout.score_rewards = poisoned
    from jaxrl_llm.cli import flags_parser
    app.run(train.main, flags_parser=flags_parser("jaxrl_llm.train"))


if __name__ == "__main__":
    poisoned_train(os.environ[POISON_ENV])
