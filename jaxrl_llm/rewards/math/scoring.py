"""Judging one (completion, reference) pair: the reference's kind decides the path.

- A plain-number reference (`72`, `\\frac{1}{2}`, `12.5%`) takes the fast path: exact rationals in
  Python, sympy only when the completion's answer is an expression (`\\sqrt{4}`). No second judge.
- A scalar expression (`\\frac{\\sqrt{3}}{2}`, `2x+1`) is compared by sympy in the worker.
- A structure (set, interval, tuple, matrix, system, equation, inequality, choice, text) is compared
  as that structure, element by element (`structures`).
- Anything else has no verdict of ours (None): math-verify's verdict is used, or None.
For every non-numeric reference math-verify judges too (in the worker); `Verdict` keeps both.

A hedged answer scores 0 on every path and is not shown to math-verify: declared answers (boxes,
`####` lines, plain numbers after answer phrases, less those withdrawn by a self-correction) with
different values, alternatives `A or B` with different values (against a reference of several
values they are the list), or a phrase, segment or last-number answer whose sentence offers
alternatives. An answer written as the reference is (after cleaning) is equal on every path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from jaxrl_llm.rewards.math.braces import balanced, top_level_split
from jaxrl_llm.rewards.math.expressions import to_sympy_source
from jaxrl_llm.rewards.math.extraction import FinalAnswer, final_answer
from jaxrl_llm.rewards.math.numeric import (
    candidates,
    clean_answer,
    normalize_answer,
    numbers_equal,
    parse_number,
    rounds_to,
    strip_label,
)
from jaxrl_llm.rewards.math.structures import (
    Structure,
    choice_letter,
    infinity_sign,
    parse_structure,
    structures_equal,
    system_order,
)
from jaxrl_llm.rewards.math.worker import WORKER

DEFAULT_SYMPY_TIMEOUT = 2.0  # seconds per worker request; the worker's start-up is not counted
_ALTERNATIVES = (" or ", "\\text{or}", "\\lor", "\\vee")
_MATHLIKE = re.compile(r"[\d\\^_=+*/<>]")


@dataclass(frozen=True)
class Verdict:
    """score: what the reward pays (1.0 / 0.0 / None = not applicable); ours: the structural judge's
    verdict; second: math-verify's (None when it was not consulted or could not read the reference)."""

    score: float | None
    ours: float | None = None
    second: float | None = None


def reference_answer(reference: str) -> str | None:
    """The reference's answer string: boxed (several boxes joined by `and` or commas are one list)
    > `####` > an answer phrase > the whole string."""
    if "\\" in reference or "####" in reference or "nswer" in reference:
        answer = final_answer(reference, join=True)
        if answer.source in ("box", "hashes", "phrase"):
            return answer.text
    whole = reference.strip()
    return whole or None


def judge(completion: str, reference: str, *, timeout: float = DEFAULT_SYMPY_TIMEOUT,
          second_judge: bool = True) -> Verdict:  # fmt: skip
    """Both judges' verdicts on one row (see the module docstring)."""
    ref_raw = reference_answer(reference)
    if ref_raw is None:
        return Verdict(None)
    ref = normalize_answer(ref_raw, lhs="symbol")
    ref_num = parse_number(ref)
    if ref_num is not None:
        return Verdict(_score_numeric(final_answer(completion), ref, ref_num, timeout))
    letter = choice_letter(clean_answer(ref_raw))  # `A` is a choice, not the symbol A
    ref_src = to_sympy_source(ref) if letter is None else None
    structure = parse_structure(strip_label(clean_answer(ref_raw))) if ref_src is None else None
    if structure is not None and structure.kind == "text" and " " in structure.items[0] and "\\" not in ref_raw:
        structure = None  # a sentence is not an answer; a text answer is one word or wrapped (`\text{}`)
    several = structure is not None and structure.kind in ("set", "list", "system")
    answer = final_answer(completion, structured=structure is not None, join=several)
    # Against several values `x = 2 or x = 3` states them all; against one value it hedges.
    listed = several or _has_alternatives(ref_raw)
    if _hedged(answer, alternatives=not listed):
        return Verdict(0.0, 0.0)
    text = answer.text if listed else _first_alternative(answer.text)
    if several and text is not None and _has_alternatives(clean_answer(text)):
        text = ", ".join(p.strip() for p in top_level_split(clean_answer(text), _ALTERNATIVES))
    if ref_src is None and structure is None and not _MATHLIKE.search(ref_raw):
        return Verdict(None)  # words, not math: math-verify would read `no value` as a product n*o*v*...
    if text is not None and _same_text(text, ref_raw):
        ours = 1.0  # written the same way: equal, whatever notation neither judge can read
    elif ref_src is not None:
        ours = _score_expression(text, ref_src, timeout)
    elif structure is not None:
        ours = _score_structure(text, structure, system_order(clean_answer(ref_raw)), timeout)
    else:
        ours = None
    second = _math_verify(text, ref_raw, timeout) if second_judge else None
    return Verdict(ours if ours is not None else second, ours, second)


