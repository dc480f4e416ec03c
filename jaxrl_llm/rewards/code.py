"""`code_tests` reward: run a completion's Python against unit tests in a sandboxed subprocess.

Layers of the sandbox (each one alone stops some attack; `sandbox_layers()` says which are active):
- `rlimits`: RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_FSIZE (file and output size), RLIMIT_NOFILE,
  RLIMIT_NPROC = 0 (no new process or thread once unprivileged), RLIMIT_CORE = 0; soft = hard
  (except CPU: SIGXCPU first) so the code cannot raise them back.
- `wall_clock`: a wall-clock deadline; on expiry the whole process group (start_new_session) is
  SIGKILLed before the child is reaped, so its pid cannot be recycled under us.
- `clean_env`: a fresh environment (PATH, LANG, HOME/TMPDIR = the work dir): no parent variables.
- `isolated_python`: `python -I -S -B`: no site-packages, no PYTHON* variables, no bytecode writes.
- `tempdir`: a fresh temporary directory as cwd, deleted afterwards.
- `uid_drop` (when run as root): setgroups([]), setgid/setuid to `nobody`, so root-owned files are
  read-only and other processes' /proc entries are closed.
- `netns` (when `unshare --net` works): an empty network namespace, no interface but a down loopback.
- `audit_hook`: a `sys.addaudithook` hook installed before the user code that refuses sockets,
  subprocess/fork/exec/kill, ctypes, rlimit changes, gc introspection, writes outside the work dir
  and reads of `/proc/*/environ`. Any refused operation scores the completion 0.

It is NOT a security boundary against a determined attacker: the code runs in the same interpreter
as the harness (it can forge test results with enough introspection), shares the kernel, the
filesystem (readable files stay readable) and the CPU; see docs/rewards.md.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import functools
import json
import math
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from jaxrl_llm.rewards.registry import register_reward

DEFAULT_TIMEOUT = 10.0  # wall-clock seconds per completion
DEFAULT_MEMORY_MB = 512
DEFAULT_FILE_SIZE_MB = 16
_MAX_OPEN_FILES = 64
_OUTPUT_CHARS = 4096
_REPORTED_BLOCKS = 5
_NOBODY = 65534

# ----------------------------------------------------------------------------- the child side

# Runs in the child (`python -I -S -B -c _BOOTSTRAP`) before any user code: reads the payload from
# stdin, applies limits, drops privileges, installs the audit hook, then runs the solution and each
# test unit, writing one JSON line per event to the result fd (tagged with a nonce).
_BOOTSTRAP = r'''
import json, os, resource, sys, types

def _main():
    cfg = json.loads(sys.stdin.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    nonce, result_fd, work = cfg["nonce"], cfg["result_fd"], os.path.realpath(cfg["workdir"])
    state = {"blocked": 0, "busy": False}

    def report(*fields):
        try:
            os.write(result_fd, (json.dumps([nonce, *fields]) + "\n").encode())
        except Exception:
            pass

    def describe(error):
        try:
            text = str(error).strip().splitlines()
        except Exception:
            text = []
        return (type(error).__name__ + (": " + text[0][:200] if text else ""))

    if cfg["drop_to"] is not None:
        # The stdlib may sit under a home directory `nobody` cannot enter (/root is 0700): keep
        # importing through directory fds opened now, as /proc/self/fd/N (always open to us).
        moved = {}
        for p in sys.path:
            try:
                moved[p] = "/proc/self/fd/%d" % os.open(p, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                pass

        def move(entry):
            for old, new in moved.items():
                if entry == old or entry.startswith(old + os.sep):
                    return new + entry[len(old):]
            return entry

        sys.path[:] = list(moved.values())
        for mod in list(sys.modules.values()):  # packages imported at start-up, e.g. collections
            if isinstance(getattr(mod, "__path__", None), list):
                mod.__path__[:] = [move(e) for e in mod.__path__]
        sys.path_importer_cache.clear()
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if cfg["drop_to"] is not None:
        uid, gid = cfg["drop_to"]
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if 0 in (os.getuid(), os.geteuid(), os.getgid(), os.getegid()):
            report("fatal", "could not drop root privileges")
            os._exit(3)
    os.umask(0o077)

    blocked_prefixes = tuple(cfg["blocked_prefixes"])
    blocked_events = frozenset(cfg["blocked_events"])
    blocked_imports = frozenset(cfg["blocked_imports"])
    path_events = cfg["path_events"]
    write_ok = frozenset(("/dev/null", "/dev/stdout", "/dev/stderr"))
    write_mask = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    realpath, isdir, join, sep = os.path.realpath, os.path.isdir, os.path.join, os.sep
    private = os.path.dirname(work) + sep

    def inside(path, dir_fd=None):
        if isinstance(path, int):
            return True  # an fd was opened through a checked open already
        path = os.fsdecode(path)
        if dir_fd is not None and dir_fd >= 0 and not path.startswith(sep):
            path = join(os.readlink("/proc/self/fd/%d" % dir_fd), path)
        resolved = realpath(path)
        return resolved == work or resolved.startswith(work + sep)

    def refuse(event, detail):
        state["blocked"] += 1
        if state["blocked"] <= cfg["reported_blocks"]:
            report("blocked", event, detail[:200])
        raise PermissionError("sandbox: %s is not allowed (%s)" % (event, detail[:100]))

    def hook(event, args):
        if state["busy"]:
            return  # our own os.readlink/realpath calls below
        state["busy"] = True
        try:
            if event in blocked_events or event.startswith(blocked_prefixes):
                detail = repr(args[0])[:120] if args else ""
            elif event == "import" and args[0].partition(".")[0] in blocked_imports:
                state["blocked"] += 1
                if state["blocked"] <= cfg["reported_blocks"]:
                    report("blocked", event, args[0])
                # ImportError, so `try: import readline except ImportError` code paths still work.
                raise ImportError("sandbox: importing %s is not allowed" % args[0])
            elif event == "open":
                path, mode, flags = args
                if path is None or isinstance(path, int):
                    return
                text = os.fsdecode(path)
                resolved = realpath(text)
                writes = (isinstance(flags, int) and flags & write_mask) or (
                    isinstance(mode, str) and any(c in mode for c in "wax+"))
                if writes:
                    if text in write_ok or resolved == work or resolved.startswith(work + sep):
                        return
                    detail = "write " + text
                elif resolved.startswith("/proc/") and resolved.endswith("/environ") and not resolved.startswith(
                        "/proc/%d/" % os.getpid()):
                    detail = "read " + text
                elif resolved.startswith(private) and not (resolved == work or resolved.startswith(work + sep)):
                    detail = "read " + text  # the harness's payload and result files
                elif isdir(resolved) and not (resolved == work or resolved.startswith(work + sep)):
                    detail = "open directory " + text  # an fd usable as dir_fd outside the work dir
                else:
                    return
            elif event in path_events:
                bad = [args[i] for i, fd_index in path_events[event]
                       if args[i] is not None and not inside(args[i], None if fd_index is None else args[fd_index])]
                if not bad:
                    return
                detail = "%s outside the work dir" % os.fsdecode(bad[0])
            else:
                return
        except Exception as error:  # a path we cannot resolve is a path we do not allow
            detail = "unresolvable: " + describe(error)
        finally:
            state["busy"] = False
        refuse(event, detail)

    if cfg["audit"]:
        sys.addaudithook(hook)
        import posix
        for name in ("mknod", "mkfifo"):  # they create files without raising any audit event
            os.__dict__.pop(name, None)
            posix.__dict__.pop(name, None)

    module = types.ModuleType("solution")
    sys.modules["solution"] = module
    try:
        exec(compile(cfg["code"], "<solution>", "exec"), module.__dict__)
        report("solution", "ok", "")
        solution_ok = True
    except SystemExit as error:  # `exit()` at the end of a script is a normal end
        solution_ok = error.code in (None, 0)
        report("solution", "ok" if solution_ok else "error", "" if solution_ok else describe(error))
    except BaseException as error:
        solution_ok = False
        report("solution", "error", describe(error))
    if solution_ok:
        for index, (kind, source) in enumerate(cfg["units"]):
            try:
                exec(compile(source, "<test %d>" % index, "exec"), module.__dict__)
                report(kind, index, "pass", "")
            except BaseException as error:
                report(kind, index, "fail", describe(error))
    report("done", state["blocked"])
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)

_main()
'''

# The audit events the hook refuses outright, by exact name or prefix.
_BLOCKED_EVENTS = (
    "os.system", "os.fork", "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "resource.setrlimit",
    "resource.prlimit", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
    "webbrowser.open", "urllib.Request", "sqlite3.enable_load_extension", "sqlite3.load_extension",
)  # fmt: skip
_BLOCKED_PREFIXES = ("socket.", "subprocess.", "ctypes.", "os.exec", "os.spawn", "os.posix_spawn")
# Modules that call C code touching files or memory without audit events (or load libraries);
# `posix` is imported at start-up, so only a re-import (to restore mknod) reaches the hook.
_BLOCKED_IMPORTS = ("ctypes", "_ctypes", "_multiprocessing", "_posixshmem", "readline", "posix", "_dbm", "_gdbm")
# Events with paths that must stay inside the work dir: (path argument, its dir_fd argument or
# None) by position, as CPython 3.11 raises them (a dir_fd of -1 or None means the cwd).
_PATH_EVENTS = {
    "os.remove": [(0, 1)], "os.rmdir": [(0, 1)], "os.mkdir": [(0, 2)], "os.chmod": [(0, 2)],
    "os.chown": [(0, 3)], "os.utime": [(0, 3)], "os.symlink": [(1, 2)], "os.rename": [(0, 2), (1, 3)],
    "os.link": [(0, 2), (1, 3)], "os.truncate": [(0, None)], "os.chflags": [(0, None)],
    "os.setxattr": [(0, None)], "os.removexattr": [(0, None)], "shutil.rmtree": [(0, 1)],
    "shutil.chown": [(0, None)], "shutil.copyfile": [(1, None)], "shutil.copytree": [(1, None)],
    "shutil.move": [(1, None)], "tempfile.mkdtemp": [(0, None)], "tempfile.mkstemp": [(0, None)],
    "sqlite3.connect": [(0, None)],
}  # fmt: skip


# ----------------------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run.

    status: 'passed' (solution ran, every test passed), 'failed' (some test failed), 'error' (the
      solution raised at top level, tests not run), 'blocked' (the audit hook refused an operation),
      'memory' (MemoryError), 'timeout' (wall clock), 'cpu_limit', 'output_limit' (RLIMIT_FSIZE),
      'crashed' (any other abnormal end).
    reason: one line saying why, '' when passed.
    passed / total: tests that passed / test units (a run without tests has total 0).
    """

    status: str
    reason: str
    passed: int = 0
    total: int = 0
    returncode: int | None = None
    duration_s: float = 0.0
    stdout: str = ""
    stderr: str = ""
    blocked: tuple[str, ...] = ()

    @property
    def score(self) -> float:
        """Pass fraction; 0 whenever the hook refused anything, even if the code caught the error.
        Tests that passed before a timeout still count. Without tests: 1.0 iff the code ran cleanly."""
        if self.blocked or self.status == "blocked":
            return 0.0
        if self.total == 0:
            return float(self.status == "passed")
        return self.passed / self.total


