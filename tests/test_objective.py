"""The Objective: one hashable value per algorithm, read from the config; its registries are the lists
config validation reads; its step math equals the pure functions it bundles."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import config as config_lib
from jaxrl_llm import rl
from jaxrl_llm.rl import objective as objective_lib


def prepared(algo, **fields):
    c = config_lib.base_config()
    c.algo = algo
    c.data.task = "digit_puzzles"
    c.reward.functions = "digit_puzzles"
    if algo in ("opd", "gkd"):  # distillation needs a teacher (not loaded here)
        c.teacher.path = "teacher_dir"
    return config_lib.prepare(config_lib.from_dict(fields, c))


@pytest.mark.parametrize("algo", config_lib.ALGOS)
def test_from_config_reads_every_preset_field(algo):
    c = prepared(algo)
    o = rl.Objective.from_config(c)
    assert (o.estimator, o.surrogate, o.ratio, o.aggregate) == (
        c.advantage.estimator, c.loss.surrogate, c.loss.ratio, c.loss.aggregate)
    assert (o.clip_low, o.clip_high, o.kl_coef, o.kl_estimator, o.kl_placement, o.value) == (
        c.loss.clip_low, c.loss.clip_high, c.kl.coef, c.kl.estimator, c.kl.placement, c.value.enabled)
    assert o.norm_length == c.rollout.max_new_tokens and o.group_size == c.rollout.group_size
    # Hashable and equal by value: it keys the compiled step functions.
    assert hash(o) == hash(rl.Objective.from_config(prepared(algo))) and o == rl.Objective.from_config(c)
    assert o != dataclasses.replace(o, clip_high=o.clip_high + 0.01)


def test_presets_differ_where_the_algorithms_do():
    objs = {a: rl.Objective.from_config(prepared(a)) for a in config_lib.ALGOS}
    assert len(set(objs.values())) == len(objs)  # no two presets compile the same step
    assert objs["ppo"].estimator == "gae" and objs["ppo"].value and objs["ppo"].kl_placement == "reward"
    assert objs["dr_grpo"].scale == "none" and objs["dr_grpo"].aggregate == "seq-mean-token-sum-norm"
    assert objs["gspo"].ratio == "sequence" and objs["gspo"].clip_low == 3e-4
    assert objs["dapo"].clip_high == 0.28 and objs["cispo"].surrogate == "cispo"


@pytest.mark.parametrize("field, registry", [
    ("advantage.estimator", rl.ESTIMATORS), ("loss.surrogate", rl.SURROGATES), ("loss.ratio", rl.RATIOS),
    ("loss.aggregate", rl.AGGREGATE_MODES), ("kl.estimator", rl.KL_KINDS), ("advantage.scale", rl.ADVANTAGE_SCALES)])
def test_validation_reads_the_registries(field, registry):
    with pytest.raises(ValueError, match=f"config.{field} must be one of {', '.join(registry)}"):
        prepared("grpo", **{field: "no_such_thing"})


def test_a_registered_estimator_is_accepted_and_used_without_touching_config_or_trainer():
    """Adding an estimator is one registration: config validation and the step pick it up."""
    @rl.register_estimator("_test_best_of_group", group=True)
    def best_of_group(o, b, penalty):
        groups = b["scores"].reshape(-1, o.group_size)
        return (groups == groups.max(axis=1, keepdims=True)).astype(jnp.float32).reshape(-1), None

    try:
        c = prepared("grpo", **{"advantage.estimator": "_test_best_of_group", "rollout.group_size": 3, "kl.coef": 0.0})
        o = rl.Objective.from_config(c)
        scores = jnp.array([0.0, 1.0, 1.0, 2.0, 0.0, 0.0])
        batch = {"scores": scores, "mask": jnp.ones((6, 2)), "loss_mask": jnp.ones((6, 2)), "old_logp": jnp.zeros((6, 2))}
        adv, returns, stats = o.advantages(batch, jnp.float32(0.0))
        np.testing.assert_array_equal(adv, [0, 1, 1, 1, 0, 0])
        assert returns is None and stats == {}
        with pytest.raises(ValueError, match="group_size must be at least 2"):
            prepared("grpo", **{"advantage.estimator": "_test_best_of_group", "rollout.group_size": 1})
        with pytest.raises(ValueError, match="already registered"):
            rl.register_estimator("_test_best_of_group")(lambda o, b, p: (None, None))
    finally:
        del rl.ESTIMATORS["_test_best_of_group"]
    with pytest.raises(ValueError, match="advantage.estimator must be one of"):
        prepared("grpo", **{"advantage.estimator": "_test_best_of_group"})


def test_estimator_needs_are_enforced():
    with pytest.raises(ValueError, match="value.enabled must be True with the gae estimator"):
        prepared("grpo", **{"advantage.estimator": "gae"})
    # A sequence-score estimator takes the KL in the reward summed over the row (tests/test_off_policy.py).
    assert prepared("rloo", **{"kl.placement": "reward", "kl.coef": 0.1, "kl.estimator": "k1"}).kl.placement == "reward"
    with pytest.raises(ValueError, match="needs a value model"):
        rl.Objective(group_size=4, estimator="gae")
    with pytest.raises(ValueError, match="Objective.surrogate must be one of clip, sapo, cispo"):
        rl.Objective(group_size=4, surrogate="ppo")


def _batch(rng, n, t, g):
    mask = (np.arange(t)[None] < rng.integers(1, t + 1, (n, 1))).astype(np.float32)
    return {"scores": jnp.asarray(rng.normal(size=n), jnp.float32), "mask": jnp.asarray(mask),
            "loss_mask": jnp.asarray(mask), "old_logp": jnp.asarray(rng.normal(size=(n, t)) - 2, jnp.float32),
            "ref_logp": jnp.asarray(rng.normal(size=(n, t)) - 2, jnp.float32),
            "old_values": jnp.asarray(rng.normal(size=(n, t)), jnp.float32)}


@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce_pp", "ppo", "dr_grpo"])
def test_advantages_are_the_estimator_functions(algo):
    """Objective.advantages dispatches to the pure functions with the config's options (the functions
    themselves are checked against slow references in test_rl_advantages.py)."""
    c = prepared(algo, **{"rollout.group_size": 4})
    o = rl.Objective.from_config(c)
    b = _batch(np.random.default_rng(0), 8, 5, 4)
    beta = jnp.float32(c.kl.coef)
    adv, returns, stats = o.advantages(b, beta)
    kl = jnp.where(b["mask"] > 0, rl.kl_penalty(b["old_logp"], b["ref_logp"], c.kl.estimator), 0.0)
    if algo in ("grpo", "dr_grpo"):
        want = rl.group_advantages(b["scores"], 4, scale=c.advantage.scale, eps=c.advantage.eps)
    elif algo == "rloo":
        want = rl.rloo_advantages(b["scores"], 4)
    elif algo == "reinforce_pp":
        want = rl.reinforce_pp_advantages(b["scores"], beta * kl, b["mask"], gamma=c.advantage.gamma)
    else:
        rewards = rl.token_rewards(b["scores"], b["mask"], beta * kl)
        want, want_returns = rl.gae(rewards, b["old_values"], b["mask"], gamma=c.advantage.gamma, lam=c.advantage.lam,
                                    lam_value=o.lam_value)
        want = rl.whiten(want, b["loss_mask"])
        np.testing.assert_allclose(returns, want_returns, rtol=1e-6)
    np.testing.assert_allclose(adv, want, rtol=1e-6, atol=1e-7)
    if c.kl.coef > 0:
        np.testing.assert_allclose(stats["kl/seq_sum"], jnp.mean(jnp.sum(kl, axis=1)), rtol=1e-6)


@pytest.mark.parametrize("algo", ["grpo", "dapo", "dr_grpo", "gspo", "sapo", "cispo"])
def test_policy_loss_adds_up_over_micro_batches_and_has_the_kl_gradient(algo):
    """The loss of a batch split into micro-batches over the global denominators sums to the whole
    batch's; the KL-in-loss term's gradient is β times the aggregated estimator's."""
    c = prepared(algo, **{"rollout.group_size": 2, "kl.coef": 0.1, "entropy_coef": 0.01})
    o = rl.Objective.from_config(c)
    rng = np.random.default_rng(1)
    b = _batch(rng, 8, 6, 2)
    b["adv"] = jnp.asarray(rng.normal(size=8), jnp.float32)
    logp = b["old_logp"] + jnp.asarray(0.1 * rng.normal(size=(8, 6)), jnp.float32)
    ent = jnp.asarray(rng.uniform(size=(8, 6)), jnp.float32)
    den = o.denominators(b)
    beta = jnp.float32(0.1)
    whole, _ = o.policy_loss(logp, ent, b, beta, den)
    parts = [o.policy_loss(logp[s], ent[s], {k: v[s] for k, v in b.items()}, beta, den)[0]
             for s in (slice(0, 2), slice(2, 8))]
    np.testing.assert_allclose(sum(parts), whole, rtol=1e-5)

    no_kl = dataclasses.replace(o, kl_coef=0.0)
    g = jax.grad(lambda lp: o.policy_loss(lp, ent, b, beta, den)[0])(logp)
    g0 = jax.grad(lambda lp: no_kl.policy_loss(lp, ent, b, beta, den)[0])(logp)
    gk = jax.grad(lambda lp: rl.aggregate_sum(rl.kl_penalty(lp, b["ref_logp"], "k3"), b["loss_mask"], o.aggregate)
                  / den["policy"])(logp)
    np.testing.assert_allclose(g - g0, 0.1 * gk, atol=1e-6)


