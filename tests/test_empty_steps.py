"""An empty step is not a non-finite one: a minibatch without loss tokens (DAPO kept no group, every
completion truncated under dapo.mask_truncated, everything rejected) contributes 0 and no update, is
logged as `train/empty_updates` with its cause, and never counts towards train.max_nonfinite_steps."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import config as config_lib
from jaxrl_llm import rl
from jaxrl_llm.trainer import Trainer, diagnose

sys.path.insert(0, os.path.dirname(__file__))
from test_trainer import read_jsonl, small_config, update_batch  # noqa: E402


def _minibatch(n=4, t=3, loss_rows=()):
    rng = np.random.RandomState(0)
    mask = np.ones((n, t), np.float32)
    loss_mask = np.zeros((n, t), np.float32)
    loss_mask[list(loss_rows)] = 1.0
    logp = jnp.asarray(-rng.rand(n, t), jnp.float32)
    return logp, {"loss_mask": jnp.asarray(loss_mask), "mask": jnp.asarray(mask), "old_logp": logp - 0.1,
                  "ref_logp": logp + 0.3, "adv": jnp.asarray(rng.randn(n), jnp.float32),
                  "scores": jnp.zeros(n), "is_weights": jnp.ones((n, t))}


@pytest.mark.parametrize("aggregate", rl.AGGREGATE_MODES)
def test_empty_minibatch_loss_and_gradient_are_zero_with_kl_entropy_and_nll(aggregate):
    """Before: the KL, entropy and NLL terms divided their sums by a denominator of 0 (0/0 = NaN)."""
    o = rl.Objective(group_size=2, aggregate=aggregate, kl_coef=0.02, entropy_coef=0.01, nll_coef=0.1)
    logp, mb = _minibatch()
    den = o.denominators(mb)
    loss_fn = lambda lp: o.policy_loss(lp, jnp.ones_like(lp), mb, jnp.float32(0.02), den)[0]
    loss, grad = jax.value_and_grad(loss_fn)(logp)
    assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)
    # Property: with loss tokens the clamp changes nothing (the counts are >= 1 already).
    logp, mb = _minibatch(loss_rows=(1, 2))
    raw = rl.aggregate_denominator(mb["loss_mask"], aggregate, norm_length=o.norm_length)
    assert float(o.denominators(mb)["policy"]) == float(raw) >= 1.0


def test_truncation_cap_below_one_needs_no_lower_bound():
    """Before: cap 0.5 derived lower = 1/cap = 2 > cap and was refused, though truncation never reads it."""
    fields = {"correction": {"mode": "token_truncate", "cap": 0.5}}
    c = config_lib.prepare(config_lib.from_dict({"data": {"task": "digit_puzzles"},
                                                 "reward": {"functions": "digit_puzzles"}, **fields}))
    assert c.correction.cap == 0.5
    beh = jnp.log(jnp.full((1, 2), 0.5))
    w, keep, _ = rl.rollout_correction(beh, jnp.zeros((1, 2)), jnp.ones((1, 2)), mode="token_truncate", cap=0.5)
    np.testing.assert_allclose(w, 0.5)  # ρ = 2, truncated at the cap
    assert np.all(np.asarray(keep) == 1.0)
    with pytest.raises(ValueError, match=r"config.correction.lower must be at most the cap 0.5"):
        config_lib.prepare(config_lib.from_dict({"data": {"task": "digit_puzzles"}, "reward": {"functions": "digit_puzzles"},
                                                 "correction": {"mode": "token_mask", "cap": 0.5}}))


def test_causes_are_named():
    c = config_lib.prepare(small_config("dapo", **{"dapo.mask_truncated": True}))
    assert "kept no group in 4 round(s)" in diagnose.empty_cause(c, {"dapo/kept_groups": 0.0, "dapo/sample_rounds": 4})
    assert "every completion was truncated" in diagnose.empty_cause(c, {"dapo/kept_groups": 0.5,
                                                                       "response_length/clip_ratio": 1.0})
    causes = diagnose.nonfinite_causes(c, {"reward/mean": 3e4, "reward/std": 2e5})
    assert "a reward's scale (reward/mean 3e+04" in causes and "optimizer.learning_rate=0.001" in causes
    assert "rewards themselves are NaN" in diagnose.nonfinite_causes(c, {"reward/mean": float("nan")})


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


@pytest.mark.parametrize("overrides", [
    {},  # every group's rewards equal: DAPO keeps no group
    {"dapo.mask_truncated": True, "dapo.dynamic_sampling": False, "rollout.max_new_tokens": 1},  # all truncated
], ids=["no_group_kept", "all_truncated"])
def test_empty_dapo_steps_run_and_are_not_nonfinite(overrides, tmp_path, caplog):
    """Before: `FloatingPointError: 3 consecutive updates had NaN/inf loss or gradients` at step 3."""
    c = small_config("dapo", total_steps=2, **{"train.max_nonfinite_steps": 1, "checkpoint.every_steps": 10,
                                               "log.samples_every": 0, **overrides})
    t = Trainer(c, str(tmp_path), rewards=[zero_reward] if not overrides else None)
    before = jax.device_get(t.state.params)
    history = t.run()
    assert [m["train/empty_updates"] for m in history] == [1.0, 1.0]
    assert all(m["train/skipped_updates"] == 0.0 and m["train/nonfinite_streak"] == 0.0 for m in history)
    assert all(np.isfinite(m["policy/loss"]) and m["policy/grad_norm"] == 0.0 for m in history)
    assert int(t.state.opt_step) == 0  # no AdamW step: moments and weight decay untouched
    jax.tree_util.tree_map(np.testing.assert_array_equal, before, jax.device_get(t.state.params))
    assert read_jsonl(tmp_path / "metrics.jsonl")[-1]["train/empty_updates"] == 1.0
    assert "had no loss token and were skipped" in caplog.text
    assert ("kept no group" if not overrides else "every completion was truncated") in caplog.text


def test_the_update_writes_the_donated_state_in_place(tmp_path):
    """The skip (a non-finite or an empty update) is a conditional around the optimizer step. As a select
    of the new and the old state, XLA computed the new parameters from the old AdamW moments after
    updating those in place, so it copied every moment first: two parameter-sized temporaries (at
    Qwen2.5-0.5B's shape the update's temporaries went 5.07 -> 3.68 GiB without them). Here: the compiled
    update copies none of the state arrays it receives (donated, written in place)."""
    import re
    from jaxrl_llm import sharding
    t = Trainer(small_config("grpo", total_steps=1), str(tmp_path))
    state = t.state
    b = update_batch(t, state)
    with sharding.use_mesh(t.mesh):
        hlo = t.fns.update.lower(state, b, jnp.arange(4), None, t.base).compile().as_text()
    entry = hlo[hlo.index("\nENTRY "):]
    signature = entry[:entry.index("->")]
    arrays = re.findall(r"(state_[\w.]+): f32\[\d", signature)  # the state's float arrays, by HLO name
    assert len(arrays) >= 3 * len(jax.tree_util.tree_leaves(state.params)), signature[:500]  # params, mu, nu
    copied = [a for a in arrays if re.search(rf"copy\(%{re.escape(a)}\)", hlo)]
    assert not copied, copied
