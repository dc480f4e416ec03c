"""jaxrl_llm.rl.advantages against slow NumPy / Python-loop references, hand-worked examples and
properties. Tiny shapes; everything runs eagerly except the retracing checks."""
import math
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import rl

N, T = 6, 5


def random_mask(rng, n=N, t=T, holes=False):
    """Right-padded masks of random lengths; row 0 is empty and row 1 full. `holes` also drops
    random tokens inside rows (masked steps must pass the GAE carry)."""
    lengths = rng.randint(0, t + 1, size=n)
    lengths[0], lengths[1] = 0, t
    m = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    if holes:
        m *= (rng.rand(n, t) > 0.3).astype(np.float32)
    return m


def count_traces(f):
    """jit(f) plus a list whose first element counts how many times f was traced."""
    count = [0]

    def wrapped(*args):
        count[0] += 1
        return f(*args)

    return jax.jit(wrapped), count


# --------------------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------------------

def ref_gae(rewards, values, mask, gamma, lam_rows, lam_value_rows):
    """GAE by its definition A_t = Σ_l (γλ)^l δ_{t+l} over the valid tokens of each row."""
    n, t = rewards.shape
    adv, ret = np.zeros((n, t)), np.zeros((n, t))
    for i in range(n):
        idx = [j for j in range(t) if mask[i, j]]
        deltas = []
        for k, j in enumerate(idx):
            v_next = values[i, idx[k + 1]] if k + 1 < len(idx) else 0.0
            deltas.append(float(rewards[i, j]) + gamma * float(v_next) - float(values[i, j]))
        for k, j in enumerate(idx):
            adv[i, j] = sum((gamma * lam_rows[i]) ** l * deltas[k + l]
                            for l in range(len(idx) - k))
            a_v = sum((gamma * lam_value_rows[i]) ** l * deltas[k + l]
                      for l in range(len(idx) - k))
            ret[i, j] = a_v + values[i, j]
    return adv, ret


def ref_whiten(x, mask, shift_mean=True):
    vals = [float(v) for v, m in zip(np.ravel(x), np.ravel(mask)) if m]
    out = np.zeros(np.shape(x))
    if not vals:
        return out
    mean = sum(vals) / len(vals)
    var = statistics.variance(vals) if len(vals) > 1 else 0.0
    for idx in np.ndindex(*np.shape(x)):
        if mask[idx]:
            out[idx] = (x[idx] - mean) / math.sqrt(var + 1e-8) + (0.0 if shift_mean else mean)
    return out


def ref_discounted_returns(rewards, mask, gamma):
    n, t = rewards.shape
    out = np.zeros((n, t))
    for i in range(n):
        idx = [j for j in range(t) if mask[i, j]]
        for k, j in enumerate(idx):
            out[i, j] = sum(gamma ** l * rewards[i, idx[k + l]] for l in range(len(idx) - k))
    return out


# --------------------------------------------------------------------------------------------------
# GAE
# --------------------------------------------------------------------------------------------------

def test_gae_hand_worked():
    # γ=0.9, λ=0.5, V=0.5, score 1 on the last token:
    # δ = [0.45−0.5, 0.45−0.5, 1−0.5] = [−0.05, −0.05, 0.5]
    # A2 = 0.5, A1 = −0.05 + 0.45·0.5 = 0.175, A0 = −0.05 + 0.45·0.175 = 0.02875
    rewards = jnp.array([[0.0, 0.0, 1.0]])
    values = jnp.full((1, 3), 0.5)
    adv, ret = rl.gae(rewards, values, jnp.ones((1, 3)), gamma=0.9, lam=0.5)
    np.testing.assert_allclose(adv, [[0.02875, 0.175, 0.5]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[0.52875, 0.675, 1.0]], rtol=1e-6)


def test_gae_hand_worked_hole_passes_carry():
    # Token 1 is masked and holds garbage: token 0 bootstraps from token 2.
    # δ0 = 0 + 1·0.5 − 0.5 = 0, δ2 = 1 − 0.5 = 0.5, A2 = 0.5, A0 = 0 + 1·1·0.5 = 0.5.
    rewards = jnp.array([[0.0, 123.0, 1.0]])
    values = jnp.array([[0.5, -77.0, 0.5]])
    adv, ret = rl.gae(rewards, values, jnp.array([[1, 0, 1]]), gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv, [[0.5, 0.0, 0.5]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[1.0, 0.0, 1.0]], rtol=1e-6)


