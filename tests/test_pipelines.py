"""The real-model configs end to end on tiny local stand-ins (issue: rewards and data).

`configs/grpo_gsm8k.py` runs 2 steps on a tiny local Qwen2 checkpoint with a chat-template tokenizer and
a GSM8K-schema jsonl; `configs/ppo_rlhf.py` runs 2 steps with a tiny sequence-classification reward model.
Only paths and sizes are overridden: the loading, templating, reward and export code is what users hit.
"""
import importlib
import json
import os
import sys

import numpy as np

from fixtures_data import make_tiny_tokenizer, write_gsm8k_like
from fixtures_hf import make_hf_model
from jaxrl_llm.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "configs"))


def _tiny_checkpoint(path, tokenizer, *, head="causal", seed=0):
    make_hf_model(str(path), "qwen2", seed=seed, head=head, vocab_size=len(tokenizer),
                  eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                  pad_token_id=tokenizer.pad_token_id, num_hidden_layers=1, max_position_embeddings=512)
    tokenizer.save_pretrained(str(path))


def _shrink(c, tmp_path):
    c.total_steps = 2
    c.model.compute_dtype = "float32"
    c.model.remat = "none"
    c.data.max_prompt_length = 256
    c.rollout.batch_prompts = 2
    c.rollout.max_new_tokens = 8
    c.train.minibatches = 1
    c.train.epochs = 1
    c.optimizer.warmup_steps = 0
    c.checkpoint.every_steps = 1
    c.checkpoint.async_save = False
    c.log.progress = False
    c.log.samples_every = 1
    return c


def test_grpo_gsm8k_pipeline_on_tiny_local_checkpoint(tmp_path):
    tok = make_tiny_tokenizer(tmp_path / "model", chat_template=True)
    _tiny_checkpoint(tmp_path / "model", tok)
    rows = write_gsm8k_like(tmp_path / "gsm8k.jsonl", 8, "jsonl")
    c = _shrink(importlib.import_module("grpo_gsm8k").get_config(), tmp_path)
    c.model.path = str(tmp_path / "model")
    c.data.path = str(tmp_path / "gsm8k.jsonl")
    c.data.name = ""
    c.rollout.group_size = 2
    work = tmp_path / "work"
    history = Trainer(c, str(work)).run()
    assert len(history) == 2 and all(np.isfinite(h["policy/loss"]) for h in history)
    assert "reward/math_answer/mean" in history[0]
    samples = [json.loads(line) for line in open(work / "samples.jsonl")]
    questions = {r["question"] for r in rows}
    assert all(s["prompt"] in questions for s in samples)  # rewards saw the user prompt, not the template
    # The export carries the chat-template tokenizer and loads in transformers.
    from transformers import AutoModelForCausalLM, AutoTokenizer
    assert AutoTokenizer.from_pretrained(work / "hf").chat_template == tok.chat_template
    AutoModelForCausalLM.from_pretrained(work / "hf")
    assert (work / "curves.png").stat().st_size > 0 and (work / "DONE").exists()


def test_ppo_rlhf_pipeline_with_tiny_reward_model(tmp_path):
    tok = make_tiny_tokenizer(tmp_path / "model", chat_template=True)
    _tiny_checkpoint(tmp_path / "model", tok)
    _tiny_checkpoint(tmp_path / "rm", tok, head="seqcls", seed=1)
    prompts = [{"prompt": f"Write a line about the number {i}."} for i in range(8)]
    with open(tmp_path / "prompts.jsonl", "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in prompts)
    c = _shrink(importlib.import_module("ppo_rlhf").get_config(), tmp_path)
    c.model.path = str(tmp_path / "model")
    c.data.path = str(tmp_path / "prompts.jsonl")
    c.data.split = "train"
    c.reward.kwargs.reward_model.path = str(tmp_path / "rm")
    c.export.at_end = False
    history = Trainer(c, str(tmp_path / "work")).run()
    m = history[-1]
    assert {"value/loss", "value/explained_var", "kl/ref", "kl/coef", "reward/reward_model/mean"} <= set(m)
    assert all(np.isfinite(v) for v in m.values())
    assert history[0]["reward/std"] > 0  # the reward model scores differ between completions
