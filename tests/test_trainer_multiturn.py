"""The trainer on multi-turn episodes (env.name, configs/tiny_multiturn.py) with a tiny built-in model: the
score pass attends to environment tokens but trains only the model's (`attention_mask` vs `mask`), every
preset runs a step, env metrics are logged, resume mid-run is exact."""
import importlib.util
import json
import os

import jax
import numpy as np
import pytest

from jaxrl_llm import config as config_lib
from jaxrl_llm import envs
from jaxrl_llm.config import ALGOS
from jaxrl_llm.data import builtin_tokenizer
from jaxrl_llm.models import token_logprobs
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.lm import init_params
from jaxrl_llm.trainer import Trainer
from jaxrl_llm.trainer.episodes import sample_episodes
from jaxrl_llm.trainer.steps import logp_of
from overrides import apply_overrides
from xla_flags import with_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_METRICS = {"env/turns/mean", "env/tool_calls/mean", "env/errors/mean", "env/aborted_frac", "env/reward/mean",
               "env/reward/turn1/mean", "sampler/logp_diff_max", "reward/mean"}  # turn k > 1: when reached


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mt_config(algo="grpo", **overrides):
    """configs/tiny_multiturn.py shrunk for tests: one layer, 4 prompts x 4 episodes."""
    c = _load("tiny_multiturn").get_config(f"algo={algo}")
    c.total_steps = 2
    c.model.hidden_size, c.model.num_layers, c.model.intermediate_size = 32, 1, 64
    c.rollout.batch_prompts, c.rollout.group_size = 4, 4
    c.train.minibatches = 1
    c.data.task_rows = 64
    c.checkpoint.every_steps, c.checkpoint.async_save = 1, False
    c.log.progress, c.log.samples_every = False, 1
    c.export.at_end = c.export.plot = False
    c.eval.every_steps = 0  # the evaluation tests turn it on
    apply_overrides(c, overrides)
    return c


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_score_pass_attends_to_environment_tokens():
    """logp_of on an episode batch (prompts shared by their group) equals a one-row-at-a-time
    teacher-forced reference on every model token, and equals the sampler's; the mutation that attends
    only to the model's tokens (`mask`) is caught."""
    tok = builtin_tokenizer()
    mc = ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=True)
    params = init_params(mc, jax.random.PRNGKey(0))
    G, rows = 2, [{"prompt": "guess:", "hidden": h} for h in (1, 8)]
    ep = sample_episodes(mc, params, tok, envs.make_env("guess_digit"), [r for r in rows for _ in range(G)],
                         jax.random.PRNGKey(3), max_turns=4, max_new_tokens=8, max_turn_tokens=1,
                         pad_id=tok.pad_token_id)
    m = ep.mask.astype(bool)
    assert (ep.attention_mask.sum(1) > ep.mask.sum(1)).any(), "some episode must hold environment tokens"
    b = {"prompt_tokens": ep.prompt_tokens[::G], "prompt_mask": ep.prompt_mask[::G], "tokens": ep.tokens,
         "mask": ep.mask, "attention_mask": ep.attention_mask}
    got = np.asarray(logp_of(mc, params, b, 1.0))
    full = np.concatenate([ep.prompt_tokens, ep.tokens], 1)
    full_mask = np.concatenate([ep.prompt_mask, ep.attention_mask], 1)
    p = ep.prompt_tokens.shape[1]
    ref = np.stack([np.asarray(token_logprobs(mc, params, full[i:i + 1, :-1], full_mask[i:i + 1, :-1],
                                              full[i:i + 1, 1:], 1.0))[0, p - 1:] for i in range(len(full))])
    assert np.abs(got - ref)[m].max() <= 1e-4
    assert np.abs(got - ep.logprobs)[m].max() <= 1e-4
    wrong = np.asarray(logp_of(mc, params, {k: v for k, v in b.items() if k != "attention_mask"}, 1.0))
    assert np.abs(wrong - ep.logprobs)[m].max() > 1e-3  # blind to the replies: not the sampler's


# The presets whose paths differ where masks matter: group advantages, GAE with a value model and
# bootstrapping, DAPO's dynamic sampling, overlong shaping and truncation mask, recomputed log-probs with
# sequence ratios# (the others differ from these only in loss formulas on the same masks).
PRESETS = ("grpo", "ppo", "dapo", "gspo")
assert set(PRESETS) <= set(ALGOS)