def test_value_loss_and_metrics_are_token_weighted():
    o = rl.Objective.from_config(prepared("ppo"))
    b = _batch(np.random.default_rng(2), 4, 5, 1)
    b["returns"] = b["old_values"] + 0.5
    values = b["old_values"] + 0.3
    loss, m = o.value_loss(values, b, o.denominators(b))
    want, wm = rl.value_loss(values, b["old_values"], b["returns"], b["loss_mask"], clip=0.2)
    np.testing.assert_allclose(loss, want, rtol=1e-6)
    np.testing.assert_allclose(m["value/clipfrac_sum"] / jnp.sum(b["loss_mask"]), wm["clipfrac"], rtol=1e-6)


def test_kl_controller_from_the_objective():
    assert isinstance(rl.Objective(group_size=2, kl_coef=0.1).kl_controller(), rl.FixedKLController)
    adaptive = rl.Objective(group_size=2, kl_coef=0.1, kl_adaptive=True).kl_controller()
    assert isinstance(adaptive, rl.AdaptiveKLController) and float(adaptive.value) == pytest.approx(0.1)


def test_estimator_registry_lives_in_rl():
    assert set(rl.ESTIMATORS) == {"gae", "group", "group_process", "rloo", "reinforce_pp", "none"}
    assert objective_lib.ESTIMATORS is rl.ESTIMATORS


