"""Shared by the code reward's attack tests: the bubblewrap requirement, the backend fixture and
a probe that runs attack code with the audit hook off and returns what it reported."""

import json
import os
import textwrap

import pytest

from jaxrl_llm.rewards.code import judge, launch

BWRAP_PROBLEM = launch.bwrap_problem()
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(20, 22) == 42", "assert add(-1, 1) == 0"]
STDIO_TESTS = {"inputs": ["1 2\n", "20 22\n"], "outputs": ["3\n", "42\n"]}


def require_bwrap():
    if BWRAP_PROBLEM is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must test the bubblewrap sandbox, but: {BWRAP_PROBLEM}")
    pytest.skip(f"no bubblewrap sandbox here: {BWRAP_PROBLEM}")


@pytest.fixture(params=["bwrap", "fallback"])
def backend(request):
    if request.param == "bwrap":
        require_bwrap()
    return request.param


def probe(code, *, timeout=5.0, memory_mb=128, disk_mb=8, audit=False):
    """Runs attack `code` in the bubblewrap sandbox (audit hook off); returns (result, the JSON the
    attack printed last, or None)."""
    require_bwrap()
    result = judge(textwrap.dedent(code), [], backend="bwrap", audit=audit, timeout=timeout, memory_mb=memory_mb,
                   disk_mb=disk_mb, file_size_mb=4)  # fmt: skip
    lines = result.stdout.strip().splitlines()
    try:
        return result, json.loads(lines[-1]) if lines else None
    except ValueError:
        return result, None


def runner_processes() -> list[int]:
    """Processes still running sandbox code started by this process. As root: any process with a
    uid from this process's sandbox uid block (other pytest workers have their own). Otherwise:
    any process running the runner (its source is in the command line)."""
    pool = launch._uid_pool
    block = range(pool["base"], pool["base"] + launch._UID_SLOTS)
    found = []
    for pid in os.listdir("/proc"):
        try:
            if os.geteuid() == 0 and pool["pid"] == os.getpid():
                with open(f"/proc/{pid}/status", "rb") as f:
                    status = f.read().decode()
                uids = status.split("Uid:")[1].split()[:4]
                zombie = status.split("State:")[1].split()[0] == "Z"  # dead, left to an init that reaps late
                if not zombie and any(int(u) in block for u in uids):
                    found.append(int(pid))
            else:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"def install_audit_hook" in f.read():
                        found.append(int(pid))
        except (OSError, ValueError, IndexError):
            pass
    return found
