"""Held-out evaluation: pass@k against a brute-force count, the majority vote, the held-out split of the
built-in task, in-loop against command-line numbers, greedy evaluation, compile reuse, config errors."""
import itertools
import json
import math
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from jaxrl_llm import config as config_lib
from jaxrl_llm import metrics as metrics_lib
from jaxrl_llm.data.tasks import digit_puzzles, is_held_out
from jaxrl_llm.evaluate import (load_eval_data, majority_vote, pass_at_k, pass_at_k_array, pass_ks, reward_config,
                                summarize, vote_key)
from jaxrl_llm.trainer import Trainer

from test_trainer import ROOT, read_jsonl, small_config


# ---------------------------------------------------------------------------------------- estimators
def brute_pass_at_k(n, c, k) -> Fraction:
    """The fraction of k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


def test_pass_at_k_equals_the_brute_force_count():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(brute_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_large_n_is_stable_and_exact_at_the_edges():
    for n, c, k in [(1000, 3, 100), (200, 1, 1), (500, 250, 64), (10_000, 7, 1000)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-10)
    assert pass_at_k(16, 9, 8) == 1.0  # n - c < k: every 8 of 16 holds one of the 9
    assert pass_at_k(16, 0, 16) == 0.0 and pass_at_k(16, 4, 1) == 0.25
    got = pass_at_k_array(np.array([4, 8, 8]), np.array([1, 0, 8]), 2)
    np.testing.assert_allclose(got, [pass_at_k(4, 1, 2), 0.0, 1.0])
    for bad in [(4, 5, 1), (4, 1, 5), (0, 0, 1), (4, 1, 0), (4.0, 1, 1), (4, True, 1)]:
        with pytest.raises(ValueError, match="pass_at_k"):
            pass_at_k(*bad)
    assert pass_ks(16) == [1, 2, 4, 8, 16] and pass_ks(6) == [1, 2, 4, 6] and pass_ks(1) == [1]


def test_majority_vote_hand_worked_cases():
    assert majority_vote(["7", "3", "7", "5"], [True, False, True, False]) == ("7", True)
    assert majority_vote(["3", "7", "7", "3"], [False, True, True, False]) == ("3", False)  # tie: first seen
    assert majority_vote(["7", "3", "3", "7"], [True, False, False, True]) == ("7", True)
    assert majority_vote([None, None, "4", None], [False, False, False, False]) == ("4", False)  # None never votes
    assert majority_vote([None, None], [True, True]) == (None, False)
    # The winner is judged by its first sample (the same answer, scored by the same reward, normally agrees).
    assert majority_vote(["9", "9", "1"], [False, True, True]) == ("9", False)
    with pytest.raises(ValueError, match="majority_vote"):
        majority_vote(["1"], [True, False])


def test_vote_keys_and_summary():
    assert vote_key(" 42 ", True) == "42" and vote_key("  ", True) is None
    assert vote_key("so the answer is $1,234.", False) == "1234"
    assert vote_key("no number here", False) is None
    m = summarize(4, correct=[4, 0, 2], score_mean=[1.0, 0.25, 0.5], maj=[1, 0, 0], level=[1, 2, 1])
    assert m["eval/pass@1"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert m["eval/pass@2"] == pytest.approx((1 + 0 + (1 - 1 / 6)) / 3)  # C(2,2)/C(4,2) = 1/6
    assert m["eval/pass@4"] == pytest.approx(2 / 3)
    assert m["eval/mean_reward"] == pytest.approx(1.75 / 3) and m["eval/maj@4"] == pytest.approx(1 / 3)
    assert m["eval/level1/pass@1"] == pytest.approx(0.75) and m["eval/level2/pass@4"] == 0.0
    assert m["eval/level1/maj@4"] == 0.5 and "eval/level1/pass@2" not in m


# --------------------------------------------------------------------------------- held-out split
@pytest.mark.parametrize("seed", [0, 7])
def test_held_out_split_is_disjoint_from_training(seed):
    train = digit_puzzles(4096, seed=seed)
    test = digit_puzzles(512, seed=seed, split="test")
    assert not set(train["prompt"]) & set(test["prompt"])
    assert all(is_held_out(p) for p in test["prompt"]) and not any(is_held_out(p) for p in train["prompt"])
    assert set(test["level"]) == {1, 2, 3, 4}  # every level has held-out prompts, the small ones too
    assert digit_puzzles(512, seed=seed, split="test")["prompt"] == test["prompt"]  # deterministic
    for p, a in zip(test["prompt"], test["answer"]):  # the answers are still right
        nums = [int(x) for x in p[4:-2].split(",")]
        assert a == str(max(nums) if p.startswith("max") else min(nums))


def test_eval_data_of_the_builtin_task_and_a_missing_path(tmp_path):
    from jaxrl_llm.data import builtin_tokenizer
    c = config_lib.prepare(small_config(**{"eval.num_prompts": 10}))
    ds = load_eval_data(c, builtin_tokenizer())
    train = digit_puzzles(c.data.task_rows, seed=c.seed)
    assert len(ds) == 10 and "level" in ds.column_names
    assert not set(ds["prompt_user"]) & set(train["prompt"])
    c.eval.path = str(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match=r"^config\.eval\.path .*does not exist"):
        load_eval_data(c, builtin_tokenizer())
    rows = tmp_path / "held.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"max({i},1)=", "answer": str(max(i, 1)), "level": 1}) + "\n"
                            for i in range(5)))
    c.eval.path, c.eval.split, c.eval.num_prompts = str(rows), "train", 3
    ds = load_eval_data(c, builtin_tokenizer())
    assert ds["prompt_user"] == ["max(0,1)=", "max(1,1)=", "max(2,1)="]


# ------------------------------------------------------------------------- in the loop, on the command line
EVAL = {"eval.every_steps": 2, "eval.num_prompts": 6, "eval.k": 4, "eval.correct_threshold": 0.3,
        "optimizer.learning_rate": 1e-2}


@pytest.fixture(scope="module")
def run_with_eval(tmp_path_factory):
    wd = tmp_path_factory.mktemp("eval_run")
    trainer = Trainer(small_config(total_steps=3, **EVAL), str(wd))
    history = trainer.run()
    return wd, history, trainer.initial_eval


def test_in_loop_rows_and_no_effect_on_training(run_with_eval, tmp_path):
    wd, history, initial = run_with_eval
    rows = read_jsonl(wd / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and [h["step"] for h in history] == [1, 2, 3]
    assert {k: v for k, v in rows[0].items() if k != "step"} == initial
    evaluated = [r["step"] for r in rows if "eval/pass@1" in r]
    assert evaluated == [0, 2, 3]  # before training, every 2 steps, at the end
    assert {"eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/mean_reward", "eval/maj@4", "eval/level1/pass@1",
            "eval/time_s"} <= set(rows[-1])
    assert "reward/mean" not in rows[0] and history[-1]["eval/mean_reward"] == rows[-1]["eval/mean_reward"]
    assert metrics_lib.tensorboard_tag("eval/level1/pass@4") == "eval/level1/pass_at_4"  # tensorboardX has no @
    assert metrics_lib.held_out_keys(rows) == ["eval/pass@1", "eval/pass@4", "eval/maj@4"]  # curves.png panel
    # The evaluation draws from a stream of its own: training is the same as without it.
    plain = read_jsonl_after(Trainer(small_config(total_steps=3, **{**EVAL, "eval.every_steps": 0}),
                                     str(tmp_path)).run())
    assert len(plain) == 3
    for a, b in zip(rows[1:], plain):
        assert {k: v for k, v in a.items() if not k.startswith(("eval/", "perf/"))} == \
               {k: v for k, v in b.items() if not k.startswith("perf/")}


def read_jsonl_after(history):
    return [json.loads(json.dumps(h)) for h in history]


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]))
    return subprocess.run([sys.executable, "-m", "jaxrl_llm.evaluate", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("step", [3, 2])
def test_command_line_gives_the_loops_numbers(run_with_eval, step):
    wd, _, _ = run_with_eval
    proc = run_cli(f"--workdir={wd}", f"--step={step}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((wd / "eval" / f"step_{step}.json").read_text())
    logged = next(r for r in read_jsonl(wd / "metrics.jsonl") if r["step"] == step)
    got = {k: v for k, v in report["metrics"].items() if k != "eval/time_s"}
    assert got and got == {k: v for k, v in logged.items() if k.startswith("eval/") and k != "eval/time_s"}
    assert 0 < got["eval/pass@1"] < got["eval/pass@4"]  # numbers worth comparing
    assert report["step"] == step and report["num_prompts"] == 6
    samples = read_jsonl(wd / "eval" / f"step_{step}.samples.jsonl")
    assert len(samples) == 6 * 4 and np.mean([s["score"] for s in samples]) == pytest.approx(got["eval/mean_reward"])
    assert "eval/pass@1" in proc.stdout


def test_command_line_on_the_exported_model_gives_the_same_numbers(run_with_eval, tmp_path):
    """--model with a config file: the run's final parameters as a Hugging Face model."""
    from jaxrl_llm.export import export
    wd, _, _ = run_with_eval
    export(str(wd), str(tmp_path / "hf"), 3)
    fields = {"rollout.batch_prompts": 4, "rollout.group_size": 2, "rollout.max_new_tokens": 3,
              "reward.functions": "fixtures_rewards:digit_fraction", **EVAL}
    proc = run_cli(f"--model={tmp_path / 'hf'}", f"--config={ROOT}/configs/tiny.py", f"--out={tmp_path / 'out'}",
                   *(f"--config.{k}={v}" for k, v in fields.items()))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "model.json").read_text())
    logged = next(r for r in read_jsonl(wd / "metrics.jsonl") if r["step"] == 3)
    assert report["step"] is None and report["source"] == str(tmp_path / "hf")
    for k, v in report["metrics"].items():
        if k != "eval/time_s":
            assert v == pytest.approx(logged[k], abs=1e-9), k


