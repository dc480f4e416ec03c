"""Plain values on the wire between the sandbox and the judge, and their exact comparison.

The sandbox returns each function result as one JSON line. JSON alone cannot tell a tuple from a
list or carry int dict keys, so the few Python types beyond JSON are tagged objects:
`{"tuple": [...]}`, `{"set": [...]}`, `{"frozenset": [...]}`, `{"dict": [[k, v], ...]}` and
`{"float": "nan" | "inf" | "-inf"}`. Nothing else can cross: no object, no int or str subclass, so
a value that "equals everything" cannot exist on the judge's side.

`encode` and `decode` run on both sides (their source is copied into the sandbox runner), so they
use builtins only and name no module-level constant.
"""

from __future__ import annotations

import json
import math


def encode(value, depth=0):
    """A plain Python value as its JSON-ready form; TypeError/ValueError for anything else."""
    if depth > 64:
        raise ValueError("value nested deeper than 64 levels")
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            return {"float": repr(value)}
        return value
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple or kind is set or kind is frozenset:
        items = [encode(v, depth + 1) for v in value]
        return {kind.__name__: items}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise TypeError("cannot return a value of type %s (only None, bool, int, float, str, list, "
                    "tuple, dict, set)" % kind.__name__)


def decode(data, depth=0):
    """The inverse of `encode` on parsed JSON; ValueError on any malformed or unknown form."""
    if depth > 64:
        raise ValueError("value nested deeper than 64 levels")
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is str or kind is float:
        return data
    if kind is list:
        return [decode(v, depth + 1) for v in data]
    if kind is not dict or len(data) != 1:
        raise ValueError("malformed value")
    (tag, body), = data.items()
    if tag == "float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if type(body) is not list:
        raise ValueError("malformed %s" % tag)
    if tag == "dict":
        if not all(type(p) is list and len(p) == 2 for p in body):
            raise ValueError("malformed dict")
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
    items = [decode(v, depth + 1) for v in body]
    if tag == "tuple":
        return tuple(items)
    if tag == "set":
        return set(items)
    if tag == "frozenset":
        return frozenset(items)
    raise ValueError("unknown tag %r" % tag)


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def parse_line(line: bytes):
    """One reply line as a dict, strictly: UTF-8, standard JSON only (no NaN/Infinity literals)."""
    record = json.loads(line.decode("utf-8"), parse_constant=_reject_constant)
    if type(record) is not dict:
        raise ValueError("a reply must be a JSON object")
    return record


def same(expected, got, rel_tol: float = 0.0, abs_tol: float = 0.0) -> bool:
    """Exact equality with exact types all the way down: True != 1, 1 != 1.0, (1,) != [1].
    Floats compare within the tolerances when given (both 0: exactly)."""
    kind = type(expected)
    if type(got) is not kind:
        return False
    if kind is float:
        if rel_tol or abs_tol:
            return math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol)
        return got == expected
    if kind is list or kind is tuple:
        return len(got) == len(expected) and all(same(e, g, rel_tol, abs_tol) for e, g in zip(expected, got))
    if kind is dict:
        if len(got) != len(expected):
            return False
        keys = {k: k for k in got}  # the key object as the solution typed it
        return all(k in keys and same(k, keys[k]) and same(v, got[k], rel_tol, abs_tol) for k, v in expected.items())
    if kind is set or kind is frozenset:
        members = {m: m for m in got}
        return len(got) == len(expected) and all(e in members and same(e, members[e]) for e in expected)
    return got == expected  # None, bool, int, str: exact types already checked


def is_number(value) -> bool:
    return type(value) is int or type(value) is float


def normalize_output(text: str) -> list[str]:
    """stdout compared line by line, each line stripped, trailing blank lines dropped."""
    lines = [line.strip() for line in text.strip().splitlines()]
    return lines


def same_output(expected: str, got: str, float_tolerance: float | None = None) -> bool:
    """Whitespace-normalised stdout equality; with `float_tolerance`, tokens that both parse as
    numbers may differ by that much (absolute or relative)."""
    want, have = normalize_output(expected), normalize_output(got)
    if want == have:
        return True
    if float_tolerance is None or len(want) != len(have):
        return False
    for line_want, line_have in zip(want, have):
        tokens_want, tokens_have = line_want.split(), line_have.split()
        if len(tokens_want) != len(tokens_have):
            return False
        for a, b in zip(tokens_want, tokens_have):
            if a == b:
                continue
            try:
                x, y = float(a), float(b)
            except ValueError:
                return False
            if not math.isclose(x, y, rel_tol=float_tolerance, abs_tol=float_tolerance):
                return False
    return True
