"""Multi-turn environments and tools, host side (docs/environments.md).

  Environment, StepResult            the interface: reset(row) -> (prompt, state); step(state, text)
  register_env, make_env             environments by name (`env.name`, `env.kwargs`), like rewards
  EpisodeBatch                       runs an environment for all rows of a batch (thread pool, errors, metrics)
  MalformedResult, EpisodeFailed,    a failed episode's named status (FAILURE_STATUSES, by exception type:
  failure_status, EnvironmentFailed    failure_status); most of a batch failing stops the run
  observation_ids, prompt_ids,       token-in-token-out: the ids to append after a model turn, never a
  turn_end_ids, Trajectory             re-encoding of what the model generated; the model/environment mask
  observation_text, prompts_ids,     the same for a whole batch: the texts, then one encoding call
  encode_all
  ToolEnvironment, parse_tool_calls  tool calling (Hermes/Qwen and Llama 3 formats), the sandboxed Python tool
  GuessDigitEnv                      `guess_digit`: the built-in task only feedback can solve
  `openenv` (envs/openenv_env.py)    an OpenEnv server's environment through openenv-core's client (by name)
  AgentEnvironment                   `agent`: agent(client, task) -> reward against an OpenAI-compatible
                                       endpoint over the policy (envs/endpoint.py)
  `verifiers` (envs/verifiers_env.py) a verifiers.v1 environment (taskset, harness, rubric) through that
                                       endpoint, its rubric's score the reward (by name)

Imports nothing heavy (config validation reads the registry); transformers and the code sandbox are
imported on first use.
"""
from jaxrl_llm.envs.base import (FAILURE_STATUSES, Environment, EpisodeFailed, MalformedResult, StepResult,
                                 failure_status)
from jaxrl_llm.envs.endpoint import AgentEnvironment
from jaxrl_llm.envs.guess import GuessDigitEnv, feedback_free_bound, feedback_optimum
from jaxrl_llm.envs.registry import check_env_config, check_env_name, make_env, register_env, registered_envs
from jaxrl_llm.envs.runner import EnvironmentFailed, EpisodeBatch, as_messages
from jaxrl_llm.envs.tokens import (TemplateDrift, Trajectory, encode_all, observation_ids, observation_text,
                                   prompt_ids, prompts_ids, stop_string_cut, turn_end_ids, turn_end_text)
from jaxrl_llm.envs.toolcalls import ToolCall, parse_tool_calls
from jaxrl_llm.envs.tools import ToolEnvironment, make_python_tool, tool_schema

__all__ = ["AgentEnvironment", "Environment", "EnvironmentFailed", "EpisodeBatch", "EpisodeFailed", "FAILURE_STATUSES",
           "GuessDigitEnv", "MalformedResult", "StepResult", "TemplateDrift", "ToolCall", "ToolEnvironment",
           "Trajectory", "as_messages", "check_env_config", "check_env_name", "encode_all", "failure_status",
           "feedback_free_bound", "feedback_optimum", "make_env", "make_python_tool", "observation_ids",
           "observation_text", "parse_tool_calls", "prompt_ids", "prompts_ids", "register_env", "registered_envs",
           "stop_string_cut", "tool_schema", "turn_end_ids", "turn_end_text"]
