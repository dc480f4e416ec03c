"""One sandbox process from the judge's side: start it, exchange messages under a deadline, end it.

The judge is the only trusted party. It writes requests (inputs only) to one pipe and reads replies
from another, at most `max_reply` bytes a line, never past the deadline; when it is done, or the
deadline passes, the whole sandbox is killed (process group, PID namespace, and as root every
process of the sandbox's uid) before its temporary directory is removed. The sandbox's stdout and
stderr are pipes too, drained whenever the judge waits: their first 4 KiB kept, the rest counted
against `output_cap` (nothing reaches the host's disk). It waits with poll(), never select(): the
trainer may hold more than 1,024 descriptors.
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
_KEPT_REFUSALS = audit.MAX_REPORTS


class Refusals(list):
    """The refusals a sandbox reported: the first few kept, `total` counting them all."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def append(self, text: str) -> None:
        self.total += 1
        if len(self) < _KEPT_REFUSALS:
            super().append(text)


class _Stream:
    """One of the sandbox's output pipes (stdout or stderr): its head kept, its bytes counted."""

    def __init__(self, fd: int):
        self.fd, self.head, self.size = fd, bytearray(), 0

    def drain(self) -> None:
        """Reads what is there now, at most 1 MiB (a writer as fast as the reader must not keep
        the judge here), without blocking; at EOF the fd is closed (`fd` -1)."""
        for _ in range(16):
            if self.fd < 0:
                return
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                os.close(self.fd)
                self.fd = -1
                return
            self.size += len(chunk)
            self.head += chunk[: _OUTPUT_CHARS - len(self.head)]


