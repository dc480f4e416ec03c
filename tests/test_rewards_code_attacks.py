"""The code reward attacked, as a policy trained on it would: every reward hack must score 0, every
attempt at host harm must be contained. Run against the bubblewrap sandbox (in CI it must exist:
a missing bwrap fails these tests there instead of skipping them) and, for the reward hacks, the
fallback layers too, since judging outside the sandbox does not depend on them.

Host-harm attacks run with the audit hook OFF (`audit=False`): the issue showed four ways to switch
it off from inside, so the OS layers must hold alone. Each reports what it achieved on stdout as
JSON; the test checks that and the host itself.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid

import pytest

from jaxrl_llm.rewards.code import judge, launch, parse_tests, run_sandboxed

BWRAP_PROBLEM = launch.bwrap_problem()
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(20, 22) == 42", "assert add(-1, 1) == 0"]
STDIO_TESTS = {"inputs": ["1 2\n", "20 22\n"], "outputs": ["3\n", "42\n"]}


def require_bwrap():
    if BWRAP_PROBLEM is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must test the bubblewrap sandbox, but: {BWRAP_PROBLEM}")
    pytest.skip(f"no bubblewrap sandbox here: {BWRAP_PROBLEM}")


def test_ci_runs_the_bubblewrap_path():
    require_bwrap()
    assert "bwrap" in launch.layers() and "seccomp" in launch.layers()


@pytest.fixture(params=["bwrap", "fallback"])
def backend(request):
    if request.param == "bwrap":
        require_bwrap()
    return request.param


def probe(code, *, timeout=5.0, memory_mb=128, disk_mb=8, audit=False):
    """Runs attack `code` in the bubblewrap sandbox (audit hook off); returns (result, the JSON the
    attack printed last, or None)."""
    require_bwrap()
    result = judge(textwrap.dedent(code), [], backend="bwrap", audit=audit, timeout=timeout, memory_mb=memory_mb,
                   disk_mb=disk_mb, file_size_mb=4)  # fmt: skip
    lines = result.stdout.strip().splitlines()
    try:
        return result, json.loads(lines[-1]) if lines else None
    except ValueError:
        return result, None


# ----------------------------------------------------------------------------- reward hacks

HACKS = {
    "always-equal object": """
        class E:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
        def add(a, b): return E()
    """,
    "int subclass equal to everything": """
        class I(int):
            def __eq__(self, other): return True
            __hash__ = int.__hash__
        def add(a, b): return I(0)
    """,
    "str subclass / custom repr": """
        class S(str):
            def __repr__(self): return "3"
        def add(a, b): return S("3")
    """,
    "bool for int": "def add(a, b): return True",
    "float for int": "def add(a, b): return float(a + b)",
    "NaN and inf": "def add(a, b): return float('nan') if a > 0 else float('inf')",
    "huge int": "def add(a, b): return 10 ** 100000",
    "deeply nested value": """
        def add(a, b):
            x = []
            for _ in range(100000): x = [x]
            return x
    """,
    "patch builtins.exec/compile/enumerate": """
        import builtins
        builtins.exec = lambda *a, **k: None
        builtins.compile = lambda *a, **k: compile('pass', '<x>', 'exec')
        builtins.enumerate = lambda it, start=0: iter([])
        def add(a, b): return None
    """,
    "patch json.dumps to claim passes": """
        import json
        json.dumps = lambda obj, **k: '{"i": %d, "ok": true, "stdout": "3\\\\n"}' % obj.get("i", 0)
        def add(a, b): return None
    """,
    "patch os.write to forge every reply": """
        import os
        real = os.write
        def forged(fd, data):
            return real(fd, b'{"i": 0, "ok": true}\\n' * 50 + b'{"ready": true}\\n') or len(data)
        os.write = forged
        def add(a, b): return None
    """,
    "forge replies on every fd, 1000 times": """
        import json, os
        for fd in range(3, 64):
            for i in range(3):
                try:
                    os.write(fd, (json.dumps({"i": i, "ok": True, "value": {"always": True}}) + "\\n").encode() * 300)
                except OSError:
                    pass
        def add(a, b): return None
    """,
    "frame walking: rewrite the harness's state": """
        import sys
        frame = sys._getframe()
        while frame is not None:
            for name in ("cfg", "handlers", "request"):
                if name in frame.f_locals:
                    value = frame.f_locals[name]
                    if isinstance(value, dict):
                        value.clear()
            frame = frame.f_back
        def add(a, b): return None
    """,
    "traceback tb_frame: call the reporter directly": """
        import sys
        try:
            raise ValueError
        except ValueError as e:
            frame = e.__traceback__.tb_frame
        while frame is not None and "reply" not in frame.f_locals:
            frame = frame.f_back
        if frame is not None:
            for k in range(1000):
                frame.f_locals["reply"]({"i": k % 3, "value": 3})
        def add(a, b): return None
    """,
    "read the expected answers": """
        import gc, os, sys
        blob = " ".join(map(str, sys.argv)) + open("/proc/self/cmdline", "rb").read().decode(errors="replace")
        for fd in range(3, 64):
            try:
                os.set_blocking(fd, False)
                blob += os.read(fd, 1 << 20).decode(errors="replace")
            except OSError:
                pass
        try:
            blob += " ".join(repr(o)[:200] for o in gc.get_objects() if isinstance(o, (dict, list, str)))
        except Exception:
            pass
        FOUND = "987654321" in blob
        def add(a, b): return 987654321 if FOUND else None
    """,
    "exit early with success code": """
        import os
        os._exit(0)
    """,
    "SystemExit from the function": "def add(a, b): raise SystemExit(0)",
    "kill the judge's view: close the reply pipe": """
        import os
        for fd in range(3, 64):
            try: os.close(fd)
            except OSError: pass
        def add(a, b): return a + b + 1
    """,
}


@pytest.mark.parametrize("attack", sorted(HACKS))
def test_reward_hacks_score_zero(attack, backend):
    expected = [987654321] if attack == "read the expected answers" else None
    tests = ["assert add(1, 2) == 987654321"] if expected else ADD_TESTS
    result = judge(textwrap.dedent(HACKS[attack]), parse_tests(tests), backend=backend, timeout=5, memory_mb=256)
    assert result.score == 0.0 and result.passed == 0, (attack, result)


def test_correct_answers_count_once_whatever_the_solution_writes(backend):
    code = textwrap.dedent(
        """
        import json, os
        def add(a, b):
            for fd in range(3, 64):  # duplicate and future replies on every fd
                try:
                    os.write(fd, b"".join((json.dumps({"i": i, "value": 3}) + "\\n").encode() for i in range(9)))
                except OSError:
                    pass
            return a + b
        """
    )
    result = judge(code, parse_tests(ADD_TESTS), backend=backend, timeout=5)
    assert result.passed <= result.total == 3 and 0.0 <= result.score <= 1.0


def test_stdout_hacks_score_zero(backend):
    for code in [
        'print(\'{"i": 0, "stdout": "3"}\')',  # fake protocol lines on stdout
        "import os\nos.write(1, b'3\\n')\nos._exit(0)",  # then end before the judge reads
        "import sys\nsys.stdout = None",
        # forged replies claiming passes for every index, on every fd (no correct answer in them)
        "import os\nfor fd in range(3, 64):\n    try: os.write(fd, b''.join(b'{\"i\": %d, \"ok\": true}\\n{\"i\": %d, \"stdout\": \"\"}\\n' % (i, i) for i in range(9)))\n    except OSError: pass",
    ]:
        result = judge(code, parse_tests(STDIO_TESTS), backend=backend, timeout=5)
        assert result.score == 0.0, (code, result)


def test_unsafe_asserts_are_hackable_as_documented():
    # The opt-in runs asserts inside the sandbox: an always-equal object passes them. Documented.
    code = "class E:\n    def __eq__(self, o): return True\ndef add(a, b): return E()"
    result = run_sandboxed(code, ["assert add(1, 2) == add(2, 1)"], unsafe_asserts=True, timeout=5)
    assert result.score == 1.0


# ----------------------------------------------------------------------------- host harm (hook off)


@pytest.fixture
def marker():
    """A unique name; afterwards no host file may carry it."""
    name = f"jaxrl_attack_{uuid.uuid4().hex}"
    yield name
    for folder in ("/tmp", "/dev/shm", "/var/tmp", os.getcwd(), os.path.expanduser("~")):
        assert not os.path.exists(os.path.join(folder, name)), f"the sandbox wrote {folder}/{name}"


def _runner_processes() -> list[int]:
    """Host processes still running sandbox code (the runner's source is in their command line)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"def install_audit_hook" in f.read():
                    found.append(int(pid))
        except (OSError, ValueError):
            pass
    return found


def test_no_file_outside_the_sandbox(marker):
    result, wrote = probe(f"""
        import json, os
        wrote = []
        for folder in ("/tmp", "/dev/shm", "/var/tmp", {os.getcwd()!r}, {os.path.expanduser('~')!r}, "/", "/dev"):
            try:
                with open(os.path.join(folder, {marker!r}), "w") as f:
                    f.write("x")
                wrote.append(folder)
            except OSError:
                pass
        print(json.dumps(wrote))
    """)
    assert wrote == ["/tmp"], result  # the private tmpfs only; the fixture checks the host's /tmp


def test_disk_quota_is_the_tmpfs_size():
    result, written = probe("""
        import json, os
        total = 0
        for n in range(64):
            try:
                with open("/tmp/f%d" % n, "wb") as f:
                    for _ in range(16):
                        total += f.write(b"x" * (1 << 20))
            except OSError:
                pass
        for n in range(64):  # room for the captured stdout, which shares the quota
            try:
                os.remove("/tmp/f%d" % n)
            except OSError:
                pass
        print(json.dumps(total))
    """, disk_mb=8)
    assert written is not None and written <= 8 << 20, result


def test_shared_memory_beyond_the_limit_is_refused():
    result, got = probe("""
        import json, mmap, os
        got = {}
        try:
            fd = os.memfd_create("x")
            got["memfd"] = sum(os.write(fd, b"x" * (1 << 20)) for _ in range(320))
        except OSError as e:
            got["memfd"] = e.errno
        try:
            import ctypes
            got["memfd_syscall"] = ctypes.CDLL(None, use_errno=True).syscall(319, b"y", 0)
        except Exception as e:
            got["memfd_syscall"] = repr(e)[:80]
        try:
            with open("/dev/shm/x", "wb") as f:
                got["shm"] = f.write(b"x" * (64 << 20))
        except OSError as e:
            got["shm"] = e.errno
        try:
            got["anon"] = len(bytearray(320 << 20))
        except MemoryError:
            got["anon"] = "MemoryError"
        print(json.dumps(got))
    """, memory_mb=64)
    assert got is not None, result
    assert got["memfd"] == 1 and got["shm"] in (2, 13, 30) and got["anon"] == "MemoryError", got  # EPERM; ENOENT/EACCES/EROFS
    assert got["memfd_syscall"] == -1 or "Error" in str(got["memfd_syscall"]), got


def test_no_secret_from_the_parent_or_other_processes(monkeypatch):
    secret = uuid.uuid4().hex
    monkeypatch.setenv("JAXRL_TEST_SECRET", secret)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", secret])
    try:
        result, found = probe(f"""
            import json, os
            blob = json.dumps(dict(os.environ))
            for pid in os.listdir("/proc"):
                for name in ("cmdline", "environ"):
                    try:
                        blob += open("/proc/%s/%s" % (pid, name), "rb").read().decode(errors="replace")
                    except OSError:
                        pass
            for path in ("/etc/shadow", "/etc/passwd", "/root/.bash_history", {os.path.abspath(__file__)!r}):
                try:
                    blob += open(path).read()
                except OSError:
                    pass
            print(json.dumps([{secret!r} in blob, "def test_" in blob, sorted(os.environ), os.getpid()]))
        """)
    finally:
        holder.kill()
        holder.wait()
    assert found is not None, result
    leaked, read_repo, names, pid = found
    assert not leaked and not read_repo
    assert set(names) <= {"HOME", "LANG", "LC_ALL", "PATH", "PWD", "TMPDIR"} and pid <= 3  # its own PID namespace


def test_no_connection_to_the_host(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    unix_path = os.path.join(tempfile.gettempdir(), f"jaxrl_attack_{uuid.uuid4().hex[:8]}.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    unix.listen()
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(b"\0jaxrl_attack_abstract")
    abstract.listen()
    try:
        result, reached = probe(f"""
            import json, socket
            reached = []
            for family, address in ((socket.AF_INET, ("127.0.0.1", {server.getsockname()[1]})),
                                    (socket.AF_UNIX, {unix_path!r}), (socket.AF_UNIX, b"\\0jaxrl_attack_abstract")):
                try:
                    s = socket.socket(family)
                    s.settimeout(1)
                    s.connect(address)
                    reached.append(str(address))
                except OSError:
                    pass
            print(json.dumps(reached))
        """)
        assert reached == [], result
        for listener in (server, unix, abstract):
            listener.settimeout(0.05)
            with pytest.raises(OSError):
                listener.accept()
    finally:
        for listener in (server, unix, abstract):
            listener.close()
        os.unlink(unix_path)


def test_fork_bomb_and_double_fork_leave_no_process_behind():
    before = set(_runner_processes())
    result, forks = probe("""
        import json, os, time
        forks = 0
        for _ in range(200):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                try:
                    os.setsid()
                    if os.fork() == 0:  # the double-fork daemon escape
                        time.sleep(60)
                finally:
                    os._exit(0)
            forks += 1
        print(json.dumps(forks))
    """, timeout=5)
    assert forks is not None and forks < 16, result  # RLIMIT_NPROC of the sandbox uid (or namespace)
    time.sleep(0.2)
    assert set(_runner_processes()) <= before


def test_sleeping_child_past_the_timeout_is_killed():
    start = time.monotonic()
    result, _ = probe("""
        import os, time
        if os.fork() == 0:
            time.sleep(60)  # holds the reply pipe open
        time.sleep(60)
    """, timeout=1)
    assert result.status == "timeout" and time.monotonic() - start < 5
    assert _runner_processes() == []


def test_a_rollout_cannot_kill_its_siblings():
    require_bwrap()
    victim = "import time\ndef add(a, b):\n    time.sleep(0.5)\n    return a + b"
    attack = textwrap.dedent("""
        import os, signal
        for _ in range(20):
            for pid in range(1, 1 << 16):
                try:
                    if pid != os.getpid():
                        os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        def add(a, b): return None
    """)
    results = {}
    victims = [threading.Thread(target=lambda k=k: results.__setitem__(k, judge(victim, parse_tests(ADD_TESTS),
                                                                                  backend="bwrap", timeout=20)))
               for k in range(2)]  # fmt: skip
    for thread in victims:
        thread.start()
    time.sleep(0.3)
    attacker = judge(attack, parse_tests(ADD_TESTS), backend="bwrap", audit=False, timeout=20)
    for thread in victims:
        thread.join()
    assert attacker.score == 0.0
    assert all(r.status == "passed" and r.score == 1.0 for r in results.values()), results


def test_kernel_surface_is_closed():
    result, got = probe("""
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        got = {}
        got["unshare_user"] = libc.unshare(0x10000000)      # CLONE_NEWUSER: could mount its own tmpfs
        got["ptrace_pid1"] = libc.ptrace(16, 1, 0, 0)        # PTRACE_ATTACH
        got["setuid0"] = libc.setuid(0)
        got["kill_pid1"] = libc.kill(1, 9)
        got["uid"] = os.getuid()
        print(json.dumps(got))
    """)
    assert got is not None, result
    assert got["unshare_user"] == -1 and got["ptrace_pid1"] == -1 and got["setuid0"] == -1 and got["kill_pid1"] == -1
    assert got["uid"] != 0


def test_output_flood_and_memory_bomb_are_bounded():
    result, _ = probe("while True:\n    print('y' * 10000)", timeout=5)
    assert result.status == "output_limit" and len(result.stdout) <= 4096
    start = time.monotonic()
    result = run_sandboxed("def add(a, b):\n    return len(bytearray(10 * 1024**3))", ADD_TESTS, timeout=5)
    assert result.status == "memory" and result.score == 0.0 and time.monotonic() - start < 5


def test_cpu_spin_is_cut_by_the_cpu_limit(backend):
    result = judge("while True:\n    pass", parse_tests(ADD_TESTS), backend=backend, timeout=10, cpu_time=1)
    assert result.status == "cpu_limit" and result.score == 0.0


# ----------------------------------------------------------------------------- the fallback layers


@pytest.mark.skipif(os.geteuid() != 0, reason="the fallback's distinct uid needs root")
def test_fallback_as_root_still_protects_siblings_and_leaves_no_process():
    # Without bubblewrap and with the audit hook switched off, a uid per sandbox still stops a
    # rollout from killing its siblings, and every process of that uid is killed afterwards.
    victim = "import time\ndef add(a, b):\n    time.sleep(0.5)\n    return a + b"
    attack = textwrap.dedent("""
        import os, signal, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        for _ in range(5):
            os.kill(-1, signal.SIGKILL) if os.fork() else os._exit(0)
        def add(a, b): return None
    """)
    results = {}
    thread = threading.Thread(target=lambda: results.setdefault(0, judge(victim, parse_tests(ADD_TESTS),
                                                                         backend="fallback", timeout=20)))  # fmt: skip
    thread.start()
    time.sleep(0.3)
    attacker = judge(attack, parse_tests(ADD_TESTS), backend="fallback", audit=False, timeout=10)
    thread.join()
    assert attacker.score == 0.0 and results[0].score == 1.0, (attacker, results)
    time.sleep(0.2)
    assert _runner_processes() == []


def test_layers_and_the_loud_warning(monkeypatch):
    layers = launch.layers("fallback")
    assert "bwrap" not in layers and {"judge_outside", "rlimits", "audit_hook"} <= set(layers)
    monkeypatch.setattr(launch, "bwrap_problem", lambda: "bwrap is not installed")
    with pytest.warns(RuntimeWarning, match="code_tests: NO bubblewrap sandbox \\(bwrap is not installed\\)"):
        launch.warn_if_weak.__wrapped__()


# ----------------------------------------------------------------------------- the judge's parser

PROTOCOL_PAYLOADS = {  # Python expressions evaluated in the sandbox
    "nested 200k deep": 'b"[" * 200_000 + b"\\n"',
    "100k-digit int": 'b\'{"i": 0, "value": 1\' + b"0" * 100_000 + b"}\\n"',
    "invalid UTF-8": 'b\'\\xff\\xfe{"i": 0, "value": 3}\\n\'',
    "NaN literal": 'b\'{"i": 0, "value": NaN}\\n\'',
    "two tags": 'b\'{"i": 0, "value": {"tuple": [3], "set": [3]}}\\n\'',
    "unhashable set member": 'b\'{"i": 0, "value": {"set": [[3]]}}\\n\'',
    "bool index": 'b\'{"i": false, "value": 3}\\n\'',
    "endless line": 'b"x" * (64 << 20)',
}


@pytest.mark.parametrize("payload", sorted(PROTOCOL_PAYLOADS))
def test_malformed_replies_fail_the_case_without_hurting_the_judge(payload, backend):
    # Written straight to the reply pipe (its fd is the runner's last argument), instead of answering.
    code = f"import os, sys\ndef add(a, b):\n    os.write(int(sys.argv[2]), {PROTOCOL_PAYLOADS[payload]})\n    return None"
    start = time.monotonic()
    result = judge(code, parse_tests(["assert add(1, 2) == 3"]), backend=backend, timeout=10, memory_mb=256)
    assert result.score == 0.0 and time.monotonic() - start < 5, result


def test_deep_recursion_crashes_only_the_sandbox(backend):
    code = "import sys\nsys.setrecursionlimit(10 ** 6)\ndef add(a, b):\n    return add(a, b) + 1"
    result = judge(code, parse_tests(ADD_TESTS), backend=backend, timeout=10, memory_mb=128)
    assert result.score == 0.0 and result.status in ("crashed", "failed", "memory"), result
