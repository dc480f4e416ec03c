"""Context parallelism (`mesh.sequence`, models/context.py) on 8 fake CPU devices, each case in a
subprocess (tests/context_worker.py) with its own XLA_FLAGS (tests/xla_flags.py), against one device:

- attention: the zigzag layout's sharded attention against the dense attention of the whole rows (no
  blocks, no gather), sequence 2, 4, 8, with and without a window + soft cap, with and without a prompt
  prefix: outputs and the q, k, v (and prefix) gradients to 1e-5;
- dense / moe: the decoder's trainer passes (prompt-shared completions, packed rows) on meshes with a
  sequence axis of 2, 4, 8 beside data, fsdp and tensor: per-token log-probs, the loss and every
  parameter's gradient (and the MoE router's sums, with and without routing replay) to atol = rtol = 1e-5
  in float32, on 11-token completions (a multiple of no shard count), a sliding-window model with soft caps
  and LoRA adapters;
  and data 4 x tensor 2 without a sequence axis on 2 prompts (rows its shards do not divide: the embedding's
  gradient was off by 4,900 of 570 before models/layout.py `constrain`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from xla_flags import with_flags  # noqa: E402

# cases each kind reports (a case that stopped being checked fails the count)
CASES = {"attention": 12, "dense": 12, "moe": 16}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_sequence_axis_equals_one_device(kind):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=with_flags("--xla_force_host_platform_device_count=8"),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "context_worker.py"), kind], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    worst = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(worst) == CASES[kind], sorted(worst)
    for case, diff in worst.items():
        assert diff < 1e-5, (case, diff)
