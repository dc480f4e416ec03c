"""Reward registry, spec resolution and the weighted combination of reward functions.

A reward function returns one value per row, `Sequence[float | None]` of length N, and is called by
keyword with the parameters it declares (TRL's convention, `rewards/calling.py`): `prompts`,
`completions`, the trainer's fields (`completion_ids`, `completion_lengths`, `truncated`,
`max_completion_length`, `prompt_text`, `trainer_state`) and every dataset column by its name, lists
aligned with the rows; `**kwargs` receives them all. The positional style `fn(prompts, completions,
**columns)` keeps working. `None` means "not applicable". A function may return a `RewardScores` (a list
with a `metrics` dict) to report extra metrics.

`compute_rewards` calls every function once on the whole batch and combines them:
score_i = Σ_f w_f · r_f,i over the functions whose value on row i is not None.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import logging
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.rewards.calling import call_reward
from jaxrl_llm.rewards.returns import RewardError, RewardScores, extra_metrics, to_values  # noqa: F401 (re-exported)

RewardFn = Callable[..., Sequence[Any]]

logger = logging.getLogger(__name__)
# name -> (object, is_factory). A factory takes configuration kwargs and returns a reward function.
_REGISTRY: dict[str, tuple[Callable[..., Any], bool]] = {}
_WARNED_ALL_NONE: set[str] = set()  # reward names already warned about (once per process)
_FACTORY_ATTR = "__jaxrl_reward_factory__"
# Built-ins whose module is heavy (JAX models): imported, hence registered, on first use by name.
_LAZY_BUILTINS = {"reward_model": "jaxrl_llm.rewards.model"}
_RESERVED_COLUMNS = ("prompts", "completions")


def register_reward(name: str, *, factory: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a reward function (or, with `factory=True`, a function returning one).

    Registered names are what configs refer to, e.g. `get_reward_fn("math_answer")`. Re-registering
    the same object under the same name is a no-op (module reloads); another object is an error.
    """
    if not isinstance(name, str) or not name or any(c in name for c in ":/ ") or name != name.strip():
        raise ValueError(f"reward name must be a non-empty string without ':', '/' or spaces, got {name!r}")

    def decorator(obj: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(obj):
            raise ValueError(f"register_reward({name!r}) must decorate a callable, got {type(obj).__name__}")
        previous = _REGISTRY.get(name)
        if previous is not None and previous[0] is not obj:
            raise ValueError(f"reward name {name!r} is already registered to {_describe(previous[0])}")
        _REGISTRY[name] = (obj, factory)
        if factory:
            # Lets `module:function` import paths know the target is a factory, not a reward.
            setattr(obj, _FACTORY_ATTR, True)
        return obj

    return decorator


def registered_rewards() -> list[str]:
    """Sorted names accepted by `get_reward_fn`."""
    return sorted(set(_REGISTRY) | set(_LAZY_BUILTINS))


def get_reward_fn(spec: str | Callable[..., Any], **kwargs: Any) -> tuple[str, RewardFn]:
    """Resolves `spec` to `(name, reward_fn)`.

    spec: a registered name (`math_answer`, `format`, `overlong`, `length_penalty`, `code_tests`, ...),
      an import path `package.module:function` (the attribute may be dotted, `module:obj.attr`), or
      the reward function (or factory) itself.
    kwargs: configuration. A factory is called with them; a plain reward function gets them bound as
      keyword arguments (functools.partial). Either way they must name parameters the target declares.
    The name is the registry name, the attribute part of an import path, or the callable's __name__.
    """
    if callable(spec) and not isinstance(spec, str):
        name = getattr(spec, "__name__", type(spec).__name__)
        obj, is_factory = spec, bool(getattr(spec, _FACTORY_ATTR, False))
    elif not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"reward spec must be a registry name, 'module:function' or a callable, got {spec!r}")
    elif ":" in spec.strip():
        spec = spec.strip()
        name = spec.split(":", 1)[1]
        obj = _import_path(spec)
        is_factory = bool(getattr(obj, _FACTORY_ATTR, False))
    else:
        spec = spec.strip()
        if spec not in _REGISTRY and spec in _LAZY_BUILTINS:
            _import_path(f"{_LAZY_BUILTINS[spec]}:{spec}")  # registers it
        if spec not in _REGISTRY:
            raise ValueError(
                f"unknown reward {spec!r}; registered rewards: {', '.join(registered_rewards())} "
                "(or use an import path 'package.module:function')"
            )
        name = spec
        obj, is_factory = _REGISTRY[spec]
    if is_factory:
        _check_kwargs(name, obj, kwargs)
        try:
            inspect.signature(obj).bind(**kwargs)
        except TypeError as e:  # e.g. a required option left out of the config
            raise ValueError(f"reward {name!r}: {e}") from e
        except ValueError:
            pass  # no signature to check against: let the call decide
        fn = obj(**kwargs)
        if not callable(fn):
            raise ValueError(f"reward factory {name!r} returned {type(fn).__name__}, expected a callable")
        return name, fn
    if not kwargs:
        return name, obj
    _check_kwargs(name, obj, kwargs)
    return name, _bind(obj, kwargs)


