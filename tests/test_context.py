"""Attention over a sequence sharded along a mesh axis (models/context.py, the building block of a
`sequence` axis): on 8 fake CPU devices, meshes (data, sequence) = (4, 2), (2, 4), (1, 8), rows of 13
tokens (a multiple of no shard count: padded), a short row, a hole, two packed segments crossing shard
boundaries, with and without a sliding window and a soft cap: the output and the gradients of q, k, v
equal the dense attention of the whole rows to 1e-5 in float32. In a subprocess (tests/context_worker.py)
with its own XLA_FLAGS (tests/xla_flags.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from xla_flags import with_flags  # noqa: E402


def test_sequence_sharded_attention_equals_dense():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=with_flags("--xla_force_host_platform_device_count=8"),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "context_worker.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    worst = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(worst) == 6  # sequence 2, 4, 8 x (plain, window + soft cap)
    for case, diff in worst.items():
        assert diff < 1e-5, (case, diff)
