"""Off-policy correctness through the trainer: behaviour / proximal / current log-probs, rollout
correction with a real precision gap, and the wiring of DAPO's shaping and filter, GSPO's first update,
the KL estimators, REINFORCE++ and batch statistics, VAPO and process rewards."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import config as config_lib
from jaxrl_llm import rl, sharding
from jaxrl_llm.trainer import Trainer
from jaxrl_llm.trainer.setup import build_rewards
from test_trainer import small_config


def one_step(tmp_path, algo, **overrides):
    c = small_config(algo, total_steps=1, **overrides)
    trainer = Trainer(c, str(tmp_path))
    return trainer, trainer.run()[0]


# ---------------------------------------------------------------------------------------- DAPO
@pytest.mark.parametrize("T, lengths, want", [
    (8, [3, 4, 5, 6], [-3 / 8, -4 / 8, -5 / 8, -6 / 8]),  # the buffer is the whole length: -|o|/8
    (64, [55, 56, 57, 64], [0.0, 0.0, -1 / 8, -1.0]),  # the penalty starts after 64 - 8 = 56 tokens
])
def test_dapo_overlong_buffer_reaches_the_reward(T, lengths, want):
    c = config_lib.base_config()
    c.algo, c.data.task, c.reward.functions = "dapo", "digit_puzzles", "digit_puzzles"
    c.rollout.max_new_tokens, c.dapo.overlong_buffer = T, 8
    c = config_lib.prepare(c)
    (name, fn, weight), = [r for r in build_rewards(c, None) if r[0] == "overlong"]
    got = fn(["p"] * 4, ["c"] * 4, completion_lengths=lengths, max_completion_length=T)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_dapo_dynamic_sampling_filters_on_the_named_quantity(tmp_path):
    """Every group is all wrong on the accuracy reward while another component varies: filtering on
    the total would keep the groups and z-score that variation into full-size advantages."""
    two = {"algo": "dapo", "reward.functions": "fixtures_rewards:always_zero,fixtures_rewards:digit_fraction",
           "dapo.max_sample_rounds": 2}
    _, m = one_step(tmp_path / "a", **two, **{"dapo.filter_on": "always_zero"})
    assert m["dapo/kept_groups"] == 0.0 and m["dapo/sample_rounds"] == 2
    _, total = one_step(tmp_path / "b", **two, **{"dapo.filter_on": "total"})
    assert total["dapo/kept_groups"] > 0


def test_dapo_default_filter_leaves_out_length_shaping():
    """By default the filter is the rewards but the length-shaping ones (overlong, length_penalty)."""
    from types import SimpleNamespace

    from jaxrl_llm.rewards import RewardBatch
    from jaxrl_llm.trainer.rollout import Rollouts
    components = {"math_answer": np.zeros(4, np.float32), "format": np.array([0, 1, 0, 1], np.float32),
                  "overlong": np.array([-1, 0, -0.5, 0], np.float32), "length_penalty": np.ones(4, np.float32)}
    batch = RewardBatch(sum(components.values()), {}, components, [[]] * 4)
    rollouts = SimpleNamespace(c=SimpleNamespace(dapo=SimpleNamespace(filter_on="")))
    np.testing.assert_array_equal(Rollouts._filter_scores(rollouts, batch), [0, 1, 0, 1])
    rollouts.c.dapo.filter_on = "math_answer"
    np.testing.assert_array_equal(Rollouts._filter_scores(rollouts, batch), np.zeros(4))
    rollouts.c.dapo.filter_on = "total"
    np.testing.assert_array_equal(Rollouts._filter_scores(rollouts, batch), batch.scores)


def test_dapo_filter_on_must_name_a_reward():
    c = small_config("dapo", **{"dapo.filter_on": "accuracy"})
    with pytest.raises(ValueError, match="config.dapo.filter_on must be '' .* or one of the reward functions "
                                         "digit_fraction, overlong"):
        config_lib.prepare(c)


# ---------------------------------------------------------------------------------------- GSPO
def test_gspo_does_not_clip_its_first_update_in_bfloat16(tmp_path):
    """In bfloat16 the sampler's and the trainer's log-probs differ by ~1e-3 per token, wider than
    GSPO's 1 ± 4e-4 band: with old log-probs from the sampler the very first update clips; the preset
    recomputes them, so the first update's ratios are 1 (to float rounding) and nothing clips."""
    bf16 = {"model.compute_dtype": "bfloat16", "rollout.max_new_tokens": 4, "rollout.group_size": 8,
            "rollout.batch_prompts": 16}
    _, fixed = one_step(tmp_path / "a", "gspo", **bf16)
    assert fixed["policy/clipfrac"] == 0.0  # ratios 1 up to the rounding of two compiled forwards:
    assert abs(fixed["policy/ratio_max"] - 1) < 1e-6 and abs(fixed["policy/ratio_min"] - 1) < 1e-6
    _, old = one_step(tmp_path / "b", "gspo", **bf16, **{"rollout.recompute_logprobs": False})
    assert old["sampler/logp_diff_max"] > 4e-4 and old["policy/clipfrac"] > 0


