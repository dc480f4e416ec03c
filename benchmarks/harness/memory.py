"""A process's resident memory, without importing jax (the peers' workers use it too)."""
import resource

GIB = 2 ** 30


def peak_rss_gib() -> float:
    """This process's peak resident memory so far, GiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def rss_gib() -> tuple[float, float]:
    """(current, peak since the last `reset_peak`) resident set, GiB (/proc/self/status: VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        kv = dict(line.split(":", 1) for line in f)
    return int(kv["VmRSS"].split()[0]) / 2 ** 20, int(kv["VmHWM"].split()[0]) / 2 ** 20


def reset_peak() -> None:
    """Restarts VmHWM from the current resident set (so a stage's peak is its own)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
