"""Partial rollouts in the trainer (rollout.partial, trainer/partial.py): the schedule as a plain loop
(step i's round with a copy of the policy after update max(0, i-1), the synchronous loop's key) gives
exactly the trainer's metrics; rows really continue across updates, their tokens from several versions,
none older than max_staleness; a stale row is restarted; a run killed mid-sampling and mid-update then
rerun equals the straight run (the rows in flight are in the checkpoint); refusals name the field.
The sampler's round itself is held to the slots sampler and to teacher-forced log-probs per version in
tests/test_sampling_partial.py.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fixtures_reliability as fr
from jaxrl_llm.trainer import Trainer, report
from jaxrl_llm.trainer import async_rollout as ar
from jaxrl_llm.trainer.partial import PartialRollouts
from test_async import STEPS, compile_cache, small  # noqa: F401 (a fixture)

K = 2
PARTIAL = {"rollout.partial": True, "rollout.decode_slots": 2, "rollout.max_new_tokens": 6}


def partial_config(**overrides):
    return small(K, **{**PARTIAL, **overrides})


def reference_history(c, workdir) -> list[dict]:
    """The metrics (without perf/*) of partial rounds driven by a plain loop: step i's round with the
    policy after update max(0, i-1), kept in a list, and the synchronous loop's key of step i."""
    tr = Trainer(c, str(workdir))
    engine = PartialRollouts(c, tr.rollouts)
    state, G = tr.state, c.rollout.group_size
    copy = jax.jit(lambda t: jax.tree_util.tree_map(jnp.copy, t))
    versions, rng, history = [copy(state.params)], state.rng, []
    for i in range(c.total_steps):
        key, rng = jax.random.split(rng, 3)[1], jax.random.split(rng, 3)[0]
        v = max(0, i - 1)
        local, first, info = engine.collect(versions[v], key, i, v)
        m = report.rollout_metrics(first, info, G, False)
        m.update(report.data_metrics(tr.data, tr.data_stats))
        m.update(info["partial"])
        batch = ar.Produced(i, v, local, m, [], info["sample_s"], info["gen_tokens"])
        state, metrics, _ = tr.update_step(state, batch, time.perf_counter())
        if i == 0:
            metrics.update(tr.self_test_metrics)
        versions.append(copy(state.params))
        history.append(metrics)
    return fr.without_perf(history)


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("partial")
    return fr.without_perf(Trainer(partial_config(), str(wd)).run())


def test_partial_run_is_the_schedule_as_a_plain_loop(partial_run, tmp_path):
    ref = reference_history(partial_config(), tmp_path)
    assert partial_run == ref


def test_rows_continue_across_updates_within_the_bound(partial_run):
    run = partial_run
    assert max(r["rollout/partial/in_flight"] for r in run) > 0  # rows were left in flight at a round's stop
    assert max(r["rollout/partial/held"] for r in run) > 0  # and a round waited for rows at the bound
    # Some batch mixes tokens of several versions: its oldest token is older than its newest.
    assert any(r["rollout/staleness/max"] > r["rollout/staleness/min_token"] for r in run)
    assert all(r["rollout/staleness/max"] <= K for r in run)
    assert all(r["rollout/staleness/min_token"] == min(i, 1) for i, r in enumerate(run))  # drawn by version i-1
    assert all("correction/ess" in r for r in run)


def test_groups_about_to_pass_the_bound_are_held():
    """A group whose oldest token would be more than k versions behind the next step is held (this round's
    batch must take it); a group not started is drawn by this round's version."""
    engine = PartialRollouts.__new__(PartialRollouts)
    engine.c, engine.G = partial_config(), 2
    engine.rows = {"lengths": np.array([3, 1, 0, 0, 2, 5]), "versions": np.array([[1, 2], [1, 0], [0, 0], [0, 0],
                                                                                  [2, 2], [2, 3]])}
    np.testing.assert_array_equal(engine._held(step=3, version=2), [True, False, False])  # 3 + 1 - 1 > 2
    np.testing.assert_array_equal(engine._held(step=4, version=3), [True, False, True])


def test_kill_and_resume_is_exact(partial_run, compile_cache, tmp_path):  # noqa: F811
    """SIGKILL while sampling step 2's round, then during the update of step 3: each rerun resumes from the last
    checkpoint (with the rows in flight) and the run ends as the straight one."""
    wd = tmp_path / "crashed"
    fields = {k.replace(".", "__"): v for k, v in PARTIAL.items()}
    args = fr.train_args(wd, total_steps=STEPS, rollout__max_staleness=K, checkpoint__async_save=False, **fields)
    for fault in ("sample:2", "update:3"):
        proc = fr.run_cli("train", args, fr.cli_env(compile_cache, fault))
        assert proc.returncode == -9, (fault, proc.stderr[-3000:])
    proc = fr.run_cli("train", args, fr.cli_env(compile_cache))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert fr.without_perf(fr.read_jsonl(wd / "metrics.jsonl")) == partial_run


def test_a_rollout_mesh_gives_the_one_mesh_run(partial_run, compile_cache, tmp_path):  # noqa: F811
    """Rounds in the producer thread on a rollout device of their own (2 CPU devices: 1 samples, 1 trains)."""
    fields = {k.replace(".", "__"): v for k, v in PARTIAL.items()}
    args = fr.train_args(tmp_path / "split", total_steps=STEPS, rollout__max_staleness=K, checkpoint__async_save=False,
                         mesh__rollout_devices=1, **fields)
    proc = fr.run_cli("train", args, fr.cli_env(compile_cache, XLA_FLAGS="--xla_force_host_platform_device_count=2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    split = fr.without_perf(fr.read_jsonl(tmp_path / "split" / "metrics.jsonl"))
    assert [r.keys() for r in split] == [r.keys() for r in partial_run]
    for a, b in zip(split, partial_run):
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("overrides,field", [
    ({"rollout.max_staleness": 1}, "rollout.max_staleness"),
    ({"rollout.decode_slots": 0}, "rollout.decode_slots"),
    ({"rollout.kv_page_size": 4}, "rollout.kv_page_size"),
    ({"dapo.dynamic_sampling": True}, "dapo.dynamic_sampling"),
    ({"distill.lmbda": 0.5}, "distill.lmbda"),
    ({"env.name": "guess_digit"}, "env.name"),
])
def test_options_partial_rollouts_cannot_serve_are_refused(overrides, field, tmp_path):
    with pytest.raises(ValueError, match=f"config.{field} .*rollout.partial"):
        Trainer(partial_config(**overrides), str(tmp_path / "w"))


def test_moe_partial_rounds_replay_each_tokens_recorded_experts(tmp_path):
    """A tiny MoE with routing replay: step 0's batch (all tokens of version 0) is recomputed by the trainer to
    1e-5 with the replayed experts; later batches carry routes for every fed token."""
    from jaxrl_llm.trainer.setup import load_tokenizer
    from test_moe_trainer import _tiny_moe_dir
    c = partial_config(total_steps=3)
    c.model.path = _tiny_moe_dir(str(tmp_path / "moe"), load_tokenizer(c.tokenizer))
    c.checkpoint.every_steps = 10
    tr = Trainer(c, str(tmp_path / "run"))
    history = tr.run()
    assert history[0]["sampler/logp_diff_max"] <= 1e-5
    assert tr.partial.route_shape == (1, 2)
    rows = tr.partial.rows
    fed = (np.arange(rows["tokens"].shape[1])[None] < rows["lengths"][:, None] - 1)  # every token but the last
    assert (rows["routes"][fed] >= 0).all() and (rows["routes"][~fed] < 0).all()


def test_a_rollout_mesh_on_several_processes_is_refused(monkeypatch):
    """Each host's rollout mesh samples alone (no collective in its thread): a round, which gathers every
    host's rows, cannot run there."""
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match="config.mesh.rollout_devices must be 0 with rollout.partial on several"):
        PartialRollouts(partial_config(**{"mesh.rollout_devices": 1}), None)



def test_lora_adapters_sample_the_rounds(tmp_path):
    """With LoRA the rounds sample with the base joined to the adapters of each version: step 0's batch is
    recomputed by the trainer to 1e-5, the adapters move, and later batches mix versions."""
    tr = Trainer(partial_config(**{"lora.rank": 4, "lora.alpha": 8.0, "total_steps": 4,
                                   "checkpoint.every_steps": 10}), str(tmp_path / "run"))
    history = tr.run()
    assert history[0]["sampler/logp_diff_max"] <= 1e-5
    assert all(r["policy/grad_norm"] > 0 for r in history)
    assert any(r["rollout/staleness/max"] > r["rollout/staleness/min_token"] for r in history)
