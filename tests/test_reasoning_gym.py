"""reasoning-gym tasks as data and reward (data.source = "reasoning_gym"; jaxrl_llm/data/reasoning_gym.py,
jaxrl_llm/rewards/reasoning_gym.py): the reward against the package's own scoring, the rows' determinism and
held-out split, what a policy cannot gain without solving, the config-time errors, the curriculum, and a
tiny run that learns one easy task."""
import os
import subprocess
import sys
import time

import ml_collections
import numpy as np
import pytest

reasoning_gym = pytest.importorskip("reasoning_gym")  # the `test` extra installs it

from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec  # noqa: E402
from reasoning_gym.utils import extract_answer as package_extract  # noqa: E402

from jaxrl_llm.config import base_config, prepare  # noqa: E402
from jaxrl_llm.data import reasoning_gym as rgym  # noqa: E402
from jaxrl_llm.evaluate.estimators import summarize  # noqa: E402
from jaxrl_llm.rewards import get_reward_fn  # noqa: E402
from jaxrl_llm.rewards import reasoning_gym as rg_reward  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "configs"))
import grpo_reasoning_gym  # noqa: E402

OPTIONS = {"spell_backward": {"min_word_len": 3, "max_word_len": 5},
           "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
           "basic_arithmetic": {"allow_parentheses": False}, "number_sorting": {}, "letter_counting": {}}


def section(tasks="spell_backward, chain_sum:2, basic_arithmetic, number_sorting, letter_counting", options=None,
            curriculum=False):
    s = base_config().data.reasoning_gym
    s.tasks, s.curriculum = tasks, curriculum
    names = [n for n, _ in rgym.parse_tasks(tasks)]
    s.options = ml_collections.ConfigDict({k: v for k, v in (OPTIONS if options is None else options).items()
                                           if k in names})
    return s


def reference_entries(s, seed, indices):
    """The package's own composite dataset of the same tasks, weights and options, and its items."""
    specs = [DatasetSpec(name=n, weight=w, config={**s.options.to_dict().get(n, {})}) for n, w in
             rgym.parse_tasks(s.tasks)]
    composite = CompositeDataset(CompositeConfig(size=max(indices) + 1, seed=rgym.composite_seed(seed),
                                                 datasets=specs))
    return composite, [composite[i] for i in indices]


def candidates(answer: str) -> list[str]:
    """Completions a policy might write for a row whose oracle answer is `answer`."""
    return [f"<answer>{answer}</answer>", f"Let me think.\n<answer> {answer} </answer>", answer,  # untagged
            "<answer>0</answer>", f"<answer>{answer[:-1]}</answer>", f"<answer>{answer} and more</answer>",
            f"<answer>{answer}", "", f"<answer>x</answer> then <answer>{answer}</answer>",  # last block counts
            f"<answer>{answer}</answer><answer>1</answer>", f"<ANSWER>{answer}</ANSWER>",
            f"<answer>{answer.upper()}</answer>", f"<answer>\n{answer}\n</answer>"]


def test_reward_equals_the_package_score_on_the_same_answers():
    """Five tasks, thirteen completions per row (right, wrong, partial, hedged, untagged, unclosed, several
    blocks, other case): the reward is the package's score_answer of the package's extraction on the
    package's own composite entry, row for row."""
    s = section()
    rows = rgym.generate(s, seed=3, num_rows=40)
    assert set(rows["task"]) == set(OPTIONS)
    composite, entries = reference_entries(s, 3, rows["rg_index"])
    fn = get_reward_fn("reasoning_gym")[1]
    completions, expected, columns = [], [], {"task": [], "rg_config": [], "rg_index": []}
    for row, entry in zip(rows, entries):
        assert (entry["question"], entry["answer"], entry["metadata"]["source_dataset"]) == (
            row["question"], row["answer"], row["task"])
        for text in candidates(row["answer"]):
            completions.append(text)
            expected.append(composite.score_answer(package_extract(text), entry))
            for k in columns:
                columns[k].append(row[k])
    got = fn(completions=completions, **columns)
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(expected, np.float64))
    assert 0 < np.mean(got) < 1 and max(got) == 1.0  # the cases are not all alike
    # the whole-completion extraction: the stripped text itself
    whole = get_reward_fn("reasoning_gym", extract="whole")[1]
    row, entry = rows[0], entries[0]
    for text in (row["answer"], f"  {row['answer']}\n", "0"):
        assert whole(completions=[text], task=[row["task"]], rg_config=[row["rg_config"]],
                     rg_index=[row["rg_index"]]) == [composite.score_answer(text.strip(), entry)]


