"""Subprocess side of tests/test_scaling.py: runs the trainer on fake CPU devices and writes what it saw.

XLA_FLAGS (fake device count) and jax config (gloo collectives, the distributed runtime) must be set
before jax starts, and only in this process: the test imports this module for its constants alone, and
nothing here imports jax at module level.

  python tests/scaling_worker.py meshes OUT_DIR ITEMS      # 8 fake devices; ITEMS e.g. 1x1x1,2x2x2,restore:
                                                           # meshes (1x1x1 = the 1-device baseline),
                                                           # resharding restore, bad input (errors)
  python tests/scaling_worker.py process OUT_DIR ADDR N I  # process I of N (4 fake devices each)

Each run writes OUT_DIR/<name>.json (metrics per step, parameter shardings) and OUT_DIR/<name>.npz
(final policy parameters, gathered); the test compares them.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "configs")]
from overrides import apply_overrides  # noqa: E402

# The meshes of the equivalence test, (data, fsdp, tensor); the baseline is (1, 1, 1) on one device.
MESHES = [(8, 1, 1), (2, 2, 2), (1, 4, 2), (1, 2, 4)]
# "<mesh>+tokens": that mesh with micro-batches by a token budget (train.max_tokens_per_microbatch) of one
# row per row shard (the prompt bucket + NEW_TOKENS <= 16 + 3): groups split over micro-batches and chips.
TOKEN_BUDGET = {"train.max_tokens_per_microbatch": 19}
# Meshes with a sequence axis, (data, fsdp, tensor, sequence): "2x1x1x4+tokens" is GRPO on data 2 x sequence
# 4 with the token budget (19 x 4 tokens per row shard: 4 rows per micro-batch, each row's tokens over 4
# chips); "1x2x1x4+ppo" is PPO (value model) on fsdp 2 x sequence 4, against "1x1x1+ppo" on one device.
SEQUENCE_ITEMS = ["2x1x1x4+tokens", "1x2x1x4+ppo", "1x1x1+ppo"]
BATCH_PROMPTS, GROUP, NEW_TOKENS = 8, 2, 3


def config(mesh=(1, 1, 1), algo: str = "grpo", **overrides):
    """GRPO with a KL term (so the reference model is used) on a tiny model: hidden 32, 4 heads, 2 KV
    heads (tensor=2 divides both; tensor=4 does not divide the KV heads: replication fallback).
    mesh: (data, fsdp, tensor[, sequence])."""
    import tiny
    c = tiny.get_config(f"algo={algo}")
    c.seed = 0
    c.total_steps = 2
    c.model.hidden_size, c.model.num_layers, c.model.intermediate_size = 32, 1, 64
    c.model.num_heads, c.model.num_kv_heads = 4, 2
    c.rollout.batch_prompts, c.rollout.group_size, c.rollout.max_new_tokens = BATCH_PROMPTS, GROUP, NEW_TOKENS
    c.kl.coef = 0.04
    c.reward.functions = "fixtures_rewards:digit_fraction"  # reward variance from the first step
    c.data.task_rows = 64
    c.checkpoint.every_steps, c.checkpoint.async_save = 1, False
    c.log.progress, c.log.samples_every, c.log.tensorboard = False, 1, False
    c.export.at_end, c.export.plot = False, False
    c.eval.every_steps = 0
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh[:3]
    c.mesh.sequence = mesh[3] if len(mesh) > 3 else 1
    apply_overrides(c, overrides)
    return c


def spec_of(x) -> list:
    """A NamedSharding's PartitionSpec as JSON: one entry per dimension, None / axis / [axes]."""
    spec = tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec))
    return [list(s) if isinstance(s, tuple) else s for s in spec]


def shardings(trainer) -> dict:
    """Specs of parameters, Adam moments and reference, keyed by parameter path."""
    import jax
    from jax.tree_util import keystr
    out = {"params": {keystr(p): spec_of(x) for p, x in jax.tree_util.tree_flatten_with_path(trainer.state.params)[0]}}
    adam = trainer.state.opt_state[-1][0]  # chain(clip, adamw) -> adamw = chain(scale_by_adam, ...)
    out["mu"] = {keystr(p): spec_of(x) for p, x in jax.tree_util.tree_flatten_with_path(adam.mu)[0]}
    if trainer.frozen_ref is not None:
        out["ref"] = {keystr(p): spec_of(x) for p, x in jax.tree_util.tree_flatten_with_path(trainer.frozen_ref)[0]}
    out["opt_count"] = spec_of(adam.count)
    return out


