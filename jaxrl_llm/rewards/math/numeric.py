"""Normalization of an extracted answer and exact parsing of plain numbers (the fast path).

Everything here is pure Python on short strings: no sympy, no worker. `parse_number` returns exact
rationals, so `1/2 == 0.5` and `0.3333 != 1/3`.
"""

from __future__ import annotations

import re
from fractions import Fraction

from jaxrl_llm.rewards.math.braces import read_group, top_level_split

# Longer "answers" are not answers (a runaway box): skipping them keeps every step linear-time.
MAX_ANSWER_CHARS = 1000

_WRAPPERS = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|textsf|texttt|mathrm|mathbf|mathit|mathsf|mathtt|mbox|operatorname)"
    r"\s*\{"
)
# Order matters: `,\!` is a thousands separator before `\!` (a negative space) is dropped.
_DROP = [
    # `\\frac` (an escaped backslash in a JSON-ish string) is `\frac`; `\\c` may be a matrix row break.
    (re.compile(r"(?<!\\)\\\\(?=(?:[dtc]?frac|left|right|sqrt|pi|le|ge|leq|geq|neq|cdot|times|infty|cup|in|text|pm)"
                r"(?![A-Za-z]))"), r"\\"),
    (re.compile(r",\s*\\!\s*"), ","),
    (re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|°"), ""),
    (re.compile(r"\\(?:left|right|displaystyle|big|Big|bigg|Bigg)(?![A-Za-z])|\\!|\\;|\\:"), ""),
    (re.compile(r"(?<=\d)\\,(?=\d{3}(?!\d))"), " "),  # 1\,000: a thin space between digit groups
    (re.compile(r"\\,"), ""),
    (re.compile(r"\\q?quad(?![A-Za-z])"), " "),
    (re.compile(r"\\(?:dollar|\$)"), ""),
    (re.compile(r"\\\(|\\\)|\\\[|\\\]|\$"), ""),
    (re.compile(r"(?<!\\)\\ |~|[\u2009\u202f\u00a0]"), " "),  # `\ ` but not a row break `\\ `
    (re.compile(r"\s*\{\s*,\s*\}\s*"), ","),
    (re.compile(r"\\%|\\percent\b"), "%"),
    (re.compile(r"[−–]"), "-"),
    (re.compile(r"\\(?:approx|simeq)(?![A-Za-z])"), "≈"),
    (re.compile(r"\\equiv(?![A-Za-z])"), "="),
    (re.compile(r"\\(?:dfrac|tfrac|cfrac)(?![A-Za-z])"), r"\\frac"),
]
_PLAIN = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")  # `1,234.5`: nothing for `_DROP` to do
_SPACE_GROUPS = re.compile(r"(?<![\d.,])([1-9]\d{0,2})((?: \d{3})+)(?![\d,.])")
_THOUSANDS = re.compile(r"(?<![\d.,])([1-9]\d{0,2})((?:,\d{3})+)(?![\d,])")
_BRACKETS = re.compile(r"[()\[\]{}]")
_DECIMAL_COMMA = re.compile(r"-?\d+,\d+")
_SINGLE_SYMBOL = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?|\\[A-Za-z]+(?:_\{?\w+\}?)?")
# A name, not an expression: `x`, `a_{37}`, `AB`, `\alpha`; a label is names combined without
# arithmetic: `(p, q)`, `V_1:V_2`, `|AB|`, `f(x)`, `\frac{NO}{BO}`. `2x + 3y` or `xy` is no label.
_NAME = r"(?:[A-Za-z]|[A-Z]{2,4}|\\[A-Za-z]+)(?:_(?:\{\w+\}|\w))?"
LABEL = re.compile(
    rf"{_NAME}|\|{_NAME}\||{_NAME}\({_NAME}(?:\s*,\s*{_NAME})*\)|\(\s*{_NAME}(?:\s*,\s*{_NAME})+\s*\)"
    rf"|{_NAME}(?:\s*:\s*{_NAME})+|\\frac\{{{_NAME}\}}\{{{_NAME}\}}"
)
_UNIT_TAIL = re.compile(r"(?P<value>.*?[\d})%.])(?P<tail>\s*[A-Za-z][A-Za-z\s./^²³\d-]*)$", re.S)
# `\log_2`, `\log_{10}`, `\sin^2`: a function still waiting for its argument, which no unit follows.
_FUNCTION_HEAD = re.compile(r"\\(?:log|ln|sin|cos|tan|sec|csc|cot|exp)(?:\s*[_^]\s*(?:\{[^{}]*\}|\w))+\s*$")
_MATH_WORDS = {"pi", "e", "i", "sqrt", "log", "ln", "sin", "cos", "tan", "exp", "inf", "infinity", "oo",
               "or", "and", "cup", "cap", "in", "le", "ge", "leq", "geq", "lt", "gt", "ne", "neq"}  # fmt: skip


def clean_answer(answer: str) -> str:
    """Presentation stripped, structure kept: `$`, `\\text{}` wrappers (content kept), degrees,
    `\\left`/`\\right`, spacing, digit-group separators (`1{,}000`, `11,\\! 111`, `1 000`), `\\dfrac`."""
    s = answer.strip()
    if len(s) > MAX_ANSWER_CHARS or _PLAIN.fullmatch(s):
        return s  # not an answer (it parses as nothing), or nothing to clean (the fast path)
    s = _unwrap_text(s)
    for pattern, repl in _DROP:
        s = pattern.sub(repl, s)
    s = _SPACE_GROUPS.sub(lambda m: m.group(1) + m.group(2).replace(" ", ""), " ".join(s.split()))
    if "≈" in s:  # `x = 1/3 \approx 0.33`: the exact value is the answer; `x \approx 11` is 11
        head = s.split("≈", 1)[0]
        s = head if "=" in head else s.replace("≈", "=")
    if s[:1] == "{" and read_group(s, 0) == (s[1:-1], len(s)):
        s = s[1:-1].strip()  # `{1, 2, 3}`: a TeX group, not a set (that is `\{1, 2, 3\}`)
    return s.strip()


def normalize_answer(answer: str, *, lhs: str = "chain", lists: bool = False) -> str:
    """Strips presentation from an extracted answer: `"x = \\$1,234.50 dollars"` -> `"1234.50"`.

    lhs: how a `... =` prefix is read. "chain" (a completion's answer): the value after the last `=`,
      unless the answer is a comma list (`x = 2, y = -1` stays whole). "symbol" (a reference): only a
      label is stripped (`x = 5` -> `5`, `(p, q) = (3, 2)` -> `(3, 2)`; `2x + 3y = 12` stays).
    lists: the answer is compared with a list, so a comma always separates (`6,8` is not 6.8).
    """
    s = clean_answer(answer)
    if len(s) > MAX_ANSWER_CHARS:
        return s
    if not lists and not _BRACKETS.search(s):  # in `(12,102)` or a list a comma separates
        s = _THOUSANDS.sub(lambda m: m.group(1) + m.group(2).replace(",", ""), s)
    s = _strip_lhs(s, lhs)
    if not lists and _DECIMAL_COMMA.fullmatch(s):  # `1000,99`, `0,111`: not a thousands grouping, so a decimal comma
        s = s.replace(",", ".")
    s = " ".join(s.split()).strip().rstrip(".").strip()
    s = _strip_units(s).strip().rstrip(".").strip()
    if not lists and _DECIMAL_COMMA.fullmatch(s):  # `3,5 liters`: the unit gone, a decimal comma
        s = s.replace(",", ".")
    return s


def _strip_lhs(s: str, mode: str) -> str:
    if "=" not in s or any(op in s for op in ("<", ">", "\\le", "\\ge", "\\ne", "≤", "≥")):
        return s
    if mode == "symbol":
        return strip_label(s)
    if len(top_level_split(s, (",", ";"))) > 1:
        left, _, right = s.partition("=")  # `x = -3, 2`: one symbol names a list of values
        return right if "=" not in right and _SINGLE_SYMBOL.fullmatch(left.strip()) else s
    return s.rsplit("=", 1)[1]


def strip_label(s: str) -> str:
    """`(p, q) = (3, 2)` -> `(3, 2)`, `V_1:V_2 = 11:21` -> `11:21`: a labelled value is the value.
    An equation (`2x + 3y = 12`) or a system (`x = 2, y = -1`) stays whole."""
    left, eq, right = s.partition("=")
    return right.strip() if eq and "=" not in right and LABEL.fullmatch(left.strip()) else s


def _unwrap_text(s: str) -> str:
    """`\\text{ cm}` -> ` cm `: the content stays (a unit is stripped later, a number is kept)."""
    out, i = [], 0
    for m in _WRAPPERS.finditer(s):
        if m.start() < i:
            continue
        group = read_group(s, m.end() - 1)
        if group is None:
            break
        out.append(s[i : m.start()] + " " + group[0] + " ")
        i = group[1]
    out.append(s[i:])
    return "".join(out)


def _strip_units(s: str) -> str:
    """`5 cm^2`, `10 km/h`, `72 dollars` -> the value. A tail counts as a unit when it is words (a
    glued single letter like `2x` is algebra, not a unit) and holds no math word (`2 pi`, `1 or 2`)."""
    m = _UNIT_TAIL.fullmatch(s)
    if m is None or _FUNCTION_HEAD.search(m.group("value")):  # `\log_2 x`: x is the argument
        return s
    tail = m.group("tail")
    words = re.findall(r"[A-Za-z]+", tail)
    if any(w.lower() in _MATH_WORDS for w in words):
        return s
    if not tail[0].isspace() and len(words[0]) < 2:
        return s
    if re.search(r"(?<![\^\d])\d", tail):  # `7 dollars and 5 cents`: digits outside exponents
        return s
    if words[0].lower() in ("percent", "pct", "percentage"):
        return m.group("value") + "%"
    return m.group("value")


# ----------------------------------------------------------------------------- exact numbers

_DECIMAL = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?")
_FRAC_CMD = re.compile(r"\\[dtc]?frac")
# `3 \times 10^8`, `2.5 × 10^{-3}`: scientific notation, exact. The exponent is bounded so that a
# policy cannot make the fast path build a gigantic integer.
_SCIENTIFIC = re.compile(r"(.+?)\s*(?:\\times|\\cdot|×|\*)\s*10\s*\^\s*(?:\{\s*([+-]?\d{1,3})\s*\}|([+-]?\d))")


def parse_number(answer: str) -> tuple[Fraction, bool] | None:
    """A normalized answer as an exact value: (value, is_percent), or None if it is not a plain number.

    Accepts `-1234.5`, `3/4`, `\\frac{3}{4}`, `\\dfrac34`, `1\\frac{1}{2}` (mixed), `12.5%`,
    `3 \\times 10^{8}`."""
    s = answer.strip()
    if len(s) > MAX_ANSWER_CHARS:
        return None
    percent = s.endswith("%")
    if percent:
        s = s[:-1].strip()
    value = _parse_signed(s)
    if value is None:
        m = _SCIENTIFIC.fullmatch(s)
        mantissa = _parse_signed(m.group(1)) if m else None
        if mantissa is None:
            return None
        value = mantissa * Fraction(10) ** int(m.group(2) or m.group(3))
    return value, percent


def _parse_signed(s: str) -> Fraction | None:
    sign = 1
    if s and s[0] in "+-":
        sign, s = (-1 if s[0] == "-" else 1), s[1:].strip()
    value = _parse_unsigned(s)
    return None if value is None else (-value if sign < 0 else value)


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
    args = frac_args(s, m.end())
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


def frac_args(s: str, i: int) -> tuple[str, str, int] | None:
    """The two arguments after `\\frac` at s[i:]: braced groups or single characters (`\\frac12`)."""
    args = []
    for _ in range(2):
        while i < len(s) and s[i] == " ":
            i += 1
        if i >= len(s):
            return None
        if s[i] == "{":
            group = read_group(s, i)
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


def candidates(value: tuple[Fraction, bool]) -> list[Fraction]:
    """A percentage may be meant as a number (`50%` for "what percent": 50) or a ratio (0.5)."""
    v, percent = value
    return [v, v / 100] if percent else [v]


_ROUNDED = re.compile(r"[-+]?\d*\.(\d{2,})")


def rounds_to(decimal: str, value: Fraction) -> bool:
    """`0.0833333333333333` for 1/12, `2.6667` for 8/3: a decimal with at least two places and three
    significant digits that is `value` rounded to its places (or, from six places, truncated), where
    `value` has no finite decimal expansion (so `0.33` is not 1/3 and `0.249` is not 0.25)."""
    m = _ROUNDED.fullmatch(decimal.strip())
    if m is None or len(decimal.strip().lstrip("+-0.").replace(".", "")) < 3:
        return False
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den == 1:
        return False
    places = len(m.group(1))
    scaled = Fraction(decimal.strip()) * 10**places
    exact = abs(value) * 10**places
    sign = -1 if value < 0 else 1
    # Rounded; truncated only from six places on, where it is float printing (`0.6666666666666666`)
    # rather than a wrong rounding (`14.28` for 100/7).
    allowed = [int(exact + Fraction(1, 2))] + ([exact.numerator // exact.denominator] if places >= 6 else [])
    return scaled in [sign * v for v in allowed]


def numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    """Exact equality of two parsed numbers, either side's percentage read as x or x/100."""
    if not a[1] and not b[1]:
        return a[0] == b[0]  # the common case, without building the candidate lists
    return any(x == y for x in candidates(a) for y in candidates(b))