@pytest.mark.parametrize("holes", [False, True])
def test_gae_matches_reference(holes):
    rng = np.random.RandomState(1 + holes)
    mask = random_mask(rng, holes=holes)
    rewards = rng.randn(N, T).astype(np.float32)
    values = rng.randn(N, T).astype(np.float32)
    adv, ret = rl.gae(rewards, values, mask, gamma=0.95, lam=0.8)
    ref_adv, ref_ret = ref_gae(rewards, values, mask, 0.95, [0.8] * N, [0.8] * N)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_gae_per_row_lambda_and_decoupled_value_lambda():
    rng = np.random.RandomState(3)
    mask = random_mask(rng, holes=True)
    rewards = rng.randn(N, T).astype(np.float32)
    values = rng.randn(N, T).astype(np.float32)
    lam = rng.uniform(0.3, 1.0, size=N).astype(np.float32)
    adv, ret = rl.gae(rewards, values, mask, gamma=0.9, lam=lam, lam_value=1.0)
    ref_adv, ref_ret = ref_gae(rewards, values, mask, 0.9, lam, [1.0] * N)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)
    # λ_value = 1 telescopes: the value target is the discounted Monte Carlo return.
    np.testing.assert_allclose(ret, ref_discounted_returns(rewards, mask, 0.9), rtol=1e-5,
                               atol=1e-5)


def test_gae_ignores_garbage_in_masked_positions():
    rng = np.random.RandomState(4)
    mask = random_mask(rng, holes=True)
    rewards = rng.randn(N, T).astype(np.float32)
    values = rng.randn(N, T).astype(np.float32)
    dirty_r = np.where(mask > 0, rewards, np.nan).astype(np.float32)
    dirty_v = np.where(mask > 0, values, 1e30).astype(np.float32)
    clean = rl.gae(rewards, values, mask, gamma=0.99, lam=0.95)
    dirty = rl.gae(dirty_r, dirty_v, mask, gamma=0.99, lam=0.95)
    for c, d in zip(clean, dirty):
        np.testing.assert_array_equal(c, d)
        assert np.all(np.asarray(d)[mask == 0] == 0)