# ----------------------------------------------------------------------------- the parent side


@functools.cache
def _netns_prefix() -> tuple[str, ...]:
    """The command prefix giving the child an empty network namespace, or () when unavailable."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    candidates = [(unshare, "--net", "--")] if os.geteuid() == 0 else [(unshare, "--net", "--map-root-user", "--")]
    for prefix in candidates:
        try:
            probe = subprocess.run([*prefix, sys.executable, "-I", "-S", "-c", "pass"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return prefix
    return ()


def sandbox_layers() -> tuple[str, ...]:
    """The protection layers active on this machine (see the module docstring)."""
    layers = ["rlimits", "wall_clock", "clean_env", "isolated_python", "tempdir", "audit_hook"]
    if os.geteuid() == 0:
        layers.append("uid_drop")
    if _netns_prefix():
        layers.append("netns")
    return tuple(layers)


def run_sandboxed(
    code: str,
    tests: str | Sequence[str] = (),
    *,
    timeout: float = DEFAULT_TIMEOUT,
    memory_mb: int = DEFAULT_MEMORY_MB,
    cpu_time: float | None = None,
    file_size_mb: int = DEFAULT_FILE_SIZE_MB,
) -> SandboxResult:
    """Runs `code` then `tests` (see `parse_tests`) in a sandboxed `python -I -S` subprocess.

    timeout: wall-clock seconds for the whole run. cpu_time: RLIMIT_CPU seconds, default
    ceil(timeout). memory_mb: RLIMIT_AS. file_size_mb: RLIMIT_FSIZE (files and stdout/stderr)."""
    return _run(code, parse_tests(tests), timeout=timeout, memory_mb=memory_mb, cpu_time=cpu_time,
                file_size_mb=file_size_mb)  # fmt: skip


def _run(
    code: str,
    units: list[tuple[str, str]],
    *,
    timeout: float,
    memory_mb: int,
    cpu_time: float | None,
    file_size_mb: int,
    audit: bool = True,
) -> SandboxResult:
    """`run_sandboxed` on parsed units. `audit=False` lets tests check the other layers alone."""
    if not isinstance(code, str):
        raise ValueError(f"code must be a string, got {type(code).__name__}")
    if not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    for arg, value in (("memory_mb", memory_mb), ("file_size_mb", file_size_mb)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg} must be a positive integer, got {value!r}")
    cpu = math.ceil(timeout if cpu_time is None else cpu_time)
    if cpu < 1:
        raise ValueError(f"cpu_time must be >= 1 second (RLIMIT_CPU is in whole seconds), got {cpu_time!r}")

    root = tempfile.mkdtemp(prefix="jaxrl_sandbox_")
    try:
        # root (0711, ours): stdout/stderr/result files the child cannot open by path; work: its cwd.
        os.chmod(root, 0o711)
        work = os.path.join(root, "work")
        os.mkdir(work, 0o700)
        drop_to = (_NOBODY, _NOBODY) if os.geteuid() == 0 else None
        if drop_to is not None:
            os.chown(work, *drop_to)
        nonce = secrets.token_hex(16)
        limits = [
            ("RLIMIT_CPU", cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL one second later
            ("RLIMIT_AS", memory_mb << 20, memory_mb << 20),
            ("RLIMIT_FSIZE", file_size_mb << 20, file_size_mb << 20),
            ("RLIMIT_NOFILE", _MAX_OPEN_FILES, _MAX_OPEN_FILES),
            ("RLIMIT_CORE", 0, 0),
            ("RLIMIT_NPROC", 0, 0),
        ]
        paths = {name: os.path.join(root, name) for name in ("payload", "stdout", "stderr", "result")}
        result_fd = os.open(paths["result"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        payload = {
            "code": code, "units": units, "nonce": nonce, "result_fd": result_fd, "workdir": work,
            "drop_to": drop_to, "rlimits": limits, "audit": audit, "reported_blocks": _REPORTED_BLOCKS,
            "blocked_events": _BLOCKED_EVENTS, "blocked_prefixes": _BLOCKED_PREFIXES,
            "blocked_imports": _BLOCKED_IMPORTS, "path_events": _PATH_EVENTS,
        }  # fmt: skip
        # 0600: as `nobody` the child must not read the nonce back from the payload by path.
        with os.fdopen(os.open(paths["payload"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump(payload, f)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": work, "TMPDIR": work}
        command = [*_netns_prefix(), sys.executable, "-I", "-S", "-B", "-c", _BOOTSTRAP]
        start = time.monotonic()
        try:
            with (
                open(paths["payload"], "rb") as stdin,
                open(paths["stdout"], "wb") as stdout,
                open(paths["stderr"], "wb") as stderr,
            ):
                proc = subprocess.Popen(command, stdin=stdin, stdout=stdout, stderr=stderr, cwd=work, env=env,
                                        pass_fds=(result_fd,), start_new_session=True)  # fmt: skip
        finally:
            os.close(result_fd)
        timed_out = not _wait_exited(proc.pid, timeout)
        # Kill the group while the child is a zombie (not yet reaped): its pid, hence the group id,
        # cannot be reused, so this never hits an unrelated process.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        returncode = proc.wait()
        duration = time.monotonic() - start
        events = _read_events(paths["result"], nonce)
        return _summarize(events, units, returncode, timed_out, timeout, duration,
                          _head(paths["stdout"]), _head(paths["stderr"]))  # fmt: skip
    finally:
        if sys.version_info >= (3, 12):
            shutil.rmtree(root, onexc=_force_remove)
        else:
            shutil.rmtree(root, onerror=_force_remove)


def _wait_exited(pid: int, timeout: float) -> bool:
    """Waits until `pid` exits WITHOUT reaping it; False on time-out."""
    deadline = time.monotonic() + timeout
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(pidfd)
        return _exited(pid)
    delay = 0.001
    while not _exited(pid):  # fallback for kernels without pidfd: poll with a growing interval
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(2 * delay, 0.02)
    return True


def _exited(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _read_events(path: str, nonce: str) -> list[list]:
    """The result lines carrying our nonce; anything else (forged or truncated) is ignored."""
    events = []
    with open(path, "rb") as f:
        for line in f.read(1 << 20).splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, list) and record and record[0] == nonce:
                events.append(record[1:])
    return events


def _summarize(events, units, returncode, timed_out, timeout, duration, stdout, stderr) -> SandboxResult:
    total = sum(kind == "test" for kind, _ in units)
    passed = 0
    first_failure = solution_error = fatal = ""
    blocked: list[str] = []
    memory = done = False
    for event in events:
        tag = event[0]
        if tag == "blocked":
            blocked.append(f"{event[1]}: {event[2]}")
        elif tag == "solution" and event[1] == "error":
            solution_error = event[2]
            memory |= event[2].startswith("MemoryError")
        elif tag == "test" and event[2] == "pass":
            passed += 1
        elif tag in ("test", "setup") and event[2] == "fail":
            memory |= event[3].startswith("MemoryError")
            first_failure = first_failure or f"{tag} {event[1]} failed: {event[3]}"
        elif tag == "done":
            done = True
        elif tag == "fatal":
            fatal = event[1]
    signum = -returncode if returncode is not None and returncode < 0 else None
    if timed_out:
        status, reason = "timeout", f"wall-clock limit of {timeout:g} s exceeded"
    elif signum in (signal.SIGXCPU, signal.SIGKILL):
        status, reason = "cpu_limit", f"CPU time limit exceeded ({signal.Signals(signum).name})"
    elif signum == signal.SIGXFSZ:
        status, reason = "output_limit", "file size limit exceeded (SIGXFSZ)"
    elif blocked:
        status, reason = "blocked", f"refused by the sandbox: {blocked[0]}"
    elif memory:
        status, reason = "memory", "memory limit exceeded (MemoryError)"
    elif fatal or not done:
        status, reason = "crashed", fatal or f"exited with code {returncode} before reporting"
    elif solution_error.startswith("OSError: [Errno 27]") or first_failure.endswith("[Errno 27] File too large"):
        status, reason = "output_limit", f"file size limit exceeded ({solution_error or first_failure})"
    elif solution_error:
        status, reason = "error", f"solution raised {solution_error}"
    elif passed < total:
        status, reason = "failed", first_failure or f"{total - passed} of {total} tests failed"
    else:
        status, reason = "passed", ""
    return SandboxResult(status, reason, passed, total, returncode, duration, stdout, stderr, tuple(blocked))


def _head(path: str) -> str:
    with open(path, "rb") as f:
        return f.read(_OUTPUT_CHARS).decode("utf-8", "replace")


def _force_remove(function, path, error) -> None:
    """rmtree error handler: the child may leave read-only directories behind."""
    del function, error
    try:
        os.chmod(os.path.dirname(path), 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


# ----------------------------------------------------------------------------- tests and code


def parse_tests(tests: str | Sequence[str]) -> list[tuple[str, str]]:
    """One row's tests as units [(kind, source)], kind 'test' (counts) or 'setup' (runs, not counted).

    - a list of strings: each string is one test (typically one `assert`), run in order;
    - a string: parsed as Python; each top-level `assert` is one test, every other top-level
      statement (imports, helpers, `check(candidate)` calls...) is setup run in order. A string
      without any top-level assert is a single test that passes iff it runs without raising.
    The solution's names are visible to the tests (they share one module namespace)."""
    if isinstance(tests, str):
        try:
            tree = ast.parse(tests)
        except SyntaxError as e:
            raise ValueError(f"tests is not valid Python: {e.msg} (line {e.lineno})") from e
        if not any(isinstance(node, ast.Assert) for node in tree.body):
            return [("test", tests)] if tests.strip() else []
        # unparse (not source segments): keeps decorators and splits `a; b` lines correctly.
        return [("test" if isinstance(node, ast.Assert) else "setup", ast.unparse(node)) for node in tree.body]
    if not isinstance(tests, Sequence) or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"tests must be a string or a list of strings, got {type(tests).__name__}")
    for i, t in enumerate(tests):
        try:
            ast.parse(t)
        except SyntaxError as e:
            raise ValueError(f"tests[{i}] is not valid Python: {e.msg}") from e
    return [("test", t) for t in tests]


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)
_OPEN_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n", re.I)


