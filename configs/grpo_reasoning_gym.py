"""GRPO on reasoning-gym tasks: rows generated from the seed, each scored by its task's own `score_answer`.

Needs the reasoning-gym package (`pip install reasoning-gym`); nothing is downloaded for the data. The
held-out evaluation reports pass@k per task (eval/task/<name>/...), and the curriculum raises a task's
difficulty level when its training reward passes the threshold (docs/data.md, "reasoning-gym tasks").

With a Qwen2.5 instruct model (answers in <answer>...</answer>):
  python -m jaxrl_llm.train --config=configs/grpo_reasoning_gym.py --workdir=/tmp/grpo_rgym
The built-in tiny model on one easy task, on CPU in a minute, no download at all (it answers with the
answer alone: the reward reads the whole completion):
  python -m jaxrl_llm.train --config=configs/grpo_reasoning_gym.py:tiny --workdir=/tmp/rgym_tiny
"""
from jaxrl_llm.config import base_config

SYSTEM_PROMPT = ("Think about the problem step by step, then give the final answer alone between <answer> and "
                 "</answer>, e.g. <answer>42</answer>.")


def get_config(arg=None):
    if arg not in (None, "", "tiny"):
        raise ValueError(f"configs/grpo_reasoning_gym.py: arg must be empty or 'tiny', got {arg!r}")
    c = base_config()
    c.algo = "grpo"
    c.data.source = "reasoning_gym"
    c.data.prompt_column = "question"  # the generated rows: question, answer, task, rg_config, rg_index
    c.data.answer_column = "answer"
    c.reward.functions = "reasoning_gym"  # the task's score_answer on the last <answer>...</answer> block
    rg = c.data.reasoning_gym
    if arg == "tiny":
        return _tiny(c)

    rg.tasks = "spell_backward, chain_sum:2, basic_arithmetic"  # name[:weight]
    rg.options.basic_arithmetic = {"allow_parentheses": False}  # any field of the task's config
    rg.rows = 8192
    rg.curriculum = True  # every task starts at its curriculum's level 0 (the options above win over it)
    rg.curriculum_threshold = 0.7
    rg.curriculum_window = 10
    c.total_steps = 500

    c.model.path = "Qwen/Qwen2.5-1.5B-Instruct"
    c.model.dtype = "float32"
    c.model.compute_dtype = "bfloat16"
    c.model.remat = "full"
    c.data.system_prompt = SYSTEM_PROMPT
    c.data.use_chat_template = "auto"
    c.data.max_prompt_length = 512

    c.rollout.batch_prompts = 64
    c.rollout.group_size = 8
    c.rollout.max_new_tokens = 512
    c.train.minibatches = 2
    c.optimizer.learning_rate = 1e-6
    c.optimizer.warmup_steps = 10

    c.eval.every_steps = 50
    c.eval.num_prompts = 256
    c.eval.k = 8
    c.checkpoint.every_steps = 50
    c.export.dtype = "bfloat16"
    return c


def _tiny(c):
    """The built-in tiny model (character tokenizer, no chat template) on spell_backward with 3-letter words:
    its first answer letter is the prompt's last character, so a random policy soon finds part of the
    reward (the task gives credit per letter in place)."""
    rg = c.data.reasoning_gym
    rg.tasks = "spell_backward"
    rg.options.spell_backward = {"min_word_len": 3, "max_word_len": 3}
    rg.rows = 512
    c.reward.kwargs.reasoning_gym = {"extract": "whole"}  # no tags: the completion is the answer
    c.total_steps = 60
    c.model.path = ""
    c.model.hidden_size = 64
    c.model.num_layers = 2
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.intermediate_size = 128
    c.model.max_position_embeddings = 128
    c.model.remat = "none"
    c.data.use_chat_template = False
    c.data.max_prompt_length = 64  # "Spell this word backward (example: sun -> nus): cat" is 51 characters
    c.rollout.batch_prompts = 16
    c.rollout.group_size = 16
    c.rollout.max_new_tokens = 4
    c.optimizer.learning_rate = 3e-3
    c.kl.coef = 0.02
    c.kl.estimator = "k3+"  # as configs/tiny.py: k3's value, k2's gradient
    c.eval.every_steps = 60
    c.eval.num_prompts = 32
    c.eval.k = 16
    c.checkpoint.every_steps = 1000
    c.log.samples_every = 20
    return c