def test_rows_same_seed_same_rows_other_seed_other_rows_held_out_disjoint():
    s = section()
    train, again = rgym.generate(s, 0, 300), rgym.generate(s, 0, 300)
    assert train.to_dict() == again.to_dict()
    other = rgym.generate(s, 1, 300)
    assert len(set(train["question"]) & set(other["question"])) < 30  # the tasks' small problem spaces only
    test = rgym.generate(s, 0, 60, split="test")
    assert not set(train["question"]) & set(test["question"])
    assert all(rgym.is_held_out(q) for q in test["question"]) and not any(map(rgym.is_held_out, train["question"]))
    assert set(test["task"]) == set(train["task"])
    assert test.to_dict() == rgym.generate(s, 0, 60, split="test").to_dict()
    # the weights are the composite's: chain_sum (2) about twice as often as spell_backward (1)
    counts = {t: train["task"].count(t) for t in OPTIONS}
    assert 1.3 < counts["chain_sum"] / counts["spell_backward"] < 3.0, counts


def test_a_completion_cannot_raise_its_reward_without_solving():
    """Think like the policy: several candidates in several blocks earn the last block's score; every
    candidate in one block earns at most len(oracle)/len(block) < 1; an answer outside the tags earns 0;
    a megabyte of unclosed tags is scored 0 in linear time (the package's regex takes quadratic time)."""
    s = section("chain_sum")
    rows = rgym.generate(s, 0, 20)
    fn = get_reward_fn("reasoning_gym")[1]

    def score(texts, row):
        return fn(completions=texts, task=[row["task"]] * len(texts), rg_config=[row["rg_config"]] * len(texts),
                  rg_index=[row["rg_index"]] * len(texts))

    for row in rows:
        answer = row["answer"]
        guesses = [str(v) for v in range(-30, 200)]
        several = "".join(f"<answer>{g}</answer>" for g in guesses)
        assert score([several], row) == score([f"<answer>{guesses[-1]}</answer>"], row)
        hedge = score([f"<answer>{' '.join(guesses)}</answer>"], row)[0]
        assert hedge <= len(answer) / len(" ".join(guesses)) < 0.02
        assert score([f"The answer is {answer}.", f"{answer} <answer></answer>", f"<answer>{answer}"], row) == [0, 0, 0]
    flood = "<answer>1 " * 100_000
    t0 = time.perf_counter()
    assert score([flood], rows[0]) == [0.0] and rg_reward.extract_tagged(flood + "</answer>") is not None
    assert time.perf_counter() - t0 < 1.0


def test_per_task_reward_metrics_and_eval_breakdown():
    s = section("spell_backward, chain_sum")
    rows = rgym.generate(s, 0, 30)
    fn = get_reward_fn("reasoning_gym", tasks=["spell_backward", "chain_sum", "basic_arithmetic"])[1]
    out = fn(completions=[f"<answer>{a}</answer>" for a in rows["answer"]], task=rows["task"],
             rg_config=rows["rg_config"], rg_index=rows["rg_index"])
    n = rows["task"].count("chain_sum")
    assert out.metrics["sum_chain_sum"] == out.metrics["rows_chain_sum"] == n
    assert out.metrics["rows_spell_backward"] == 30 - n
    assert out.metrics["sum_basic_arithmetic"] == out.metrics["rows_basic_arithmetic"] == 0  # named, not sampled
    m = summarize(4, [4, 0, 2, 1], [1.0, 0.0, 0.5, 0.25], None, None, ["b", "a", "b", "a"])
    assert m["eval/task/b/pass@1"] == 0.75 and m["eval/task/a/pass@1"] == 0.125
    assert m["eval/task/a/mean_reward"] == 0.125 and m["eval/pass@1"] == pytest.approx(7 / 16)
    assert not any(k.startswith("eval/level") for k in m)


def _config(**fields):
    c = grpo_reasoning_gym.get_config("tiny")
    for key, value in fields.items():
        node, *path = key.split(".")
        target = c
        for p in [node, *path][:-1]:
            target = target[p]
        target[key.split(".")[-1]] = value
    return c


