"""configs/tiny_multiturn.py's guess_digit task written as a verifiers.v1 environment with verifiers' public
API (taskset, harness, rubric), for env.name=verifiers (tests/test_envs_verifiers.py,
configs/tiny_verifiers.py). A verifiers taskset id is a top-level module: this one is `verifiers_guess`,
imported from tests/ (env.kwargs.path="tests").

- `GuessData`: the task's data, `prompt` and the row's `hidden` digit (and `fault`, for the fault tests).
- `GuessHarness`: the agent, an in-process loop (no program to install): every model call goes through
  verifiers' interception endpoint with the rollout's secret, as a harness must. It asks for a guess,
  answers '<', '>' or '?' as envs/guess.py does, and stops at the right guess or when the model's
  endpoint ends the episode (`finish_reason: "length"`).
- `GuessTask`'s rubric: `found` (1 when an assistant turn is the hidden digit, as guess_digit's reward)
  and `digits` (the fraction of the turns that are one digit; weight 0 unless the taskset config plugs
  another: taskset_args={"task": {"rewards": {"digits": {"weight": 0.25}}}}); a metric `turns`.
"""
from __future__ import annotations

import asyncio
import weakref

import verifiers.v1 as vf
from openai import AsyncOpenAI

_CLIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> AsyncOpenAI


def _is_guess(text: str) -> bool:
    return len(text) == 1 and text in "0123456789"


class GuessData(vf.TaskData):
    hidden: int = 0
    fault: str = ""  # the fault tests: "harness_raises", "harness_hangs", "scoring_raises"


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def found(self, trace) -> float:
        return float(any(_is_guess(m.content or "") and int(m.content) == self.data.hidden
                         for m in trace.assistant_messages))

    @vf.reward(weight=0.0)
    async def digits(self, trace) -> float:
        if self.data.fault == "scoring_raises":
            raise RuntimeError("the rubric cannot read this trace")
        turns = trace.assistant_messages
        return sum(_is_guess(m.content or "") for m in turns) / max(len(turns), 1)

    @vf.metric
    async def turns(self, trace) -> float:
        return float(len(trace.assistant_messages))


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for hidden in range(10):
            yield GuessTask(GuessData(prompt="guess:", hidden=hidden), self.config.task)


class GuessHarnessConfig(vf.HarnessConfig):
    pass


class GuessHarness(vf.Harness[GuessHarnessConfig]):
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs):
        if data.fault == "harness_raises":
            raise RuntimeError("the harness broke")
        loop = asyncio.get_running_loop()
        if loop not in _CLIENTS:  # one HTTP client per loop: building one costs about 0.2 s
            _CLIENTS[loop] = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        client = _CLIENTS[loop].with_options(base_url=endpoint, api_key=secret)
        messages = [{"role": "user", "content": data.prompt}]
        while True:
            if data.fault == "harness_hangs" and len(messages) > 1:
                await asyncio.sleep(3600)
            choice = (await client.chat.completions.create(model=ctx.model, messages=messages)).choices[0]
            text = choice.message.content or ""
            if choice.finish_reason == "length" or (_is_guess(text) and int(text) == data.hidden):
                break
            reply = ("<" if data.hidden < int(text) else ">") if _is_guess(text) else "?"
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": reply}]
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["GuessHarness", "GuessTaskset"]
