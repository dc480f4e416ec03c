"""Which part of a completion is its final answer, and every answer it declares.

The counted answer, in order of preference (docs/rewards.md has the same list):
1. the last complete `\\boxed{...}` / `\\fbox{...}` / `\\boxed 7` (of nested boxes the innermost; an
   unclosed, truncated last box is skipped). With `join` (a reference of several values), the last
   run of boxes separated only by connectors (`,`, `and`, `or`, `\\quad`, `$`, `x =`) is one list
   answer: `\\boxed{1} and \\boxed{-2}` is `1, -2`;
2. else the text after the last `####` (GSM8K; its value when a remark follows: `#### 8 (not 12)`);
3. else the answer after the last explicit phrase `final answer is`, `the answer is`, `answer:`
   (also `answers are`, `answer could be`, ...): a `$...$`, `\\(...\\)` or `\\[...\\]` right after it,
   else the rest of the line or sentence; when that is a value, its unit and a remark offering no
   alternative (`20 cups, which is one third of the 60 cups`, `8 (not 12)`), the value; when it is
   prose (`The volume is 120.`), its last math segment or number;
4. else the last `$...$`/`\\(...\\)`/`\\[...\\]` segment when nothing but punctuation follows it; for a
   structured reference, the last math segment or bracketed group with a comma; else the last number.
The completion ends at the first chat end-of-turn or start-of-turn marker after its text
(`<|im_end|>`, `</s>`, ...), trailing special tokens dropped. After a `</think>`, only the text after
it is read when it holds an answer (the reasoning before it is scratch work). Declared answers are
every box, every `####` line and every answer phrase stating a plain number (or a value before a
remark) after the last self-correction (`Wait`, `Actually`, `let me recheck`, ...): an answer
revised after one no longer counts. Whether the declared answers agree, or the counted one hedges
(`18 or 19`), is judged by the caller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jaxrl_llm.rewards.math.braces import matching_braces
from jaxrl_llm.rewards.math.turns import within_turn

_BOX = re.compile(r"\\(?:boxed|fbox)\b")
_BOX_TOKEN = re.compile(r"[^\s{}$]+")
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
# Matched where the word `answer` starts (found by `str.find`, not a regex scan of the whole text);
# `final answer is` ends where `answer is` does.
_PHRASE = re.compile(
    r"(?<![A-Za-z])answers?\b(?:\s*(?:is|are|was|would\s+be|could\s+be|might\s+be|should\s+be|will\s+be)"
    r"\b\s*:?|[*\s]*[:=])[* \t]*",
    re.I,
)
# A self-correction: what was declared before it is withdrawn, the answer after it counts.
_CORRECTION = re.compile(
    r"(?<!\bor )\b(?:wait|actually|hold on|oops|on second thought|correct(?:ion|ing)|mistake|miscalculat\w*|"
    r"re-?check\w*|re-?calculat\w*|re-?comput\w*|re-?evaluat\w*|double[- ]check\w*|let me (?:check|verify))\b",
    re.I,
)
_MATH_OPEN = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_SENTENCE = re.compile(r"[^\n]*?(?=\.(?:\s|$)|\n|$)")
_MATH_SEGMENT = re.compile(r"\$\$(.+?)\$\$|\$([^$]+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
_BRACKET_GROUP = re.compile(r"[(\[][^()\[\]\n]{0,200},[^()\[\]\n]{0,200}[)\]]")
_PROSE = re.compile(r"[A-Za-z]{2,}\s+[A-Za-z]{2,}")  # two words in a row, outside math
_GROUP_SEP = r"(?:,|\{,\}|\\,|,\\!\s?|[ \u2009\u202f])"
_FRAC_ARG = r"(?:\{(?:[^{}]|\{[^{}]{0,40}\}){1,60}\}|\d(?!\d))"
# The last number: a LaTeX fraction (one level of nested braces, or `\frac12`), a number with strict
# thousands groups, a decimal comma (`2,74`, never inside brackets), a decimal, a/b,
# `a \times 10^b`; an optional sign (only where it cannot be a binary minus, the unicode minus
# included), `$` and `%`. Never glued to a word.
NUMBER_TOKEN = re.compile(
    r"(?<![\w.])(?:(?<![\w)\]}])[-−]\s?)?\\?\$?\s?(?:"
    r"\\[dtc]?frac" + _FRAC_ARG + _FRAC_ARG +
    r"|[1-9]\d{0,2}(?:" + _GROUP_SEP + r"\d{3})+(?![\d,])(?:\.\d+)?"
    r"|(?<![(\[{,])\d+,\d+(?![\d,)\]}])"
    r"|\d+(?:\.\d+)?(?:\s?/\s?\d+(?:\.\d+)?)?"
    r"|\.\d+"
    r")(?:\s?(?:\\times|×|\\cdot)\s?10\^(?:\{[-−]?\d{1,3}\}|[-−]?\d))?(?:\s?\\?%)?"
)
_PLAIN_NUMBER = re.compile(r"[-−]?\$?\s?(?:\d[\d,]*(?:\.\d+)?|\.\d+)\s?%?(?:\s[A-Za-z]+)?")  # `$5`, `12 kg`
_NUMBER_START = set("0123456789$-−.")
# An answer stated as a value, its unit words, then a remark (`20 cups, which is one third of the 60
# cups`, `8 (not 12)`, `12 because 3 * 4 = 12`): the remark starts at `,` `;` `(` or a dash before
# a word, or at a connective. Operator words are no unit and start no remark: in `6 squared, which
# is 36` or `12, times 3` the number is an operand, not the answer (`12 divided by 4, which` or
# `10 choose 3, which` have another number before the remark, so no value is read there either).
_CONNECTIVE = r"(?:which|because|since|as|so|that|given|from|using|i\.e\.|e\.g\.)"
_OPERATOR = (r"(?:plus|minus|times|divided|multiplied|over|squared|cubed|factorial|mod|modulo|to|"
             r"dozen|hundred|thousand|million|billion|trillion)")  # fmt: skip
_HEDGE = (r"(?:or|but|if|unless|maybe|perhaps|possibly|probably|could|might|either|alternativ\w*|other\w*|"
          r"depend\w*|instead|although|though|however|also|else|another)")  # fmt: skip
_UNIT_WORDS = re.compile(
    rf"(?:\s+(?!(?:{_CONNECTIVE}|{_OPERATOR}|{_HEDGE}|and|is|are|was|were|not)\b)"
    r"[A-Za-z]{2,}(?:/[A-Za-z]+)?(?:\^\{?[23]\}?|[²³])?(?![\w^/]))*",
    re.I,
)
_REMARK = re.compile(
    rf"\s*(?:[,;(—]|\s[-–]{{1,2}}\s)\s*(?!(?:and|{_OPERATOR}|{_HEDGE})\b)(?=[A-Za-z]{{2}}|i\.e\.|e\.g\.)"
    rf"|\s+(?={_CONNECTIVE}\b)",
    re.I,
)
_HEDGE_WORD = re.compile(rf"\b{_HEDGE}\b", re.I)  # a remark offering an alternative: `8 (or 12)`
_OR = re.compile(r"\bor\b", re.I)
_NAME_IS = re.compile(r"(?<![A-Za-z])[A-Za-z](?:_\{?\w+\}?)?\s*=")
_CONNECTOR_DROP = re.compile(r"\\(?:text|mathrm|textbf)\s*\{|\\q?quad\b|\\[()\[\],;:! ]|\\\\|[{}$&]")


@dataclass(frozen=True)
class FinalAnswer:
    """text: the counted answer (raw, not normalized) or None; source: "box" | "hashes" | "phrase" |
    "segment" | "number" | "none"; declared: every declared answer after the last self-correction
    (boxes, `####` lines, plain-number phrase answers; at least `text`); hedged: the sentence of a
    phrase, closing-segment or last-number answer offers alternatives."""

    text: str | None
    source: str
    declared: tuple[str, ...] = ()
    hedged: bool = False


def final_answer(text: str, *, structured: bool = False, join: bool = False) -> FinalAnswer:
    """The final answer of a completion by the rules of this module's docstring."""
    text = within_turn(text)
    if "</think>" in text:  # reasoning, then the answer: what the answer part declares counts alone
        answer = final_answer(text[text.rfind("</think>") + 8 :], structured=structured, join=join)
        if answer.text is not None:
            return answer
    boxes = box_spans(text)
    hashes = []
    if "####" in text:
        hashes = [(m.start(), _stated(m.group(1).strip())) for m in _HASHES.finditer(text) if m.group(1).strip()]
    if boxes or hashes:
        revised = _revised_by_phrase(text, max([b[1] for b in boxes[-1:]] + [h[0] for h in hashes[-1:]]))
        if revised is not None:
            return revised
        if boxes:
            group = _box_group(text, boxes) if join else boxes[-1:]
            counted = group[0][2] if len(group) == 1 else ", ".join(b[2] for b in group)
            members = {b[2] for b in group} if len(group) > 1 else set()  # restated members agree
            others = [(b[0], b[2]) for b in boxes[: len(boxes) - len(group)] if b[2] not in members]
            items = [*others, *hashes, *_phrase_numbers(text, 0, len(text)), (group[0][0], counted)]
            return FinalAnswer(counted, "box", _declared(text, items, group[0][0]))
        items = [*_phrase_numbers(text, 0, len(text)), *hashes]
        return FinalAnswer(hashes[-1][1], "hashes", _declared(text, items, hashes[-1][0]))
    phrase, end = _phrase_answer(text)
    if phrase:
        items = [*_phrase_numbers(text, 0, end), (end, phrase)]
        return FinalAnswer(phrase, "phrase", _declared(text, items, end), _sentence_hedges(text, end))
    segment, at = _closing_segment(text)
    if segment is None and structured:
        segment, at = _last_segment(text)
    if segment:  # `$x = 3$ or $x = 4$.` hedges
        return FinalAnswer(segment, "segment", (segment,), _sentence_hedges(text, at))
    last = _last_number(text)
    if last is None:
        return FinalAnswer(None, "none")
    number = last.group(0).strip()
    return FinalAnswer(number, "number", (number,), _sentence_hedges(text, last.start()))