@dataclasses.dataclass
class RewardBatch:
    """What `score_rewards` returns: scores (N,) float32, the weighted sum; metrics; components
    {name: (N,) float32 weighted values, 0 where None}; steps: per row, the (token index, weighted
    reward) steps of process rewards, sorted by index ([] for rows without any); present: {name: (N,)
    bool, False where the function returned None}."""

    scores: np.ndarray
    metrics: dict[str, float]
    components: dict[str, np.ndarray]
    steps: list[list[tuple[int, float]]]
    present: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def compute_rewards(
    reward_fns: Sequence[tuple[str, RewardFn, float]],
    prompts: Sequence[str],
    completions: Sequence[str],
    columns: Mapping[str, Any] | None = None,
    *,
    on_error: str = "raise",
) -> tuple[np.ndarray, dict[str, float]]:
    """(scores, metrics) of `score_rewards`."""
    batch = score_rewards(reward_fns, prompts, completions, columns, on_error=on_error)
    return batch.scores, batch.metrics


def score_rewards(
    reward_fns: Sequence[tuple[str, RewardFn, float]],
    prompts: Sequence[str],
    completions: Sequence[str],
    columns: Mapping[str, Any] | None = None,
    *,
    on_error: str = "raise",
) -> RewardBatch:
    """Calls each reward function on the batch and returns the weighted sum, its parts and metrics.

    reward_fns: (name, fn, weight) triples; names must be unique (they key the metrics).
    prompts, completions: N strings each.
    columns: the other inputs by name (dataset columns, trainer fields); each fn receives those it
      declares (all of them with **kwargs; rewards/calling.py). Sequences (list, tuple, 1-D array) must
      have N entries and are row-aligned; scalars (e.g. `max_completion_length`) are passed unchanged.
    on_error: 'raise' -> a fn that raises is re-run row by row and the error names the fn and the
      first failing row; 'zero' -> the failing rows score 0 and are counted in `reward/<name>/errors`.
      Invalid returns (wrong length, non-numeric, NaN/inf, float32 overflow) always raise: they are
      bugs in the function, and zeroing them would silently train on garbage.
    Returns scores (N,) float32 and metrics `reward/<name>/mean` (over non-None rows; omitted when
      every row is None), `reward/<name>/none_frac`, `reward/<name>/errors` (rows zeroed) and the
      function's own `reward/<name>/<key>` when it returns a `RewardScores` on the whole batch (a
      row-by-row retry reports none: a per-row metric has no batch meaning).
    Process rewards: a function may return, for a row, a list of (token index, reward) steps instead of
      a number; the row's value is then the sum of its steps, and the steps are kept in `steps`.
    """
    if on_error not in ("raise", "zero"):
        raise ValueError(f"on_error must be 'raise' or 'zero', got {on_error!r}")
    n = _check_texts(prompts, completions)
    columns = _check_columns(columns, n)
    names = [_check_triple(i, t) for i, t in enumerate(reward_fns)]
    duplicates = sorted({x for x in names if names.count(x) > 1})
    if duplicates:
        raise ValueError(f"reward_fns names must be unique (they key the metrics), repeated: {duplicates}")

    prompts, completions = list(prompts), list(completions)
    scores = np.zeros((n,), np.float32)
    metrics: dict[str, float] = {}
    components: dict[str, np.ndarray] = {}
    present_of: dict[str, np.ndarray] = {}
    steps: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for name, fn, weight in reward_fns:
        values, present, errors, extra, fn_steps = _evaluate(name, fn, prompts, completions, columns, on_error)
        # float32 from the first array: the weight is cast so the product never widens to float64.
        with np.errstate(over="ignore"):  # overflow is reported below, once, as an error
            components[name] = np.where(present, np.float32(weight) * values, np.float32(0.0))
            scores += components[name]
        present_of[name] = present
        for i, row_steps in enumerate(fn_steps):
            steps[i].extend((t, float(np.float32(weight) * np.float32(r))) for t, r in row_steps)
        count = int(present.sum())
        if not count and name not in _WARNED_ALL_NONE:  # once per function: a batch it has no opinion on is legal
            _WARNED_ALL_NONE.add(name)
            logger.warning("reward %r returned None for every row of a batch: it scores nothing there "
                           "(reward/%s/mean is not logged; reward/%s/none_frac is 1)", name, name, name)
        if count:
            metrics[f"reward/{name}/mean"] = float(values[present].astype(np.float64).mean())
        metrics[f"reward/{name}/none_frac"] = float(n - count) / n
        metrics[f"reward/{name}/errors"] = float(errors)
        metrics.update({f"reward/{name}/{key}": value for key, value in extra.items()})
    if not np.all(np.isfinite(scores)):
        raise ValueError("the weighted sum of rewards overflows float32; check the reward weights")
    return RewardBatch(scores, metrics, components, [sorted(row) for row in steps], present_of)


# ----------------------------------------------------------------------------- evaluation


