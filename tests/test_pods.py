"""Every capability on a pod, on CPU the way pods run it: two processes on 127.0.0.1 (jax.distributed,
gloo collectives, 2 fake devices each) against one process with the same 4 devices and global batch.

  (a) GRPO with rollout.max_staleness = 2 (tests/pods_worker.py `grpo_k2`, 4 steps);
  (b) GRPO with k = 1 on a rollout mesh of 2 devices (`grpo_mesh`, 3 steps): one device of each host
      samples that host's rows, the other two train; and the same run with process 1's producer
      raising on its first batch: both processes stop with that error;
  (c) multi-turn GRPO on configs/tiny_multiturn.py (`mt_grpo`, 2 steps, episodes on both processes)
      with the held-out evaluation of episodes before the first step and at the end;
  (d) a kill -9 of process 1 in the update of step 3 (after checkpoint 2, which holds the batches of
      steps 3 and 4 in flight); process 0, stuck in a collective, is killed too; the rerun of both
      processes continues to the run that never stopped, and so does a rerun of a copy of that
      checkpoint on one process (another process count: the batches in flight are global rows).

  (f) GRPO with partial rollouts (`grpo_partial`, k = 2, 4 steps): one table of rows in flight on both hosts.

  (e) SIGTERM to process 1 of a k = 2 run in step 2: both processes stop after the same step, with a
      checkpoint of it that holds the global rows of the batches in flight (the agreement itself, for
      SIGINT too, is tests/test_preemption.py's `test_processes_agree_on_the_stop_step`).

Tolerances (float32; observed in parentheses): metrics rtol 1e-5 + atol 1e-6 and parameters atol 1e-5,
as tests/test_scaling.py for one mesh against another (k = 2: metrics 4.8e-7, parameters 3e-8; the
rollout mesh: metrics 3e-7, parameters 1.1e-7; the multi-turn run: metrics 4.8e-7, parameters 0: the
same episodes and partitioned programs; the 2-process checkpoint resumed on one process: metrics 6e-8,
parameters 3e-8). Wall time: 685 to 905 s on two cores loaded by other jobs before (b), 926 s with it
(306 s of CPU; the launches' compilations dominate).

The launches are ordered so that at most two jobs compile at once on two cores: the killed run first,
then the 2-process rerun (which also runs (b), (c) and (e)) next to the 1-process job.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import fixtures_reliability as fr
from test_scaling import PARAM_ATOL, _env, _free_port, assert_metrics_close, assert_params_close, load

# One module fixture launches five JAX processes (the killed run, its rerun, the one-process run): the
# pods capability's end-to-end run, so every test of the file is marked slow (tests/budget.py).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "pods_worker.py")
FAULT = "update:2"  # process 1 dies in the third iteration, after checkpoint 2


def _launch(out: str, runs: str, n: int, log_name: str, fault_on: int | None = None):
    """n processes of tests/pods_worker.py (4 devices in all); [Popen], logs under out."""
    os.makedirs(out, exist_ok=True)
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = []
    for pid in range(n):
        env = _env(4 // n)
        if pid == fault_on:
            env["JAXRL_LLM_FAULT"] = FAULT
        args = [WORKER, out, runs] + ([coordinator, str(n), str(pid)] if n > 1 else [])
        log = open(os.path.join(out, f"{log_name}{pid}.log"), "w")
        procs.append(subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                      cwd=ROOT))
        procs[-1].log = log
    return procs


def _wait(procs, timeout: float = 1200) -> list[int]:
    codes = []
    for p in procs:
        codes.append(p.wait(timeout=timeout))
        p.log.close()
    return codes


def _report(what: str, rows, base_rows, params, base_params) -> None:
    """Prints the largest differences (`pytest -s`): the numbers the docs quote."""
    metric = max(abs(r[k] - b[k]) for r, b in zip(rows, base_rows) for k in b)
    param = max(float(np.abs(params[k] - base_params[k]).max()) for k in base_params)
    print(f"{what}: max |metric diff| {metric:.3g}, max |param diff| {param:.3g}")


def _tail(procs) -> str:
    return "\n".join(open(p.log.name, errors="replace").read()[-3000:] for p in procs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("pods"))
    two, one = os.path.join(out, "two"), os.path.join(out, "one")
    t0 = time.monotonic()
    killed = _launch(two, "grpo_k2@k2", 2, "killed", fault_on=1)
    try:
        code1 = killed[1].wait(timeout=1200)
        # Process 0 is stuck in a collective with the dead process, or failing in it ("Gloo AllGather
        # failed: Connection closed by peer"): either way it is killed too, the rerun is of all processes.
        killed[0].kill()
        codes = [_wait(killed[:1])[0], code1]
        killed[1].log.close()
        assert code1 == -9 and codes[0] != 0, (codes, _tail(killed))
        after_kill = {"committed": fr.committed_steps(os.path.join(two, "w_k2")),
                      "rows": fr.read_jsonl(os.path.join(two, "w_k2", "metrics.jsonl"))}
        shutil.copytree(os.path.join(two, "w_k2"), os.path.join(one, "w_k2_on_one"))
        rerun = _launch(two, "grpo_k2@k2,mt_grpo,grpo_mesh,grpo_partial,grpo_mesh@fail,grpo_k2@term", 2, "rerun")
        single = _launch(one, "grpo_k2,mt_grpo,grpo_k2@k2_on_one,grpo_mesh,grpo_partial", 1, "single")
        codes = _wait(rerun) + _wait(single)
        assert codes == [0, 0, 0], _tail(rerun + single)
    finally:
        for p in [*killed, *locals().get("rerun", []), *locals().get("single", [])]:
            if p.poll() is None:
                p.kill()
    print(f"pods: all launches done in {time.monotonic() - t0:.0f} s")
    return {"two": two, "one": one, "after_kill": after_kill}


def test_async_k2_on_two_processes_matches_one_process_after_a_kill(runs):
    """(a) + (d): the 2-process run, killed in step 3 and rerun, equals the uninterrupted 1-process run."""
    base, base_params = load(runs["one"], "grpo_k2")
    assert [m["rollout/staleness/mean"] for m in base["metrics"]] == [0.0, 1.0, 2.0, 2.0]
    assert all(m["policy/grad_norm"] > 1e-3 for m in base["metrics"])  # every step moved the policy
    # The kill left checkpoint 2 (with the batches of steps 3 and 4 in flight) and the rows of steps 1-2.
    assert runs["after_kill"]["committed"][-1] == 2
    killed_rows = fr.without_perf(runs["after_kill"]["rows"])
    assert [r["step"] for r in killed_rows] == [1, 2]
    assert_metrics_close(killed_rows, base["metrics"][:2], "2 processes, steps 1-2, vs 1 process")
    resumed, params = load(runs["two"], "k2")
    assert resumed["start_step"] == 2 and resumed["local_rows"] == 4  # each process sampled its half
    assert_metrics_close(resumed["metrics"], base["metrics"][2:], "2 processes resumed after kill -9 vs 1 process")
    assert_params_close(params, base_params, PARAM_ATOL, "2 processes resumed after kill -9 vs 1 process")
    _report("k=2, 2 processes (killed, rerun) vs 1", killed_rows + resumed["metrics"], base["metrics"], params,
            base_params)
    rows = fr.read_jsonl(os.path.join(runs["two"], "w_k2", "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # the log reads as one run


def test_in_flight_batches_resume_on_another_process_count(runs):
    """The 2-process checkpoint 2 continued on one process: the same rows in flight, the same run."""
    base, base_params = load(runs["one"], "grpo_k2")
    resumed, params = load(runs["one"], "k2_on_one")
    assert resumed["start_step"] == 2 and resumed["local_rows"] == 8
    assert_metrics_close(resumed["metrics"], base["metrics"][2:], "2-process checkpoint resumed on 1 process")
    assert_params_close(params, base_params, PARAM_ATOL, "2-process checkpoint resumed on 1 process")
    _report("k=2, 2-process checkpoint 2 resumed on 1 process vs 1", resumed["metrics"], base["metrics"][2:],
            params, base_params)


def _multiturn(runs, base, two) -> None:
    """(c) episodes whose rows live on two hosts: each host's environments, one global batch."""
    assert two["local_rows"] == 2 and base["local_rows"] == 4
    assert base["metrics"][0]["env/turns/mean"] > 1  # episodes of several turns
    assert set(two["initial_eval"]) == set(base["initial_eval"]) and "eval/env/turns/mean" in base["initial_eval"]
    assert any(m["policy/grad_norm"] > 1e-3 for m in base["metrics"])


