"""configs/tiny_multiturn.py's guess_digit task as a verifiers.v1 environment: tests/verifiers_guess.py
(a taskset, an in-process harness and a rubric written with verifiers' public API), whose harness talks
to the policy through the trainer's OpenAI-compatible endpoint (envs/endpoint.py) via verifiers' own
interception; verifiers' rubric scores each episode and its score is the reward
(envs/verifiers_env.py, docs/environments.md "verifiers environments").

  pip install verifiers
  python -m jaxrl_llm.train --config=configs/tiny_verifiers.py --workdir=/tmp/tiny_verifiers

(from the repository root: env.kwargs.path="tests" is where the taskset module `verifiers_guess` is
imported from; an installed verifiers environment needs no path). The rubric's `found` is guess_digit's
reward, so for the same seed the run is configs/tiny_multiturn.py's (tests/test_envs_verifiers.py checks
two training steps metric for metric); each step adds verifiers' rollout machinery per episode.
"""
import os

from jaxrl_llm.config import from_file


def get_config(arg=None):
    c = from_file(os.path.join(os.path.dirname(__file__), "tiny_multiturn.py"), arg)
    c.env.name = "verifiers"
    c.env.kwargs.taskset = "verifiers_guess"  # the verifiers taskset id: a top-level module
    c.env.kwargs.path = "tests"  # imported from here (a local environment, not an installed package)
    c.env.kwargs.chat = False  # the built-in tiny model has no chat template: messages joined as text
    c.env.kwargs.timeout_s = 60.0  # an episode's own time (waiting for the model not counted)
    c.env.max_workers = 256  # threads waiting on the episodes: one per episode of a batch (16 prompts x 16)
    return c
