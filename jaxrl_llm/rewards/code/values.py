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
import re


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
    """The inverse of `encode` on parsed JSON; ValueError on any malformed or unknown form (TypeError
    for an unhashable set member or key). Set members and dict keys are hashed once first and refused
    when more than 64 of them share a hash with another (`k * (2**61 - 1)` all hash to 0): a hash
    table of them would cost quadratic time. A set of hashes is safe: distinct ints hash apart."""
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
        keys = [decode(k, depth + 1) for k, _ in body]
        if len(keys) - len(set([hash(k) for k in keys])) > 64:  # hashes are ints hashing to themselves
            raise ValueError("dict keys with too many equal hashes")
        return dict(zip(keys, [decode(v, depth + 1) for _, v in body]))
    items = [decode(v, depth + 1) for v in body]
    if tag == "tuple":
        return tuple(items)
    if tag != "set" and tag != "frozenset":
        raise ValueError("unknown tag %r" % tag)
    if len(items) - len(set([hash(v) for v in items])) > 64:
        raise ValueError("set members with too many equal hashes")
    return set(items) if tag == "set" else frozenset(items)


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


class Budget:
    """What one reply may cost the judge, whatever the test form. bytes: the longest line read (the
    session stops reading there); elements: JSON values in it (lists, objects, strings, numbers:
    each costs ~50-70 bytes of Python object for 1-3 bytes of JSON); depth: nesting, 64 (`decode`);
    digits: of one integer (int parsing is quadratic in them). Time is the row's deadline: the
    judge checks it after each decode and comparison, which the caps above keep linear. (A plain
    class: the checker process runs this module, and dataclasses would double its start-up.)"""

    __slots__ = ("bytes", "elements", "digits")

    def __init__(self, bytes: int = 1 << 20, elements: int = 1 << 20, digits: int = 4300):
        self.bytes, self.elements, self.digits = bytes, elements, digits

    def __repr__(self) -> str:
        return f"Budget(bytes={self.bytes}, elements={self.elements}, digits={self.digits})"


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def count_elements(line: bytes, limit: int) -> int:
    """An upper bound on the JSON values in `line`, exact enough to compare with `limit`: one per
    comma or opening bracket. Commas inside strings count too, so only when that bound is over the
    limit are the strings cut out (linear, but ~20 MB/s) and the count redone."""
    count = line.count(b",") + line.count(b"[") + line.count(b"{") + 1
    if count <= limit:
        return count
    line = _STRING.sub(b'""', line)
    return line.count(b",") + line.count(b"[") + line.count(b"{") + 1


def read_reply(line: bytes, budget: Budget) -> dict:
    """One reply line as a dict, strictly (UTF-8, standard JSON only: no NaN/Infinity literals) and
    under `budget` (see `Budget`); ValueError (or RecursionError, UnicodeDecodeError) saying what
    was wrong or exceeded. Values inside stay in their wire form: `decode`."""
    if len(line) > budget.bytes:
        raise ValueError(f"reply of {len(line)} bytes over the budget of {budget.bytes}")
    if count_elements(line, budget.elements) > budget.elements:
        raise ValueError(f"reply of more than {budget.elements} elements")

    def parse_int(text: str) -> int:
        if len(text) > budget.digits + 1:
            raise ValueError(f"integer of more than {budget.digits} digits")
        return int(text)

    record = json.loads(line.decode("utf-8"), parse_constant=_reject_constant, parse_int=parse_int)
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


def equal(a, b, tolerance=0.0):
    """Python's `a == b`. With a tolerance (float_tolerance), two numbers of which one is a float
    compare within it (relative or absolute), also inside lists, tuples and dict values."""
    if not tolerance:
        return a == b
    ta, tb = type(a), type(b)
    if ta in (int, float) and tb in (int, float) and (ta is float or tb is float):
        return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)
    if ta in (list, tuple) and ta is tb:
        return len(a) == len(b) and all(equal(x, y, tolerance) for x, y in zip(a, b))
    if ta is dict and tb is dict:
        return a.keys() == b.keys() and all(equal(v, b[k], tolerance) for k, v in a.items())
    return a == b


def is_number(value) -> bool:
    return type(value) is int or type(value) is float


def normalize_output(text: str) -> list[str]:
    """stdout compared line by line, each line stripped, trailing blank lines dropped."""
    lines = [line.strip() for line in text.strip().splitlines()]
    return lines


_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][+-]?[0-9]+)?")


def same_output(expected: str, got: str, float_tolerance: float | None = None) -> bool:
    """Whitespace-normalised stdout equality; with `float_tolerance`, two number tokens may differ by
    that much (absolute or relative) where either is a float (a decimal point or an exponent).
    Integers compare exactly (`1000000000` is not `1000000006`), and so does anything that is not a
    plain decimal number (`1_000_000_006`, `inf`, `0x10`)."""
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
            if a != b and not _close_tokens(a, b, float_tolerance):
                return False
    return True


def _close_tokens(a: str, b: str, tolerance: float) -> bool:
    float_a, float_b = _FLOAT.fullmatch(a), _FLOAT.fullmatch(b)
    numbers = (float_a or _INT.fullmatch(a)) and (float_b or _INT.fullmatch(b))
    if not numbers or not (float_a or float_b):
        return False  # not two numbers, or two integers: compared as text, exactly
    return math.isclose(float(a), float(b), rel_tol=tolerance, abs_tol=tolerance)
