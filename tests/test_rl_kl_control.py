"""KL controllers: the adaptive rule against a plain-Python reference, pytree behaviour (jit, scan,
no retracing) and argument checks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import rl


def ref_adaptive(beta, target, horizon, steps):
    """β ← β·(1 + clip(KL/target − 1, −0.2, 0.2)·n/horizon), one (kl, n) at a time."""
    out = []
    for kl, n in steps:
        error = min(max(kl / target - 1.0, -0.2), 0.2)
        beta = beta * (1.0 + error * n / horizon)
        out.append(beta)
    return out


def test_adaptive_matches_reference_under_scan():
    rng = np.random.RandomState(0)
    kls = rng.uniform(0.0, 12.0, size=20).astype(np.float32)  # both sides of the clip
    ns = rng.randint(1, 512, size=20).astype(np.float32)
    ctrl = rl.AdaptiveKLController.create(0.2, target=6.0, horizon=1000.0)

    def step(c, x):
        c = c.update(x[0], x[1])
        return c, c.value

    final, betas = jax.jit(lambda c: jax.lax.scan(step, c, jnp.stack([kls, ns], 1)))(ctrl)
    want = ref_adaptive(0.2, 6.0, 1000.0, zip(kls.tolist(), ns.tolist()))
    np.testing.assert_allclose(betas, want, rtol=1e-5)
    np.testing.assert_allclose(final.value, want[-1], rtol=1e-5)
    assert final.value.dtype == jnp.float32


def test_adaptive_hand_worked_and_clipping():
    ctrl = rl.AdaptiveKLController.create(0.1, target=6.0, horizon=10000.0)
    # KL at target: unchanged. KL = 9: error 0.5 clipped to 0.2 → 0.1·(1 + 0.2·256/10000).
    np.testing.assert_allclose(ctrl.update(6.0, 256).value, 0.1, rtol=1e-7)
    np.testing.assert_allclose(ctrl.update(9.0, 256).value, 0.1 * 1.00512, rtol=1e-6)
    # KL = 5.4: error −0.1 (inside the clip) → 0.1·(1 − 0.1·256/10000).
    np.testing.assert_allclose(ctrl.update(5.4, 256).value, 0.1 * 0.99744, rtol=1e-6)
    # KL = 0: error −1 clipped to −0.2.
    np.testing.assert_allclose(ctrl.update(0.0, 256).value, 0.1 * 0.99488, rtol=1e-6)
    # Pure: the original state is untouched.
    assert float(ctrl.value) == pytest.approx(0.1)


def test_fixed_controller_is_constant():
    ctrl = rl.FixedKLController.create(0.05)
    out = jax.jit(lambda c, kl: c.update(kl, 64))(ctrl, jnp.float32(100.0))
    np.testing.assert_allclose(out.value, 0.05)
    assert rl.FixedKLController.create(0.0).value == 0.0


def test_controllers_are_pytrees_without_retracing():
    ctrl = rl.AdaptiveKLController.create(0.1, 6.0, 10000.0)
    leaves = jax.tree_util.tree_leaves(ctrl)
    assert len(leaves) == 3 and all(leaf.shape == () for leaf in leaves)
    count = [0]

    def upd(c, kl, n):
        count[0] += 1
        return rl.AdaptiveKLController.update(c, kl, n)

    jupd = jax.jit(upd)
    for kl in (1.0, 7.0, 20.0):
        ctrl = jupd(ctrl, jnp.float32(kl), jnp.float32(128))
    # A controller with another target/horizon is the same pytree structure: still one trace.
    jupd(rl.AdaptiveKLController.create(0.3, 2.0, 500.0), jnp.float32(1.0), jnp.float32(8))
    assert count[0] == 1
    assert len(jax.tree_util.tree_leaves(rl.FixedKLController.create(0.1))) == 1


@pytest.mark.parametrize("call, match", [
    (lambda: rl.AdaptiveKLController.create(0.1, 0.0, 100.0), "target"),
    (lambda: rl.AdaptiveKLController.create(0.1, 6.0, -1.0), "horizon"),
    (lambda: rl.AdaptiveKLController.create(0.0, 6.0, 100.0), "init_kl_coef"),
    (lambda: rl.AdaptiveKLController.create(jnp.ones(2), 6.0, 100.0), "init_kl_coef"),
    (lambda: rl.FixedKLController.create(-0.1), "kl_coef"),
    (lambda: rl.AdaptiveKLController.create(0.1, 6.0, 100.0).update(jnp.ones(3), 8), "kl"),
    (lambda: rl.FixedKLController.create(0.1).update(1.0, jnp.ones(2)), "n_steps"),
])
def test_kl_controller_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