def _evaluate(name, fn, prompts, completions, columns, on_error):
    """Returns values (N,) float32, present (N,) bool, number of rows zeroed by errors, extra metrics,
    process steps per row."""
    n = len(prompts)
    try:
        out = call_reward(fn, prompts, completions, columns)
    except Exception as batch_error:  # noqa: BLE001 - any user error is reported with its row
        values, present, errors, steps = _evaluate_rows(name, fn, prompts, completions, columns, on_error, batch_error)
        return values, present, errors, {}, steps
    values, present, steps = to_values(name, out, n)
    return values, present, 0, extra_metrics(name, out), steps


def _evaluate_rows(name, fn, prompts, completions, columns, on_error, batch_error):
    """Re-runs `fn` one row at a time to find (and, with on_error='zero', zero) the failing rows."""
    n = len(prompts)
    values = np.zeros((n,), np.float32)
    present = np.zeros((n,), bool)
    steps: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    errors = 0
    for i in range(n):
        row_columns = {k: (v[i : i + 1] if _is_sequence(v) else v) for k, v in columns.items()}
        try:
            out = call_reward(fn, prompts[i : i + 1], completions[i : i + 1], row_columns)
        except Exception as row_error:  # noqa: BLE001
            if on_error == "raise":
                raise RewardError(
                    f"reward {name!r} raised on row {i}: {_one_line(row_error)}", reward=name, row=i
                ) from row_error
            errors += 1
            present[i] = True  # the row "gets 0": it counts in the mean, like any other 0
            continue
        row_values, row_present, row_steps = to_values(name, out, 1, row_offset=i)
        values[i], present[i], steps[i] = row_values[0], row_present[0], row_steps[0]
    if errors == 0 and on_error == "raise":
        raise RewardError(
            f"reward {name!r} raised on the batch of {n} rows but on no single row: {_one_line(batch_error)}",
            reward=name,
        ) from batch_error
    return values, present, errors, steps


# ----------------------------------------------------------------------------- validation


def _check_texts(prompts, completions) -> int:
    for arg, texts in (("prompts", prompts), ("completions", completions)):
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise ValueError(f"{arg} must be a list of strings, got {type(texts).__name__}")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ValueError(f"{arg}[{i}] must be a string, got {type(t).__name__}")
    if len(prompts) != len(completions):
        raise ValueError(f"prompts has {len(prompts)} rows but completions has {len(completions)}")
    if not prompts:
        raise ValueError("prompts is empty: there is nothing to score")
    return len(prompts)


def _check_columns(columns, n: int) -> dict[str, Any]:
    columns = dict(columns or {})
    for key, value in columns.items():
        if key in _RESERVED_COLUMNS:
            raise ValueError(f"columns must not contain {key!r}: it is passed positionally")
        if _is_sequence(value):
            if isinstance(value, np.ndarray) and value.ndim != 1:
                raise ValueError(f"column {key!r} must be 1-D with {n} rows, got shape {value.shape}")
            if len(value) != n:
                raise ValueError(f"column {key!r} has {len(value)} rows, expected {n}")
    return columns


def _check_triple(i: int, triple: Any) -> str:
    if not isinstance(triple, (tuple, list)) or len(triple) != 3:
        raise ValueError(f"reward_fns[{i}] must be a (name, fn, weight) triple, got {triple!r:.80}")
    name, fn, weight = triple
    if not isinstance(name, str) or not name:
        raise ValueError(f"reward_fns[{i}] name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise ValueError(f"reward_fns[{i}] ({name!r}) fn is not callable: {type(fn).__name__}")
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
        raise ValueError(f"reward_fns[{i}] ({name!r}) weight must be a finite number, got {weight!r}")
    return name


def _check_kwargs(name: str, obj: Callable[..., Any], kwargs: Mapping[str, Any]) -> None:
    """Config kwargs must name declared parameters: a typo must not vanish into **kwargs."""
    if not kwargs:
        return
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return  # builtins without a signature: let the call decide
    accepted = [
        p
        for p, v in params.items()
        if v.kind in (v.KEYWORD_ONLY, v.POSITIONAL_OR_KEYWORD) and p not in _RESERVED_COLUMNS
    ]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ValueError(
            f"reward {name!r} got unknown option(s) {unknown}; accepted: {', '.join(accepted) or 'none'}"
        )


def _bind(fn: Callable[..., Any], config: Mapping[str, Any]) -> RewardFn:
    # A partial keeps the function's signature (less the bound options), which decides how it is called.
    bound = functools.partial(fn, **config)
    bound.__name__ = getattr(fn, "__name__", "reward")
    bound.__doc__ = fn.__doc__
    return bound


def _import_path(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"reward import path must look like 'package.module:function', got {spec!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - import errors of user modules come in every flavour
        raise ValueError(f"cannot import reward {spec!r}: {_one_line(e)}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ValueError(f"cannot import reward {spec!r}: {module_name!r} has no attribute {attr!r}") from e
    if not callable(obj):
        raise ValueError(f"reward {spec!r} is a {type(obj).__name__}, not a callable")
    return obj


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _describe(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
