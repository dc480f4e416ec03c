"""configs/tiny_multiturn.py's guess_digit task played by an agent over the OpenAI-compatible endpoint:
`jaxrl_llm.envs.agents:guess_digit(client, task)` runs in a thread per episode and talks to the policy
through an `openai.OpenAI` client pointed at the trainer's local endpoint (envs/endpoint.py,
docs/environments.md "Agents over the endpoint"). The episodes are the in-process environment's, token
for token; only the path differs.

  pip install openai
  python -m jaxrl_llm.train --config=configs/tiny_agent.py --workdir=/tmp/tiny_agent
"""
import os

from jaxrl_llm.config import from_file


def get_config(arg=None):
    c = from_file(os.path.join(os.path.dirname(__file__), "tiny_multiturn.py"), arg)
    c.env.name = "agent"
    c.env.kwargs.agent = "jaxrl_llm.envs.agents:guess_digit"
    c.env.kwargs.chat = False  # the built-in tiny model has no chat template: messages joined as text
    c.env.kwargs.timeout_s = 30.0  # the agent's own time per episode (waiting for the model not counted)
    c.env.max_workers = 256  # threads waiting on the agents: one per episode of a batch (16 prompts x 16)
    c.env.max_failed_frac = 0.5
    return c