@pytest.mark.parametrize("fields,message", [
    ({"data.reasoning_gym.tasks": "spell_backwards"},
     r"^config\.data\.reasoning_gym\.tasks: 'spell_backwards' is not a reasoning-gym task; did you mean "
     r"spell_backward"),
    ({"data.reasoning_gym.tasks": "chain_sum:x"}, r"the weight of 'chain_sum' must be a number"),
    ({"data.reasoning_gym.tasks": ""}, r"must name at least one reasoning-gym task"),
    ({"data.reasoning_gym.options": ml_collections.ConfigDict({"spell_backward": {"min_word_length": 3}})},
     r"options\.spell_backward\.min_word_length is not an option of the task .*min_word_len"),
    ({"data.reasoning_gym.options": ml_collections.ConfigDict({"chain_sum": {"min_terms": 2}})},
     r"options\.chain_sum: 'chain_sum' is not among data\.reasoning_gym\.tasks"),
    ({"data.reasoning_gym.options": ml_collections.ConfigDict({"spell_backward": {"min_word_len": 0}})},
     r"options\.spell_backward: the task refuses its options"),
    ({"data.reasoning_gym.tasks": "gsm_symbolic", "data.reasoning_gym.options": ml_collections.ConfigDict(),
      "data.reasoning_gym.curriculum": True}, r"curriculum: gsm_symbolic has no curriculum"),
    ({"data.reasoning_gym.curriculum": True, "reward.functions": "format"},
     r"curriculum must be False unless reward.functions has reasoning_gym"),
    ({"data.source": "reasoning-gym"}, r"config\.data\.source must be '' \(data\.path or data\.task\) or "
                                       r"'reasoning_gym'"),
    ({"data.task": "digit_puzzles"}, r"config\.data\.source must be '' with data\.path or data\.task set"),
])
def test_bad_config_is_refused_at_prepare_with_one_line(fields, message):
    with pytest.raises(ValueError, match=message) as e:
        prepare(_config(**fields))
    assert "\n" not in str(e.value)


