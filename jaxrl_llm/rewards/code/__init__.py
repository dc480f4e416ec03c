"""`code_tests` reward: a completion's Python judged against tests, the code run in a sandbox.

The solution runs in a sandbox (`launch`: bubblewrap namespaces, seccomp, a uid of its own, rlimits,
an audit hook; fewer layers where bubblewrap is missing, see `sandbox_layers()`). The judge
(`judge`), outside it, sends only inputs (`cases`), receives only values of builtin types (`values`)
and compares them itself, with Python's semantics, or lets the dataset's test code compare them in
a checker process of its own (`checker`), where the solution's functions are proxies; so nothing
the solution does inside can forge a pass. docs/rewards.md has the formats and the threat model.

Modules: `extract` (the code in a completion), `cases` (test formats, assert parsing), `script`
(other test code as units and tests), `values` (wire format of real Python values, decoding budget,
Python's comparison), `runner` (the program inside the sandbox), `audit` (its audit hook), `seccomp`
(its system-call filter), `launch` (starting it), `session` (one sandbox from the judge's side),
`checker` (the test code's process), `testforms` (its pytest and unittest runners), `judge`
(scoring), `api` (entry points).
"""

from jaxrl_llm.rewards.code.api import code_tests, run_code_tests, run_sandboxed, sandbox_layers
from jaxrl_llm.rewards.code.cases import Case, parse_tests
from jaxrl_llm.rewards.code.extract import extract_code
from jaxrl_llm.rewards.code.judge import (
    DEFAULT_DISK_MB,
    DEFAULT_FILE_SIZE_MB,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT,
    SandboxResult,
    judge,
)

__all__ = [
    "Case",
    "DEFAULT_DISK_MB",
    "DEFAULT_FILE_SIZE_MB",
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIMEOUT",
    "SandboxResult",
    "code_tests",
    "extract_code",
    "judge",
    "parse_tests",
    "run_code_tests",
    "run_sandboxed",
    "sandbox_layers",
]