# ------------------------------------------------------------------------- correction, precision gap
def test_bfloat16_sampler_float32_trainer_is_corrected(tmp_path):
    """A real behaviour/proximal gap: the sampler computes in bfloat16, the trainer in float32 and
    recomputes the proximal log-probs; token_mask with a tight band rejects tokens and the loss's
    normaliser shrinks with them."""
    gap = {"rollout.compute_dtype": "bfloat16", "rollout.recompute_logprobs": True, "rollout.max_new_tokens": 4}
    trainer, m = one_step(tmp_path / "tis", "grpo", **gap, **{"correction.mode": "token_truncate"})
    assert m["sampler/logp_diff_max"] > 1e-4  # the sampler really is another policy
    # ... by little: the ESS, 1 - O(gap^2), is within float32's resolution of 1 here (0.99999988 or 1.0,
    # depending on the rounding of the sampler's matmuls); the masked run below shows the tokens that differ.
    assert m["correction/mismatch_kl"] > 0 and m["correction/ess"] <= 1 and m["correction/kept_frac"] == 1
    _, masked = one_step(tmp_path / "mask", "grpo", **gap, **{"correction.mode": "token_mask", "correction.cap": 1.0001})
    assert 0 < masked["correction/kept_frac"] < 1 and masked["correction/ess"] == pytest.approx(
        masked["correction/kept_frac"], rel=1e-5)
    _, same = one_step(tmp_path / "f32", "grpo", **{"rollout.recompute_logprobs": True, "correction.mode": "token_mask",
                                                   "correction.cap": 1.0001})
    assert same["correction/kept_frac"] == 1.0  # the same precision on both sides: nothing to reject


def test_prepare_removes_rejected_tokens_from_the_loss_and_its_normaliser():
    o = rl.Objective(group_size=2, aggregate="token-mean", correction_mode="token_mask", correction_cap=1.5,
                     correction_lower=0.5)
    mask = jnp.ones((4, 3))
    behavior = jnp.zeros((4, 3)) - 1.0
    proximal = behavior.at[0, 1].add(2.0)  # ratio e^2: rejected
    b = {"scores": jnp.array([1.0, 0.0, 0.5, 0.2]), "mask": mask, "loss_mask": mask, "behavior_logp": behavior,
         "old_logp": proximal}
    fields, stats = o.prepare(b, jnp.float32(0.0))
    np.testing.assert_array_equal(fields["loss_mask"], mask.at[0, 1].set(0.0))
    assert float(stats["correction/kept_frac"]) == pytest.approx(11 / 12)
    mb = {**b, **fields}
    den = o.denominators(mb)
    assert float(den["policy"]) == 11.0
    logp = proximal + 0.05
    grad = jax.grad(lambda lp: o.policy_loss(lp, jnp.zeros_like(lp), mb, 0.0, den)[0])(logp)
    assert float(grad[0, 1]) == 0.0 and float(jnp.abs(grad[0, 0])) > 0


