"""The built-in multi-turn task: the tiny random model guesses a hidden digit from '<'/'>' replies.

Only feedback solves it (jaxrl_llm/envs/guess.py): the prompt is the same for every row, so a policy
that ignores the replies finds the digit in K = env.max_turns guesses with probability at most K/10
(0.4 here), while a binary search on the replies always finds it (1.0). Each model turn is one token
(a digit), each reply one token; rollout.max_new_tokens = 2K bounds the whole episode.

  python -m jaxrl_llm.train --config=configs/tiny_multiturn.py --workdir=/tmp/tiny_mt

From random init the default run (GRPO, 300 steps, about a minute on 2 CPU cores) goes from reward 0.043
to 0.661 (the last 30 steps) and held-out pass@1 from 0.040 to 0.721: past the feedback-free bound 0.4,
hence using the replies, and past the bar 0.521 (initial + half the headroom to 1) at step 193. The curve
is in docs/environments.md.
"""
import os

from jaxrl_llm.config import from_file


def get_config(arg=None):
    c = from_file(os.path.join(os.path.dirname(__file__), "tiny.py"), arg)
    c.total_steps = 300
    c.data.task = "guess_digit"
    c.data.prompt_column = "prompt"
    c.data.answer_column = "answer"
    c.data.extra_columns = ("hidden",)
    c.data.max_prompt_length = 8

    c.env.name = "guess_digit"
    c.env.max_turns = 4
    c.env.max_turn_tokens = 1  # one digit per turn
    c.reward.functions = ""  # the environment's turn rewards (1 for the right guess) are the score

    c.rollout.max_new_tokens = 2 * c.env.max_turns  # a guess and a reply per turn
    # configs/tiny.py's 16 prompts x 16 episodes and KL 0.02 (an entropy floor for a random-init policy);
    # a larger step than its 1e-3 (measured over steps 281-300: 1e-3 0.60, 2e-3 0.64, 3e-3 0.65).
    c.optimizer.learning_rate = 2e-3
    # configs/tiny.py's held-out evaluation every 100 steps (128 rows x 16 episodes of the test split), here
    # as episodes under the environment: pass@1 is the held-out rate of finding the digit.
    return c
