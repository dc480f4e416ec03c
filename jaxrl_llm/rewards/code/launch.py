"""Starting the sandbox process: bubblewrap where it works, the older layers where it does not.

With bubblewrap (`bwrap`) the runner gets new PID, mount, IPC, network, UTS and cgroup namespaces
(and a user namespace when not root); a root filesystem holding only the interpreter, its standard
library (no site-packages) and the shared libraries they load, read-only; a private tmpfs of
`disk_mb` as /tmp, the only writable place; a seccomp filter (see `seccomp`); no environment. As
root it also drops to a uid of its own, distinct per concurrent sandbox, so sandboxes cannot signal
each other and RLIMIT_NPROC counts each one alone; leftovers of that uid are killed afterwards.

Without bubblewrap: `[unshare --net] python -I -S -B` in a fresh directory, the same uid drop as
root, rlimits and the audit hook, and a loud warning once.
"""

from __future__ import annotations

import functools
import glob
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import warnings

from jaxrl_llm.rewards.code import seccomp

_PYTHON = os.path.realpath(sys.executable)
_STDLIB = os.path.dirname(os.path.realpath(os.__file__))
# Sandbox uids: one block per process, drawn at random far above real accounts, and drawn again in
# a forked child (which must not share its parent's block).
_UID_SLOTS = 1024
_uid_lock = threading.Lock()
_uid_pool: dict = {"pid": None, "base": 0, "free": []}


def _shared_libraries() -> dict[str, str] | None:
    """{path the loader uses: real file} for the interpreter and its C modules, via ldd."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    # Not for _tkinter (a GUI, ~20 X11 libraries) or nis (a network directory): each bind mount
    # costs sandbox start-up time, and neither can work in the sandbox anyway.
    files = [_PYTHON, *(f for f in glob.glob(os.path.join(_STDLIB, "lib-dynload", "*.so"))
                        if not os.path.basename(f).startswith(("_tkinter.", "nis.")))]  # fmt: skip
    try:
        listing = subprocess.run([ldd, *files], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    libs = {}
    for line in listing.splitlines():
        path = line.split("=>")[-1].strip().split(" (")[0].strip()
        if path.startswith("/") and os.path.exists(path):
            libs[path] = os.path.realpath(path)
    return libs or None


@functools.cache
def _mount_args() -> tuple[str, ...]:
    """bwrap arguments binding the interpreter, stdlib and libraries read-only, nothing else."""
    binds = {_PYTHON: _PYTHON, _STDLIB: _STDLIB}
    libs = _shared_libraries()
    if libs is None:  # no ldd: the system library directories instead
        libs = {d: d for d in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(d) and not os.path.islink(d)}
    binds.update(libs)
    if os.path.exists("/etc/ld.so.cache"):
        binds["/etc/ld.so.cache"] = "/etc/ld.so.cache"
    # Parent directories are created 0755 (bwrap would copy the host's modes, /root being 0700).
    parents = sorted({os.path.dirname(p) for dest in binds for p in _ancestors(dest)} - {"/"} - set(binds),
                     key=lambda p: p.count("/"))  # fmt: skip
    args = [a for p in parents for a in ("--perms", "0755", "--dir", p)]
    for dest, src in binds.items():
        args += ["--ro-bind", src, dest]
    site = os.path.join(_STDLIB, "site-packages")
    if os.path.isdir(site):  # the base install's packages: hidden, the sandbox gets the stdlib only
        args += ["--tmpfs", site, "--remount-ro", site]
    return tuple(args)


def _ancestors(path: str) -> list[str]:
    parts = []
    while path not in ("/", ""):
        parts.append(path)
        path = os.path.dirname(path)
    return parts


def bwrap_command(disk_mb: int, seccomp_fd: int | None) -> list[str]:
    """The bwrap command line up to (not including) the runner's own arguments."""
    args = [shutil.which("bwrap") or "bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "sandbox"]  # fmt: skip
    if os.geteuid() == 0:  # the runner drops to its own uid itself (bwrap would map uid 0 outside)
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user", "--disable-userns"]
    args += [*_mount_args(), "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
             "--perms", "01777", "--size", str(disk_mb << 20), "--tmpfs", "/tmp",
             "--remount-ro", "/",  # the root tmpfs, owned by the sandbox user in a user namespace
             "--chdir", "/tmp", "--clearenv",
             "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8", "--setenv", "LC_ALL", "C.UTF-8",
             "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp"]  # fmt: skip
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    return [*args, _PYTHON, "-I", "-S", "-B", "-c"]


@functools.cache
def bwrap_problem() -> str | None:
    """None if bubblewrap sandboxes work here, else why not (probed once)."""
    if sys.platform != "linux":
        return "not Linux"
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    if not seccomp.supported():
        return "no seccomp filter for this architecture"
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, seccomp.program())
        os.close(write_fd)
        command = [*bwrap_command(1, read_fd), "import json, os; os.listdir('/tmp')"]
        probe = subprocess.run(command, capture_output=True, timeout=30, pass_fds=(read_fd,), env={})
    except (OSError, subprocess.SubprocessError) as e:
        return f"bwrap failed to start: {e}"
    finally:
        os.close(read_fd)
    if probe.returncode != 0:
        return "bwrap cannot create the sandbox here: " + probe.stderr.decode(errors="replace").strip()[:300]
    return None


