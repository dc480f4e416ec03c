"""The splash and cuDNN kernels composed with the sequence axis (models/context_kernels.py), on 8 fake CPU
devices, each run in a subprocess (tests/context_kernels_worker.py) with its own XLA_FLAGS
(tests/xla_flags.py): splash in Pallas' interpreter, cuDNN's wrapper through JAX's 'xla' reference of the
same call, each shard's two query chunks at their static offsets (`lax.switch` on the shard index), against
one device's dense attention: outputs at the real queries and the q, k, v [and prefix] gradients to 1e-5
(float32), rows of 13 tokens with a left-padded prompt then right padding, a hole and packed segments across
shard boundaries; sliding windows, splash's soft cap, a shared prompt prefix; and cuDNN inside the decoder's
passes. cuDNN itself and splash's compiled TPU kernel do not run here.
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


def worker(*args: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=with_flags("--xla_force_host_platform_device_count=8"),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "context_kernels_worker.py"), *args],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("impl,which", [("cudnn", "all"), ("splash", "first"), ("splash", "last"),
                                        ("cudnn-model", "all")])
def test_kernel_on_the_sequence_axis_equals_one_device(impl, which):
    """cudnn-model: the decoder's trainer passes (tests/context_worker.py `passes`) with cudnn forced, on data 4 x
    sequence 2, against one device's dense path: log-probs, loss and every gradient (excess over rtol 1e-5)."""
    if impl == "splash":
        pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")
    worst = worker(impl, which)
    assert len(worst) == {"all": 4, "first": 2, "last": 2}[which] - (impl == "cudnn-model"), sorted(worst)
    for case, diff in worst.items():
        assert diff < 1e-5, (case, diff)


def test_a_wrong_chunk_offset_fails_the_comparison():
    """The cases see a chunk's offset: each shard's first chunk placed one chunk later breaks every one."""
    worst = worker("cudnn", "all", "mutate")
    assert len(worst) == 4 and min(worst.values()) > 0.1, worst