def _revised_by_phrase(text: str, after: int) -> FinalAnswer | None:
    """`\\boxed{17}. Wait, 6 * 3 = 18, so the answer is 18.`: an answer phrase after a self-correction
    that follows the last box or `####` line is the final answer."""
    if len(text) - after < 12:  # no room for a correction and a new answer: the common case
        return None
    cut = 0
    for m in _CORRECTION.finditer(text, after):
        cut = m.end()
    if not cut:
        return None
    phrase, end = _phrase_answer(text, cut)
    if not phrase:
        return None
    items = [*_phrase_numbers(text, cut, end), (end, phrase)]
    return FinalAnswer(phrase, "phrase", tuple(v for _, v in sorted(items)), _sentence_hedges(text, end))


def extract_answer(text: str) -> str | None:
    """The final answer of `text` as a raw string (not normalized), or None when there is none."""
    return final_answer(text).text


def all_boxed(text: str) -> list[str]:
    """Contents of the complete, non-empty boxes in order; of nested boxes only the innermost."""
    return [b[2] for b in box_spans(text)]


def box_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of the complete, non-empty boxes in order; of nested boxes the innermost."""
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
    for k, (start, end, begin) in enumerate(spans):
        # Slice only boxes that hold no other box: slicing every nested one would be quadratic.
        if end is not None and not (k + 1 < len(spans) and spans[k + 1][0] < end):
            content = text[begin:end].strip()
            if content:
                out.append((start, end + (text[end : end + 1] == "}"), content))
    return out


def _box_group(text: str, boxes: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """The last run of boxes joined only by connectors (`, `, ` and `, `\\quad \\text{and} \\quad`)."""
    k = len(boxes) - 1
    while k > 0 and _is_connector(text[boxes[k - 1][1] : boxes[k][0]]):
        k -= 1
    return boxes[k:]


def _is_connector(gap: str) -> bool:
    if len(gap) > 80:
        return False
    rest = _NAME_IS.sub(" ", _CONNECTOR_DROP.sub(" ", gap))  # `$ or $x = `: the name of the next value
    if re.search(r"[^A-Za-z\s,;.()]", rest):
        return False
    words = re.findall(r"[A-Za-z]+", rest)
    return not words or (("and" in words or "or" in words) and len(words) <= 5)


def _declared(text: str, items: list[tuple[int, str]], final_at: int) -> tuple[str, ...]:
    """The declared answers (position, value) in order, less those withdrawn by a self-correction
    before the final one at `final_at` (looked for only when they differ: the common case is one)."""
    if len(items) == 1:
        return (items[0][1],)
    items.sort()
    if len({v for _, v in items}) > 1:
        cut = 0
        for m in _CORRECTION.finditer(text, 0, final_at):
            cut = m.end()
        items = [(at, v) for at, v in items if at >= cut or at == final_at]
    return tuple(v for _, v in items)


def _phrase_numbers(text: str, start: int, stop: int) -> list[tuple[int, str]]:
    """(position, value) of the answer phrases in text[start:stop] stating a plain number."""
    out = []
    for m in _phrases(text, start, stop):
        if text[m.end() : m.end() + 1] not in _NUMBER_START:
            continue  # `the answer is \\boxed{...}`: no plain number, decided without a regex
        s = _SENTENCE.match(text, m.end(), min(len(text), m.end() + 40))
        region = s.group(0).strip().strip("$*").strip() if s else ""
        if _PLAIN_NUMBER.fullmatch(region):
            out.append((m.start(), region))
        elif (head := _value_head(region)) is not None:  # `20 cups, which ...` declares 20 cups
            out.append((m.start(), region[:head]))
    return out


def _phrases(text: str, start: int, stop: int):
    """The answer phrases starting in text[start:stop], in order."""
    lower = text.lower() if "NSWER" in text or "Answer" in text else text
    i = lower.find("answer", start, stop)
    while i >= 0:
        m = _PHRASE.match(text, i)
        if m is not None:
            yield m
        i = lower.find("answer", i + 6, stop)


def _last_number(text: str) -> re.Match | None:
    """The last NUMBER_TOKEN match, as a scan of the whole text finds it, scanning windows from the
    end (a long solution costs what its last sentence costs). A window starts just after a character
    no number token holds and no lookahead tests (`=`, `+`, `:`, `?`, `(`), so no match straddles it."""
    end = len(text)
    while end > 0:
        start = max(text.rfind(c, 0, max(0, end - 48)) for c in "=+:?(") + 1 if end > 48 else 0
        last = None
        for last in NUMBER_TOKEN.finditer(text, start, end):
            pass
        if last is not None:
            return last
        end = start - 1 if start > 0 else 0
    return None


def _phrase_answer(text: str, start: int = 0) -> tuple[str | None, int]:
    """(the answer after the last answer phrase from `start` on, where the phrase ends) or (None, 0)."""
    last = None
    for last in _phrases(text, start, len(text)):
        pass
    if last is None:
        return None, 0
    i = last.end()
    for opener, closer in _MATH_OPEN.items():
        if text.startswith(opener, i):
            j = text.find(closer, i + len(opener))
            segment = text[i + len(opener) : j].strip()
            if j > i + len(opener) and not _is_currency(opener, segment):
                return segment, i
            break
    m = _SENTENCE.match(text, i, min(len(text), i + 300))
    region = m.group(0).strip().rstrip("*").strip() if m else ""  # `**Answer: 540 meters**`
    return _value_before_remark(region) or _in_prose(region) or None, i


def _is_currency(opener: str, segment: str) -> bool:
    """`The answer is $18, which is 9 * $2.`: two dollar amounts in prose, not a math segment."""
    return opener == "$" and segment[:1].isdigit() and _PROSE.search(segment) is not None


def _stated(line: str) -> str:
    """A `####` line's answer: the value before a remark (`#### 8 (not 12)`), else the whole line."""
    return _value_before_remark(line) or line


