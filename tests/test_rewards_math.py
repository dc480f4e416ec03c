"""`math_answer`: answer extraction, comparison by value, and the sympy time limit."""

import threading
import time
from fractions import Fraction

import pytest

from jaxrl_llm.rewards import get_reward_fn
from jaxrl_llm.rewards import math as math_reward
from jaxrl_llm.rewards.math import (
    extract_answer,
    math_answer,
    normalize_answer,
    parse_number,
    reference_answer,
    score_answer,
)

GSM8K_REFERENCE = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)

# (completion, reference, expected score). Grouped by what they exercise.
CASES = [
    # integers, decimals, 3.0 == 3
    (r"The answer is \boxed{72}.", "72", 1.0),
    (r"The answer is \boxed{72}.", "73", 0.0),
    (r"\boxed{3.0}", "3", 1.0),
    (r"\boxed{3.00}", "3", 1.0),
    (r"\boxed{3}", "3.5", 0.0),
    (r"\boxed{.5}", "1/2", 1.0),
    (r"\boxed{1e3}", "1000", 1.0),
    # thousands separators
    (r"\boxed{1,234}", "1234", 1.0),
    (r"\boxed{1,234,567}", "1234567", 1.0),
    (r"\boxed{1{,}000}", "1000", 1.0),
    (r"\boxed{1\,000}", "1000", 1.0),
    ("So she pays $1,234.50 in total.", "1234.5", 1.0),
    ("#### 1,000", "#### 1000", 1.0),
    # fractions, LaTeX fractions, mixed numbers; 1/2 == 0.5
    (r"The answer is \boxed{\frac{1}{2}}.", "0.5", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\tfrac{2}{4}}", "1/2", 1.0),
    (r"\boxed{\frac12}", "0.5", 1.0),
    (r"\boxed{\frac{3}{4}}", r"\frac{6}{8}", 1.0),
    (r"\boxed{1\frac{1}{2}}", "3/2", 1.0),
    ("The answer is 3/4.", "0.75", 1.0),
    (r"\boxed{0.3333}", "1/3", 1.0),  # 1/3 rounded to the places shown
    (r"\boxed{0.3334}", "1/3", 0.0),  # neither rounded nor truncated
    (r"\boxed{0.33}", "1/3", 0.0),  # too few significant digits to say which number is meant
    (r"\boxed{0.2499}", "1/4", 0.0),  # 1/4 has a finite expansion: only 0.25 is it
    # negative numbers
    (r"\boxed{-7}", "-7", 1.0),
    (r"\boxed{-7}", "7", 0.0),
    (r"\boxed{−3}", "-3", 1.0),  # unicode minus
    (r"\boxed{-\dfrac{3}{4}}", "-0.75", 1.0),
    ("The temperature dropped to -12 degrees.", "-12", 1.0),
    ("We compute 10-4 = 6", "6", 1.0),  # a binary minus is not a sign
    (r"\boxed{-0}", "0", 1.0),
    # percentages: x% matches x and x/100
    (r"\boxed{50\%}", "50", 1.0),
    (r"\boxed{50\%}", "0.5", 1.0),
    (r"\boxed{25%}", "0.5", 0.0),
    ("The discount is 20%.", "20", 1.0),
    # units, currency, degrees, `x =`
    (r"\boxed{5 \text{ cm}}", "5", 1.0),
    (r"\boxed{10\text{ km/h}}", "10", 1.0),
    (r"\boxed{18 \text{dollars}}", "18", 1.0),
    (r"\boxed{\$18.00}", "18", 1.0),
    (r"\boxed{30^\circ}", "30", 1.0),
    (r"\boxed{x = 5}", "5", 1.0),
    (r"\boxed{2x}", "2", 0.0),  # a glued letter is algebra, not a unit
    # multiple boxes, nesting, truncation, inline math
    (r"First \boxed{3}, but correcting: \boxed{4}", "4", 1.0),  # a self-correction: the last counts
    (r"First \boxed{3}, but correcting: \boxed{4}", "3", 0.0),
    (r"\boxed{\boxed{7}}", "7", 1.0),
    (r"So \boxed{5}. Then maybe \boxed{6", "5", 1.0),  # an unclosed last box falls back
    (r"\boxed 7", "7", 1.0),
    (r"The answer is \(\boxed{42}\)", "42", 1.0),
    # preference: box > #### > last number
    ("Reasoning gives 12 and 15.\n#### 13", "13", 1.0),
    (r"\boxed{13} and later 12 then 15", "13", 1.0),
    ("Add them: 2 + 3 = 5", "5", 1.0),
    ("She has 72 apples.\n#### 72", GSM8K_REFERENCE, 1.0),
    ("She has 71 apples.", GSM8K_REFERENCE, 0.0),
    # no answer
    ("I am not sure.", "5", 0.0),
    ("", "5", 0.0),
    (r"\boxed{}", "5", 0.0),
    # expressions through sympy
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"\boxed{\sqrt{2}/2}", r"\frac{1}{\sqrt{2}}", 1.0),
    (r"\boxed{0.7071067811865476}", r"\frac{\sqrt{2}}{2}", 1.0),
    (r"\boxed{2\pi}", r"2\pi", 1.0),
    (r"\boxed{2\pi}", "6.28", 0.0),
    (r"\boxed{\sqrt{8}}", r"2\sqrt{2}", 1.0),
    (r"\boxed{\sqrt[3]{8}}", "2", 1.0),
    (r"\boxed{3^2}", "9", 1.0),
    (r"\boxed{2 \cdot 3 + 1}", "7", 1.0),
    (r"\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
    (r"\boxed{2x+1}", "x^2", 0.0),
    # never evaluated: not a whitelisted expression
    (r"\boxed{__import__('os').system('true')}", "0", 0.0),
    # reference without a value: not applicable
    (r"\boxed{5}", "yes", 0.0),  # a text answer: read as text, not "no value"
    (r"\boxed{\text{Yes}}", "yes", 1.0),
    (r"\boxed{5}", "", None),
    (r"\boxed{5}", "x**", None),
]


