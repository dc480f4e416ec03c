"""`code_tests` and its sandbox: test schema, code extraction, and each attack from the issue.

Every attack runs with short limits; each must score 0 with a reason, end within its time limit and
leave the host untouched. Defence in depth: the `_run(..., audit=False)` cases check that the
layers under the audit hook (uid drop, RLIMIT_NPROC, network namespace) hold on their own.
"""

import os
import shutil
import socket
import stat
import tempfile
import textwrap
import time

import pytest

from jaxrl_llm.rewards import get_reward_fn
from jaxrl_llm.rewards import code as sandbox
from jaxrl_llm.rewards.code import code_tests, extract_code, parse_tests, run_code_tests, run_sandboxed

IS_ROOT = os.geteuid() == 0
LAYERS = sandbox.sandbox_layers()
ADD = "def add(a, b):\n    return a + b\n"


def _bare(code, timeout=3.0):
    """The sandbox without its audit hook: what the OS-level layers alone allow."""
    return sandbox._run(code, [], timeout=timeout, memory_mb=256, cpu_time=None, file_size_mb=1, audit=False)


# ----------------------------------------------------------------------------- schema and extraction


def test_parse_tests_schema():
    asserts = ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]
    assert parse_tests(asserts) == [("test", a) for a in asserts]
    source = textwrap.dedent(
        """
        import functools

        @functools.cache
        def expected(a, b):
            return a + b
        assert add(1, 2) == expected(1, 2); assert add(2, 2) == 4
        check = lambda f: f(0, 0) == 0
        """
    )
    units = parse_tests(source)
    assert [kind for kind, _ in units] == ["setup", "setup", "test", "test", "setup"]
    assert units[1][1].startswith("@functools.cache")  # decorators are kept
    assert parse_tests("check(add)") == [("test", "check(add)")]  # no assert: one all-or-nothing test
    assert parse_tests("") == [] and parse_tests([]) == []
    with pytest.raises(ValueError, match=r"tests is not valid Python: .* \(line 1\)"):
        parse_tests("assert (")
    with pytest.raises(ValueError, match=r"tests\[1\] is not valid Python"):
        parse_tests(["assert True", "assert ("])
    with pytest.raises(ValueError, match="tests must be a string or a list of strings, got int"):
        parse_tests(3)


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("Here:\n```python\nx = 1\n```\nthen\n```python\nx = 2\n```", "x = 2\n"),
        ("```py\nx = 3\n```", "x = 3\n"),
        ("```\nx = 4\n```\n```bash\nls\n```", "x = 4\n"),
        ("```bash\nls\n```\n```Python3\nx = 5\n```", "x = 5\n"),
        ("<think>use a loop</think>\nx = 6", "\nx = 6"),
        ("x = 7", "x = 7"),
        ("Truncated:\n```python\nx = 8\nwhile", "x = 8\nwhile"),
    ],
)
def test_extract_code(completion, expected):
    assert extract_code(completion) == expected


# ----------------------------------------------------------------------------- scoring


