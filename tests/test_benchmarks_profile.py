"""benchmarks/sampler_profile.py stays runnable: a toy-size run in a subprocess (old code extracted from git
and run in its own worker process included) writes its markdown block, tables and plot. Nothing here times
anything: the numbers are measured by hand (docs/benchmarks.md), never asserted on."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _table(block: str, first_header: str) -> list[list[str]]:
    """Rows (cells stripped) of the markdown table in `block` whose header starts with `first_header`."""
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def stage_rows_speedup(rows, label):
    return next(r for r in rows if r[1] == label)[4].strip("*x")


def test_sampler_profile_script_runs_at_toy_size(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from sampler_profile import OLD_REV
    has_rev = subprocess.run(["git", "-C", ROOT, "cat-file", "-e", f"{OLD_REV}^{{commit}}"], capture_output=True)
    if has_rev.returncode:
        pytest.skip(f"revision {OLD_REV} (the code before the sampler rewrite) is not in this clone (shallow?)")
    out, png = tmp_path / "b.md", tmp_path / "p.png"
    out.write_text("# Benchmarks\n\nhand-written text\n\n<!-- sampler-results:begin -->\nother block\n"
                   "<!-- sampler-results:end -->\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "sampler_profile.py"), "--toy",
                           "--out", str(out), "--plot", str(png)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "old code:" in proc.stdout and "new code:" in proc.stdout

    doc = out.read_text()
    # Other blocks and hand-written text survive; the profile block is appended with the image link.
    assert doc.startswith("# Benchmarks\n\nhand-written text\n\n<!-- sampler-results:begin -->\nother block\n")
    block = doc.split("<!-- sampler-profile-results:begin -->")[1].split("<!-- sampler-profile-results:end -->")[0]
    assert "![" in block and "(p.png)" in block
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    stages = _table(block, "model")
    labels = [row[1] for row in stages]
    for label in ("decoder layers", "LM head", "draw (temperature 1)", "draw (greedy)", "sum of the three stages"):
        assert label in labels
    for row in stages:
        assert row[0] == "toy"
        # Every row but the step inside generate (a difference of two timings, noisy at toy size) is a time.
        if "step inside" not in row[1]:
            assert float(row[2]) > 0 and float(row[3]) > 0
    assert float(stage_rows_speedup(stages, "decoder layers")) > 0
    stage_rows = {row[1]: row for row in stages}
    total = stage_rows["sum of the three stages"]
    parts = [stage_rows[k] for k in ("decoder layers", "LM head", "draw (temperature 1)")]
    for col in (2, 3):  # the sum row is the sum of the rows above it (3 significant digits each)
        assert abs(float(total[col]) - sum(float(p[col]) for p in parts)) <= 0.01 * float(total[col]) + 1e-3

    e2e = _table(block, "model | params")
    assert len(e2e) == 1 and e2e[0][0] == "toy"
    row = e2e[0]
    gaps = [float(x) for x in row[10].split(" / ")]
    assert all(g <= 1e-4 for g in gaps)  # old and new sampled log-probs both agree with the trainer
    assert float(row[11]) <= 1e-4  # old and new decode steps compute the same hidden states


def test_sampler_profile_compares_any_revision_into_its_own_block(tmp_path):
    """`--old-rev HEAD` (this clone's own code as the 'before') and `--block`: the results land between the
    named markers, say which revision was the 'before', and old and new compute the same rollouts."""
    out = tmp_path / "b.md"
    out.write_text("# Benchmarks\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "sampler_profile.py"), "--toy",
                           "--old-rev", "HEAD", "--out", str(out), "--block", "my-ab", "--plot",
                           str(tmp_path / "p.png")], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = out.read_text()
    assert "sampler-profile-results" not in doc
    block = doc.split("<!-- my-ab:begin -->")[1].split("<!-- my-ab:end -->")[0]
    assert "Before: revision HEAD; after: this checkout." in block
    row = _table(block, "model | params")[0]
    assert all(float(g) <= 1e-4 for g in row[10].split(" / "))
    assert float(row[11]) <= 1e-4  # the decode steps of HEAD and of the working tree agree