@pytest.mark.parametrize("completion, reference, expected", CASES)
def test_answer_table(completion, reference, expected):
    assert score_answer(completion, reference) == expected


def test_table_is_large_and_covers_both_outcomes():
    assert len(CASES) >= 40
    assert {c[2] for c in CASES} == {0.0, 1.0, None}


# A chat end-of-turn marker (or any special token) closing the completion, and a hallucinated next
# turn after it: the answer is what the turn said before it. A marker never joins text around it.
CHAT_MARKERS = [
    ("The answer is 42.<|im_end|>", "42", 1.0),
    ("The answer is 42<|im_end|><|endoftext|><|endoftext|>", "42", 1.0),  # padding after the end
    ("The answer is 42.<|eot_id|>", "42", 1.0),
    ("The answer is 42.</s>", "42", 1.0),
    ("The answer is 42<end_of_turn>\n<eos>", "42", 1.0),
    ("The answer is 42.<|end|>", "42", 1.0),
    ("The answer is 42 <eos>", "42", 1.0),
    ("The answer is 42.<|end_of_solution|>", "42", 1.0),  # any trailing `<|...|>` token
    ("The answer is 42.<｜end▁of▁sentence｜>", "42", 1.0),
    ("<|im_start|>assistant\nThe answer is 42.<|im_end|>", "42", 1.0),  # a template's header first
    ("The answer is 41.<|im_end|>", "42", 0.0),
    ("The answer is 4<|im_end|>2", "42", 0.0),  # a marker inside a number joins nothing
    ("The answer is 4<|im_end|>2", "4", 0.0),
    (r"\boxed{4<|eot_id|>2}", "42", 0.0),
    (r"\boxed{4<|eot_id|>2}", "4", 0.0),
    ("The answer is 42 or 43.<|im_end|>", "42", 0.0),  # a hedge stays a hedge
    (r"\boxed{41} \boxed{42}<|im_end|>", "42", 0.0),
    (r"\boxed{41}<|im_end|>\boxed{42}", "42", 0.0),  # only the turn before the marker counts
    ("The answer is 42.<|im_end|>\n<|im_start|>user\nAnd 6 * 7 + 1?<|im_end|>\n<|im_start|>assistant\n"
     "The answer is 43.<|im_end|>", "42", 1.0),
    ("The answer is 42.<|im_end|>\n<|im_start|>user\nAnd 6 * 7 + 1?<|im_end|>\n<|im_start|>assistant\n"
     "The answer is 43.<|im_end|>", "43", 0.0),
    # What real completions that ran on into invented turns end with.
    (r"So $b = \boxed{\frac{5}{3}}$. Final Answer: The final answer is $\frac{5}{3}$. I hope it is correct. "
     r"<|im_start|>userYes, that is correct. <|im_start|>}userI have another problem. Solve $2^{4x} = 2^{32}$. "
     r"Solution: <|im_start|>assistantWe find $x = \boxed{8}$. Final Answer: The final answer is $8$. I hope it "
     r"is correct.", "$5/3$", 1.0),
    (r"So $b = \boxed{\frac{5}{3}}$. Final Answer: The final answer is $\frac{5}{3}$. I hope it is correct. "
     r"<|im_start|>userYes, that is correct. <|im_start|>}userI have another problem. Solve $2^{4x} = 2^{32}$. "
     r"Solution: <|im_start|>assistantWe find $x = \boxed{8}$. Final Answer: The final answer is $8$. I hope it "
     r"is correct.", "8", 0.0),
    ("$85 + (-67) + 12,\\!000,\\!003 + (-3) = 12,\\!000,\\!023$. Final Answer: The final answer is 12,000,023. "
     "I hope it is correct. <|im_start|>user", "12000023", 1.0),
    ("Therefore, there are 12 distinct arithmetic sequences that meet the three given conditions. I hope it is "
     "correct. <|im_start|>user", "$12$", 1.0),
]