def test_rloo_whitened_over_the_rows_the_loss_sees_matches_a_loop():
    """advantage.whiten with RLOO: the leave-one-out advantages, then zero mean and unit (ddof=1) std over
    the on-policy rows that have loss tokens; a row without loss tokens and a supervised row get 0 and
    move nothing. Reference: Python loops."""
    rng = np.random.default_rng(3)
    n, t, g = 12, 4, 4
    c = prepared("rloo", **{"rollout.group_size": g, "advantage.whiten": True, "kl.coef": 0.0})
    o = rl.Objective.from_config(c)
    b = _batch(rng, n, t, g)
    loss_mask = np.array(b["loss_mask"])
    loss_mask[5] = 0.0  # e.g. a masked truncation
    supervised = np.zeros(n, np.float32)
    supervised[9] = 1.0
    b = {**b, "loss_mask": jnp.asarray(loss_mask), "supervised": jnp.asarray(supervised),
         "behavior_logp": b["old_logp"], "is_weights": jnp.ones((n, t))}
    out, _ = o.prepare(b, jnp.float32(0.0))
    s = np.array(b["scores"], np.float64)
    loo = [s[i] - sum(s[j] for j in range(i // g * g, i // g * g + g) if j != i) / (g - 1) for i in range(n)]
    rows = [i for i in range(n) if loss_mask[i].any() and not supervised[i]]
    mean = sum(loo[i] for i in rows) / len(rows)
    var = sum((loo[i] - mean) ** 2 for i in rows) / (len(rows) - 1)
    want = [(loo[i] - mean) / np.sqrt(var + 1e-8) if i in rows else 0.0 for i in range(n)]
    np.testing.assert_allclose(out["adv"], want, rtol=1e-5, atol=1e-6)
    # only the scale and shift differ from plain RLOO: a mutation that whitens over every row is caught
    plain = rl.Objective.from_config(prepared("rloo", **{"rollout.group_size": g, "kl.coef": 0.0}))
    np.testing.assert_allclose(plain.prepare(b, jnp.float32(0.0))[0]["adv"], loo, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algo", ["grpo", "reinforce_pp"])
def test_whiten_is_refused_where_the_estimator_ignores_it(algo):
    with pytest.raises(ValueError, match="advantage.whiten must be False with the"):
        prepared(algo, **{"advantage.whiten": True})
    with pytest.raises(ValueError, match="ignores whiten"):
        rl.Objective(group_size=4, estimator=prepared(algo).advantage.estimator, whiten=True)