@pytest.mark.parametrize("algo", PRESETS)
def test_one_multiturn_step_of_presets(algo, tmp_path):
    c = mt_config(algo, total_steps=1, **({"rollout.group_size": 1} if algo == "ppo" else {}))
    t = Trainer(c, str(tmp_path))
    (m,) = t.run()
    assert ENV_METRICS <= set(m), ENV_METRICS - set(m)
    assert all(np.isfinite(v) for v in m.values()), m
    assert m["sampler/logp_diff_max"] < 1e-4
    assert 1.0 <= m["env/turns/mean"] <= c.env.max_turns
    if not t.c.dapo.overlong_buffer:  # no reward function: the score is the sum of the turn rewards
        assert m["reward/mean"] == pytest.approx(m["env/reward/mean"])
    sample = read_jsonl(tmp_path / "samples.jsonl")[0]
    assert "env" in sample["rewards"] and sample["prompt"] == "guess:"
    assert sample["reward"] == pytest.approx(sum(sample["rewards"].values()))  # env + reward functions
    assert all(ch in "<>?" for ch in sample["completion"][1::2])  # the log shows the replies too


def _check_batch_masks(t):
    """The rollout rows: mask within attention_mask, replies ('<', '>', '?') exactly off the mask, one
    model token per turn, the episode reward is 1 iff the last guess is the hidden digit."""
    local, first, info = t.rollouts.collect(t.state.params, jax.random.PRNGKey(5), 0)
    tok = t.tokenizer
    att, mask, tokens = local["attention_mask"], local["mask"], local["tokens"]
    assert ((mask == 1) <= (att == 1)).all() and (att.sum(1) == local["lengths"]).all()
    b = t.rollouts.device_batch(local)
    assert set(b) >= {"attention_mask", "mask", "loss_mask"}
    for i in range(len(tokens)):
        n = int(att[i].sum())
        assert att[i, :n].all() and not att[i, n:].any()  # right-padded
        text = [tok.decode([int(x)]) for x in tokens[i, :n]]
        assert list(mask[i, :n]) == [1 - (k % 2) for k in range(n)]  # guess, reply, guess, ...
        assert all(ch in "<>?" for ch in text[1::2])
        hidden = int(info["references"][i])
        assert local["scores"][i] == float(text[-1] == str(hidden) and n % 2 == 1)


def test_multiturn_resume_is_exact(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    Trainer(mt_config(total_steps=4), str(straight)).run()
    Trainer(mt_config(total_steps=2), str(resumed)).run()
    t = Trainer(mt_config(total_steps=4), str(resumed))
    assert t.start_step == 2
    t.run()
    a, b = read_jsonl(straight / "metrics.jsonl"), read_jsonl(resumed / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4] and "env/turns/mean" in b[-1]
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if not k.startswith("perf/")} == \
               {k: v for k, v in rb.items() if not k.startswith("perf/")}
    done = Trainer(mt_config(total_steps=4), str(straight))
    jax.tree_util.tree_map(np.testing.assert_array_equal, done.state.params, t.state.params)
    _check_batch_masks(done)


def test_env_refuses_process_rewards():
    with pytest.raises(ValueError, match="reads process rewards"):
        config_lib.prepare(mt_config(**{"advantage.estimator": "group_process"}))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_multiturn_evaluation_against_reference_episodes(temperature, tmp_path):
    """Held-out evaluation runs episodes under the environment. Greedy: pass@1 and the mean reward equal
    the success rate of tests/episodes_reference.py's episodes on the same held-out rows (each turn a
    fresh prefill on the single-turn sampler), and eval/env/turns/mean their turns. Sampled (k=4): every
    sample's score is its episode's reward, its completion its last guess."""
    from episodes_reference import reference_episodes
    from jaxrl_llm import evaluate
    c = mt_config(**{"eval.every_steps": 2, "eval.num_prompts": 12, "eval.temperature": temperature, "eval.k": 4})
    t = Trainer(c, str(tmp_path))
    params = dict(t.policy(t.state))
    # A random policy biased towards digits (the tied embedding: every state leans along u, the digits'
    # rows too): its greedy episodes sometimes find the digit, so pass@1 is neither 0 nor 1.
    u = np.zeros(params["embed"].shape[1], np.float32)
    u[0] = 1.0
    digits = [t.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    params["embed"] = (params["embed"] + 0.5 * u).at[np.asarray(digits)].add(u)
    m, samples = t.evaluator(params, step=0)
    rows = evaluate.load_eval_data(t.c, t.tokenizer).with_format(None)
    if temperature == 0:
        ref = reference_episodes(t.mc, params, t.tokenizer, envs.make_env("guess_digit"), list(rows),
                                 jax.random.PRNGKey(0), max_turns=4, max_new_tokens=8, max_turn_tokens=1,
                                 temperature=0.0, pad_id=t.pad_id)
        assert m["eval/pass@1"] == pytest.approx(float(np.mean(ref.rewards))) and 0 < m["eval/pass@1"] < 1
        assert m["eval/mean_reward"] == pytest.approx(float(np.mean(ref.rewards)))
        assert m["eval/env/turns/mean"] == pytest.approx(np.mean([len(x) for x in ref.texts]))
        assert [s["completion"] for s in samples] == [x[-1] for x in ref.texts]
    else:
        assert len(samples) == 12 * 4 and 0 < m["eval/pass@4"] and 1 <= m["eval/env/turns/mean"] <= 4
        for s in samples:  # right when the last guess is the hidden digit (a right guess ends the episode)
            assert s["score"] == float(s["completion"] == str(rows[s["prompt_index"]]["hidden"]))
            assert s["completion"] in s["episode"] and 1 <= s["turns"] <= 4
    # and inside training: the loop logs the eval metrics at step 2
    t.run()
    logged = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "eval/pass@1" in r]
    assert logged and "eval/env/turns/mean" in logged[-1]


