"""A process's resident memory, without importing jax (the peers' workers use it too)."""
import resource

GIB = 2 ** 30


def peak_rss_gib() -> float:
    """This process's peak resident memory so far, GiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def device_peak_gib(framework: str) -> float | None:
    """Peak bytes the accelerator's allocator handed out in this process, GiB (None on a CPU): XLA's
    `peak_bytes_in_use` (its BFC allocator, with preallocation off) or torch's `max_memory_allocated`. Both
    count live allocations, not the pool reserved around them, so the two are compared like for like."""
    if framework == "torch":
        import torch
        return torch.cuda.max_memory_allocated() / 2 ** 30 if torch.cuda.is_available() else None
    import jax
    if jax.default_backend() == "cpu":
        return None
    return (jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use", 0) / 2 ** 30


def rss_gib() -> tuple[float, float]:
    """(current, peak since the last `reset_peak`) resident set, GiB (/proc/self/status: VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        kv = dict(line.split(":", 1) for line in f)
    return int(kv["VmRSS"].split()[0]) / 2 ** 20, int(kv["VmHWM"].split()[0]) / 2 ** 20


def reset_peak() -> None:
    """Restarts VmHWM from the current resident set (so a stage's peak is its own)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