def test_truncated_importance_weights_scale_the_policy_gradient():
    base = rl.Objective(group_size=2, aggregate="token-mean")
    tis = dataclasses.replace(base, correction_mode="token_truncate", correction_cap=2.0)
    mask = jnp.ones((2, 2))
    behavior = jnp.log(jnp.array([[0.5, 0.5], [0.25, 0.5]]))
    proximal = jnp.log(jnp.array([[0.5, 0.75], [0.75, 0.5]]))  # ratios 1, 1.5; 3 (capped at 2), 1
    b = {"scores": jnp.array([1.0, 0.0]), "mask": mask, "loss_mask": mask, "behavior_logp": behavior,
         "old_logp": proximal}
    f0, _ = base.prepare(b, 0.0)
    f1, _ = tis.prepare(b, 0.0)
    np.testing.assert_allclose(f1["is_weights"], [[1.0, 1.5], [2.0, 1.0]], rtol=1e-6)
    g = lambda o, f: jax.grad(lambda lp: o.policy_loss(lp, lp, {**b, **f}, 0.0, o.denominators({**b, **f}))[0])(proximal)
    np.testing.assert_allclose(g(tis, f1), g(base, f0) * f1["is_weights"], rtol=1e-5)


# ---------------------------------------------------------------------------------------- KL
def test_kl_k1_in_the_loss_is_refused_and_k3_plus_runs(tmp_path):
    with pytest.raises(ValueError, match=r"config.kl.estimator must be k2, k3 or k3\+ with kl.placement='loss' "
                                         r"\(k1's expected gradient is zero"):
        config_lib.prepare(small_config("grpo", **{"kl.estimator": "k1"}))
    _, m = one_step(tmp_path, "grpo", **{"kl.estimator": "k3+", "kl.importance_weighted": True,
                                         "train.minibatches": 2})
    assert np.isfinite(m["policy/loss"]) and m["kl/ref"] >= 0


def test_rloo_takes_its_kl_in_the_reward_as_a_sequence_penalty():
    """docs/algorithms/grpo.md: RLOO's KL may go in the reward; it is summed over the row's tokens."""
    c = small_config("rloo", **{"kl.placement": "reward", "kl.estimator": "k1", "kl.coef": 0.1})
    o = rl.Objective.from_config(config_lib.prepare(c))
    rng = np.random.default_rng(0)
    mask = jnp.ones((4, 3))
    old, ref = (jnp.asarray(rng.normal(size=(4, 3)) - 2, jnp.float32) for _ in range(2))
    b = {"scores": jnp.array([1.0, 0.0, 0.3, 0.3]), "mask": mask, "loss_mask": mask, "old_logp": old,
         "ref_logp": ref, "behavior_logp": old}
    adv, _, _ = o.advantages(b, jnp.float32(0.1))
    want = rl.rloo_advantages(b["scores"] - 0.1 * jnp.sum(old - ref, axis=1), 2)
    np.testing.assert_allclose(adv, want, rtol=1e-5)


# ------------------------------------------------------------- statistics over the loss's rows/tokens
@pytest.mark.parametrize("algo, fields", [("grpo", {"advantage.scale": "batch"}), ("reinforce_pp", {})])
def test_batch_statistics_ignore_rows_outside_the_loss(algo, fields):
    """Filler groups (DAPO) and masked truncations have loss_mask 0: they must not move the batch
    std (scale=batch) or REINFORCE++'s whitening."""
    o = rl.Objective.from_config(config_lib.prepare(small_config(algo, **{"rollout.group_size": 2, **fields})))
    mask = jnp.ones((6, 3))
    loss_mask = mask.at[4:].set(0.0)
    scores = jnp.array([0.0, 1.0, 2.0, 4.0, 0.0, 0.0])
    b = {"mask": mask, "loss_mask": loss_mask, "old_logp": jnp.full((6, 3), -1.0), "ref_logp": jnp.full((6, 3), -1.0)}
    a1, _, _ = o.advantages({**b, "scores": scores}, jnp.float32(0.0))
    a2, _, _ = o.advantages({**b, "scores": scores.at[4:].set(jnp.array([100.0, -300.0]))}, jnp.float32(0.0))
    np.testing.assert_allclose(np.asarray(a1)[:4], np.asarray(a2)[:4], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------- VAPO, process
def test_value_pretraining_freezes_the_policy_then_releases_it(tmp_path):
    c = small_config("ppo", total_steps=3, **{"value.pretrain_steps": 2, "checkpoint.every_steps": 100})
    trainer = Trainer(c, str(tmp_path))
    params0 = jax.tree_util.tree_map(np.asarray, trainer.state.params)
    value0 = jax.tree_util.tree_map(np.asarray, trainer.state.value_params)
    state = trainer.state
    changed = lambda a, b: any(not np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a),
                                                                          jax.tree_util.tree_leaves(b)))
    for _ in range(2):
        state, m, _ = trainer.train_step(state)
    assert not changed(params0, state.params) and changed(value0, state.value_params)
    assert int(state.opt_step) == 0  # the policy's schedule has not started
    state, m, _ = trainer.train_step(state)
    assert changed(params0, state.params) and int(state.opt_step) == 1


