"""The sandbox's limits seen from the trainer: code extraction in linear time, forged refusals and
output floods that cost the judge nothing, honest programs that exit(), more than 1,024 open fds,
and statuses that say which limit was hit and who ended the process. Attacks run beside an honest
sibling in the same batch."""

import os
import random
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from fixtures_sandbox import ADD_TESTS, STDIO_TESTS, backend, require_bwrap  # noqa: F401  (backend: a fixture)

from jaxrl_llm.rewards.code import extract_code, judge, parse_tests, run_code_tests, run_sandboxed
from jaxrl_llm.rewards.code.session import Refusals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
    start = time.thread_time()  # CPU time of this thread: a loaded host does not fail the test
    extract_code(completion)
    assert time.thread_time() - start < 2.0  # linear: ~0.1 s; the old regex took hours on some of these
    assert extract_code(unit * 300) == old_extract_code(unit * 300)  # the same answer where the old one is quick


# ----------------------------------------------------------------------------- attacks beside an honest sibling

HONEST = "```python\ndef add(a, b):\n    return a + b\n```"


def _batch(attack, timeout=20.0):
    """Judges [attack, honest] in one batch of two workers: (attack result, sibling result, seconds)."""
    start = time.monotonic()
    results = run_code_tests([attack, HONEST], [ADD_TESTS, ADD_TESTS], timeout=timeout, max_workers=2)
    return results[0], results[1], time.monotonic() - start


