"""benchmarks/sampler_lengths.py stays runnable: a toy-size run in a subprocess, its markdown block checked."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sampler_lengths_script_runs_at_toy_size(tmp_path):
    out = tmp_path / "bench.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "sampler_lengths.py"), "--toy", "--out",
                           str(out)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-3000:]
    block = out.read_text().split("<!-- sampler-lengths-results:begin -->")[1].split("<!-- sampler-lengths-results:end -->")[0]
    rows = [line for line in block.splitlines() if line.startswith("| ours") or line.startswith("| transformers")]
    names = ["ours static", "ours shrink 2", "ours S=2", "transformers"]
    assert [r.split("|")[1].strip().split(" (")[0] for r in rows] == names
    gap = float(re.search(r"`token_logprobs`: ([0-9.e+-]+)\.", block).group(1))
    assert gap < 1e-4  # the slotted and shrunk samplers' log-probs are the trainer's
    for row in rows:  # every side produced some useful tokens, within the cap of 16
        lengths = [int(x) for x in re.findall(r"\d+", row.split("|")[7].split("(")[0])]
        assert 1 <= lengths[0] <= lengths[-1] <= 16


def test_grpo_iteration_heavy_tailed_with_decode_slots_at_toy_size(tmp_path):
    """Our side of benchmarks/grpo_iteration.py with stop ids calibrated for heavy-tailed lengths (written to
    the workspace's generation_config.json, which the trainer reads) and continuous batching."""
    out = tmp_path / "bench.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "grpo_iteration.py"), "--toy",
                           "--frameworks", "ours", "--heavy-tailed", "--decode-slots", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-3000:]
    block = out.read_text()
    assert "rollout.decode_slots=2" in block and "heavy-tailed:" in block
    mean, low, high = re.search(r"jaxrl_llm completion lengths: .*overall ([\d.]+)\), min (\d+), max (\d+) of 16",
                                block).groups()
    assert 1 <= int(low) <= float(mean) < 16 and int(high) <= 16  # rows stop early: the stop ids are in effect