def test_command_line_errors_are_one_line(tmp_path):
    for args, message in [((f"--workdir={tmp_path}",), "config.json: not found"),
                          ((), "give either --workdir"),
                          ((f"--model={tmp_path}",), "--model needs --config")]:
        proc = run_cli(*args)
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr
        assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("jaxrl_llm.evaluate: error:")


def test_greedy_takes_one_sample_and_reuses_the_training_sampler(tmp_path):
    from jaxrl_llm.sampling import generate_program
    greedy = {"eval.every_steps": 1, "eval.num_prompts": 5, "eval.k": 8, "eval.temperature": 0.0,
              "rollout.max_new_tokens": 2}
    before = generate_program._cache_size()
    history = Trainer(small_config(total_steps=1, **greedy), str(tmp_path / "greedy")).run()
    keys = {k for k in history[-1] if k.startswith("eval/") and "level" not in k}
    assert keys == {"eval/pass@1", "eval/mean_reward", "eval/maj@1", "eval/time_s"}
    # One sample, so pass@1 and maj@1 are the fraction of prompts answered correctly.
    assert history[-1]["eval/pass@1"] == history[-1]["eval/maj@1"]
    assert generate_program._cache_size() - before == 2  # greedy evaluation + the training sampler
    # eval.k = group_size and the training prompt bucket: the evaluation runs the training's program.
    same = {"eval.every_steps": 1, "eval.num_prompts": 8, "eval.k": 2, "rollout.max_new_tokens": 2,
            "seed": 1}
    before = generate_program._cache_size()
    Trainer(small_config(total_steps=1, **same), str(tmp_path / "same")).run()
    assert generate_program._cache_size() - before == 0