@pytest.mark.parametrize("completion, reference, expected", CHAT_MARKERS)
def test_chat_markers_end_the_answer(completion, reference, expected):
    assert score_answer(completion, reference) == expected


def test_within_turn_cuts_at_the_first_marker_after_text():
    from jaxrl_llm.rewards.math.turns import within_turn

    header = "<|im_start|>assistant\n"
    assert within_turn(header + "It is 4.<|im_end|>\n<|im_start|>user\nAnd?") == header + "It is 4."
    assert within_turn("It is 4. <|end_of_solution|> <|endoftext|>\n") == "It is 4."
    assert within_turn("It is 4<|im_end|>2.") == "It is 4<|im_end|>2."  # inside a token: no turn ends there
    assert within_turn("It is <|im_end|>") == "It is"
    assert within_turn("no markers <b>4</b>") == "no markers <b>4</b>"


# An answer phrase stating a value, its unit, then a remark with other numbers: the value is the
# answer. A remark offering an alternative, a list, or a number that is an operand is not.
VALUE_THEN_REMARK = [
    ("The answer is 20 cups, which is one third of the 60 cups ...", "20", 1.0),
    ("The answer is 20 cups, which is one third of the 60 cups ...", "60", 0.0),
    ("The answer is 21 cups, one third of 63", "20", 0.0),
    ("The answer is 21 cups, one third of 63", "63", 0.0),
    ("The answer is 72 clips, since 48 + 24 = 72.", "72", 1.0),
    ("The answer is 12 because 3 * 4 = 12.", "12", 1.0),
    ("The answer is 72 clips - she sold 48 in April and 24 in May.", "72", 1.0),
    ("The answer is $18, which is 9 * $2.", "18", 1.0),  # dollar amounts, not a math segment
    ("The answer is $18, which is 9 * $2.", "2", 0.0),
    ("Answer: 8 (not 12).", "8", 1.0),
    ("Answer: 12 (not 8).", "8", 0.0),
    ("**Answer:** 540 meters (the distance he runs in a week)", "540", 1.0),
    ("#### 8 (not 12)", "8", 1.0),
    ("The answer is 8 or 12", "8", 0.0),
    ("The answer is 8, 12, 16, 20.", "8", 0.0),
    ("The answer is 8 (or 12).", "8", 0.0),
    ("The answer is 8, or maybe 12.", "8", 0.0),
    ("The answer is 8, but it could be 12.", "8", 0.0),
    ("The answer is 8, and the other root is 12.", "8", 0.0),
    ("The answer is 8; if not, 12.", "8", 0.0),
    ("The answer is 8, depending on the reading; 12 in the other.", "8", 0.0),
    ("Answer: 8 (not 12). Answer: 12 (not 8).", "8", 0.0),
    ("Answer: 8 (not 12). Answer: 12 (not 8).", "12", 0.0),
    ("The answer is 18 (not 19). Then the answer is 19.", "19", 0.0),
    ("#### 8 (or 12)", "8", 0.0),
    ("The answer is 12 divided by 4, which is 3.", "12", 0.0),  # an operand is no answer
    ("The answer is 6 squared, which is 36.", "6", 0.0),
    (r"The answer is 2\sqrt{3}, which is about 3.46.", "2", 0.0),
    ("The answer is 2 (3 + 4), which is 14.", "2", 0.0),
]


