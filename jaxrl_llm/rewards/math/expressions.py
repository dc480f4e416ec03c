"""Conversion of a normalized LaTeX/plain answer into a whitelisted sympy source string.

Only numbers, single-letter symbols, + - * / ** ( ) and a few function names survive, so the string
handed to sympy's `parse_expr` (which uses eval) in the worker can never name anything else.
"""

from __future__ import annotations

import re

from jaxrl_llm.rewards.math.braces import read_group
from jaxrl_llm.rewards.math.numeric import frac_args

MAX_EXPR_CHARS = 300
_COMMANDS = {
    "cdot": "*", "times": "*", "ast": "*", "div": "/", "pi": " pi ",
    "ln": " ln ", "log": " log ", "sin": " sin ", "cos": " cos ", "tan": " tan ", "exp": " exp ",
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
            m = re.match(r"\\([A-Za-z]+)", s[i:])
            if m is None:
                return None
            name, i = m.group(1), i + m.end()
            if name in ("frac", "dfrac", "tfrac", "cfrac"):
                piece, i = _frac(s, i)
            elif name == "sqrt":
                piece, i = _sqrt(s, i)
            elif name in _COMMANDS:
                piece = _COMMANDS[name]
            else:
                return None
            if piece is None:
                return None
            out.append(piece)
            continue
        out.append({"{": "(", "}": ")", "^": "**", "×": "*", "·": "*"}.get(c, c))
        i += 1
    return "".join(out)


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


def _single_arg(s: str, i: int) -> tuple[str, int] | None:
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return None
    if s[i] == "{":
        return read_group(s, i)
    return (s[i], i + 1) if s[i].isalnum() else None