def test_a_paged_evaluation_gives_the_unpaged_numbers(tmp_path):
    """rollout.kv_page_size: the evaluator samples on the paged cache (a pool of at least what its own batch
    needs, `Evaluator._paging`) and gives the unpaged evaluation's pass@k, rewards and samples."""
    import copy
    from jaxrl_llm.sampling import paged_program
    fields = {**EVAL, "eval.every_steps": 1, "rollout.max_new_tokens": 6, "rollout.decode_slots": 4,
              "rollout.kv_page_size": 2, "rollout.kv_pages": 0}
    trainer = Trainer(small_config(total_steps=1, **fields), str(tmp_path))
    params = trainer.policy(trainer.state)
    paged = trainer.evaluator
    unpaged = copy.copy(paged)
    unpaged.c = copy.deepcopy(paged.c)
    unpaged.c.rollout.kv_page_size = 0
    assert unpaged._paging(2, 16) == {} and paged._paging(2, 16)["kv_page_size"] == 2
    before = paged_program._cache_size()
    (got, got_rows), (want, want_rows) = paged(params), unpaged(params)
    assert paged_program._cache_size() > before  # the paged sampler ran
    got.pop("eval/time_s"), want.pop("eval/time_s")
    assert got == want and "eval/pass@4" in got and got_rows == want_rows


def test_eval_rewards_default_to_training_ones_without_overlong_shaping():
    dapo = config_lib.prepare(small_config("dapo"))
    assert [n for n, _ in config_lib.reward_specs(dapo)] == ["fixtures_rewards:digit_fraction", "overlong"]
    assert config_lib.reward_specs(reward_config(dapo)) == [("fixtures_rewards:digit_fraction", 1.0)]
    own = config_lib.prepare(small_config(**{"eval.rewards": "digit_puzzles, format", "reward.weights": "2.0"}))
    assert config_lib.reward_specs(reward_config(own)) == [("digit_puzzles", 1.0), ("format", 1.0)]


# ------------------------------------------------------------------------------------ config errors
@pytest.mark.parametrize("values, message", [
    ({"eval.k": 0}, "config.eval.k must be an int >= 1"),
    ({"eval.every_steps": -1}, "config.eval.every_steps must be an int >= 0"),
    ({"eval.num_prompts": -2}, "config.eval.num_prompts must be an int >= 0"),
    ({"eval.temperature": -0.5}, "config.eval.temperature must be a number >= 0"),
    ({"eval.correct_threshold": "high"}, "config.eval.correct_threshold"),
    ({"eval.correct_threshold": float("nan")}, "config.eval.correct_threshold must be a finite number"),
    ({"eval.split": ""}, "config.eval.split must be a split name"),
    ({"eval.rewards": "digit_puzzles,,format"}, "config.eval.rewards must be comma-separated"),
    ({"eval.holdout": -1}, "config.eval.holdout must be an int >= 0"),
    ({"eval.holdout": 1, "data.task": "", "data.path": "gsm8k"}, "config.eval.holdout must be an int >= 2 or 0"),
    ({"eval.path": "gsm8k", "eval.split": "train", "data.task": "", "data.path": "gsm8k"},
     "config.eval.path must be other prompts than the training data"),
    ({"eval.kk": 3}, "config.eval.kk is not a config field; did you mean eval.k"),
])
def test_bad_eval_fields_are_one_line_errors(values, message):
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.").replace("(", r"\(")):
        config_lib.prepare(config_lib.from_dict(values, small_config()))
