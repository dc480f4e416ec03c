"""`ToolEnvironment`: a chat model calls Python functions as tools.

Each tool's JSON schema comes from its signature and docstring (transformers' `get_json_schema`:
type hints, and a Google-style `Args:` section) and is rendered by the tokenizer's chat template
(`tool_schemas()` -> `apply_chat_template(tools=...)`). Each model turn is parsed for calls
(envs/toolcalls.py, Hermes/Qwen or Llama 3 format); every call runs and its result comes back as a
`tool` message. A turn without any call is the model's answer: the episode ends. Everything a policy can
get wrong -- bad JSON, an unknown tool, wrong or mistyped arguments, a tool that raises or runs past
`tool_timeout_s`, a huge output, too many calls -- comes back as an error message in the observation
(and in `info["errors"]`), never as an exception. The built-in Python tool (`python=True`) runs code in
the code sandbox of `jaxrl_llm.rewards.code`, with its wall-clock and memory limits.
"""
from __future__ import annotations

import importlib
import inspect
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxrl_llm.envs.base import Environment, StepResult
from jaxrl_llm.envs.registry import register_env
from jaxrl_llm.envs.toolcalls import FORMATS, ToolCall, parse_tool_calls

_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
               "array": (list,), "object": (dict,)}


def tool_schema(fn: Callable[..., Any]) -> dict:
    """The JSON schema of `fn` as chat templates expect it ({"type": "function", "function": {...}})."""
    from transformers.utils import get_json_schema
    try:
        return get_json_schema(fn)
    except Exception as e:  # noqa: BLE001 - transformers' parsing errors have several types
        raise ValueError(f"tool {getattr(fn, '__name__', fn)!r} has no usable schema: {e}") from None


def make_python_tool(*, timeout: float = 5.0, memory_mb: int = 512) -> Callable[[str], str]:
    """A `python(code)` tool: runs `code` in the code sandbox and returns what it printed (or why it failed)."""

    def python(code: str) -> str:
        """Runs a Python program in a sandbox and returns what it printed to stdout.

        Args:
            code: The complete Python program; print the values you need.
        """
        from jaxrl_llm.rewards.code import run_sandboxed
        result = run_sandboxed(code, timeout=timeout, memory_mb=memory_mb)
        if result.status == "passed":
            return result.stdout
        return f"{result.stdout}error ({result.status}): {result.reason}".strip()

    return python


def _load(tool: Callable[..., Any] | str) -> Callable[..., Any]:
    if callable(tool):
        return tool
    module, _, attr = str(tool).partition(":")
    if not (module and attr):
        raise ValueError(f"a tool must be a callable or 'package.module:function', got {tool!r}")
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"cannot import tool {tool!r}: {type(e).__name__}: {e}") from None


@register_env("tools")
class ToolEnvironment(Environment):
    """Episodes of a chat model with tools. `tools`: Python functions (or 'module:function' paths) with
    type hints and docstrings; `python`: add the sandboxed `python(code)` tool. The prompt is the row's
    `prompt_column` (messages, or a text made a user message), after `system_prompt` if given."""

    def __init__(self, tools: Sequence[Callable[..., Any] | str] = (), *, python: bool = False,
                 fmt: str = "auto", max_calls_per_turn: int = 4, max_output_chars: int = 2000,
                 tool_timeout_s: float = 10.0, python_timeout_s: float = 5.0, python_memory_mb: int = 512,
                 prompt_column: str = "prompt", system_prompt: str = ""):
        if fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
        for name, v in (("max_calls_per_turn", max_calls_per_turn), ("max_output_chars", max_output_chars)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        fns = [_load(t) for t in tools]
        if python:
            fns.append(make_python_tool(timeout=python_timeout_s, memory_mb=python_memory_mb))
        if not fns:
            raise ValueError("ToolEnvironment needs at least one tool (tools=[...] or python=True)")
        self.tools = {fn.__name__: fn for fn in fns}
        if len(self.tools) != len(fns):
            raise ValueError(f"tool names must be unique, got {[fn.__name__ for fn in fns]}")
        self.schemas = [tool_schema(fn) for fn in fns]
        self.fmt, self.max_calls, self.max_chars = fmt, max_calls_per_turn, max_output_chars
        self.timeout, self.prompt_column, self.system_prompt = tool_timeout_s, prompt_column, system_prompt

    def tool_schemas(self) -> list[dict]:
        return self.schemas

    def reset(self, row: Mapping[str, Any]):
        prompt = row[self.prompt_column]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if self.system_prompt and messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages, {"tool_calls": 0}

    def step(self, state, turn_text: str) -> StepResult:
        calls, errors = parse_tool_calls(turn_text, fmt=self.fmt, max_calls=self.max_calls)
        if not calls and not errors:
            return StepResult(None, None, state, {"tool_calls": 0})
        messages = [{"role": "tool", "name": "error", "content": f"error: {e}"} for e in errors]
        failed = len(errors)
        for call in calls:
            content, ok = self.run_call(call)
            failed += not ok
            messages.append({"role": "tool", "name": call.name, "content": content})
        state = {**state, "tool_calls": state["tool_calls"] + len(calls)}
        return StepResult(messages, None, state, {"tool_calls": len(calls), "errors": failed})

    def run_call(self, call: ToolCall) -> tuple[str, bool]:
        """(the tool message's content, whether the call succeeded)."""
        fn = self.tools.get(call.name)
        if fn is None:
            return f"error: unknown tool {call.name!r}; tools: {', '.join(sorted(self.tools))}", False
        problem = self._check_arguments(call)
        if problem:
            return f"error: {problem}", False
        outcome: dict[str, Any] = {}

        def target():
            try:
                outcome["value"] = fn(**call.arguments)
            except BaseException as e:  # noqa: BLE001 - whatever the tool does, the episode goes on
                outcome["error"] = f"{type(e).__name__}: {str(e).strip()[:200]}"

        # A daemon thread: a tool past its time limit is abandoned (it cannot be killed; tools that may
        # hang should bound themselves, as the sandboxed Python tool does).
        worker = threading.Thread(target=target, daemon=True)
        worker.start()
        worker.join(self.timeout)
        if worker.is_alive():
            return f"error: tool {call.name!r} did not return within {self.timeout:g} s", False
        if "error" in outcome:
            return f"error: tool {call.name!r} raised {outcome['error']}", False
        return self._truncate(_as_text(outcome.get("value"))), True

    def _check_arguments(self, call: ToolCall) -> str | None:
        try:
            inspect.signature(self.tools[call.name]).bind(**call.arguments)
        except TypeError as e:
            return f"bad arguments for tool {call.name!r}: {e}"
        props = next(s for s in self.schemas if s["function"]["name"] == call.name)["function"]["parameters"]
        for key, value in call.arguments.items():
            want = props.get("properties", {}).get(key, {}).get("type")
            types = _JSON_TYPES.get(want) if isinstance(want, str) else None
            if types and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
                return f"argument {key!r} of tool {call.name!r} must be of JSON type {want}, got {value!r:.40}"
        return None

    def _truncate(self, text: str) -> str:
        if len(text) <= self.max_chars:
            return text
        return text[:self.max_chars] + f"\n[... {len(text) - self.max_chars} more characters cut]"


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
