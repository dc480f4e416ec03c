"""Real Python values on the wire between the sandbox and the judge (and the checker process).

The sandbox returns each function result as one JSON line. JSON alone cannot tell a tuple from a
list or carry int dict keys, so the Python types beyond JSON are tagged objects of one key:
`{"tuple": [...]}`, `{"set": [...]}`, `{"frozenset": [...]}`, `{"dict": [[k, v], ...]}`,
`{"float": "nan" | "inf" | "-inf"}`, `{"complex": [re, im]}`, `{"bytes": latin-1 text}`, a builtin
type by name (`{"type": "int"}`),
`{"bytearray": ...}`, and `collections`' `{"Counter": pairs}`, `{"OrderedDict": pairs}`,
`{"defaultdict": [factory, pairs]}` (the factory a builtin type's name, or null), `{"deque":
[items, maxlen]}`. They decode into the same types, so `==`, `!=`, truthiness and `math.isclose` in
the judge and the checker are Python's own (`1 == True`, `240.0 == 240`, as in the official
harnesses). Nothing else can cross (the case fails naming the type): no object, no subclass (an
int or str subclass, a namedtuple), so a value that "equals everything" cannot exist outside.

`encode` and `decode` run in the sandbox too (`runner` copies their source, with `_pairs` and
`_TYPES`: proxy calls' arguments arrive there in wire form), so they use builtins only and no module-level name but
`_TYPES` and `_pairs`; the checker process runs the whole module.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time

# defaultdict factories that cross by name: builtin types (a lambda cannot cross).
# Builtin types that cross by name (`{"type": "int"}`; defaultdict factories). One line, no imports:
# the sandbox runner runs it too.
_TYPES = {t.__name__: t for t in (int, float, str, list, dict, set, tuple, frozenset, bool, complex, bytes, type(None))}


def encode(value, depth=0):
    """A Python value as its JSON-ready form; TypeError naming the type for anything else."""
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
        return {kind.__name__: [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is complex:
        return {"complex": [encode(value.real), encode(value.imag)]}
    if kind is bytes or kind is bytearray:
        return {kind.__name__: value.decode("latin-1")}
    if kind is type and any(value is t for t in (int, float, complex, str, bytes, bool, list, tuple, dict, set,
                                                 frozenset, type(None))):
        return {"type": value.__name__}  # `remove_datatype(xs, int)`: a builtin type by name
    import sys
    found = sys.modules.get("collections")
    pairs = lambda: [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]
    if found is not None and kind is found.Counter or found is not None and kind is found.OrderedDict:
        return {kind.__name__: pairs()}
    if found is not None and kind is found.defaultdict:
        factory = value.default_factory  # a builtin type by name; anything else (a lambda) as None
        builtin = (int, float, str, list, dict, set, tuple, frozenset, bool, complex, bytes)
        name = factory.__name__ if any(factory is t for t in builtin) else None
        return {"defaultdict": [name, pairs()]}
    if found is not None and kind is found.deque:
        return {"deque": [[encode(v, depth + 1) for v in value], value.maxlen]}
    raise TypeError("a value of type %s cannot cross the sandbox boundary (only None, bool, int, float, complex, "
                    "str, bytes, list, tuple, dict, set, frozenset, builtin types and collections' Counter, "
                    "OrderedDict, defaultdict, deque)" % kind.__name__)


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
    if tag == "type" and body in _TYPES:
        return _TYPES[body]
    if tag in ("bytes", "bytearray") and type(body) is str:
        return (bytes if tag == "bytes" else bytearray)(body, "latin-1")
    if tag == "complex" and type(body) is list and len(body) == 2:
        parts = [decode(v, depth + 1) for v in body]
        if not all(type(p) is float or type(p) is int for p in parts):
            raise ValueError("malformed complex")
        return complex(*parts)
    collections = __import__("collections")  # imported here: the sandbox runs this without the module's imports
    if tag == "defaultdict" and type(body) is list and len(body) == 2 and (body[0] is None or body[0] in _TYPES):
        return collections.defaultdict(_TYPES.get(body[0]), _pairs(body[1], depth))
    if tag == "deque" and type(body) is list and len(body) == 2 and type(body[0]) is list and (
            body[1] is None or type(body[1]) is int and len(body[0]) <= body[1] < 2**62):
        return collections.deque([decode(v, depth + 1) for v in body[0]], body[1])
    if type(body) is not list:
        raise ValueError("malformed %s" % tag)
    if tag in ("dict", "Counter", "OrderedDict"):
        pairs = _pairs(body, depth)
        return pairs if tag == "dict" else getattr(collections, tag)(pairs)
    items = [decode(v, depth + 1) for v in body]
    if tag == "tuple":
        return tuple(items)
    if tag != "set" and tag != "frozenset":
        raise ValueError("unknown tag %r" % tag)
    if len(items) - len(set([hash(v) for v in items])) > 64:
        raise ValueError("set members with too many equal hashes")
    return set(items) if tag == "set" else frozenset(items)


def _pairs(body, depth) -> dict:
    if type(body) is not list or not all(type(p) is list and len(p) == 2 for p in body):
        raise ValueError("malformed dict")
    keys = [decode(k, depth + 1) for k, _ in body]
    if len(keys) - len(set([hash(k) for k in keys])) > 64:  # hashes are ints hashing to themselves
        raise ValueError("dict keys with too many equal hashes")
    return dict(zip(keys, [decode(v, depth + 1) for _, v in body]))


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


_SLICE = 1 << 20  # bytes scanned with the GIL held, at most, before other threads get it back


def count_elements(line: bytes, limit: int) -> int:
    """An upper bound on the JSON values in `line`, exact enough to compare with `limit`: one per
    comma or opening bracket. Commas inside strings count too, so only when that bound is over the
    limit is the count redone outside strings, with bytes methods only (linear, no regex that a line
    of quotes, escapes and commas could make restart): escape pairs removed first (in valid JSON
    every backslash begins one, and `\\\\` pairs read left to right), so each quote left delimits a
    string; then the bytes outside strings counted 1 MiB at a time, the GIL let go between slices."""
    count = line.count(b",") + line.count(b"[") + line.count(b"{") + 1
    if count <= limit:
        return count
    plain = line.replace(b"\\\\", b"").replace(b'\\"', b"")
    count, outside_first = 1, True
    for start in range(0, len(plain), _SLICE):
        parts = plain[start : start + _SLICE].split(b'"')
        outside = b"".join(parts[0 if outside_first else 1 :: 2])
        count += outside.count(b",") + outside.count(b"[") + outside.count(b"{")
        outside_first ^= len(parts) % 2 == 0  # an odd number of quotes: the next slice starts in the other state
        if count > limit:
            break
        time.sleep(0)  # siblings judged in other threads run
    return count


_local = threading.local()  # a decoder per thread and digit limit: making one costs more than a short reply


def _decoder(digits: int | None) -> json.JSONDecoder:
    """A strict decoder: no NaN/Infinity literals; integers of at most `digits` digits (None: unchecked)."""
    decoders = _local.__dict__.setdefault("decoders", {})
    if digits is None and None not in decoders:
        decoders[None] = json.JSONDecoder(parse_constant=_reject_constant)
    if digits not in decoders:

        def parse_int(text: str) -> int:
            if len(text) > digits + 1:
                raise ValueError(f"integer of more than {digits} digits")
            return int(text)

        decoders[digits] = json.JSONDecoder(parse_constant=_reject_constant, parse_int=parse_int)
    return decoders[digits]


def read_reply(line: bytes, budget: Budget) -> dict:
    """One reply line as a dict, strictly (UTF-8, standard JSON only: no NaN/Infinity literals) and
    under `budget` (see `Budget`); ValueError (or RecursionError, UnicodeDecodeError) saying what
    was wrong or exceeded. Values inside stay in their wire form: `decode`."""
    if len(line) > budget.bytes:
        raise ValueError(f"reply of {len(line)} bytes over the budget of {budget.bytes}")
    if count_elements(line, budget.elements) > budget.elements:
        raise ValueError(f"reply of more than {budget.elements} elements")

    # A line no longer than `digits` holds no longer integer: the decoder without a hook (faster).
    record = _decoder(budget.digits if len(line) > budget.digits else None).decode(line.decode("utf-8"))
    if type(record) is not dict:
        raise ValueError("a reply must be a JSON object")
    return record


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


# What str.splitlines splits on: a text with more of these than twice the expected lines has more lines.
_BREAKS = ("\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][+-]?[0-9]+)?")


def same_output(expected: str, got: str, float_tolerance: float | None = None) -> bool:
    """Whitespace-normalised stdout equality; with `float_tolerance`, a number token may differ from an
    expected float token (a decimal point or an exponent) by that much (absolute or relative). An
    expected integer token is matched exactly, by text (`1000000006` by neither `1000000000` nor
    `1000000006.0`), and so is anything that is not a plain decimal number (`1_000_000_006`, `inf`).
    Memory is bounded by the expected output: a reply with many more lines or tokens is refused
    before it is split."""
    if expected == got:
        return True
    want = normalize_output(expected)
    got = got.strip()
    if sum(got.count(c) for c in _BREAKS) > 2 * len(want) + 2:
        return False  # more lines than expected: never split into millions of strings
    have = normalize_output(got)
    if want == have:
        return True
    if float_tolerance is None or len(want) != len(have):
        return False
    for line_want, line_have in zip(want, have):
        tokens_want = line_want.split()
        tokens_have = line_have.split(maxsplit=len(tokens_want))  # at most one token more than expected
        if len(tokens_want) != len(tokens_have):
            return False
        for a, b in zip(tokens_want, tokens_have):
            if a != b and not _close_tokens(a, b, float_tolerance):
                return False
    return True


def _close_tokens(expected: str, got: str, tolerance: float) -> bool:
    if not _FLOAT.fullmatch(expected) or not (_FLOAT.fullmatch(got) or _INT.fullmatch(got)):
        return False  # an expected integer (or a non-number) is compared as text, exactly
    return math.isclose(float(expected), float(got), rel_tol=tolerance, abs_tol=tolerance)

