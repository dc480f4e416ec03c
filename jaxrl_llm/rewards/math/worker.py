"""The sympy / math-verify worker process: every comparison that is not plain numbers runs here.

Sympy can run for ever (`9^{9^{9}}` evaluates a tower of powers in C) and math-verify's own timeout
relies on `signal.alarm`, which fails outside the main thread. Only killing a process stops C-level
work reliably, from any thread: a request that exceeds its time limit kills the worker, and the
next request starts a fresh one.

Protocol: one JSON request per stdin line, one JSON reply per stdout line.
  {"candidate": str|null, "references": [str]}     -> {"ref_ok": bool, "equal": bool}
  {"op": "pairs", "pairs": [[str, str], ...]}      -> {"equal": [bool, ...]}  (sympy sources)
  {"op": "ratio", "candidate": str, "reference": str} -> {"ratio": "pos"|"neg"|"none"}: the sign of
      candidate/reference when it is a nonzero constant (two equations' `lhs - rhs`)
  {"op": "mv", "gold": str, "pred": str}           -> {"gold_ok": bool, "equal": bool} (math-verify)
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import select
import subprocess
import sys
import threading
import time

_WORKER_START_TIMEOUT = 60.0
_WORKER_MEMORY_BYTES = 2 << 30


def _sympy_tools():
    import sympy
    from sympy.parsing.sympy_parser import (
        implicit_multiplication_application,
        parse_expr,
        rationalize,
        standard_transformations,
    )

    transformations = standard_transformations + (implicit_multiplication_application, rationalize)
    functions = {"sqrt": sympy.sqrt, "pi": sympy.pi, "ln": sympy.log, "log": sympy.log, "sin": sympy.sin,
                 "cos": sympy.cos, "tan": sympy.tan, "exp": sympy.exp}  # fmt: skip

    def parse(src: str):
        # Single letters are plain symbols: `E`, `I`, `N`, `S` must not become sympy objects.
        local = {c: sympy.Symbol(c) for c in set(re.findall(r"(?<![A-Za-z])[A-Za-z](?![A-Za-z])", src))}
        local.update(functions)
        expr = parse_expr(src, local_dict=local, transformations=transformations)
        if not isinstance(expr, sympy.Expr) or expr.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
            raise ValueError("not a finite expression")
        return expr

    def equal(a, b) -> bool:
        if a.free_symbols or b.free_symbols:
            return sympy.simplify(a - b) == 0
        diff, scale = sympy.N(a - b, 30), sympy.N(b, 30)
        return bool(abs(diff) <= sympy.Float("1e-9") * max(1, abs(scale)))

    def ratio(a, b) -> str:
        q = sympy.simplify(a / b)
        if q.free_symbols or q == 0 or not q.is_finite:
            return "none"
        return "pos" if q > 0 else "neg"

    return parse, equal, ratio


def _math_verify_judge():
    """(gold, pred) -> (gold parsed, equal). None when math-verify is not installed."""
    try:
        import logging

        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError:
        return None
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns once that its timeout is off
    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    @functools.lru_cache(maxsize=1024)  # a group's G completions share one reference
    def parse_gold(gold: str) -> list:
        # Only a parsed reference counts: math-verify falls back to the raw string, which reads anything.
        return [x for x in parse(gold, config, parsing_timeout=None) if not isinstance(x, str)]

    def judge(gold: str, pred: str) -> tuple[bool, bool]:
        # Timeouts off: math-verify's use signal.alarm; this process is killed from outside instead.
        g = parse_gold(gold)
        if not g:
            return False, False
        p = parse(pred, config, parsing_timeout=None)
        return True, bool(p) and verify(g, p, timeout_seconds=None)

    return judge


def _answer(request: dict, parse, equal, ratio, judge) -> dict:
    op = request.get("op", "expr")
    if op == "pairs":
        out = []
        for a, b in request["pairs"]:
            try:
                out.append(bool(equal(parse(a), parse(b))))
            except Exception:  # noqa: BLE001 - an unparseable element is simply not equal
                out.append(False)
        return {"equal": out}
    if op == "ratio":
        return {"ratio": ratio(parse(request["candidate"]), parse(request["reference"]))}
    if op == "mv":
        if judge is None:
            return {"gold_ok": False, "equal": False, "missing": True}
        gold_ok, eq = judge(request["gold"], request["pred"])
        return {"gold_ok": gold_ok, "equal": eq}
    refs = []
    for src in request["references"]:
        try:
            refs.append(parse(src))
        except Exception:  # noqa: BLE001 - an unparseable reference is an answer, not a crash
            pass
    reply = {"ref_ok": bool(refs), "equal": False}
    if refs and request["candidate"] is not None:
        candidate = parse(request["candidate"])
        reply["equal"] = any(equal(candidate, r) for r in refs)
    return reply


def worker_main() -> None:
    """Entry point of the worker process (see the module docstring for the protocol)."""
    import resource

    # A runaway power or simplify must end in MemoryError here, never in the host's OOM killer.
    resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY_BYTES, _WORKER_MEMORY_BYTES))
    parse, equal, ratio = _sympy_tools()
    judge = _math_verify_judge()
    # Warm sympy's lazy imports and caches now (and math-verify's grammar): the first simplify costs
    # ~0.5 s, which would otherwise be charged to the first comparison's time limit.
    equal(parse("(x+1)**2"), parse("x**2+2*x+1"))
    equal(parse("sqrt(8)"), parse("2*sqrt(2)"))
    if judge is not None:
        judge("$\\frac{1}{2}$", "$0.5$")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    failed = {"ref_ok": False, "equal": False, "gold_ok": False, "ratio": "none"}
    for line in sys.stdin:
        try:
            reply = _answer(json.loads(line), parse, equal, ratio, judge)
        except Exception:  # noqa: BLE001 - MemoryError, RecursionError, sympy errors: not equal
            reply = failed
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class SympyWorker:
    """A lazily started worker process, killed and restarted when a request exceeds its limit."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._lock = threading.Lock()

    def request(self, request: dict, timeout: float) -> dict | None:
        """Reply dict, or None when the request ran out of time (the worker is then killed)."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            try:
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except OSError:
                self._kill()
                return None
            line = self._readline(time.monotonic() + timeout)
            if line is None:
                self._kill()
                return None
            return json.loads(line)

    def compare(self, candidate: str | None, references: list[str], timeout: float) -> dict | None:
        """Sympy equality of a candidate source with any of the reference sources."""
        return self.request({"candidate": candidate, "references": references}, timeout)

    def _start(self) -> None:
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._buffer = b""
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from jaxrl_llm.rewards.math.worker import worker_main; worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a Ctrl-C meant for the trainer must not hit the worker first
        )
        if self._readline(time.monotonic() + _WORKER_START_TIMEOUT) != "ready":
            self._kill()
            raise RuntimeError("the sympy worker process of math_answer failed to start")

    def _readline(self, deadline: float) -> str | None:
        fd = self._proc.stdout.fileno()
        poller = select.poll()  # not select.select: a trainer with over 1,024 open descriptors
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(max(1, int(remaining * 1000))):
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                stream.close()
        self._proc = None

    def close(self) -> None:
        with self._lock:
            self._kill()


WORKER = SympyWorker()
atexit.register(WORKER.close)
