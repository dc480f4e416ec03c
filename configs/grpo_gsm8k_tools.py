"""GRPO on GSM8K with a Python tool: Qwen2.5-Instruct solves math word problems in multi-turn episodes,
calling a sandboxed `python(code)` tool (Hermes/Qwen `<tool_call>` format) whose output comes back as a
tool message, until it answers without a call (docs/environments.md).

  python -m jaxrl_llm.train --config=configs/grpo_gsm8k_tools.py --workdir=/tmp/gsm8k_tools

Reward: the `math_answer` verifier on the episode's last model turn (its final answer), plus the
environment's turn rewards (none for `tools`). Everything else is configs/grpo_gsm8k.py's; the episode's
budget (`rollout.max_new_tokens`) covers the model's turns and the tool results together.
`arg` may name another group algorithm, as in configs/grpo_gsm8k.py.
"""
import os

from jaxrl_llm.config import from_file

SYSTEM_PROMPT = ("Please reason step by step. You may run Python with the `python` tool to compute; print the "
                 "values you need. When you know the answer, reply without a tool call and put your final "
                 "answer within \\boxed{}.")



def get_config(arg=None):
    c = from_file(os.path.join(os.path.dirname(__file__), "grpo_gsm8k.py"), arg)
    c.model.path = "Qwen/Qwen2.5-1.5B-Instruct"  # its chat template renders tools; 0.5B works too
    c.data.system_prompt = SYSTEM_PROMPT

    c.env.name = "tools"
    c.env.kwargs.python = True  # the sandboxed python(code) tool (jaxrl_llm/rewards/code.py's sandbox)
    c.env.kwargs.fmt = "hermes"  # Qwen2.5's <tool_call>{json}</tool_call>
    c.env.kwargs.prompt_column = "question"
    c.env.kwargs.system_prompt = SYSTEM_PROMPT
    c.env.kwargs.python_timeout_s = 5.0
    c.env.kwargs.max_output_chars = 1000
    c.env.max_turns = 4
    c.env.max_turn_tokens = 384
    c.rollout.max_new_tokens = 1024  # the whole episode: turns and tool results

    c.reward.functions = "math_answer"  # on the last model turn
    return c