def save_run(out_dir: str, name: str, trainer, history, extra=None):
    import jax
    import numpy as np
    from jaxrl_llm import distributed as dist
    params = jax.tree_util.tree_map(dist.to_host, trainer.state.params)  # collective across processes
    if not dist.is_main():
        return
    flat = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    np.savez(os.path.join(out_dir, f"{name}.npz"), **flat)
    rows = [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in history]
    record = {"metrics": rows, "shardings": shardings(trainer), **(extra or {})}
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(record, f)


class Notes:
    """Collects the sharding module's log records (the replication fallback notes) while active."""

    def __enter__(self):
        import logging
        self.messages, logger = [], logging.getLogger("jaxrl_llm.sharding")
        self.handler = logging.Handler(logging.INFO)
        self.handler.emit = lambda record: self.messages.append(record.getMessage())
        logger.addHandler(self.handler)
        self.level = logger.level
        logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        import logging
        logger = logging.getLogger("jaxrl_llm.sharding")
        logger.removeHandler(self.handler)
        logger.setLevel(self.level)


def error_of(fn) -> str:
    try:
        fn()
    except Exception as e:  # the test checks the message is one clear line
        return f"{type(e).__name__}: {e}"
    return "no error"


def kv_cache_layout(trainer) -> dict:
    """The per-device shapes of every float32 buffer of rank >= 4 in the sampler's program compiled on this
    mesh (the decode cache among them, in whatever layout the sampler gives it), and the cache's global
    dimensions (L, N, T, Hkv, hd)."""
    import jax
    import numpy as np
    from jaxrl_llm import sharding
    from jaxrl_llm.sampling import generate_program
    mc, c = trainer.mc, trainer.c
    rows = sharding.batch_sharding(trainer.mesh, 2)
    prompts = jax.ShapeDtypeStruct((BATCH_PROMPTS, c.data.max_prompt_length), np.int32, sharding=rows)
    key = jax.ShapeDtypeStruct((2,), np.uint32, sharding=sharding.replicated(trainer.mesh))
    with sharding.use_mesh(trainer.mesh):
        hlo = generate_program.lower(mc, trainer.state.params, prompts, prompts, key, np.float32(1.0), np.float32(1.0),
                              max_new_tokens=c.rollout.max_new_tokens, num_samples=GROUP, top_k=0, greedy=False,
                              nucleus=False, eos_ids=trainer.eos_ids, pad_id=trainer.pad_id).compile().as_text()
    shapes = sorted({tuple(int(d) for d in m.split(",")) for m in re.findall(r"\bf32\[(\d+(?:,\d+){3,})\]", hlo)})
    return {"global": [mc.num_layers, BATCH_PROMPTS * GROUP, c.rollout.max_new_tokens, mc.num_kv_heads, mc.head_dim],
            "prompt_length": c.data.max_prompt_length, "shapes": shapes}


# ==================================================================================== 8 fake devices
def meshes(out_dir: str, items: list[str]):
    """Runs `items` in order: mesh names (1x1x1 is the 1-device baseline; "+tokens": with TOKEN_BUDGET),
    `restore` (after 2x2x2 and,
    for compiled programs to reuse, 1x4x2) and `errors` (after 1x1x1). The test splits them over two
    processes so that no long chain of compilations is left for one core at the end."""
    import jax
    from jaxrl_llm.trainer import Trainer
    devices = jax.devices()
    assert len(devices) == 8, devices
    for item in items:
        if item == "restore":
            restore(out_dir, devices)
        elif item == "errors":
            bad_input(out_dir, devices)
        else:
            name, *tags = item.split("+")
            mesh = tuple(int(v) for v in name.split("x"))
            c = config(mesh, "ppo" if "ppo" in tags else "grpo", **(TOKEN_BUDGET if "tokens" in tags else {}))
            with Notes() as notes:
                t = Trainer(c, os.path.join(out_dir, f"w_{item}"), devices=devices[:1] if mesh == (1, 1, 1) else devices)
            extra = {"notes": notes.messages}
            if item == "2x2x2":
                extra["kv_cache"] = kv_cache_layout(t)
            save_run(out_dir, item, t, t.run(), extra)


