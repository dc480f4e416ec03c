"""How a reward function is called: by keyword, with only the parameters it declares (TRL's convention).

A reward may declare any of the names the trainer provides -- `prompts`, `completions`, `completion_ids`,
`completion_lengths`, `truncated`, `max_completion_length`, `prompt_text`, `trainer_state` -- and any
column of the dataset by its name, plus `**kwargs` to receive every one of them:

    def accuracy(completions, solution, **kwargs): ...      # TRL style
    def brevity(completion_ids, **kw): ...
    def legacy(prompts, completions, **columns): ...         # the positional style, still accepted

The positional style `fn(p, c, **columns)` -- recognised by a first parameter that is not a name the call
provides -- gets the prompts and completions positionally, as before. The signature is read once per
function (`inspect.signature`, cached); each call only picks names from a dict.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

# What the trainer passes besides the dataset's columns (docs/rewards.md).
TRAINER_FIELDS = ("prompts", "completions", "completion_ids", "completion_lengths", "truncated",
                  "max_completion_length", "prompt_text", "trainer_state")
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclasses.dataclass(frozen=True)
class TrainerState:
    """The `trainer_state` a reward may declare, named as TRL's: `global_step` (steps done before this
    batch was sampled; for an evaluation, the step evaluated) and `max_steps` (config.total_steps)."""

    global_step: int
    max_steps: int


@dataclasses.dataclass(frozen=True)
class _Signature:
    readable: bool  # False for callables without an introspectable signature (some builtins)
    positional: tuple[str, ...]  # the positional parameters, in order
    keyword: tuple[str, ...]  # every parameter that can be passed by keyword, bound options excluded
    required: tuple[str, ...]  # parameters without a default
    var_keyword: bool  # has **kwargs
    positional_only: bool  # one of the first two parameters cannot be passed by keyword
    bound: frozenset[str] = frozenset()  # options bound with functools.partial: never overridden by an input


_CACHE: dict[int, tuple[Callable[..., Any], _Signature]] = {}


@dataclasses.dataclass(frozen=True)
class UserReward:
    """A reward function of the user's (a callable or `module:function`, not a registry name), with the
    form its completions take (`reward.completion_format`): `messages` = TRL's conversational form, one
    `[{"role": "assistant", "content": text}]` per row, with `prompts` the rows' conversations (the
    `prompt_column`'s message lists, else the user text as one user message); else strings. A TypeError
    or AttributeError raised inside it gets a hint naming the switch."""

    fn: Callable[..., Any]
    messages: bool
    prompt_column: str = ""

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def inputs(self, prompts: list, completions: list, columns: Mapping[str, Any]) -> tuple[list, list]:
        if not self.messages:
            return prompts, completions
        conversations = columns.get(self.prompt_column) if self.prompt_column else None
        if conversations is None or not all(isinstance(c, list) for c in conversations):
            conversations = [[{"role": "user", "content": p}] for p in prompts]
        return list(conversations), [[{"role": "assistant", "content": c}] for c in completions]

    def hint(self) -> str:
        if self.messages:
            return ("(completions are TRL's conversational form here, a list [{'role': 'assistant', 'content': "
                    "text}] per row: read completion[0]['content'], or set reward.completion_format=text for strings)")
        return ("(completions are strings here; reward.completion_format=messages passes TRL's conversational "
                "form, a list [{'role': 'assistant', 'content': text}] per row)")


def _signature(fn: Callable[..., Any]) -> _Signature:
    """The parameters of `fn`, read once (keyed by identity; the function is kept alive with its entry)."""
    if isinstance(fn, UserReward):
        return _signature(fn.fn)
    hit = _CACHE.get(id(fn))
    if hit is not None and hit[0] is fn:
        return hit[1]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        sig = _Signature(False, (), (), (), True, False)  # called the old way, with everything
    else:
        # Options bound with functools.partial (get_reward_fn's configuration) are not call inputs.
        bound = set(fn.keywords) if isinstance(fn, functools.partial) else set()
        params = [p for p in params if p.name not in bound]
        kinds = {p.name: p.kind for p in params}
        positional = tuple(p.name for p in params if p.kind in _POSITIONAL)
        sig = _Signature(
            readable=True, positional=positional,
            keyword=tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)),
            required=tuple(p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL,
                                                                                                p.VAR_KEYWORD)),
            var_keyword=any(p.kind == p.VAR_KEYWORD for p in params),
            positional_only=any(kinds[n] == inspect.Parameter.POSITIONAL_ONLY for n in positional[:2]),
            bound=frozenset(bound))
    _CACHE[id(fn)] = (fn, sig)
    return sig


def _legacy(sig: _Signature, available: Collection[str]) -> bool:
    """The positional style: the first two parameters take prompts and completions whatever their names.
    It is recognised by its first parameter: one the call does not provide (`p`, `_`, `samples`), or a
    positional-only one. A TRL-style function starts with a name it uses (`completions, solution` or
    `prompts, level`): an unknown name after it is an error, never a silent shift of the arguments."""
    if not sig.readable:
        return True
    head = sig.positional[:2]
    return len(head) == 2 and (sig.positional_only or head[0] not in available)


def missing_parameters(fn: Callable[..., Any], available: Collection[str]) -> list[str]:
    """The required parameters of `fn` that no input named in `available` fills (prompts and completions
    included in `available`); [] when the function can be called."""
    sig = _signature(fn)
    if not sig.readable:
        return []
    filled = set(sig.positional[:2]) if _legacy(sig, available) else set()
    return [n for n in sig.required if n not in filled and n not in available]


def call_reward(fn: Callable[..., Any], prompts: list[str], completions: list[str], columns: Mapping[str, Any]):
    """`fn` called with what it declares: by keyword (everything, with **kwargs), or positionally for the
    old `(prompts, completions, **columns)` style. A `UserReward` gets its form of the completions, and a
    TypeError raised inside it gets the hint naming `reward.completion_format`."""
    if not isinstance(fn, UserReward):
        return _call(fn, prompts, completions, columns)
    prompts, completions = fn.inputs(prompts, completions, columns)
    try:
        return _call(fn.fn, prompts, completions, columns)
    except (TypeError, AttributeError) as e:  # `c[0]["content"]` on a string, `c.strip()` on a list, ...
        if _depth(e.__traceback__) < 3:  # raised by the call itself (call_reward, _call), not by the body
            raise
        raise type(e)(f"{e} {fn.hint()}") from e


def _depth(tb) -> int:
    n = 0
    while tb is not None:
        n, tb = n + 1, tb.tb_next
    return n


def _call(fn, prompts, completions, columns):
    sig = _signature(fn)
    if sig.bound:  # a dataset column named like a configured option does not replace the option
        columns = {k: v for k, v in columns.items() if k not in sig.bound}
    values = {"prompts": prompts, "completions": completions, **columns}
    if _legacy(sig, values):
        rest = columns if sig.var_keyword else {
            k: v for k, v in columns.items() if k in sig.keyword and k not in sig.positional[:2]}
        return fn(prompts, completions, **rest)
    if sig.var_keyword:
        return fn(**values)
    return fn(**{k: values[k] for k in sig.keyword if k in values})


def check_reward_parameters(reward_fns, columns: Collection[str]) -> None:
    """Before anything compiles: every required parameter of every (name, fn, weight) reward is a trainer
    field or one of the dataset's `columns`; a one-line ValueError naming the function and parameter."""
    available = [*TRAINER_FIELDS, *(c for c in columns if c not in TRAINER_FIELDS)]
    for name, fn, _ in reward_fns:
        missing = missing_parameters(fn, available)
        if missing:
            raise ValueError(
                f"reward {name!r} declares the parameter {missing[0]!r}, which is neither a trainer field nor a "
                f"dataset column; available: {', '.join(available)} (give it a default, or add the column)")


def generation_fields(tokens, lengths, truncated, max_completion_length: int, trainer_state: TrainerState) -> dict:
    """The trainer fields of a sampled batch, as the rollout and the evaluation pass them: `completion_ids`
    (each row's tokens, the EOS included, as `completion_lengths` counts them), `completion_lengths`,
    `truncated`, `max_completion_length` and `trainer_state`."""
    return {"completion_ids": [row[:n].tolist() for row, n in zip(tokens, lengths)],
            "completion_lengths": lengths.tolist(), "truncated": truncated.tolist(),
            "max_completion_length": int(max_completion_length), "trainer_state": trainer_state}