def test_adaptive_lam():
    mask = np.array([[1, 1, 1, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.float32)
    lam = rl.adaptive_lam(mask, alpha=0.5)
    # 1 − 1/(0.5·4) = 0.5; 1 − 1/(0.5·1) = −1 → clipped to 0; empty row → 1.
    np.testing.assert_allclose(lam, [0.5, 0.0, 1.0], rtol=1e-6)


# --------------------------------------------------------------------------------------------------
# Whitening and token rewards
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shift_mean", [True, False])
def test_whiten_matches_reference(shift_mean):
    rng = np.random.RandomState(5)
    mask = random_mask(rng, holes=True)
    x = (3.0 + 2.0 * rng.randn(N, T)).astype(np.float32)
    out = rl.whiten(x, mask, shift_mean)
    np.testing.assert_allclose(out, ref_whiten(x, mask, shift_mean), rtol=1e-5, atol=1e-5)
    if shift_mean:
        valid = np.asarray(out)[mask > 0]
        np.testing.assert_allclose(valid.mean(), 0.0, atol=1e-5)
        np.testing.assert_allclose(valid.std(ddof=1), 1.0, rtol=1e-4)


def test_whiten_degenerate_masks():
    x = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(rl.whiten(x, jnp.zeros((2, 3))), np.zeros((2, 3)))
    one = jnp.zeros((2, 3)).at[1, 2].set(1.0)
    np.testing.assert_array_equal(rl.whiten(x, one), np.zeros((2, 3)))


def test_token_rewards_reference():
    rng = np.random.RandomState(6)
    mask = random_mask(rng, holes=True)
    scores = rng.randn(N).astype(np.float32)
    kl = rng.rand(N, T).astype(np.float32)
    out = np.asarray(rl.token_rewards(scores, mask, kl))
    ref = np.zeros((N, T))
    for i in range(N):
        idx = [j for j in range(T) if mask[i, j]]
        for j in idx:
            ref[i, j] = -kl[i, j] + (scores[i] if j == idx[-1] else 0.0)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# Group advantages, RLOO, REINFORCE++
# --------------------------------------------------------------------------------------------------

# Group tests use N = 6 rewards, the row count of the other tests, so eager primitives compile once.

def test_group_advantages_hand_worked():
    # Group [1, 0, 0]: mean 1/3, unbiased std sqrt(((2/3)² + 2·(1/3)²)/2) = 1/sqrt(3), so
    # A = (2/3)·sqrt(3) = 1.1547005 and −(1/3)·sqrt(3) = −0.5773503. Group [2, 2, 2]: tied, 0.
    rewards = jnp.array([1.0, 0.0, 0.0, 2.0, 2.0, 2.0])
    adv = rl.group_advantages(rewards, 3, eps=0.0)
    np.testing.assert_allclose(adv, [1.1547005, -0.5773503, -0.5773503, 0, 0, 0], rtol=1e-6)
    dr = rl.group_advantages(rewards, 3, scale="none")  # Dr. GRPO: centered only
    np.testing.assert_allclose(dr, [2 / 3, -1 / 3, -1 / 3, 0, 0, 0], rtol=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_matches_reference(scale):
    rng = np.random.RandomState(7)
    g = 2
    rewards = rng.randn(N).astype(np.float32)
    rewards[2:4] = 0.7  # one tied group
    out = np.asarray(rl.group_advantages(rewards, g, scale=scale, eps=1e-6))
    batch_std = statistics.stdev([float(r) for r in rewards])
    ref = []
    for b in range(N // g):
        grp = [float(r) for r in rewards[b * g:(b + 1) * g]]
        mean = sum(grp) / g
        std = {"group": statistics.stdev(grp), "batch": batch_std, "none": None}[scale]
        for r in grp:
            tied = max(grp) == min(grp)
            ref.append(0.0 if tied else (r - mean) / (std + 1e-6) if std is not None else r - mean)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_tied_group_is_exactly_zero(scale):
    # 0.1 is not representable: the float32 group mean may differ from 0.1 by an ulp, which a
    # division by (std + eps) would otherwise turn into a visible advantage.
    rewards = jnp.array([0.1, 0.1, 0.1, 1.0, 0.0, 1.0], jnp.float32)
    for eps in (1e-6, 0.0):
        out = np.asarray(rl.group_advantages(rewards, 3, scale=scale, eps=eps))
        assert np.all(np.isfinite(out))
        assert np.all(out[:3] == 0.0) and np.all(out[3:] != 0.0)


def test_rloo_matches_reference_and_identity():
    rng = np.random.RandomState(8)
    g = 3
    rewards = rng.randn(N).astype(np.float32)
    out = np.asarray(rl.rloo_advantages(rewards, g))
    ref = []
    for b in range(N // g):
        grp = [float(r) for r in rewards[b * g:(b + 1) * g]]
        for i, r in enumerate(grp):
            others = grp[:i] + grp[i + 1:]
            ref.append(r - sum(others) / len(others))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    # RLOO is Dr. GRPO's centered reward scaled by G/(G−1).
    np.testing.assert_allclose(out, np.asarray(rl.group_advantages(rewards, g, scale="none"))
                               * g / (g - 1), rtol=1e-5, atol=1e-6)
    tied = np.asarray(rl.rloo_advantages(jnp.array([0.1, 0.1, 0.1, 0.3, 0.3, 0.3]), g))
    assert np.all(tied == 0.0)


@pytest.mark.parametrize("group_size", [None, 3])
def test_reinforce_pp_matches_reference(group_size):
    rng = np.random.RandomState(9)
    mask = random_mask(rng)
    scores = rng.randn(N).astype(np.float32)
    kl = (0.05 * rng.rand(N, T)).astype(np.float32)
    out = rl.reinforce_pp_advantages(scores, kl, mask, gamma=0.9, group_size=group_size)
    s = scores.astype(np.float64)
    if group_size:
        s = np.concatenate([grp - grp.mean() for grp in s.reshape(-1, group_size)])
    rewards = np.zeros((N, T))
    for i in range(N):
        idx = [j for j in range(T) if mask[i, j]]
        for j in idx:
            rewards[i, j] = -kl[i, j] + (s[i] if j == idx[-1] else 0.0)
    ref = ref_whiten(ref_discounted_returns(rewards, mask, 0.9), mask)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# jit without retracing; bad input
# --------------------------------------------------------------------------------------------------

def test_advantages_jit_without_retracing():
    rng = np.random.RandomState(10)
    mask = random_mask(rng)
    cases = [
        (lambda r, v: rl.gae(r, v, mask, gamma=0.99, lam=0.95), 2),
        (lambda r, v: rl.whiten(r, mask), 2),
        (lambda r, v: rl.group_advantages(r[:, 0], 3), 1),
        (lambda r, v: rl.rloo_advantages(r[:, 0], 2), 1),
        (lambda r, v: rl.reinforce_pp_advantages(r[:, 0], v, mask, gamma=1.0, group_size=2), 1),
    ]
    for f, _ in cases:
        jf, count = count_traces(f)
        for _ in range(3):
            jax.block_until_ready(jf(rng.randn(N, T).astype(np.float32),
                                     rng.randn(N, T).astype(np.float32)))
        assert count[0] == 1
    # Traced γ, λ (e.g. from a schedule) do not retrace either.
    jg, count = count_traces(lambda r, g, l: rl.gae(r, r, mask, gamma=g, lam=l))
    for g in (0.9, 0.95):
        jg(jnp.ones((N, T)), jnp.float32(g), jnp.full((N,), 0.9, jnp.float32))
    assert count[0] == 1


@pytest.mark.parametrize("call, match", [
    (lambda: rl.group_advantages(jnp.ones(4), 0), "group_size"),
    (lambda: rl.group_advantages(jnp.ones(4), -2), "group_size"),
    (lambda: rl.group_advantages(jnp.ones(4), 1), "group_size"),
    (lambda: rl.group_advantages(jnp.ones(6), 4), "group_size"),
    (lambda: rl.group_advantages(jnp.ones(4), 2.0), "group_size"),
    (lambda: rl.group_advantages(jnp.ones(4), 2, scale="std"), "scale"),
    (lambda: rl.group_advantages(jnp.ones((2, 2)), 2), "rewards"),
    (lambda: rl.rloo_advantages(jnp.ones(4), 1), "group_size"),
    (lambda: rl.rloo_advantages(jnp.ones(5), 2), "group_size"),
    (lambda: rl.gae(jnp.ones((2, 3)), jnp.ones((2, 4)), jnp.ones((2, 3)), gamma=1.0, lam=1.0),
     "values"),
    (lambda: rl.gae(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((3, 3)), gamma=1.0, lam=1.0),
     "mask"),
    (lambda: rl.gae(jnp.ones(3), jnp.ones(3), jnp.ones(3), gamma=1.0, lam=1.0), "rewards"),
    (lambda: rl.gae(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 3)), gamma=1.5, lam=1.0),
     "gamma"),
    (lambda: rl.gae(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 3)), gamma=1.0,
                    lam=jnp.ones(3)), "lam"),
    (lambda: rl.gae(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 3)), gamma=1.0, lam=1.0,
                    lam_value=-0.1), "lam_value"),
    (lambda: rl.whiten(jnp.ones((2, 3)), jnp.ones((3, 2))), "mask"),
    (lambda: rl.reinforce_pp_advantages(jnp.ones(2), jnp.ones((2, 4)), jnp.ones((2, 3)),
                                        gamma=1.0), "kl"),
    (lambda: rl.reinforce_pp_advantages(jnp.ones(3), jnp.ones((2, 3)), jnp.ones((2, 3)),
                                        gamma=1.0), "scores"),
    (lambda: rl.reinforce_pp_advantages(jnp.ones(4), jnp.ones((4, 3)), jnp.ones((4, 3)),
                                        gamma=1.0, group_size=3), "group_size"),
    (lambda: rl.adaptive_lam(jnp.ones((2, 3)), alpha=0.0), "alpha"),
])
def test_advantages_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_bad_input_raises_at_trace_time_under_jit():
    with pytest.raises(ValueError, match="group_size"):
        jax.jit(lambda r: rl.group_advantages(r, 3))(jnp.ones(4))
    with pytest.raises(ValueError, match="mask"):
        jax.jit(lambda r, m: rl.gae(r, r, m, gamma=1.0, lam=1.0))(jnp.ones((2, 3)),
                                                                  jnp.ones((2, 2)))


