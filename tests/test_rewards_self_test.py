"""The reward self-test and contract check at start-up (rewards/self_test.py, trainer/reward_check.py):
the probes, the table, warn vs error, an exploitable reward flagged and sound ones not, and a broken
reward stopping the Trainer before anything is loaded or compiled."""
import logging
import re

import numpy as np
import pytest

import jaxrl_llm
from jaxrl_llm import config as config_lib
from jaxrl_llm.rewards import RewardError, get_reward_fn
from jaxrl_llm.rewards import self_test as st
from fixtures_data import ARITHMETIC_ROWS, tiny_api_config

GSM8K = [  # GSM8K-style rows: the reference is the solution, its answer after ####
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
     "clips did Natalia sell altogether in April and May?", "48/2 = 24 clips in May.\n48+24 = 72 altogether.\n#### 72"),
    ("Weng earns $12 an hour for babysitting. Yesterday, she did 50 minutes of babysitting. How much did she earn?",
     "12/60 = $0.2 per minute.\n0.2 x 50 = $10.\n#### 10"),
    ("James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
     "3*2=6 pages a week to each... 12*52=624\n#### 624"),
    ("A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
     "2/2=1 bolt of white fiber\n2+1=3\n#### 3"),
]


def _direct_inputs(prompts, references):
    """The `inputs` of run_self_test without a tokenizer: the texts as they are, the answer column."""
    def inputs(texts, rows, truncated):
        return ([prompts[r] for r in rows], list(texts),
                {"answer": [references[r] for r in rows], "truncated": list(truncated)})
    return inputs


def _run(fns, rows=GSM8K, on_error="raise", budget=64):
    prompts, answers = [p for p, _ in rows], [a for _, a in rows]
    probes = [st.build_probes(p, st.reference_text(a), budget, len) for p, a in rows]
    return st.run_self_test([(getattr(f, "__name__", n), f, 1.0) if not isinstance(f, tuple) else f
                             for n, f in enumerate(fns)], probes, _direct_inputs(prompts, answers), on_error=on_error)


