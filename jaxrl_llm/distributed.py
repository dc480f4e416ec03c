"""JAX's multi-controller runtime: one process per host, the same program everywhere.

`initialize` starts `jax.distributed` when the environment calls for it; the other helpers move a batch
between this host's rows (NumPy, what rewards and data loading see) and global arrays (what jitted code
sees). With one process they reduce to plain device_put / device_get.

Rows: a global batch of n rows is split over the P processes in contiguous blocks, process p owning rows
[p*n/P, (p+1)*n/P) -- exactly the slice the prompt iterator gives each host. When the mesh puts each
process's block on that process's own devices (the usual layout: data/fsdp outermost over hosts),
arrays are assembled from and read back to host-local data without any communication. Any other
layout (e.g. a tensor axis spanning hosts, so every host's devices need every row) goes through an
all-gather of the rows instead: slower, never wrong.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxrl_llm.compile_options import jit

log = logging.getLogger(__name__)


# ============================================================================================ start-up
def initialize(coordinator: str = "", num_processes: int = 0, process_id: int = -1, timeout_s: int = 300) -> bool:
    """Starts the multi-controller runtime when asked to, or when a cluster environment is detected.

    Explicit: `coordinator` host:port with `num_processes` and `process_id`. Automatic: JAX's own
    cluster detection (`jax._src.clusters`: Cloud TPU pods through the TPU metadata server, GKE, SLURM,
    Open MPI, ...) finding more than one process. Otherwise (one host) a no-op; returns whether it
    started. A coordinator that cannot be reached within `timeout_s` raises one RuntimeError line
    (JAX itself would abort the process with a C++ stack trace when its connection deadline passes).
    """
    explicit = bool(coordinator) or num_processes > 0 or process_id >= 0
    if explicit:
        if not coordinator or num_processes < 1 or not 0 <= process_id < num_processes:
            raise ValueError("multi-host flags need all of --coordinator=HOST:PORT, --num_processes=N >= 1 and "
                             f"--process_id in [0, N), got {coordinator!r}, {num_processes}, {process_id}")
        source = "flags"
    else:
        detected = detect_cluster(timeout_s)
        if detected is None:
            return False
        source, coordinator, num_processes, process_id = detected
    if num_processes == 1:
        return False
    host, port = _split_address(coordinator)
    deadline = time.monotonic() + timeout_s
    if process_id != 0:  # process 0 runs the coordinator service itself
        _wait_reachable(host, port, deadline, f"process {process_id} of {num_processes} ({source})", timeout_s)
    log.info("jax.distributed (%s): process %d of %d joining %s (timeout %ds)", source, process_id,
             num_processes, coordinator, timeout_s)
    # Past this point only a failure of another process can stop the start (JAX aborts the process
    # when its deadline passes); the line above says what it was waiting for.
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id,
                               initialization_timeout=max(1, int(deadline - time.monotonic())))
    log.info("jax.distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
             jax.process_count(), jax.local_device_count(), jax.device_count())
    return True


def detect_cluster(timeout_s: int = 300) -> tuple[str, str, int, int] | None:
    """(environment name, coordinator host:port, process count, process id) from JAX's cluster
    detection, or None outside any known cluster. Uses the same `ClusterEnv` classes that
    `jax.distributed.initialize()` consults, so a Cloud TPU VM is recognized through its metadata
    server even where TPU_WORKER_HOSTNAMES is unset."""
    try:
        from jax._src import clusters
        envs = [e for e in clusters.ClusterEnv._cluster_types if not e.opt_in_only_method]
    except (ImportError, AttributeError) as e:  # a private module: a future jax may move it
        log.warning("JAX's cluster detection is unavailable (%s); multi-host needs --coordinator flags", e)
        return None
    for env in envs:
        try:
            present = env.is_env_present()
        except Exception:  # an environment whose probe fails (no metadata server, ...) is not this one
            present = False
        if not present:
            continue
        name = getattr(env, "name", "") or env.__name__
        try:
            count = int(env.get_process_count())
            if count <= 1:
                return name, "", 1, 0
            address = env.get_coordinator_address(timeout_secs=timeout_s,
                                                  override_coordinator_port=os.environ.get("JAX_COORDINATOR_PORT"))
            return name, address, count, int(env.get_process_id())
        except Exception as e:
            raise RuntimeError(f"detected a {name} cluster but could not read its coordinator, process count "
                               f"or id: {_one_line(e)}") from None
    return None


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"coordinator address must be HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def _wait_reachable(host: str, port: int, deadline: float, who: str, timeout_s: float) -> None:
    """Retries a TCP connection to the coordinator until it accepts or `deadline` (monotonic) passes;
    processes start in any order, so a refused connection is normal for a while."""
    last = "no attempt"
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(2.0, deadline - time.monotonic()))):
                return
        except OSError as e:
            last = _one_line(e)
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{who}: the coordinator {host}:{port} was not reachable within {timeout_s:g}s "
                               f"({last}); is process 0 running there, with the port open?")
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


# ============================================================================================ rows
_scope = threading.local()  # `host_only` is per thread: the trainer's thread keeps the global view


@contextlib.contextmanager
def host_only():
    """In this thread, the row helpers below treat this host's rows as the whole batch: no collective,
    arrays on a mesh of this host's devices. What the rollout producer thread of a rollout mesh across
    hosts runs under (trainer/async_rollout.py): a collective issued there would not be ordered with the
    trainer thread's across hosts."""
    before = getattr(_scope, "host_only", False)
    _scope.host_only = True
    try:
        yield
    finally:
        _scope.host_only = before


