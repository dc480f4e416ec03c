"""On-policy distillation: a frozen teacher's log-probs as a dense signal on the student's own samples.

Two kinds, in `DISTILL_KINDS` (the values `distill.kind` takes; docs/algorithms/distillation.md):

  opd  the per-token advantage −(log π_student − log π_teacher) at the sampled tokens (a one-sample
       estimate of the reverse KL, as a reward), optionally discounted: A_t = Σ_{s≥t} γ^{s−t} r_s. It goes
       through the usual clipped surrogate and rollout correction, added to the estimator's advantage
       times `distill.coef`. Needs the teacher's log-probs at the sampled tokens only (the score pass).
  gkd  the generalized Jensen–Shannon divergence between the two next-token distributions over the whole
       vocabulary at every loss token, added to the loss times `distill.coef`. β = 0 is the forward
       KL(teacher‖student), β = 1 the reverse KL(student‖teacher), in between
       β·KL(T‖M) + (1−β)·KL(S‖M) with M = (1−β)·S + β·T (TRL's `generalized_jsd_loss` convention).
       Computed from the two models' hidden states and output projections in vocabulary chunks, so the
       largest array is (n, T, chunk): memory O(T·chunk), never O(T·V). Models of one tokenizer but
       differently padded output sizes compare their first `vocab` logits (trainer/teacher.py).

Shapes: n rows, T tokens, D/Dt hidden sizes, V vocabulary.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

DISTILL_KINDS = {"opd": "reverse KL of the sampled tokens as a per-token advantage",
                 "gkd": "generalized JSD over the full vocabulary, in the loss"}

_PAD_LOGIT = -1e9  # padded vocabulary columns: finite (no inf − inf), with probability exactly 0


def opd_rewards(student_logp, teacher_logp, mask):
    """(n,T) r_t = log π_teacher − log π_student on the mask's tokens, 0 elsewhere (float32)."""
    r = teacher_logp.astype(jnp.float32) - student_logp.astype(jnp.float32)
    return jnp.where(mask > 0, r, 0.0)


def opd_advantages(student_logp, teacher_logp, mask, gamma: float = 0.0):
    """(n,T) A_t = Σ_{s≥t} γ^{s−t} r_s over the mask's tokens (γ = 0: A_t = r_t, the per-token reverse KL
    reward); masked tokens pass the return through and get 0 (a multi-turn observation is context)."""
    r = opd_rewards(student_logp, teacher_logp, mask)
    if gamma == 0.0:
        return r

    def step(carry, x):
        rt, mt = x
        ret = jnp.where(mt > 0, rt + gamma * carry, carry)
        return ret, ret

    _, out = lax.scan(step, jnp.zeros(r.shape[0], jnp.float32), (r.T[::-1], mask.T[::-1]))
    return jnp.where(mask > 0, out[::-1].T, 0.0)


