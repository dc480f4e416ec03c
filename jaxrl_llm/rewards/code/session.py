"""One sandbox process from the judge's side: start it, exchange messages under a deadline, end it.

The judge is the only trusted party. It writes requests (inputs only) to one pipe and reads replies
from another, at most `max_reply` bytes a line, never past the deadline; when it is done, or the
deadline passes, the whole sandbox is killed (process group, PID namespace, and as root every
process of the sandbox's uid) before its temporary directory is removed.
"""

from __future__ import annotations

import marshal
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from jaxrl_llm.rewards.code import audit, launch, runner, seccomp

_OUTPUT_CHARS = 4096
_MAX_OPEN_FILES = 64
_SANDBOX_NPROC = 16  # threads of one sandbox (bubblewrap, as root); 0 otherwise


class Session:
    """A started sandbox: `send(record)` one request, `receive()` one reply line (bytes, or None at
    EOF, past the deadline, or too long), `close()` -> (returncode, stdout head, stderr head)."""

    def __init__(self, code, *, backend, load_module, timeout, memory_mb, cpu_time, file_size_mb, disk_mb, audit_on,
                 max_reply):  # fmt: skip
        self.deadline = time.monotonic() + timeout
        self.timed_out = False
        self.blocked: list[str] = []
        self.max_reply = max_reply  # bytes a reply line may have: the judge's memory per sandbox
        self._buffer = bytearray()
        self._scanned = 0
        self._uid = launch.acquire_uid() if os.geteuid() == 0 else None
        self._root = tempfile.mkdtemp(prefix="jaxrl_sandbox_")
        try:
            self._start(code, backend, load_module, memory_mb, cpu_time or math.ceil(timeout), file_size_mb,
                        disk_mb, audit_on)  # fmt: skip
        except BaseException:
            self._cleanup()
            raise

    def _start(self, code, backend, load_module, memory_mb, cpu, file_size_mb, disk_mb, audit_on):
        os.chmod(self._root, 0o711)  # the child's stdout/stderr files live here, closed to it by path
        # Threads need RLIMIT_NPROC > 0. Only with bubblewrap, where seccomp refuses new processes
        # (each would get its own RLIMIT_AS), and a uid of its own, is it safe to allow them.
        nproc = _SANDBOX_NPROC if self._uid is not None and backend == "bwrap" else 0
        limits = [("RLIMIT_CPU", cpu, cpu + 1), ("RLIMIT_AS", memory_mb << 20, memory_mb << 20),
                  ("RLIMIT_FSIZE", file_size_mb << 20, file_size_mb << 20), ("RLIMIT_CORE", 0, 0),
                  ("RLIMIT_NOFILE", _MAX_OPEN_FILES, _MAX_OPEN_FILES), ("RLIMIT_NPROC", nproc, nproc),
                  ("RLIMIT_MSGQUEUE", 0, 0), ("RLIMIT_MEMLOCK", 0, 0)]  # fmt: skip
        config = {"code": code, "load_module": load_module, "rlimits": limits, "max_output": file_size_mb << 20,
                  "drop_to": None if self._uid is None else [self._uid, self._uid],
                  "audit": audit.config() if audit_on else None}  # fmt: skip
        request_r, self._request_w = os.pipe()
        self._reply_r, reply_w = os.pipe()
        extra = []
        if backend == "bwrap":
            config.update(workdir="/tmp", private=None, reroute_paths=False)
            filter_r, filter_w = os.pipe()
            os.write(filter_w, seccomp.program())
            os.close(filter_w)
            extra.append(filter_r)
            command, cwd, env = launch.bwrap_command(disk_mb, filter_r), None, {}
        else:
            work = os.path.join(self._root, "work")
            os.mkdir(work, 0o700)
            if self._uid is not None:
                os.chown(work, self._uid, self._uid)
            config.update(workdir=work, private=self._root + os.sep, reroute_paths=self._uid is not None)
            command, cwd = [*launch.netns_prefix(), launch._PYTHON, "-I", "-S", "-B", "-c"], work
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": work, "TMPDIR": work}
        paths = [os.path.join(self._root, name) for name in ("stdout", "stderr")]
        try:
            with open(paths[0], "wb") as out, open(paths[1], "wb") as err:
                self.proc = subprocess.Popen([*command, runner.SOURCE, str(request_r), str(reply_w)],
                                             stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=cwd, env=env,
                                             pass_fds=(request_r, reply_w, *extra), start_new_session=True)  # fmt: skip
        finally:
            for fd in (request_r, reply_w, *extra):
                os.close(fd)
        os.set_blocking(self._reply_r, False)
        self.send(config)

    def send(self, record) -> bool:
        """Writes one request (length, marshal dump: the runner reads it before any solution code
        runs, and decodes it without importing json); False if the sandbox is gone or stopped
        reading in time."""
        data = marshal.dumps(record)
        data = len(data).to_bytes(4, "little") + data
        while data:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.timed_out = True
                return False
            _, ready, _ = select.select([], [self._request_w], [], remaining)
            if not ready:
                continue
            try:
                # A pipe write of up to PIPE_BUF never blocks once writable; larger ones may, briefly.
                data = data[os.write(self._request_w, data[:4096]):]
            except (BrokenPipeError, OSError):
                return False
        return True

    def receive(self):
        """The next reply line as bytes; None at EOF, past the deadline (sets `timed_out`) or for an
        over-long line (sets `oversized`)."""
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)  # search only new bytes next time: linear in the line
            if len(self._buffer) > self.max_reply:
                self.oversized = True
                return None
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.timed_out = True
                return None
            ready, _, _ = select.select([self._reply_r], [], [], remaining)
            if not ready:
                continue
            try:
                chunk = os.read(self._reply_r, min(1 << 16, self.max_reply + 1 - len(self._buffer)))
            except BlockingIOError:
                continue
            if not chunk:
                return None
            self._buffer += chunk

    oversized = False

    def close(self) -> tuple[int | None, str, str]:
        """Ends the sandbox (grace: until the deadline, at most 1 s, for a clean exit after the
        request pipe closes), kills what is left and removes its files."""
        try:
            os.close(self._request_w)
            self._request_w = -1
            _wait_exited(self.proc.pid, min(1.0, max(0.0, self.deadline - time.monotonic())))
            # Kill the group while the child is not yet reaped: its pid, hence the group id, cannot
            # have been reused, so this never hits an unrelated process. With bwrap the PID
            # namespace dies with it.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            returncode = self.proc.wait()
            heads = [_head(os.path.join(self._root, n)) for n in ("stdout", "stderr")]
            return returncode, heads[0], heads[1]
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        for fd in (getattr(self, "_request_w", -1), getattr(self, "_reply_r", -1)):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._request_w = self._reply_r = -1
        if self._uid is not None:
            launch.release_uid(self._uid)  # kills any process of the uid, then frees it
            self._uid = None
        if sys.version_info >= (3, 12):
            shutil.rmtree(self._root, onexc=_force_remove)
        else:
            shutil.rmtree(self._root, onerror=_force_remove)


def _wait_exited(pid: int, timeout: float) -> None:
    """Waits up to `timeout` for `pid` to exit WITHOUT reaping it."""
    deadline = time.monotonic() + timeout
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            select.select([pidfd], [], [], timeout)
        finally:
            os.close(pidfd)
        return
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None and time.monotonic() < deadline:
        time.sleep(0.005)  # kernels without pidfd


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
