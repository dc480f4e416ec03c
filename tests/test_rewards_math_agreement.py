"""`math_answer` against two case sets it was not written from: Math-Verify's own test suite
(tests/data/math_verify_cases.json) and what real solutions and reward hackers write
(tests/data/math_solution_cases.py). Agreement >= 95% and no false positive on each."""

import importlib.util
import json
import os
from collections import Counter, defaultdict

import pytest

from jaxrl_llm.rewards import get_reward_fn

DATA = os.path.join(os.path.dirname(__file__), "data")
_SPEC = importlib.util.spec_from_file_location("math_solution_cases", os.path.join(DATA, "math_solution_cases.py"))
solution_cases = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(solution_cases)


def _math_verify_cases():
    with open(os.path.join(DATA, "math_verify_cases.json"), encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    # A rejected expectation contradicts the mathematics: the corrected one is held instead.
    return [(c["test"].split("::")[1], c["completion"], c["reference"], c.get("corrected", c["expected"]))
            for c in cases]  # fmt: skip


def _table(cases):
    """(category, completion, reference, expected) -> per-category counts and the misses."""
    _, fn = get_reward_fn("math_answer")
    scores = fn(["q"] * len(cases), [c[1] for c in cases], answer=[c[2] for c in cases])
    stats = defaultdict(Counter)
    misses = []
    for (category, completion, reference, expected), got in zip(cases, scores):
        got = 0.0 if got is None else got  # the trainer pays a not-applicable row nothing
        row = stats[category]
        row["n"] += 1
        row["agree"] += got == expected
        row["fp"] += got == 1.0 and expected != 1.0
        if got != expected:
            misses.append(f"  {category}: {completion[-80:]!r} vs {reference[-60:]!r}: expected {expected}, got {got}")
    lines = [f"{k:40s} {v['agree']:4d}/{v['n']:<4d} false positives {v['fp']}" for k, v in stats.items()]
    return stats, "\n".join(lines + ["misses:"] + misses)


@pytest.mark.parametrize("name", ["math_verify", "solutions"])
def test_agreement_at_least_95_percent_and_no_false_positive(name):
    cases = _math_verify_cases() if name == "math_verify" else solution_cases.CASES
    stats, table = _table(cases)
    n = sum(s["n"] for s in stats.values())
    agree = sum(s["agree"] for s in stats.values())
    false_positives = sum(s["fp"] for s in stats.values())
    assert false_positives == 0 and agree >= 0.95 * n, f"{name}: {agree}/{n} agree\n{table}"


def test_case_sets_are_what_they_claim():
    mv = json.load(open(os.path.join(DATA, "math_verify_cases.json"), encoding="utf-8"))["cases"]
    assert len(mv) >= 250 and len({c["test"].split("::")[0] for c in mv}) >= 6
    rejected = [c for c in mv if "rejected" in c]
    assert rejected and all(c["corrected"] != c["expected"] and c["rejected"] for c in rejected)
    assert len(rejected) <= 0.05 * len(mv)  # the suite's expectations are kept, not rewritten
    for name, cases in solution_cases.CATEGORIES.items():
        outcomes = {c[2] for c in cases}
        assert outcomes == {0.0} if name == "probes" else outcomes == {0.0, 1.0}, name