def _chunked_head(w, chunk: int, v: int):
    """(D,V) -> its first v ≤ V columns as (k, D, c) in k chunks of c ≤ chunk, zero-padded, and (k, c)
    validity. The slice fuses into the pad/transpose copy the chunking makes anyway: no extra copy."""
    w, d = w[:, :v], w.shape[0]
    k = -(-v // max(1, min(chunk, v)))
    c = -(-v // k)
    wp = jnp.pad(w, ((0, 0), (0, k * c - v)))
    valid = (jnp.arange(k * c) < v).reshape(k, c)
    return wp.reshape(d, k, c).transpose(1, 0, 2), valid


def _logits(h, w, valid, temperature, dtype):
    """(n,T,c) float32 logits/temperature of one vocabulary chunk, padding at _PAD_LOGIT."""
    prec = lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None
    z = jnp.einsum("ntd,dc->ntc", h.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32,
                   precision=prec) / temperature
    return jnp.where(valid, z, _PAD_LOGIT)


def _jsd_terms(ls, lt, beta: float):
    """Elementwise generalized-JSD terms from log-probs ls (student), lt (teacher); sum over V = the
    divergence. β = 0 and 1 are the two KLs (the mixture formula degenerates there)."""
    if beta == 0.0:
        return jnp.exp(lt) * (lt - ls)
    if beta == 1.0:
        return jnp.exp(ls) * (ls - lt)
    lm = jnp.logaddexp(ls + math.log(1.0 - beta), lt + math.log(beta))
    return beta * jnp.exp(lt) * (lt - lm) + (1.0 - beta) * jnp.exp(ls) * (ls - lm)


def generalized_jsd(h_student, w_student, h_teacher, w_teacher, *, beta: float, temperature: float = 1.0,
                    chunk: int = 4096, dtype=jnp.float32, teacher_dtype=None, vocab: int | None = None):
    """(n,T) float32 generalized JSD per position between softmax(h_s·W_s/τ) and softmax(h_t·W_t/τ).

    h_student (n,T,D), w_student (D,Vs); h_teacher (n,T,Dt), w_teacher (Dt,Vt). vocab None: Vs = Vt = V,
    the whole distributions. vocab ≤ Vs, Vt: both distributions restricted to the first `vocab` ids and
    renormalised there (log_softmax of the sliced logits / τ): the shared vocabulary of two models of one
    tokenizer whose output sizes are padded differently; the logits past it are ignored. Two scans over
    vocabulary chunks, each body rematerialised in the backward pass: first each model's log-partition
    (online log-sum-exp), then the sum of the divergence's terms. Gradients flow to the student's inputs;
    the teacher's are stopped. Masking and aggregation are the caller's.
    """
    vs, vt = w_student.shape[1], w_teacher.shape[1]
    if (vs != vt) if vocab is None else not 1 <= vocab <= min(vs, vt):
        raise ValueError(f"generalized_jsd: {vs} and {vt} logits, vocab={vocab} (expected equal sizes, or a "
                         f"vocab of at most both)")
    vocab = vs if vocab is None else vocab
    h_teacher, w_teacher = lax.stop_gradient(h_teacher), lax.stop_gradient(w_teacher)
    tdt = dtype if teacher_dtype is None else teacher_dtype
    ws, valid = _chunked_head(w_student, chunk, vocab)
    wt, _ = _chunked_head(w_teacher, chunk, vocab)
    temperature = jnp.asarray(temperature, jnp.float32)
    init = jnp.full(h_student.shape[:2], -jnp.inf, jnp.float32)

    @jax.checkpoint
    def logz_body(carry, xs):
        zs, zt = carry
        w1, w2, ok = xs
        zs = jnp.logaddexp(zs, jax.nn.logsumexp(_logits(h_student, w1, ok, temperature, dtype), axis=-1))
        zt = jnp.logaddexp(zt, jax.nn.logsumexp(_logits(h_teacher, w2, ok, temperature, tdt), axis=-1))
        return (zs, zt), None

    (zs, zt), _ = lax.scan(logz_body, (init, init), (ws, wt, valid))
    zt = lax.stop_gradient(zt)

    @jax.checkpoint
    def sum_body(acc, xs):
        w1, w2, ok = xs
        ls = _logits(h_student, w1, ok, temperature, dtype) - zs[..., None]
        lt = _logits(h_teacher, w2, ok, temperature, tdt) - zt[..., None]
        return acc + jnp.sum(jnp.where(ok, _jsd_terms(ls, lt, beta), 0.0), axis=-1), None

    out, _ = lax.scan(sum_body, jnp.zeros(h_student.shape[:2], jnp.float32), (ws, wt, valid))
    return out


def distill_stats(student_logp, teacher_logp, mask):
    """{'distill/reverse_kl': token-mean of log π_s − log π_t (a one-sample reverse-KL estimate),
    'distill/teacher_logp_mean': token-mean of the teacher's log-prob} over the mask's tokens."""
    m = (mask > 0).astype(jnp.float32)
    n = jnp.maximum(jnp.sum(m), 1.0)
    return {"distill/reverse_kl": -jnp.sum(opd_rewards(student_logp, teacher_logp, mask)) / n,
            "distill/teacher_logp_mean": jnp.sum(jnp.where(m > 0, teacher_logp, 0.0)) / n}
