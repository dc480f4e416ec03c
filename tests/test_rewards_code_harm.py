"""The code reward attacked for host harm, as a policy trained on it might: every attempt must be
contained. The attacks run in the bubblewrap sandbox with the audit hook OFF (`audit=False`: code in
its interpreter can switch it off), so the OS layers are tested alone; each reports what it
achieved on stdout as JSON and the test checks that and the host itself. Under CI=true a missing
bwrap fails these tests instead of skipping them."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid

import pytest
from fixtures_sandbox import ADD_TESTS, probe, require_bwrap, runner_processes

from jaxrl_llm.rewards.code import judge, launch, parse_tests, run_sandboxed


def test_ci_runs_the_bubblewrap_path():
    require_bwrap()
    assert "bwrap" in launch.layers() and "seccomp" in launch.layers()


# ----------------------------------------------------------------------------- host harm (hook off)


@pytest.fixture
def marker():
    """A unique name; afterwards no host file may carry it."""
    name = f"jaxrl_attack_{uuid.uuid4().hex}"
    yield name
    for folder in ("/tmp", "/dev/shm", "/var/tmp", os.getcwd(), os.path.expanduser("~")):
        assert not os.path.exists(os.path.join(folder, name)), f"the sandbox wrote {folder}/{name}"


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
    before = set(runner_processes())
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
    assert forks == 0, result  # seccomp: threads only (one address space, one RLIMIT_AS)
    time.sleep(0.2)
    assert set(runner_processes()) <= before


def test_sleeping_child_past_the_timeout_is_killed():
    start = time.monotonic()
    result, _ = probe("""
        import os, threading, time
        try:
            if os.fork() == 0:
                time.sleep(60)  # holds the reply pipe open
        except OSError:
            threading.Thread(target=time.sleep, args=(60,)).start()  # a thread holds it then
        time.sleep(60)
    """, timeout=1)
    assert result.status == "timeout" and time.monotonic() - start < 15  # not the 60 s the holders sleep
    assert runner_processes() == []


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
    assert result.status == "memory" and result.score == 0.0 and time.monotonic() - start < 5 + 10  # slack for a loaded host


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
    assert runner_processes() == []


def test_layers_and_the_loud_warning(monkeypatch):
    layers = launch.layers("fallback")
    assert "bwrap" not in layers and {"judge_outside", "rlimits", "audit_hook"} <= set(layers)
    monkeypatch.setattr(launch, "bwrap_problem", lambda: "bwrap is not installed")
    with pytest.warns(RuntimeWarning, match="code_tests: NO bubblewrap sandbox \\(bwrap is not installed\\)"):
        launch.warn_if_weak.__wrapped__()


def test_forked_processes_draw_their_own_uid_blocks():
    if os.geteuid() != 0:
        pytest.skip("uids are drawn only as root")
    uid = launch.acquire_uid()
    launch.release_uid(uid)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # a data-loader-like child: its sandboxes must not reuse the parent's uids
        child_uid = launch.acquire_uid()
        os.write(write_fd, str(child_uid).encode())
        os._exit(0)
    os.close(write_fd)
    child_uid = int(os.read(read_fd, 64))
    os.waitpid(pid, 0)
    os.close(read_fd)
    block = lambda u: (u - 1_000_000_000) // 1024  # noqa: E731
    assert block(child_uid) != block(uid)  # equal by chance: 1 in 900 000


@pytest.mark.skipif(os.geteuid() != 0, reason="uids are drawn only as root")
def test_a_uid_with_lingering_zombies_is_retired(monkeypatch):
    uid = launch.acquire_uid()
    monkeypatch.setattr(launch, "_processes_of", lambda u: ([], True))  # as under an init that reaps late
    launch.release_uid(uid)
    monkeypatch.undo()
    assert uid not in launch._uid_pool["free"]
    uid = launch.acquire_uid()
    launch.release_uid(uid)
    assert uid in launch._uid_pool["free"]


@pytest.fixture
def host_dir():
    """A world-writable directory under /tmp (where only the audit hook stops the fallback's writes)
    and a root-owned world-readable file."""
    base = tempfile.mkdtemp(prefix="jaxrl_test_host_")
    os.chmod(base, 0o755)
    shared = os.path.join(base, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    private = os.path.join(base, "private.txt")
    with open(private, "w") as f:
        f.write("original")
    yield shared, private
    shutil.rmtree(base)


def test_fallback_audit_hook_refuses_writes_outside_its_directory(host_dir):
    shared, private = host_dir
    attacks = [
        f"open({shared + '/planted'!r}, 'w').write('x')",
        f"import os\nos.close(os.open({shared + '/planted2'!r}, os.O_CREAT | os.O_WRONLY))",
        f"open({private!r}, 'a').write('x')",
        f"import os\nos.remove({private!r})",
        f"import os\nos.symlink({shared!r}, 'link')\nopen('link/planted3', 'w').write('x')",
        f"import os\nfd = os.open({shared!r}, os.O_RDONLY)\nos.open('planted4', os.O_CREAT | os.O_WRONLY, dir_fd=fd)",
        "open('../../escape.txt', 'w').write('x')",
    ]
    for code in attacks:
        result = judge(code + "\ndef add(a, b):\n    return a + b", parse_tests(ADD_TESTS), backend="fallback", timeout=5)
        assert result.status == "blocked" and result.score == 0.0, (code, result)
    assert os.listdir(shared) == []
    with open(private) as f:
        assert f.read() == "original"


def test_fallback_environment_is_clean(monkeypatch):
    monkeypatch.setenv("JAXRL_TEST_SECRET", "hunter2")
    code = "import os\nprint(sorted(os.environ))"
    result = judge(code, [], backend="fallback", timeout=5)
    assert result.status == "passed" and eval(result.stdout) == ["HOME", "LANG", "LC_ALL", "PATH", "TMPDIR"]


def test_fallback_hook_removes_memfd_create():
    result = judge("import os\nos.memfd_create('x')", [], backend="fallback", timeout=5)
    assert result.status == "failed" and "has no attribute 'memfd_create'" in result.reason


def test_memory_limit_holds_across_threads_and_processes():
    # Each process would have its own RLIMIT_AS: forks are refused; threads share the one limit.
    result, got = probe("""
        import json, os, threading
        got = {"chunks": 0}
        try:
            os.fork()
            got["fork"] = "allowed"
        except OSError as e:
            got["fork"] = e.errno
        keep, lock = [], threading.Lock()
        def grab():
            for _ in range(8):
                try:
                    block = bytearray(32 << 20)
                except MemoryError:
                    return
                with lock:
                    keep.append(block)
                    got["chunks"] += 1
        threads = []
        for _ in range(8):
            threads.append(threading.Thread(target=grab))
            try:
                threads[-1].start()
            except RuntimeError:  # no room left for its stack: the limit holds
                threads.pop()
        for t in threads: t.join()
        keep.clear()
        print(json.dumps(got))
    """, memory_mb=128, timeout=10)
    assert got is not None, result
    assert got["fork"] == 1 and got["chunks"] * 32 < 128, got  # EPERM; under 128 MiB in all
