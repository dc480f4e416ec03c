"""Brace matching and top-level splitting of LaTeX answer strings; every function is linear-time."""

from __future__ import annotations

import re

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {")", "]", "}"}
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.S)  # an escape (`\{`, `\\`) is one token, never a brace


def matching_braces(s: str) -> dict[int, int]:
    """{index of '{': index of its matching '}'} for every balanced pair; escaped `\\{` `\\}` skipped."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_TOKENS.finditer(s):  # the regex skips plain text at C speed
        c = m.group()
        if c == "{":
            stack.append(m.start())
        elif c == "}" and stack:
            pairs[stack.pop()] = m.start()
    return pairs


def read_group(s: str, i: int) -> tuple[str, int] | None:
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


def top_level_split(s: str, separators: tuple[str, ...]) -> list[str]:
    """`s` split at the separators that are outside every (), [], {} and `\\{ \\}` pair.

    Brackets are counted without checking that they match: intervals such as `[0, 1)` close with
    another kind of bracket than they open with. Separators are tried in order at each position."""
    if not any(sep in s for sep in separators):  # the common case, at C speed
        return [s]
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if c == "\\" and s.startswith("\\\\", i):  # a matrix row break, not an escape
            i += 2
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif depth == 0:
            sep = next((x for x in separators if s.startswith(x, i)), None)
            if sep is not None:
                parts.append(s[start:i])
                i += len(sep)
                start = i
                continue
        i += 1
    parts.append(s[start:])
    return parts


def balanced(s: str) -> bool:
    """Every (, [, { closed, none closed before it opens (of any kind: `[0, 1)` is balanced)."""
    depth = 0
    for c in s:
        depth += (c in "([{") - (c in ")]}")
        if depth < 0:
            return False
    return depth == 0
