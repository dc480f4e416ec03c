"""The training benchmarks stay runnable and count right: benchmarks/mfu.py and benchmarks/compile_time.py
at toy size in subprocesses (started together, so the two compile-bound runs overlap), and mfu's FLOP
counter against a slow count of every matmul the update needs. Nothing here asserts on time."""
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    """Both scripts with `--toy --out <tmp>`, launched at once; each test waits for its own."""
    tmp = tmp_path_factory.mktemp("bench")
    procs = {}
    for script in ("mfu", "compile_time"):
        out = tmp / f"{script}.md"
        out.write_text("# Benchmarks\n\nhand-written text that a rerun must keep\n")
        proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "benchmarks", f"{script}.py"), "--toy",
                                 "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=ROOT)
        procs[script] = (proc, out)
    yield procs
    for proc, _ in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def finished(toy_runs, script, key):
    """(stdout, the script's results block of the markdown file) after checking it ran and kept the doc."""
    proc, out = toy_runs[script]
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    doc = out.read_text()
    assert doc.startswith("# Benchmarks\n\nhand-written text that a rerun must keep\n")
    return stdout, doc.split(f"<!-- {key}:begin -->")[1].split(f"<!-- {key}:end -->")[0]


def table_rows(block, first_cell):
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.splitlines()
            if line.startswith(f"| {first_cell}")]


def test_mfu_script_runs_at_toy_size(toy_runs):
    stdout, block = finished(toy_runs, "mfu", "mfu-results")
    mfu = float(re.search(r"MFU ([\d.]+)% of measured peak \(target >= 40%\)", block).group(1)) / 100
    assert 0 < mfu <= 1
    assert f"MFU {100 * mfu:.1f}% of measured peak" in stdout
    (main,) = table_rows(block, "remat=none, logits_chunk=4 (main)")
    seconds, gflops, pct = float(main[1]), float(main[4]), float(main[5])
    assert seconds > 0 and gflops > 0 and pct == pytest.approx(100 * mfu, abs=0.05 + 0.01 * pct)
    # Chunks of 4 over 6 completion tokens pad the LM head to 8 positions: executed > useful.
    assert float(main[3]) > 1
    pieces = {row[0]: row for row in table_rows(block, "")}
    assert float(pieces["blocks forward"][1]) > 0 and float(pieces["AdamW step (clip + adamw)"][1]) > 0
    assert any(name.startswith("matmul LM head (24x32 . 32x256)") for name in pieces)


def test_compile_time_script_runs_at_toy_size(toy_runs):
    stdout, block = finished(toy_runs, "compile_time", "compile-time-results")
    rows = {int(r[0]): r for r in table_rows(block, "") if r[0].isdigit()}
    assert sorted(rows) == [1, 2]
    for r in rows.values():
        assert r[1] == "unrolled"  # decode steps unroll up to DECODE_UNROLL_MAX_LAYERS
        parts = [float(x) for cell in r[2:6] for x in cell.split(" + ")]
        assert all(x > 0 for x in parts) and float(r[6]) == pytest.approx(sum(parts), rel=0.01)
    ratio = float(re.search(r"2/1 layers compile ratio ([\d.]+)x \(target <= 1.3x\)", block).group(1))
    totals = [float(rows[k][6]) for k in (1, 2)]
    assert ratio == pytest.approx(totals[1] / totals[0], rel=0.02)
    assert "2/1 layers update:" in stdout and "2/1 layers generate:" in stdout


def slow_update_flops(config, params, B, G, P, T):
    """Useful FLOPs of the update, token by token: 2 per weight of every kernel of the stacked layers and
    of the LM head, read from the parameter shapes, and 2*hd per key per head for q.k and again for p.v."""
    c = config
    layers = params["layers"]
    kernels = [layers[k]["kernel"] for k in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj")]
    per_token = sum(2 * math.prod(k.shape) for k in kernels)  # (L, ...) stacked: every layer
    head = 2 * math.prod(params["lm_head"].shape)

    def token(keys):
        return per_token + c.num_layers * c.num_heads * keys * (2 * c.head_dim + 2 * c.head_dim)

    forward = 0
    for _ in range(B):  # each prompt once (shared by its G completions)
        for i in range(P):
            forward += token(i + 1)
    for _ in range(B * G):
        for j in range(T - 1):  # the last completion token predicts nothing
            forward += token(P + j + 1)
        forward += T * head
    return 3 * forward


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_update_flops_against_a_slow_count(model_type):
    import jax

    from harness.flops import update_flops

    from jaxrl_llm.models import ModelConfig, init_params
    config = ModelConfig(model_type=model_type, vocab_size=11, hidden_size=8, intermediate_size=12, num_layers=3,
                         num_heads=4, num_kv_heads=2, head_dim=4, qkv_bias=model_type == "qwen2")
    params = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
    B, G, P, T = 2, 3, 5, 4
    f = update_flops(config, B, G, P, T)
    assert f["useful"] == pytest.approx(slow_update_flops(config, params, B, G, P, T), rel=1e-12)
    assert f["useful"] == pytest.approx(3 * f["forward"]) and f["forward"] == f["blocks_fwd"] + f["head_fwd"]


def test_executed_flops_count_the_extra_work():
    from harness.flops import update_flops

    from jaxrl_llm.metrics import flops_per_token
    from jaxrl_llm.models import ModelConfig
    c = ModelConfig(vocab_size=13, hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                    head_dim=4)
    B, G, P, T = 2, 2, 3, 5
    N = B * G
    weights, head = flops_per_token(c, 0, lm_head=False), 2 * c.hidden_size * c.vocab_size
    per_key = 4 * c.num_layers * c.num_heads * c.head_dim
    attention = sum(per_key * P for _ in range(B * P)) + sum(per_key * (P + T) for _ in range(N * T))
    blocks = weights * (B * P + N * T) + attention
    for chunk, padded in ((5, 5), (2, 6), (3, 6), (4, 6), (0, 5)):
        base = 3 * (blocks + head * N * padded) + head * N * padded  # + the checkpointed head's recompute
        assert update_flops(c, B, G, P, T, logits_chunk=chunk)["executed"] == pytest.approx(base)
        full = update_flops(c, B, G, P, T, logits_chunk=chunk, remat="full")["executed"]
        dots = update_flops(c, B, G, P, T, logits_chunk=chunk, remat="dots")["executed"]
        assert full == pytest.approx(base + blocks) and dots == pytest.approx(base + attention)
    assert update_flops(c, B, G, P, T)["executed"] > update_flops(c, B, G, P, T)["useful"]
    with pytest.raises(ValueError, match="remat"):
        update_flops(c, B, G, P, T, remat="some")
    with pytest.raises(ValueError, match="new_tokens"):
        update_flops(c, B, G, P, 0)


def test_argument_errors_are_one_line():
    import compile_time
    import mfu
    with pytest.raises(ValueError, match="--variants"):
        mfu.parse_args(["--variants", "chunk=3"])
    with pytest.raises(ValueError, match="--group"):
        mfu.parse_args(["--group", "1"])
    with pytest.raises(ValueError, match="--layers"):
        compile_time.parse_args(["--layers", "4"])
    with pytest.raises(ValueError, match="--hidden"):
        compile_time.parse_args(["--hidden", "30", "--heads", "4"])
