"""The schema's field names: a field of a config file, dict or command line that is not in `base_config()`
is refused with the nearest names (TRL's name for it first, jaxrl_llm/trl_names.py), never kept silently
while the run uses the default. `jaxrl_llm.config` and the command line call these; the values are
checked by jaxrl_llm/validation.py.
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping

import ml_collections

from jaxrl_llm.trl_names import trl_hint

# Sections whose keys are the user's (reward.kwargs.<fn>.<arg>, data.reasoning_gym.options.<task>.<field>).
FREE_FORM = ("reward.kwargs", "env.kwargs", "data.reasoning_gym.options")


def check_fields(c: ml_collections.ConfigDict, schema: ml_collections.ConfigDict, prefix: str = "") -> None:
    """Rejects any field of `c` that is not in `schema` (`base_config()`): a typo in a config file or dict
    would otherwise be kept silently while the run used the default. Names the nearest fields."""
    for key in c.keys():
        path = prefix + key
        if path in FREE_FORM:
            continue
        if key not in schema:
            raise ValueError(f"config.{path} is not a config field{suggest_fields(key, schema, prefix)}")
        sub, want = c[key], schema[key]
        if isinstance(want, ml_collections.ConfigDict):
            if not isinstance(sub, (ml_collections.ConfigDict, Mapping)):
                raise ValueError(f"config.{path} is a section of fields, got {sub!r}")
            check_fields(sub if isinstance(sub, ml_collections.ConfigDict) else ml_collections.ConfigDict(sub),
                         want, path + ".")
        elif isinstance(sub, ml_collections.ConfigDict):
            raise ValueError(f"config.{path} is a field, not a section")


def suggest_fields(key: str, schema: ml_collections.ConfigDict, prefix: str) -> str:
    trl = trl_hint(key)  # a TRL name first: difflib's nearest spelling is rarely the field meant
    if trl:
        return trl
    close = difflib.get_close_matches(key, list(schema.keys()), n=3, cutoff=0.6)
    if not close:
        return f" (fields of config{'.' + prefix[:-1] if prefix else ''}: {', '.join(sorted(schema.keys()))})"
    return "; did you mean " + " or ".join(f"{prefix}{k}" for k in close) + "?"


def unknown_field(path: str, schema: ml_collections.ConfigDict) -> str | None:
    """Why the dotted `path` of a command-line override is not a field of `schema`, in words naming
    the nearest fields (or the section's), or None when it is one (or lies in a free-form section)."""
    node, prefix = schema, ""
    parts = path.split(".")
    for i, key in enumerate(parts):
        if (prefix + key) in FREE_FORM:
            return None
        last = i == len(parts) - 1
        if key not in node and last and trl_hint(key):
            return f"unknown config field '{prefix}{key}'{trl_hint(key)}"
        if key not in node:
            names = [k for k in node.keys() if last or isinstance(node[k], ml_collections.ConfigDict)]
            close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
            if close:
                hint = "; did you mean " + " or ".join(f"'{prefix}{k}'" for k in close) + "?"
            else:
                where = f"fields of {prefix[:-1]}" if prefix else ("top-level fields" if last else "sections")
                hint = f" ({'no such section; ' if not last else ''}{where}: {', '.join(sorted(names))})"
            return f"unknown config field '{prefix}{key}'{hint}"
        if not last and not isinstance(node[key], ml_collections.ConfigDict):
            return f"config field '{prefix}{key}' is a value, not a section: no field '{path}'"
        node, prefix = node[key], prefix + key + "."
    if isinstance(node, ml_collections.ConfigDict) and path not in FREE_FORM:
        return f"'{path}' is a section, not a field (its fields: {', '.join(sorted(node.keys()))})"
    return None
