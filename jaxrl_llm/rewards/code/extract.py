"""`extract_code`: the Python in a completion, found in time linear in its length.

The completion is the policy's text: code extraction runs in the trainer's thread, before any
sandbox or timeout, so it must not be quadratic in anything a completion can repeat.
"""

from __future__ import annotations

import re

_PYTHON_TAGS = ("python", "py", "python3")
# A fence's tag: after ``` and blanks, the longest run of these characters (the rest of the line ignored).
_TAG = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")
_OPEN_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n", re.I)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(tag, body) of each closed ``` block, left to right: a fence runs to the end of its line, the
    body to the next ```. Each character is scanned a bounded number of times: once a fence has no
    line end or no closing ``` after it, no later one can have either."""
    blocks, start = [], 0
    while (fence := text.find("```", start)) >= 0:
        line_end = text.find("\n", fence + 3)
        if line_end < 0:
            break
        close = text.find("```", line_end + 1)
        if close < 0:
            break
        tag = _TAG.match(text, fence + 3, line_end).group(1)
        blocks.append((tag, text[line_end + 1 : close]))
        start = close + 3
    return blocks


def extract_code(completion: str) -> str:
    """The Python in a completion: the last ```python (or ```py / ```python3) block, else the last
    untagged ``` block, else an unclosed ```python block (truncation), else the text after
    `</think>` if any, else the whole completion."""
    blocks = fenced_blocks(completion)
    python = [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS]
    if python:
        return python[-1]
    untagged = [body for tag, body in blocks if not tag]
    if untagged:
        return untagged[-1]
    opened = list(_OPEN_FENCE.finditer(completion))
    if opened:  # a truncated completion: the block was never closed
        return completion[opened[-1].end() :]
    _, think, after = completion.rpartition("</think>")
    return after if think else completion
