"""jaxrl_llm.rl.losses against slow NumPy / Python-loop references, hand-worked clip examples,
gradient identities on a toy softmax policy, KL estimator expectations, and minibatch invariance of
the (sum, denominator) form. Tiny shapes, mostly eager (primitives compile once per shape)."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import rl

N, T, V = 6, 5, 4
MODES = rl.AGGREGATE_MODES


def random_mask(rng, n=N, t=T):
    """Right-padded masks of random lengths; row 0 is empty, row 1 full."""
    lengths = rng.randint(0, t + 1, size=n)
    lengths[0], lengths[1] = 0, t
    return (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)


def count_traces(f):
    count = [0]

    def wrapped(*args):
        count[0] += 1
        return f(*args)

    return jax.jit(wrapped), count


# --------------------------------------------------------------------------------------------------
# References (float64, loops)
# --------------------------------------------------------------------------------------------------

def valid_idx(mask, i):
    return [t for t in range(mask.shape[1]) if mask[i, t]]


def ref_aggregate(x, mask, mode, norm_length=None):
    n, t = mask.shape
    rows = [[float(x[i, j]) for j in valid_idx(mask, i)] for i in range(n)]
    nonempty = [r for r in rows if r]
    if mode == "token-mean":
        count = sum(len(r) for r in rows)
        return sum(sum(r) for r in rows) / count if count else 0.0
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in nonempty) / len(nonempty) if nonempty else 0.0
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in nonempty) / len(nonempty) if nonempty else 0.0
    return sum(sum(r) for r in rows) / (n * (norm_length or t))


def aggregation_weights(mask, mode, norm_length=None):
    """(N,T) d aggregate / d x: the weight each valid token gets."""
    n, t = mask.shape
    lengths = mask.sum(1)
    nonempty = max(int((lengths > 0).sum()), 1)
    w = np.zeros((n, t))
    for i in range(n):
        for j in valid_idx(mask, i):
            w[i, j] = {"token-mean": 1.0 / max(mask.sum(), 1),
                       "seq-mean-token-mean": 1.0 / (lengths[i] * nonempty),
                       "seq-mean-token-sum": 1.0 / nonempty,
                       "seq-mean-token-sum-norm": 1.0 / (n * (norm_length or t))}[mode]
    return w


def sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


def ref_policy(logp, old_logp, adv, mask, *, ratio="token", surrogate="clip", clip_low=0.2,
               clip_high=0.2, dual_clip=None, tau_pos=1.0, tau_neg=1.05, cispo_max=5.0):
    """Per-token losses, ratios and clip indicators, token by token."""
    n, t = mask.shape
    adv = np.broadcast_to(adv[:, None], (n, t)) if adv.ndim == 1 else adv
    per, rho = np.zeros((n, t)), np.ones((n, t))
    low, high, anyclip = np.zeros((n, t)), np.zeros((n, t)), np.zeros((n, t))
    for i in range(n):
        idx = valid_idx(mask, i)
        lr = {j: min(max(float(logp[i, j]) - float(old_logp[i, j]), -20.0), 20.0) for j in idx}
        log_s = min(sum(lr.values()) / len(idx), 10.0) if idx else 0.0
        for j in idx:
            r = math.exp(lr[j]) if ratio == "token" else math.exp(log_s)
            a = float(adv[i, j])
            rho[i, j] = r
            if surrogate == "cispo":
                per[i, j] = -min(r, cispo_max) * a * float(logp[i, j])
                high[i, j] = anyclip[i, j] = r > cispo_max
                continue
            low[i, j] = a < 0 and r < 1 - clip_low
            high[i, j] = a > 0 and r > 1 + clip_high
            anyclip[i, j] = low[i, j] or high[i, j]
            if surrogate == "clip":
                per[i, j] = -min(r * a, min(max(r, 1 - clip_low), 1 + clip_high) * a)
                if dual_clip is not None and a < 0:
                    per[i, j] = min(per[i, j], -dual_clip * a)
                    anyclip[i, j] = anyclip[i, j] or r > dual_clip
            else:
                tau = tau_pos if a > 0 else tau_neg
                per[i, j] = -sigmoid(tau * (r - 1)) * 4 / tau * a
    return per, rho, low, high, anyclip


def masked_mean(x, mask):
    return float((x * mask).sum() / max(mask.sum(), 1))


# Toy softmax policy: the logits are the parameters, one distribution per token.
def logp_of(theta, tokens):
    logp_all = jax.nn.log_softmax(theta, axis=-1)
    return jnp.take_along_axis(logp_all, tokens[..., None], axis=-1)[..., 0]


def np_grad_logp(theta, tokens):
    """∇_θ log softmax(θ)[token] = onehot(token) − softmax(θ), per token, (N,T,V)."""
    z = theta.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.eye(theta.shape[-1])[tokens] - p


def np_logp(theta, tokens):
    z = theta - theta.max(-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return np.take_along_axis(logp_all, tokens[..., None], axis=-1)[..., 0]


def toy_problem(seed, n=N, t=T, v=V, noise=0.05):
    rng = np.random.RandomState(seed)
    theta = rng.randn(n, t, v).astype(np.float32)
    tokens = rng.randint(0, v, size=(n, t))
    mask = random_mask(rng, n, t)
    logp = np.asarray(logp_of(theta, tokens))
    old = (logp + rng.uniform(-noise, noise, size=(n, t))).astype(np.float32)
    return rng, theta, tokens, mask, logp, old


# --------------------------------------------------------------------------------------------------
# KL estimators
# --------------------------------------------------------------------------------------------------

def test_kl_penalty_matches_reference():
    rng = np.random.RandomState(0)
    logp, ref = rng.randn(N, T).astype(np.float32), rng.randn(N, T).astype(np.float32)
    ref[0, 0] = logp[0, 0] + 30.0  # k3 clamps d = 30 to 20
    for kind in rl.KL_KINDS:
        out = np.asarray(rl.kl_penalty(logp, ref, kind))
        for idx in np.ndindex(N, T):
            d = float(ref[idx]) - float(logp[idx])
            k3 = math.exp(min(d, 20.0)) - min(d, 20.0) - 1
            want = {"k1": -d, "k2": d * d / 2, "k3": k3, "k3+": k3}[kind]
            np.testing.assert_allclose(out[idx], want, rtol=2e-5, atol=1e-5)


def _categorical_kl_gradients(kind, off_policy, weighted=None):
    """(expected gradient of the KL term over tokens drawn from π_old, exact gradient of the reverse KL
    KL(π_θ ‖ π_ref), exact gradient of the forward KL(π_ref ‖ π_θ)) for a small categorical policy:
    the expectation is a sum over the whole vocabulary, weighted by π_old (no sampling noise)."""
    rng = np.random.default_rng(0)
    theta, old, ref = (jnp.asarray(rng.normal(size=7), jnp.float32) for _ in range(3))
    weighted = off_policy if weighted is None else weighted
    old = theta + 0.3 * old if off_policy else theta  # later minibatches: θ has moved away from π_old
    tokens = jnp.arange(7)

    def expected_term(th):
        logp = jax.nn.log_softmax(th)[tokens][None]  # every token of the vocabulary as a "sample"
        k = rl.kl_penalty(logp, jax.nn.log_softmax(ref)[tokens][None], kind)[0]
        if weighted:  # importance weight π_θ/π_old of the token, not differentiated
            k = k * jax.lax.stop_gradient(jnp.exp(logp[0] - jax.nn.log_softmax(old)))
        return jnp.sum(jax.nn.softmax(old) * k)  # E_{x~π_old}[...]

    reverse = lambda th: jnp.sum(jax.nn.softmax(th) * (jax.nn.log_softmax(th) - jax.nn.log_softmax(ref)))
    forward = lambda th: jnp.sum(jax.nn.softmax(ref) * (jax.nn.log_softmax(ref) - jax.nn.log_softmax(th)))
    return jax.grad(expected_term)(theta), jax.grad(reverse)(theta), jax.grad(forward)(theta)


@pytest.mark.parametrize("weighted", [False, True])  # on-policy, or off-policy with the importance weight
def test_kl_estimator_gradients_on_a_categorical_policy(weighted):
    """k2 and k3+ follow the reverse KL they report; k3 differentiated follows the forward KL; k1's
    expected gradient is zero. With tokens from an older policy, weighting the term by the
    importance ratio π_θ/π_old restores these identities (the trainer's kl.importance_weighted)."""
    for kind in ("k2", "k3+"):
        got, rev, _ = _categorical_kl_gradients(kind, weighted)
        np.testing.assert_allclose(got, rev, atol=1e-6)
    got, _, fwd = _categorical_kl_gradients("k3", weighted)
    np.testing.assert_allclose(got, fwd, atol=1e-6)
    got, rev, _ = _categorical_kl_gradients("k1", weighted)
    np.testing.assert_allclose(got, np.zeros(7), atol=1e-6)
    assert np.abs(rev).max() > 1e-2  # the identities above are not all trivially zero
    if weighted:  # without the weight, off-policy samples give another gradient
        unweighted, rev, _ = _categorical_kl_gradients("k3+", True, weighted=False)
        assert not np.allclose(unweighted, rev, atol=1e-3)


def test_k3_nonnegative_and_zero_at_equality():
    x = jnp.linspace(-30.0, 30.0, 121)
    assert np.all(np.asarray(rl.kl_penalty(jnp.zeros_like(x), x, "k3")) >= 0)
    same = rl.kl_penalty(x, x, "k3")
    np.testing.assert_array_equal(same, np.zeros(121))
    # expm1 keeps tiny differences accurate (≈ d²/2); exp(d) − 1 − d in float32 would be off by
    # ~1e-8 absolute here, i.e. entirely noise.
    np.testing.assert_allclose(rl.kl_penalty(jnp.float32(0.0), jnp.float32(1e-4), "k3"),
                               0.5e-8, rtol=1e-2)


def test_kl_estimators_expectations_vs_exact_categorical_kl():
    p = np.array([0.4, 0.3, 0.2, 0.1])  # π_θ, the sampling policy
    q = np.array([0.25, 0.35, 0.15, 0.25])  # π_ref
    exact = float(np.sum(p * np.log(p / q)))
    logp, logq = np.log(p).astype(np.float32), np.log(q).astype(np.float32)
    est = {k: np.asarray(rl.kl_penalty(logp, logq, k), np.float64) for k in rl.KL_KINDS}
    # Exact expectations under p: k1 and k3 are unbiased, k2 is not (but close for nearby p, q).
    for kind in ("k1", "k3"):
        np.testing.assert_allclose(np.sum(p * est[kind]), exact, rtol=1e-5)
    assert abs(np.sum(p * est["k2"]) - exact) < 0.15 * exact
    # Monte Carlo: sample tokens from p and average the per-token estimates.
    rng = np.random.RandomState(0)
    samples = rng.choice(4, size=200_000, p=p)
    for kind in ("k1", "k3"):
        vals = est[kind][samples]
        stderr = vals.std() / math.sqrt(len(vals))
        assert abs(vals.mean() - exact) < 4 * stderr
    assert est["k3"].min() >= 0


# --------------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_aggregate_matches_reference(mode):
    rng = np.random.RandomState(1)
    mask = random_mask(rng)
    mask[3, 1] = 0.0  # a hole inside a row
    x = rng.randn(N, T).astype(np.float32)
    x_dirty = np.where(mask > 0, x, np.nan).astype(np.float32)
    for norm_length in (None, 7):
        out = rl.aggregate(x_dirty, mask, mode, norm_length=norm_length)
        np.testing.assert_allclose(out, ref_aggregate(x, mask, mode, norm_length), rtol=1e-5)
        s, d = rl.aggregate_parts(x, mask, mode, norm_length=norm_length)
        np.testing.assert_allclose(s, rl.aggregate_sum(x, mask, mode), rtol=1e-6)
        np.testing.assert_allclose(d, rl.aggregate_denominator(mask, mode,
                                                               norm_length=norm_length))
        np.testing.assert_allclose(out, s / d, rtol=1e-6)
    want_den = {"token-mean": mask.sum(), "seq-mean-token-mean": (mask.sum(1) > 0).sum(),
                "seq-mean-token-sum": (mask.sum(1) > 0).sum(),
                "seq-mean-token-sum-norm": N * T}[mode]
    assert float(rl.aggregate_denominator(mask, mode)) == want_den


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_empty_batch_is_zero(mode):
    x = jnp.full((N, T), jnp.nan)
    empty = jnp.zeros((N, T))
    assert float(rl.aggregate(x, empty, mode)) == 0.0
    g = jax.grad(lambda y: rl.aggregate(y, empty, mode))(jnp.ones((N, T)))
    np.testing.assert_array_equal(g, np.zeros((N, T)))


# --------------------------------------------------------------------------------------------------
# Policy loss: references and hand-worked examples
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ratio", rl.RATIOS)
@pytest.mark.parametrize("surrogate", rl.SURROGATES)
def test_policy_loss_matches_reference(ratio, surrogate):
    rng = np.random.RandomState(2)
    mask = random_mask(rng)
    logp = rng.uniform(-3, 0, size=(N, T)).astype(np.float32)
    old = (logp + rng.uniform(-0.5, 0.5, size=(N, T))).astype(np.float32)
    old[1, 0] = logp[1, 0] - 40.0  # exercises the ±20 clamp and (for GSPO) the ≤ 10 clamp
    kwargs = dict(clip_low=0.2, clip_high=0.28)
    if surrogate == "clip":
        kwargs["dual_clip"] = 3.0
    for adv in (rng.randn(N).astype(np.float32), rng.randn(N, T).astype(np.float32)):
        per, rho, low, high, anyclip = ref_policy(logp, old, adv, mask, ratio=ratio,
                                                  surrogate=surrogate, **kwargs)
        for mode in MODES:
            loss, metrics = rl.policy_loss(logp, old, adv, mask, ratio=ratio, surrogate=surrogate,
                                           aggregate=mode, **kwargs)
            np.testing.assert_allclose(loss, ref_aggregate(per, mask, mode), rtol=1e-5,
                                       atol=1e-6)
        lr = np.clip(logp.astype(np.float64) - old, -20, 20)
        valid = rho[mask > 0]
        want = {"clipfrac": masked_mean(anyclip, mask), "clipfrac_low": masked_mean(low, mask),
                "clipfrac_high": masked_mean(high, mask),
                "approx_kl": masked_mean(np.exp(lr) - 1 - lr, mask),
                "ratio_mean": valid.mean(), "ratio_min": valid.min(), "ratio_max": valid.max()}
        assert set(metrics) == set(want)
        for k, v in want.items():
            np.testing.assert_allclose(metrics[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def hand_loss(rho, adv, valid=(1, 1, 1, 1), **kwargs):
    """policy_loss on four one-token rows (a fixed shape keeps eager compilation cached), with
    ratios `rho` made by old_logp = logp − log ρ; rows with valid = 0 are padding."""
    rho = jnp.asarray(rho, jnp.float32).reshape(4, 1)
    logp = jnp.full((4, 1), -1.0)
    return rl.policy_loss(logp, logp - jnp.log(rho), jnp.asarray(adv, jnp.float32),
                          jnp.asarray(valid, jnp.float32).reshape(4, 1),
                          aggregate="seq-mean-token-sum", **kwargs)


def test_clip_hand_worked():
    # ε = 0.2, one token per row:
    #   A=1,   ρ=1.5 → −min(1.5, 1.2)   = −1.2   (clipped high)
    #   A=−10, ρ=0.5 → −min(−5, −8)     =  8     (clipped low)
    #   A=−1,  ρ=1.5 → −min(−1.5, −1.2) =  1.5   (pessimistic side: not clipped)
    #   A=1,   ρ=0.5 → −min(0.5, 0.8)   = −0.5
    loss, m = hand_loss([1.5, 0.5, 1.5, 0.5], [1.0, -10.0, -1.0, 1.0])
    np.testing.assert_allclose(loss, (-1.2 + 8 + 1.5 - 0.5) / 4, rtol=1e-6)
    np.testing.assert_allclose([m["clipfrac"], m["clipfrac_low"], m["clipfrac_high"]],
                               [0.5, 0.25, 0.25])
    # Clip-higher ε_high = 0.28: A=1, ρ=1.5 → −1.28 (rows 1-3 are padding).
    loss, _ = hand_loss([1.5, 1, 1, 1], [1.0, 5, 5, 5], (1, 0, 0, 0), clip_high=0.28)
    np.testing.assert_allclose(loss, -1.28, rtol=1e-6)


def test_dual_clip_hand_worked():
    # c = 3, A = −1: ρ=5 → standard −min(−5, −1.2) = 5, dual min(5, 3) = 3;
    # ρ=2 → 2 (below c, untouched); A = +1, ρ=5 → −1.2 (dual clip only acts on A < 0).
    per_row = []
    for i in range(3):
        valid = [int(j == i) for j in range(4)]
        loss, m = hand_loss([5.0, 2.0, 5.0, 1.0], [-1.0, -1.0, 1.0, 0.0], valid, dual_clip=3.0)
        per_row.append(float(loss))
    np.testing.assert_allclose(per_row, [3.0, 2.0, -1.2], rtol=1e-6)
    assert float(m["clipfrac"]) == 1.0 and float(m["clipfrac_high"]) == 1.0


def test_sapo_and_cispo_hand_worked():
    # SAPO: A=2, ρ=1.5, τ_pos=1 → −σ(0.5)·4·2; A=−2, ρ=1.5, τ_neg=1.05 → σ(0.525)·(4/1.05)·2.
    loss, _ = hand_loss([1.5, 1.5, 1, 1], [2.0, -2.0, 0, 0], (1, 1, 0, 0), surrogate="sapo")
    want = (-sigmoid(0.5) * 4 * 2 + sigmoid(0.525) * 4 / 1.05 * 2) / 2
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    # CISPO: logp = −1, ρ = 8 capped at 5, A = 2 → −5·2·(−1) = 10.
    loss, m = hand_loss([8.0, 1, 1, 1], [2.0, 0, 0, 0], (1, 0, 0, 0), surrogate="cispo")
    np.testing.assert_allclose(loss, 10.0, rtol=1e-5)
    assert float(m["clipfrac"]) == 1.0 and float(m["clipfrac_low"]) == 0.0


def test_policy_loss_empty_batch_and_masked_garbage():
    rng = np.random.RandomState(3)
    empty = jnp.zeros((N, T))
    x = jnp.asarray(rng.randn(N, T), jnp.float32)
    loss, m = rl.policy_loss(x, x + 1, jnp.ones(N), empty, ratio="sequence")
    assert float(loss) == 0.0
    assert {k: float(v) for k, v in m.items()} == {
        "clipfrac": 0.0, "clipfrac_low": 0.0, "clipfrac_high": 0.0, "approx_kl": 0.0,
        "ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}
    mask = random_mask(rng)
    nan_pad = jnp.where(mask > 0, x, jnp.nan)
    for ratio in rl.RATIOS:
        f = lambda lp: rl.policy_loss(lp, x * 0.9, jnp.ones(N), mask, ratio=ratio)[0]
        clean, g_clean = jax.value_and_grad(f)(x)
        dirty, g_dirty = jax.value_and_grad(f)(nan_pad)
        np.testing.assert_allclose(dirty, clean, rtol=1e-6)
        np.testing.assert_allclose(g_dirty, g_clean, rtol=1e-6)
        assert np.all(np.asarray(g_dirty)[mask == 0] == 0)


@pytest.mark.parametrize("ratio", ["sequence", "sequence_token"])
def test_gspo_ratio_cannot_overflow(ratio):
    mask = jnp.ones((N, T))
    adv = jnp.array([1.0, -1.0] * (N // 2))
    for shift in (15.0, 100.0, -100.0):
        logp = jnp.full((N, T), -1.0)
        f = lambda lp: rl.policy_loss(lp, lp - shift, adv, mask, ratio=ratio)
        (loss, m), g = jax.value_and_grad(f, has_aux=True)(logp)
        assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(g)))
        assert all(np.isfinite(float(v)) for v in m.values())
        want = math.exp(min(max(shift, -20.0), 10.0))
        np.testing.assert_allclose(m["ratio_max"], want, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# Gradient identities on the toy softmax policy
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("surrogate", rl.SURROGATES)
def test_gradient_at_ratio_one_is_reinforce(surrogate):
    rng, theta, tokens, mask, logp, _ = toy_problem(4)
    adv = rng.randn(N, T).astype(np.float32)
    grad_logp = np_grad_logp(theta, tokens)
    for mode in MODES:
        f = lambda th: rl.policy_loss(logp_of(th, tokens), logp, adv, mask, surrogate=surrogate,
                                      aggregate=mode)[0]
        g = jax.grad(f)(theta)
        # REINFORCE: ∇ −aggregate(A·logp) = −Σ w_t A_t ∇logp_t.
        want = -(aggregation_weights(mask, mode) * adv)[..., None] * grad_logp
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6, err_msg=mode)


def test_gspo_gradient_formula():
    rng, theta, tokens, mask, logp, old = toy_problem(5)
    adv = rng.randn(N).astype(np.float32)
    f = lambda th: rl.policy_loss(logp_of(th, tokens), old, adv, mask, ratio="sequence",
                                  aggregate="seq-mean-token-mean", clip_low=0.2,
                                  clip_high=0.2)[0]
    g = np.asarray(jax.grad(f)(theta))
    # ∇J = (1/G) Σ_i s_i A_i (1/|o_i|) Σ_t ∇logp_it over the G non-empty rows (unclipped here).
    grad_logp = np_grad_logp(theta, tokens)
    rows = [i for i in range(N) if mask[i].sum()]
    want = np.zeros((N, T, V))
    for i in rows:
        idx = valid_idx(mask, i)
        s = math.exp(sum(float(logp[i, j]) - float(old[i, j]) for j in idx) / len(idx))
        assert 0.8 < s < 1.2
        for j in idx:
            want[i, j] = -s * adv[i] / len(idx) * grad_logp[i, j] / len(rows)
    np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("surrogate", rl.SURROGATES)
def test_gspo_token_with_sequence_advantage_equals_gspo(surrogate):
    # Large perturbation so that some sequences are clipped too.
    rng, theta, tokens, mask, logp, old = toy_problem(6, noise=0.6)
    adv = rng.randn(N).astype(np.float32)
    for mode in MODES:
        def f(th, ratio):
            return rl.policy_loss(logp_of(th, tokens), old, adv, mask, ratio=ratio,
                                  surrogate=surrogate, aggregate=mode)
        (l_seq, m_seq), g_seq = jax.value_and_grad(f, has_aux=True)(theta, "sequence")
        (l_tok, m_tok), g_tok = jax.value_and_grad(f, has_aux=True)(theta, "sequence_token")
        np.testing.assert_allclose(l_tok, l_seq, rtol=1e-6)
        np.testing.assert_allclose(g_tok, g_seq, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(m_tok["ratio_mean"], m_seq["ratio_mean"], rtol=1e-6)
    if surrogate == "clip":
        assert float(m_seq["clipfrac"]) > 0  # the comparison covered clipped sequences


def test_clipped_tokens_have_zero_gradient():
    _, theta, tokens, _, logp, _ = toy_problem(7)
    mask = np.ones((N, T), np.float32)
    adv = np.full((N, T), 0.5, np.float32)
    old = logp.copy()
    cases = {  # token: (ρ, A, clipped?)
        (0, 0): (1.5, 1.0, True),  # A > 0 above 1 + ε
        (1, 1): (0.5, -1.0, True),  # A < 0 below 1 − ε
        (2, 2): (5.0, -1.0, True),  # A < 0 above the dual clip c = 3
        (3, 3): (1.5, -1.0, False),  # A < 0 above 1 + ε: pessimistic side keeps the gradient
        (4, 4): (0.5, 1.0, False),  # A > 0 below 1 − ε: likewise
    }
    for (i, j), (r, a, _) in cases.items():
        old[i, j] = logp[i, j] - math.log(r)
        adv[i, j] = a
    f = lambda th: rl.policy_loss(logp_of(th, tokens), old, adv, mask, dual_clip=3.0)[0]
    g = np.asarray(jax.grad(f)(theta))
    for (i, j), (_, _, clipped) in cases.items():
        assert (np.abs(g[i, j]).max() == 0.0) == clipped, (i, j)
    assert np.abs(g[5, 0]).max() > 0  # an ordinary token at ρ = 1


@pytest.mark.parametrize("ratio, surrogate", [("token", "clip"), ("token", "sapo"),
                                              ("sequence", "clip"), ("sequence", "sapo")])
def test_policy_gradient_matches_finite_differences_of_reference(ratio, surrogate):
    rng, theta, tokens, mask, logp, old = toy_problem(8, noise=0.4)
    adv = rng.randn(N, T).astype(np.float32)
    kwargs = dict(dual_clip=2.0) if surrogate == "clip" else {}
    mode = "seq-mean-token-mean"

    def ref_loss(th):
        per = ref_policy(np_logp(th, tokens), old, adv, mask, ratio=ratio, surrogate=surrogate,
                         **kwargs)[0]
        return ref_aggregate(per, mask, mode)

    f = lambda th: rl.policy_loss(logp_of(th, tokens), old, adv, mask, ratio=ratio,
                                  surrogate=surrogate, aggregate=mode, **kwargs)[0]
    g = np.asarray(jax.grad(f)(theta))
    th64, h = theta.astype(np.float64), 1e-6
    fd = np.zeros_like(th64)
    for idx in np.ndindex(*theta.shape):
        e = np.zeros_like(th64)
        e[idx] = h
        fd[idx] = (ref_loss(th64 + e) - ref_loss(th64 - e)) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-3, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# Minibatch invariance of the (sum, denominator) form
# --------------------------------------------------------------------------------------------------

NB, MB = 6, 2  # rows, rows per minibatch; minibatch 1 (rows 2-3) has no valid token at all


def minibatch_configs(mode):
    """GSPO's sequence ratio (the one that couples the tokens of a row) under every mode; the other
    ratios and surrogates under GRPO's mode (they share the aggregation code path)."""
    cfgs = [dict(ratio="sequence")]
    if mode == "seq-mean-token-mean":
        cfgs += [dict(ratio="token", dual_clip=3.0), dict(ratio="sequence_token"),
                 dict(surrogate="sapo"), dict(surrogate="cispo")]
    return cfgs


def minibatch_problem(seed=9):
    """A model whose parameters θ (K,) are shared by every row, logp = base + feats·θ, so minibatch
    gradients genuinely add up rather than live on disjoint rows."""
    rng = np.random.RandomState(seed)
    lengths = np.array([2, 5, 0, 0, 3, 1])
    return dict(
        theta=rng.randn(3).astype(np.float32),
        feats=(0.3 * rng.randn(NB, T, 3)).astype(np.float32),
        old=rng.uniform(-2.0, -0.5, size=(NB, T)).astype(np.float32),
        adv=rng.randn(NB).astype(np.float32),
        mask=(np.arange(T)[None, :] < lengths[:, None]).astype(np.float32),
        v_feats=rng.randn(NB, T, 3).astype(np.float32),  # a linear critic V = v_feats·θ
        old_v=rng.randn(NB, T).astype(np.float32),
        ret=rng.randn(NB, T).astype(np.float32))


@jax.jit
def minibatch_results(p):
    """For every "mode/config": (loss, grad) of the full batch with the global denominator and
    (loss, grad) of each minibatch (vmapped) with the global denominator; "mode/naive": each
    minibatch's loss normalized by its own denominator. One compilation for the whole table."""
    def split(x):
        return x.reshape((NB // MB, MB) + x.shape[1:])

    out = {}
    for mode in MODES:
        den = rl.aggregate_denominator(p["mask"], mode, norm_length=8)
        cases = {str(k): (lambda cfg: lambda th, feats, old, adv, mask, d: rl.policy_loss(
            old + 0.1 + feats @ th, old, adv, mask, aggregate=mode, norm_length=8,
            denominator=d, **cfg)[0])(cfg) for k, cfg in enumerate(minibatch_configs(mode))}
        cases["value"] = lambda th, feats, old_v, ret, mask, d: rl.value_loss(
            feats @ th, old_v, ret, mask, clip=0.5, aggregate=mode, norm_length=8,
            denominator=d)[0]
        for key, f in cases.items():
            rows = ((p["v_feats"], p["old_v"], p["ret"]) if key == "value" else
                    (p["feats"], p["old"], p["adv"])) + (p["mask"],)
            vg = jax.value_and_grad(f)
            out[f"{mode}/{key}"] = (
                vg(p["theta"], *rows, den),
                jax.vmap(vg, (None, 0, 0, 0, 0, None))(p["theta"], *map(split, rows), den))
            if key == "0":
                out[f"{mode}/naive"] = jax.vmap(f, (None, 0, 0, 0, 0, None))(
                    p["theta"], *map(split, rows), None)
    return out


@pytest.fixture(scope="module")
def minibatch_table():
    p = minibatch_problem()
    return p, jax.device_get(minibatch_results(p))


@pytest.mark.parametrize("mode", MODES)
def test_minibatch_invariance(minibatch_table, mode):
    p, table = minibatch_table
    keys = [str(k) for k in range(len(minibatch_configs(mode)))] + ["value"]
    for key in keys:
        (full, g_full), (parts, g_parts) = table[f"{mode}/{key}"]
        if key == "value":
            what = "value_loss"
            plain = rl.value_loss(p["v_feats"] @ p["theta"], p["old_v"], p["ret"], p["mask"],
                                  clip=0.5, aggregate=mode, norm_length=8)[0]
        else:
            cfg = minibatch_configs(mode)[int(key)]
            what = str(cfg)
            plain = rl.policy_loss(p["old"] + 0.1 + p["feats"] @ p["theta"], p["old"], p["adv"],
                                   p["mask"], aggregate=mode, norm_length=8, **cfg)[0]
        # With the global denominator the full batch is exactly the ordinary aggregate ...
        np.testing.assert_allclose(full, plain, rtol=1e-6, err_msg=what)
        # ... and the minibatches add up to it, values and gradients.
        np.testing.assert_allclose(parts.sum(), full, rtol=1e-5, atol=1e-7, err_msg=what)
        np.testing.assert_allclose(g_parts.sum(0), g_full, rtol=1e-5, atol=1e-7, err_msg=what)
        assert parts[1] == 0.0 and not np.any(g_parts[1])  # the empty minibatch: 0, not NaN
        assert np.all(np.isfinite(g_parts)) and np.all(g_full != 0)
    # Negative control, the peers' bug: averaging per-minibatch normalized losses over the
    # accumulation steps. Only seq-mean-token-sum-norm, whose denominator is a constant per row,
    # survives it.
    (full, _), _ = table[f"{mode}/0"]
    naive = table[f"{mode}/naive"]
    assert np.all(np.isfinite(naive)) and naive[1] == 0.0
    agrees = abs(float(np.mean(naive)) - float(full)) < 1e-6
    assert agrees == (mode == "seq-mean-token-sum-norm")


# --------------------------------------------------------------------------------------------------
# Value loss
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("clip", [None, 0.3])
def test_value_loss_matches_reference(clip):
    rng = np.random.RandomState(11)
    mask = random_mask(rng)
    v, v_old, r = (rng.randn(N, T).astype(np.float32) for _ in range(3))
    per = np.zeros((N, T))
    clipped = np.zeros((N, T))
    for i, j in np.ndindex(N, T):
        e1 = (float(v[i, j]) - float(r[i, j])) ** 2
        if clip is None:
            per[i, j] = e1
            continue
        vc = float(v_old[i, j]) + min(max(float(v[i, j]) - float(v_old[i, j]), -clip), clip)
        e2 = (vc - float(r[i, j])) ** 2
        per[i, j], clipped[i, j] = max(e1, e2), e2 > e1
    rv, vv = r[mask > 0].astype(np.float64), v[mask > 0].astype(np.float64)
    for mode in MODES:
        loss, m = rl.value_loss(v, v_old, r, mask, clip=clip, aggregate=mode)
        np.testing.assert_allclose(loss, 0.5 * ref_aggregate(per, mask, mode), rtol=1e-5)
    np.testing.assert_allclose(m["clipfrac"], masked_mean(clipped, mask), atol=1e-7)
    np.testing.assert_allclose(m["explained_var"], 1 - np.var(rv - vv) / np.var(rv), rtol=1e-5)
    np.testing.assert_allclose(m["mean"], vv.mean(), rtol=1e-5)


def test_value_loss_degenerate_cases():
    ones = jnp.ones((N, T))
    _, m = rl.value_loss(ones, ones, ones, ones)  # Var(R) = 0: explained variance is 0, not NaN
    assert float(m["explained_var"]) == 0.0
    loss, m = rl.value_loss(ones, ones, ones * 5, jnp.zeros((N, T)), clip=0.2)
    assert float(loss) == 0.0 and all(float(x) == 0.0 for x in m.values())
    r = jnp.arange(N * T, dtype=jnp.float32).reshape(N, T)
    _, m = rl.value_loss(r, r, r, ones)  # perfect critic
    assert float(m["explained_var"]) == 1.0


# --------------------------------------------------------------------------------------------------
# jit / grad without retracing; bad input
# --------------------------------------------------------------------------------------------------

def test_losses_jit_and_grad_without_retracing():
    rng = np.random.RandomState(13)
    mask = random_mask(rng)
    fns = [
        lambda a, b, c: rl.kl_penalty(a, b, "k3"),
        lambda a, b, c: rl.aggregate(a, mask, "seq-mean-token-mean"),
        lambda a, b, c: rl.aggregate_parts(a, mask, "seq-mean-token-sum-norm"),
        lambda a, b, c: rl.policy_loss(a, b, c, mask, ratio="sequence", dual_clip=3.0),
        jax.grad(lambda a, b, c: rl.policy_loss(a, b, c, mask, surrogate="sapo",
                                                denominator=jnp.float32(7.0))[0]),
        jax.grad(lambda a, b, c: rl.value_loss(a, b, c, mask, clip=0.2)[0]),
    ]
    for f in fns:
        jf, count = count_traces(f)
        for _ in range(3):
            args = [rng.randn(N, T).astype(np.float32) for _ in range(3)]
            jax.block_until_ready(jf(*args))
        assert count[0] == 1
    # Traced hyper-parameters (e.g. scheduled clip ranges) do not retrace either.
    jf, count = count_traces(lambda a, lo, hi: rl.policy_loss(a, a * 0.9, a, mask, clip_low=lo,
                                                              clip_high=hi)[0])
    for lo in (0.1, 0.2):
        jf(jnp.ones((N, T)), jnp.float32(lo), jnp.float32(0.3))
    assert count[0] == 1


X = jnp.zeros((2, 3))
PL = functools.partial(rl.policy_loss, X, X, jnp.zeros(2), X)


@pytest.mark.parametrize("call, match", [
    (lambda: rl.kl_penalty(X, X, "k4"), "kind"),
    (lambda: rl.kl_penalty(X, jnp.zeros((3, 2)), "k1"), "ref_logp"),
    (lambda: rl.aggregate(X, X, "mean"), "mode"),
    (lambda: rl.aggregate(jnp.zeros((2, 4)), X, "token-mean"), "x"),
    (lambda: rl.aggregate(X, jnp.zeros(3), "token-mean"), "mask"),
    (lambda: rl.aggregate_denominator(X, "seq-mean-token-sum-norm", norm_length=0), "norm_length"),
    (lambda: PL(ratio="seq"), "ratio"),
    (lambda: PL(surrogate="ppo"), "surrogate"),
    (lambda: PL(aggregate="sum"), "aggregate"),
    (lambda: PL(clip_low=-0.1), "clip_low"),
    (lambda: PL(clip_low=1.0), "clip_low"),
    (lambda: PL(clip_high=-0.1), "clip_high"),
    (lambda: PL(dual_clip=1.0), "dual_clip"),
    (lambda: PL(dual_clip=0.5), "dual_clip"),
    (lambda: PL(surrogate="sapo", dual_clip=3.0), "dual_clip"),
    (lambda: PL(sapo_tau_neg=0.0), "sapo_tau_neg"),
    (lambda: PL(cispo_max=-1.0), "cispo_max"),
    (lambda: PL(denominator=jnp.ones(2)), "denominator"),
    (lambda: rl.policy_loss(X, jnp.zeros((2, 4)), jnp.zeros(2), X), "old_logp"),
    (lambda: rl.policy_loss(X, X, jnp.zeros(3), X), "advantages"),
    (lambda: rl.policy_loss(X, X, jnp.zeros((2, 3)), jnp.zeros((3, 3))), "mask"),
    (lambda: rl.policy_loss(jnp.zeros(3), jnp.zeros(3), jnp.zeros(3), jnp.zeros(3)), "logp"),
    (lambda: rl.value_loss(X, X, X, X, clip=0.0), "clip"),
    (lambda: rl.value_loss(X, X, jnp.zeros((2, 4)), X), "returns"),
    (lambda: rl.value_loss(X, jnp.zeros(2), X, X), "old_values"),
    (lambda: rl.value_loss(X, X, X, X, aggregate="token-sum"), "aggregate"),
])
def test_losses_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_losses_bad_input_raises_at_trace_time_under_jit():
    with pytest.raises(ValueError, match="clip_low"):
        jax.jit(lambda lp: rl.policy_loss(lp, lp, lp[:, 0], lp, clip_low=1.5))(X)
    with pytest.raises(ValueError, match="advantages"):
        jax.jit(lambda lp, a: rl.policy_loss(lp, lp, a, lp))(X, jnp.zeros(5))