def _value_head(region: str) -> int | None:
    """Where the value and its unit words end, when `region` is a value followed by a remark."""
    number = NUMBER_TOKEN.match(region)
    if number is None:
        return None
    end = _UNIT_WORDS.match(region, number.end()).end()
    return end if _REMARK.match(region, end) else None


def _value_before_remark(region: str) -> str | None:
    """`20 cups, which is one third of the 60 cups` -> `20 cups`, `8 (not 12)` -> `8`: the value an
    answer phrase states before remarking on it; None when the remark offers an alternative
    (`8, or maybe 12`, `8 (or 12)`) or the region is no value and remark."""
    head = _value_head(region)
    if head is None or _HEDGE_WORD.search(region, head):
        return None
    return region[:head]


def _in_prose(region: str) -> str:
    """A phrase answer that is a sentence (`The volume of $V$ is 120`) -> its last segment, or its
    number when it states only one (`between 70 and 75` states no single answer: kept whole)."""
    if not _PROSE.search(_MATH_SEGMENT.sub(" ", region)):
        return region
    seg = None
    for seg in _MATH_SEGMENT.finditer(region):
        pass
    numbers = list(NUMBER_TOKEN.finditer(region))
    if seg is not None and (not numbers or seg.end() >= numbers[-1].end()):
        return next(g for g in seg.groups() if g is not None).strip()
    values = {" ".join(m.group(0).split()) for m in numbers}
    return numbers[-1].group(0).strip() if len(values) == 1 else region


