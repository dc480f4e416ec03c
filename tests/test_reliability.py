"""Reliability (issue 8): exact resume after SIGKILL at any point, checkpoint integrity, the non-finite
guard, atomic exports, and a leak-free run. docs/reliability.md says what each test guarantees.

The crash tests run the real CLI as subprocesses killed by `jaxrl_llm.faults` (JAXRL_LLM_FAULT); one
uninterrupted reference run and one workdir crashed three times cost five process starts in all.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import fixtures_reliability as fr
from jaxrl_llm import faults

STEPS = 5
# A failed Orbax restore leaves tensorstore callbacks into its closed event loop (noise; see cli.py).
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(scope="session")
def compile_cache(request, tmp_path_factory):
    """JAX's persistent compilation cache of the CLI subprocesses: they share the tiny shapes, so only
    the first compiles. Kept in pytest's cache directory (`--cache-clear` empties it): a later session
    compiles nothing. A kill never lands mid-entry: the fault points run after their step's compiles."""
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("jaxrl_llm_compilation_cache") if cache is not None else tmp_path_factory.mktemp("jax_cache")


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, compile_cache):
    """One uninterrupted run of STEPS steps (it also fills the compilation cache)."""
    wd = tmp_path_factory.mktemp("reference")
    proc = fr.run_cli("train", fr.train_args(wd, total_steps=STEPS, export__at_end=True), fr.cli_env(compile_cache))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return wd


def _killed(proc, where):
    assert proc.returncode == -9, (proc.returncode, proc.stderr[-3000:])
    assert f"jaxrl_llm.faults: SIGKILL at {where}" in proc.stderr


