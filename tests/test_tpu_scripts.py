"""tpu_scripts/*.sh: dry-run output, flag errors, and the real code paths against an emulated TPU.

Nothing here reaches Google Cloud. A fake `gcloud` placed first on PATH logs every call, plays back
scripted TPU states, and emulates a two-worker TPU VM as two local directories: `tpu-vm scp` copies
into them and `tpu-vm ssh --command` runs the command there with bash and HOME set to the worker's
directory, which is what the real ssh does on a worker. The workers' interpreters are stubs: the venv
python records the argv the trainer would get and then stays up like a trainer until it is killed.
So the quoting of the remote commands, the pid-file guard, the code copy and babysit's state machine
all run for real, in well under a second each.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "tpu_scripts"
SCRIPT_NAMES = ["create.sh", "delete.sh", "setup.sh", "launch.sh", "babysit.sh"]
FIND_LINKS = "https://storage.googleapis.com/jax-releases/libtpu_releases.html"

NAME, ZONE, ACCEL = "rl-pod", "us-east5-a", "v5p-64"
COMMON = ["--name", NAME, "--zone", ZONE]
CONFIG, WORKDIR = "configs/grpo_gsm8k.py", "gs://bucket/run1"
OVERRIDE = "--config.rollout.group_size=8"
# Every character class that a naive remote command would mangle: quotes, $, backquotes, ;, *, &, |.
TRICKY = "--config.data.system_prompt=Let's \"think\" $HOME `id`; a*b & c|d  (two spaces)"

# --- fakes --------------------------------------------------------------------------------------

# The fakes that run many times are bash (a Python start costs ~50 ms on a busy machine). Calls are
# logged one per line as printf %q words, which shlex.split reads back.

FAKE_GCLOUD = r"""#!/usr/bin/env bash
# Fake gcloud: logs the call, plays back TPU states, emulates the workers as local directories.
set -euo pipefail
root=$FAKE_ROOT
printf '%q ' "$@" >>"$root/calls"
printf '\n' >>"$root/calls"
args=("$@")
workers=("$root"/workers/worker*)
flag() {
  local a
  for a in "${args[@]}"; do
    if [[ $a == "$1="* ]]; then printf '%s' "${a#*=}"; return 0; fi
  done
  return 1
}
selected=("${workers[0]}")
if worker=$(flag --worker); then
  if [[ $worker == all ]]; then selected=("${workers[@]}"); else selected=("${workers[$worker]}"); fi
fi
if [[ $1 == storage && $2 == ls ]]; then
  if [[ -e $root/gcs/${3#gs://} ]]; then echo "$3"; exit 0; fi
  echo "ERROR: (gcloud.storage.ls) One or more URLs matched no objects." >&2
  exit 1
fi
[[ $1 == compute && $2 == tpus ]] || { echo "fake gcloud: unexpected call $*" >&2; exit 64; }
case $4 in
  describe)
    mapfile -t states <"$root/states"
    state=${states[0]}
    # The last state repeats.
    if ((${#states[@]} > 1)); then printf '%s\n' "${states[@]:1}" >"$root/states"; fi
    case $state in
      MISSING) echo "ERROR: (gcloud.compute.tpus.describe) NOT_FOUND: Resource '$5' was not found" >&2; exit 1 ;;
      ERROR) echo "ERROR: (gcloud.compute.tpus.describe) There was a problem refreshing your auth tokens" >&2; exit 1 ;;
    esac
    echo "$state" ;;
  delete)
    # A deleted TPU takes its processes and its disks with it. A trainer launched a moment ago is
    # first let to start (register its pid), as on a real TPU, so the tests do not depend on timing.
    for w in "${workers[@]}"; do
      if [[ -s $w/jaxrl_llm_logs/train.pid ]]; then
        pid=$(cat "$w/jaxrl_llm_logs/train.pid")
        for _ in $(seq 1000); do
          if grep -qsx "$pid" "$root/pids" || ! kill -0 "$pid" 2>/dev/null; then break; fi
          sleep 0.01
        done
        kill -KILL "$pid" 2>/dev/null || true
      fi
      rm -rf "$w"
      mkdir "$w"
    done ;;
  create) ;;
  scp)
    positional=()
    for a in "${args[@]:4}"; do [[ $a == --* ]] || positional+=("$a"); done
    for w in "${selected[@]}"; do cp "${positional[0]}" "$w/${positional[1]#*:}"; done ;;
  ssh)
    command=$(flag --command)
    status=0
    for w in "${selected[@]}"; do
      rc=0
      (cd "$w" && HOME=$w exec bash -c "$command") || rc=$?
      if ((status == 0)); then status=$rc; fi
    done
    exit "$status" ;;
  *) echo "fake gcloud: unexpected call $*" >&2; exit 64 ;;