def _biased_qwen2(path, tok):
    """A tiny random Qwen2 checkpoint (untied head) whose final hidden state has a constant positive
    coordinate that the head maps to `<tool_call>`, `</tool_call>` and `<|im_end|>`: a random policy that
    writes (mostly malformed) tool calls and ends its turns, as a real instruct model would try to."""
    import torch
    from fixtures_hf import make_hf_model
    model = make_hf_model(str(path), "qwen2", vocab_size=len(tok), bos_token_id=tok.pad_token_id,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, max_position_embeddings=2048)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 3.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight[:, 0] = 0.0
        for token, w in (("<tool_call>", 1.2), ("</tool_call>", 1.0), ("<|im_end|>", 0.8)):
            model.lm_head.weight[tok.convert_tokens_to_ids(token), 0] = w
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))


def test_gsm8k_tools_config_end_to_end(tmp_path):
    """configs/grpo_gsm8k_tools.py through the real loading path (a local Qwen2 checkpoint and a tokenizer
    whose chat template renders tools) for 2 steps: episodes hold tool-response observations (error
    messages for malformed calls), the masks frame them, the metrics are there."""
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from fixtures_envs import qwen_tokenizer
    tok = qwen_tokenizer()
    tok.add_tokens(["<tool_call>", "</tool_call>"])  # Qwen2.5's added (non-special) tokens
    _biased_qwen2(tmp_path / "model", tok)
    with open(tmp_path / "gsm8k.jsonl", "w") as f:
        for a, b in [(2, 3), (4, 5), (7, 1), (6, 6)]:
            f.write(json.dumps({"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}) + "\n")
    c = _load("grpo_gsm8k_tools").get_config()
    assert c.env.name == "tools" and c.model.path.startswith("Qwen/Qwen2.5")
    c.model.path, c.data.path, c.data.name = str(tmp_path / "model"), str(tmp_path / "gsm8k.jsonl"), ""
    c.model.compute_dtype = "float32"
    c.data.max_prompt_length = 1024
    c.rollout.batch_prompts, c.rollout.group_size, c.rollout.max_new_tokens = 2, 2, 320
    c.env.max_turns, c.env.max_turn_tokens = 3, 12
    c.train.minibatches, c.optimizer.warmup_steps, c.total_steps = 1, 0, 2
    c.checkpoint.every_steps, c.checkpoint.async_save = 1, False
    c.log.progress, c.export.at_end, c.export.plot = False, False, False
    t = Trainer(c, str(tmp_path / "run"))
    local, _, info = t.rollouts.collect(t.state.params, jax.random.PRNGKey(0), 0)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    responses = 0
    for i in range(len(local["tokens"])):
        ids, att, mask = local["tokens"][i], local["attention_mask"][i], local["mask"][i]
        n = int(att.sum())
        assert att[:n].all() and not att[n:].any() and not mask[n:].any() and mask[0] == 1
        # each environment segment: closes the turn, a user turn of tool responses, opens the next assistant turn
        k = 0
        while k < n:
            if mask[k]:
                k += 1
                continue
            end = k + int(np.argmax(mask[k:n])) if mask[k:n].any() else n
            env_text = tok.decode(ids[k:end])
            assert ids[k - 1] == im_end or env_text.startswith("<|im_end|>"), env_text
            assert "<tool_response>\nerror: " in env_text or "<tool_response>" in env_text, env_text
            assert env_text.endswith("<|im_start|>assistant\n") and mask[end:n].any(), env_text
            responses += 1
            k = end
    assert responses > 0, ("the biased policy writes tool calls: some episodes must get tool responses",
                           info["completions"])
    history = t.run()
    assert len(history) == 2
    for m in history:
        assert {"env/tool_calls/mean", "env/errors/mean", "env/turns/mean", "reward/math_answer/mean",
                "sampler/logp_diff_max"} <= set(m), sorted(m)
        assert m["sampler/logp_diff_max"] < 1e-4
    assert sum(m["env/errors/mean"] for m in history) > 0  # malformed calls answered with errors


MESH_OVERRIDES = {"eval.every_steps": 2, "eval.num_prompts": 8, "eval.k": 4, "rollout.temperature": 0.7}
MESH_RUN = """
import json, sys, tempfile
sys.path.insert(0, {tests!r})
from test_trainer_multiturn import MESH_OVERRIDES, mt_config
from jaxrl_llm.trainer import Trainer
c = mt_config(**{{"mesh.data": 2, "mesh.fsdp": 1, "mesh.tensor": 2, **MESH_OVERRIDES}})
print("RESULT" + json.dumps(Trainer(c, tempfile.mkdtemp()).run()))
"""


def test_multiturn_on_a_mesh_matches_one_device(tmp_path):
    """Episodes, their update and their evaluation on a (data 2, tensor 2) mesh of 4 CPU devices give one
    device's metrics (the mesh in a subprocess: the fake devices need their own XLA flags)."""
    import subprocess
    import sys
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=with_flags("--xla_force_host_platform_device_count=4"),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", MESH_RUN.format(tests=os.path.join(ROOT, "tests"))], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    one = Trainer(mt_config(**MESH_OVERRIDES), str(tmp_path)).run()  # meanwhile, on this process's one device
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    mesh = json.loads(stdout.split("RESULT", 1)[1])
    assert len(one) == len(mesh) == 2 and "eval/pass@1" in one[-1] and "env/turns/mean" in one[0]
    for a, b in zip(one, mesh):
        for key in a:
            if not key.startswith("perf/") and key != "eval/time_s":
                np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=key)
        assert b["sampler/logp_diff_max"] <= 1e-4


@pytest.mark.slow
def test_default_tiny_multiturn_run_uses_the_feedback(tmp_path):
    """configs/tiny_multiturn.py as the README runs it (the CLI, 300 steps from random init, about a minute): the
    training reward ends past the bar (initial + half the headroom to 1) and past 0.4, the best a policy
    that ignores the replies can score, and so does held-out pass@1."""
    import fixtures_reliability as fr
    rows = fr.learning_run("tiny_multiturn.py", tmp_path, log__progress=False, log__tensorboard=False,
                           export__at_end=False, export__plot=False)
    r = np.array([h["reward/mean"] for h in rows if "reward/mean" in h])
    init, final = r[:10].mean(), r[-30:].mean()
    bound = envs.feedback_free_bound(_load("tiny_multiturn").get_config().env.max_turns)
    assert bound == 0.4 and len(r) == 300
    assert final >= max(init + (1 - init) / 2, bound + 0.05), (init, final)
    last = rows[-1]
    assert last["step"] == 300 and last["eval/pass@1"] > bound + 0.1, last


def test_evaluate_command_line_gives_the_loops_episode_numbers(tmp_path):
    """`python -m jaxrl_llm.evaluate --workdir --step` on a multi-turn run: the held-out episodes of the
    checkpoint give the numbers the loop logged at that step."""
    import subprocess
    import sys
    c = mt_config(**{"eval.every_steps": 2, "eval.num_prompts": 8, "eval.k": 4})
    Trainer(c, str(tmp_path)).run()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]))
    proc = subprocess.run([sys.executable, "-m", "jaxrl_llm.evaluate", f"--workdir={tmp_path}", "--step=2"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "eval" / "step_2.json").read_text())
    logged = next(r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["step"] == 2 and "eval/pass@1" in r)
    got = {k: v for k, v in report["metrics"].items() if k != "eval/time_s"}
    assert "eval/env/turns/mean" in got
    assert got == {k: v for k, v in logged.items() if k.startswith("eval/") and k != "eval/time_s"}
