"""Example agents for `env.name=agent` (envs/endpoint.py): plain functions `agent(client, task) -> reward`
written against the `openai` package, as any agent code would be.

`guess_digit`: the built-in task of envs/guess.py played by an agent instead of the in-process
environment: it asks for a guess, replies '<', '>' or '?' itself, and returns 1.0 when the model finds the
hidden digit, 0.0 when the episode ends first (the endpoint answers `finish_reason: "length"` once the
turn limit or the token budget is spent). Its episodes are the in-process `guess_digit`'s, token for
token (tests/test_envs_endpoint.py): configs/tiny_agent.py trains it.
"""
from __future__ import annotations

from typing import Any


def guess_digit(client, task: dict[str, Any]) -> float:
    """Plays one guess_digit episode through `client` (an `openai.OpenAI` client); the reward."""
    hidden = int(task["hidden"])
    messages: list[dict] = [{"role": "user", "content": str(task["prompt"])}]
    while True:
        choice = client.chat.completions.create(model="policy", messages=messages).choices[0]
        if choice.finish_reason == "length":
            return 0.0
        text = choice.message.content or ""
        if len(text) == 1 and text in "0123456789":
            if int(text) == hidden:
                return 1.0
            reply = "<" if hidden < int(text) else ">"
        else:
            reply = "?"
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": reply}]