# ================================================================================= crash and resume
def test_sigkill_anywhere_then_rerun_gives_the_uninterrupted_run(reference_run, compile_cache, tmp_path):
    """SIGKILL during sampling, during the update, during an asynchronous checkpoint write (with a
    corrupted latest checkpoint in between); rerunning the same command each time ends bitwise equal to
    the uninterrupted run: metrics (but wall-clock perf/*), samples, whole train state, HF export."""
    wd = tmp_path / "run"
    args = fr.train_args(wd, total_steps=STEPS, export__at_end=True)

    # Orbax writes checkpoint k in the background while step k+1 runs, and a save starts by waiting for
    # the previous one: at any kill, checkpoints up to k-1 are committed, k may or may not be.
    # 1. Killed while sampling step 3.
    proc = fr.run_cli("train", args, fr.cli_env(compile_cache, "sample:2"))
    _killed(proc, "sample:2")
    assert fr.committed_steps(wd) in ([1], [1, 2])
    assert [r["step"] for r in fr.read_jsonl(wd / "metrics.jsonl")] == [1, 2]

    # 2. Resumed; killed while the update of step 4 runs on the donated state.
    proc = fr.run_cli("train", args, fr.cli_env(compile_cache, "update:3"))
    _killed(proc, "update:3")
    assert "resumed from step" in proc.stderr
    assert fr.committed_steps(wd)[-2:] in ([1, 2], [2, 3])

    # A torn write in the latest checkpoint (its largest file, the array data, cut in half).
    latest = fr.committed_steps(wd)[-1]
    fr.truncate_largest_file(wd / "checkpoints" / str(latest) / "state")

    # 3. The corrupt checkpoint is reported in one line and moved aside; the run resumes from the one
    #    before, saves the lost steps afresh, and is killed while the background write of 4 is in flight.
    proc = fr.run_cli("train", args, fr.cli_env(compile_cache, "checkpoint:4"))
    _killed(proc, "checkpoint:4")
    reports = [line for line in proc.stderr.splitlines() if "cannot be restored" in line]
    assert len(reports) == 1 and f"checkpoint step {latest} " in reports[0], reports
    # Seen twice under load (a traceback through Orbax's _read_array_index_and_device_put, its first
    # lines cut from pytest's report): the lines around it say which channel printed it, should it recur.
    lines = proc.stderr.splitlines()
    first = next((i for i, line in enumerate(lines) if "Traceback" in line), None)
    assert first is None, "\n".join(lines[max(0, first - 8):first + 40])
    assert f"resumed from step {latest - 1} " in proc.stderr
    assert glob.glob(str(wd / "checkpoints" / f"{latest}.corrupt-*"))
    in_flight = glob.glob(str(wd / "checkpoints" / "4.orbax-checkpoint-tmp*"))
    assert in_flight, os.listdir(wd / "checkpoints")  # the kill did interrupt the write of 4 ...
    assert fr.committed_steps(wd)[-1] == 3  # ... which is not a checkpoint

    # 4. The unfinished 4 is never selected: resumed from 3, the run completes.
    proc = fr.run_cli("train", args, fr.cli_env(compile_cache))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from step 3 " in proc.stderr
    assert not glob.glob(str(wd / "checkpoints" / "*.orbax-checkpoint-tmp*"))  # Orbax cleaned it up
    assert (wd / "DONE").read_text().strip() == str(STEPS)

    ref, got = fr.read_jsonl(reference_run / "metrics.jsonl"), fr.read_jsonl(wd / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert fr.without_perf(got) == fr.without_perf(ref)
    assert fr.read_jsonl(wd / "samples.jsonl") == fr.read_jsonl(reference_run / "samples.jsonl")
    a, b = fr.read_state(reference_run, STEPS), fr.read_state(wd, STEPS)
    assert a.keys() == b.keys() and any("params" in k for k in a)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    with open(reference_run / "hf" / "model.safetensors", "rb") as f1, open(wd / "hf" / "model.safetensors", "rb") as f2:
        assert f1.read() == f2.read()


# ============================================================================ checkpoint integrity
BASE = np.random.default_rng(0).standard_normal(300).astype(np.float32)  # incompressible, unlike arange


def _checkpointer_run(directory, steps, **kw):
    """Saves a small state at `steps` (value of step s: BASE + s); returns the abstract state."""
    import jax.numpy as jnp

    from jaxrl_llm.checkpoint import Checkpointer, abstract_like
    ck = Checkpointer(str(directory), **kw)
    for s in steps:
        ck.save(s, {"w": jnp.asarray(BASE) + s, "n": jnp.int32(s)}, {"step": s})
    abstract = abstract_like({"w": jnp.zeros(300, jnp.float32), "n": jnp.int32(0)})
    ck.close()
    return abstract


def _exact(state, meta, s):
    return (np.array_equal(np.asarray(state["w"]), BASE + np.float32(s))
            and int(state["n"]) == s and meta["step"] == s)


def _damage(path, how):
    """'truncate': cut the file in half (a torn write); 'flip': flip one bit of its middle byte (bit rot)."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        if how == "truncate":
            f.truncate(size // 2)
        else:
            f.seek(size // 2)
            byte = f.read(1)[0]
            f.seek(size // 2)
            f.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_damaging_any_file_of_the_latest_checkpoint_never_restores_wrong_numbers(tmp_path, caplog, how):
    """Every file of the newest step, damaged in turn: restore gives that step exactly (the file was not
    needed) or, reported in one line, the previous step exactly, after moving the damaged one aside, so
    that the step can be saved again (Orbax silently refuses to save a step that exists). A flipped bit
    in the compressed array data still decodes: the per-array checksums catch it."""
    from jaxrl_llm.checkpoint import Checkpointer
    clean = tmp_path / "clean"
    abstract = _checkpointer_run(clean, [1, 2], async_save=False)
    files = sorted(os.path.relpath(os.path.join(r, f), clean / "2") for r, _, fs in os.walk(clean / "2") for f in fs)
    largest = max(files, key=lambda rel: os.path.getsize(clean / "2" / rel))  # the array data
    assert len(files) >= 8 and os.path.getsize(clean / "2" / largest) > 1000
    outcomes = {}
    for rel in files:
        work = tmp_path / "work"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(clean, work)
        _damage(work / "2" / rel, how)
        caplog.clear()
        ck = Checkpointer(str(work), async_save=False)
        s, state, meta = ck.restore(abstract)
        assert _exact(state, meta, s), rel
        outcomes[rel] = s
        if s == 1:
            reports = [r.getMessage() for r in caplog.records if "cannot be restored" in r.getMessage()]
            assert len(reports) == 1 and "\n" not in reports[0] and "checkpoint step 2" in reports[0]
            assert ck.steps() == [1] and glob.glob(str(work / "2.corrupt-*"))
            assert ck.save(2, {"w": jax.numpy.asarray(BASE) + 2, "n": jax.numpy.int32(2)}, {"step": 2})
            ck.wait()
            assert ck.steps() == [1, 2] and _exact(*ck.restore(abstract)[1:], 2)
        ck.close()
    assert outcomes[largest] == 1, outcomes


def test_unfinished_checkpoint_is_never_selected_and_is_cleaned_up(tmp_path):
    from jaxrl_llm.checkpoint import Checkpointer
    abstract = _checkpointer_run(tmp_path, [1, 2], async_save=False)
    shutil.copytree(tmp_path / "2", tmp_path / "3.orbax-checkpoint-tmp-1234")  # a write cut by a kill
    ck = Checkpointer(str(tmp_path), async_save=False)
    assert ck.steps() == [1, 2]
    assert ck.restore(abstract)[0] == 2
    ck.close()
    assert not glob.glob(str(tmp_path / "*tmp*"))


def test_no_restorable_checkpoint_moves_nothing(tmp_path):
    """When no step restores, the cause is likelier the code (another state layout) than the files:
    the error says so and every checkpoint stays where it is."""
    import jax.numpy as jnp

    from jaxrl_llm.checkpoint import Checkpointer, abstract_like
    _checkpointer_run(tmp_path, [1, 2], async_save=False)
    ck = Checkpointer(str(tmp_path), async_save=False)
    with pytest.raises(ValueError, match=r"no checkpoint in .* can be restored \(tried steps \[2, 1\]"):
        ck.restore(abstract_like({"w": jnp.zeros(7, jnp.float32), "n": jnp.int32(0)}))
    assert ck.steps() == [1, 2] and not glob.glob(str(tmp_path / "*corrupt*"))
    ck.close()


def test_listing_steps_during_an_async_save_keeps_max_to_keep(tmp_path):
    """Orbax forgets a step whose asynchronous write is in flight when its manager reloads; `steps()`
    waits for the write first, so max_to_keep still holds (it did not: one checkpoint too many)."""
    import jax.numpy as jnp

    from jaxrl_llm.checkpoint import Checkpointer
    ck = Checkpointer(str(tmp_path), max_to_keep=2, async_save=True)
    for s in range(1, 6):
        ck.save(s, {"w": jnp.ones(3) * s}, {"step": s})
        assert ck.latest_step() == s
    ck.close()
    assert sorted(int(n) for n in os.listdir(tmp_path) if n.isdigit()) == [4, 5]


# =============================================================================== non-finite guard
def test_nan_and_inf_skip_the_update_count_it_and_stop_after_k(reference_run, compile_cache, tmp_path):
    """Scores poisoned after the reward functions (tests/fixtures_reliability.py says why there) make
    the loss NaN: step 2 (NaN) is skipped, step 3 trains, steps 4 (inf) and 5 (NaN) are skipped, and
    with train.max_nonfinite_steps=2 the run stops after step 5 with one line; every checkpoint holds
    the last good parameters, bitwise, and restores."""
    wd = tmp_path / "run"
    env = fr.cli_env(compile_cache, **{fr.POISON_ENV: "2:nan,4:inf,5:nan"})
    proc = subprocess.run([sys.executable, "-m", "fixtures_reliability",
                           *fr.train_args(wd, total_steps=8, train__max_nonfinite_steps=2)],
                          capture_output=True, text=True, env=env, cwd=fr.ROOT, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = fr.error_lines(proc.stderr, "jaxrl_llm.train")
    assert len(errors) == 1 and errors[0].startswith(
        "jaxrl_llm.train: error: 2 consecutive updates had NaN/inf loss or gradients (step 5); stopped with the "
        "last good checkpoint intact (train.max_nonfinite_steps=2); likely causes: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    rows = fr.read_jsonl(wd / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["train/skipped_updates"] for r in rows] == [0, 1, 0, 1, 1]
    assert [r["train/nonfinite_streak"] for r in rows] == [0, 1, 0, 1, 2]
    assert rows[1]["policy/loss"] == "nan" and np.isfinite(rows[2]["policy/loss"])

    assert fr.committed_steps(wd) == [1, 2, 3, 4]  # the step that tripped the guard saved nothing
    ckpt = {s: fr.read_state(wd, s) for s in (1, 2, 3, 4)}
    params = lambda s: {k: v for k, v in ckpt[s].items() if k.startswith("['params']")}
    same = lambda a, b: all(np.array_equal(a[k], b[k]) for k in a)
    ref1 = fr.read_state(reference_run, 1)
    assert same(ckpt[1], ref1)  # step 1 was not poisoned: as in the reference run
    assert same(params(2), params(1)) and same(params(4), params(3)) and not same(params(3), params(2))
    for s, opt_step, streak in ((1, 1, 0), (2, 1, 1), (3, 2, 0), (4, 2, 1)):
        assert (int(ckpt[s]["['opt_step']"]), int(ckpt[s]["['nonfinite']"])) == (opt_step, streak), s
        assert all(np.isfinite(v).all() for k, v in ckpt[s].items() if v.dtype.kind == "f")


# =================================================================================== atomic exports
def _tree_bytes(directory) -> dict[str, bytes]:
    out = {}
    for root, _, files in os.walk(directory):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[os.path.relpath(os.path.join(root, f), directory)] = fh.read()
    return out


def test_export_killed_mid_write_leaves_the_previous_export_intact(reference_run, compile_cache, tmp_path):
    """SIGKILL inside save_hf, every file written to the temporary directory, before the rename: the
    previous export at --out is byte for byte intact and nothing else looks like an export; the same
    command then replaces it."""
    out = tmp_path / "hf"
    shutil.copytree(reference_run / "hf", out)
    before = _tree_bytes(out)
    args = [f"--workdir={reference_run}", f"--out={out}", "--step=2"]
    proc = fr.run_cli("export", args, fr.cli_env(compile_cache, "export"))
    _killed(proc, "export")
    assert _tree_bytes(out) == before
    leftovers = [n for n in os.listdir(tmp_path) if n != "hf"]
    assert leftovers and all(n.startswith(".hf.tmp-") for n in leftovers), leftovers  # hidden, named temporary
    proc = fr.run_cli("export", args, fr.cli_env(compile_cache))
    assert proc.returncode == 0, proc.stderr[-2000:]
    after = _tree_bytes(out)
    assert after.keys() == before.keys() and after["model.safetensors"] != before["model.safetensors"]


def _write_files(names, fail_after=None):
    def write(tmp):
        for i, name in enumerate(names):
            if i == fail_after:
                raise OSError("disk full")
            with open(os.path.join(tmp, name), "w") as f:
                f.write(name)
    return write


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_atomic_directory_replaces_or_keeps_never_mixes(tmp_path, monkeypatch, exchange):
    from jaxrl_llm import fs
    if not exchange:  # the portable path (no RENAME_EXCHANGE: macOS, some network filesystems)
        monkeypatch.setattr(fs, "_exchange", lambda a, b: False)
    out = tmp_path / "export"
    with pytest.raises(OSError, match="disk full"):  # a first export that fails: nothing at all
        fs.atomic_directory(str(out), _write_files(["a", "b"], fail_after=1))
    assert os.listdir(tmp_path) == []
    fs.atomic_directory(str(out), _write_files(["a", "b"]))
    with pytest.raises(OSError, match="disk full"):  # a failing replacement: the old one, unchanged
        fs.atomic_directory(str(out), _write_files(["c", "d"], fail_after=1))
    assert sorted(os.listdir(out)) == ["a", "b"] and os.listdir(tmp_path) == ["export"]
    fs.atomic_directory(str(out), _write_files(["c"]))  # a successful one replaces it whole
    assert os.listdir(out) == ["c"] and os.listdir(tmp_path) == ["export"]
    (tmp_path / "file").write_text("keep me")
    with pytest.raises(FileExistsError, match="exists and is not a directory"):
        fs.atomic_directory(str(tmp_path / "file"), _write_files(["a"]))
    assert (tmp_path / "file").read_text() == "keep me" and sorted(os.listdir(tmp_path)) == ["export", "file"]


# ====================================================================================== soak smoke
def test_soak_smoke_no_retrace_and_flat_memory(compile_cache, tmp_path, reference_run):
    """benchmarks/soak.py, 30 small steps with a checkpoint and samples every 5: after a 10-step warm-up
    nothing is traced or compiled again and the resident memory stays flat (the 300-step run of the
    tiny config and its numbers are in docs/reliability.md)."""
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, os.path.join(fr.ROOT, "benchmarks", "soak.py"), "--small", "--steps=30",
                           "--warmup=10", "--window=10", "--checkpoint-every=5", "--samples-every=5", f"--json={out}"],
                          capture_output=True, text=True, env=fr.cli_env(compile_cache), cwd=fr.ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert len(r["step_s"]) == 30 and r["events_during_warmup"] > 0  # the listener does see traces
    assert r["traces_after_warmup"] == []
    assert r["rss_growth_pct"] < 10.0 and r["rss_growth_from_min_pct"] < 10.0, r["rss_mib_per_step"]


# ================================================================================== fault injection
def test_fault_spec_parsing_and_disarmed_points():
    assert faults.parse("update:3, export,sample:0") == {("update", 3), ("export", None), ("sample", 0)}
    assert faults.parse("") == frozenset()
    for bad in ("update:x", "update:-1", "3", "a b:2"):
        with pytest.raises(ValueError, match="JAXRL_LLM_FAULT=.* must be comma-separated name"):
            faults.parse(bad)
    faults.arm("")
    faults.point("update", jax.numpy.int32(3))  # disarmed: returns, reads nothing
    faults.arm("update:7")
    try:
        faults.point("step", 6)
        faults.point("update")  # step 6 (inherited): no match, still alive
        faults.point("sample", 7)
    finally:
        faults.arm("")


# ============================================================================== bad-input catalogue
# (name, CLI, extra arguments or a builder of them, a piece of the one-line error). Most fail before any
# compilation; the reward cases fail in the first step's scoring (the compilation cache makes them fast).
def _train(**overrides):
    return lambda a: ("train", fr.train_args(a["wd"], **overrides), {})


def _data(path_key, **overrides):
    return lambda a: ("train", fr.train_args(a["wd"], data__task="", data__path=a[path_key], **overrides), {})


CATALOGUE = [
    ("group_size_not_an_int", _train(rollout__group_size="abc"),
     "flag --config.rollout.group_size=abc: invalid literal for int()"),
    ("unknown_config_field", lambda a: ("train", fr.train_args(a["wd"]) + ["--config.rollout.gruop_size=2"], {}),
     "--config.rollout.gruop_size=2: unknown config field 'rollout.gruop_size'; did you mean 'rollout.group_size'?"),
    ("unknown_config_section", lambda a: ("train", fr.train_args(a["wd"]) + ["--config.vision.patch=4",
                                                                             "--config.export.plot=False"], {}),
     "--config.vision.patch=4: unknown config field 'vision' (no such section; sections: advantage, checkpoint,"),
    ("negative_total_steps", _train(total_steps=-1), "config.total_steps must be an int >= 1, got -1"),
    ("total_steps_below_the_checkpoint", lambda a: ("train", fr.train_args(a["ref_copy"], total_steps=3), {}),
     f"config.total_steps=3 is below step {STEPS}, where the checkpoint in"),
    ("bad_config_file_argument", lambda a: ("train", [f"--config={fr.ROOT}/configs/tiny.py:algo=grpo,lr=1",
                                                      f"--workdir={a['wd']}"], {}),
     "configs/tiny.py: unknown argument(s) ['lr']"),
    ("negative_learning_rate", _train(optimizer__learning_rate=-1e-3),
     "config.optimizer.learning_rate must be a number > 0, got -0.001"),
    ("unknown_algorithm", _train(algo="ppo2"), "algo 'ppo2' is unknown"),
    ("group_size_1_for_grpo", _train(rollout__group_size=1),
     "config.rollout.group_size must be at least 2 for algo grpo"),
    ("batch_not_divisible_by_mesh", lambda a: ("train", fr.train_args(a["wd"], rollout__batch_prompts=3),
                                               {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}),
     "config.rollout.batch_prompts=3 (per micro-batch: 3) must be divisible by mesh data*fsdp=2"),
    ("missing_model_dir", _train(model__path="/nonexistent/model"), "model.path '/nonexistent/model' is not a directory"),
    ("model_without_config_json", lambda a: ("train", fr.train_args(a["wd"], model__path=a["model_weights_only"]), {}),
     "model_weights_only/config.json: not found (a Hugging Face model directory holds config.json)"),
    ("model_without_tokenizer", lambda a: ("train", fr.train_args(a["wd"], model__path=a["model_no_tokenizer"]), {}),
     "model_no_tokenizer' holds none of tokenizer.json, tokenizer_config.json"),
    ("model_without_weights", lambda a: ("train", fr.train_args(a["wd"], model__path=a["model_no_weights"]), {}),
     "model_no_weights: no model.safetensors or model.safetensors.index.json"),
    ("model_unsupported_architecture", lambda a: ("train", fr.train_args(a["wd"], model__path=a["model_gpt2"]), {}),
     "unsupported model_type 'gpt2'; supported: llama"),
    ("model_config_disagrees_with_weights", lambda a: ("train", fr.train_args(a["wd"], model__path=a["model_shapes"]),
                                                       {}), "model_shapes: tensor model.layers.0.mlp."),
    # The model's files are checked before the dataset is read (trainer/preflight.py): a bad checkpoint is
    # the error, not the unreadable data file beside it.
    ("weights_checked_before_the_data", lambda a: ("train", fr.train_args(
        a["wd"], data__task="", data__path=a["data_bad_line"], model__path=a["model_shapes"]), {}),
     "model_shapes: tensor model.layers.0.mlp."),
    ("value_model_missing", _train(algo="ppo", rollout__group_size=1, value__init="/nonexistent/value"),
     "config.value.init '/nonexistent/value' is neither 'policy' nor a directory"),
    ("mesh_product_not_the_device_count", _train(mesh__data=3, mesh__fsdp=1),
     "mesh data*fsdp*expert*sequence*tensor = 3*1*1*1*1 = 3 does not match the 1 available devices"),
    ("corrupt_safetensors", lambda a: ("train", fr.train_args(a["wd"], model__path=a["model_corrupt"]), {}),
     "model.safetensors: truncated"),
    ("tokenizer_without_eos", lambda a: ("train", fr.train_args(a["wd"], tokenizer=a["tok_no_eos"]), {}),
     "has no EOS token"),
    ("dataset_missing_its_column", _data("data_no_prompt"), "dataset lacks the configured column(s) ['prompt']"),
    ("empty_dataset", _data("data_empty"), "no rows"),
    ("missing_dataset_file", _data("data_missing"), "data.path '/nonexistent/prompts.jsonl' does not exist"),
    ("jsonl_with_a_bad_line", _data("data_bad_line"), "could not be read: line 2 is not valid JSON"),
    ("dataset_of_unsupported_format", _data("data_txt"), "has extension '.txt'; expected one of"),
    ("dataset_with_a_null_prompt", _data("data_null_prompt"),
     "data.prompt_column 'prompt' of row 3 holds NoneType, expected a string"),
    ("prompt_too_long_under_error_policy", _data("data_long", data__max_prompt_length_policy="error"),
     "tokens > data.max_prompt_length=16 (data.max_prompt_length_policy='error')"),
    ("unknown_reward", _train(reward__functions="no_such_module:score"), "cannot import reward 'no_such_module:score'"),
    ("reward_raises", _train(reward__functions="fixtures_reliability:always_raises"),
     "reward 'always_raises' raised on row 0: ZeroDivisionError: the grader divided by zero"),
    ("reward_wrong_length", _train(reward__functions="fixtures_rewards:wrong_length"),
     "reward 'wrong_length' returned 49 values for 48 rows, in the reward check at start-up"),
    ("reward_nan", _train(reward__functions="fixtures_rewards:nan_reward"), "reward 'nan_reward' returned nan on row 0"),
    ("unwritable_workdir", lambda a: ("train", fr.train_args(os.path.join(a["a_file"], "run")), {}),
     "cannot be created"),
    ("incompatible_existing_workdir", lambda a: ("train", fr.train_args(a["wd_other_config"]), {}),
     "holds a run with another config (rollout.max_new_tokens: 5 there, 3 now)"),
    ("damaged_workdir_config", lambda a: ("train", fr.train_args(a["wd_bad_json"]), {}), "config.json is not valid JSON"),
    ("export_missing_step", lambda a: ("export", [f"--workdir={a['ref']}", f"--out={a['out']}", "--step=99"], {}),
     "no checkpoint for step 99"),
    ("export_corrupt_checkpoint", lambda a: ("export", [f"--workdir={a['ref_corrupt']}", f"--out={a['out']}"], {}),
     "cannot be restored: array params/embed does not match the checksum saved with it"),
    ("export_bad_dtype", lambda a: ("export", [f"--workdir={a['ref']}", f"--out={a['out']}", "--dtype=int8"], {}),
     "flag --dtype=int8: value should be one of"),
    ("export_out_is_a_file", lambda a: ("export", [f"--workdir={a['ref']}", f"--out={a['a_file']}"], {}),
     "exists and is not a directory"),
    ("export_out_checked_before_the_checkpoint",  # refused before the (damaged) checkpoint is read
     lambda a: ("export", [f"--workdir={a['ref_corrupt']}", f"--out={a['a_file']}"], {}),
     "exists and is not a directory"),
]
VERBOSE = ("negative_learning_rate",)  # rerun with --verbose: the full traceback


def _catalogue_assets(tmp, ref) -> dict:
    import fixtures_data
    import fixtures_hf
    a = {"ref": ref, "a_file": str(tmp / "a_file"), "empty_dir": str(tmp / "empty_dir")}
    (tmp / "a_file").write_text("not a directory")
    os.makedirs(a["empty_dir"])
    tok = fixtures_data.make_tiny_tokenizer(tmp / "model_corrupt", chat_template=False)
    fixtures_hf.make_hf_model(str(tmp / "model_corrupt"), "llama", vocab_size=len(tok))
    fr.truncate_largest_file(tmp / "model_corrupt")  # the weights
    a["model_corrupt"] = str(tmp / "model_corrupt")
    fixtures_data.make_tiny_tokenizer(tmp / "tok_no_eos", chat_template=False, eos=False)
    a["tok_no_eos"] = str(tmp / "tok_no_eos")
    a.update(_model_assets(tmp))
    rows = lambda prompt: "".join(json.dumps({"prompt": prompt, "answer": "4", "level": 1}) + "\n" for _ in range(8))
    (tmp / "long.jsonl").write_text(rows("What is the largest of the digits 3, 1, 4, 1, 5, 9, 2, 6?"))
    (tmp / "no_prompt.jsonl").write_text(rows("2+2?").replace('"prompt"', '"question"'))
    (tmp / "empty.jsonl").write_text("")
    a.update(data_long=str(tmp / "long.jsonl"), data_no_prompt=str(tmp / "no_prompt.jsonl"),
             data_empty=str(tmp / "empty.jsonl"), data_missing="/nonexistent/prompts.jsonl")
    lines = rows("2+2?").splitlines()
    (tmp / "bad_line.jsonl").write_text("\n".join([lines[0], '{"prompt": "3+1?", ', *lines[1:]]) + "\n")
    (tmp / "prompts.txt").write_text("2+2?\n")
    (tmp / "null_prompt.jsonl").write_text("".join(json.dumps({"prompt": None if i == 3 else "2+2?", "answer": "4", "level": 1})
                                                   + "\n" for i in range(8)))
    a.update(data_bad_line=str(tmp / "bad_line.jsonl"), data_txt=str(tmp / "prompts.txt"),
             data_null_prompt=str(tmp / "null_prompt.jsonl"))
    shutil.copytree(ref, tmp / "ref_copy", ignore=shutil.ignore_patterns("hf"))
    a["ref_copy"] = str(tmp / "ref_copy")
    config = json.loads((ref / "config.json").read_text())
    config["rollout"]["max_new_tokens"] = 5
    os.makedirs(tmp / "wd_other_config" / "checkpoints" / "1")  # it saved a step: a run to keep, not replace
    (tmp / "wd_other_config" / "config.json").write_text(json.dumps(config))
    os.makedirs(tmp / "wd_bad_json")
    (tmp / "wd_bad_json" / "config.json").write_text('{"algo": "grpo", ')  # cut short
    a.update(wd_other_config=str(tmp / "wd_other_config"), wd_bad_json=str(tmp / "wd_bad_json"))
    shutil.copytree(ref, tmp / "ref_corrupt", ignore=shutil.ignore_patterns("hf"))
    # The export promises to refuse parameters that do not verify (it reads no optimizer state): flip one
    # bit of a parameter, wherever Orbax lays the bytes out, and keep the checksums saved with the step.
    fr.flip_a_parameter_bit(tmp / "ref_corrupt" / "checkpoints" / str(STEPS) / "state")
    a["ref_corrupt"] = str(tmp / "ref_corrupt")
    return a


def _model_assets(tmp) -> dict:
    """Hugging Face model directories with one thing wrong each."""
    import fixtures_data
    import fixtures_hf
    out = {}
    for name in ("model_weights_only", "model_no_tokenizer", "model_no_weights", "model_gpt2", "model_shapes"):
        tok = fixtures_data.make_tiny_tokenizer(tmp / name, chat_template=False)
        fixtures_hf.make_hf_model(str(tmp / name), "llama", vocab_size=len(tok))
        out[name] = str(tmp / name)
    for f in os.listdir(tmp / "model_weights_only"):  # the weights alone
        if f != "model.safetensors":
            os.remove(tmp / "model_weights_only" / f)
    for f in os.listdir(tmp / "model_no_tokenizer"):
        if f.startswith(("tokenizer", "special_tokens", "vocab")):
            os.remove(tmp / "model_no_tokenizer" / f)
    os.remove(tmp / "model_no_weights" / "model.safetensors")
    fixtures_hf.rewrite_config(out["model_gpt2"], model_type="gpt2", architectures=["GPT2LMHeadModel"])
    config = json.loads((tmp / "model_shapes" / "config.json").read_text())
    fixtures_hf.rewrite_config(out["model_shapes"], intermediate_size=2 * config["intermediate_size"])
    return out


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory, reference_run, compile_cache):
    """Every case of CATALOGUE (and the --verbose reruns) through the CLI, two processes at a time."""
    import concurrent.futures
    tmp = tmp_path_factory.mktemp("catalogue")
    assets = _catalogue_assets(tmp, reference_run)
    jobs = {}
    for name, build, _ in CATALOGUE:
        for verbose in (False, True) if name in VERBOSE else (False,):
            key = name + ("+verbose" if verbose else "")
            a = dict(assets, wd=str(tmp / key / "wd"), out=str(tmp / key / "out"))
            os.makedirs(tmp / key)
            module, args, extra = build(a)
            jobs[key] = (module, args + (["--verbose"] if verbose else []), fr.cli_env(compile_cache, **extra), a)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {k: pool.submit(fr.run_cli, m, args, env) for k, (m, args, env, _) in jobs.items()}
        return {k: (f.result(), jobs[k][3]) for k, f in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name,expected", [(n, e) for n, _, e in CATALOGUE], ids=[n for n, _, _ in CATALOGUE])
def test_bad_input_exits_with_one_line_and_leaves_nothing_behind(catalogue, name, expected):
    proc, a = catalogue[name]
    prog = "jaxrl_llm." + ("export" if name.startswith("export_") else "train")
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    errors = fr.error_lines(proc.stderr, prog)
    assert len(errors) == 1 and expected in errors[0], proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == errors[0]  # the last word, after any log line
    assert "Traceback" not in proc.stderr
    checkpoints = os.path.join(a["wd"], "checkpoints")  # no checkpoint, not even a temporary one
    assert not os.path.isdir(checkpoints) or os.listdir(checkpoints) == []
    parent = os.path.dirname(a["out"])
    assert not os.path.exists(a["out"]) and not [n for n in os.listdir(parent) if n.startswith(".out")]
    assert open(a["a_file"]).read() == "not a directory"


def test_the_file_checks_need_neither_datasets_nor_transformers(tmp_path):
    """trainer/preflight.py runs before the command line imports the trainer: a damaged model directory
    fails with JAX alone imported, not after `datasets`, `transformers` and the tokenizer have loaded."""
    import fixtures_data
    import fixtures_hf
    tok = fixtures_data.make_tiny_tokenizer(tmp_path / "m", chat_template=False)
    fixtures_hf.make_hf_model(str(tmp_path / "m"), "llama", vocab_size=len(tok))
    fr.truncate_largest_file(tmp_path / "m")
    fields = {"model.path": str(tmp_path / "m"), "data.task": "digit_puzzles"}
    code = ("import sys\nfrom jaxrl_llm import config\nfrom jaxrl_llm.trainer import preflight\n"
            f"c = config.prepare(config.from_dict({fields!r}))\n"
            "try:\n    preflight.check_inputs(c)\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
            "heavy = ('datasets', 'transformers', 'torch', 'pandas', 'tokenizers')\n"
            "print(sorted(m for m in heavy if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=fr.cli_env(), cwd=fr.ROOT,
                          timeout=300)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and len(lines) == 2, proc.stderr[-2000:]
    assert lines[0].startswith("CheckpointError") and "model.safetensors: truncated" in lines[0], lines
    assert lines[1] == "[]"


@pytest.mark.parametrize("name", VERBOSE)
def test_bad_input_with_verbose_shows_the_traceback(catalogue, name):
    proc, _ = catalogue[name + "+verbose"]
    assert proc.returncode != 0 and "Traceback (most recent call last)" in proc.stderr


def test_cli_flag_errors_are_one_line_and_library_noise_is_dropped(capsys):
    """The in-process halves of the catalogue's promises: a bad flag is one line (its traceback with
    --verbose), and the noise of a failed Orbax restore (asyncio's unretrieved task exceptions,
    finalized coroutines, callbacks into a closed loop) is dropped while anything else still shows."""
    import logging
    import types

    from absl import flags

    from jaxrl_llm import cli
    with pytest.raises(SystemExit) as exit_info:
        cli.flags_parser("prog")(["prog", "--no_such_flag=1"])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == "prog: error: Unknown command line flag 'no_such_flag'\n"
    with pytest.raises(flags.Error):
        cli.flags_parser("prog")(["prog", "--no_such_flag=1", "--verbose"])
    noise = logging.LogRecord("asyncio", logging.ERROR, "", 0, "Task exception was never retrieved\nfuture: <Task>",
                              None, None)
    other = logging.LogRecord("asyncio", logging.ERROR, "", 0, "Unhandled exception in event loop", None, None)
    assert not cli._drop_unretrieved(noise) and cli._drop_unretrieved(other)
    seen = []
    hook = cli._drop_closed_loop_callbacks(seen.append)

    async def read():
        return 0
    coroutine = read()
    for exc, obj in ((RuntimeError("Event loop is closed"), None), (ValueError("read failed"), coroutine),
                     (ValueError("a real one"), None)):
        hook(types.SimpleNamespace(exc_value=exc, object=obj))
    coroutine.close()
    assert [str(u.exc_value) for u in seen] == ["a real one"]