def test_missing_package_is_refused_with_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` raises ImportError
    with pytest.raises(ValueError, match=r"needs the reasoning-gym package, which is not installed .*: "
                                         r"pip install reasoning-gym$") as e:
        prepare(_config())
    assert "\n" not in str(e.value)


def test_library_imports_the_package_only_when_the_source_is_used():
    code = ("import sys; import jaxrl_llm.config, jaxrl_llm.rewards, jaxrl_llm.data.reasoning_gym, jaxrl_llm.evaluate;"
            "from jaxrl_llm.config import prepare, base_config; c = base_config(); c.data.task = 'digit_puzzles';"
            "prepare(c); assert 'reasoning_gym' not in sys.modules, 'imported'")
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_curriculum_state_raises_on_the_threshold_only():
    cur = rgym.CurriculumState(["spell_backward", "chain_sum"], threshold=0.7, window=3)
    assert cur.levels == {"spell_backward": 0, "chain_sum": 0} and cur.top["spell_backward"] == 4
    for _ in range(5):  # below the threshold: never
        assert cur.observe({"spell_backward": 0.69, "chain_sum": 0.1}) == []
    assert cur.levels == {"spell_backward": 0, "chain_sum": 0}
    assert cur.observe({"spell_backward": 0.9}) == ["spell_backward"]  # the window (0.69, 0.69, 0.9): 0.76
    assert cur.levels == {"spell_backward": 1, "chain_sum": 0}
    cur = rgym.CurriculumState(["spell_backward"], threshold=0.7, window=2)
    assert cur.observe({"spell_backward": 0.8}) == []  # a window not yet full
    assert cur.observe({"spell_backward": 0.6}) == ["spell_backward"]  # mean 0.7 reaches it
    assert cur.levels == {"spell_backward": 1} and cur.recent["spell_backward"] == []  # the window restarts
    assert cur.observe({"chain_sum": 1.0}) == []  # not one of its tasks
    restored = rgym.CurriculumState(["spell_backward"], threshold=0.7, window=2)
    restored.restore(cur.state())
    assert restored.state() == cur.state()
    for _ in range(20):
        cur.observe({"spell_backward": 1.0})
    assert cur.levels["spell_backward"] == cur.top["spell_backward"]  # capped at the last level
    # the options at a level are the package's curriculum's; the run's options win over them
    assert rgym.curriculum_options("spell_backward", 2) == {"min_word_len": 3, "max_word_len": 7}
    s = section("spell_backward", {"spell_backward": {"max_word_len": 4}}, curriculum=True)
    assert rgym.task_kwargs(s, "spell_backward", 2) == {"min_word_len": 3, "max_word_len": 4}


def _small(c):
    c.model.hidden_size, c.model.num_layers, c.model.intermediate_size = 32, 1, 64
    c.rollout.batch_prompts, c.rollout.group_size, c.rollout.max_new_tokens = 4, 2, 3
    c.data.reasoning_gym.rows = 64
    c.checkpoint.every_steps, c.checkpoint.async_save = 1, False
    c.log.progress, c.export.at_end, c.export.plot = False, False, False
    c.eval.every_steps = 0
    c.data.reasoning_gym.curriculum = True  # from level 0 (3-letter words): no option pins the word length
    c.data.reasoning_gym.options = ml_collections.ConfigDict()
    c.data.reasoning_gym.curriculum_window = 1
    return c


def test_curriculum_raises_the_level_in_training_and_a_resume_keeps_it(tmp_path, monkeypatch):
    """Scores of 1 raise spell_backward's level each step (window 1) and the next batches are of longer
    words; a run resumed after step 2 starts at the saved level with that level's rows and logs what the
    straight run logged; scores of 0 then raise nothing."""
    import json
    from jaxrl_llm.trainer import Trainer
    monkeypatch.setattr(rg_reward, "score", lambda *a, **k: 1.0)
    c = _small(grpo_reasoning_gym.get_config("tiny"))
    c.total_steps = 3
    straight = Trainer(c, str(tmp_path / "straight")).run()
    assert [h["curriculum/spell_backward/level"] for h in straight] == [1.0, 2.0, 3.0]
    c.total_steps = 2
    Trainer(c, str(tmp_path / "resumed")).run()
    c.total_steps = 3
    t = Trainer(c, str(tmp_path / "resumed"))
    assert t.start_step == 2 and t.curriculum.levels == {"spell_backward": 2}
    lengths = {len(a) for a in t.data._dataset["answer"]}
    assert max(lengths) > 3 and lengths <= set(range(3, 8))  # level 2: words of 3 to 7 letters
    t.run()
    rows = [json.loads(line) for line in open(tmp_path / "resumed" / "metrics.jsonl")]
    assert len(rows) == 3
    for key, value in straight[-1].items():
        if not key.startswith("perf/"):
            assert rows[-1][key] == value, (key, rows[-1][key], value)
    monkeypatch.setattr(rg_reward, "score", lambda *a, **k: 0.0)
    c.total_steps = 4
    assert Trainer(c, str(tmp_path / "resumed")).run()[-1]["curriculum/spell_backward/level"] == 3.0  # a 0: no raise


def test_iterator_serves_a_replacing_dataset_from_its_position():
    from jaxrl_llm.data import PromptIterator
    import datasets
    rows = lambda tag, n: datasets.Dataset.from_dict({"prompt_text": [f"{tag}{i}" for i in range(n)],  # noqa: E731
                                                      "prompt_ids": [[i + 1] for i in range(n)]})
    it = PromptIterator(rows("a", 10), 4, seed=0)
    next(it)
    it.replace_dataset(rows("b", 10))
    assert it.state() == {"epoch": 0, "position": 4, "seed": 0, "num_rows": 10}
    assert all(p.startswith("b") for p in next(it)["prompt_text"])
    it.replace_dataset(rows("c", 6))  # position 8 leaves no batch of 4 in 6 rows: the next epoch
    assert it.state()["epoch"] == 1 and it.state()["position"] == 0
    with pytest.raises(ValueError, match="fewer than a batch"):
        it.replace_dataset(rows("d", 3))


def test_tiny_model_learns_an_easy_task_with_per_task_evaluation(tmp_path):
    """configs/grpo_reasoning_gym.py:tiny: the built-in tiny model on spell_backward (3 letters) for 60 steps:
    the reward (the task's own per-letter credit) rises well above the random policy's, and the held-out
    evaluation reports the task."""
    from jaxrl_llm.trainer import Trainer
    c = grpo_reasoning_gym.get_config("tiny")
    c.log.progress, c.export.at_end, c.export.plot = False, False, False
    c.eval.num_prompts = 16
    history = Trainer(c, str(tmp_path)).run()
    rewards = np.array([h["reward/mean"] for h in history])
    print("reward by 10 steps:", np.round(rewards.reshape(-1, 10).mean(1), 3))
    assert rewards[:10].mean() < 0.1
    assert rewards[-10:].mean() > rewards[:10].mean() + 0.1
    last = history[-1]
    assert last["eval/task/spell_backward/mean_reward"] == last["eval/mean_reward"] > 0


def test_start_up_probes_pay_the_tagged_reference_and_nothing_else_like_it():
    """The reward check's probes (rewards/self_test.py) on reasoning-gym rows: the reference, stated in answer
    tags among its forms, scores 1; no probe that lists, hedges or echoes scores like it."""
    from jaxrl_llm.rewards.self_test import build_probes
    rows = rgym.generate(section("chain_sum, spell_backward"), 0, 8)
    fn = get_reward_fn("reasoning_gym")[1]
    for row in rows:
        probes = build_probes(row["question"], row["answer"], 64, len)
        best = {name: max(fn(completions=list(texts), task=[row["task"]] * len(texts),
                             rg_config=[row["rg_config"]] * len(texts), rg_index=[row["rg_index"]] * len(texts)))
                for name, texts in probes.items()}
        assert best.pop("reference") == 1.0 and max(best.values()) < 1.0, best