@functools.cache
def netns_prefix() -> tuple[str, ...]:
    """Without bwrap: the prefix giving the child an empty network namespace, or () if unavailable."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    prefix = (unshare, "--net", "--") if os.geteuid() == 0 else (unshare, "--net", "--map-root-user", "--")
    try:
        probe = subprocess.run([*prefix, _PYTHON, "-I", "-S", "-c", "pass"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ()
    return prefix if probe.returncode == 0 else ()


@functools.cache
def warn_if_weak() -> None:
    """Says once, loudly, that the code reward runs without bubblewrap."""
    problem = bwrap_problem()
    if problem is not None:
        message = (f"code_tests: NO bubblewrap sandbox ({problem}). Solutions run with rlimits, a uid drop "
                   f"(as root) and an audit hook only: they can read world-readable host files and use "
                   f"/tmp and /dev/shm. Layers active: {', '.join(layers())}. Install bubblewrap.")  # fmt: skip
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        print("WARNING: " + message, file=sys.stderr)


def layers(backend: str | None = None) -> tuple[str, ...]:
    backend = backend or ("bwrap" if bwrap_problem() is None else "fallback")
    found = ["judge_outside", "rlimits", "wall_clock", "clean_env", "isolated_python", "audit_hook"]
    if backend == "bwrap":
        found += ["bwrap", "pid_ns", "mount_ns", "ipc_ns", "net_ns", "uts_ns", "tmpfs_quota", "seccomp"]
        found += ["distinct_uid"] if os.geteuid() == 0 else ["user_ns"]
    else:
        found += ["tempdir"] + (["distinct_uid"] if os.geteuid() == 0 else []) + (["net_ns"] if netns_prefix() else [])
    return tuple(found)


def acquire_uid() -> int:
    with _uid_lock:
        if _uid_pool["pid"] != os.getpid() or not _uid_pool["free"]:  # a new process, or all quarantined
            base = 1_000_000_000 + secrets.randbelow(900_000) * _UID_SLOTS
            _uid_pool.update(pid=os.getpid(), base=base, free=list(range(base + _UID_SLOTS - 1, base - 1, -1)))
        return _uid_pool["free"].pop()  # clean: killed at release; blocks of other processes differ


def release_uid(uid: int) -> None:
    """Kills what is left of the uid and frees it, unless zombies of it linger (an init that reaps
    slowly): they would count against the next sandbox's RLIMIT_NPROC, so the uid is retired."""
    if kill_uid(uid):
        return
    with _uid_lock:
        if _uid_pool["pid"] == os.getpid():
            _uid_pool["free"].append(uid)


def kill_uid(uid: int) -> bool:
    """SIGKILLs every live process with `uid` as real, effective, saved or file uid, repeating
    until none is left (a fork may race the scan; RLIMIT_NPROC bounds the race). Returns whether
    zombies of the uid remain."""
    for _ in range(100):
        live, zombies = _processes_of(uid)
        if not live:
            return zombies
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return True


def _processes_of(uid: int) -> tuple[list[int], bool]:
    """Pids of the live processes with `uid` among their ids, and whether dead ones (zombies) too."""
    live, zombies, wanted = [], False, str(uid).encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read(4096)
        except OSError:
            continue
        uid_at, state_at = status.find(b"\nUid:"), status.find(b"\nState:")
        if uid_at < 0 or wanted not in status[uid_at + 5 : status.find(b"\n", uid_at + 1)].split():
            continue
        if status[state_at + 7 : state_at + 16].strip().startswith(b"Z"):
            zombies = True
        else:
            live.append(int(name))
    return live, zombies
