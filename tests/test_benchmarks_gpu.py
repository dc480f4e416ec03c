"""The GPU suite (benchmarks/gpu_suite.py) is ready before any GPU time is spent: its dry run goes through
every stage on this machine's device, and its pure helpers are right. Nothing here times anything."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from harness import shapes  # noqa: E402
import gpu_suite  # noqa: E402


def test_dry_run_passes_every_stage_and_writes_its_results(tmp_path):
    doc = tmp_path / "bench.md"
    doc.write_text("# Benchmarks\n\nkept\n")
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_suite.py"), "--dry-run", "--json",
                           str(out), "--markdown", str(doc)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert {k: v["status"] for k, v in results["stages"].items()} == {s: "ok" for s in gpu_suite.STAGES}, \
        {k: v.get("error") for k, v in results["stages"].items()}
    s = results["stages"]
    # float32 on CPU: the library's logits are transformers', and the sampler's log-probs the trainer's.
    assert s["correctness"]["parity"]["float32"]["max_abs"] < 1e-4
    assert s["correctness"]["logp_identity"]["float32"] < 1e-4
    toy = s["sampler"]["toy"]
    assert toy["full length"]["lengths_ours"]["min"] == toy["new"]  # every row ran to the cap
    assert toy["heavy-tailed"]["lengths_ours"]["median"] < toy["new"]  # the stop set ends rows early
    assert all(r["tflops"] > 0 for r in s["update"]["runs"])
    grpo = s["grpo"]["runs"]  # heavy-tailed and packed, both frameworks timed (the full plan: test below)
    assert set(grpo) == {"toy heavy-tailed"} and len(grpo["toy heavy-tailed"]["timings"]) == 2
    assert "--pack-length" in grpo["toy heavy-tailed"]["args"]
    assert s["memory"]["plan_cpu"]["peak"] > s["memory"]["plan_cpu"]["params"] > 0
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nkept\n") and "<!-- gpu-suite-results:begin -->" in text
    assert "**Sampler**" in text and "**Memory**" in text and "**GRPO iteration**" in text
    # Re-rendering the saved results gives the same block (the doc is regenerated from the JSON files).
    assert gpu_suite.render(results) in text


def test_eos_set_reaches_the_stop_probability_of_the_median():
    rng = np.random.default_rng(0)
    mass = rng.dirichlet(np.ones(1000))
    for median in (5, 40, 200):
        ids = shapes.eos_set_for_median(mass, median, exclude=(0, 7))
        hazard = 1 - 2 ** (-1 / median)
        total = mass[ids].sum()
        assert total >= hazard and 0 not in ids and 7 not in ids and ids == sorted(set(ids))
        # Smallest: without its last-added id the set falls short (ids are added nearest the median mass first).
        order = [i for i in np.argsort(np.abs(mass - np.median(mass)), kind="stable") if i not in (0, 7)]
        assert mass[order[:len(ids) - 1]].sum() < hazard
        # A geometric length with that hazard has the asked-for median (within one token).
        assert abs(np.log(0.5) / np.log(1 - total) - median) <= max(1.0, 0.05 * median)
    with pytest.raises(ValueError, match="median"):
        shapes.eos_set_for_median(mass, 0.5)
    with pytest.raises(ValueError, match="no set"):
        shapes.eos_set_for_median(np.full(4, 1e-6), 2)


def test_completion_lengths_count_the_first_stop_token():
    tokens = np.array([[5, 6, 2, 6], [9, 9, 9, 9], [3, 5, 5, 5], [2, 3, 3, 3]])
    assert shapes.completion_lengths(tokens, {2, 3}, cap=4).tolist() == [3, 4, 1, 1]
    assert shapes.completion_lengths(tokens, {2, 3}, cap=2).tolist() == [2, 2, 1, 1]
    s = shapes.length_summary([1, 2, 3, 10])
    assert (s["min"], s["max"], s["median"], s["sum"]) == (1, 10, 2.5, 16)


def test_bad_arguments_are_one_line_errors():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_suite.py"), "--stages", "env,gpu"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "--stages: unknown ['gpu']" in proc.stderr
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_suite.py"), "--grpo-runs", "0.5B even"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "--grpo-runs: unknown ['0.5B even']; expected some of 0.5B uniform" in proc.stderr
    assert set(gpu_suite.PLANS["full"]["grpo"]) == {f"{s} {k}" for s in ("0.5B", "1.5B") for k in ("uniform", "heavy-tailed")}
    assert gpu_suite.PLANS["full"]["grpo"]["0.5B uniform"].count("--sequential") == 0  # only 1.5B runs one side at a time
    assert gpu_suite.PLANS["full"]["grpo"]["1.5B heavy-tailed"].count("--sequential") == 1


def test_saved_runs_merge_into_one_report():
    """The H100 results of 2026-11-26 came from two calls (the 1.5B sampler with memory and update, then the
    0.5B sampler): rendered together, the report holds both sampler sizes and the other stages once."""
    runs = [json.load(open(os.path.join(ROOT, "benchmarks", "results", f"h100-2026-11-26-{x}.json"))) for x in "ba"]
    merged = gpu_suite.merge_results(runs)
    assert set(merged["stages"]["sampler"]) >= {"0.5B", "1.5B"}
    assert merged["seconds"] == pytest.approx(runs[0]["seconds"] + runs[1]["seconds"])
    text = gpu_suite.render(merged)
    assert "| 0.5B (0.49B) | full length |" in text and "| 1.5B (1.54B) | heavy-tailed |" in text
    assert text.count("**Memory**") == 1 and text.count("**Update**") == 1
    # A failed later run of a stage replaces the earlier result: nothing stale is kept beside an error.
    failed = {"stages": {"sampler": {"status": "error", "error": "x"}}, "seconds": 1.0}
    assert gpu_suite.merge_results([*runs, failed])["stages"]["sampler"] == {"status": "error", "error": "x"}


def test_grpo_reruns_replace_their_label_alone():
    """The H200 results of 2026-11-28: the first call's 1.5B runs failed (both sides on the card at once),
    the second reran 1.5B uniform alone. Merged, that label is the rerun's and the others stay as they were."""
    runs = [json.load(open(os.path.join(ROOT, "benchmarks", "results", f"h200-2026-11-28-{x}.json"))) for x in "ab"]
    assert "error" in runs[0]["stages"]["grpo"]["runs"]["1.5B uniform"]
    merged = gpu_suite.merge_results(runs)["stages"]["grpo"]["runs"]
    assert set(merged) == {"0.5B uniform", "0.5B heavy-tailed", "1.5B uniform", "1.5B heavy-tailed"}
    assert merged["1.5B uniform"] == runs[1]["stages"]["grpo"]["runs"]["1.5B uniform"]
    assert merged["0.5B uniform"] == runs[0]["stages"]["grpo"]["runs"]["0.5B uniform"]
    text = gpu_suite.render(gpu_suite.merge_results(runs))
    assert text.count("| 0.5B uniform |") == 2 and "| 1.5B uniform | TRL (cuda) |" in text
    assert "- 1.5B heavy-tailed: did not finish" in text and text.count("**GRPO iteration**") == 1
