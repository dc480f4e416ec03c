"""`math_answer` reward: extract a completion's final answer and compare it with the reference by value.

Extraction, in order of preference: the last complete `\\boxed{...}` (nested braces allowed), the
last `#### x` line (GSM8K), the last number in the text. The reference goes through the same
extraction (GSM8K references end in `#### 72`), except that a reference which is a value as a whole
(`\\frac{1}{2}`, `0.5`) is taken as is.

Comparison by value, fast path in pure Python with exact rationals: integers with thousands
separators, decimals, `a/b`, `\\frac`/`\\dfrac`/`\\tfrac` (and `\\frac12`), mixed numbers `1\\frac{1}{2}`,
percentages, negative numbers, with `$`, units and `x =` stripped. 1/2 equals 0.5 and 3.0 equals 3.
Anything else that converts to a whitelisted expression (`\\sqrt{2}/2`, `2\\pi`, `3^2`, `2x+1`) is
compared by sympy in a separate worker process under a hard time limit: sympy can run for ever
(`9^{9^{9}}`), and only killing a process stops C-level work reliably, from any thread.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from fractions import Fraction

from jaxrl_llm.rewards.registry import register_reward

DEFAULT_SYMPY_TIMEOUT = 2.0  # seconds per comparison; the worker's start-up is not counted
_WORKER_START_TIMEOUT = 60.0
_WORKER_MEMORY_BYTES = 2 << 30
_MAX_EXPR_CHARS = 300
# Longer "answers" are not answers (a runaway box): skipping them keeps every step linear-time.
_MAX_ANSWER_CHARS = 1000

# ----------------------------------------------------------------------------- extraction

_BOX = re.compile(r"\\(?:boxed|fbox)\b")
_BOX_TOKEN = re.compile(r"[^\s{}$]+")
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
# The last number: a LaTeX fraction, a number with strict thousands groups, a decimal, a/b; an
# optional sign (only where it cannot be a binary minus), `$` and `%`. Never glued to a word.
_NUMBER_TOKEN = re.compile(
    r"(?<![\w.])(?:(?<![\w)\]}])-\s?)?\\?\$?\s?(?:"
    r"\\[dt]?frac\{[^{}]{1,40}\}\{[^{}]{1,40}\}"
    r"|\d{1,3}(?:,\d{3})+(?![\d,])(?:\.\d+)?"
    r"|\d+(?:\.\d+)?(?:\s?/\s?\d+(?:\.\d+)?)?"
    r"|\.\d+"
    r")(?:\s?\\?%)?"
)


def extract_answer(text: str) -> str | None:
    """The final answer of `text` as a raw string (not normalized), or None when there is none."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    hashes = [m.group(1).strip() for m in _HASHES.finditer(text)]
    hashes = [h for h in hashes if h]
    if hashes:
        return hashes[-1]
    last = None
    for last in _NUMBER_TOKEN.finditer(text):
        pass
    return last.group(0).strip() if last is not None else None


def _last_boxed(text: str) -> str | None:
    """Content of the complete, non-empty box that starts last: of several boxes the last one, of
    nested boxes the innermost; an unclosed (truncated) last box falls back to the one before."""
    boxes = list(_BOX.finditer(text))
    if not boxes:
        return None
    closing = _matching_braces(text)  # one pass: re-scanning per box would be quadratic
    for m in reversed(boxes):
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            j = closing.get(i)
            content = text[i + 1 : j].strip() if j is not None else ""
        else:  # `\boxed 5`: LaTeX takes a single token as the argument
            token = _BOX_TOKEN.match(text, i)
            content = token.group(0) if token else ""
        if content:
            return content
    return None


