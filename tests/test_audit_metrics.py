"""The audit's three: explained variance over the whole minibatch whatever train.grad_accum; Dr. GRPO's
constant normaliser counts every row (docs/algorithms/off_policy.md says why); rows without loss tokens
(DAPO's fillers, masked truncations) are not packed."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import rl, sharding
from jaxrl_llm.trainer import Trainer
from jaxrl_llm.trainer.packs import trained_lengths
from jaxrl_llm.models.packing import plan_packs
from jaxrl_llm.trainer.steps import step_functions, values_of
from test_trainer import small_config, update_batch


def test_explained_variance_does_not_depend_on_grad_accum(tmp_path):
    """Before: a ratio of variances averaged over micro-batches (audit: -0.1034 / -0.0474 / -0.2412 for
    grad_accum 1/2/4 against -0.1034)."""
    # char_code: returns that vary whatever tokens are drawn (constant returns have no explained variance).
    t = Trainer(small_config("ppo", total_steps=1, **{"rollout.batch_prompts": 4,
                                                      "reward.functions": "fixtures_rewards:char_code"}), str(tmp_path))
    state = t.state
    b = update_batch(t, state)
    with sharding.use_mesh(t.mesh):
        values = np.asarray(values_of(t.mc, state.value_params, b), np.float64)
        leaves, treedef = jax.tree_util.tree_flatten(t.state_shardings)
        got = []
        for grad_accum in (1, 2, 4):
            plan = dataclasses.replace(t.plan, grad_accum=grad_accum)
            fns = step_functions(t.objective, plan, t.mc, t.mesh, treedef, tuple(leaves))
            fresh = jax.tree_util.tree_map(jnp.copy, state)  # the update donates its state
            got.append(float(fns.update(fresh, b, jnp.arange(4), None, None)[1]["value/explained_var"]))
    m = np.asarray(b["loss_mask"]) > 0
    r = np.asarray(b["returns"], np.float64)[m]
    assert np.var(r) > 0
    want = 1.0 - np.var(r - values[m]) / np.var(r)  # the whole batch's, directly
    np.testing.assert_allclose(got, [want] * 3, rtol=2e-4, atol=2e-5)


def test_dr_grpo_normaliser_counts_every_row():
    """seq-mean-token-sum-norm divides by N·L whatever the rollout correction rejected or DAPO filled:
    a rejected or filler row adds 0 to the sum and the other tokens keep the weight 1/(N·L)."""
    o = rl.Objective(group_size=2, scale="none", aggregate="seq-mean-token-sum-norm", norm_length=4,
                     correction_mode="sequence_mask", correction_cap=2.0)
    n, t = 4, 4
    mask = jnp.ones((n, t))
    loss_mask = mask.at[3].set(0.0)  # row 3: a DAPO filler row
    behavior = jnp.zeros((n, t)).at[0].set(-1.0)  # row 0: Π ρ = e^4 > cap, rejected by sequence_mask
    b = {"mask": mask, "loss_mask": loss_mask, "behavior_logp": behavior, "old_logp": jnp.zeros((n, t)),
         "scores": jnp.asarray([1.0, 0.0, 1.0, 0.0])}
    fields, stats = o.prepare(b, jnp.float32(0.0))
    np.testing.assert_array_equal(np.asarray(fields["loss_mask"]).sum(1), [0, 4, 4, 0])
    assert float(o.denominators({**b, **fields})["policy"]) == n * 4  # N·L: rows 0 and 3 count
    # Rows with loss tokens alone enter the correction's statistics (the filler row is not scored).
    assert abs(float(stats["correction/kept_frac"]) - 8 / 12) < 1e-6
    logp = jnp.full((n, t), -0.5)
    loss, _ = o.policy_loss(logp, jnp.zeros((n, t)), {**b, **fields, "old_logp": logp},
                            jnp.float32(0.0), o.denominators({**b, **fields}))
    adv = np.asarray(fields["adv"])
    want = -(adv[1] * 4 + adv[2] * 4) / (n * 4)  # ratio 1: −A per kept token, over N·L
    np.testing.assert_allclose(float(loss), want, rtol=1e-6)


def test_packing_plans_exclude_rows_without_loss_tokens():
    """Before: DAPO's filler rows were packed (and scored) though docs/design.md says they are not."""
    prompt_mask = jnp.ones((2, 3), jnp.int32)  # B=2 prompts, G=2
    mask = jnp.asarray([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], jnp.int32)
    loss_mask = mask.astype(jnp.float32).at[2:].set(0.0).at[1].set(0.0)  # rows 1-3: truncated, filler
    lengths = np.asarray(trained_lengths(prompt_mask, mask, loss_mask))
    np.testing.assert_array_equal(lengths, [5, 0, 0, 0])
    plan = plan_packs(lengths[None], pack_length=8)
    np.testing.assert_array_equal(plan["row"][0], [0, -1, -1, -1])
    assert int(plan["slots"].sum()) == 5  # only row 0's tokens are packed