def test_nll_term_is_the_token_mean_nll_of_completions_that_score_well():
    o = rl.Objective(group_size=2, aggregate="token-mean", nll_coef=0.5, nll_threshold=1.0)
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    b = {"scores": jnp.array([1.0, 0.0, 2.0, 0.5]), "mask": mask, "loss_mask": mask, "adv": jnp.zeros(4),
         "old_logp": jnp.zeros((4, 3)) - 1, "is_weights": mask}
    den = o.denominators(b)
    assert float(den["nll"]) == 3.0  # rows 0 and 2 score >= 1: 2 + 1 tokens
    logp = jnp.full((4, 3), -1.0)
    _, m = o.policy_loss(logp, jnp.zeros_like(logp), b, 0.0, den)
    assert float(m["policy/nll"]) == pytest.approx(1.0)
    g_nll = jax.grad(lambda lp: o.policy_loss(lp, lp * 0, b, 0.0, den)[0])(logp)
    g0 = jax.grad(lambda lp: dataclasses.replace(o, nll_coef=0.0).policy_loss(lp, lp * 0, b, 0.0, den)[0])(logp)
    want = -0.5 * np.array([[1, 1, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]]) / 3
    np.testing.assert_allclose(g_nll - g0, want, atol=1e-7)


def test_process_rewards_train_through_group_process(tmp_path):
    trainer, m = one_step(tmp_path, "grpo", **{"advantage.estimator": "group_process",
                                                "reward.functions": "fixtures_rewards:digit_steps"})
    assert np.isfinite(m["policy/loss"]) and "reward/digit_steps/mean" in m
    local, _, _ = trainer.rollouts.collect(trainer.state.params, jax.random.PRNGKey(1))
    steps = local["process_mask"].sum(axis=1)
    np.testing.assert_array_equal(steps, local["lengths"] - (~local["truncated"]))  # a step per character


def test_bootstrap_truncated_reads_the_value_after_the_last_token(tmp_path):
    c = small_config("ppo", **{"advantage.bootstrap_truncated": True, "rollout.max_new_tokens": 3})
    trainer = Trainer(c, str(tmp_path))
    local, _, _ = trainer.rollouts.collect(trainer.state.params, jax.random.PRNGKey(0))
    local["truncated"] = np.array(local["truncated"])
    local["truncated"][:2] = True  # at least two truncated rows; and one that ended
    local["truncated"][2] = False
    b = trainer.rollouts.device_batch(local)
    # The value head starts at zero (V = 0 everywhere): give it weights that read the hidden state.
    keys = iter(jax.random.split(jax.random.PRNGKey(1), 64))
    noisy = jax.tree_util.tree_map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype),
                                   trainer.state.value_params)
    state = trainer.state.replace(value_params=noisy)
    with sharding.use_mesh(trainer.mesh):
        out = trainer.fns.score(state, trainer.frozen_ref, b)
    last = np.asarray(out["last_values"])
    assert last[2] == 0.0 and np.all(last[:2] != 0.0)
    # An independent reference: the value model on the completion extended by any real token.
    from jaxrl_llm.trainer.steps import values_of
    tokens = np.concatenate([np.asarray(b["tokens"]), np.full((len(last), 1), 5, np.int32)], axis=1)
    ext = {**b, "tokens": jnp.asarray(tokens), "mask": jnp.ones(tokens.shape, jnp.int32)}
    want = np.asarray(values_of(trainer.mc, noisy, ext))[:, -1]
    np.testing.assert_allclose(last[:2], want[:2], rtol=1e-5, atol=1e-6)