# --------------------------------------------------------------------------------------------------
# Statistics over the rows / tokens that enter the loss; bootstrap; process rewards
# --------------------------------------------------------------------------------------------------

def test_batch_scale_std_ignores_rows_outside_the_loss():
    """scale='batch' takes its std over the rows the loss sees: a filler group (row_mask 0) with wild
    scores changes nothing of the kept rows' advantages."""
    scores = np.array([0.0, 1.0, 2.0, 4.0, 100.0, -50.0], np.float32)
    keep = np.array([1, 1, 1, 1, 0, 0])
    got = rl.group_advantages(scores, 2, scale="batch", row_mask=keep)
    kept = scores[:4].astype(np.float64)
    std = statistics.stdev(kept)
    want = [(kept[i] - kept[2 * (i // 2):2 * (i // 2) + 2].mean()) / (std + 1e-6) for i in range(4)]
    np.testing.assert_allclose(got[:4], want, rtol=1e-5)
    unmasked = rl.group_advantages(scores, 2, scale="batch")
    assert not np.allclose(unmasked[:4], want, rtol=1e-3)  # the old statistics did move


@pytest.mark.parametrize("keep", [[1, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]])
def test_batch_scale_with_kept_rows_alike_falls_back_to_every_row(keep):
    """One kept row, or kept rows that scored alike, while rows outside the loss move their groups'
    means (dapo.mask_truncated): the std of every row scales them, not eps (an advantage of ~1e6)."""
    scores = np.array([1.0, 0.0, 1.0, 0.0], np.float32)
    got = np.asarray(rl.group_advantages(scores, 2, scale="batch", row_mask=np.array(keep)))
    std = statistics.stdev(scores.astype(np.float64))
    want = [(scores[i] - 0.5) / (std + 1e-6) for i in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert np.all(np.abs(got) < 2)
    tied = rl.group_advantages(np.full(4, 0.25, np.float32), 2, scale="batch", row_mask=np.array(keep))
    assert np.all(np.asarray(tied) == 0)


def test_reinforce_pp_whitens_over_the_loss_tokens():
    rng = np.random.default_rng(3)
    mask = np.ones((4, 3), np.float32)
    loss_mask = mask.copy()
    loss_mask[3] = 0  # a row the loss ignores
    scores = np.array([1.0, 0.0, 2.0, 50.0], np.float32)
    kl = jnp.asarray(0.01 * rng.normal(size=(4, 3)), jnp.float32)
    got = rl.reinforce_pp_advantages(scores, kl, mask, gamma=1.0, loss_mask=loss_mask)
    returns = ref_discounted_returns(np.asarray(rl.token_rewards(scores, mask, kl)), mask, 1.0)
    np.testing.assert_allclose(got, ref_whiten(returns, loss_mask), rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(got)[3] == 0)


def test_gae_bootstraps_a_truncated_row():
    """A row cut by the length limit did not end: its last δ uses V(s_T) instead of 0."""
    rewards = np.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]], np.float32)
    values = np.array([[0.5, 0.6, 0.7], [0.2, 0.3, 0.0]], np.float32)
    mask = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
    last = np.array([0.9, 0.0], np.float32)  # row 0 truncated; row 1 ended with EOS
    adv, ret = rl.gae(rewards, values, mask, gamma=0.9, lam=0.8, last_value=last)
    # Row 0 by hand: δ2 = 1 + 0.9*0.9 - 0.7; δ1 = 0.9*0.7 - 0.6; δ0 = 0.9*0.6 - 0.5.
    d2, d1, d0 = 1 + 0.81 - 0.7, 0.63 - 0.6, 0.54 - 0.5
    a2 = d2
    a1 = d1 + 0.72 * a2
    a0 = d0 + 0.72 * a1
    np.testing.assert_allclose(adv[0], [a0, a1, a2], rtol=1e-5)
    plain, _ = rl.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(adv[1], plain[1])  # a row that ended is unchanged
    np.testing.assert_allclose(ret, np.asarray(adv) + values * mask, rtol=1e-6)


def ref_group_process(step_rewards, step_mask, mask, g, eps=1e-6):
    n, t = mask.shape
    out = np.zeros((n, t))
    for b in range(n // g):
        rows = range(b * g, b * g + g)
        vals = [float(step_rewards[i, j]) for i in rows for j in range(t) if step_mask[i, j] and mask[i, j]]
        if len(vals) < 2 or max(vals) == min(vals):
            continue
        mean, std = statistics.mean(vals), statistics.stdev(vals)
        for i in rows:
            for tok in range(t):
                if mask[i, tok]:
                    out[i, tok] = sum((float(step_rewards[i, j]) - mean) / (std + eps)
                                      for j in range(tok, t) if step_mask[i, j] and mask[i, j])
    return out


def test_group_process_advantages_match_the_reference():
    rng = np.random.default_rng(4)
    mask = random_mask(np.random.RandomState(4))
    step_mask = (rng.random((N, T)) < 0.4).astype(np.float32)
    step_rewards = rng.normal(size=(N, T)).astype(np.float32)
    got = rl.group_process_advantages(step_rewards, step_mask, mask, 3)
    np.testing.assert_allclose(got, ref_group_process(step_rewards, step_mask, mask, 3), rtol=1e-4, atol=1e-5)
    # One step per row at its last token reduces to outcome GRPO's advantage on every token.
    full = np.ones((4, 3), np.float32)
    last = np.zeros((4, 3), np.float32)
    last[:, -1] = 1
    scores = np.array([1.0, 0.0, 0.5, 0.5], np.float32)
    proc = rl.group_process_advantages(scores[:, None] * last, last, full, 2)
    outcome = rl.group_advantages(scores, 2)
    np.testing.assert_allclose(proc, np.broadcast_to(np.asarray(outcome)[:, None], (4, 3)), rtol=1e-5, atol=1e-6)