@pytest.mark.parametrize("completion, reference, expected", VALUE_THEN_REMARK)
def test_value_stated_before_a_remark(completion, reference, expected):
    assert score_answer(completion, reference) == expected


# `\log_b x`, `\log_{b} x`, `\ln x`, `\log x` (base 10) evaluated, on either side.
LOGARITHMS = [
    (r"\boxed{\log_2 8}", "3", 1.0),
    (r"\boxed{\log_2 16}", "3", 0.0),
    (r"\boxed{\log_{2} 8}", "3", 1.0),
    (r"\boxed{\log_2(8)}", "3", 1.0),
    (r"\boxed{\log_3 8}", "3", 0.0),
    (r"\boxed{\log 1000}", "3", 1.0),
    (r"\boxed{\ln 8}", "3", 0.0),
    (r"\boxed{\log_{10} 40 + \log_{10} 25}", "3", 1.0),
    (r"\boxed{\log_2 \frac{1}{8}}", "-3", 1.0),
    (r"\boxed{\log_2 2^{10}}", "10", 1.0),
    (r"\boxed{\log_4 2}", r"\frac{1}{2}", 1.0),
    (r"\boxed{2\log_2 3}", r"\log_2 9", 1.0),
    (r"\boxed{\log_2 10}", r"\log_2 9", 0.0),
    (r"\boxed{3}", r"\log_2 8", 1.0),
    (r"\boxed{4}", r"\log_2 8", 0.0),
    (r"\boxed{\log_2 8 \text{ or } \log_2 16}", "3", 0.0),
    (r"\boxed{\log_2 8} \boxed{\log_2 16}", "4", 0.0),
    (r"\boxed{\log_{2} x}", r"\frac{\ln x}{\ln 2}", 1.0),
    (r"\boxed{\log_{11} x}", r"\frac{\ln x}{\ln 11}", 1.0),
    (r"\boxed{\log_{a^2} x}", r"\frac{\ln x}{\ln a^2}", 1.0),
    (r"\boxed{\log x}", r"\frac{\ln x}{\ln 10}", 1.0),
    (r"\boxed{\ln x}", r"\log x", 0.0),
    (r"\boxed{\ln\left(x-1\right)}", r"\ln(x-1)", 1.0),
    (r"\boxed{\log_2 x}", r"\log_3 x", 0.0),
]


