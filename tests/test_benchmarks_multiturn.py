"""benchmarks/multiturn_sampler.py stays runnable: a toy-size run in a subprocess, its markdown block checked."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_multiturn_sampler_script_runs_at_toy_size(tmp_path):
    out = tmp_path / "bench.md"
    out.write_text("<!-- multiturn-sampler-results:begin -->\n<!-- multiturn-sampler-results:end -->\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "multiturn_sampler.py"), "--toy", "--out",
                           str(out)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-3000:]
    block = out.read_text()
    rows = [line.split("|")[1].strip() for line in block.splitlines() if line.startswith("| ours")
            or line.startswith("| transformers")]
    assert rows == ["ours multi-turn (KV cache)", "ours re-prefill per turn", "transformers re-prefill per turn (1 thr)"]
    gap = float(re.search(r"`token_logprobs` over the episodes' model tokens: ([0-9.e+-]+)\.", block).group(1))
    assert gap < 1e-4  # the multi-turn sampler's log-probs are the trainer's
    for line in block.splitlines():
        if line.startswith("| ours") or line.startswith("| transformers"):
            assert float(line.split("|")[3].replace(",", "")) > 0  # model tokens/s


def test_agent_endpoint_script_runs_at_toy_size(tmp_path):
    """benchmarks/agent_endpoint.py: both paths run the same episodes (the script exits non-zero otherwise)
    and its block has a row per agent count."""
    out = tmp_path / "bench.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "agent_endpoint.py"), "--toy", "--out",
                           str(out)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-3000:]
    block = out.read_text().split("<!-- agent-endpoint:begin -->")[1].split("<!-- agent-endpoint:end -->")[0]
    rows = [line.split("|")[1:3] for line in block.splitlines() if line.startswith("| toy")]
    assert [(s.strip(), int(n)) for s, n in rows] == [("toy", 1), ("toy", 4)]