def _matching_braces(s: str) -> dict[int, int]:
    """{index of '{': index of its matching '}'} for every balanced pair; escaped `\\{` `\\}` skipped."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    j = 0
    while j < len(s):
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == "{":
            stack.append(j)
        elif c == "}" and stack:
            pairs[stack.pop()] = j
        j += 1
    return pairs


def _read_group(s: str, i: int) -> tuple[str, int] | None:
    """s[i] == '{': returns (content, index after the matching '}'), or None when unbalanced.
    Escaped braces `\\{` `\\}` are literal characters, not grouping."""
    depth, j = 0, i
    while j < len(s):
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return s[i + 1 : j], j + 1
        j += 1
    return None


# ----------------------------------------------------------------------------- normalization

_WRAPPERS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname)\s*\{")
_DROP = [
    (re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|°"), ""),
    (re.compile(r"\\(?:left|right|displaystyle)(?![A-Za-z])|\\!|\\,|\\;|\\:"), ""),
    (re.compile(r"\\(?:dollar|\$)"), ""),
    (re.compile(r"\\\(|\\\)|\\\[|\\\]|\$"), ""),
    (re.compile(r"\\ |~"), " "),
    (re.compile(r"\{,\}"), ","),
    (re.compile(r"\\%"), "%"),
    (re.compile(r"[−–]"), "-"),
    (re.compile(r"\\(?:approx|simeq|equiv)|≈"), "="),
]
_THOUSANDS = re.compile(r"(?<![\d.,])(\d{1,3})((?:,\d{3})+)(?![\d,])")
_UNIT_TAIL = re.compile(r"(?P<value>.*?[\d})%.])(?P<tail>\s*[A-Za-z][A-Za-z\s./^²³\d-]*)$", re.S)
_MATH_WORDS = {"pi", "e", "i", "sqrt", "log", "ln", "sin", "cos", "tan", "exp", "inf", "infinity", "oo"}


def normalize_answer(answer: str) -> str:
    """Strips presentation from an extracted answer: `$`, `\\text{}`, degrees, spacing commands,
    `x =`, thousands separators and trailing units. `"x = \\$1,234.50 dollars"` -> `"1234.50"`."""
    s = answer.strip()
    if len(s) > _MAX_ANSWER_CHARS:
        return s  # not an answer; left as is, it parses as nothing
    s = _unwrap_text(s)
    for pattern, repl in _DROP:
        s = pattern.sub(repl, s)
    if "=" in s:  # `x = 5`, `\frac{a}{b} = 0.5`: the value is what comes last
        s = s.rsplit("=", 1)[1]
    s = _THOUSANDS.sub(lambda m: m.group(1) + m.group(2).replace(",", ""), s)
    s = " ".join(s.split()).strip().rstrip(".").strip()
    s = _strip_units(s)
    return s.strip().rstrip(".").strip()


def _unwrap_text(s: str) -> str:
    """`\\text{ cm}` -> ` cm `: the content stays (a unit is stripped later, a number is kept)."""
    out, i = [], 0
    for m in _WRAPPERS.finditer(s):
        if m.start() < i:
            continue
        group = _read_group(s, m.end() - 1)
        if group is None:
            break
        out.append(s[i : m.start()] + " " + group[0] + " ")
        i = group[1]
    out.append(s[i:])
    return "".join(out)


def _strip_units(s: str) -> str:
    """`5 cm^2`, `10 km/h`, `72 dollars` -> the value. A tail counts as a unit when it is words (a
    glued single letter like `2x` is algebra, not a unit) and holds no math word (`2 pi`)."""
    m = _UNIT_TAIL.fullmatch(s)
    if m is None:
        return s
    tail = m.group("tail")
    words = re.findall(r"[A-Za-z]+", tail)
    if any(w.lower() in _MATH_WORDS for w in words):
        return s
    if not tail[0].isspace() and len(words[0]) < 2:
        return s
    if re.search(r"(?<![\^\d])\d", tail):  # `7 dollars and 5 cents`: digits outside exponents
        return s
    return m.group("value")


# ----------------------------------------------------------------------------- exact numbers

_DECIMAL = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?")
_FRAC_CMD = re.compile(r"\\[dt]?frac")


def parse_number(answer: str) -> tuple[Fraction, bool] | None:
    """A normalized answer as an exact value: (value, is_percent), or None if it is not a plain number.

    Accepts `-1234.5`, `3/4`, `\\frac{3}{4}`, `\\dfrac34`, `1\\frac{1}{2}` (mixed), `12.5%`."""
    s = answer.strip()
    if len(s) > _MAX_ANSWER_CHARS:
        return None
    percent = s.endswith("%")
    if percent:
        s = s[:-1].strip()
    value = _parse_signed(s)
    return None if value is None else (value, percent)


def _parse_signed(s: str) -> Fraction | None:
    sign = 1
    if s and s[0] in "+-":
        sign, s = (-1 if s[0] == "-" else 1), s[1:].strip()
    value = _parse_unsigned(s)
    return None if value is None else sign * value


def _parse_unsigned(s: str) -> Fraction | None:
    if _DECIMAL.fullmatch(s):
        return _fraction(s)
    parts = s.split("/")
    if len(parts) == 2 and all(_DECIMAL.fullmatch(p.strip()) for p in parts):
        num, den = _fraction(parts[0].strip()), _fraction(parts[1].strip())
        return None if num is None or not den else num / den
    m = _FRAC_CMD.search(s)
    if m is None:
        return None
    whole = s[: m.start()].strip()
    args = _frac_args(s, m.end())
    if args is None or args[2] != len(s):
        return None
    num, den = _parse_signed(args[0]), _parse_signed(args[1])
    if num is None or not den:
        return None
    if not whole:
        return num / den
    if not whole.isdigit() or num < 0 or den < 0:
        return None
    return _fraction(whole) + num / den  # mixed number: 1\frac{1}{2} = 3/2


def _frac_args(s: str, i: int) -> tuple[str, str, int] | None:
    """The two arguments after `\\frac` at s[i:]: braced groups or single characters (`\\frac12`)."""
    args = []
    for _ in range(2):
        while i < len(s) and s[i] == " ":
            i += 1
        if i >= len(s):
            return None
        if s[i] == "{":
            group = _read_group(s, i)
            if group is None:
                return None
            args.append(group[0].strip())
            i = group[1]
        elif s[i].isalnum():
            args.append(s[i])
            i += 1
        else:
            return None
    return args[0], args[1], i


def _fraction(s: str) -> Fraction | None:
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):  # e.g. more than sys.get_int_max_str_digits() digits
        return None


def _candidates(value: tuple[Fraction, bool]) -> list[Fraction]:
    """A percentage may be meant as a number (`50%` for "what percent": 50) or a ratio (0.5)."""
    v, percent = value
    return [v, v / 100] if percent else [v]


def numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    """Exact equality of two parsed numbers, either side's percentage read as x or x/100."""
    return any(x == y for x in _candidates(a) for y in _candidates(b))