def _rollout_mesh(runs, base, two) -> None:
    """(b) the rollout mesh per host: process 0 samples its 4 rows on one device of its own, one process
    its 8 on two; 2 devices train either way. A producer failing on process 1 stops both with its error."""
    assert (two["local_rows"], two["rollout_mesh"], base["local_rows"], base["rollout_mesh"]) == (4, [0], 8, [0, 0])
    assert two["training_devices"] == base["training_devices"] == 2
    assert [m["rollout/staleness/mean"] for m in base["metrics"]] == [0.0, 1.0, 1.0]
    assert all(m["policy/grad_norm"] > 1e-3 for m in base["metrics"])
    errors = [json.load(open(os.path.join(runs["two"], f"fail{p}.json")))["error"] for p in range(2)]
    assert errors == ["RuntimeError: the rollout producer of process 1 failed: ZeroDivisionError: the grader "
                      "divided by zero on process 1", "ZeroDivisionError: the grader divided by zero on process 1"]


def _partial(runs, base, two) -> None:
    """(f) partial rollouts: one table of rows in flight, the same on both hosts, each scoring and training
    its block of every batch; rows continue across updates, none past the bound."""
    assert two["local_rows"] == 4 and base["local_rows"] == 8
    assert all(m["rollout/staleness/max"] <= 2 for m in base["metrics"])
    assert max(m["rollout/partial/in_flight"] for m in base["metrics"]) > 0


