"""The sandbox's limits seen from the trainer: code extraction in linear time, forged refusals and
output floods that cost the judge nothing, honest programs that exit(), more than 1,024 open fds,
and statuses that say which limit was hit and who ended the process. Attacks run beside an honest
sibling in the same batch."""

import random
import re
import time

import pytest

from jaxrl_llm.rewards.code import extract_code

# The extraction regexes before they were made linear: the reference for normal inputs.
_OLD_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)
_OLD_OPEN = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n", re.I)


def old_extract_code(completion):
    blocks = _OLD_FENCE.findall(completion)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if python:
        return python[-1]
    untagged = [body for lang, body in blocks if not lang]
    if untagged:
        return untagged[-1]
    opened = list(_OLD_OPEN.finditer(completion))
    if opened:
        return completion[opened[-1].end() :]
    _, think, after = completion.rpartition("</think>")
    return after if think else completion


_PIECES = ["```", "```python", "```Python3", "```py", "``` python extra", "```bash", "```c++", "```\t", "``", "`",
           "\n", "\n", "\n", " ", "\t", "x = 1", "print(2)", "Here is the code:", "</think>", "<think>", "py"]


def test_extract_code_is_the_old_regex_on_normal_completions():
    rng = random.Random(0)
    completions = ["".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 40))) for _ in range(3000)]
    completions += ["Sure.\n```python\ndef f():\n    return 1\n```\nTest:\n```\nf()\n```",
                    "<think>hmm ```python\nx``` no</think>\n```py  \nx = 2\n```", "```python\r\nx = 3\r\n```"]
    for completion in completions:
        assert extract_code(completion) == old_extract_code(completion), repr(completion)


@pytest.mark.parametrize("unit", ["```", "````\n", "```\n", "```python", "```python\n", "``` \t", "```x\n```\n``"])
def test_extract_code_is_linear_on_a_megabyte_of_fences(unit):
    completion = unit * ((1 << 20) // len(unit))
    start = time.monotonic()
    extract_code(completion)
    assert time.monotonic() - start < 1.0  # linear: ~0.1 s; the old regex took hours on some of these
    assert extract_code(unit * 300) == old_extract_code(unit * 300)  # the same answer where the old one is quick
