"""Asynchronous rollouts with bounded, deterministic staleness (rollout.max_staleness = k, issue 23).

The reference is the schedule written out as a plain loop: step i samples with a copy of the policy
after update max(0, i - k), kept in a list, and with the key of the synchronous loop at step i; the
trainer's producer (trainer/async_rollout.py) must give exactly its metrics. k = 0 is then today's
synchronous loop. Crash/resume and the split mesh run the CLI in subprocesses (tests/fixtures_reliability.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
import os
import threading
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import orbax.checkpoint as ocp

import fixtures_reliability as fr
from jaxrl_llm import config as config_lib
from jaxrl_llm.checkpoint import Checkpointer
from jaxrl_llm.trainer import Trainer, report
from jaxrl_llm.trainer import async_rollout as ar

STEPS = 5
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def small(k: int, **overrides):
    """tests/fixtures_reliability.py's small config (configs/tiny.py shrunk) with staleness k."""
    values = {**fr.SMALL, "total_steps": STEPS, "checkpoint.async_save": False, "rollout.max_staleness": k,
              **overrides}
    return config_lib.from_dict(values, base=tiny_config().get_config())


def tiny_config():
    """configs/tiny.py as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tiny_config", os.path.join(fr.ROOT, "configs", "tiny.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_history(c, workdir) -> tuple[list[dict], list]:
    """(metrics without perf/*, the policy version of each step's rows) of the schedule as a plain loop."""
    k = c.rollout.max_staleness
    tr = Trainer(c, str(workdir))
    state, G = tr.state, c.rollout.group_size
    copy = jax.jit(lambda t: jax.tree_util.tree_map(jnp.copy, t))
    versions, rng, history, rows = [copy(state.params)], state.rng, [], []
    for i in range(c.total_steps):
        key, rng = jax.random.split(rng, 3)[1], jax.random.split(rng, 3)[0]  # the synchronous loop's keys
        v = max(0, i - k)
        local, first, info = tr.rollouts.collect(versions[v], key, i)
        local["policy_version"] = np.full(len(local["scores"]), v, np.int32)
        m = report.rollout_metrics(first, info, G, False)
        m.update(report.data_metrics(tr.data, tr.data_stats))
        batch = ar.Produced(i, v, local, m, [], info["sample_s"], info["gen_tokens"])
        state, metrics, _ = tr.update_step(state, batch, time.perf_counter())
        if i == 0:  # as Trainer.run: the start-up reward check in the first step's row
            metrics.update(tr.self_test_metrics)
        versions.append(copy(state.params))
        history.append(metrics)
        rows.append(local["policy_version"])
    return fr.without_perf(history), rows


@pytest.fixture(scope="module")
def k2_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("k2")
    tr = Trainer(small(2), str(wd))
    history = tr.run()
    return fr.without_perf(history), jax.tree_util.tree_map(np.asarray, tr.state.params), wd


@pytest.fixture(scope="session")
def compile_cache(request, tmp_path_factory):
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("jaxrl_llm_compilation_cache") if cache is not None else tmp_path_factory.mktemp("jax_cache")


# =================================================================================== the schedule
def test_k0_is_the_synchronous_loop_exactly(tmp_path):
    run = fr.without_perf(Trainer(small(0), str(tmp_path / "run")).run())
    ref, versions = reference_history(small(0), tmp_path / "ref")
    assert run == ref  # bit for bit
    assert [int(v.max()) for v in versions] == list(range(STEPS))
    assert not any(k.startswith("rollout/staleness") for k in run[0])  # k = 0 logs what it always did
    assert all(r["sampler/logp_diff_max"] < 1e-4 for r in run)  # float32: the trainer recomputes the sampler


def test_k2_samples_with_exactly_the_policy_after_update_i_minus_k(k2_run, tmp_path):
    run, _, _ = k2_run
    ref, versions = reference_history(small(2), tmp_path)
    assert run == ref
    assert [sorted(set(v.tolist())) for v in versions] == [[0], [0], [0], [1], [2]]
    assert [r["rollout/staleness/mean"] for r in run] == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert [r["rollout/staleness/max"] for r in run] == [0.0, 1.0, 2.0, 2.0, 2.0]
    # The proximal log-probs are recomputed by the trainer: from step 2 on they are another policy's
    # than the sampler's, and truncated importance sampling (the k >= 1 default) weighs the gap.
    assert all("correction/ess" in r for r in run)
    assert run[0]["correction/mismatch_kl"] == pytest.approx(0.0, abs=1e-6)
    assert max(r["correction/mismatch_kl"] for r in run[2:]) > 1e-6
    # Sampler drift is measured against the behaviour policy only: step 0's batch is the one sampled by
    # the policy its step starts from (float32: the sampler's log-probs up to rounding); a stale batch
    # logs none. The proximal-behaviour gap is logged apart: the policy's move after the first update.
    assert run[0]["sampler/logp_diff_max"] < 1e-4 and all("sampler/logp_diff_max" not in r for r in run[1:])
    gaps = [r["rollout/staleness/logp_gap"] for r in run]
    assert gaps[0] < 1e-4 and min(gaps[1:]) > 1e-3, gaps


def test_two_k2_runs_are_identical(k2_run, tmp_path):
    run, params, _ = k2_run
    tr = Trainer(small(2), str(tmp_path))
    assert fr.without_perf(tr.run()) == run
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, jax.tree_util.tree_map(np.asarray, tr.state.params))


def test_checkpoint_holds_the_batches_in_flight(k2_run):
    """A checkpoint at step s stores the batches of steps s..s+k-1 (rows, versions), losslessly."""
    _, _, wd = k2_run
    ck = Checkpointer(str(wd / "checkpoints"), max_to_keep=10)
    try:
        meta = ck.manager.restore(2, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    finally:
        ck.close()
    batches = [ar.from_json(d) for d in meta["inflight"]]
    assert [(p.step, p.version) for p in batches] == [(2, 0), (3, 1)]
    again = ar.from_json(json.loads(json.dumps(ar.to_json(batches[1]))))
    assert again.local.keys() == batches[1].local.keys() and again.metrics == batches[1].metrics
    for name, x in batches[1].local.items():
        assert again.local[name].dtype == x.dtype and np.array_equal(again.local[name], x)


def test_raising_total_steps_after_the_end_samples_the_missing_batches_with_the_last_policy(k2_run, tmp_path):
    """The final checkpoint has no batch in flight (none is sampled past total_steps): a run extended
    from it samples its first k batches with the restored policy (logged), staleness 0, 1, then 2."""
    import shutil
    wd = tmp_path / "extended"
    shutil.copytree(k2_run[2], wd)
    tr = Trainer(small(2, total_steps=STEPS + 3), str(wd))
    assert tr.start_step == STEPS and tr._inflight == []
    history = tr.run()
    assert [r["rollout/staleness/max"] for r in history] == [0.0, 1.0, 2.0]


def test_kill_and_resume_with_k2_is_exact(k2_run, compile_cache, tmp_path):
    """SIGKILL while the batch of step 2+k is sampled, then during the update of step 4: each rerun
    resumes from the last checkpoint (with its batches in flight) and the run ends as the straight one."""
    run, _, _ = k2_run
    wd = tmp_path / "crashed"
    args = fr.train_args(wd, total_steps=STEPS, rollout__max_staleness=2, checkpoint__async_save=False)
    for fault in ("sample:2", "update:3"):
        proc = fr.run_cli("train", args, fr.cli_env(compile_cache, fault))
        assert proc.returncode == -9, (fault, proc.stderr[-3000:])
    proc = fr.run_cli("train", args, fr.cli_env(compile_cache))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert fr.without_perf(fr.read_jsonl(wd / "metrics.jsonl")) == run


def test_sigint_while_sampling_ahead_stops_cleanly_and_resumes_exactly(k2_run, tmp_path):
    """Ctrl-C while the batch of the fourth step is scored (sampled ahead at the start of the second): that step
    finishes, its checkpoint (the batches of the third and fourth steps in flight) is committed, `Preempted` is
    raised; a new Trainer resumes and ends as the straight run."""
    import signal

    import fixtures_rewards
    from jaxrl_llm.preemption import Preempted
    calls = []

    def digit_fraction(prompts, completions, **kw):
        calls.append(1)
        if len(calls) == 5:  # the start-up check; batches 0, 1, 2 at the first step, 3 at the second
            os.kill(os.getpid(), signal.SIGINT)
        return fixtures_rewards.digit_fraction(prompts, completions, **kw)

    wd = str(tmp_path / "run")
    with pytest.raises(Preempted) as info:
        Trainer(small(2), wd, rewards=[digit_fraction]).run()
    assert info.value.step == 2 and fr.committed_steps(wd) == [1, 2]
    rest = Trainer(small(2), wd, rewards=[digit_fraction]).run()
    assert fr.without_perf(fr.read_jsonl(os.path.join(wd, "metrics.jsonl"))) == k2_run[0]
    assert [m["step"] for m in rest] == [3.0, 4.0, 5.0]


# ================================================================================ the split mesh
@pytest.fixture(scope="module")
def split_mesh_runs(tmp_path_factory, compile_cache):
    """On 8 CPU devices: a k=2 run sampling on 4 and training on 4; a run whose reward raises."""
    root = tmp_path_factory.mktemp("split")
    env = fr.cli_env(compile_cache, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    common = dict(total_steps=STEPS, rollout__max_staleness=2, mesh__rollout_devices=4)
    procs = {"ok": fr.run_cli("train", fr.train_args(root / "ok", **common), env),
             "raises": fr.run_cli("train", fr.train_args(root / "raises", reward__functions="fixtures_reliability:"
                                                          "always_raises", **common), env, timeout=120)}
    return root, procs


def test_split_mesh_gives_the_one_mesh_run(split_mesh_runs, k2_run):
    root, procs = split_mesh_runs
    assert procs["ok"].returncode == 0, procs["ok"].stderr[-3000:]
    split, one = fr.without_perf(fr.read_jsonl(root / "ok" / "metrics.jsonl")), k2_run[0]
    assert [r.keys() for r in split] == [r.keys() for r in one]
    for a, b in zip(split, one):  # other meshes: other reduction orders (tests/test_scaling.py's tolerance)
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_producer_thread_error_stops_the_run_with_it(split_mesh_runs):
    _, procs = split_mesh_runs
    p = procs["raises"]
    assert p.returncode not in (0, None) and "the grader divided by zero" in p.stderr, p.stderr[-3000:]


def test_producer_error_surfaces_in_the_trainer_thread():
    """A producer that raises while sampling ahead: the trainer's next request or take raises that
    error (at the latest when it needs the failed batch), never waits forever."""
    def make(params, rng, version, step):
        if step == 3:
            raise ZeroDivisionError("failed at 3")
        return ar.Produced(step, version, {"policy_version": np.full(2, version)}, {}, [], 0.0, 0.0)

    producer = ar.ThreadedProducer(make, 2, 10, to_rollout=lambda p: p)
    outcome = {}

    def trainer():
        state = types.SimpleNamespace(params={}, rng=jax.random.PRNGKey(0))
        try:
            for v in range(10):
                state.step = v
                outcome.setdefault("taken", []).append(producer.next(state).step)
        except ZeroDivisionError as e:
            outcome["error"] = e

    t = threading.Thread(target=trainer, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the trainer hangs on a failed producer"
    assert str(outcome["error"]) == "failed at 3" and outcome["taken"] in ([0], [0, 1], [0, 1, 2])
    producer.close()


def test_schedule_versions_and_keys():
    """Which version samples which step, and with which key, against the synchronous key stream."""
    calls = []
    producer = ar.Producer(lambda params, rng, version, step: calls.append((step, version, params, rng)) or
                           ar.Produced(step, version, {"policy_version": np.full(2, version)}, {}, [], 0.0, 0.0), 3, 7)
    rng = jax.random.PRNGKey(1)
    stream = [rng]
    for _ in range(7):
        stream.append(jax.random.split(stream[-1], 3)[0])
    for v in range(7):
        p = producer.next(types.SimpleNamespace(step=v, params=f"after {v}", rng=stream[v]))
        assert (p.step, p.version) == (v, max(0, v - 3))
        assert ar.staleness_metrics(p)["rollout/staleness/max"] == v - max(0, v - 3)
    assert [(s, ver, params) for s, ver, params, _ in calls] == (
        [(0, 0, "after 0"), (1, 0, "after 0"), (2, 0, "after 0"), (3, 0, "after 0")]
        + [(v + 3, v, f"after {v}") for v in range(1, 4)])
    for step, version, _, rng in calls:
        np.testing.assert_array_equal(ar.rollout_key(rng, step - version), jax.random.split(stream[step], 3)[1])
    assert producer.pending() == []


# ================================================================================== configuration
def test_k_ge_1_defaults_and_errors():
    c = config_lib.prepare(small(1))
    assert (c.rollout.recompute_logprobs, c.correction.mode) == (True, "token_truncate")
    c = config_lib.prepare(small(0))
    assert (c.rollout.recompute_logprobs, c.correction.mode) == (False, "none")
    c = config_lib.prepare(small(2, **{"correction.mode": "none"}))  # an explicit choice wins
    assert c.correction.mode == "none"
    with pytest.raises(ValueError, match=r"rollout.recompute_logprobs must be True with rollout.max_staleness"):
        config_lib.prepare(small(1, **{"rollout.recompute_logprobs": False}))
    for k in (-1, STEPS):
        with pytest.raises(ValueError, match=r"rollout.max_staleness"):
            config_lib.prepare(small(k))
    with pytest.raises(ValueError, match=r"mesh.rollout_devices"):
        config_lib.prepare(small(0, **{"mesh.rollout_devices": -1}))


def test_device_split_errors(monkeypatch):
    c = config_lib.prepare(small(1, **{"mesh.rollout_devices": 1}))
    with pytest.raises(ValueError, match=r"mesh.rollout_devices=1 leaves no training device of the 1"):
        ar.split_devices(c, jax.devices()[:1])
    c = config_lib.prepare(small(1, **{"mesh.rollout_devices": 3}))
    with pytest.raises(ValueError, match=r"batch_prompts=4 must be divisible by mesh.rollout_devices=3"):
        ar.split_devices(c, list(jax.devices()) * 4)
    assert ar.split_devices(config_lib.prepare(small(1)), jax.devices()) == (list(jax.devices()), None)
    # Several processes: the split is per host, the last r/P devices of each host sampling.
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    assert ar.split_devices(config_lib.prepare(small(2)), jax.devices()) == (list(jax.devices()), None)
    hosts = [types.SimpleNamespace(process_index=p, id=i) for p in range(2) for i in range(3)]
    train, rollout = ar.split_devices(config_lib.prepare(small(1, **{"mesh.rollout_devices": 2})), hosts)
    assert train == [hosts[0], hosts[1], hosts[3], hosts[4]] and rollout == [hosts[5]]
    train, rollout = ar.split_devices(config_lib.prepare(small(1, **{"mesh.rollout_devices": 4})), hosts)
    assert train == [hosts[0], hosts[3]] and rollout == hosts[4:]
    for r, error in ((1, r"^config.mesh.rollout_devices=1 must be divisible by the 2 processes"),
                     (6, r"batch_prompts=4 must be divisible by mesh.rollout_devices=6"),
                     (2, r"^config.mesh.rollout_devices=2 needs more than r/2 = 1 devices on each of the 2 processes, "
                         r"got \[1, 1\]")):
        with pytest.raises(ValueError, match=error):
            ar.split_devices(config_lib.prepare(small(1, **{"mesh.rollout_devices": r})), hosts[2::3])
    for field, value in (("env.name", "countdown"), ("dapo.dynamic_sampling", True)):
        c = config_lib.prepare(small(1, **{"mesh.rollout_devices": 2}))
        c[field.split(".")[0]][field.split(".")[1]] = value
        with pytest.raises(ValueError, match=rf"^config.{field} with mesh.rollout_devices > 0 needs a single process"):
            ar.split_devices(c, hosts)


def test_producer_failure_on_any_process_stops_every_process(monkeypatch):
    """Two processes (faked): a failure of this host's producer is said to the others (its message in
    the agreement's gather) and raised here; another host's failure is raised here too, naming it."""
    said = []

    def gather(lists):
        said.append(bytes(lists[0]).decode())
        return [lists[0], list(b"ZeroDivisionError: failed on 1") if other_fails else []]

    def make(params, rng, version, step):
        if step == 3:
            raise ZeroDivisionError("failed at 3")
        return ar.Produced(step, version, {"policy_version": np.full(2, version)}, {}, [], 0.0, 0.0)

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(ar.dist, "allgather_lists", gather)
    state = types.SimpleNamespace(params={}, rng=jax.random.PRNGKey(0))
    for other_fails, expected in ((False, ZeroDivisionError), (True, RuntimeError)):
        producer, said[:] = ar.ThreadedProducer(make, 2, 10, to_rollout=lambda p: p), []
        with pytest.raises(expected) as e:
            for v in range(10):
                state.step = v
                producer.next(state)
        producer.close()
        if other_fails:  # the first agreement, before any batch
            assert str(e.value) == "the rollout producer of process 1 failed: ZeroDivisionError: failed on 1"
        else:
            assert str(e.value) == "failed at 3" and said[-1] == "ZeroDivisionError: failed at 3"
            assert set(said[:-1]) == {""}


# ====================================================================================== learning
@pytest.mark.slow
def test_k2_learns_the_default_task_to_the_synchronous_bar(tmp_path):
    """configs/tiny.py (GRPO, 800 steps) with k = 2, through the CLI: the mean reward of the last 10% of steps
    reaches the initial one plus half the headroom to 1.0, the bar of benchmarks/tiny_curves.py (docs/algorithms/async.md
    has the curves beside k = 0's and k = 1's). One learning run for the capability: k = 2 is the stalest
    schedule tested and the one with the least margin over the bar (k = 1 ran with k = 2 before; the
    schedule of any k is checked exactly above)."""
    rows = fr.learning_run("tiny.py:algo=grpo", tmp_path / "k2", rollout__max_staleness=2, log__progress=False,
                           log__tensorboard=False, export__at_end=False, export__plot=False, eval__every_steps=0,
                           checkpoint__every_steps=10_000)
    r = np.array([h["reward/mean"] for h in rows])
    assert len(r) == 800
    init, final = r[:10].mean(), r[-len(r) // 10:].mean()
    print(f"k=2: initial {init:.3f}, final {final:.3f}")
    assert final >= init + (1 - init) / 2, (init, final)


def test_benchmark_script_runs_at_toy_size(compile_cache, tmp_path):
    out = tmp_path / "bench.md"
    env = fr.cli_env(compile_cache, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, os.path.join(fr.ROOT, "benchmarks", "async_rollout.py"), "--toy",
                              "--steps", "3", "--out", str(out)], capture_output=True, text=True, env=env, cwd=fr.ROOT,
                             timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    block = out.read_text().split("<!-- async-timeline:begin -->")[1].split("<!-- async-timeline:end -->")[0]
    rows = [line for line in block.splitlines() if line.startswith("| sync |") or line.startswith("| async |")]
    assert len(rows) == 2 and "ideal overlap speed-up" in block
