"""Environments by name, like rewards: `env.name` is a registered name or an import path
`package.module:Class` (a class or a factory function), built with `env.kwargs`.

This module imports nothing heavy, so config validation can check names (`check_env_name`) before
anything is loaded: the built-ins are listed by import path and imported on first use.
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

_REGISTRY: dict[str, Callable[..., Any]] = {}
# Built-ins, imported (which registers them) when first asked for by name.
_BUILTINS = {
    "guess_digit": "jaxrl_llm.envs.guess:GuessDigitEnv",
    "tools": "jaxrl_llm.envs.tools:ToolEnvironment",
    "openenv": "jaxrl_llm.envs.openenv_env:OpenEnvEnvironment",
    "agent": "jaxrl_llm.envs.endpoint:AgentEnvironment",
    "verifiers": "jaxrl_llm.envs.verifiers_env:VerifiersEnvironment",
}
# Built-ins whose config can be checked before anything is loaded: name -> 'module:function(kwargs)'
# raising a one-line ValueError (a missing package, a missing option).
_CONFIG_CHECKS = {
    "openenv": "jaxrl_llm.envs.openenv_env:check_config",
    "verifiers": "jaxrl_llm.envs.verifiers_env:check_config",
}


def register_env(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Class decorator making an environment (or a factory of one) available as `env.name=<name>`."""
    if not isinstance(name, str) or not name or any(c in name for c in ":/ "):
        raise ValueError(f"environment name must be a non-empty string without ':', '/' or spaces, got {name!r}")

    def decorator(obj):
        previous = _REGISTRY.get(name)
        if previous is not None and previous is not obj:
            raise ValueError(f"environment name {name!r} is already registered to {previous.__qualname__}")
        _REGISTRY[name] = obj
        return obj

    return decorator


def registered_envs() -> list[str]:
    """Sorted names accepted by `make_env`."""
    return sorted(set(_REGISTRY) | set(_BUILTINS))


def check_env_name(name: str) -> None:
    """ValueError naming the field unless `name` is '' (off), a registered name or 'module:attr'."""
    if not isinstance(name, str):
        raise ValueError(f"config.env.name must be a string, got {name!r}")
    if not name or name in _REGISTRY or name in _BUILTINS:
        return
    module, _, attr = name.partition(":")
    if not (module and attr):
        raise ValueError(f"config.env.name {name!r} is unknown; registered environments: "
                         f"{', '.join(registered_envs())} (or an import path 'package.module:Class')")


def check_env_config(name: str, kwargs: Mapping[str, Any] | None = None) -> None:
    """The start-up check of a built-in environment's `env.kwargs` and packages (one-line ValueError)."""
    check_env_name(name)
    if name in _CONFIG_CHECKS:
        module, _, attr = _CONFIG_CHECKS[name].partition(":")
        getattr(importlib.import_module(module), attr)(dict(kwargs or {}))


def make_env(name: str, kwargs: Mapping[str, Any] | None = None):
    """The environment `name` built with `kwargs`; one-line ValueErrors for unknown names or options."""
    check_env_name(name)
    if not name:
        raise ValueError("config.env.name is empty: no environment to build")
    if name in _CONFIG_CHECKS:
        check_env_config(name, kwargs)
    if ":" in name:
        target = import_object(name)
    else:
        if name not in _REGISTRY:
            import_object(_BUILTINS[name])  # registers it
        target = _REGISTRY[name]
    kwargs = dict(kwargs or {})
    try:
        inspect.signature(target).bind(**kwargs)
    except TypeError as e:
        raise ValueError(f"config.env.kwargs do not fit environment {name!r}: {e}") from None
    except ValueError:
        pass  # no signature to check (a builtin): the call decides
    env = target(**kwargs)
    if not (callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))):
        raise ValueError(f"environment {name!r} built a {type(env).__name__}, which has no reset/step methods")
    return env


def import_object(spec: str):
    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # noqa: BLE001 - user modules fail in every way
        raise ValueError(f"cannot import environment {spec!r}: {type(e).__name__}: {e}") from None
    if not callable(obj):
        raise ValueError(f"environment {spec!r} is a {type(obj).__name__}, not a class or factory")
    return obj