def _closing_segment(text: str) -> tuple[str | None, int]:
    """The last math segment when only punctuation follows it (`... so $x = \\frac13$.`)."""
    end = len(text.rstrip(" \t\n.,;:!"))
    if not (text.endswith("$", 0, end) or text.endswith("\\)", 0, end) or text.endswith("\\]", 0, end)):
        return None, 0  # the common case, decided without a scan
    seg = None
    for seg in _MATH_SEGMENT.finditer(text, 0, end):
        pass
    if seg is None or seg.end() != end:
        return None, 0
    return next(g for g in seg.groups() if g is not None).strip() or None, seg.start()


def _last_segment(text: str) -> tuple[str | None, int]:
    """The later of the last math segment and the last bracketed group holding a comma."""
    seg = grp = None
    for seg in _MATH_SEGMENT.finditer(text):
        pass
    for grp in _BRACKET_GROUP.finditer(text):
        pass
    if seg is not None and (grp is None or seg.end() >= grp.end()):
        return next(g for g in seg.groups() if g is not None).strip() or None, seg.start()
    return (grp.group(0), grp.start()) if grp is not None else (None, 0)


def _sentence_hedges(text: str, pos: int) -> bool:
    """The sentence around `pos` offers alternatives with different numbers: `it is 18 or 19`."""
    start = max(text.rfind(". ", 0, pos), text.rfind("\n", 0, pos)) + 1
    if text[start : start + 4].lstrip().lower().startswith("or ") and start > 1:  # `It is 18. Or 19.`
        start = max(text.rfind(". ", 0, start - 2), text.rfind("\n", 0, start - 2)) + 1
    end = _SENTENCE.match(text, pos).end()
    sentence = text[start:end]
    if not _OR.search(sentence):
        return False
    values = {" ".join(m.group(0).split()) for m in NUMBER_TOKEN.finditer(sentence)}
    return len(values) > 1
