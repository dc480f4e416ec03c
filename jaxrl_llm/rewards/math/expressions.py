"""Conversion of a normalized LaTeX/plain answer into a whitelisted sympy source string.

Only numbers, single-letter symbols, + - * / ** ( ) and a few function names survive, so the string
handed to sympy's `parse_expr` (which uses eval) in the worker can never name anything else.
Logarithms become `log(x)/log(b)` (`\\log_b x`; `\\log x` is base 10) or `log(x)` (`\\ln x`).
"""

from __future__ import annotations

import re

from jaxrl_llm.rewards.math.braces import read_group
from jaxrl_llm.rewards.math.numeric import frac_args

MAX_EXPR_CHARS = 300
_COMMANDS = {
    "cdot": "*", "times": "*", "ast": "*", "div": "/", "pi": " pi ",
    "sin": " sin ", "cos": " cos ", "tan": " tan ", "exp": " exp ",
}  # fmt: skip
_EXPR_TOKENS = re.compile(r"\s+|\d+(?:\.\d+)?|\.\d+|[A-Za-z]+|\*\*|[-+*/()]")
_FUNCTION_NAMES = {"sqrt", "pi", "ln", "log", "sin", "cos", "tan", "exp"}


def to_sympy_source(answer: str) -> str | None:
    """A normalized answer (`\\frac{\\sqrt{3}}{2}`, `2x+1`) as a whitelisted sympy source, or None."""
    if not answer or len(answer) > MAX_EXPR_CHARS or "%" in answer:
        return None
    src = _latex_to_plain(answer)
    if src is None or len(src) > 4 * MAX_EXPR_CHARS:
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
            piece, i = _command(s, i)
            if piece is None:
                return None
            out.append(piece)
            continue
        out.append({"{": "(", "}": ")", "^": "**", "×": "*", "·": "*"}.get(c, c))
        i += 1
    return "".join(out)


def _command(s: str, i: int) -> tuple[str | None, int]:
    """The command at s[i] (a backslash) with its arguments, as plain source, and the index after it."""
    m = re.match(r"\\([A-Za-z]+)", s[i:])
    if m is None:
        return None, i
    name, i = m.group(1), i + m.end()
    if name in ("frac", "dfrac", "tfrac", "cfrac"):
        return _frac(s, i)
    if name == "sqrt":
        return _sqrt(s, i)
    if name in ("log", "ln"):
        return _log(s, i, name)
    return _COMMANDS.get(name), i


def _frac(s: str, i: int) -> tuple[str | None, int]:
    args = frac_args(s, i)
    if args is None:
        return None, i
    num, den = _latex_to_plain(args[0]), _latex_to_plain(args[1])
    if num is None or den is None:
        return None, i
    return f"(({num})/({den}))", args[2]


def _sqrt(s: str, i: int) -> tuple[str | None, int]:
    index = None
    if i < len(s) and s[i] == "[":
        close = s.find("]", i)
        if close < 0:
            return None, i
        index, i = _latex_to_plain(s[i + 1 : close]), close + 1
        if index is None:
            return None, i
    arg = _single_arg(s, i)
    if arg is None:
        return None, i
    body = _latex_to_plain(arg[0])
    if body is None:
        return None, i
    return (f"sqrt({body})" if index is None else f"(({body})**(1/({index})))"), arg[1]


def _log(s: str, i: int, name: str) -> tuple[str | None, int]:
    """`\\log_2 8`, `\\log_{b}(x)`, `\\ln x`, `\\log^2 x` (s[i:] follows the command) as
    `log(arg)/log(base)`. The base is the subscript, else e for `\\ln` and 10 for `\\log` (the
    convention of math-verify's parser too); `\\log^2 x` is the log squared."""
    base = power = None
    while i < len(s) and s[i] in "_^":  # `\\log_2^2 x` and `\\log^2_2 x` alike
        script = _single_arg(s, i + 1)
        value = _latex_to_plain(script[0]) if script is not None else None
        if value is None:
            return None, i
        base, power = (value, power) if s[i] == "_" else (base, value)
        i = script[1]
    arg, i = _log_argument(s, i)
    if arg is None:
        return None, i
    if base is None and name == "log":
        base = "10"
    out = f"(log({arg})/log({base}))" if base is not None else f"log({arg})"
    return (out if power is None else f"({out}**({power}))"), i


_LOG_RUN = re.compile(r"(?:\d+(?:\.\d+)?|\.\d+|[A-Za-z])+")


def _log_argument(s: str, i: int) -> tuple[str | None, int]:
    """A logarithm's argument at s[i:]: a braced or parenthesized group, a command with its arguments
    (`\\frac{1}{8}`), or a run of digits and letters (`8`, `2x`) with its power (`\\log_2 2^{10}`
    is 10: the power belongs to the argument, as in `\\log x^2`)."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return None, i
    if s[i] in "{(":
        close = _closing(s, i)
        if close is None:
            return None, i
        return _latex_to_plain(s[i + 1 : close]), close + 1
    if s[i] == "\\":
        return _command(s, i)
    run = _LOG_RUN.match(s, i)
    if run is None:
        return None, i
    arg, i = run.group(0), run.end()
    if i < len(s) and s[i] == "^":
        power = _single_arg(s, i + 1)
        exponent = _latex_to_plain(power[0]) if power is not None else None
        if exponent is None:
            return None, i
        arg, i = f"({arg})**({exponent})", power[1]
    return arg, i


def _closing(s: str, i: int) -> int | None:
    """The index of the bracket closing the `{` or `(` at s[i], or None when it is unbalanced."""
    opener, depth = s[i], 0
    closer = "}" if opener == "{" else ")"
    for j in range(i, len(s)):
        depth += (s[j] == opener) - (s[j] == closer)
        if depth == 0:
            return j
    return None


def _single_arg(s: str, i: int) -> tuple[str, int] | None:
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return None
    if s[i] == "{":
        return read_group(s, i)
    return (s[i], i + 1) if s[i].isalnum() else None