# ----------------------------------------------------------------------------- expressions

_COMMANDS = {
    "cdot": "*", "times": "*", "ast": "*", "div": "/", "pi": " pi ",
    "ln": " ln ", "log": " log ", "sin": " sin ", "cos": " cos ", "tan": " tan ", "exp": " exp ",
}  # fmt: skip
_EXPR_TOKENS = re.compile(r"\s+|\d+(?:\.\d+)?|\.\d+|[A-Za-z]+|\*\*|[-+*/()]")
_FUNCTION_NAMES = {"sqrt", "pi", "ln", "log", "sin", "cos", "tan", "exp"}


def to_sympy_source(answer: str) -> str | None:
    """A normalized LaTeX/plain answer as a whitelisted sympy expression string, or None.

    Only numbers, single-letter symbols, + - * / ** ( ) and a few function names survive, so the
    string handed to sympy's `parse_expr` (which uses eval) can never name anything else."""
    if not answer or len(answer) > _MAX_EXPR_CHARS or "%" in answer:
        return None
    src = _latex_to_plain(answer)
    if src is None or len(src) > 4 * _MAX_EXPR_CHARS:
        return None
    pos = 0
    for m in _EXPR_TOKENS.finditer(src):
        if m.start() != pos:
            return None
        token = m.group(0)
        if token[0].isalpha() and len(token) > 1 and token not in _FUNCTION_NAMES:
            return None
        pos = m.end()
    if pos != len(src) or not src.strip():
        return None
    return src


