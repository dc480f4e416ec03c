"""JAX's multi-controller runtime: one process per host, the same program everywhere.

`initialize` starts `jax.distributed` when the environment calls for it; the other helpers move a batch
between this host's rows (NumPy, what rewards and data loading see) and global arrays (what jitted code
sees). With one process they reduce to plain device_put / device_get.
"""
from __future__ import annotations

import logging
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

log = logging.getLogger(__name__)


def initialize(coordinator: str = "", num_processes: int = 0, process_id: int = -1, timeout_s: int = 300):
    """Starts the multi-controller runtime when asked to, or when a cluster environment is detected.

    Explicit: `coordinator` host:port with `num_processes` and `process_id`. Automatic: a Cloud TPU pod
    (several workers in TPU_WORKER_HOSTNAMES / TPU metadata) or SLURM with more than one task, where
    `jax.distributed.initialize()` reads everything from the environment. Otherwise a no-op.
    A coordinator that cannot be reached fails after `timeout_s` with one line, never hangs.
    """
    explicit = bool(coordinator) or num_processes > 0 or process_id >= 0
    if explicit:
        if not coordinator or num_processes < 1 or not 0 <= process_id < num_processes:
            raise ValueError("multi-host flags need all of --coordinator=HOST:PORT, --num_processes=N >= 1 and "
                             f"--process_id in [0, N), got {coordinator!r}, {num_processes}, {process_id}")
        kwargs = dict(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    elif _cluster_detected():
        kwargs = {}
    else:
        return False
    try:
        jax.distributed.initialize(initialization_timeout=timeout_s, **kwargs)
    except Exception as e:
        where = coordinator or "the auto-detected coordinator"
        raise RuntimeError(f"could not join the multi-host run at {where} within {timeout_s}s: "
                           f"{' '.join(str(e).split())[:200]}") from None
    log.info("jax.distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
             jax.process_count(), jax.local_device_count(), jax.device_count())
    return True


def _cluster_detected() -> bool:
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if len([h for h in hosts.split(",") if h]) > 1:
        return True
    return int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in os.environ


def is_main() -> bool:
    return jax.process_index() == 0


def to_global(local: np.ndarray, sharding) -> jax.Array:
    """This host's rows (a contiguous slice of the global batch) -> a global array with `sharding`."""
    if jax.process_count() == 1:
        return jax.device_put(local, sharding)
    return jax.make_array_from_process_local_data(sharding, local)


def to_local(x: jax.Array) -> np.ndarray:
    """A global row-sharded array -> this host's rows as NumPy."""
    if jax.process_count() == 1 or x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    return np.asarray(multihost_utils.global_array_to_host_local_array(x, x.sharding.mesh, x.sharding.spec))


def to_host(x: jax.Array) -> np.ndarray:
    """The whole (global) array on every host."""
    if jax.process_count() == 1 or x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def allgather_rows(local: np.ndarray) -> np.ndarray:
    """Concatenates every host's rows (in process order) on every host."""
    if jax.process_count() == 1:
        return local
    return np.asarray(multihost_utils.process_allgather(local, tiled=True))


def sync(name: str):
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
