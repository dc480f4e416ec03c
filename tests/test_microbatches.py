"""Micro-batches by a token budget (`train.max_tokens_per_microbatch`, trainer/microbatches.py): the row
and packed-row plans, and the score outputs, loss, metrics and every gradient of a step by token budget
against the same step as one batch of whole groups (no micro-batches, no packing: the reference)."""
import dataclasses
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import sharding
from jaxrl_llm.trainer import Trainer
from jaxrl_llm.trainer.microbatches import rows_per_micro, split_plan, strided_rows
from jaxrl_llm.trainer.steps import accumulate, make_score, micro_batch_loss

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_trainer import small_config  # noqa: E402
from test_trainer_distill import save_teacher  # noqa: E402


def test_strided_rows_hold_every_row_once():
    for rows, per in ((8, 3), (8, 8), (5, 2), (12, 4), (1, 4)):
        idx, present = strided_rows(rows, per)
        assert idx.shape == present.shape == (-(-rows // per), per)
        assert sorted(idx[present].tolist()) == list(range(rows))
        assert not np.any(idx[~present])  # padding: row 0, absent
    assert rows_per_micro(60, 19, 2, 8) == 6 and rows_per_micro(60, 19, 4, 2) == 4 and rows_per_micro(19, 19, 1, 8) == 1


def test_split_plan_partitions_the_packed_rows():
    plan = {"row": np.array([2, 0, -1, 4, 1, 3, 0], np.int32), "offset": np.arange(7, dtype=np.int32),
            "slots": np.array([9, 5, 7, 3, 2, 0, 0, 0], np.int32)}
    out = split_plan(plan, 2, 4)
    assert out["row"].shape == (4, 7) and out["slots"].tolist() == [[9, 5], [7, 3], [2, 0], [0, 0]]
    for n, r in enumerate(plan["row"]):
        where = np.flatnonzero(out["row"][:, n] >= 0)
        assert where.tolist() == ([] if r < 0 else [r // 2]) and (r < 0 or out["row"][r // 2, n] == r % 2)
    with pytest.raises(ValueError, match="5 packed rows do not fit 2 micro-batches of 2"):
        split_plan(plan, 2, 2)


# (algo, overrides): the budget splits every group (G = 2) over micro-batches (GRPO: 3 rows each, the last
# one padded; LoRA adapters, the base the reference); the PPO cases carry a value model with the bootstrap
# column, a KL term in the reward, recomputed log-probs and an entropy bonus.
PPO = {"rollout.group_size": 2, "rollout.recompute_logprobs": True, "advantage.bootstrap_truncated": True,
       "kl.coef": 0.05, "entropy_coef": 0.01}
CASES = {
    "grpo_lora": ("grpo", {"train.max_tokens_per_microbatch": 60, "lora.rank": 4}),
    "dr_grpo_packed": ("dr_grpo", {"train.max_tokens_per_microbatch": 20, "train.pack_length": 20}),
    "ppo": ("ppo", {**PPO, "train.max_tokens_per_microbatch": 19}),
    "ppo_packed_copies": ("ppo", {**PPO, "train.max_tokens_per_microbatch": 40, "train.pack_length": 20,
                                  "train.pack_share_prompt": False}),
    # distillation from a teacher of other weights (`teacher` below): opd reads the teacher's log-probs from
    # the score pass (3 rows a chunk, groups split); gkd computes the divergence in the update, per packed
    # micro-batch, normalised by the step's den["distill"]; with distill.lmbda 0.5 half the prompts are
    # supervised rows (the answer column; 4 new tokens, so P+T = 20 and 3 rows a micro-batch), which
    # only the divergence trains.
    "opd": ("opd", {"train.max_tokens_per_microbatch": 57}),
    "gkd_packed": ("gkd", {"train.max_tokens_per_microbatch": 20, "train.pack_length": 20}),
    "gkd_supervised": ("gkd", {"train.max_tokens_per_microbatch": 60, "distill.lmbda": 0.5,
                               "data.completion_column": "answer", "rollout.max_new_tokens": 4}),
}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A teacher of the student's shape and other weights: a nonzero divergence and opd advantage."""
    return save_teacher(tmp_path_factory.mktemp("teacher") / "t", small_config(), seed=7)


def one_batch_reference(t):
    """The plan of the same step as one batch of whole groups: no micro-batches, no packing."""
    return dataclasses.replace(t.plan, microbatch_tokens=0, pack_length=0, grad_accum=1)


def gradients(t, plan, state, b, pidx, pack):
    """(loss, (policy, value) gradients, summed metrics) of one step of `plan` on the prompts `pidx`."""
    loss_fn = functools.partial(micro_batch_loss, t.objective, plan, t.mc, t.teacher_mc, False)
    run = lambda s, bb, p, pk: accumulate(t.objective, plan, t.mc, loss_fn, True, s, bb, p, pk, t.base,
                                          t.teacher)[0]
    return jax.jit(run)(state, b, pidx, pack)


@pytest.mark.parametrize("case", CASES)
def test_step_by_tokens_equals_one_batch(case, tmp_path, request):
    algo, overrides = CASES[case]
    if algo in ("opd", "gkd"):
        overrides = {**overrides, "teacher.path": request.getfixturevalue("teacher")}
    c = small_config(algo, total_steps=1, **{"reward.functions": "fixtures_rewards:char_code", **overrides})
    t = Trainer(c, str(tmp_path))
    state, ref, reference = t.state, t.frozen_ref, one_batch_reference(t)
    b = t.rollouts.device_batch(t.producer.next(state, t.policy(state)).local)
    pidx = jnp.array([3, 0, 2, 1])
    with sharding.use_mesh(t.mesh):
        pack = t.packer.score(b) if t.packer else None
        got = t.fns.score(state, ref, b, pack, t.base, t.teacher)
        want = jax.jit(make_score(t.objective, reference, t.mc, t.teacher_mc))(state, ref, b, None, t.base, t.teacher)
        assert set(got) == set(want)
        for k in want:  # real tokens only: the reference log-probs of padding are not read
            keep = b["mask"] if want[k].ndim == 2 else np.ones_like(want[k])
            np.testing.assert_allclose(np.where(keep, got[k], 0), np.where(keep, want[k], 0), atol=2e-6, err_msg=k)
        b.update(want)
        b.setdefault("old_logp", b["behavior_logp"])
        b.update(t.fns.prepare(b, state.kl.value)[0])
        plan = t.packer.update(pidx) if t.packer else None
        (loss, grads, aux) = gradients(t, t.plan, state, b, pidx, plan)
        (loss0, grads0, aux0) = gradients(t, reference, state, b, pidx, None)
    if plan is not None:
        assert plan["row"].shape[0] > 1  # several micro-batches
    else:
        row = b["prompt_tokens"].shape[1] + b["tokens"].shape[1]
        assert rows_per_micro(t.plan.microbatch_tokens, row, 1, 8) % 2  # an odd row count: groups split
    assert float(jnp.abs(loss0)) > 0 and optax_norm(grads0[0]) > 0
    if t.objective.distill:  # the teacher is read: a teacher of other weights gives log-probs != the student's
        assert np.any(np.abs(want["teacher_logp"] - want.get("old_logp", b["old_logp"])) * b["mask"] > 1e-3)
    if t.objective.distill == "gkd":
        assert float(aux0["distill/jsd"]) > 1e-4
    if "supervised" in b:  # both kinds of rows in the step
        assert 0 < int(jnp.sum(b["supervised"])) < b["supervised"].shape[0]
    np.testing.assert_allclose(loss, loss0, rtol=1e-5, atol=1e-7)
    for g, g0 in zip(grads, grads0):
        if g0 is not None:
            jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-7), g, g0)
    for k in aux0:
        np.testing.assert_allclose(aux[k], aux0[k], rtol=1e-5, atol=1e-6, err_msg=k)


def optax_norm(tree):
    return float(jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(tree))))


def test_a_budget_below_the_longest_row_is_refused(tmp_path):
    for overrides, match in (({"train.max_tokens_per_microbatch": 18}, "room for the longest row, "
                              r"data.max_prompt_length \+ rollout.max_new_tokens = 19 tokens \(or a mesh.sequence "
                              r"axis to split it over chips\), got 18"),
                             ({"train.max_tokens_per_microbatch": 9, "mesh.sequence": 2},  # a row over 2 chips
                              r"= 19 tokens over mesh.sequence = 2 chips: 10 per chip, got 9"),
                             ({"train.max_tokens_per_microbatch": 30, "train.pack_length": 32},
                              "room for one packed row, train.pack_length = 32 tokens"),
                             ({"train.max_tokens_per_microbatch": 40, "train.grad_accum": 2},
                              r"config.train.grad_accum must be 1 with train.max_tokens_per_microbatch > 0")):
        with pytest.raises(ValueError, match=match):
            Trainer(small_config("grpo", **overrides), str(tmp_path))
