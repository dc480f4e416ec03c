"""Which part of a completion is its final answer, and every answer it declares.

The counted answer, in order of preference (docs/rewards.md has the same list):
1. the last complete `\\boxed{...}` / `\\fbox{...}` / `\\boxed 7` (of nested boxes the innermost; an
   unclosed, truncated last box is skipped). Every box and every `####` line is a declared answer;
2. else the text after the last `####` (GSM8K). Every non-empty `####` line is a declared answer;
3. else the answer after the last explicit phrase `final answer is`, `the answer is`, `answer:`
   (also `answers are`, `answer could be`, ...): a `$...$`, `\\(...\\)` or `\\[...\\]` right after it,
   else the rest of the line or sentence;
4. else, for a reference that is a structure, the last `$...$`/`\\(...\\)`/`\\[...\\]` segment or
   bracketed group with a comma; for a plain reference, the last number in the text.
Whether the declared answers agree, or the counted one hedges (`18 or 19`), is judged by the caller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jaxrl_llm.rewards.math.braces import matching_braces

_BOX = re.compile(r"\\(?:boxed|fbox)\b")
_BOX_TOKEN = re.compile(r"[^\s{}$]+")
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_PHRASE = re.compile(
    r"\b(?:final\s+answer|answers?)\b(?:\s*(?:is|are|was|would\s+be|could\s+be|might\s+be|should\s+be|will\s+be)"
    r"\b\s*:?|[*\s]*[:=])[* \t]*",
    re.I,
)
_MATH_OPEN = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_SENTENCE = re.compile(r"[^\n]*?(?=\.(?:\s|$)|\n|$)")
_MATH_SEGMENT = re.compile(r"\$\$(.+?)\$\$|\$([^$]+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
_BRACKET_GROUP = re.compile(r"[(\[][^()\[\]\n]{0,200},[^()\[\]\n]{0,200}[)\]]")
_GROUP_SEP = r"(?:,|\{,\}|\\,|,\\!\s?|[ \u2009\u202f])"
# The last number: a LaTeX fraction (one level of nested braces), a number with strict thousands
# groups, a decimal, a/b, `a \times 10^b`; an optional sign (only where it cannot be a binary minus,
# the unicode minus included), `$` and `%`. Never glued to a word.
NUMBER_TOKEN = re.compile(
    r"(?<![\w.])(?:(?<![\w)\]}])[-−]\s?)?\\?\$?\s?(?:"
    r"\\[dtc]?frac\{(?:[^{}]|\{[^{}]{0,40}\}){1,60}\}\{(?:[^{}]|\{[^{}]{0,40}\}){1,60}\}"
    r"|[1-9]\d{0,2}(?:" + _GROUP_SEP + r"\d{3})+(?![\d,])(?:\.\d+)?"
    r"|\d+(?:\.\d+)?(?:\s?/\s?\d+(?:\.\d+)?)?"
    r"|\.\d+"
    r")(?:\s?(?:\\times|×|\\cdot)\s?10\^(?:\{[-−]?\d{1,3}\}|[-−]?\d))?(?:\s?\\?%)?"
)
_OR = re.compile(r"\bor\b")


@dataclass(frozen=True)
class FinalAnswer:
    """text: the counted answer (raw, not normalized) or None; source: "box" | "hashes" | "phrase" |
    "segment" | "number" | "none"; declared: every declared answer of that source (boxes or `####`
    lines; just `text` otherwise); hedged: the sentence of a last-number answer offers alternatives."""

    text: str | None
    source: str
    declared: tuple[str, ...] = ()
    hedged: bool = False


def final_answer(text: str, *, structured: bool = False) -> FinalAnswer:
    """The final answer of a completion by the rules of this module's docstring."""
    boxes = all_boxed(text)
    hashes = [h for h in (m.group(1).strip() for m in _HASHES.finditer(text)) if h] if "####" in text else []
    if boxes:
        return FinalAnswer(boxes[-1], "box", tuple(boxes + hashes))
    if hashes:
        return FinalAnswer(hashes[-1], "hashes", tuple(hashes))
    phrase, end = _phrase_answer(text)
    if phrase:
        return FinalAnswer(phrase, "phrase", (phrase,), _sentence_hedges(text, end))
    if structured:
        segment = _last_segment(text)
        if segment:
            return FinalAnswer(segment, "segment", (segment,))
    last = None
    for last in NUMBER_TOKEN.finditer(text):
        pass
    if last is None:
        return FinalAnswer(None, "none")
    number = last.group(0).strip()
    return FinalAnswer(number, "number", (number,), _sentence_hedges(text, last.start()))


def extract_answer(text: str) -> str | None:
    """The final answer of `text` as a raw string (not normalized), or None when there is none."""
    return final_answer(text).text


def all_boxed(text: str) -> list[str]:
    """Contents of the complete, non-empty boxes in order; of nested boxes only the innermost."""
    boxes = list(_BOX.finditer(text))
    if not boxes:
        return []
    closing = matching_braces(text)  # one pass: re-scanning per box would be quadratic
    spans = []
    for m in boxes:
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            j = closing.get(i)
            spans.append((m.start(), j, i + 1))
        else:  # `\boxed 5`: LaTeX takes a single token as the argument
            token = _BOX_TOKEN.match(text, i)
            spans.append((m.start(), token.end() if token else i, i))
    out = []
    for k, (_, end, begin) in enumerate(spans):
        # Slice only boxes that hold no other box: slicing every nested one would be quadratic.
        if end is not None and not (k + 1 < len(spans) and spans[k + 1][0] < end):
            content = text[begin:end].strip()
            if content:
                out.append(content)
    return out


def _phrase_answer(text: str) -> tuple[str | None, int]:
    """(the answer after the last answer phrase, where the phrase ends) or (None, 0)."""
    last = None
    for last in _PHRASE.finditer(text):
        pass
    if last is None:
        return None, 0
    i = last.end()
    for opener, closer in _MATH_OPEN.items():
        if text.startswith(opener, i):
            j = text.find(closer, i + len(opener))
            if j > i + len(opener):
                return text[i + len(opener) : j].strip(), i
            break
    m = _SENTENCE.match(text, i, min(len(text), i + 300))
    region = m.group(0).strip() if m else ""
    return region or None, i


def _last_segment(text: str) -> str | None:
    """The later of the last math segment and the last bracketed group holding a comma."""
    seg = grp = None
    for seg in _MATH_SEGMENT.finditer(text):
        pass
    for grp in _BRACKET_GROUP.finditer(text):
        pass
    if seg is not None and (grp is None or seg.end() >= grp.end()):
        return next(g for g in seg.groups() if g is not None).strip() or None
    return grp.group(0) if grp is not None else None


def _sentence_hedges(text: str, pos: int) -> bool:
    """The sentence around `pos` offers alternatives with different numbers: `it is 18 or 19`."""
    start = max(text.rfind(". ", 0, pos), text.rfind("\n", 0, pos)) + 1
    end = _SENTENCE.match(text, pos).end()
    sentence = text[start:end]
    if not _OR.search(sentence):
        return False
    values = {" ".join(m.group(0).split()) for m in NUMBER_TOKEN.finditer(sentence)}
    return len(values) > 1