def test_pass_fraction_and_statuses():
    result = run_sandboxed(ADD, ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add(0, 0) == 0"])
    assert (result.status, result.passed, result.total) == ("failed", 2, 3)
    assert result.score == pytest.approx(2 / 3)
    assert result.reason == "test 1 failed: AssertionError"

    result = run_sandboxed(ADD, "import math\nassert add(1, 2) == 3\nassert math.isclose(add(0.1, 0.2), 0.3)")
    assert (result.status, result.passed, result.total, result.score) == ("passed", 2, 2, 1.0)

    result = run_sandboxed("def add(a, b):\n    return a +", ["assert add(1, 2) == 3"])
    assert result.status == "error" and result.reason.startswith("solution raised SyntaxError")
    assert result.score == 0.0

    result = run_sandboxed(ADD + "print('hello')\nraise SystemExit(0)", ["assert add(1, 1) == 2"])
    assert result.status == "passed" and result.stdout == "hello\n"  # exit() ending a script is fine


def test_stdlib_works_under_the_dropped_privileges():
    code = textwrap.dedent(
        """
        import collections.abc, dataclasses, fractions, heapq, json, re, statistics, typing
        @dataclasses.dataclass
        class P:
            x: int
        def solve():
            with open("scratch.txt", "w") as f:  # the work dir is writable
                f.write(json.dumps([P(1).x, heapq.nsmallest(1, [3, 2])[0]]))
            return open("scratch.txt").read()

        # File operations inside the work dir are allowed (the hook checks every path argument).
        import os, pathlib, shutil, sqlite3, tempfile
        os.makedirs("d/e", exist_ok=True)
        pathlib.Path("d/s.txt").write_text("s"); os.rename("d/s.txt", "s.txt"); shutil.copy("s.txt", "d/s.txt")
        os.chmod("d/s.txt", 0o600); os.utime("d/s.txt"); os.symlink("d/s.txt", "lnk"); os.remove("lnk")
        fd, path = tempfile.mkstemp(); os.close(fd); os.remove(path)
        with tempfile.TemporaryDirectory() as t:
            pathlib.Path(t, "q").write_text("x")
        dir_fd = os.open(".", os.O_RDONLY); os.mkdir("via_fd", dir_fd=dir_fd); os.rmdir("via_fd", dir_fd=dir_fd)
        sqlite3.connect("local.db").execute("create table t(x)")
        shutil.rmtree("d")
        """
    )
    result = run_sandboxed(code, ["assert solve() == '[1, 2]'"], timeout=5)
    assert (result.status, result.score) == ("passed", 1.0), result.reason


def test_code_tests_reward_batches_rows_in_order():
    completions = [f"```python\n{ADD}```", "```python\ndef add(a, b):\n    return a - b\n```", "no code", ADD]
    tests = [["assert add(1, 2) == 3"], "assert add(2, 1) == 3\nassert add(1, 1) == 0", ["assert add(1, 2) == 3"], None]
    scores = code_tests(["q"] * 4, completions, tests=tests, timeout=5, max_workers=2)
    assert scores == [1.0, 0.5, 0.0, None]  # a row without tests is not applicable
    name, fn = get_reward_fn("code_tests", timeout=5.0, max_workers=1)
    assert name == "code_tests" and fn(["q"], [ADD], tests=[["assert add(2, 2) == 4"]]) == [1.0]
    with pytest.raises(ValueError, match="needs the column 'tests' with 2 entries"):
        code_tests(["q"] * 2, ["a", "b"], tests=[["assert True"]])
    with pytest.raises(ValueError, match="tests of row 0: tests is not valid Python"):
        code_tests(["q"], ["a"], tests=["assert ("])


def test_forged_results_do_not_count():
    code = textwrap.dedent(
        """
        import json, os
        line = json.dumps(["0" * 32, "test", 0, "pass", ""]) + "\\n"
        print(line)
        for fd in range(3, 16):
            try:
                os.write(fd, line.encode())
            except OSError:
                pass
        os._exit(0)
        """
    )
    result = run_sandboxed(code, ["assert True", "assert True"])
    assert (result.status, result.passed, result.score) == ("crashed", 0, 0.0)
    # The nonce cannot be read back from the harness's payload file.
    steal = "import os\nnonce = open(os.path.join(os.path.dirname(os.getcwd()), 'payload')).read()"
    result = run_sandboxed(steal, ["assert True"])
    assert result.status == "blocked" and result.reason.endswith("/payload")
    if IS_ROOT:
        assert "PermissionError" in _bare(steal).reason  # 0600 root-owned: closed to `nobody` too


# ----------------------------------------------------------------------------- attacks


def test_infinite_loop_hits_the_cpu_limit():
    start = time.monotonic()
    result = run_sandboxed("while True:\n    pass", ["assert True"], timeout=10, cpu_time=1)
    assert result.status == "cpu_limit" and "SIGXCPU" in result.reason
    assert result.score == 0.0 and time.monotonic() - start < 10


def test_ignoring_sigxcpu_still_dies_at_the_hard_cpu_limit():
    code = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass"
    result = run_sandboxed(code, ["assert True"], timeout=10, cpu_time=1)  # ends at 2 s of CPU
    assert result.status == "cpu_limit" and "SIGKILL" in result.reason and result.score == 0.0


def test_wall_clock_timeout_kills_the_group_and_keeps_finished_tests():
    start = time.monotonic()
    result = run_sandboxed(ADD, ["assert add(1, 1) == 2", "import time\ntime.sleep(60)"], timeout=1)
    elapsed = time.monotonic() - start
    assert result.status == "timeout" and result.reason == "wall-clock limit of 1 s exceeded"
    assert (result.passed, result.total, result.score) == (1, 2, 0.5)  # the test done before counts
    assert 1.0 <= elapsed < 3.0  # the limit plus process start-up and kill, on a loaded machine


def test_fork_bomb_is_refused():
    start = time.monotonic()
    result = run_sandboxed("import os\nwhile True:\n    os.fork()", ["assert True"], timeout=3)
    assert result.status == "blocked" and result.reason.startswith("refused by the sandbox: os.fork")
    assert result.score == 0.0 and time.monotonic() - start < 3.0  # refused at once, not timed out
    result = run_sandboxed("import subprocess\nsubprocess.run(['true'])", ["assert True"], timeout=3)
    assert result.status == "blocked" and "subprocess.Popen" in result.reason


@pytest.mark.skipif(not IS_ROOT, reason="RLIMIT_NPROC=0 applies to the dropped uid only when root")
def test_fork_fails_without_the_audit_hook_too():
    # Bounded: even if fork worked, this makes 5 processes that exit at once.
    code = "import os\nfor _ in range(5):\n    if os.fork() == 0:\n        os._exit(0)"
    result = _bare(code)
    assert result.status == "error" and "BlockingIOError" in result.reason


def test_ten_gigabyte_allocation_is_a_memory_error():
    start = time.monotonic()
    result = run_sandboxed("x = bytearray(10 * 1024**3)", ["assert True"], timeout=3)
    assert result.status == "memory" and result.score == 0.0
    assert time.monotonic() - start < 3.0  # refused at once, not timed out


@pytest.fixture
def host_dir():
    """A directory the sandbox user can reach (under /tmp, not pytest's private 0700 tree), holding
    a world-writable `shared/` (like /tmp: only the audit hook can stop writes there) and a
    root-owned `private.txt`."""
    base = tempfile.mkdtemp(prefix="jaxrl_test_host_")
    os.chmod(base, 0o755)
    shared = os.path.join(base, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    private = os.path.join(base, "private.txt")
    with open(private, "w") as f:
        f.write("original")
    os.chmod(private, 0o644)
    yield shared, private
    shutil.rmtree(base)


def test_writes_outside_the_temp_dir_are_refused(host_dir):
    shared, private = host_dir
    attacks = [
        f"open({shared + '/planted'!r}, 'w').write('x')",
        f"import os\nos.close(os.open({shared + '/planted2'!r}, os.O_CREAT | os.O_WRONLY))",
        f"open({private!r}, 'a').write('x')",
        f"import os\nos.remove({private!r})",
        f"import os\nos.rename({private!r}, 'stolen.txt')",
        f"import os\nos.mkdir({shared + '/dir'!r})",
        "open('../../escape.txt', 'w').write('x')",
        f"import os\nos.symlink({shared!r}, 'link')\nopen('link/planted3', 'w').write('x')",
        f"import os\nfd = os.open({shared!r}, os.O_RDONLY)\nos.open('planted4', os.O_CREAT | os.O_WRONLY, dir_fd=fd)",
        f"import sqlite3\nsqlite3.connect({shared + '/db'!r}).execute('create table t(x)')",
        f"import sys\ndel sys.modules['posix']\nimport posix\nposix.mkfifo({shared + '/fifo'!r})",
    ]
    for code in attacks:
        result = run_sandboxed(code, ["assert True"], timeout=3)
        assert result.status == "blocked" and result.score == 0.0, (code, result)
    # mknod/mkfifo raise no audit event: they are removed from os and posix instead.
    result = run_sandboxed(f"import os\nos.mknod({shared + '/node'!r})", ["assert True"], timeout=3)
    assert result.status == "error" and "has no attribute 'mknod'" in result.reason
    assert os.listdir(shared) == []
    with open(private) as f:
        assert f.read() == "original"


@pytest.mark.skipif(not IS_ROOT, reason="the uid layer exists only when run as root")
def test_root_owned_files_stay_read_only_without_the_audit_hook(tmp_path):
    private = tmp_path / "private.txt"
    private.write_text("original")
    private.chmod(0o644)
    tmp_path.chmod(0o755)
    result = _bare(f"open({str(private)!r}, 'a').write('x')")
    assert result.status == "error" and "PermissionError" in result.reason
    assert private.read_text() == "original"
    assert stat.S_IMODE(private.stat().st_mode) == 0o644


def test_parent_environment_is_invisible(monkeypatch):
    monkeypatch.setenv("JAXRL_TEST_SECRET", "hunter2")
    code = "import os\nprint(sorted(os.environ))\nleak = os.environ.get('JAXRL_TEST_SECRET')"
    result = run_sandboxed(code, ["assert leak is None"], timeout=3)
    assert result.status == "passed"
    assert sorted(eval(result.stdout)) == ["HOME", "LANG", "LC_ALL", "PATH", "TMPDIR"]
    # The parent's /proc entry is refused by the hook...
    result = run_sandboxed("import os\nsecret = open(f'/proc/{os.getppid()}/environ').read()", ["assert True"], timeout=3)
    assert result.status == "blocked" and "environ" in result.reason and "hunter2" not in result.stdout


@pytest.mark.skipif(not IS_ROOT, reason="the uid layer exists only when run as root")
def test_parent_proc_environ_is_closed_without_the_audit_hook(monkeypatch):
    monkeypatch.setenv("JAXRL_TEST_SECRET", "hunter2")
    result = _bare("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())")
    assert result.status == "error" and "PermissionError" in result.reason and "hunter2" not in result.stdout


def test_socket_creation_is_refused():
    result = run_sandboxed("import socket\ns = socket.socket()", ["assert True"], timeout=3)
    assert result.status == "blocked" and result.reason.startswith("refused by the sandbox: socket.__new__")
    # Catching the refusal does not help: any refused operation scores 0.
    code = ADD + "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9))\nexcept OSError:\n    pass"
    result = run_sandboxed(code, ["assert add(1, 1) == 2"], timeout=3)
    assert (result.status, result.passed, result.score) == ("blocked", 1, 0.0)


@pytest.mark.skipif("netns" not in LAYERS, reason="unshare --net is not available here")
def test_network_namespace_blocks_connections_without_the_audit_hook():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    try:
        port = server.getsockname()[1]
        result = _bare(f"import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))")
        assert result.status == "error" and "Network is unreachable" in result.reason
    finally:
        server.close()


def test_ctypes_and_output_floods_are_contained():
    result = run_sandboxed("import ctypes", ["assert True"], timeout=3)
    assert result.status == "blocked" and "ctypes" in result.reason
    result = sandbox._run("while True:\n    print('y' * 10000)", [("test", "assert True")], timeout=3,
                          memory_mb=256, cpu_time=None, file_size_mb=1)  # fmt: skip
    assert result.status == "output_limit" and result.score == 0.0
    assert len(result.stdout) == sandbox._OUTPUT_CHARS


def test_the_run_leaves_no_temp_dir_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox.tempfile, "tempdir", str(tmp_path))
    result = run_sandboxed("import os\nos.chmod('.', 0o500)\nopen('../x', 'w')", ["assert True"], timeout=3)
    assert result.status == "blocked"
    assert os.listdir(tmp_path) == []


def test_bad_sandbox_arguments():
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        run_sandboxed("pass", timeout=0)
    with pytest.raises(ValueError, match="memory_mb must be a positive integer"):
        run_sandboxed("pass", memory_mb=0.5)
    with pytest.raises(ValueError, match="code must be a string"):
        run_sandboxed(b"pass")
    with pytest.raises(ValueError, match="max_workers must be a positive integer"):
        run_code_tests(["pass"], [["assert True"]], max_workers=0)
