"""Parsing tool calls out of a model turn, in the two formats chat models are trained on:

  hermes   (Qwen2.5, Hermes, many others)  <tool_call>{"name": "f", "arguments": {...}}</tool_call>
  llama3   (Llama 3.x JSON tool calling)   [<|python_tag|>]{"name": "f", "parameters": {...}}[; {...}]

`parse_tool_calls(text)` returns the calls and one error message per malformed one (bad JSON, no name,
arguments that are not an object, an unclosed tag, more calls than allowed): the caller replies with the
errors as observations, so a policy's malformed output never crashes a run.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

FORMATS = ("auto", "hermes", "llama3")
_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_MAX_CALL_CHARS = 20_000  # one call's JSON; longer is refused before json.loads sees it


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


def parse_tool_calls(text: str, *, fmt: str = "auto", max_calls: int = 4) -> tuple[list[ToolCall], list[str]]:
    """(calls, errors) of one model turn. `fmt='auto'`: Hermes if the text has a `<tool_call>` tag, else
    Llama 3 if it starts (after `<|python_tag|>` and blanks) with a JSON object, else no calls. Calls
    beyond `max_calls` are dropped with one error."""
    if fmt not in FORMATS:
        raise ValueError(f"tool call format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "hermes" or (fmt == "auto" and "<tool_call>" in text):
        raw, errors = _hermes_blocks(text)
        keys = ("arguments", "parameters")
    elif fmt == "llama3" or text.lstrip().startswith((_PYTHON_TAG, "{")):
        raw, errors = _llama3_objects(text)
        keys = ("parameters", "arguments")
    else:
        return [], []
    calls = []
    for block in raw:
        call, error = _to_call(block, keys)
        if error:
            errors.append(error)
        else:
            calls.append(call)
    if len(calls) > max_calls:
        errors.append(f"too many tool calls in one turn ({len(calls)}); only the first {max_calls} were run")
        calls = calls[:max_calls]
    return calls, errors


def _hermes_blocks(text: str) -> tuple[list[str], list[str]]:
    blocks = [m.group(1) for m in _HERMES.finditer(text)]
    errors = []
    tail = text[text.rfind("</tool_call>") + len("</tool_call>"):] if "</tool_call>" in text else text
    if "<tool_call>" in tail:
        errors.append("a <tool_call> tag is never closed by </tool_call>")
    out = []
    for b in blocks:
        if "<tool_call>" in b:  # nested: the regex paired the outer opening with the inner closing
            errors.append("nested <tool_call> tags")
        else:
            out.append(b)
    return out, errors


def _llama3_objects(text: str) -> tuple[list[str], list[str]]:
    """The JSON objects of a Llama 3 call: one, or several separated by ';' or blanks."""
    rest = text.strip().removeprefix(_PYTHON_TAG).strip()
    out, decoder = [], json.JSONDecoder()
    while rest:
        if len(rest) > _MAX_CALL_CHARS * 4:
            return out, ["tool call text too long"]
        try:
            obj, end = decoder.raw_decode(rest)
        except json.JSONDecodeError as e:
            return out, [f"tool call is not valid JSON: {e.msg} at character {e.pos}"]
        out.append(obj)
        rest = rest[end:].lstrip().lstrip(";").lstrip()
    return out, []


def _to_call(block: Any, keys: tuple[str, str]) -> tuple[ToolCall | None, str | None]:
    if isinstance(block, str):
        if len(block) > _MAX_CALL_CHARS:
            return None, f"tool call longer than {_MAX_CALL_CHARS} characters"
        try:
            block = json.loads(block)
        except json.JSONDecodeError as e:
            return None, f"tool call is not valid JSON: {e.msg} at character {e.pos}"
    if not isinstance(block, dict) or not isinstance(block.get("name"), str) or not block["name"]:
        return None, "a tool call must be a JSON object with a string 'name'"
    args = next((block[k] for k in keys if k in block), {})
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if not isinstance(args, dict):
        return None, f"the arguments of tool call {block['name']!r} must be a JSON object"
    return ToolCall(block["name"], args), None
