"""The trusted judge: runs cases in a sandbox and compares the returned values itself (Python's semantics).

Correctness comes only from values the judge compares with expectations that never left it, each
case counted once, keyed by the index the judge asked for. Nothing the sandbox says about itself
(a "pass", a status, an exit code) can raise a score; a refusal it reports can only lower it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import reprlib
import signal
import time
from collections.abc import Sequence

from jaxrl_llm.rewards.code import audit, checker, launch, script, values
from jaxrl_llm.rewards.code.cases import Case
from jaxrl_llm.rewards.code.session import Session

DEFAULT_TIMEOUT = 10.0  # wall-clock seconds per completion
DEFAULT_MEMORY_MB = 512
DEFAULT_FILE_SIZE_MB = 16
DEFAULT_DISK_MB = 32


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run.

    status: 'passed' (every case passed), 'failed' (some did not), 'error' (the solution did not
      load: SyntaxError, an exception at top level), 'blocked' (the audit hook refused an operation),
      'timeout' (wall clock: the judge killed it), 'cpu_limit' (RLIMIT_CPU: the kernel), 'memory'
      (MemoryError), 'output_limit' (RLIMIT_FSIZE, or the judge's caps on replies and on stdout +
      stderr), 'disk' (the tmpfs is full), 'crashed' (the sandbox ended or broke the protocol
      before answering every case), 'no_tests' (the tests ran, but no case called the solution: a
      test file of definitions only, a `check` never called; score 0). `reason` says which limit
      and who ended the process.
    reason: one line saying why, '' when passed. passed / total: cases passed / counted cases.
    stdout: without tests, what the program printed; with tests, the sandbox's own stdout (4 KiB).
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
        """Pass fraction; 0 whenever the sandbox refused anything. Cases passed before a time-out
        count. Without tests: 1.0 iff the program ran cleanly."""
        if self.blocked or self.status == "blocked":
            return 0.0
        if self.total == 0:
            return float(self.status == "passed")  # a test-less run; `no_tests` scores 0
        return self.passed / self.total


def _check_limits(code, timeout, memory_mb, file_size_mb, disk_mb, cpu_time) -> None:
    if not isinstance(code, str):
        raise ValueError(f"code must be a string, got {type(code).__name__}")
    if isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    for arg, value in (("memory_mb", memory_mb), ("file_size_mb", file_size_mb), ("disk_mb", disk_mb)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg} must be a positive integer, got {value!r}")
    if cpu_time is not None and not (isinstance(cpu_time, (int, float)) and cpu_time >= 1):
        raise ValueError(f"cpu_time must be >= 1 second (RLIMIT_CPU is in whole seconds), got {cpu_time!r}")


def judge(code: str, cases: Sequence[Case], *, timeout: float = DEFAULT_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB,
          cpu_time: float | None = None, file_size_mb: int = DEFAULT_FILE_SIZE_MB, disk_mb: int = DEFAULT_DISK_MB,
          float_tolerance: float | None = None, backend: str | None = None, audit: bool = True) -> SandboxResult:
    """Runs `code` in one sandbox against `cases` (see `cases.parse_tests`). backend: 'bwrap',
    'fallback' or None (bwrap where it works). audit=False drops the audit hook (tests use it to
    check the layers under it)."""
    _check_limits(code, timeout, memory_mb, file_size_mb, disk_mb, cpu_time)
    if backend is None:
        launch.warn_if_weak()
        backend = "bwrap" if launch.bwrap_problem() is None else "fallback"
    run_only = not cases
    cases = list(cases) or [Case("stdio", "", None, counted=False)]
    start = time.monotonic()
    budget = _budget(cases, file_size_mb)
    pipes = checker.Pipes() if cases[0].kind == "script" else None  # the checker's calls go straight to the sandbox
    try:
        session = Session(code, backend=backend, load_module=any(c.kind != "stdio" for c in cases), timeout=timeout,
                          memory_mb=memory_mb, cpu_time=cpu_time and math.ceil(cpu_time), file_size_mb=file_size_mb,
                          disk_mb=disk_mb, audit_on=audit, max_reply=budget.bytes,
                          direct=pipes.sandbox if pipes else ())  # fmt: skip
    except BaseException:
        if pipes:
            pipes.close()
        raise
    tally = _Tally(total=sum(c.counted for c in cases), cases=len(cases))
    try:
        if pipes:
            pipes.close(pipes.sandbox)
            _exchange_script(session, cases, tally, budget, float_tolerance, (file_size_mb + 1) << 20, pipes)
        else:
            _exchange(session, cases, tally, budget, float_tolerance)
    finally:
        if pipes:
            pipes.close()
        returncode, stdout, stderr = session.close()
    if backend == "bwrap" and returncode is not None and returncode > 128:
        returncode = 128 - returncode  # bwrap reports the runner's death by signal N as 128 + N
    stdout = tally.program_output[:4096] if run_only else stdout
    status, reason = _status(tally, session, returncode, timeout)
    if status == "passed" and tally.total == 0 and not run_only:
        status, reason = "no_tests", "the tests ran no case that calls the solution: score 0"
    return SandboxResult(status, reason, tally.passed, tally.total, returncode, time.monotonic() - start,
                         stdout, stderr, tuple(session.blocked))  # fmt: skip


def _budget(cases: list[Case], file_size_mb: int) -> values.Budget:
    """What one reply may cost (`values.Budget`). Bytes: 1 MiB plus 8 times the longest expected
    answer (JSON escapes at most ~6x), a longer one cannot match (`!=` too: an answer that long is
    refused); a program's shown output (uncounted, test-less) and the checker's calls, whose
    expectations the judge does not know: the output limit plus 1 MiB. Elements: 2**18 plus twice
    the expected answer's, 2**20 for those. Never more bytes than the output limit allows."""
    limit = file_size_mb << 20
    longest, elements = 0, 0
    for case in cases:
        if case.kind == "script" or not case.counted:
            longest, elements = max(longest, limit // 8), max(elements, 3 << 18)
        elif case.check in ("eq", "ne", "in"):
            encoded = json.dumps(values.encode(case.expected)).encode()
            longest = max(longest, len(encoded))
            elements = max(elements, 2 * values.count_elements(encoded, 1 << 30))
    return values.Budget(bytes=(1 << 20) + 8 * min(longest, limit), elements=(1 << 18) + elements)


@dataclasses.dataclass
class _Tally:
    total: int
    cases: int
    passed: int = 0
    answered: int = 0
    first_failure: str = ""
    load_error: str = ""
    fatal: str = ""
    memory: bool = False
    output_limit: bool = False
    protocol: str = ""
    program_output: str = ""


def _exchange(session: Session, cases: list[Case], tally: _Tally, budget: values.Budget, float_tolerance) -> None:
    """Sends the cases one at a time and compares each answer. Counted cases of one `group` (the
    asserts of one `check(f)` call) are one case, passed when all of them pass."""
    results: dict = {}
    try:
        if ready(session, tally, budget) is None:
            return
        for index, case in enumerate(cases):
            if case.kind == "call":
                request = {"i": index, "call": case.payload}  # (name, args, kwargs): plain, checked by parse_tests
            else:
                request = {"i": index, "stdin": case.payload}
            if not session.send(request):
                return
            record, _ = next_record(session, tally, budget)
            if record is None:
                return
            tally.answered += 1
            if type(record.get("i")) is not int or record["i"] != index:
                tally.protocol = f"reply for test {record.get('i')!r} when test {index} was asked"
                return
            ok, why = _verdict(case, record, float_tolerance, tally)
            if time.monotonic() > session.deadline:  # decoding and comparing count against the row's time:
                session.timed_out = True  # a verdict reached too late does not count
                return
            results[index] = ok
            if not ok:
                tally.first_failure = tally.first_failure or f"test {index} failed: {why}"
    finally:
        groups: dict = {}
        for index, case in enumerate(cases):
            if case.counted:
                key = ("group", case.group) if case.group is not None else ("case", index)
                groups[key] = groups.get(key, True) and results.get(index, False)
        tally.total, tally.passed = len(groups), sum(groups.values())


def _exchange_script(session: Session, cases: list[Case], tally: _Tally, budget: values.Budget, float_tolerance,
                     max_line: int, pipes: checker.Pipes) -> None:  # fmt: skip
    """Runs the row's test code in a checker process (`checker`) whose proxy calls go straight to the
    sandbox over `pipes`; the judge relays the solution's names, keeps the deadline (draining the
    sandbox's output meanwhile) and reads the checker's messages: each unit's verdict in order
    (`script.Units` counts the cases among them), the sandbox's refusals, and what ended the exchange."""
    units = [(case.payload[0], case.payload[2]) for case in cases]
    tests = checker.Checker(units, list(cases[0].payload[1]), budget=budget, tolerance=float_tolerance,
                            deadline=session.deadline, max_line=max_line, pipes=pipes, wait=session.wait)  # fmt: skip
    counter = script.Units(cases, tally)
    try:
        names = ready(session, tally, budget)
        if names is None or not tests.relay(json.dumps(names).encode()):
            return
        while tally.answered < len(cases) and session.blocked.total <= audit.MAX_REPORTS:
            message = tests.receive()
            if message is None:
                tally.protocol = tally.protocol or "the checker process ended before every test ran"
                break
            if "blocked" in message:
                session.blocked.append(str(message["blocked"])[:300])
            elif "error" in message:
                note_error(message, tally)
            elif "end" in message:
                _ended(session, tally, message)
                break
            elif message.get("case") == tally.answered:
                counter.add(message)
            else:
                tally.protocol = "the checker process broke the protocol"
                break
    finally:
        counter.finish()
        tests.close()


def _ended(session: Session, tally: _Tally, message: dict) -> None:
    """What ended the checker's exchange with the sandbox: the sandbox gone (its exit status says
    why), a reply over the budget, too many refusals (counted already), a broken protocol."""
    if message["end"] == "oversized":
        session.oversized = True
    elif message["end"] == "protocol":
        tally.protocol = str(message.get("why", "a broken protocol"))[:300]


def ready(session: Session, tally: _Tally, budget: values.Budget) -> list[str] | None:
    """Waits for the sandbox's first message: the solution's names (`runner.solution_names`) once it
    loaded, else None and the tally says why."""
    record, _ = next_record(session, tally, budget)
    if record is None:
        return None
    if "fatal" in record:
        tally.fatal = str(record["fatal"])[:300]
        return None
    if record.get("ready") is not True:
        tally.load_error = str(record.get("error", "no ready message"))[:300]
        tally.memory = tally.load_error.startswith("MemoryError")
        tally.output_limit = "[Errno 27]" in tally.load_error
        return None
    names = record.get("names", [])
    if type(names) is not list:
        names = []
    return [n for n in names[:1024] if type(n) is str and n.isidentifier() and not n.startswith("__")]


def next_record(session: Session, tally: _Tally, budget: values.Budget) -> tuple[dict | None, bytes]:
    """The next reply and its line, read under `budget`; refusals reported by the audit hook on
    the way are collected (they can only lower the score, so a forged one harms only its author)."""
    while True:
        line = session.receive()
        if line is None:
            return None, b""
        try:
            record = values.read_reply(line, budget)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            tally.protocol = f"unreadable reply ({type(e).__name__}: {str(e)[:80]})"
            return None, b""
        if "blocked" not in record:
            return record, line
        session.blocked.append(str(record["blocked"])[:300])


def note_error(record: dict, tally: _Tally) -> str:
    """The solution's error in `record` ('' if none), noting a MemoryError or an output limit."""
    if "error" not in record:
        return ""
    error = str(record["error"])[:300]
    tally.memory |= error.startswith("MemoryError")
    tally.output_limit |= "[Errno 27]" in error
    return error


def _verdict(case: Case, record: dict, float_tolerance, tally: _Tally) -> tuple[bool, str]:
    error = note_error(record, tally)
    if error:
        return False, error
    if case.kind == "stdio":
        got = record.get("stdout")
        if type(got) is not str:
            return False, "no output"
        if not case.counted:
            tally.program_output = got[:4096]
            return True, ""
        try:
            return values.same_output(case.expected, got, float_tolerance), "wrong output"
        except Exception as e:  # none known; any would fail this case only
            return False, f"output the check cannot compare ({type(e).__name__})"
    if "value" not in record:
        return False, "no value"
    try:
        got = values.decode(record["value"])
    except (ValueError, TypeError, RecursionError) as e:
        return False, f"malformed value ({e})"
    try:
        ok = _compare(case, got, float_tolerance)
    except Exception as e:  # e.g. OverflowError from 10**400 in abs(got - c) or math.isclose: this case fails
        return False, f"returned a value the check cannot compare ({type(e).__name__})"
    return ok, "" if ok else f"returned {reprlib.repr(got)}"  # bounded: the value may be huge


def _compare(case: Case, got, float_tolerance) -> bool:
    """The assert's own meaning in Python on the decoded value (real Python types, `values`):
    `==`, `is`, `in`, truthiness, `math.isclose`, `abs(...) < eps`; an exception fails the case."""
    tol = float_tolerance or 0.0
    if case.check == "eq":
        return values.equal(got, case.expected, tol)
    if case.check == "ne":
        return not values.equal(got, case.expected, tol)
    if case.check == "is":
        return got is case.expected  # None, True or False: decoded as the singletons
    if case.check == "truthy":
        return bool(got)
    if case.check == "falsy":
        return not got
    if case.check == "in":
        return any(values.equal(got, option, tol) for option in case.expected)
    if case.check == "isclose":
        return math.isclose(got, case.expected, rel_tol=case.rel_tol, abs_tol=case.abs_tol)
    if case.check == "abs_lt":
        return abs(got - case.expected) < case.abs_tol
    if case.check == "abs_le":
        return abs(got - case.expected) <= case.abs_tol
    raise ValueError(f"unknown check {case.check!r}")


def _status(tally: _Tally, session: Session, returncode, timeout) -> tuple[str, str]:
    """Which limit ended the run, and who ended it: the judge (wall clock, output caps, a broken
    protocol: it kills the sandbox) or the kernel (RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_AS, the tmpfs)."""
    signum = -returncode if returncode is not None and returncode < 0 else None
    unfinished = tally.answered < tally.cases  # the sandbox ended (or was killed) before answering all
    errors = tally.load_error + tally.first_failure
    if session.blocked:
        more = f" (and {session.blocked.total - 1} more)" if session.blocked.total > 1 else ""
        return "blocked", f"refused by the sandbox: {session.blocked[0]}{more}"
    if session.timed_out:
        return "timeout", f"wall-clock limit of {timeout:g} s exceeded: killed by the judge"
    if session.output_exceeded:
        return "output_limit", f"stdout and stderr over {session.output_cap >> 20} MiB: killed by the judge"
    if session.oversized:
        return "output_limit", f"a reply over {session.max_reply} bytes: killed by the judge"
    # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one (1 s later) if SIGXCPU is
    # ignored. Any other SIGKILL came from the judge (`killed`), as the audit hook refuses os.kill.
    if unfinished and (signum == signal.SIGXCPU or signum == signal.SIGKILL and not session.killed):
        name = signal.Signals(signum).name
        return "cpu_limit", f"CPU time limit of {session.cpu_limit:g} s exceeded: {name} from the kernel"
    if unfinished and signum == signal.SIGXFSZ or tally.output_limit:
        return "output_limit", "file size limit exceeded (RLIMIT_FSIZE)"
    if tally.memory:
        return "memory", "memory limit exceeded (MemoryError)"
    if "[Errno 28]" in errors:
        return "disk", f"the sandbox's disk of {session.disk_mb} MiB is full"
    if tally.fatal:
        return "crashed", f"the sandbox could not start: {tally.fatal}"
    if tally.load_error:
        return "error", f"solution raised {tally.load_error}"
    if tally.protocol:
        return "crashed", f"{tally.protocol}: the judge ended the run"
    if unfinished:
        ended = (f"killed by signal {signal.Signals(signum).name}" if signum in set(signal.Signals)
                 else f"exited with code {returncode}")  # fmt: skip
        if session.killed:
            ended = "stopped answering: killed by the judge"
        return "crashed", f"{ended} after {tally.answered} of {tally.cases} tests"
    if tally.passed < tally.total or tally.first_failure:  # an uncounted unit (setup, a bare run) failing too
        return "failed", tally.first_failure or f"{tally.total - tally.passed} of {tally.total} tests failed"
    return "passed", ""