esac
"""

FAKE_VENV_PYTHON = r"""#!/usr/bin/env bash
# Fake venv python of a worker: `-m jaxrl_llm.train` becomes the fake trainer (exec: same pid, so the
# pid file stays right); other calls (pip, -c) are logged and succeed.
if [[ ${1-} == -m && ${2-} == jaxrl_llm.train ]]; then exec "$FAKE_PYTHON" -S "$FAKE_TRAINER" "$@"; fi
printf '%q ' "$@" >>"$HOME/venv_python_calls"
printf '\n' >>"$HOME/venv_python_calls"
"""

FAKE_SYSTEM_PYTHON = r"""#!/usr/bin/env bash
# Fake system python of a worker: `-m venv DIR` makes DIR/bin/python, the fake venv python.
set -euo pipefail
printf '%q ' "$@" >>"$HOME/system_python_calls"
printf '\n' >>"$HOME/system_python_calls"
[[ $1 == -m && $2 == venv ]] || { echo "fake system python: unexpected call $*" >&2; exit 64; }
mkdir -p "$3/bin"
cp "$FAKE_VENV_PYTHON" "$3/bin/python"
"""

FAKE_TRAINER = r"""
# Fake trainer: records its argv, writes DONE at the N-th launch, then runs until it is killed.
import json, os, signal, sys
from pathlib import Path

root, home = Path(os.environ["FAKE_ROOT"]), Path(os.environ["HOME"])
args = sys.argv[3:]  # after -m jaxrl_llm.train
with open(root / "pids", "a") as f:
    f.write(f"{os.getpid()}\n")
with open(home / "trainer_runs.jsonl", "a") as f:
    f.write(json.dumps({"argv": args, "cwd": os.getcwd(), "pid": os.getpid(),
                        "env": os.environ.get("FAKE_TRAINER_ENV")}) + "\n")
if home.name == "worker0":
    with open(root / "launches", "a") as f:
        f.write("1\n")
    launches = len((root / "launches").read_text().splitlines())
    done_on = root / "done_on_launch"
    if done_on.exists() and int(done_on.read_text()) == launches:
        workdir = next(a for a in args if a.startswith("--workdir=")).split("=", 1)[1]
        done = root / "gcs" / workdir.removeprefix("gs://") / "DONE"
        done.parent.mkdir(parents=True, exist_ok=True)
        done.touch()
if os.environ.get("FAKE_TRAINER_CRASHES"):
    sys.exit(1)
