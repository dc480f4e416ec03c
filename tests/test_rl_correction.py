"""rollout_correction against a slow per-token Python reference, and its properties."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import rl
from jaxrl_llm.rl.correction import CORRECTION_MODES, correction_bounds, rollout_correction

N, T = 6, 7


def reference(behavior, proximal, mask, mode, cap, lower):
    """Loops over rows and tokens in float64."""
    w = np.zeros((N, T))
    keep = np.zeros((N, T))
    for i in range(N):
        valid = [t for t in range(T) if mask[i, t]]
        lr = {t: min(max(float(proximal[i, t]) - float(behavior[i, t]), -20.0), 20.0) for t in valid}
        seq = sum(lr.values())
        for t in valid:
            rho = math.exp(lr[t])
            if mode == "token_truncate":
                w[i, t], keep[i, t] = min(rho, cap), 1
            elif mode == "token_mask":
                w[i, t], keep[i, t] = 1, lower <= rho <= cap
            elif mode == "sequence_truncate":
                w[i, t], keep[i, t] = min(math.exp(seq), cap), 1
            elif mode == "sequence_mask":
                w[i, t], keep[i, t] = 1, lower <= math.exp(seq) <= cap
            elif mode == "geometric_mask":
                w[i, t], keep[i, t] = 1, lower <= math.exp(seq / len(valid)) <= cap
            else:
                w[i, t], keep[i, t] = 1, 1
    return w, keep


def batch(seed, scale=0.3):
    rng = np.random.default_rng(seed)
    mask = (np.arange(T)[None] < rng.integers(0, T + 1, (N, 1))).astype(np.int32)
    mask[0] = 1  # a full row and (likely) an empty one
    behavior = rng.normal(-2, 1, (N, T)).astype(np.float32)
    proximal = (behavior + rng.normal(0, scale, (N, T))).astype(np.float32)
    behavior[mask == 0] = np.nan  # masked garbage must not leak
    return behavior, proximal, mask


@pytest.mark.parametrize("mode", CORRECTION_MODES)
@pytest.mark.parametrize("bounds", [(None, None), (1.5, 0.8)])
def test_matches_the_slow_reference(mode, bounds):
    behavior, proximal, mask = batch(0)
    cap, lower = correction_bounds(mode, *bounds)
    w, keep, m = rollout_correction(behavior, proximal, mask, mode=mode, cap=bounds[0], lower=bounds[1])
    want_w, want_keep = reference(behavior, proximal, mask, mode, cap, lower)
    np.testing.assert_allclose(w, want_w, rtol=2e-5, atol=1e-7)
    np.testing.assert_array_equal(keep, want_keep)
    applied = (want_w * want_keep)[mask > 0]
    ess = applied.sum() ** 2 / (applied.size * (applied ** 2).sum()) if applied.any() else 0.0
    np.testing.assert_allclose(m["correction/ess"], ess, rtol=1e-5)
    np.testing.assert_allclose(m["correction/kept_frac"], want_keep[mask > 0].mean(), rtol=1e-6)
    np.testing.assert_allclose(m["correction/weight_max"], applied.max(), rtol=1e-5)
    d = (proximal.astype(np.float64) - behavior)[mask > 0]
    np.testing.assert_allclose(m["correction/mismatch_kl"], np.mean(np.exp(d) - d - 1), rtol=1e-4)


def test_equal_policies_change_nothing_and_weights_have_no_gradient():
    behavior, _, mask = batch(1)
    same = np.where(mask > 0, behavior, 0.0)
    for mode in CORRECTION_MODES:
        w, keep, m = rollout_correction(same, same, mask, mode=mode)
        np.testing.assert_array_equal(w, mask.astype(np.float32))
        np.testing.assert_array_equal(keep, mask.astype(np.float32))
        assert float(m["correction/ess"]) == 1.0 and float(m["correction/mismatch_kl"]) == 0.0
    g = jax.grad(lambda p: jnp.sum(rollout_correction(same, p, mask, mode="token_truncate")[0]))(
        jnp.asarray(same))
    assert not np.any(np.asarray(g))


def test_large_mismatch_is_contained():
    behavior, proximal, mask = batch(2, scale=30.0)  # ratios up to e^20 and beyond
    for mode in CORRECTION_MODES:
        w, keep, m = rollout_correction(behavior, proximal, mask, mode=mode)
        assert np.all(np.isfinite(w)) and np.all(np.isfinite(list(map(float, m.values()))))
        assert float(np.max(w)) <= correction_bounds(mode)[0] + 1e-6 or mode in ("none", "token_mask", "sequence_mask",
                                                                               "geometric_mask")
    _, keep, m = rollout_correction(behavior, proximal, mask, mode="token_mask")
    assert float(m["correction/kept_frac"]) < 0.5 and float(m["correction/ess"]) < 0.5


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="tis"), "mode must be one of"), (dict(mode="token_mask", cap=1.0, lower=2.0), "0 < lower <= cap"),
])
def test_bad_arguments(kwargs, message):
    b, p, m = batch(3)
    with pytest.raises(ValueError, match=message):
        rollout_correction(b, p, m, **kwargs)


def test_exported_from_rl():
    assert rl.rollout_correction is rollout_correction and rl.CORRECTION_MODES == CORRECTION_MODES
