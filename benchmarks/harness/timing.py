"""Timing of the benchmark scripts: synchronized calls, warm-up then repeats, several functions side by side
(interleaved, so the load of a shared machine hits all alike), the measured matmul peak, peak RSS.

Benchmarks are scripts, never timed tests: everything here measures and prints, nothing asserts on time.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp


# ------------------------------------------------------------------------------------------- timing
def block(x: Any) -> Any:
    """Waits for every jax array in the pytree `x` (no-op on torch tensors and Python values)."""
    for leaf in jax.tree_util.tree_leaves(x):
        if isinstance(leaf, jax.Array):
            leaf.block_until_ready()
    return x


@dataclasses.dataclass(frozen=True)
class Timing:
    """Wall-clock seconds: `first` is the first call (compile + run for jitted code), `runs` the repeats."""

    first: float
    runs: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def spread(self) -> float:
        """(max - min) / median of the repeats: how noisy the machine was during the measurement."""
        return (max(self.runs) - min(self.runs)) / self.median

    @property
    def warmup(self) -> float:
        """The first call's extra cost over a steady-state call (compilation, caches, allocator)."""
        return max(self.first - self.median, 0.0)


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def wait_for_idle(max_busy: float = 0.15, window: float = 0.5, timeout: float = 120.0) -> float:
    """Waits until the whole machine was at most `max_busy` busy over the last `window` seconds (other
    processes of a shared machine), or `timeout` passed. Returns the busy fraction last seen. Without
    /proc/stat (not Linux) it returns at once with NaN. Call it only when this process is idle."""
    if not os.path.exists("/proc/stat"):
        return float("nan")
    deadline = time.monotonic() + timeout
    while True:
        b0, t0 = _cpu_times()
        time.sleep(window)
        b1, t1 = _cpu_times()
        busy = (b1 - b0) / max(t1 - t0, 1e-9)
        if busy <= max_busy or time.monotonic() > deadline:
            return busy


def time_fn(fn: Callable[[int], Any], *, repeats: int, warmup: int = 1) -> Timing:
    """Times `fn(i)` (i = call index, e.g. to vary the seed): `warmup` calls, then `repeats` timed ones.
    Every call is synchronized with `block`, so asynchronous dispatch is not timed as done work."""
    return time_interleaved({"fn": fn}, repeats=repeats, warmup=warmup)["fn"]


def time_interleaved(fns: dict[str, Callable[[int], Any]], *, repeats: int, warmup: int = 1,
                     before_each: Callable[[], Any] | None = None) -> dict[str, Timing]:
    """Times several functions side by side: each round runs every function once, so a change of load on
    a shared machine hits all of them alike instead of whichever happened to run last. Returns a Timing
    per name; `first` is each function's first call (compilation included for jitted code).
    `before_each` (e.g. `wait_for_idle`) runs untimed before every call."""
    if repeats < 1 or warmup < 1:
        raise ValueError(f"repeats and warmup must be >= 1, got repeats={repeats}, warmup={warmup}")
    first: dict[str, float] = {}
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(warmup + repeats):
        for name, fn in fns.items():
            if before_each is not None:
                before_each()
            t0 = time.perf_counter()
            block(fn(i))
            dt = time.perf_counter() - t0
            if i == 0:
                first[name] = dt
            elif i >= warmup:
                runs[name].append(dt)
    return {name: Timing(first=first[name], runs=tuple(runs[name])) for name in fns}


def matmul_peak_flops(n: int = 2048, repeats: int = 10, dtype=jnp.float32, precision=None) -> float:
    """Measured FLOP/s of a jitted n x n matmul (2 n^3 FLOPs) of `dtype` on the default device, on random
    data (zeros run faster), at `precision` (None: XLA's default): the roofline's compute peak on this
    machine, in the same process and thread settings as the benchmark."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
    matmul = jax.jit(lambda x, y: jnp.dot(x, y, precision=precision))
    timing = time_fn(lambda i: matmul(a, b), repeats=repeats, warmup=2)
    return 2.0 * n ** 3 / min(timing.runs)  # best run: the peak, not the load of a shared machine


def read_bandwidth(n: int = 2**27, repeats: int = 5) -> float:
    """Measured bytes/s of a jitted sum of n random float32 values (one read of 4n bytes, XLA's threads): the
    roofline's memory side, for a decode step that reads every weight once."""
    x = jax.random.normal(jax.random.PRNGKey(0), (n,), jnp.float32)
    total = jax.jit(jnp.sum)
    timing = time_fn(lambda i: total(x), repeats=repeats, warmup=2)
    return 4.0 * n / min(timing.runs)


def once(fn: Callable[[], Any], sync: Callable[[Any], Any] = block) -> tuple[float, Any]:
    """(seconds, output) of one synchronized call (`sync`: `block` for jax, a device sync for torch)."""
    t0 = time.perf_counter()
    out = sync(fn())
    return time.perf_counter() - t0, out