signal.alarm(120)  # bounds a leaked fake trainer; the tests kill them by pid
signal.pause()
"""


def _write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def read_words(path: Path) -> list[list[str]]:
    """A log of printf %q lines, as argv lists."""
    return [shlex.split(line) for line in path.read_text().splitlines()] if path.exists() else []


# Tests must not depend on the machine's git configuration (signing, hooks, default branch).
GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          env={**os.environ, **GIT_ENV}, check=True, capture_output=True,
                          text=True).stdout.strip()


class Sandbox:
    """A fake gcloud on PATH, two emulated workers, a fake GCS and a small git checkout to copy."""

    def __init__(self, tmp: Path, template_repo: Path):
        self.root = tmp / "fake"
        self.workers = [self.root / "workers" / f"worker{i}" for i in range(2)]
        for d in [*self.workers, self.root / "gcs", tmp / "bin", tmp / "tmp"]:
            d.mkdir(parents=True)
        _write_exe(tmp / "bin" / "gcloud", FAKE_GCLOUD)
        self.venv_python = _write_exe(tmp / "venv_python", FAKE_VENV_PYTHON)
        self.system_python = _write_exe(tmp / "system_python", FAKE_SYSTEM_PYTHON)
        (tmp / "fake_trainer.py").write_text(FAKE_TRAINER)
        self.set_states(["READY"])
        self.env = dict(
            os.environ,
            PATH=f"{tmp / 'bin'}{os.pathsep}{os.environ['PATH']}",
            FAKE_ROOT=str(self.root),
            FAKE_VENV_PYTHON=str(self.venv_python),
            FAKE_TRAINER=str(tmp / "fake_trainer.py"),
            FAKE_PYTHON=sys.executable,
            TMPDIR=str(tmp / "tmp"),
            **GIT_ENV,
        )
        # The checkout to copy, from a template made once per module (git init costs processes).
        self.repo = tmp / "repo"
        shutil.copytree(template_repo, self.repo, symlinks=True)
        # What a copy must deliver: tracked files plus untracked files that are not ignored.
        self.expected_files = {"setup.py", "jaxrl_llm/__init__.py", CONFIG, "notes.txt", ".gitignore"}

    def git(self, *args: str, cwd: Path | None = None) -> str:
        return git(cwd or self.repo, *args)

    def run(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPTS / script), *args], capture_output=True, text=True,
                              env={**self.env, **env}, timeout=60)

    def set_states(self, states: list[str]) -> None:
        (self.root / "states").write_text("".join(f"{state}\n" for state in states))

    def calls(self) -> list[list[str]]:
        return read_words(self.root / "calls")

    def install_venvs(self) -> None:
        for worker in self.workers:
            (worker / "jaxrl_llm_venv" / "bin").mkdir(parents=True)
            shutil.copy(self.venv_python, worker / "jaxrl_llm_venv" / "bin" / "python")

    def trainer_runs(self, worker: Path, count: int) -> list[dict]:
        """The first `count` trainer starts on `worker`; they are background processes, so poll."""
        runs_file, deadline = worker / "trainer_runs.jsonl", time.monotonic() + 20
        while True:
            runs = ([json.loads(x) for x in runs_file.read_text().splitlines()]
                    if runs_file.exists() else [])
            if len(runs) >= count or time.monotonic() > deadline:
                assert len(runs) >= count, f"{worker.name}: {len(runs)} trainer starts, expected {count}"
                return runs
            time.sleep(0.01)

    def kill_trainers(self) -> None:
        pids = self.root / "pids"
        for pid in pids.read_text().split() if pids.exists() else []:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def template_repo(tmp_path_factory):
    """A checkout with tracked files, an untracked file, and ignored files that must not travel."""
    repo = tmp_path_factory.mktemp("template") / "repo"
    files = {
        "setup.py": "", "jaxrl_llm/__init__.py": "", CONFIG: "", "notes.txt": "untracked",
        ".gitignore": "/runs/\n*.log\n", "runs/old/ckpt": "ignored", "debug.log": "ignored",
    }
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "setup.py", "jaxrl_llm", "configs", ".gitignore")
    return repo


@pytest.fixture
def sb(tmp_path, template_repo):
    sandbox = Sandbox(tmp_path, template_repo)
    yield sandbox
    sandbox.kill_trainers()


def alive(pid: int) -> bool:
    """True for a live process; zombies (dead, not yet reaped) have an empty cmdline."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() != b""
    except FileNotFoundError:
        return False


def lines(proc: subprocess.CompletedProcess) -> list[list[str]]:
    """The printed commands, each parsed back into its argv as a POSIX shell would."""
    return [shlex.split(line) for line in proc.stdout.splitlines()]


def flag_value(argv: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]
    assert len(values) == 1, (name, argv)
    return values[0]


def shell_words(command: str) -> list[str]:
    """Words of a shell command line as the shell splits them, operators (; & >> ...) on their own."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def train_argv(remote_command: str) -> list[str]:
    """The trainer's argv in a launch command: the words from `-m jaxrl_llm.train` to `>>`."""
    words = shell_words(remote_command)
    [start] = [i + 2 for i in range(len(words)) if words[i:i + 2] == ["-m", "jaxrl_llm.train"]]
    return words[start:words.index(">>", start)]


def full_args(sb: Sandbox, script: str) -> list[str]:
    """Realistic, valid arguments for each script."""
    worker = ["--repo", str(sb.repo)]
    run = ["--config", CONFIG, "--workdir", WORKDIR, OVERRIDE]
    return {
        "create.sh": [*COMMON, "--accelerator-type", ACCEL, "--spot"],
        "delete.sh": COMMON,
        "setup.sh": [*COMMON, *worker],
        "launch.sh": [*COMMON, *worker, *run],
        "babysit.sh": [*COMMON, "--accelerator-type", ACCEL, "--spot", *worker, *run],
    }[script]