class Session:
    """A started sandbox: `send(record)` one request, `receive()` one reply line (bytes, or None at
    EOF, past the deadline, too long, past the output cap or after forged refusals), `close()` ->
    (returncode, stdout head, stderr head). `direct`: the sandbox's ends of a checker's pipe pair
    (calls, answers), which the runner uses once it has said it is ready (`runner`).

    What ended it, for the status: `timed_out` (the deadline passed), `oversized` (a reply line
    over `max_reply`), `output_exceeded` (stdout + stderr over `output_cap` bytes), `killed` (the
    judge had to kill it: it had not exited by itself, set by close); `blocked` holds the
    refusals it reported."""

    def __init__(self, code, *, backend, load_module, timeout, memory_mb, cpu_time, file_size_mb, disk_mb, audit_on,
                 max_reply, direct=()):  # fmt: skip
        self.deadline = time.monotonic() + timeout
        self.timed_out = self.oversized = self.output_exceeded = self.killed = False
        self.blocked = Refusals()
        self.max_reply = max_reply  # bytes a reply line may have: the judge's memory per sandbox
        self.output_cap = min(file_size_mb, disk_mb) << 20  # stdout + stderr, bytes
        self.cpu_limit = cpu_time or math.ceil(timeout)
        self.disk_mb = disk_mb
        self._buffer = bytearray()
        self._scanned = 0
        self._streams: list[_Stream] = []
        self._uid = launch.acquire_uid() if os.geteuid() == 0 else None
        self._root = tempfile.mkdtemp(prefix="jaxrl_sandbox_")
        try:
            self._start(code, backend, load_module, memory_mb, self.cpu_limit, file_size_mb, disk_mb, audit_on, direct)
        except BaseException:
            self._cleanup()
            raise

    def _start(self, code, backend, load_module, memory_mb, cpu, file_size_mb, disk_mb, audit_on, direct):
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
            os.chmod(self._root, 0o711)  # the sandbox uid passes through to its work dir
            work = os.path.join(self._root, "work")
            os.mkdir(work, 0o700)
            if self._uid is not None:
                os.chown(work, self._uid, self._uid)
            config.update(workdir=work, private=self._root + os.sep, reroute_paths=self._uid is not None)
            command, cwd = [*launch.netns_prefix(), launch._PYTHON, "-I", "-S", "-B", "-c"], work
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": work, "TMPDIR": work}
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        self._streams = [_Stream(out_r), _Stream(err_r)]
        try:
            self.proc = subprocess.Popen([*command, runner.SOURCE, str(request_r), str(reply_w), *map(str, direct)],
                                         stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, cwd=cwd, env=env,
                                         pass_fds=(request_r, reply_w, *direct, *extra), start_new_session=True)  # fmt: skip
        finally:
            for fd in (request_r, reply_w, out_w, err_w, *extra):
                os.close(fd)
        for fd in (self._reply_r, out_r, err_r):
            os.set_blocking(fd, False)
        self.send(config)

    def _wait(self, fd: int, events: int, until: float) -> bool:
        """Waits until `fd` is ready for `events` (or has hung up), draining stdout and stderr
        meanwhile; False once `until` has passed or the output went over its cap."""
        while not self.output_exceeded:
            remaining = until - time.monotonic()
            if remaining <= 0:
                return False
            poller = select.poll()
            if fd >= 0:
                poller.register(fd, events)
            for stream in self._streams:
                if stream.fd >= 0:
                    poller.register(stream.fd, select.POLLIN)
            ready = {ready_fd for ready_fd, _ in poller.poll(math.ceil(remaining * 1000))}
            self._drain(ready)
            if fd in ready:
                return True
        return False

    def wait(self, fd: int, events: int) -> bool:
        """Waits for another process's `fd` (the checker's) until the deadline, draining the sandbox's
        stdout and stderr meanwhile; False past the deadline (sets `timed_out`) or the output cap."""
        if self._wait(fd, events, self.deadline):
            return True
        self.timed_out = not self.output_exceeded
        return False

    def _drain(self, ready=None) -> None:
        for stream in self._streams:
            if ready is None or stream.fd in ready:
                stream.drain()
        self.output_exceeded |= sum(s.size for s in self._streams) > self.output_cap

    def send(self, record) -> bool:
        """Writes one request (length, marshal dump: the runner reads it before any solution code
        runs, and decodes it without importing json); False if the sandbox is gone or stopped
        reading in time."""
        data = marshal.dumps(record)
        data = len(data).to_bytes(4, "little") + data
        while data:
            if not self._wait(self._request_w, select.POLLOUT, self.deadline):
                self.timed_out = not self.output_exceeded
                return False
            try:
                # A pipe write of up to PIPE_BUF never blocks once writable; larger ones may, briefly.
                data = data[os.write(self._request_w, data[:4096]):]
            except (BrokenPipeError, OSError):
                return False
        return True

    def receive(self):
        """The next reply line as bytes; None at EOF, past the deadline (sets `timed_out`), for an
        over-long line (sets `oversized`), past the output cap, or once more refusals were reported
        than the audit hook ever sends (forged: the score is 0 already, reading on costs the judge)."""
        while self.blocked.total <= audit.MAX_REPORTS:
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
            if not self._wait(self._reply_r, select.POLLIN, self.deadline):
                self.timed_out = not self.output_exceeded
                return None
            try:
                chunk = os.read(self._reply_r, min(1 << 16, self.max_reply + 1 - len(self._buffer)))
            except BlockingIOError:
                continue
            if not chunk:
                return None
            self._buffer += chunk
        return None

    def close(self) -> tuple[int | None, str, str]:
        """Ends the sandbox (grace: until the deadline, at most 1 s, for a clean exit after the
        request pipe closes), kills what is left and removes its files."""
        try:
            os.close(self._request_w)
            self._request_w = -1
            # No grace for a sandbox past a cap or caught forging: it is killed at once.
            misbehaved = self.oversized or self.output_exceeded or self.blocked.total > audit.MAX_REPORTS
            grace = 0.0 if misbehaved else min(1.0, max(0.0, self.deadline - time.monotonic()))
            self.killed = not self._wait_exited(grace)
            # Kill the group while the child is not yet reaped: its pid, hence the group id, cannot
            # have been reused, so this never hits an unrelated process. With bwrap the PID
            # namespace dies with it.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            returncode = self.proc.wait()
            self._drain()  # what is left in the pipes; a stray writer cannot make this block
            heads = [bytes(s.head).decode("utf-8", "replace") for s in self._streams]
            return returncode, heads[0], heads[1]
        finally:
            self._cleanup()

    def _wait_exited(self, timeout: float) -> bool:
        """Waits up to `timeout` for the child to exit WITHOUT reaping it, draining its output
        meanwhile; whether it exited."""
        until = time.monotonic() + timeout
        try:
            pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            pidfd = -1  # kernels without pidfd: look every 5 ms
        try:
            while not (self.output_exceeded or _exited(self.proc.pid)) and time.monotonic() < until:
                self._wait(pidfd, select.POLLIN, min(until, time.monotonic() + 0.005) if pidfd < 0 else until)
        finally:
            if pidfd >= 0:
                os.close(pidfd)
        return _exited(self.proc.pid)

    def _cleanup(self) -> None:
        fds = [getattr(self, "_request_w", -1), getattr(self, "_reply_r", -1), *(s.fd for s in self._streams)]
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._request_w = self._reply_r = -1
        for stream in self._streams:
            stream.fd = -1  # closed: the number may belong to another thread's file now
        if self._uid is not None:
            launch.release_uid(self._uid)  # kills any process of the uid, then frees it
            self._uid = None
        if sys.version_info >= (3, 12):
            shutil.rmtree(self._root, onexc=_force_remove)
        else:
            shutil.rmtree(self._root, onerror=_force_remove)


def _exited(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


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
