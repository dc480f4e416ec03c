"""The peers' side of the benchmarks: transformers `generate` in this process, and a framework in a
subprocess of its own (TRL, Tunix, or jaxrl_llm itself for a clean peak RSS) that steps one iteration per
'go' line on its stdin, in lockstep with the others.

torch runs with OMP_WAIT_POLICY=PASSIVE (set in `harness/__init__.py` before torch is imported, and in
every worker's environment): on a loaded host torch's OpenMP threads otherwise spin at barriers while their
partner is descheduled, which distorts its timings; it uses as many threads as XLA (one per core) unless
a script says otherwise.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # benchmarks/
VENVS = os.path.join(HERE, ".venv")  # git-ignored (".venv/" in .gitignore)
# What each framework's virtualenv installs, in order (torch first and pinned: plain `torch` would pull a
# multi-GB CUDA build; the CPU build is on disk here).
VENV_PACKAGES = {"trl": [["torch==2.13.0"], ["trl==1.16.0"]], "tunix": [["google-tunix==0.1.7"]]}
TORCH_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


# ---------------------------------------------------------------------------- transformers in-process
def hf_generate(model, prompts, mask, max_new_tokens, seed, num_return_sequences=1):
    """transformers sampling from the full distribution; returns the (rows, P+T) output ids."""
    import torch
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(input_ids=torch.as_tensor(prompts, dtype=torch.long),
                             attention_mask=torch.as_tensor(mask, dtype=torch.long), do_sample=True,
                             temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                             num_return_sequences=num_return_sequences, pad_token_id=0)
    rows = prompts.shape[0] * num_return_sequences
    if tuple(out.shape) != (rows, prompts.shape[1] + max_new_tokens):  # HF stopped early: not comparable
        raise RuntimeError(f"transformers generated shape {tuple(out.shape)}, expected full length")
    return out


def hf_with_threads(threads: int, fn):
    """fn with torch's intra-op thread count set to `threads` for the call."""
    def call(i):
        import torch
        torch.set_num_threads(threads)
        return fn(i)
    return call


# ------------------------------------------------------------------------------- workers (subprocess)
def emit(event: str, **data) -> None:
    """One protocol line from a worker to the parent (other output of the libraries is ignored)."""
    print("@@ " + json.dumps({"event": event, **data}, default=float), flush=True)


def wait_for_go() -> None:
    """The worker's side of a step: says 'ready', then waits for the parent's 'go' (exits on anything else)."""
    emit("ready")
    if sys.stdin.readline().strip() != "go":
        raise SystemExit(0)


def ensure_venv(name: str, log) -> str:
    """The python of benchmarks/.venv/<name>, created and installed on first use."""
    venv = os.path.join(VENVS, name)
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, ".installed")
    if os.path.exists(marker):
        return python
    log(f"creating {venv} ({', '.join(p for step in VENV_PACKAGES[name] for p in step)}); minutes, once")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    for packages in VENV_PACKAGES[name]:
        proc = subprocess.run([python, "-m", "pip", "install", "-q", *packages], capture_output=True, text=True)
        if proc.returncode:
            tail = " ".join(proc.stderr.strip().splitlines()[-3:])[:400]
            raise RuntimeError(f"pip install {' '.join(packages)} into {venv} failed: {tail}")
    with open(marker, "w") as f:
        f.write("ok\n")
    return python


class Worker:
    """`python -m harness.worker <kind> <json settings>` in a subprocess, stepping one iteration per
    `step()` call. `keep_path`: keep PYTHONPATH (this venv's packages; a venv of its own must not see them)."""

    def __init__(self, python: str, kind: str, settings: dict, keep_path: bool = False):
        drop = () if keep_path else ("PYTHONPATH", "VIRTUAL_ENV")
        env = {k: v for k, v in os.environ.items() if k not in drop} | TORCH_ENV
        # stderr goes to a file, read only on failure: a pipe nobody drains blocks a chatty worker.
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([python, "-m", "harness.worker", kind, json.dumps(settings)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                     env=env, cwd=HERE)
        self.events: dict[str, dict] = {}
        self.step_ends: list[str] = []  # the event that ended each step: 'ready' (next go awaited) or 'done'

    def expect(self, *events: str) -> dict:
        """Reads protocol lines until one of `events` arrives; raises with the worker's stderr if it exits."""
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self._stderr.seek(0)
                err = self._stderr.read()[-3000:]
                raise RuntimeError(f"worker exited (code {self.proc.wait()}) before {events}: {err}")
            if line.startswith("@@ "):
                msg = json.loads(line[3:])
                self.events[msg["event"]] = msg
                if msg["event"] in events:
                    return msg

    def step(self, _i=None) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        self.step_ends.append(self.expect("ready", "done")["event"])

    def close(self) -> dict:
        """The worker's 'done' message (its lengths, metrics, peak RSS) after it exits."""
        done = self.expect("done") if "done" not in self.events else self.events["done"]
        self.proc.stdin.close()
        self.proc.wait(timeout=120)
        return done