@pytest.mark.parametrize("completion, reference, expected", LOGARITHMS)
def test_logarithms_are_evaluated(completion, reference, expected):
    assert score_answer(completion, reference) == expected


def test_a_function_keeps_its_argument_from_the_unit_stripper():
    assert normalize_answer(r"\log_{2} x") == r"\log_{2} x"
    assert normalize_answer(r"\sin^2 x") == r"\sin^2 x"
    assert normalize_answer(r"\log_2 8 \text{ bits}") == r"\log_2 8"


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"a \boxed{1} b \boxed{\frac{a}{\sqrt{b}}} c", r"\frac{a}{\sqrt{b}}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces do not close the box
        ("text\n#### 42\nmore 7", "42"),
        ("#### \n8 apples", "8"),  # an empty #### falls back to the last number
        ("the values 1, 2 and 3", "3"),
        ("costs $5 or -$6", "-$6"),
        ("version v1.5 only", None),
        ("no digits", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_normalize_and_parse_number():
    assert normalize_answer(r"x = \$1,234.50 \text{ dollars}") == "1234.50"
    assert normalize_answer(r"\left( 3 \right)") == "( 3 )"
    assert parse_number("1234.50") == (Fraction(2469, 2), False)
    assert parse_number(r"-\frac{3}{4}") == (Fraction(-3, 4), False)
    assert parse_number("12.5%") == (Fraction(25, 2), True)
    assert parse_number(r"2\frac{1}{3}") == (Fraction(7, 3), False)
    assert parse_number("1/0") is None
    assert parse_number("9" * 5000) is None  # beyond int's digit limit: not a crash
    assert reference_answer(GSM8K_REFERENCE) == "72"
    assert reference_answer(r"\frac{1}{2}") == r"\frac{1}{2}"
    assert reference_answer("The answer is 5") == "5"


def test_math_answer_reward_columns():
    completions = [r"\boxed{4}", r"\boxed{4}", "no idea", r"\boxed{0.25}"]
    scores = math_answer(["q"] * 4, completions, answer=["4", 5, "#### 4", None], truncated=[False] * 4)
    assert scores == [1.0, 0.0, 0.0, None]
    assert math_answer(["q"], [r"\boxed{2.5}"], answer=[2.5]) == [1.0]
    with pytest.raises(ValueError, match="needs the column 'answer' with 2 references"):
        math_answer(["q"] * 2, ["a", "b"], answer=["1"])
    with pytest.raises(ValueError, match="references must be strings or numbers, got list"):
        math_answer(["q"], ["a"], answer=[["1"]])
    name, fn = get_reward_fn("math_answer", sympy_timeout=1.5)
    assert name == "math_answer" and fn(["q"], [r"\boxed{\sqrt{4}}"], answer=["2"]) == [1.0]


@pytest.mark.parametrize(
    "completion",
    [
        "\\boxed{" * 20000,  # a repetition loop of unclosed boxes
        "\\boxed{\\frac{" * 10000 + "1}{2}" + "}" * 20000,  # deep nesting
        "\\boxed{" + "9" * 100000 + "}",  # a runaway box
        "x = " * 20000 + "5 cm " * 20000,
        "\\boxed{1}" * 20000,  # many declared answers: agreement is checked in one pass
        "#### 5\n" * 20000,
        "The answer is " * 20000,
        "1 or " * 20000,
        "<|im_end|>" * 20000,  # markers with no text before them: nothing to cut at
        "8" + "<|end_of_solution|>" * 20000,  # trailing special tokens, dropped one by one
        "The answer is 5 cups, which " * 20000,
        "Answer: 5 (not " * 20000,
    ],
)
def test_degenerate_completions_stay_fast(completion):
    """Each case takes 0.003-0.2 s of CPU when the scans are linear; a quadratic scan of these 100-200 KB
    strings would take minutes. CPU time of this thread (where the scans run), after a warm-up call, so that
    a loaded host, a first call's imports or work still running in the worker's other threads cannot fail
    the test (a wall-clock bound of 1 s did on CI, and so did this process's CPU time: 2.1 s once). On a
    loaded CI host the 20,000 declared boxes took 2.2 s of this thread's CPU once: the bound, 10 s, still
    sits far below a quadratic scan's minutes."""
    assert score_answer(r"\boxed{7}", "7") == 1.0
    start = time.thread_time()
    assert score_answer(completion, "7") == 0.0
    assert time.thread_time() - start < 10.0


def test_sympy_time_limit_really_stops_a_runaway_comparison():
    assert score_answer(r"\boxed{\sqrt{9}}", "3") == 1.0  # the worker is up: start-up not timed below
    limit = 0.5
    start = time.perf_counter()
    assert score_answer(r"\boxed{9^{9^{9^{9}}}}", "5", timeout=limit) == 0.0
    elapsed = time.perf_counter() - start
    assert limit <= elapsed < limit + 3.0, elapsed  # measured overshoot: ~10 ms; slack for a loaded host
    assert math_reward._WORKER._proc is None  # killed, not left running
    assert score_answer(r"\boxed{\sqrt{16}}", "4") == 1.0  # and restarted on demand


def test_concurrent_callers_share_the_worker_safely():
    results = {}

    def work(k):
        results[k] = [score_answer(rf"\boxed{{\sqrt{{{k * k}}}}}", str(k)) for _ in range(3)]

    threads = [threading.Thread(target=work, args=(k,)) for k in (2, 3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {2: [1.0] * 3, 3: [1.0] * 3, 4: [1.0] * 3}


def test_last_number_scanned_from_the_end_is_the_last_of_a_whole_scan():
    # The windowed scan must find exactly what a scan of the whole text finds, on any text.
    import random

    from jaxrl_llm.rewards.math.extraction import NUMBER_TOKEN, _last_number

    rng = random.Random(0)
    pieces = ["1", "2", " ", "=", "+", "(", ")", "-", ".", ",", "$", r"\frac{1}{2}", "a", "b", "/", "%", "\n",
              ":", "?", "1 000", r"\times 10^{3}", "−", "2,74", "[", "]", "{,}", r"\!"]  # fmt: skip
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 150)))
        whole = list(NUMBER_TOKEN.finditer(text))
        last = _last_number(text)
        assert (whole[-1].span() if whole else None) == (last.span() if last else None), text


def test_rounds_to_agrees_with_decimal_rounding():
    # Independent reference: the decimal module's half-up rounding of p/q to d places.
    import random
    from decimal import ROUND_HALF_UP, Decimal, localcontext

    from jaxrl_llm.rewards.math.numeric import rounds_to

    rng = random.Random(0)
    for _ in range(2000):
        value = Fraction(rng.randint(-10**6, 10**6), rng.choice([3, 7, 12, 13, 30, 99]))
        places = rng.randint(2, 9)
        with localcontext() as ctx:
            ctx.prec = 50
            exact = Decimal(value.numerator) / Decimal(value.denominator)
            shown = exact.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
        text = f"{shown:f}"
        if value.denominator % 3 and value.denominator % 7 and value.denominator % 13:
            continue  # a finite decimal expansion: never a rounding (checked below)
        enough = len(text.lstrip("-0.").replace(".", "")) >= 3
        assert rounds_to(text, value) == enough, (text, value)
        wrong = f"{shown + Decimal(1).scaleb(-places) * rng.choice([-2, 2]):f}"
        assert not rounds_to(wrong, value), (wrong, value)
    assert not rounds_to("0.25", Fraction(1, 4)) and not rounds_to("0.2499", Fraction(1, 4))