def _processes() -> int:
    """The process count the row helpers see: 1 under `host_only`."""
    return 1 if getattr(_scope, "host_only", False) else jax.process_count()


def is_main() -> bool:
    return jax.process_index() == 0


def host_rows(n_rows: int) -> slice:
    """This process's block of a global batch of `n_rows` rows (what its data iterator yields)."""
    if _processes() == 1:
        return slice(0, n_rows)
    per = n_rows // jax.process_count()
    return slice(jax.process_index() * per, (jax.process_index() + 1) * per)


@functools.lru_cache(maxsize=64)
def _blocks_local(sharding, shape: tuple[int, ...]) -> bool:
    """True when every process's devices hold exactly its own block of rows, whole in every other
    dimension: then host-local data maps onto the devices with no communication. The same answer
    on every process (it looks at all devices), so collectives taken on False are taken by all."""
    n, count = shape[0], jax.process_count()
    per = n // count
    spans: dict[int, list[tuple[int, int]]] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        rows, rest = index[0], index[1:]
        if any(s.indices(d)[:2] != (0, d) for s, d in zip(rest, shape[1:])):
            return False
        spans.setdefault(device.process_index, []).append(rows.indices(n)[:2])
    for p, intervals in spans.items():
        covered, end = [], None
        for start, stop in sorted(set(intervals)):
            if end is not None and start > end:
                return False  # a gap inside this process's rows
            end = stop if end is None else max(end, stop)
            covered.append((start, stop))
        if (covered[0][0], end) != (p * per, (p + 1) * per):
            return False
    return True


def to_global(local: np.ndarray, sharding) -> jax.Array:
    """This host's rows (its block of the global batch) -> a global array with `sharding`."""
    local = np.asarray(local)
    if _processes() == 1:
        return jax.device_put(local, sharding)
    shape = (local.shape[0] * jax.process_count(), *local.shape[1:])
    if _blocks_local(sharding, shape):
        return jax.make_array_from_process_local_data(sharding, local, shape)
    full = allgather_rows(local)
    return jax.make_array_from_callback(shape, sharding, lambda index: full[index])


def to_local(x: jax.Array) -> np.ndarray:
    """A global array whose rows are this run's batch -> this host's block of rows, as NumPy."""
    if _processes() == 1:
        return np.asarray(jax.device_get(x))
    rows = host_rows(x.shape[0])
    if not _blocks_local(x.sharding, x.shape):
        return to_host(x)[rows]
    out = np.empty((rows.stop - rows.start, *x.shape[1:]), x.dtype)
    for shard in x.addressable_shards:  # replicas of one block write the same values
        start, stop, _ = shard.index[0].indices(x.shape[0])
        out[start - rows.start:stop - rows.start] = np.asarray(shard.data)
    return out


def to_host(x: jax.Array, max_bytes: int = 1 << 28) -> np.ndarray:
    """The whole (global) array as NumPy on every host (a collective: every process must call it).

    Across processes the array is gathered in pieces of at most ~`max_bytes` along its first axis
    (layers for stacked weights, vocabulary for embeddings): gathering a whole 7B-model weight at once
    would replicate gigabytes onto every chip next to the training state.
    """
    if _processes() == 1 or x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    if x.ndim == 0 or x.nbytes <= max_bytes:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    step = max(1, int(max_bytes // max(1, x.nbytes // x.shape[0])))
    pieces = [np.asarray(multihost_utils.process_allgather(_slice_rows(x, start, min(step, x.shape[0] - start)),
                                                           tiled=True))
              for start in range(0, x.shape[0], step)]
    return np.concatenate(pieces)


def _slice_rows(x: jax.Array, start: int, size: int) -> jax.Array:
    return _row_slicer(size)(x, np.int32(start))


@functools.lru_cache(maxsize=None)
def _row_slicer(size: int):
    # One program per piece size (the start is traced); the output keeps the input's layout elsewhere.
    return jit(lambda x, start: jax.lax.dynamic_slice_in_dim(x, start, size, axis=0))


def allgather_rows(local: np.ndarray) -> np.ndarray:
    """Concatenates every host's rows (in process order) on every host."""
    if _processes() == 1:
        return local
    return np.asarray(multihost_utils.process_allgather(local, tiled=True))


def allgather_lists(lists: list) -> list[list[int]]:
    """Every host's lists of ints (the same count on every host), concatenated in process order on
    every host: two gathers, of the lengths and of the lists right-padded to the longest."""
    if _processes() == 1:
        return [list(x) for x in lists]
    lengths = allgather_rows(np.asarray([len(x) for x in lists], np.int32))
    padded = np.zeros((len(lists), max(1, int(lengths.max(initial=0)))), np.int32)
    for i, x in enumerate(lists):
        padded[i, :len(x)] = x
    return [row[:k].tolist() for row, k in zip(allgather_rows(padded), lengths)]


def any_process(flag: bool) -> bool:
    """True on every host when `flag` is True on any: one decision that all hosts' collectives follow."""
    if _processes() == 1:
        return bool(flag)
    return bool(allgather_rows(np.array([bool(flag)])).any())


def fetch(x) -> np.ndarray:
    """A (small) global array as NumPy on every host: `to_host` where it spans other hosts' devices."""
    if _processes() == 1 or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(jax.device_get(x))
    return to_host(x)


def sync(name: str):
    if _processes() > 1:
        multihost_utils.sync_global_devices(name)
