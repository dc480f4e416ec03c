"""docs/coming_from_trl.md cannot rot: every field of ours its tables name exists in base_config, and every
value it gives one is accepted by the config's validation."""
import ast
import os
import re

import pytest

from jaxrl_llm import config as config_lib
from jaxrl_llm.validation import get_path

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "coming_from_trl.md")


def cited_fields() -> list[tuple[str, str, str | None]]:
    """(table row, field, value or None) for each `field` or `field=value` in the "ours" column."""
    out, column = [], None
    for line in open(DOC, encoding="utf-8"):
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:
            column = cells.index("ours")  # the header row of a table
            continue
        if set(cells[0]) <= set("-: "):
            continue
        for span in re.findall(r"`([^`]+)`", cells[column]):
            field, _, value = span.partition("=")
            out.append((cells[0], field, value or None))
    return out


def test_the_doc_cites_fields():
    fields = {f for _, f, _ in cited_fields()}
    assert {"rollout.group_size", "kl.coef", "loss.clip_high", "loss.aggregate", "train.epochs"} <= fields
    assert len(cited_fields()) > 60


@pytest.mark.parametrize("row,field,value", cited_fields())
def test_each_cited_field_exists_and_its_value_validates(row, field, value):
    base = config_lib.base_config()
    try:
        get_path(base, field)
    except (KeyError, AttributeError):
        pytest.fail(f"docs/coming_from_trl.md row {row!r} names {field!r}, which is not a field of base_config()")
    if value is not None:
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        config_lib.prepare(config_lib.from_dict({"data.task": "digit_puzzles", field: parsed}))