def extract_code(completion: str) -> str:
    """The Python in a completion: the last ```python (or ```py / ```python3) block, else the last
    untagged ``` block, else an unclosed ```python block (truncation), else the text after
    `</think>` if any, else the whole completion."""
    blocks = _FENCE.findall(completion)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if python:
        return python[-1]
    untagged = [body for lang, body in blocks if not lang]
    if untagged:
        return untagged[-1]
    opened = list(_OPEN_FENCE.finditer(completion))
    if opened:  # a truncated completion: the block was never closed
        return completion[opened[-1].end() :]
    _, think, after = completion.rpartition("</think>")
    return after if think else completion


def run_code_tests(
    completions: Sequence[str],
    tests: Sequence[str | Sequence[str] | None],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    memory_mb: int = DEFAULT_MEMORY_MB,
    max_workers: int | None = None,
) -> list[SandboxResult | None]:
    """Runs every completion's code against its row's tests, `max_workers` sandboxes at a time
    (default: the CPU count). Rows whose tests are None or empty give None."""
    if isinstance(tests, str) or not isinstance(tests, Sequence) or len(tests) != len(completions):
        raise ValueError(f"code_tests needs the column 'tests' with {len(completions)} entries")
    if max_workers is not None and (isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1):
        raise ValueError(f"max_workers must be a positive integer, got {max_workers!r}")
    units = []
    for i, row in enumerate(tests):
        try:
            units.append(parse_tests(row) if row is not None else [])
        except ValueError as e:
            raise ValueError(f"tests of row {i}: {e}") from e
    jobs = [i for i, u in enumerate(units) if u]
    results: list[SandboxResult | None] = [None] * len(completions)
    if not jobs:
        return results
    workers = min(len(jobs), max_workers or os.cpu_count() or 1)
    # Threads suffice: each one only waits on its subprocess. No preexec_fn anywhere, so fork
    # from these threads is safe.
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            pool.submit(_run, extract_code(completions[i]), units[i], timeout=timeout, memory_mb=memory_mb,
                        cpu_time=None, file_size_mb=DEFAULT_FILE_SIZE_MB): i
            for i in jobs
        }  # fmt: skip
        for future in concurrent.futures.as_completed(futures):
            results[futures[future]] = future.result()
    return results


@register_reward("code_tests")
def code_tests(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    tests: Sequence[str | Sequence[str] | None],
    timeout: float = DEFAULT_TIMEOUT,
    memory_mb: int = DEFAULT_MEMORY_MB,
    max_workers: int | None = None,
    **columns,
) -> list[float | None]:
    """Pass fraction of each completion's code on its row's `tests` (see `parse_tests` for the
    schema), run in the sandbox; 0 on time-out, memory or a refused operation; None without tests."""
    del prompts, columns
    results = run_code_tests(completions, tests, timeout=timeout, memory_mb=memory_mb, max_workers=max_workers)
    return [None if r is None else r.score for r in results]
