"""On-policy distillation math (rl/distill.py, Objective's opd/gkd terms): against float64 loops over
tokens and the vocabulary, TRL's GKD loss, and the reverse KL's analytic gradient on a small categorical
policy."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import rl
from jaxrl_llm.rl.distill import distill_stats, generalized_jsd, opd_advantages


def _log_softmax64(z):
    z = np.asarray(z, np.float64)
    m = z.max()
    return z - (m + math.log(sum(math.exp(x - m) for x in z)))


def jsd_loop(s_logits, t_logits, beta, temperature):
    """(n,T) float64 generalized JSD, one position and one vocabulary entry at a time."""
    n, T, V = s_logits.shape
    out = np.zeros((n, T))
    for i in range(n):
        for t in range(T):
            ls = _log_softmax64(s_logits[i, t] / temperature)
            lt = _log_softmax64(t_logits[i, t] / temperature)
            total = 0.0
            for v in range(V):
                ps, pt = math.exp(ls[v]), math.exp(lt[v])
                if beta == 0:
                    total += pt * (lt[v] - ls[v])
                elif beta == 1:
                    total += ps * (ls[v] - lt[v])
                else:
                    lm = math.log((1 - beta) * ps + beta * pt)
                    total += beta * pt * (lt[v] - lm) + (1 - beta) * ps * (ls[v] - lm)
            out[i, t] = total
    return out


def _jsd_from_logits(s, t, beta, temperature, chunk):
    """Our chunked divergence on given logits: hidden = logits, output projection = identity."""
    eye = jnp.eye(s.shape[-1], dtype=jnp.float32)
    return generalized_jsd(jnp.asarray(s), eye, jnp.asarray(t), eye, beta=beta, temperature=temperature, chunk=chunk)


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("chunk", [8, 64])  # 37 = 4 chunks of 10 (3 padded columns), and one chunk
def test_generalized_jsd_matches_float64_loop(beta, chunk):
    rng = np.random.default_rng(0)
    s = rng.normal(size=(2, 3, 37)).astype(np.float32) * 2
    t = rng.normal(size=(2, 3, 37)).astype(np.float32) * 2
    got = np.asarray(_jsd_from_logits(s, t, beta, 0.7, chunk))
    np.testing.assert_allclose(got, jsd_loop(s, t, beta, 0.7), rtol=2e-5, atol=2e-6)
    assert np.all(got >= -1e-6)


def test_generalized_jsd_with_projections_and_identical_models():
    """Hidden states times (D,V) heads (not the identity): equal to the loop on the logits they give;
    the same model on both sides: 0 for every β."""
    rng = np.random.default_rng(1)
    hs, ws = rng.normal(size=(2, 4, 6)).astype(np.float32), rng.normal(size=(6, 23)).astype(np.float32)
    ht, wt = rng.normal(size=(2, 4, 9)).astype(np.float32), rng.normal(size=(9, 23)).astype(np.float32)
    got = generalized_jsd(jnp.asarray(hs), jnp.asarray(ws), jnp.asarray(ht), jnp.asarray(wt), beta=0.5, chunk=5)
    want = jsd_loop(hs.astype(np.float64) @ ws, ht.astype(np.float64) @ wt, 0.5, 1.0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
    for beta in (0.0, 0.5, 1.0):
        same = generalized_jsd(jnp.asarray(hs), jnp.asarray(ws), jnp.asarray(hs), jnp.asarray(ws), beta=beta, chunk=5)
        np.testing.assert_allclose(np.asarray(same), 0.0, atol=1e-6)


def test_generalized_jsd_gradient_matches_unchunked():
    """The chunked, rematerialised scans differentiate like the dense formula; the teacher gets none."""
    rng = np.random.default_rng(2)
    s = jnp.asarray(rng.normal(size=(2, 3, 19)).astype(np.float32))
    t = jnp.asarray(rng.normal(size=(2, 3, 19)).astype(np.float32))

    def dense(s, t, beta):
        ls, lt = jax.nn.log_softmax(s, -1), jax.nn.log_softmax(t, -1)
        lm = jnp.logaddexp(ls + jnp.log1p(-beta), lt + jnp.log(beta))
        return jnp.sum(beta * jnp.exp(lt) * (lt - lm) + (1 - beta) * jnp.exp(ls) * (ls - lm))

    g_s, g_t = jax.grad(lambda a, b: jnp.sum(_jsd_from_logits(a, b, 0.4, 1.0, 4)), argnums=(0, 1))(s, t)
    np.testing.assert_allclose(np.asarray(g_s), np.asarray(jax.grad(dense)(s, t, 0.4)), rtol=1e-4, atol=1e-6)
    assert not np.any(np.asarray(g_t))


def test_reverse_kl_gradient_is_the_analytic_expectation():
    """On a categorical policy π = softmax(θ) and a teacher q: (a) gkd with β = 1 differentiates to
    ∇KL(π‖q) = π ⊙ (r − E_π r), r = log π − log q; (b) opd's advantage −r(y) through the clipped surrogate
    at ratio 1, every token y weighted by π(y) (the exact expectation over samples), gives the same."""
    rng = np.random.default_rng(3)
    V = 7
    theta = jnp.asarray(rng.normal(size=V).astype(np.float32))
    logq = jax.nn.log_softmax(jnp.asarray(rng.normal(size=V).astype(np.float32)))
    p64 = np.exp(_log_softmax64(np.asarray(theta)))
    r64 = np.log(p64) - np.asarray(logq, np.float64)
    analytic = p64 * (r64 - np.sum(p64 * r64))

    eye = jnp.eye(V, dtype=jnp.float32)
    g_gkd = jax.grad(lambda th: generalized_jsd(th[None, None], eye, logq[None, None], eye, beta=1.0, chunk=3)[0, 0])(theta)
    np.testing.assert_allclose(np.asarray(g_gkd), analytic, rtol=1e-4, atol=1e-6)

    tokens, mask = jnp.arange(V)[:, None], jnp.ones((V, 1), jnp.float32)

    def surrogate(th):  # V rows, row y samples token y; weights π(y)·V undo the token-mean's 1/V
        logp = jax.nn.log_softmax(th)[tokens]
        old = jax.lax.stop_gradient(logp)
        adv = opd_advantages(old, logq[tokens], mask)
        w = jax.lax.stop_gradient(jnp.exp(old)) * V
        return rl.policy_loss(logp, old, adv, mask, aggregate="token-mean", weights=w)[0]

    np.testing.assert_allclose(np.asarray(jax.grad(surrogate)(theta)), analytic, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("gamma", [0.0, 0.7])
def test_opd_advantages_match_loop(gamma):
    """Per-token rewards log q − log π on the mask's tokens; discounted returns skip masked tokens (a
    multi-turn observation is context: no reward, no advantage, the return passes through it)."""
    rng = np.random.default_rng(4)
    s, t = rng.normal(size=(3, 6)).astype(np.float32), rng.normal(size=(3, 6)).astype(np.float32)
    mask = np.array([[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]], np.float32)
    got = np.asarray(opd_advantages(jnp.asarray(s), jnp.asarray(t), jnp.asarray(mask), gamma))
    want = np.zeros((3, 6))
    for i in range(3):
        ret = 0.0
        for k in reversed(range(6)):
            if mask[i, k]:
                ret = (float(t[i, k]) - float(s[i, k])) + gamma * ret
                want[i, k] = ret
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    stats = distill_stats(jnp.asarray(s), jnp.asarray(t), jnp.asarray(mask))
    m = mask > 0
    np.testing.assert_allclose(float(stats["distill/reverse_kl"]), np.mean(s[m] - t[m]), rtol=1e-5)
    np.testing.assert_allclose(float(stats["distill/teacher_logp_mean"]), np.mean(t[m]), rtol=1e-5)


def _batch(rng, N=4, T=5):
    mask = np.ones((N, T), np.float32)
    mask[1, 3:] = 0
    old = -rng.uniform(0.1, 3, size=(N, T)).astype(np.float32)
    return {"scores": jnp.asarray([1.0, 0.0, 0.5, 0.0]), "mask": jnp.asarray(mask), "loss_mask": jnp.asarray(mask),
            "behavior_logp": jnp.asarray(old), "old_logp": jnp.asarray(old),
            "teacher_logp": jnp.asarray(-rng.uniform(0.1, 3, size=(N, T)).astype(np.float32))}


def test_objective_opd_alone_and_mixed_with_group_advantages():
    """estimator 'none' + opd: coef·(log q − log π); mixed with GRPO: its row advantage plus that."""
    b = _batch(np.random.default_rng(5))
    d = np.asarray(jnp.where(b["mask"] > 0, b["teacher_logp"] - b["old_logp"], 0.0))
    alone, _ = rl.Objective(group_size=2, estimator="none", distill="opd", distill_coef=0.5).prepare(b, 0.0)
    np.testing.assert_allclose(np.asarray(alone["adv"]), 0.5 * d, rtol=1e-6)
    mixed, stats = rl.Objective(group_size=2, estimator="group", distill="opd", distill_coef=2.0).prepare(b, 0.0)
    grpo = np.asarray(rl.group_advantages(b["scores"], 2))
    np.testing.assert_allclose(np.asarray(mixed["adv"]), grpo[:, None] + 2.0 * d, rtol=1e-5, atol=1e-6)
    assert {"distill/reverse_kl", "distill/teacher_logp_mean"} <= set(stats)


def test_objective_gkd_adds_the_weighted_divergence():
    b = _batch(np.random.default_rng(6))
    o = rl.Objective(group_size=2, estimator="none", distill="gkd", distill_coef=3.0, aggregate="token-mean")
    fields, _ = o.prepare(b, 0.0)
    mb, den = {**b, **fields}, o.denominators({**b, **fields})
    div = jnp.asarray(np.random.default_rng(7).uniform(0, 1, size=(4, 5)).astype(np.float32))
    base, _ = o.policy_loss(b["old_logp"], jnp.zeros((4, 5)), mb, 0.0, den)
    with_div, metrics = o.policy_loss(b["old_logp"], jnp.zeros((4, 5)), mb, 0.0, den, divergence=div)
    m = np.asarray(b["loss_mask"]) > 0
    np.testing.assert_allclose(float(with_div - base), 3.0 * np.asarray(div)[m].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["distill/jsd"]), np.asarray(div)[m].mean(), rtol=1e-5)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_gkd_loss_equals_trl_generalized_jsd_loss(beta):
    """TRL's GKDTrainer.generalized_jsd_loss (batchmean over the labelled tokens) on a fixed batch equals
    our divergence's token-mean over the same tokens, at a temperature != 1."""
    torch = pytest.importorskip("torch")
    gkd = pytest.importorskip("trl.experimental.gkd")
    rng = np.random.default_rng(8)
    s = rng.normal(size=(2, 6, 41)).astype(np.float32) * 3
    t = rng.normal(size=(2, 6, 41)).astype(np.float32) * 3
    labels = rng.integers(0, 41, size=(2, 6))
    labels[0, 4:] = -100
    labels[1, :2] = -100
    want = gkd.GKDTrainer.generalized_jsd_loss(torch.tensor(s), torch.tensor(t), labels=torch.tensor(labels),
                                               beta=beta, temperature=0.9).item()
    ours = np.asarray(_jsd_from_logits(s, t, beta, 0.9, 16))
    got = ours[labels != -100].mean()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_generalized_jsd_over_the_shared_vocabulary_of_two_output_sizes():
    """One tokenizer of 60 ids, a student with 64 logits and a teacher with 80 (padded differently), the
    teacher's 16 extra logits made large so that any of their mass left in would show: with vocab = 64
    or 60 the divergence is the float64 loop's and TRL's generalized_jsd_loss on the first `vocab`
    logits, each side renormalised there; a vocab past either size, or none with unequal sizes, refused."""
    torch = pytest.importorskip("torch")
    gkd = pytest.importorskip("trl.experimental.gkd")
    rng = np.random.default_rng(9)
    s = rng.normal(size=(2, 3, 64)).astype(np.float32) * 2
    t = rng.normal(size=(2, 3, 80)).astype(np.float32) * 2
    t[..., 64:] += 6.0
    eye = lambda v: jnp.eye(v, dtype=jnp.float32)
    for vocab, beta in [(64, 0.5), (60, 0.0), (60, 1.0)]:
        got = np.asarray(generalized_jsd(jnp.asarray(s), eye(64), jnp.asarray(t), eye(80), beta=beta,
                                         temperature=0.7, chunk=16, vocab=vocab))
        np.testing.assert_allclose(got, jsd_loop(s[..., :vocab], t[..., :vocab], beta, 0.7), rtol=2e-5, atol=2e-6)
        want = gkd.GKDTrainer.generalized_jsd_loss(torch.tensor(s[..., :vocab]), torch.tensor(t[..., :vocab]),
                                                   labels=torch.zeros((2, 3), dtype=torch.long), beta=beta,
                                                   temperature=0.7).item()  # the mean over the 6 labelled tokens
        np.testing.assert_allclose(got.mean(), want, rtol=1e-5, atol=1e-6)
    for vocab in (None, 65, 0):
        with pytest.raises(ValueError, match=f"generalized_jsd: 64 and 80 logits, vocab={vocab}"):
            generalized_jsd(jnp.asarray(s), eye(64), jnp.asarray(t), eye(80), beta=0.5, vocab=vocab)