def test_a_megabyte_of_fences_beside_an_honest_sibling():
    attack, sibling, seconds = _batch("```" * ((1 << 20) // 3))
    assert sibling.score == 1.0 and attack.score == 0.0 and seconds < 10, (sibling, attack, seconds)


def test_a_flood_of_forged_refusals_keeps_five_and_ends_the_run():
    flood = ("import os, sys\nline = ('{\"blocked\": \"' + 'x' * 300 + '\"}\\n').encode() * 64\n"
             "def add(a, b):\n    while True:\n        os.write(int(sys.argv[2]), line)")  # fmt: skip
    attack, sibling, seconds = _batch(flood)
    assert sibling.score == 1.0 and seconds < 10, (sibling, seconds)  # not held until the 20 s timeout
    assert attack.status == "blocked" and attack.score == 0.0 and len(attack.blocked) == 5
    assert "more)" in attack.reason  # the sixth refusal proves forgery (the hook reports five at most)


def test_refusals_keep_the_first_few_and_count_all():
    refusals = Refusals()
    for n in range(1000):
        refusals.append(f"refusal {n}")
    assert list(refusals) == [f"refusal {n}" for n in range(5)] and refusals.total == 1000


def _peak_bytes_under(root, stop, peak):
    while not stop.is_set():
        sizes = [os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(root) for f in files]
        peak[0] = max(peak[0], sum(sizes))
        time.sleep(0.002)


def test_stdout_and_stderr_floods_never_reach_the_host_disk(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    stop, peak = threading.Event(), [0]
    watcher = threading.Thread(target=_peak_bytes_under, args=(str(tmp_path), stop, peak))
    watcher.start()
    flood = ("import os\ndef add(a, b):\n    for fd in (1, 2):\n        for _ in range(20):\n"
             "            os.write(fd, b'x' * (1 << 20))\n    return a + b")  # fmt: skip
    try:
        attack, sibling, seconds = _batch(flood)
        small = judge("import os\nos.write(2, b'y' * (2 << 20))\ndef add(a, b):\n    return a + b",
                      parse_tests(ADD_TESTS), disk_mb=1, timeout=10)  # fmt: skip
    finally:
        stop.set()
        watcher.join()
    assert sibling.score == 1.0 and seconds < 10, (sibling, seconds)
    assert attack.status == small.status == "output_limit" and attack.score == small.score == 0.0
    assert "stdout and stderr over 16 MiB: killed by the judge" in attack.reason and "over 1 MiB" in small.reason
    assert attack.stdout == "x" * 4096 and peak[0] < 64 << 10  # the judge's files: no output among them


def test_output_under_the_cap_is_drained_and_its_head_kept():
    code = ("import sys\ndef add(a, b):\n    print('debug', a, b)\n    print('e' * 300_000, file=sys.stderr)\n"
            "    return a + b")
    result = run_sandboxed(code, ADD_TESTS, timeout=10)  # 300 KB of stderr a case: more than a pipe holds
    assert result.score == 1.0 and result.stdout.startswith("debug 1 2\ndebug 20 22\n") and result.stderr == "e" * 4096


def test_stdio_output_counts_against_the_sandbox_disk():
    require_bwrap()
    code = "import sys\nfor _ in range(64):\n    sys.stdout.write('z' * 65536)"
    result = judge(code, parse_tests(STDIO_TESTS), backend="bwrap", disk_mb=1, file_size_mb=16, timeout=10)
    assert result.status == "disk" and result.score == 0.0 and "disk of 1 MiB is full" in result.reason, result


# ----------------------------------------------------------------------------- honest programs that exit


@pytest.mark.parametrize("ending", ["exit()", "quit()", "exit(0)", "sys.exit()", "sys.exit(0)", "sys.exit(False)",
                                    "raise SystemExit"])  # fmt: skip
def test_stdio_programs_may_end_with_exit(ending, backend):
    code = f"import sys\na, b = map(int, input().split())\nprint(a + b)\n{ending}\nprint('unreachable')"
    result = judge(code, parse_tests(STDIO_TESTS), backend=backend, timeout=10)
    assert (result.status, result.score) == ("passed", 1.0), result


@pytest.mark.parametrize("ending", ["exit(1)", "quit(2)", "sys.exit('bye')", "sys.exit(True)"])
def test_a_nonzero_exit_status_fails_the_case(ending):
    code = f"import sys\na, b = map(int, input().split())\nprint(a + b)\n{ending}"
    result = run_sandboxed(code, STDIO_TESTS, timeout=10)
    assert (result.status, result.score) == ("failed", 0.0) and "SystemExit" in result.reason, result


def test_sandboxes_work_with_more_than_1024_descriptors_open():
    script = textwrap.dedent("""
        import os, resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard < 1200:
            raise SystemExit("SKIP: RLIMIT_NOFILE's hard limit is %d" % hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096 if hard == resource.RLIM_INFINITY else min(4096, hard), hard))
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
        assert max(held) > 1024
        from jaxrl_llm.rewards.code import run_sandboxed
        result = run_sandboxed("def add(a, b):\\n    return a + b", ["assert add(1, 2) == 3"], timeout=10)
        print(result.status, result.score)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})  # fmt: skip
    if "SKIP:" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.stdout.split() == ["passed", "1.0"], proc.stderr[-2000:]


# ----------------------------------------------------------------------------- which limit, and who ended the run

ADD_ONE = ["assert add(1, 2) == 3"]


@pytest.mark.parametrize("body, status, reason", [  # reason: a regular expression
    ("return 'x' * (4 << 20)", "output_limit", r"a reply over \d+ bytes: killed by the judge"),
    ("os.write(int(sys.argv[2]), b'{\"i\": 7, \"value\": 3}\\n')\n    time.sleep(60)", "crashed",
     "reply for test 7 when test 0 was asked: the judge ended the run"),
    ("open('big', 'wb').write(b'x' * (5 << 20))", "output_limit", r"file size limit exceeded \(RLIMIT_FSIZE\)"),
    ("os.abort()", "crashed", "killed by signal SIGABRT after 0 of 1 tests"),
    ("os.close(int(sys.argv[1]))\n    os.close(int(sys.argv[2]))\n    time.sleep(60)", "crashed",
     "stopped answering: killed by the judge after 0 of 1 tests"),
    ("while True:\n        pass", "cpu_limit", "CPU time limit of 1 s exceeded: SIGXCPU from the kernel"),
])  # fmt: skip
def test_the_status_names_the_limit_and_who_ended_the_run(body, status, reason, backend):
    code = f"import os, sys, time\ndef add(a, b):\n    {body}"
    result = judge(code, parse_tests(ADD_ONE), backend=backend, timeout=20, cpu_time=1, file_size_mb=4)
    assert (result.status, result.score) == (status, 0.0) and re.fullmatch(reason, result.reason), result


def test_a_full_tmpfs_is_the_disk_status():
    require_bwrap()
    code = "def add(a, b):\n    with open('/tmp/fill', 'wb') as f:\n        f.write(b'x' * (3 << 20))\n    return a + b"
    result = judge(code, parse_tests(ADD_ONE), backend="bwrap", disk_mb=2, file_size_mb=16, timeout=10)
    assert (result.status, result.reason) == ("disk", "the sandbox's disk of 2 MiB is full"), result
