"""The checker process: runs a row's test code (trusted) outside the trainer and outside the sandbox.

`python -I -S -B -c SOURCE REQUEST_FD REPLY_FD CALLS_FD ANSWERS_FD`, started by the judge for rows whose tests are
Python beyond the simple assert forms (`script`). It reads one JSON config line (the units, the
free names that are stdlib modules, the decoding budget, the tolerance, its own rlimits), then one
line of the solution's top-level names once it has loaded (each becomes a proxy, over the builtins
and as `solution.<name>`), then runs the units in order in one namespace (`testforms` runs the
pytest and unittest tests). A proxy call goes straight to the sandbox over a pipe pair the judge
made before starting either process (`Pipes`; the runner takes it over once it is ready): the
request as the runner reads it from the judge (`{"i": k, "wire": [name, args, kwargs]}` in wire
form, `values.encode`, kwargs None when empty; a 4-byte length and marshal), and back one reply
line, read here under the judge's budget (at most `budget.bytes`, each byte scanned once) and
decoded under it (`values.read_reply`, `values.decode`) into values of builtin types, writing back
the arguments the solution changed in place. To the judge it writes, after each unit, `{"case": k,
"ok": bool, "why": "...", "calls": n}` (`script.Units` counts the cases); each refusal the sandbox
reports, `{"blocked": text}`; a solution's MemoryError or file-size error, `{"error": text}` (for
the status); and whatever ends the exchange, `{"end": "gone" | "oversized" | "forged" |
"protocol", "why": text}`, after which it exits at once (`os._exit`: the test code cannot catch it).

The solution never sees the test code or anything the test code computes, only the arguments of
its own calls; what comes back is data of builtin types (no pickle, no object), so a reply cannot
forge a pass: the verdict is the test code's own. The judge keeps the deadline: it waits on this
process (draining the sandbox's stdout and stderr meanwhile) and kills both process groups at the
row's deadline.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import select
import signal
import subprocess
import time

from jaxrl_llm.rewards.code import audit, launch, script, testforms, values

MEMORY_MB = 1024  # RLIMIT_AS of the checker: test code and decoded replies (each within the budget)

_MAIN = r'''
import builtins, marshal, os, resource, sys

# Exceptions that steer the test code's control flow (end a loop, a map or the program): raised by
# the solution they fail the case, whatever the test code does with them.
STEERING = ("StopIteration", "StopAsyncIteration", "GeneratorExit", "SystemExit", "KeyboardInterrupt")


class SolutionError(Exception):
    # An exception the solution raised, of a type that is not a builtin exception (or one that steers).
    pass


def raised(text):
    # The solution's `TypeName: message` as an exception to raise in the test code: the builtin
    # exception of that name (tests may expect a ValueError), else SolutionError.
    name, _, message = text.partition(": ")
    kind = getattr(builtins, name, None)
    if name not in STEERING and isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(message)
        except BaseException:  # UnicodeDecodeError and the like take other arguments
            pass
    return SolutionError(text)


def exit_program(code=None):
    raise SystemExit(code)  # exit() / quit(), as the site module (-S: not loaded) would define them


class Sandbox:
    # The sandbox's own pipe pair (the judge made it): requests as the runner reads them (a 4-byte
    # length, marshal), reply lines read under the judge's budget: at most `budget.bytes` a line,
    # each byte scanned once. What ends the exchange (the sandbox gone; a reply too long, unreadable
    # or out of order; more refusals than the audit hook sends) is told to the judge and ends this
    # process at once, where the test code cannot catch it.

    def __init__(self, calls_fd, answers_fd, budget, max_reports, send):
        self.calls_fd, self.answers_fd, self.budget = calls_fd, answers_fd, budget
        self.max_reports, self.send = max_reports, send
        self.buffer, self.scanned, self.index, self.refusals = bytearray(), 0, 0, 0

    def call(self, name, args, kwargs):
        data = marshal.dumps({"i": self.index, "wire": (name, args, kwargs)})
        data = memoryview(len(data).to_bytes(4, "little") + data)
        try:
            while data:
                data = data[os.write(self.calls_fd, data):]
        except OSError:
            self.end("gone")
        while True:
            try:
                record = read_reply(self.line(), self.budget)
            except (ValueError, UnicodeDecodeError, RecursionError) as error:
                self.end("protocol", "unreadable reply (%s: %s)" % (type(error).__name__, str(error)[:80]))
            if "blocked" not in record:
                break
            self.refusals += 1
            self.send({"blocked": str(record["blocked"])[:300]})
            if self.refusals > self.max_reports:
                self.end("forged")
        if type(record.get("i")) is not int or record["i"] != self.index:
            self.end("protocol", "reply for call %.80r when call %d was made" % (record.get("i"), self.index))
        self.index += 1
        return record

    def line(self):
        while True:
            newline = self.buffer.find(b"\n", self.scanned)
            if newline >= 0:
                line = bytes(self.buffer[:newline])
                del self.buffer[:newline + 1]
                self.scanned = 0
                return line
            self.scanned = len(self.buffer)  # search only new bytes next time: linear in the line
            if len(self.buffer) > self.budget.bytes:
                self.end("oversized")
            try:
                chunk = os.read(self.answers_fd, min(1 << 16, self.budget.bytes + 1 - len(self.buffer)))
            except OSError:
                chunk = b""
            if not chunk:
                self.end("gone")
            self.buffer += chunk

    def end(self, why, text=""):
        try:
            self.send({"end": why, "why": text[:200]})
        finally:
            os._exit(0)


def main():
    reader = os.fdopen(int(sys.argv[1]), "rb")
    reply_fd = int(sys.argv[2])

    def send(record):
        data = (json.dumps(record) + "\n").encode()
        while data:
            data = data[os.write(reply_fd, data):]

    cfg = json.loads(reader.readline())
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    budget = Budget(**cfg["budget"])
    tolerance = cfg["tolerance"] or 0.0
    state = {"calls": 0, "steered": ""}
    sandbox = Sandbox(int(sys.argv[3]), int(sys.argv[4]), budget, cfg["max_reports"], send)

    def call(name, args, kwargs):
        state["calls"] += 1
        record = sandbox.call(name, encode(list(args)), encode(kwargs) if kwargs else None)
        if "error" in record:
            error = str(record["error"])
            if error.startswith("MemoryError") or "[Errno 27]" in error:
                send({"error": error[:300]})  # a limit the status names
            if error.partition(":")[0] in STEERING:
                state["steered"] = state["steered"] or error[:200]
            raise raised(error)
        if "value" not in record:
            raise SolutionError("no value")
        write_back(args, kwargs, record.get("changed", []))
        return decode(record["value"])

    class Proxy:
        def __init__(self, name):
            self.__name__ = name

        def __call__(self, *args, **kwargs):
            return call(self.__name__, args, kwargs)

        def __repr__(self):
            return "<the solution's %s>" % self.__name__

    class Instance:  # Solution(): its attributes are the solution's methods
        def __getattr__(self, name):
            return Proxy(name)

    module = type(sys)("__main__")  # `if __name__ == "__main__": check(f)` runs; dataclasses find it
    sys.modules["__main__"] = module
    namespace = module.__dict__
    names = json.loads(reader.readline())  # the solution's top-level functions and classes, once it loaded
    used = {name for name, kind in cfg["modules"] if kind == "used"}
    scope = bind_solution(names, used, lambda n: (lambda *a, **k: Instance()) if n == "Solution" else Proxy(n))
    sys.modules["pytest"] = make_pytest()
    namespace.update({"__builtins__": scope, cfg["same"]: lambda a, b: equal(a, b, tolerance),
                      cfg["run_function"]: lambda name: run_function(namespace, name),
                      cfg["run_method"]: lambda cls, name: run_method(namespace, cls, name)})
    for name, kind in cfg["modules"]:
        if kind == "module" and name not in names:
            try:
                namespace[name] = __import__(name)
            except BaseException:
                pass
    shown = [written for _, written in cfg["units"]]
    for k, (source, _) in enumerate(cfg["units"]):
        state["calls"], state["steered"] = 0, ""
        try:
            exec(compile(source, "<tests %d>" % k, "exec"), namespace)
            why = "the solution raised " + state["steered"] if state["steered"] else ""
        except BaseException as error:
            why = describe(error, shown)
        send({"case": k, "ok": not why, "why": why, "calls": state["calls"]})


def bind_solution(names, used, proxy_of):
    # The builtins the test code sees, with the solution's names over them, and the module
    # `solution` (`from solution import f`). A builtin name is the solution's only when the test code
    # reads no other name of the solution's (then it is the function under test).
    scope = dict(vars(builtins), exit=exit_program, quit=exit_program)
    tested = [name for name in names if name in used and name not in scope]
    solution = type(sys)("solution")
    for name in names:
        proxy = solution.__dict__[name] = proxy_of(name)
        if name not in scope or not tested:
            scope[name] = proxy
    solution.__all__ = list(names)
    sys.modules["solution"] = solution
    return scope


def write_back(args, kwargs, changed):
    # What the solution did to its arguments in place, done to the test code's own objects: each
    # entry [position or keyword, the argument's value after the call] (mutable containers only).
    for where, value in changed:
        target = args[where] if type(where) is int and 0 <= where < len(args) else kwargs.get(where)
        new = decode(value)
        if type(new) is not type(target):
            continue
        target.clear()
        if isinstance(target, (dict, set)):
            target.update(new)
        else:  # list, bytearray, deque
            target.extend(new)


def describe(error, shown):
    # `TypeName: message`; for a bare failed assert, the assert's line in the test code as written.
    try:
        text = str(error).strip().splitlines()
    except BaseException:
        text = []
    trace = error.__traceback__
    while not text and isinstance(error, AssertionError) and trace is not None:
        code = trace.tb_frame.f_code.co_filename
        if code.startswith("<tests ") and trace.tb_next is None:
            lines = shown[int(code[7:-1])].splitlines()
            text = [lines[trace.tb_lineno - 1].strip()[:120]] if 0 < trace.tb_lineno <= len(lines) else []
        trace = trace.tb_next
    return type(error).__name__ + (": " + text[0][:200] if text else "")


main()
'''

SOURCE = inspect.getsource(values) + testforms.SOURCE + _MAIN


class Pipes:
    """The pipe pair between a checker and its sandbox, made by the judge before either starts:
    calls (checker -> sandbox) and answers (sandbox -> checker). Each process gets its two ends
    (`sandbox`, `checker`); the judge closes its own copies once it has started them (`close`)."""

    def __init__(self):
        self.calls = os.pipe()
        try:
            self.answers = os.pipe()
        except BaseException:
            os.close(self.calls[0])
            os.close(self.calls[1])
            raise
        self._open = {*self.calls, *self.answers}

    @property
    def sandbox(self) -> tuple[int, int]:
        return self.calls[0], self.answers[1]

    @property
    def checker(self) -> tuple[int, int]:
        return self.calls[1], self.answers[0]

    def close(self, ends=None) -> None:
        """Closes `ends` (all four if None), each once."""
        for fd in [*self.sandbox, *self.checker] if ends is None else ends:
            if fd in self._open:
                self._open.discard(fd)
                os.close(fd)


class Checker:
    """A started checker process: `receive()` one message (a dict; None at EOF, past the deadline
    or for a malformed or over-long line), `relay(line)` one line to it, `close()`. `pipes`: its
    pipe pair to the sandbox (`Pipes`); `wait(fd, events)`: the judge's wait (`Session.wait`: the
    deadline, the sandbox's output drained meanwhile)."""

    def __init__(self, units, modules, *, budget: values.Budget, tolerance, deadline: float, max_line: int,
                 pipes: Pipes, wait):  # fmt: skip
        self.max_line = max_line
        self._wait_for = wait
        self._buffer = bytearray()
        self._scanned = 0
        cpu = math.ceil(max(1.0, deadline - time.monotonic())) + 1
        limits = [("RLIMIT_AS", MEMORY_MB << 20, MEMORY_MB << 20), ("RLIMIT_CPU", cpu, cpu + 1), ("RLIMIT_CORE", 0, 0)]
        config = {"units": units, "modules": modules, "same": script.SAME, "run_function": script.RUN_FUNCTION,
                  "run_method": script.RUN_METHOD, "tolerance": tolerance, "rlimits": limits,
                  "max_reports": audit.MAX_REPORTS,
                  "budget": {"bytes": budget.bytes, "elements": budget.elements, "digits": budget.digits}}  # fmt: skip
        request_r, self._request_w = os.pipe()
        self._reply_r, reply_w = os.pipe()
        fds = (request_r, reply_w, *pipes.checker)
        try:
            self.proc = subprocess.Popen([launch._PYTHON, "-I", "-S", "-B", "-c", SOURCE, *map(str, fds)],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         pass_fds=fds, start_new_session=True, cwd="/",
                                         env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"})  # fmt: skip
        except BaseException:
            for fd in (self._request_w, self._reply_r):
                os.close(fd)
            raise
        finally:
            os.close(request_r)
            os.close(reply_w)
            pipes.close(pipes.checker)
        os.set_blocking(self._reply_r, False)
        os.set_blocking(self._request_w, False)
        self.relay(json.dumps(config).encode())

    def _wait(self, fd: int, event: int) -> bool:
        """True once `fd` is ready for `event` (or hung up), False past the deadline or the output cap."""
        return self._wait_for(fd, event | select.POLLHUP | select.POLLERR)

    def relay(self, line: bytes) -> bool:
        """Writes one line to the checker; False if it is gone or past the deadline."""
        data = memoryview(line + b"\n")
        while data:
            if self._request_w < 0 or not self._wait(self._request_w, select.POLLOUT):
                return False
            try:
                data = data[os.write(self._request_w, data[: 1 << 16]) :]
            except BlockingIOError:
                continue
            except OSError:
                return False
        return True

    def receive(self) -> dict | None:
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                self._scanned = 0
                try:
                    message = json.loads(line)
                except (ValueError, RecursionError):
                    return None
                return message if type(message) is dict else None
            self._scanned = len(self._buffer)  # search only new bytes next time: linear in the line
            if len(self._buffer) > self.max_line or not self._wait(self._reply_r, select.POLLIN):
                return None
            try:
                chunk = os.read(self._reply_r, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                return None
            self._buffer += chunk

    def close(self) -> None:
        for fd in (self._request_w, self._reply_r):
            if fd >= 0:
                os.close(fd)
        self._request_w = self._reply_r = -1
        try:  # not yet reaped, so the group id cannot have been reused
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
