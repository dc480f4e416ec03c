"""Subprocess side of tests/test_pods.py: the async and multi-turn trainers on one process or as one of
N processes (jax.distributed on 127.0.0.1, gloo collectives), on fake CPU devices.

  python tests/pods_worker.py OUT_DIR RUNS                 # one process, 4 devices
  python tests/pods_worker.py OUT_DIR RUNS ADDR N I        # process I of N, 4/N devices each

RUNS: comma-separated `CONFIG` or `CONFIG@NAME` (CONFIG a key of `CONFIGS`; NAME defaults to it); each
trains in the workdir OUT_DIR/w_<NAME> (an existing one is resumed) and process 0 writes
OUT_DIR/<NAME>.json (metrics per step of this run) and OUT_DIR/<NAME>.npz (final policy parameters).
A run named `term` is preempted instead: process 1 sends itself SIGTERM in step TERM_AT + 1, and each
process writes OUT_DIR/term<I>.json with the step it stopped after and why (put it last: a process
that got JAX's preemption notice keeps it). In a run named `fail` the rollout producer of process 1
raises on its first batch, and each process writes OUT_DIR/fail<I>.json with the error it stopped with.
XLA_FLAGS and JAX_PLATFORMS come from the test; nothing here imports jax at module level.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "configs")]
from overrides import apply_overrides  # noqa: E402

DEVICES = 4  # in all: the mesh (2, 2, 1) whatever the process count
STEPS = 4
TERM_AT = 1  # steps done when process 1 of the `term` run signals itself


def grpo_async():
    """(a) GRPO with k = 2 on the tiny model, a checkpoint every step (the resume checks restart from them)."""
    from scaling_worker import config
    return config((2, 2, 1), **{"total_steps": STEPS, "rollout.max_staleness": 2})


def grpo_rollout_mesh():
    """(b) GRPO with k = 1 on a rollout mesh of 2 devices (1 per host on 2 processes), 2 training devices."""
    from scaling_worker import config
    return config((1, 2, 1), **{"total_steps": 3, "rollout.max_staleness": 1, "mesh.rollout_devices": 2})


def grpo_partial():
    """(f) GRPO with partial rollouts (k = 2, 4 slots for 16 rows: rows continue across updates)."""
    from scaling_worker import config
    return config((2, 2, 1), **{"total_steps": STEPS, "rollout.max_staleness": 2, "rollout.partial": True,
                                "rollout.decode_slots": 4, "rollout.max_new_tokens": 6})


def multiturn(algo: str):
    """(c) configs/tiny_multiturn.py shrunk to a few steps, with a held-out evaluation of episodes."""
    import tiny_multiturn
    c = tiny_multiturn.get_config(f"algo={algo}")
    return apply_overrides(c, {"seed": 0, "total_steps": 2, "rollout.batch_prompts": 4, "rollout.group_size": 4,
                    "env.max_turns": 3, "rollout.max_new_tokens": 6,
                    "data.task_rows": 64, "eval.every_steps": 2, "eval.num_prompts": 4, "eval.k": 2,
                    "mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 1,
                    "checkpoint.every_steps": 1, "checkpoint.async_save": False, "log.progress": False,
                    "log.tensorboard": False, "export.at_end": False, "export.plot": False})


CONFIGS = {"grpo_k2": grpo_async, "grpo_mesh": grpo_rollout_mesh, "grpo_partial": grpo_partial, "mt_grpo": lambda: multiturn("grpo"),
           # PPO (not in CI): configs/tiny.py's 2 minibatches would leave 2 prompts for 4 row shards
           "mt_ppo": lambda: apply_overrides(multiturn("ppo"), {"train.minibatches": 1})}


def run(out_dir: str, spec: str):
    import jax
    import numpy as np
    from jaxrl_llm import distributed as dist
    from jaxrl_llm.trainer import Trainer
    config, _, name = spec.partition("@")
    t = Trainer(CONFIGS[config](), os.path.join(out_dir, f"w_{name or config}"))
    name = name or config
    if name == "term":
        return preempt(out_dir, t)
    if name == "fail":
        return fail(out_dir, t)
    history = t.run()
    params = jax.tree_util.tree_map(dist.to_host, t.state.params)  # collective across processes
    if not dist.is_main():
        return
    flat = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    np.savez(os.path.join(out_dir, f"{name}.npz"), **flat)
    rows = [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in history]
    sampling = None if t.rollout_mesh is None else [d.process_index for d in t.rollout_mesh.devices.flat]
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump({"metrics": rows, "start_step": t.start_step, "initial_eval": t.initial_eval,
                   "local_rows": t.data.local_batch_size, "rollout_mesh": sampling,
                   "training_devices": t.mesh.devices.size}, f)


def fail(out_dir: str, t):
    """Runs `t` with the producer thread of process 1 raising on its first batch; records each
    process's error (the test wants that error on every process, not a hang)."""
    import jax
    make = t.producer.make

    def broken(*args):
        if jax.process_index() == 1:
            raise ZeroDivisionError("the grader divided by zero on process 1")
        return make(*args)

    t.producer.make = broken  # the thread looks it up per batch
    try:
        t.run()
        record = {"error": None}
    except Exception as e:
        record = {"error": f"{type(e).__name__}: {e}"}
    with open(os.path.join(out_dir, f"fail{jax.process_index()}.json"), "w") as f:
        json.dump(record, f)


def preempt(out_dir: str, t):
    """Runs `t` with process 1 signalled at step TERM_AT + 1; records where each process stopped."""
    import signal

    import jax
    from jaxrl_llm.preemption import Preempted
    step = t.train_step

    def train_step(state):
        if jax.process_index() == 1 and int(state.step) == TERM_AT:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(state)

    t.train_step = train_step
    try:
        t.run()
        record = {"step": None}
    except Preempted as e:
        record = {"step": e.step, "reason": e.reason}
    with open(os.path.join(out_dir, f"term{jax.process_index()}.json"), "w") as f:
        json.dump(record, f)


def main(out_dir: str, runs: list[str], coordinator: str = "", n: int = 1, pid: int = 0):
    import jax
    if n > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        from jaxrl_llm import distributed as dist
        assert dist.initialize(coordinator, n, pid, timeout_s=120)
    assert jax.process_count() == n and jax.device_count() == DEVICES, (jax.process_count(), jax.devices())
    for name in runs:
        run(out_dir, name)


if __name__ == "__main__":
    try:
        args = sys.argv[1:]
        main(args[0], args[1].split(","), *(args[2:3]), *(int(a) for a in args[3:5]))
    except Exception:
        traceback.print_exc()
        sys.exit(1)