def restore(out_dir: str, devices):
    """Resharding restore: the (2,2,2) run's checkpoint of step 1 continues on (1,4,2)."""
    from jaxrl_llm.trainer import Trainer
    src, dst = os.path.join(out_dir, "w_2x2x2"), os.path.join(out_dir, "w_restore")
    shutil.copytree(src, dst)
    shutil.rmtree(os.path.join(dst, "checkpoints", "2"))
    os.remove(os.path.join(dst, "DONE"))
    t = Trainer(config((1, 4, 2)), dst, devices=devices)
    save_run(out_dir, "restore_2x2x2_to_1x4x2", t, t.run(), {"start_step": t.start_step})


def bad_input(out_dir: str, devices):
    from jaxrl_llm.trainer import Trainer
    errors = {
        "mesh_size": error_of(lambda: Trainer(config((2, 2, 1)), os.path.join(out_dir, "e1"), devices=devices)),
        "batch": error_of(lambda: Trainer(config((8, 1, 1), **{"rollout.batch_prompts": 4}),
                                          os.path.join(out_dir, "e2"), devices=devices)),
    }
    # A checkpoint of another model (hidden 48): only its checkpoints, so no config.json refuses it first.
    other = os.path.join(out_dir, "w_other_model")
    os.makedirs(other)
    shutil.copytree(os.path.join(out_dir, "w_1x1x1", "checkpoints"), os.path.join(other, "checkpoints"))
    errors["model"] = error_of(lambda: Trainer(config(**{"model.hidden_size": 48}), other, devices=devices[:1]))
    with open(os.path.join(out_dir, "errors.json"), "w") as f:
        json.dump(errors, f)


# ==================================================================================== one of N processes
def process(out_dir: str, coordinator: str, num_processes: int, process_id: int):
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from jaxrl_llm import distributed as dist
    assert dist.initialize(coordinator, num_processes, process_id, timeout_s=120)
    import numpy as np
    from jaxrl_llm import sharding
    from jaxrl_llm.trainer import Trainer
    assert jax.process_count() == num_processes and jax.device_count() == 4 * num_processes

    # Row helpers on a mesh where every host's devices need every row (tensor spans the hosts): the
    # all-gather path, next to the local one the trainer takes on (2,2,2).
    wide = sharding.make_mesh(1, 1, jax.device_count())
    rows = np.arange(4 * 3, dtype=np.int32).reshape(4, 3) + 100 * process_id
    x = dist.to_global(rows, sharding.batch_sharding(wide, 2))
    helpers = {"wide_local": bool(dist._blocks_local(x.sharding, x.shape)),
               "wide_roundtrip": bool(np.array_equal(dist.to_local(x), rows)),
               "wide_full": dist.to_host(x).tolist()}
    big = dist.to_global(np.arange(6 * 5, dtype=np.float32).reshape(6, 5) + 1000 * process_id,
                         sharding.batch_sharding(sharding.make_mesh(2, 2, 2), 2))
    helpers["chunked_gather_equal"] = bool(np.array_equal(dist.to_host(big, max_bytes=24), dist.to_host(big)))

    workdir = os.path.join(out_dir, "w_2proc")
    t = Trainer(config((2, 2, 2), **{"export.at_end": True}), workdir)
    history = t.run()
    save_run(out_dir, "2proc", t, history, {"helpers": helpers, "local_rows": t.data.local_batch_size})
    with open(os.path.join(out_dir, f"process{process_id}.json"), "w") as f:
        json.dump({"metrics": [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in history],
                   "helpers": helpers}, f)
    # A sequence axis across the processes: sequence 8 over both hosts' devices (each row's tokens on 8 chips
    # of 2 hosts; the sampler's rows over them too).
    t = Trainer(config((1, 1, 1, 8)), os.path.join(out_dir, "w_2proc_seq"))
    save_run(out_dir, "2proc_seq", t, t.run())


if __name__ == "__main__":
    try:
        mode, out = sys.argv[1], sys.argv[2]
        if mode == "meshes":
            meshes(out, sys.argv[3].split(","))
        elif mode == "process":
            process(out, sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    except Exception:
        traceback.print_exc()
        sys.exit(1)