def without(args: list[str], flag: str) -> list[str]:
    i = args.index(flag)
    return args[:i] + args[i + 2:]


# --- static checks ------------------------------------------------------------------------------

def test_scripts_parse_as_bash_and_are_strict():
    for path in sorted(SCRIPTS.glob("*.sh")):
        subprocess.run(["bash", "-n", str(path)], check=True)
        if path.name != "common.sh":  # sourced: the caller's options apply
            assert "set -euo pipefail" in path.read_text(), path.name


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_clean():
    done = subprocess.run(["shellcheck", "-x", *sorted(str(p) for p in SCRIPTS.glob("*.sh"))],
                          cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_jax_pin_matches_installed_jax():
    common_sh = (SCRIPTS / "common.sh").read_text()
    pinned = re.search(r"^JAXRL_JAX_VERSION=(\S+)$", common_sh, re.M).group(1)
    assert pinned == importlib.metadata.version("jax")


# --- help and bad input ---------------------------------------------------------------------------

HELP_FLAGS = {
    "create.sh": ["--name", "--zone", "--accelerator-type", "--runtime-version", "--spot", "--queued",
                  "--dry-run"],
    "delete.sh": ["--name", "--zone", "--queued", "--dry-run"],
    "setup.sh": ["--name", "--zone", "--python", "--jax-version", "--git-url", "--dry-run"],
    "launch.sh": ["--name", "--zone", "--config", "--workdir", "--env", "--restart", "--dry-run"],
    "babysit.sh": ["--name", "--zone", "--accelerator-type", "--workdir", "--poll-interval",
                   "--max-iterations", "--max-restarts", "--dry-run"],
}


@pytest.mark.parametrize("script", SCRIPT_NAMES)
def test_help(sb, script):
    done = sb.run(script, "--help")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith(f"Usage: {script} ")
    for flag in HELP_FLAGS[script]:
        assert re.search(rf"^\s+{re.escape(flag)}\b", done.stdout, re.M), flag
    assert sb.calls() == []


REQUIRED = [(s, f) for s, flags in {
    "create.sh": ["--name", "--zone", "--accelerator-type"],
    "delete.sh": ["--name", "--zone"],
    "setup.sh": ["--name", "--zone"],
    "launch.sh": ["--name", "--zone", "--config", "--workdir"],
    "babysit.sh": ["--name", "--zone", "--accelerator-type", "--config", "--workdir"],
}.items() for f in flags]


@pytest.mark.parametrize("script,flag", REQUIRED)
def test_missing_required_flag_is_a_one_line_error(sb, script, flag):
    args = without(full_args(sb, script), flag) + ["--dry-run"]
    done = sb.run(script, *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"{script}: error: {flag} is required")
    assert sb.calls() == []


BAD = [
    ("create.sh", ["--bogus"], "unknown argument '--bogus'"),
    ("create.sh", ["--name", "--zone", ZONE], "--name needs a value, got the flag --zone"),
    ("create.sh", ["--name", "RL_pod", "--zone", ZONE, "--accelerator-type", ACCEL], "--name must be"),
    ("create.sh", ["--zone", "useast", "--name", NAME, "--accelerator-type", ACCEL], "--zone must"),
    ("create.sh", [*COMMON, "--accelerator-type", "tpu7x-8"], "--runtime-version is required"),
    ("create.sh", [*COMMON, "--accelerator-type", "v5p"], "--accelerator-type must look like"),
    ("create.sh", [*COMMON, "--accelerator-type", ACCEL, "--extra-flag", "reserved"],
     "--extra-flag takes a gcloud flag"),
    ("launch.sh", ["--env", "NO_EQUALS_SIGN"], "--env must be NAME=VALUE"),
    ("launch.sh", ["--config", "configs/missing.py"], "--config configs/missing.py is not a file"),
    ("launch.sh", ["--repo", "/nonexistent"], "--repo must be a directory"),
    ("setup.sh", ["--jax-version", "latest"], "--jax-version must look like"),
    ("setup.sh", ["--code-dir", "."], "--code-dir must name a directory of its own"),
    ("setup.sh", ["--venv", "envs/../.."], "--venv must name a directory of its own"),
    ("launch.sh", ["--log-dir", "/"], "--log-dir must name a directory of its own"),
    ("babysit.sh", ["--workdir", "/tmp/run1"], "--workdir must be gs://"),
    ("babysit.sh", ["--poll-interval", "5m"], "--poll-interval must be a non-negative integer"),
    ("babysit.sh", ["--max-restarts", "-1"], "--max-restarts must be a non-negative integer"),
    ("babysit.sh", ["--max-iterations", "0"], "cannot end in a dry run"),
    # babysit checks the flags it forwards with the other scripts' rules, at start-up.
    ("babysit.sh", ["--env", "1X=y"], "launch.sh: error: --env must be NAME=VALUE"),
    ("babysit.sh", ["--runtime-version", "--spot"], "--runtime-version needs a value"),
]


@pytest.mark.parametrize("script,extra,message", BAD)
def test_bad_input_is_a_one_line_error(sb, script, extra, message):
    args = full_args(sb, script) if script != "create.sh" else []
    done = sb.run(script, *args, *extra, "--dry-run")
    assert done.returncode == 2, done.stdout
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert sb.calls() == []


def test_non_git_repo_is_refused(sb, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    done = sb.run("setup.sh", *COMMON, "--repo", str(plain), "--dry-run",
                  GIT_CEILING_DIRECTORIES=str(tmp_path))
    assert done.returncode == 2 and "is not a git work tree" in done.stderr


# --- dry runs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("queued", [False, True])
@pytest.mark.parametrize("spot", [False, True])
def test_create_dry_run(sb, spot, queued):
    args = [*COMMON, "--accelerator-type", ACCEL, "--project", "my-proj",
            "--extra-flag=--labels=team=rl", "--dry-run"]
    done = sb.run("create.sh", *args, *(["--spot"] if spot else []), *(["--queued"] if queued else []))
    assert done.returncode == 0, done.stderr
    [argv] = lines(done)
    if queued:
        expected = ["gcloud", "compute", "tpus", "queued-resources", "create", NAME, f"--zone={ZONE}",
                    f"--node-id={NAME}", f"--accelerator-type={ACCEL}",
                    "--runtime-version=v2-alpha-tpuv5"]
    else:
        expected = ["gcloud", "compute", "tpus", "tpu-vm", "create", NAME, f"--zone={ZONE}",
                    f"--accelerator-type={ACCEL}", "--version=v2-alpha-tpuv5"]
    expected += ["--spot"] if spot else []
    assert argv == expected + ["--labels=team=rl", "--project=my-proj"]
    assert sb.calls() == []


@pytest.mark.parametrize("accel,version", [
    ("v6e-8", "v2-alpha-tpuv6e"), ("v5p-128", "v2-alpha-tpuv5"),
    ("v5litepod-16", "v2-alpha-tpuv5-lite"), ("v4-32", "tpu-ubuntu2204-base"),
])
def test_create_default_runtime_version(sb, accel, version):
    done = sb.run("create.sh", *COMMON, "--accelerator-type", accel, "--dry-run")
    assert f"--version={version}" in lines(done)[0]
    done = sb.run("create.sh", *COMMON, "--accelerator-type", accel, "--runtime-version", "custom-1",
                  "--dry-run")
    assert "--version=custom-1" in lines(done)[0]


@pytest.mark.parametrize("queued", [False, True])
def test_delete_dry_run(sb, queued):
    done = sb.run("delete.sh", *COMMON, "--dry-run", *(["--queued"] if queued else []))
    kind, extra = ("queued-resources", ["--force"]) if queued else ("tpu-vm", [])
    assert lines(done) == [["gcloud", "compute", "tpus", kind, "delete", NAME, f"--zone={ZONE}",
                            *extra, "--quiet"]]
    assert sb.calls() == []


def test_setup_dry_run(sb):
    done = sb.run("setup.sh", *full_args(sb, "setup.sh"), "--dry-run")
    assert done.returncode == 0, done.stderr
    scp, ssh = lines(done)
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
    assert Path(scp[5]).name == "jaxrl_llm_code.tgz" and scp[6] == f"{NAME}:jaxrl_llm_code.tgz"
    assert scp[7:] == [f"--zone={ZONE}", "--worker=all"]
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", NAME]
    assert ssh[6:8] == [f"--zone={ZONE}", "--worker=all"]
    words = shell_words(flag_value(ssh, "--command"))
    pin = f"jax[tpu]=={importlib.metadata.version('jax')}"
    i = words.index(pin)
    assert words[i - 4:i + 3] == ["-m", "pip", "install", "-q", pin, "-f", FIND_LINKS]
    assert sb.calls() == [] and not list((sb.root.parent / "tmp").iterdir())


def test_launch_dry_run_sends_one_identical_command_to_all_workers(sb):
    done = sb.run("launch.sh", *full_args(sb, "launch.sh"), "--project", "p1", "--dry-run", "--",
                  TRICKY)
    assert done.returncode == 0, done.stderr
    scp, ssh = lines(done)
    assert scp[4] == "scp" and "--worker=all" in scp and "--project=p1" in scp
    assert ssh[:8] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", NAME, f"--zone={ZONE}",
                       "--worker=all"]
    assert train_argv(flag_value(ssh, "--command")) == [
        f"--config={CONFIG}", f"--workdir={WORKDIR}", OVERRIDE, TRICKY]
    assert sb.calls() == []


def test_launch_dry_run_git_mode_copies_nothing(sb):
    done = sb.run("launch.sh", *COMMON, "--git-url", "https://github.com/o/r.git", "--git-ref",
                  "v1.2", "--config", CONFIG, "--workdir", WORKDIR, "--dry-run")
    [ssh] = lines(done)
    command = flag_value(ssh, "--command")
    assert "git clone -q https://github.com/o/r.git" in command
    assert "fetch -q origin v1.2" in command


def test_babysit_dry_run_prints_one_iteration(sb):
    done = sb.run("babysit.sh", *full_args(sb, "babysit.sh"), "--dry-run", "--", TRICKY)
    assert done.returncode == 0, done.stderr
    printed = lines(done)
    assert [argv[:5] for argv in printed] == [
        ["gcloud", "storage", "ls", f"{WORKDIR}/DONE"],
        ["gcloud", "compute", "tpus", "tpu-vm", "describe"],
        ["gcloud", "compute", "tpus", "tpu-vm", "delete"],
        ["gcloud", "compute", "tpus", "tpu-vm", "create"],
        ["gcloud", "compute", "tpus", "tpu-vm", "scp"],  # setup
        ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],
        ["gcloud", "compute", "tpus", "tpu-vm", "scp"],  # launch
        ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],
    ]
    assert "--format=value(state)" in printed[1]
    assert "--spot" in printed[3]
    assert all("--worker=all" in argv for argv in printed[4:])
    launch = flag_value(printed[7], "--command")
    assert train_argv(launch) == [f"--config={CONFIG}", f"--workdir={WORKDIR}", OVERRIDE, TRICKY]
    assert "stopping jaxrl_llm.train" in launch  # relaunches replace survivors
    assert sb.calls() == []


