"""Where a completion's chat turn ends: the text a sampler stopping at the end-of-turn marker returns.

A policy's decoded completion may still hold the chat template's special tokens: an end-of-turn
marker (`<|im_end|>`, `<|eot_id|>`, `</s>`, `<end_of_turn>`, ...), padding after it, or a next turn
the model went on to invent. None of that is part of the answer.
"""

from __future__ import annotations

import re

# Where the model's chat turn ends or another one starts (ChatML, Llama 3, Gemma, Phi-3, Mistral,
# DeepSeek): a sampler stops there, so what follows (padding, a hallucinated next turn) is no answer.
# Only where a turn can end: before a space, punctuation, a role or the end, never inside a token
# (`4<|im_end|>2` is no answer at all, neither 4 nor 42).
_TURN_MARKER = re.compile(
    r"(?:<\|(?:im_end|im_start|endoftext|end_of_text|eot_id|eom_id|start_header_id|end|user|assistant|system)\|>"
    r"|</s>|<(?:eos|pad|end_of_turn|start_of_turn)>|<｜(?:end▁of▁sentence|User|Assistant)｜>)"
    r"(?=\W|$|user|assistant|system|model|human)",
    re.I,
)
# Any special token (`<|end_of_solution|>`, DeepSeek's full-width bars) closing the completion.
_TRAILING_TOKEN = re.compile(r"(?:<\|[^|<>\s]{1,40}\|>|<｜[^｜<>\s]{1,40}｜>)\Z")


def within_turn(text: str) -> str:
    """The completion up to where its chat turn ends: cut at the first turn marker that follows some
    text (markers before any text are a template's header), with trailing special tokens dropped.
    Nothing is joined across a marker: `4<|im_end|>2` (a marker inside a token) stays as it is."""
    if "<" not in text:
        return text  # the common case, decided without a scan
    last = 0
    for m in _TURN_MARKER.finditer(text):
        if text[last : m.start()].strip():
            text = text[: m.start()]
            break
        last = m.end()
    end = len(text.rstrip())
    while text.endswith(">", 0, end):
        m = _TRAILING_TOKEN.search(text, max(0, end - 48), end)
        if m is None:
            break
        end = m.start()
        while end and text[end - 1].isspace():
            end -= 1
    return text[:end]