@pytest.mark.parametrize("run,check", [("grpo_mesh", _rollout_mesh), ("mt_grpo", _multiturn), ("grpo_partial", _partial)],
                         ids=["rollout_mesh", "multiturn", "partial"])
def test_two_processes_match_one_process(runs, run, check):
    """(b) k = 1 on a rollout mesh, (c) multi-turn GRPO with the held-out evaluation of episodes: the
    2-process run equals the 1-process one with the same global batch (and each run's own properties)."""
    base, base_params = load(runs["one"], run)
    two, params = load(runs["two"], run)
    check(runs, base, two)
    no_time = lambda rows: [{k: v for k, v in r.items() if k != "eval/time_s"} for r in rows]
    evals = lambda r: [r["initial_eval"]] if r["initial_eval"] else []
    assert_metrics_close(no_time(two["metrics"] + evals(two)), no_time(base["metrics"] + evals(base)),
                         f"{run}, 2 processes vs 1")
    assert_params_close(params, base_params, PARAM_ATOL, f"{run}, 2 processes vs 1")
    _report(f"{run}, 2 processes vs 1", no_time(two["metrics"] + evals(two)), no_time(base["metrics"] + evals(base)),
            params, base_params)


def test_sigterm_to_one_process_stops_both_with_the_batches_in_flight(runs):
    """(e) both processes stop after the same step s, checkpoint s committed, holding the batches of
    steps s..s+k-1 as all 16 rows (8 prompts x 2) of each, gathered from both processes."""
    import base64
    import io

    import orbax.checkpoint as ocp
    from jaxrl_llm.checkpoint import Checkpointer
    stops = [json.load(open(os.path.join(runs["two"], f"term{p}.json"))) for p in range(2)]
    assert stops[0] == stops[1] and stops[0]["reason"].startswith("preempted"), stops
    s = stops[0]["step"]
    assert 2 <= s < 4
    work = os.path.join(runs["two"], "w_term")
    assert fr.committed_steps(work)[-1] == s
    ck = Checkpointer(os.path.join(work, "checkpoints"), max_to_keep=10)
    try:
        meta = ck.manager.restore(s, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    finally:
        ck.close()
    in_flight = [(d["step"], d["version"]) for d in meta["inflight"]]
    assert in_flight == [(j, max(0, j - 2)) for j in range(s, min(s + 2, 4))]
    base, _ = load(runs["one"], "grpo_k2")
    for d in meta["inflight"]:
        with np.load(io.BytesIO(base64.b64decode(d["local"]))) as z:
            assert z["tokens"].shape[0] == 16 and z["prompt_tokens"].shape[0] == 8
            assert np.all(z["policy_version"] == max(0, d["step"] - 2))
            # the batch's scores are the uninterrupted run's (the same rows, sampled by the same policy)
            assert np.isclose(z["scores"].mean(), base["metrics"][d["step"]]["reward/mean"], rtol=1e-5, atol=1e-6)