def _latex_to_plain(s: str) -> str | None:
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            m = re.match(r"\\([A-Za-z]+)", s[i:])
            if m is None:
                return None
            name, i = m.group(1), i + m.end()
            if name in ("frac", "dfrac", "tfrac"):
                args = _frac_args(s, i)
                if args is None:
                    return None
                num, den = _latex_to_plain(args[0]), _latex_to_plain(args[1])
                if num is None or den is None:
                    return None
                out.append(f"(({num})/({den}))")
                i = args[2]
            elif name == "sqrt":
                index = None
                if i < len(s) and s[i] == "[":
                    close = s.find("]", i)
                    if close < 0:
                        return None
                    index, i = _latex_to_plain(s[i + 1 : close]), close + 1
                    if index is None:
                        return None
                arg = _single_arg(s, i)
                if arg is None:
                    return None
                body = _latex_to_plain(arg[0])
                if body is None:
                    return None
                out.append(f"sqrt({body})" if index is None else f"(({body})**(1/({index})))")
                i = arg[1]
            elif name in _COMMANDS:
                out.append(_COMMANDS[name])
            else:
                return None
        elif c == "{":
            out.append("(")
            i += 1
        elif c == "}":
            out.append(")")
            i += 1
        elif c == "^":
            out.append("**")
            i += 1
        elif c in "×·":
            out.append("*")
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _single_arg(s: str, i: int) -> tuple[str, int] | None:
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return None
    if s[i] == "{":
        group = _read_group(s, i)
        return None if group is None else (group[0], group[1])
    return (s[i], i + 1) if s[i].isalnum() else None


# ----------------------------------------------------------------------------- sympy worker


def _worker_main() -> None:
    """Entry point of the sympy worker process: one JSON request per stdin line, one reply per line.

    Request {"candidate": str | null, "references": [str]} -> reply {"ref_ok": bool, "equal": bool}.
    """
    import resource

    # A runaway power or simplify must end in MemoryError here, never in the host's OOM killer.
    resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY_BYTES, _WORKER_MEMORY_BYTES))
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

    # Warm sympy's lazy imports and caches now: the first simplify costs ~0.5 s, which would
    # otherwise be charged to the first comparison's time limit.
    equal(parse("(x+1)**2"), parse("x**2+2*x+1"))
    equal(parse("sqrt(8)"), parse("2*sqrt(2)"))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        reply = {"ref_ok": False, "equal": False}
        try:
            request = json.loads(line)
            refs = []
            for src in request["references"]:
                try:
                    refs.append(parse(src))
                except Exception:  # noqa: BLE001 - an unparseable reference is an answer, not a crash
                    pass
            reply["ref_ok"] = bool(refs)
            if refs and request["candidate"] is not None:
                candidate = parse(request["candidate"])
                reply["equal"] = any(equal(candidate, r) for r in refs)
        except Exception:  # noqa: BLE001 - MemoryError, RecursionError, sympy errors: not equal
            pass
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class _SympyWorker:
    """A lazily started worker process, killed and restarted when a comparison exceeds its limit."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._lock = threading.Lock()

    def compare(self, candidate: str | None, references: list[str], timeout: float) -> dict | None:
        """Reply dict, or None when the comparison ran out of time (the worker is then killed)."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            request = json.dumps({"candidate": candidate, "references": references}) + "\n"
            try:
                self._proc.stdin.write(request.encode())
                self._proc.stdin.flush()
            except OSError:
                self._kill()
                return None
            line = self._readline(time.monotonic() + timeout)
            if line is None:
                self._kill()
                return None
            return json.loads(line)

    def _start(self) -> None:
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._buffer = b""
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from jaxrl_llm.rewards.math import _worker_main; _worker_main()"],
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
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
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