def score_answer(completion: str, reference: str, *, timeout: float = DEFAULT_SYMPY_TIMEOUT) -> float | None:
    """1.0 if the completion's final answer equals the reference, else 0.0; None when the reference
    has no answer either judge can read (the row is then "not applicable")."""
    return judge(completion, reference, timeout=timeout).score


# ----------------------------------------------------------------------------- hedging


def _value_key(raw: str):
    s = normalize_answer(raw)
    number = parse_number(s)
    return number[0] if number is not None else "".join(s.split())


def _has_alternatives(raw: str) -> bool:
    return len(top_level_split(raw, _ALTERNATIVES)) > 1


def _first_alternative(text: str | None) -> str | None:
    """`18 or 18` -> `18`: alternatives that agree (checked by `_hedged`) are one answer."""
    if text is None or not _has_alternatives(text):
        return text
    return top_level_split(text, _ALTERNATIVES)[0].strip()


def _hedged(answer: FinalAnswer, *, alternatives: bool = True) -> bool:
    """Several declared answers that differ, `A or B` with A != B, or a hedging last sentence."""
    if answer.hedged:
        return True
    if len(answer.declared) > 1:
        first = _value_key(answer.declared[-1])
        if any(_value_key(d) != first for d in answer.declared[:-1]):  # stops at the first difference
            return True
    if alternatives and answer.text is not None and _has_alternatives(answer.text):
        return len({_value_key(p) for p in top_level_split(answer.text, _ALTERNATIVES) if p.strip()}) > 1
    return False


# ----------------------------------------------------------------------------- the three paths


def _same_text(text: str, ref_raw: str) -> bool:
    """Equal after normalizing, and the reference is no broken fragment (`x**`, `\\frac{`)."""
    a, b = ("".join(normalize_answer(x, lhs="symbol").split()) for x in (text, ref_raw))
    return bool(a) and a == b and b[-1] not in "+-*/^=_\\" and balanced(b)


def _numbers_match(a: str, a_num: tuple[Fraction, bool], b: str, b_num: tuple[Fraction, bool]) -> bool:
    """Exactly equal, or one side a decimal that rounds the other (`0.0833` for `\\frac{1}{12}`)."""
    if numbers_equal(a_num, b_num):
        return True
    if a_num[1] or b_num[1] or not ("." in a or "." in b):
        return False
    return rounds_to(a, b_num[0]) or rounds_to(b, a_num[0])


def _score_numeric(answer: FinalAnswer, ref: str, ref_num: tuple[Fraction, bool], timeout: float) -> float:
    if answer.text is None or _hedged(answer):
        return 0.0
    cand = normalize_answer(_first_alternative(answer.text))
    cand_num = parse_number(cand) if cand else None
    if cand_num is not None:
        return float(_numbers_match(cand, cand_num, ref, ref_num))
    cand_src = to_sympy_source(cand) if cand else None
    if cand_src is None:
        return 0.0
    reply = WORKER.compare(cand_src, [_rational_source(v) for v in candidates(ref_num)], timeout)
    return 0.0 if reply is None else float(reply["equal"])  # out of time: unverifiable earns nothing


def _score_expression(text: str | None, ref_src: str, timeout: float) -> float | None:
    cand = normalize_answer(text) if text is not None else ""
    cand_num = parse_number(cand) if cand else None
    if cand_num is not None:
        sources = [_rational_source(v) for v in candidates(cand_num)]
    else:
        src = to_sympy_source(cand) if cand else None
        if src is None:
            return 0.0
        sources = [src]
    for source in sources:
        reply = WORKER.compare(source, [ref_src], timeout)
        if reply is None:
            return 0.0
        if not reply["ref_ok"]:
            return None
        if reply["equal"]:
            return 1.0
    return 0.0