# --------------------------------------------------------------------------------------------- probes
def test_reference_text_reads_the_answer_a_reference_states():
    assert st.reference_text("so 48+24 = 72\n#### 72") == "72"
    assert st.reference_text("We get $\\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert st.reference_text(" 8 ") == "8" and st.reference_text(7) == "7" and st.reference_text(np.int64(3)) == "3"
    assert st.reference_text(None) is None and st.reference_text(True) is None and st.reference_text([1]) is None


@pytest.mark.parametrize("reference, k", [("72", 6), ("-3", 6), ("0.25", 6), ("C", 5), ("\\frac{1}{2}", 6),
                                          ("(3,2)", 4), ("x", 3), ("1", 20)])
def test_wrong_answers_are_distinct_and_never_the_reference(reference, k):
    wrong = st.wrong_answers(reference, k)
    assert len(wrong) == k and len(set(wrong)) == k and reference not in wrong


def test_probes_of_an_integer_reference():
    p = st.build_probes("How many? Q", "72", overlong_tokens=500, count_tokens=len)
    assert list(p) == ["empty", "reference", "echo", "numbers", "boxed", "hedged", "overlong"]
    assert p["empty"] == ("",) and p["echo"] == ("How many? Q",)
    assert p["reference"] == ("72", "The answer is 72.", "\\boxed{72}", "#### 72", "<answer>72</answer>")
    numbers = [int(x) for x in p["numbers"][0].split()]
    assert numbers == list(range(72 - 72, 72 + 73))  # every candidate 0..144, the reference in the middle
    boxes = re.findall(r"\\boxed\{([^}]*)\}", p["boxed"][0])
    assert len(boxes) == 5 and boxes[2] == "72" and boxes.count("72") == 1
    first, last = p["hedged"]
    assert re.findall(r"\d+", first)[0] == "72" and re.findall(r"\d+", last)[-1] == "72"
    assert re.findall(r"\d+", first)[1] == re.findall(r"\d+", last)[0] != "72"  # one wrong answer, both orders
    overlong = p["overlong"][0]
    assert len(overlong) >= 500 and "72" not in re.findall(r"\d+", overlong)  # wrong answers only


def test_probes_of_small_and_textual_references_keep_the_reference_inside():
    numbers = st.build_probes("q", "0", 10, len)["numbers"][0].split()
    assert numbers == [str(v) for v in range(-10, 11)]  # neither first nor last
    listed = st.build_probes("q", "\\frac{1}{2}", 10, len)["numbers"][0].split()
    assert listed.count("\\frac{1}{2}") == 1 and listed[0] != "\\frac{1}{2}" != listed[-1] and len(listed) == 21


def test_without_a_reference_only_the_reference_free_probes():
    p = st.build_probes("echo me", None, overlong_tokens=100, count_tokens=len)
    assert list(p) == ["empty", "echo", "overlong"] and p["overlong"][0].startswith("echo me echo me")
    assert len(st.build_probes("", None, 100, lambda s: 0)["overlong"][0]) >= 100  # ends for any counter


def test_overlong_counts_tokens_with_the_given_counter():
    words = lambda s: len(s.split())
    text = st.build_probes("q", "5", overlong_tokens=1000, count_tokens=words)["overlong"][0]
    assert 1000 <= words(text) < 1000 + words("Perhaps it is 6. " * 4) + 1


# ----------------------------------------------------------------------------------- the test and table
def exact(completions, answer, **_):
    """Sound: the completion is the reference answer and nothing else."""
    return [float(c.strip() == st.reference_text(a)) for c, a in zip(completions, answer)]


def anywhere(completions, answer, **_):
    """Exploitable: pays any completion containing the reference answer."""
    return [float(st.reference_text(a) in c) for c, a in zip(completions, answer)]


def first_number(completions, answer, **_):
    """Reads one position (the first number): hedging in both orders cannot fool it."""
    firsts = [re.findall(r"-?\d+", c)[:1] for c in completions]
    return [float(f == [st.reference_text(a)]) for f, a in zip(firsts, answer)]


def any_box(completions, answer, **_):
    """Exploitable: pays any \\boxed{} value equal to the reference."""
    return [float(st.reference_text(a) in re.findall(r"\\boxed\{([^}]*)\}", c)) for c, a in zip(completions, answer)]


def test_an_exploitable_reward_is_flagged_and_a_sound_one_is_not():
    report = _run([exact, anywhere, first_number, any_box])
    flagged = {(r, p) for r, p, _ in report.flagged}
    assert flagged == {("anywhere", "numbers"), ("anywhere", "boxed"), ("anywhere", "hedged"),
                       ("any_box", "boxed")}
    assert report.table["exact"] == {"empty": 0.0, "reference": 1.0, "echo": 0.0, "numbers": 0.0, "boxed": 0.0,
                                     "hedged": 0.0, "overlong": 0.0}
    assert report.table["first_number"]["hedged"] == 0.0  # 1.0 on "r or w", 0.0 on "w or r": the worse


def test_the_table_marks_flagged_cells_and_the_metrics_name_each_probe():
    report = _run([exact, anywhere])
    lines = report.format().splitlines()
    assert lines[1].split() == ["probe", "exact", "anywhere"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows["numbers"] == ["0.000", "1.000!"] and rows["reference"] == ["1.000", "1.000"]
    assert set(rows) == set(st.PROBES) | {"seconds"}
    m = report.metrics()
    assert m["reward/self_test/anywhere/numbers"] == 1.0 and m["reward/self_test/exact/reference"] == 1.0
    assert m["reward/self_test/flagged"] == 3.0 and m["perf/reward_self_test_s"] >= 0.0


def test_warn_logs_each_flag_and_error_raises_naming_reward_and_probe(caplog):
    report = _run([exact, anywhere])
    with caplog.at_level(logging.WARNING, logger=st.__name__):
        st.enforce(report, "warn")
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3 and all("reward 'anywhere'" in w for w in warned)
    assert any("probe 'numbers' (every candidate answer listed) scores like a correct answer: mean 1.000 >= the "
               "reference's 1.000 over 4 rows" in w for w in warned)
    with pytest.raises(st.RewardSelfTestError, match=r"^reward.self_test=error: reward 'anywhere', probe 'numbers'"):
        st.enforce(report, "error")
    st.enforce(_run([exact]), "error")  # nothing flagged: no error


def test_a_reward_that_judges_nothing_is_flagged():
    def always_none(completions, **_):
        return [None] * len(completions)

    def raises(completions, **_):
        raise KeyError("no such column")

    report = _run([exact, always_none, raises], on_error="zero")
    assert [(r, p) for r, p, _ in report.flagged] == [("always_none", "*"), ("raises", "*")]
    assert report.table["always_none"]["reference"] is None and "reward/self_test/always_none/empty" not in \
        report.metrics()


def test_a_reward_paying_the_empty_completion_like_the_reference_is_flagged():
    def constant(completions, **_):  # e.g. a code reward whose tests never call the solution
        return [1.0] * len(completions)

    report = _run([exact, constant])
    assert [(r, p) for r, p, _ in report.flagged] == [("constant", "empty")]
    assert "(the empty completion) scores like a correct answer: mean 1.000 >= the reference's 1.000 over 4 rows" \
        in report.flagged[0][2]


def test_builtin_rewards_are_not_flagged_on_gsm8k_rows():
    fns = [(*get_reward_fn("math_answer"), 1.0), (*get_reward_fn("format"), 1.0)]
    report = _run(fns)
    assert report.flagged == []
    assert report.table["math_answer"]["reference"] == 1.0 and report.table["math_answer"]["empty"] == 0.0


def test_digit_puzzles_reward_is_not_flagged_on_its_task():
    from jaxrl_llm.data.tasks import digit_puzzles
    rows = digit_puzzles(8, seed=1)
    report = _run([(*get_reward_fn("digit_puzzles"), 1.0)], rows=list(zip(rows["prompt"], rows["answer"])))
    assert report.flagged == [] and report.table["digit_puzzles"]["reference"] == 1.0


def test_contract_errors_name_the_dataset_row_and_probe():
    def wrong_length(completions, **_):
        return [0.0] * (len(completions) + 1)

    def bad_on_echo(completions, prompts, **_):
        return [float("nan") if c == p and c else 0.0 for c, p in zip(completions, prompts)]

    with pytest.raises(RewardError, match=r"^reward 'wrong_length' returned \d+ values for \d+ rows, in the reward "
                                          r"check at start-up$"):
        _run([wrong_length])
    with pytest.raises(RewardError, match=r"^reward 'bad_on_echo' returned nan on row 6 \(dataset row 0, probe "
                                          r"'echo'\), in the reward check at start-up$"):
        _run([bad_on_echo])


# ----------------------------------------------------------------------------------------- the Trainer
def tiny(**fields):
    return tiny_api_config(**{"model.max_position_embeddings": 64, **fields})


ROWS = ARITHMETIC_ROWS


def returns_none(completions, **_):
    return None


def wrong_shape(completions, **_):
    return np.zeros((len(completions), 2))


def raises(completions, **_):
    raise ZeroDivisionError("the grader divided by zero")


@pytest.fixture
def nothing_compiles(monkeypatch):
    """Fails the test if the parameters load or a step program is built."""
    from jaxrl_llm.trainer import loop, setup

    def compiled(*a, **k):
        raise AssertionError("the Trainer went past the reward check")
    monkeypatch.setattr(setup, "load_params", compiled)
    monkeypatch.setattr(loop, "step_functions", compiled)


@pytest.mark.parametrize("fn, message", [
    (returns_none, r"reward 'returns_none' returned NoneType, expected a list of \d+ floats or None, in the reward"),
    (wrong_shape, r"reward 'wrong_shape' returned an array of shape \(\d+, 2\), expected \(\d+,\)"),
    (raises, r"reward 'raises' raised on row 0: ZeroDivisionError: the grader divided by zero \(dataset row 0, "
             r"probe 'empty'\), in the reward check at start-up"),
])
def test_a_broken_reward_stops_the_trainer_before_anything_compiles(tmp_path, nothing_compiles, fn, message):
    with pytest.raises(RewardError, match=message):
        jaxrl_llm.Trainer(tiny(), str(tmp_path / "run"), rewards=[fn], dataset=ROWS)
    assert not (tmp_path / "run").exists()  # a failed start leaves nothing behind


def test_self_test_error_mode_stops_the_trainer_and_off_calls_nothing(tmp_path, nothing_compiles, capsys):
    with pytest.raises(st.RewardSelfTestError, match="reward 'anywhere', probe 'numbers'"):
        jaxrl_llm.Trainer(tiny(**{"reward.self_test": "error"}), str(tmp_path / "a"), rewards=[anywhere], dataset=ROWS)
    assert "anywhere" in capsys.readouterr().out  # the table came first
    with pytest.raises(AssertionError, match="went past the reward check"):  # off: straight on to the parameters
        jaxrl_llm.Trainer(tiny(**{"reward.self_test": "off"}), str(tmp_path / "b"), rewards=[raises], dataset=ROWS)


def test_self_test_mode_is_validated():
    with pytest.raises(ValueError, match=r"config.reward.self_test must be warn, error or off, got 'strict'"):
        config_lib.prepare(jaxrl_llm.from_dict(tiny(**{"reward.self_test": "strict", "data.path": "rows.jsonl"})))


def _multiturn_config(**fields):
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "tiny_multiturn.py")
    spec = importlib.util.spec_from_file_location("_tiny_multiturn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return config_lib.from_dict({"data.task_rows": 64, "eval.every_steps": 0, **fields}, base=module.get_config())


def test_multi_turn_runs_probe_the_last_turn_and_the_tiny_multiturn_config_has_nothing_to_check(
        tmp_path, nothing_compiles, capsys):
    with pytest.raises(AssertionError, match="went past the reward check"):
        jaxrl_llm.Trainer(_multiturn_config(**{"reward.functions": "digit_puzzles"}), str(tmp_path / "a"))
    out = capsys.readouterr().out
    assert "digit_puzzles" in out and "(env.name: each probe stands for an episode's last model turn" in out
    reference = next(line for line in out.splitlines() if line.startswith("reference"))
    assert reference.split()[1] == "1.000"
    with pytest.raises(AssertionError, match="went past the reward check"):  # configs/tiny_multiturn.py: no reward
        jaxrl_llm.Trainer(_multiturn_config(), str(tmp_path / "b"))
    assert "reward self-test" not in capsys.readouterr().out