_WORKER = _SympyWorker()
atexit.register(_WORKER.close)


# ----------------------------------------------------------------------------- the reward


def reference_answer(reference: str) -> str | None:
    """The reference's answer string: boxed > `####` > the whole string if it is a value > last number."""
    boxed = _last_boxed(reference)
    if boxed is not None:
        return boxed
    if "####" in reference:
        return extract_answer(reference)
    whole = normalize_answer(reference)
    if whole and (parse_number(whole) is not None or to_sympy_source(whole) is not None):
        return reference.strip()
    return extract_answer(reference)


def score_answer(completion: str, reference: str, *, timeout: float = DEFAULT_SYMPY_TIMEOUT) -> float | None:
    """1.0 if the completion's final answer equals the reference by value, else 0.0; None when the
    reference has no answer that parses as a value (the row is then "not applicable")."""
    ref_raw = reference_answer(reference)
    if ref_raw is None:
        return None
    ref = normalize_answer(ref_raw)
    ref_num = parse_number(ref)
    ref_src = to_sympy_source(ref) if ref_num is None else None
    if ref_num is None and ref_src is None:
        return None
    cand_raw = extract_answer(completion)
    cand = normalize_answer(cand_raw) if cand_raw is not None else ""
    cand_num = parse_number(cand) if cand else None
    cand_src = to_sympy_source(cand) if cand and cand_num is None else None
    if ref_num is not None:
        if cand_num is not None:
            return float(numbers_equal(cand_num, ref_num))
        if cand_src is None:
            return 0.0
        reply = _WORKER.compare(cand_src, [_rational_source(v) for v in _candidates(ref_num)], timeout)
        return 0.0 if reply is None else float(reply["equal"])  # out of time: unverifiable earns nothing
    # A symbolic reference: the worker also tells whether it parses (if not, the row is None).
    candidates = [_rational_source(v) for v in _candidates(cand_num)] if cand_num is not None else [cand_src]
    for candidate in candidates:
        reply = _WORKER.compare(candidate, [ref_src], timeout)
        if reply is None:
            return 0.0
        if not reply["ref_ok"]:
            return None
        if reply["equal"]:
            return 1.0
    return 0.0


def _rational_source(value: Fraction) -> str:
    return f"({value.numerator})/({value.denominator})"


@register_reward("math_answer")
def math_answer(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    answer: Sequence[str | int | float | None],
    sympy_timeout: float = DEFAULT_SYMPY_TIMEOUT,
    **columns,
) -> list[float | None]:
    """Reward 1.0 when a completion's final answer equals the row's reference `answer` by value.

    answer: (N,) reference answers (a dataset column; GSM8K's "...#### 72" works as is). A numeric
      or None entry is allowed; None, or a reference without a parseable value, gives None.
    sympy_timeout: seconds allowed for each symbolic comparison; on time-out the row scores 0.
    """
    del prompts, columns
    if isinstance(answer, str) or not isinstance(answer, Sequence) or len(answer) != len(completions):
        raise ValueError(f"math_answer needs the column 'answer' with {len(completions)} references")
    if not sympy_timeout > 0:
        raise ValueError(f"sympy_timeout must be > 0 seconds, got {sympy_timeout!r}")
    scores: list[float | None] = []
    for completion, reference in zip(completions, answer):
        if reference is None:
            scores.append(None)
            continue
        if isinstance(reference, bool) or not isinstance(reference, (str, int, float)):
            raise ValueError(f"math_answer references must be strings or numbers, got {type(reference).__name__}")
        scores.append(score_answer(completion, str(reference), timeout=sympy_timeout))
    return scores
