"""Dotted-key overrides of a ConfigDict, for the tests and their worker scripts: {"rollout.group_size": 4}.

ml_collections' `update_from_flattened_dict` refuses a top-level key ("total_steps"); this takes both."""


def apply_overrides(c, overrides: dict):
    """Sets each dotted key of `overrides` on the ConfigDict `c` (type-checked by ConfigDict); returns c."""
    for key, value in overrides.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c