def _score_structure(text: str | None, ref: Structure, order: tuple[str, ...], timeout: float) -> float:
    if text is None:
        return 0.0
    # `(a, b) = (1, 2)`: the value comes last, except where the reference itself has `=` in it.
    lists = ref.kind in ("set", "list", "system", "tuple", "interval", "ratio")
    cleaned = clean_answer(text) if ref.kind in ("relation", "system") else normalize_answer(text, lists=lists)
    cand = parse_structure(cleaned)
    if cand is None:
        return 0.0
    if ref.kind == "relation":
        return float(cand.kind == "relation" and _relations_equal(cand, ref, timeout))
    return float(structures_equal(cand, ref, lambda pairs: _elements_equal(pairs, timeout), order))


def _relations_equal(cand: Structure, ref: Structure, timeout: float) -> bool:
    """Equations equal up to a nonzero factor; inequalities (`<`, `<=`) up to a positive one."""
    if cand.items[0] != ref.items[0]:
        return False
    sources = [_difference_source(s.items[1], s.items[2]) for s in (cand, ref)]
    if None in sources:
        return False
    reply = WORKER.request({"op": "ratio", "candidate": sources[0], "reference": sources[1]}, timeout)
    if reply is None:
        return False
    return reply["ratio"] == "pos" or (reply["ratio"] == "neg" and ref.items[0] in ("=", "!="))


def _difference_source(lhs: str, rhs: str) -> str | None:
    a, b = (to_sympy_source(normalize_answer(x, lhs="symbol")) for x in (lhs, rhs))
    return None if a is None or b is None else f"({a})-({b})"


def _elements_equal(pairs: Sequence[tuple[str, str]], timeout: float) -> list[bool]:
    """Element equality: exact numbers and infinities in Python, anything else in one worker request."""
    out: list[bool | None] = []
    symbolic: list[tuple[int, str, str]] = []
    for i, (c, r) in enumerate(pairs):
        cn, rn = normalize_answer(c, lhs="symbol"), normalize_answer(r, lhs="symbol")
        c_inf, r_inf = infinity_sign(cn), infinity_sign(rn)
        c_num, r_num = parse_number(cn), parse_number(rn)
        if c_inf or r_inf:
            out.append(c_inf == r_inf)
        elif c_num is not None and r_num is not None:
            out.append(_numbers_match(cn, c_num, rn, r_num))
        elif "".join(cn.split()) == "".join(rn.split()):
            out.append(True)
        elif cn[:1] in "([" and rn[:1] in "([" and c_num is None and r_num is None:
            out.append(_nested_equal(cn, rn, timeout))  # a set of tuples: each tuple as a structure
        else:
            c_src = _rational_source(c_num[0]) if c_num else to_sympy_source(cn)
            r_src = _rational_source(r_num[0]) if r_num else to_sympy_source(rn)
            out.append(False if c_src is None or r_src is None else None)
            if c_src is not None and r_src is not None:
                symbolic.append((i, c_src, r_src))
    if symbolic:
        reply = WORKER.request({"op": "pairs", "pairs": [[c, r] for _, c, r in symbolic]}, timeout)
        equal = reply.get("equal") if reply else None
        for k, (i, _, _) in enumerate(symbolic):
            out[i] = bool(isinstance(equal, list) and equal[k])
    return [bool(x) for x in out]


def _nested_equal(cand: str, ref: str, timeout: float) -> bool:
    c, r = parse_structure(cand), parse_structure(ref)
    if c is None or r is None or c.kind not in _NESTED or r.kind not in _NESTED:
        return False
    return structures_equal(c, r, lambda pairs: _elements_equal(pairs, timeout))


_NESTED = ("tuple", "interval", "list")


def _math_verify(text: str | None, ref_raw: str, timeout: float) -> float | None:
    if text is None:
        return 0.0
    reply = WORKER.request({"op": "mv", "gold": f"${ref_raw}$", "pred": f"${text}$"}, timeout)
    if reply is None:
        return 0.0  # out of time: unverifiable earns nothing
    return float(reply["equal"]) if reply.get("gold_ok") else None


def _rational_source(value: Fraction) -> str:
    return f"({value.numerator})/({value.denominator})"
