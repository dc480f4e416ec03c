"""Answers that are not one value: sets, intervals, tuples, matrices, equations, inequalities, systems,
multiple-choice letters and text. Parsed from a cleaned answer (`numeric.clean_answer`) into a
`Structure`; compared element by element with a caller-supplied element comparison.

Equivalences accepted (everything else must be the same kind): a bare comma list is a set
(`1, 2` = `\\{2, 1\\}`); a pair `(a, b)` is also the open interval; a one-variable inequality or chain
is its interval (`x < 5` = `(-\\infty, 5)`); a system `x = 2, y = -1` answered as a tuple takes the
values in the reference's order, and so does a bare list (`-5, \\frac{14}{3}` for `x = -5, p = \\frac{14}{3}`).
Names may be labels (`AB = 4, CD = 5`; `0 < f(x) < 1`); a ratio `a:b` is compared part by part; a
tuple may use `;` (`(0; -2; 6)`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jaxrl_llm.rewards.math.braces import balanced, top_level_split
from jaxrl_llm.rewards.math.numeric import LABEL

# pairs of element strings -> one bool per pair (exact numbers in Python, the rest in the worker)
ElementsEqual = Callable[[Sequence[tuple[str, str]]], list[bool]]


@dataclass(frozen=True)
class Structure:
    """kind and items: "set" / "list" (a bare comma list) / "tuple" / "ratio" (`a:b`): elements;
    "interval": (left_closed, lo, hi, right_closed) per piece of a union; "matrix" / "determinant"
    (`vmatrix`): rows of elements; "system": (name, value) sorted; "relation": (op, lhs, rhs) with op
    in = != < <=; "choice": (letter,); "text": (lowercase words,)."""

    kind: str
    items: tuple


_MATRIX = re.compile(r"\\begin\{([pbvBV]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}", re.S)
_CHOICE = re.compile(r"\(?\s*([A-E])\s*\)?(?:\s(?!\s*[=<>:]).*)?", re.S)
_OTHER_LETTER = re.compile(r"(?<![A-Za-z])[A-E](?![A-Za-z])")
_TEXT = re.compile(r"[A-Za-z][A-Za-z' -]*[A-Za-z]")
_SYMBOL = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?|\\[A-Za-z]+")
_EMPTY = re.compile(r"\\(?:emptyset|varnothing)|\\\{\s*\\\}|∅")
_INFINITY = re.compile(r"([+-]?)\s*(?:\\infty|\\inf|∞|oo)")
_OPS = [
    (re.compile(r"\\(?:leqslant|leq|le)(?![A-Za-z])|≤"), "<="),
    (re.compile(r"\\(?:geqslant|geq|ge)(?![A-Za-z])|≥"), ">="),
    (re.compile(r"\\(?:neq|ne)(?![A-Za-z])|≠"), "!="),
    (re.compile(r"\\lt(?![A-Za-z])"), "<"),
    (re.compile(r"\\gt(?![A-Za-z])"), ">"),
]
_REL_SPLIT = re.compile(r"(<=|>=|!=|<|>|=)")
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "!=": "!="}
_SEPARATORS = (",", ";", " and ")


def parse_structure(s: str) -> Structure | None:
    """The structure a cleaned answer is, or None when it is a single value or unparseable."""
    s = s.strip().rstrip(".").strip()
    if not s:
        return None
    for op_re, op in _OPS:
        s = op_re.sub(op, s)
    for parser in (_matrix, _empty_or_set, _choice, _union, _ratio, _relation, _comma_list, _text):
        out = parser(s)
        if out is not None:
            return out
    return None


def _matrix(s: str) -> Structure | None:
    if s[:1] in "([" and s[-1:] in ")]" and _MATRIX.fullmatch(s[1:-1].strip()):
        s = s[1:-1].strip()  # `\left[\begin{array}...\end{array}\right]`: the brackets are the matrix's
    m = _MATRIX.fullmatch(s)
    if m is None:
        return None
    rows = [r for r in (row.strip() for row in m.group(2).split("\\\\")) if r and r != "\\hline"]
    cells = tuple(tuple(c.strip() for c in row.split("&")) for row in rows)
    if not cells or any(not c for row in cells for c in row) or len({len(r) for r in cells}) != 1:
        return None
    # `vmatrix` is a determinant, a number: never equal to the matrix written with other brackets.
    return Structure("determinant" if m.group(1).lower() == "vmatrix" else "matrix", cells)


def _empty_or_set(s: str) -> Structure | None:
    if _EMPTY.fullmatch(s):
        return Structure("set", ())
    if s.startswith("\\{") and s.endswith("\\}") and len(top_level_split(s, ("\\cup",))) == 1:
        inner = s[2:-2]
        return Structure("set", tuple(p.strip() for p in top_level_split(inner, (",", ";")))) if inner.strip() else None
    return None


def choice_letter(s: str) -> str | None:
    """`A`, `(A)`, `(B) 12` -> the letter; None for anything else."""
    out = _choice(s.strip())
    return None if out is None else out.items[0]


def _choice(s: str) -> Structure | None:
    m = _CHOICE.fullmatch(s)
    if m is None or (len(s) > 1 and not s.startswith("(") and not s[1].isspace()):
        return None
    if _OTHER_LETTER.search(s, m.end(1) + 1):  # `A B C D E`: every option listed is no choice
        return None
    return Structure("choice", (m.group(1),))


def _union(s: str) -> Structure | None:
    """Intervals `[0, 1)`, `(-\\infty, 2] \\cup (3, \\infty)`; a plain `(a, b)` is a tuple."""
    s = re.sub(r"^[A-Za-z]\s*(?:\\in(?![A-Za-z])|∈)\s*", "", s)
    pieces = [p.strip() for p in top_level_split(s, ("\\cup", "∪"))]
    parsed = []
    for p in pieces:
        if len(p) < 5 or p[0] not in "([" or p[-1] not in ")]" or not balanced(p[1:-1]):
            return None  # `(1, 2), (3, 4)` is a list of pairs, not one piece
        ends = top_level_split(p[1:-1], (",",))
        if len(ends) != 2:
            ends = top_level_split(p[1:-1], (",", ";"))
            if len(pieces) == 1 and len(ends) > 2 and p[0] == "(" and p[-1] == ")":  # `(0; -2; 6)`
                return Structure("tuple", tuple(e.strip() for e in ends))
            return None
        parsed.append((p[0] == "[", ends[0].strip(), ends[1].strip(), p[-1] == "]"))
    if len(parsed) == 1 and (parsed[0][0], parsed[0][3]) == (False, False) and not _INFINITY.search(s):
        return Structure("tuple", (parsed[0][1], parsed[0][2]))
    return Structure("interval", tuple(parsed))


def _ratio(s: str) -> Structure | None:
    """`11:21`, `12:00`: compared part by part (`22:42` is not `11:21`: no reduction is assumed)."""
    if ":" not in s or _REL_SPLIT.search(s) or len(top_level_split(s, _SEPARATORS)) > 1:
        return None
    parts = [p.strip() for p in top_level_split(s, (":",))]
    return Structure("ratio", tuple(parts)) if len(parts) > 1 and all(parts) else None


def _relation(s: str) -> Structure | None:
    if len(top_level_split(s, _SEPARATORS)) > 1:
        return None
    parts = [p.strip() for p in _REL_SPLIT.split(s)]
    if len(parts) < 3 or any(not p for p in parts):
        return None
    if len(parts) == 5:
        return _chain(parts)
    if len(parts) != 3:
        return None
    lhs, op, rhs = parts
    if op in (">", ">="):
        lhs, op, rhs = rhs, _FLIP[op], lhs
    for var, bound, var_left in ((lhs, rhs, True), (rhs, lhs, False)):
        if var[:1] == "-" and _SYMBOL.fullmatch(var[1:].strip()) and not _SYMBOL.fullmatch(bound):
            var, bound, var_left = var[1:].strip(), f"-({bound})", not var_left  # -x < b: x > -b
        if op in ("<", "<=") and _SYMBOL.fullmatch(var) and not _SYMBOL.fullmatch(bound):
            closed = op == "<="
            piece = (False, "-\\infty", bound, closed) if var_left else (closed, bound, "\\infty", False)
            return Structure("interval", (piece,))
    return Structure("relation", (op, lhs, rhs))


def _chain(parts: list[str]) -> Structure | None:
    lo, op1, var, op2, hi = parts
    if op1 != op2 and {op1, op2} - {"<", "<="} and {op1, op2} - {">", ">="}:
        return None
    if not LABEL.fullmatch(var):
        return None
    if op1 in (">", ">="):
        lo, op1, op2, hi = hi, _FLIP[op2], _FLIP[op1], lo
    if op1 not in ("<", "<=") or op2 not in ("<", "<="):
        return None
    return Structure("interval", ((op1 == "<=", lo, hi, op2 == "<="),))


def _comma_list(s: str) -> Structure | None:
    parts = [p.strip() for p in top_level_split(s, _SEPARATORS)]
    if len(parts) > 2 and not parts[-2] and parts[-1]:
        del parts[-2]  # `19, 46, and 82`
    if len(parts) < 2 or any(not p for p in parts):
        if s.startswith("[") and s.endswith("]") and len(parts) == 1:
            inner = top_level_split(s[1:-1], (",",))
            return Structure("tuple", tuple(p.strip() for p in inner)) if len(inner) > 1 else None
        return None
    pairs = [_REL_SPLIT.split(p) for p in parts]
    if all(len(q) == 3 and q[1] == "=" and LABEL.fullmatch(q[0].strip()) for q in pairs):
        names = [_name(q[0]) for q in pairs]
        if len(set(names)) == len(names):
            return Structure("system", tuple(sorted(zip(names, (q[2].strip() for q in pairs)))))
        return _solutions(s, names, [q[2].strip() for q in pairs])
    if any(len(q) > 1 for q in pairs):
        return None
    return Structure("list", tuple(parts))


def _solutions(s: str, names: list[str], values: list[str]) -> Structure | None:
    """Several solutions: `x = 1, x = 2` is the list `1, 2`; `p = 5, q = 2; p = 7, q = 2` the list of
    tuples `(5, 2), (7, 2)` (values in the order the names are first written)."""
    if len(set(names)) == 1:
        return Structure("list", tuple(values))
    groups = [top_level_split(g, (",", " and ")) for g in top_level_split(s, (";",))]
    width = len(groups[0])
    if len(groups) < 2 or any(len(g) != width for g in groups) or width * len(groups) != len(names):
        return None
    order = names[:width]
    pairs = list(zip(names, values))
    rows = [dict(pairs[k * width : (k + 1) * width]) for k in range(len(groups))]
    if any(sorted(r) != sorted(order) for r in rows):
        return None
    return Structure("list", tuple("(" + ", ".join(r[n] for n in order) + ")" for r in rows))


def _name(s: str) -> str:
    """`a_{3}` and `a_3` are one name."""
    return re.sub(r"_\{(\w)\}", r"_\1", s.strip())


def _text(s: str) -> Structure | None:
    if "\\" in s or not _TEXT.fullmatch(s) or len(s.replace(" ", "")) < 2:
        return None
    return Structure("text", (" ".join(s.lower().split()),))


def system_order(s: str) -> tuple[str, ...]:
    """The symbols of a system in the order written (`y = 1, x = 2` -> ("y", "x"))."""
    return tuple(_name(_REL_SPLIT.split(p)[0]) for p in top_level_split(s, _SEPARATORS))


def structures_equal(cand: Structure, ref: Structure, eq: ElementsEqual, order: tuple[str, ...] = ()) -> bool:
    """cand equals ref as the structure ref is (see the module docstring for the equivalences)."""
    if ref.kind in ("choice", "text"):
        return cand.kind == ref.kind and cand.items == ref.items
    if ref.kind in _SETS and cand.kind in _SETS:
        return _same_elements(cand.items, ref.items, eq)
    if ref.kind == "system" and cand.kind in ("tuple", "list") and len(order) == len(cand.items):
        cand = Structure("system", tuple(sorted(zip(order, cand.items))))  # values in the reference's order
    if ref.kind == "interval" and cand.kind == "tuple" and len(cand.items) == 2:
        cand = Structure("interval", ((False, *cand.items, False),))
    if ref.kind == "tuple" and cand.kind == "interval" and len(ref.items) == 2:
        ref = Structure("interval", ((False, *ref.items, False),))
    if cand.kind != ref.kind or len(cand.items) != len(ref.items):
        return False
    if ref.kind == "relation":
        return False  # equations need sympy: the caller compares them (`relation_sources`)
    return _flat_equal(cand, ref, eq)


_SETS = ("set", "list")


def _flat_equal(cand: Structure, ref: Structure, eq: ElementsEqual) -> bool:
    pairs: list[tuple[str, str]] = []
    for c, r in zip(cand.items, ref.items):
        if ref.kind == "interval":
            if (c[0], c[3]) != (r[0], r[3]):
                return False
            pairs += [(c[1], r[1]), (c[2], r[2])]
        elif ref.kind in ("matrix", "determinant"):
            if len(c) != len(r):
                return False
            pairs += list(zip(c, r))
        elif ref.kind == "system":
            if c[0] != r[0]:
                return False
            pairs.append((c[1], r[1]))
        else:
            pairs.append((c, r))
    return all(eq(pairs))


def _same_elements(cand: tuple, ref: tuple, eq: ElementsEqual) -> bool:
    if not cand or not ref:
        return not cand and not ref
    table = eq([(c, r) for c in cand for r in ref])
    hits = [table[i * len(ref) : (i + 1) * len(ref)] for i in range(len(cand))]
    return all(any(row) for row in hits) and all(any(row[j] for row in hits) for j in range(len(ref)))


def infinity_sign(s: str) -> int:
    """+1 / -1 for `\\infty` / `-\\infty` (also `+\\infty`, `∞`, `oo`), 0 for anything else."""
    m = _INFINITY.fullmatch(s.strip())
    return 0 if m is None else (-1 if m.group(1) == "-" else 1)