def test_babysit_dry_run_queued_two_iterations(sb):
    args = [*full_args(sb, "babysit.sh"), "--queued", "--dry-run", "--max-iterations", "2"]
    done = sb.run("babysit.sh", *args)
    printed = lines(done)
    # The same plan twice (up to the local tarball's temporary name), without a real sleep.
    plan = [argv[:5] + argv[6:] if argv[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
            else argv for argv in printed]
    assert len(plan) == 2 * 8 and plan[:8] == plan[8:]
    assert "would sleep 300 s" in done.stderr
    assert printed[1][3:5] == ["queued-resources", "describe"]
    assert "--format=value(state.state)" in printed[1]
    assert printed[2][3:5] == ["queued-resources", "delete"] and "--force" in printed[2]
    assert printed[3][3:5] == ["queued-resources", "create"] and f"--node-id={NAME}" in printed[3]


# --- emulated TPU ---------------------------------------------------------------------------------

def test_launch_runs_the_same_trainer_command_on_every_worker(sb):
    sb.install_venvs()
    env_value = "a b 'c' $HOME"
    args = [*full_args(sb, "launch.sh"), "--env", f"FAKE_TRAINER_ENV={env_value}", "--", TRICKY]
    done = sb.run("launch.sh", *args)
    assert done.returncode == 0, done.stderr
    expected = [f"--config={CONFIG}", f"--workdir={WORKDIR}", OVERRIDE, TRICKY]
    for worker in sb.workers:
        [run] = sb.trainer_runs(worker, 1)
        assert run["argv"] == expected
        assert run["env"] == env_value
        assert run["cwd"] == str(worker / "jaxrl_llm")
        assert (worker / "jaxrl_llm_logs" / "train.pid").read_text().strip() == str(run["pid"])
        assert "launch on" in (worker / "jaxrl_llm_logs" / "train.log").read_text()
        copied = {str(p.relative_to(worker / "jaxrl_llm")) for p in (worker / "jaxrl_llm").rglob("*")
                  if p.is_file()}
        assert copied == sb.expected_files
        assert not (worker / "jaxrl_llm_code.tgz").exists()
    assert [c[3] for c in sb.calls()] == ["scp", "ssh"]
    assert not list((sb.root.parent / "tmp").iterdir())  # the local tarball is cleaned up

    # A second launch must not start a second trainer next to the first one ...
    again = sb.run("launch.sh", *args)
    assert again.returncode != 0 and "pass --restart to replace it" in again.stderr
    first_pids = [sb.trainer_runs(w, 1)[0]["pid"] for w in sb.workers]
    assert all(alive(pid) for pid in first_pids)
    # ... but --restart replaces it.
    restarted = sb.run("launch.sh", "--restart", *args)  # before the --: after it, it is the trainer's
    assert restarted.returncode == 0, restarted.stderr
    for worker, old_pid in zip(sb.workers, first_pids):
        runs = sb.trainer_runs(worker, 2)
        assert len(runs) == 2 and runs[1]["argv"] == expected
        assert not alive(old_pid) and alive(runs[1]["pid"])


def test_launch_git_mode_checks_out_the_ref_on_every_worker(sb, tmp_path):
    sb.install_venvs()
    sb.git("commit", "-q", "-m", "first")
    first = sb.git("rev-parse", "HEAD")
    args = [*COMMON, "--git-url", str(sb.repo), "--git-ref", "main", "--config", CONFIG,
            "--workdir", WORKDIR]
    assert sb.run("launch.sh", *args).returncode == 0
    for worker in sb.workers:
        assert sb.git("rev-parse", "HEAD", cwd=worker / "jaxrl_llm") == first
        assert sb.trainer_runs(worker, 1)[0]["cwd"] == str(worker / "jaxrl_llm")
    # A later launch fetches the new commit into the existing clones.
    (sb.repo / "notes.txt").write_text("second")
    sb.git("add", "notes.txt")
    sb.git("commit", "-q", "-m", "second")
    second = sb.git("rev-parse", "HEAD")
    assert sb.run("launch.sh", *args, "--restart").returncode == 0
    for worker in sb.workers:
        assert sb.git("rev-parse", "HEAD", cwd=worker / "jaxrl_llm") == second
    assert {c[3] for c in sb.calls()} == {"ssh"}  # nothing copied


def test_setup_is_idempotent_and_pins_jax(sb):
    args = [*full_args(sb, "setup.sh"), "--python", str(sb.system_python)]
    for _ in range(2):
        done = sb.run("setup.sh", *args)
        assert done.returncode == 0, done.stderr
    version = importlib.metadata.version("jax")
    for worker in sb.workers:
        venv = worker / "jaxrl_llm_venv"
        assert read_words(worker / "system_python_calls") == [["-m", "venv", str(venv)]]  # made once
        pip = [c for c in read_words(worker / "venv_python_calls") if c[:2] == ["-m", "pip"]]
        assert pip == 2 * [
            ["-m", "pip", "install", "-q", "--upgrade", "pip"],
            ["-m", "pip", "install", "-q", f"jax[tpu]=={version}", "-f", FIND_LINKS],
            ["-m", "pip", "install", "-q", "-e", str(worker / "jaxrl_llm") + "[gcs]"],
        ]
        assert {str(p.relative_to(worker / "jaxrl_llm")) for p in (worker / "jaxrl_llm").rglob("*")
                if p.is_file()} == sb.expected_files


def test_setup_refuses_to_swap_code_under_a_running_trainer(sb):
    sb.install_venvs()
    assert sb.run("launch.sh", *full_args(sb, "launch.sh")).returncode == 0
    pids = [sb.trainer_runs(w, 1)[0]["pid"] for w in sb.workers]
    args = [*full_args(sb, "setup.sh"), "--python", str(sb.system_python)]
    refused = sb.run("setup.sh", *args)
    assert refused.returncode != 0 and "pass --stop" in refused.stderr
    assert all(alive(pid) for pid in pids)
    assert sb.run("setup.sh", *args, "--stop").returncode == 0
    assert not any(alive(pid) for pid in pids)


def call_kinds(calls: list[list[str]]) -> list[str]:
    """Compact names of gcloud calls: 'ls', 'describe', 'delete', 'create', 'scp', 'ssh'."""
    return [c[1] if c[0] == "storage" else c[3] for c in calls]


def test_babysit_recreates_a_preempted_tpu_and_resumes_until_done(sb):
    sb.install_venvs()
    # A transient gcloud error, then a ready TPU without a trainer, then a preemption.
    sb.set_states(["ERROR", "READY", "PREEMPTED", "READY"])
    (sb.root / "done_on_launch").write_text("2")
    args = [*full_args(sb, "babysit.sh"), "--python", str(sb.system_python), "--poll-interval", "0",
            "--max-iterations", "30", "--", TRICKY]
    done = sb.run("babysit.sh", *args)
    assert done.returncode == 0, done.stderr
    kinds = call_kinds(sb.calls())
    setup_and_launch = ["scp", "ssh", "scp", "ssh"]
    assert kinds[:14 + 4] == [
        "ls", "describe",                                          # ERROR: nothing deleted
        "ls", "describe", "ssh", "ls", *setup_and_launch,          # READY, no trainer: launch
        "ls", "describe", "delete", "create", *setup_and_launch,   # PREEMPTED: recreate, relaunch
    ]
    # Afterwards only checks, until the trainer's DONE shows up.
    assert set(kinds[18:]) <= {"ls", "describe", "ssh"} and kinds[-1] == "ls"
    create = sb.calls()[kinds.index("create")]
    assert "--spot" in create and f"--accelerator-type={ACCEL}" in create
    # Two launches on worker 0; the recreated workers have fresh disks, so each shows the second.
    assert len((sb.root / "launches").read_text().splitlines()) == 2
    first_trainers = [int(pid) for pid in (sb.root / "pids").read_text().split()[:2]]
    assert not any(alive(pid) for pid in first_trainers)  # went down with the preempted TPU
    expected = [f"--config={CONFIG}", f"--workdir={WORKDIR}", OVERRIDE, TRICKY]
    for worker in sb.workers:
        [run] = sb.trainer_runs(worker, 1)
        assert run["argv"] == expected and alive(run["pid"])
    assert "done" in done.stderr.splitlines()[-1]


def test_babysit_gives_up_on_a_trainer_that_keeps_crashing(sb):
    sb.install_venvs()
    args = [*full_args(sb, "babysit.sh"), "--python", str(sb.system_python), "--poll-interval", "0",
            "--max-iterations", "40", "--max-restarts", "2"]
    done = sb.run("babysit.sh", *args, FAKE_TRAINER_CRASHES="1")
    assert done.returncode == 1
    assert "giving up" in done.stderr.splitlines()[-1]
    assert len(sb.trainer_runs(sb.workers[0], 2)) == 2
    assert "delete" not in call_kinds(sb.calls())


def test_babysit_queued_resource_waits_for_active_then_deletes_when_done(sb):
    sb.install_venvs()
    sb.set_states(["SUSPENDED", "WAITING_FOR_RESOURCES", "ACTIVE"])
    (sb.root / "done_on_launch").write_text("1")
    args = [*full_args(sb, "babysit.sh"), "--queued", "--python", str(sb.system_python),
            "--poll-interval", "0", "--max-iterations", "30", "--delete-when-done"]
    done = sb.run("babysit.sh", *args)
    assert done.returncode == 0, done.stderr
    calls = sb.calls()
    kinds = call_kinds(calls)
    assert kinds[:11] == ["ls", "describe", "delete", "create",   # SUSPENDED: recreate, no launch
                          "ls", "describe",                        # WAITING_FOR_RESOURCES
                          "ls", "describe", "ssh", "ls", "scp"]    # ACTIVE, no trainer: launch
    assert kinds[-2:] == ["ls", "delete"]
    assert calls[2][2] == "queued-resources" and "--force" in calls[2]
    assert calls[3][2] == "queued-resources" and "--spot" in calls[3]
