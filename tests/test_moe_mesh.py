"""A mixture-of-experts model on 8 fake CPU devices with an `expert` mesh axis (experts' weights sharded
over it) equals one device: log-probs, loss and every gradient to 1e-5. The meshes run in a subprocess
(tests/moe_mesh_worker.py) with its own XLA_FLAGS (8 fake devices, then the test run's, tests/xla_flags.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from moe_mesh_worker import MESHES  # noqa: E402  (constants only: no jax there)
from xla_flags import with_flags  # noqa: E402


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("moe_mesh"))
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=with_flags("--xla_force_host_platform_device_count=8"),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "moe_mesh_worker.py"), out], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {shape: dict(np.load(os.path.join(out, "x".join(map(str, shape)) + ".npz"))) for shape in MESHES}


@pytest.mark.parametrize("shape", MESHES[1:], ids=lambda s: "data{}_fsdp{}_expert{}_tensor{}".format(*s))
def test_expert_mesh_equals_one_device(results, shape):
    one, many = results[MESHES[0]], results[shape]
    assert str(many["gate_spec"]).count("expert") == 1  # the experts' axis is sharded over `expert`
    assert set(one) == set(many)
    for name in one:
        if name != "gate_spec":
            np.testing.assert_allclose(many[name], one[name], atol=1e-5, rtol=1e-5, err_msg=name)
