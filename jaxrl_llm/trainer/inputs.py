"""The Python API's inputs (`Trainer(config, rewards=..., dataset=...)`) recorded in the config: rewards by
registry name or `module:qualname` (their weights from the list, else from `reward.weights`), the dataset
by a fingerprint, so that config.json describes the run and a rerun with other inputs is refused by the
workdir check."""
from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxrl_llm import config as config_lib
from jaxrl_llm.trainer import setup


def python_inputs(config, rewards: Sequence[Any] | Callable[..., Any] | str | None, dataset: Any):
    """(the prepared config, reward callables, dataset rows or None)."""
    from jaxrl_llm.data.loading import as_dataset  # `datasets` only when the run starts

    c = config_lib.from_dict(config) if isinstance(config, Mapping) else copy.deepcopy(config)
    callables: list[Callable[..., Any]] = []
    if rewards is not None:
        names, weights = [], []
        for r in reward_list(rewards):
            fn, weight = r if isinstance(r, tuple) else (r, None)
            if callable(fn) and not isinstance(fn, str):
                callables.append(fn)
                fn = setup.reward_name(fn)
            names.append(str(fn))
            weights.append(weight)
        c.reward.functions, c.reward.weights = ",".join(names), _weights(c.reward.weights, weights)
    rows = None
    if dataset is not None:
        if c.data.path or c.data.task or c.data.get("source"):
            raise ValueError("pass the prompts either as dataset= or as config.data.path/data.task, not both "
                             "(nor with data.source)")
        rows = as_dataset(dataset)
        c.data.path = f"<in-memory dataset {rows._fingerprint}>"
    return config_lib.prepare(c), callables, rows


def reward_list(rewards) -> list[Any]:
    """`rewards=` as a list: one callable or name (as TRL's `reward_funcs` takes) becomes a list of one."""
    if callable(rewards) or isinstance(rewards, str):
        return [rewards]
    if isinstance(rewards, Sequence) and not isinstance(rewards, tuple | list):
        rewards = list(rewards)
    if not isinstance(rewards, list | tuple) or not rewards:
        raise ValueError(f"Trainer(rewards=...) takes a reward function, a name or a non-empty list of them "
                         f"(each optionally as (reward, weight)), got {rewards!r:.80}")
    return list(rewards)


def _weights(config_weights: str, given: list[float | None]) -> str:
    """reward.weights for the rewards of the list: the list's weights (1.0 where one is not given), or,
    when the list gives none, the config's own `reward.weights`; a conflict between the two is an error."""
    configured = [w.strip() for w in config_weights.split(",") if w.strip()]
    if all(w is None for w in given):
        if configured and len(configured) != len(given):
            raise ValueError(f"reward.weights {config_weights!r} has {len(configured)} entries for the {len(given)} "
                             "rewards given as Trainer(rewards=...); give one weight per reward, or (reward, weight)")
        return ",".join(configured)
    out = ",".join(str(float(1.0 if w is None else w)) for w in given)
    try:
        same = [float(w) for w in configured] == [float(w) for w in out.split(",")]
    except ValueError:
        same = False
    if configured and not same:
        raise ValueError(f"reward.weights {config_weights!r} conflicts with the weights of Trainer(rewards=...) "
                         f"({out}); give the weights in one place")
    return out
