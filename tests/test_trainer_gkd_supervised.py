"""GKD's supervised rows (distill.lmbda < 1, data.completion_column; trainer/supervised.py): which prompts,
their rows, the loss on them against TRL's generalized_jsd_loss on transformers' logits, and the refusals."""
import copy
import time

import jax
import numpy as np
import pytest

from jaxrl_llm import config as config_lib
from jaxrl_llm.data import load_tokenizer
from jaxrl_llm.trainer import Trainer
from jaxrl_llm.trainer.supervised import encode_completions, mix_rows, on_policy_count, supervised_prompts
from test_trainer import small_config
from test_trainer_distill import save_teacher


def test_the_supervised_prompts_are_the_fraction_and_follow_the_key():
    for lmbda, B in [(0.0, 4), (0.5, 4), (0.3, 10), (0.25, 8), (1.0, 6)]:
        sup = supervised_prompts(jax.random.PRNGKey(3), lmbda, B)
        assert sup.sum() == B - on_policy_count(lmbda, B) == B - int(np.floor(lmbda * B + 0.5))
        np.testing.assert_array_equal(sup, supervised_prompts(jax.random.PRNGKey(3), lmbda, B))  # deterministic
    draws = {tuple(supervised_prompts(jax.random.PRNGKey(k), 0.5, 8)) for k in range(8)}
    assert len(draws) > 2  # the key chooses which prompts


def test_encoded_completions_and_mixed_rows_by_hand():
    tok = load_tokenizer("")
    eos, pad = tok.eos_token_id, tok.pad_token_id
    ids = tok.encode("12", add_special_tokens=False)
    r = encode_completions(tok, ["12", "1234567"], len(ids) + 2, eos, pad)
    np.testing.assert_array_equal(r["tokens"][0], ids + [eos, pad])
    np.testing.assert_array_equal(r["mask"][0], [1] * (len(ids) + 1) + [0])
    assert list(r["lengths"]) == [len(ids) + 1, len(ids) + 2] and list(r["truncated"]) == [False, True]
    with pytest.raises(ValueError, match="data.completion_column holds a list"):
        encode_completions(tok, [["a"]], 4, eos, pad)
    # 2 prompts x G=2: prompt 1 supervised; its two rows take its completion, log-probs 0, the others stay.
    T = r["tokens"].shape[1]
    local = {"tokens": np.full((4, T), 9, np.int32), "mask": np.ones((4, T), np.int32),
             "lengths": np.full(4, T, np.int32), "truncated": np.ones(4, bool),
             "sampler_logp": -np.ones((4, T), np.float32), "behavior_logp": -np.ones((4, T), np.float32)}
    out = mix_rows(local, np.array([False, True]), {k: v[::-1] for k, v in r.items()}, 2)
    np.testing.assert_array_equal(out["tokens"][2:], np.stack([r["tokens"][0]] * 2))
    np.testing.assert_array_equal(out["tokens"][:2], local["tokens"][:2])
    assert list(out["supervised"]) == [0, 0, 1, 1] and out["sampler_logp"][2:].sum() == 0
    assert out["sampler_logp"][:2].sum() == -2 * T and list(out["truncated"]) == [True, True, False, False]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A gkd trainer (built, not run) with half of each batch supervised from the answer column, a
    teacher of other weights, and a correction that would mask every row whose sampler log-probs are 0."""
    root = tmp_path_factory.mktemp("gkd_sup")
    c = small_config()
    teacher = save_teacher(root / "teacher", c, seed=7)
    c = small_config("gkd", total_steps=1, **{
        "teacher.path": teacher, "distill.lmbda": 0.5, "data.completion_column": "answer",
        "rollout.max_new_tokens": 4, "correction.mode": "token_mask"})
    return Trainer(c, str(root / "work")), root


def test_lmbda_half_keeps_the_samples_of_lmbda_one_on_its_on_policy_prompts(mixed):
    """Same rollout key and prompts: the on-policy rows are exactly what λ = 1 (today's path) samples,
    the supervised rows the answer column's completions."""
    t, _ = mixed
    params, key, start = t.policy(t.state), jax.random.PRNGKey(11), t.data.state()
    half, scored = t.rollouts.sample_round(params, key)
    t.data.restore(start)
    rollouts_one = copy.copy(t.rollouts)
    rollouts_one.c = copy.deepcopy(t.c)
    rollouts_one.c.distill.lmbda = 1.0
    one, _ = rollouts_one.sample_round(params, key)
    assert "supervised" not in one
    G, sup = t.c.rollout.group_size, half["supervised"] > 0
    assert sup.sum() == G * 2  # 2 of the 4 prompts
    np.testing.assert_array_equal(sup, np.repeat(supervised_prompts(key, 0.5, 4), G))
    for k in ("tokens", "mask", "sampler_logp", "lengths"):
        np.testing.assert_array_equal(half[k][~sup], one[k][~sup])
    want = encode_completions(t.tokenizer, [a for a in scored["references"]], 4, t.eos_ids[0], t.pad_id)
    np.testing.assert_array_equal(half["tokens"][sup], want["tokens"][sup])
    assert np.all(half["sampler_logp"][sup] == 0)


def test_lmbda_zero_trains_trl_generalized_jsd_on_the_dataset_completions(mixed):
    """λ = 0: every row is its prompt's answer; one step's `distill/jsd` (the token mean of the
    divergence on the loss tokens, before the update) equals TRL's GKDTrainer.generalized_jsd_loss (β 0.5)
    on the transformers models of the student's initial weights and the teacher, on those rows, although
    token_mask would mask every row if the supervised rows were corrected."""
    torch = pytest.importorskip("torch")
    gkd = pytest.importorskip("trl.experimental.gkd")
    import transformers
    t, root = mixed
    c = t.rollouts.c = copy.deepcopy(t.c)  # the same trainer (compiled steps), its rollouts at λ = 0
    c.distill.lmbda = 0.0
    batch = t.producer.next(t.state, t.policy(t.state))
    local = batch.local
    assert np.all(local["supervised"] == 1)
    t.state, m, _ = t.update_step(t.state, batch, time.perf_counter())  # the state is donated
    assert m["policy/loss"] == 0.0 and np.isfinite(m["policy/grad_norm"]) and m["policy/grad_norm"] > 0
    student = save_teacher(root / "student", t.c)  # the student's initial weights
    hs, ht = (transformers.AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32) for p in (student, c.teacher.path))
    s_rows, t_rows, labels, G = [], [], [], c.rollout.group_size
    for n in range(len(local["tokens"])):
        p = local["prompt_tokens"][n // G][local["prompt_mask"][n // G] > 0]
        comp = local["tokens"][n][local["mask"][n] > 0]
        ids = torch.tensor(np.concatenate([p, comp])[None].astype(np.int64))
        with torch.no_grad():
            s_rows.append(hs(ids).logits[0, len(p) - 1:len(p) - 1 + len(comp)])
            t_rows.append(ht(ids).logits[0, len(p) - 1:len(p) - 1 + len(comp)])
        labels.append(torch.tensor(comp.astype(np.int64)))
    want = gkd.GKDTrainer.generalized_jsd_loss(torch.cat(s_rows)[None], torch.cat(t_rows)[None],
                                               labels=torch.cat(labels)[None], beta=c.distill.beta,
                                               temperature=c.rollout.temperature).item()
    np.testing.assert_allclose(m["distill/jsd"], want, rtol=2e-4, atol=1e-6)


@pytest.mark.parametrize("fields, message", [
    ({"distill.lmbda": 0.5}, "config.data.completion_column must be the column of the supervised completions"),
    ({"distill.lmbda": 1.5, "data.completion_column": "answer"}, r"config.distill.lmbda must be in \[0, 1\]"),
    ({"distill.seq_kd": True}, "config.distill.seq_kd must be False"),
    ({"algo": "opd", "distill.lmbda": 0.5, "data.completion_column": "answer"},
     "config.distill.lmbda must be 1 unless distill.kind='gkd'"),
    ({"distill.lmbda": 0.5, "data.completion_column": "answer", "dapo.dynamic_sampling": True},
     "config.distill.lmbda must be 1 with env.name or dapo.dynamic_sampling"),
])
def test_supervised_config_errors(fields, message):
    c = small_config(fields.pop("algo", "gkd"), **{"teacher.path": "t"})
    with pytest.raises(ValueError, match=message):
        config_lib.prepare(config_lib.from_dict(fields, c))


def _mixed_batch(rng, supervised, G=2, T=5):
    """A scored batch of len(supervised) prompts x G rows, right-padded completions; the rows of the
    supervised prompts carry `supervised` 1 and sampler log-probs 0 (trainer/supervised.py)."""
    n = len(supervised) * G
    lengths = rng.integers(2, T + 1, n)
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    sup = np.repeat(np.asarray(supervised, np.float32), G)
    logp = np.where(mask > 0, -rng.uniform(0.1, 3.0, (n, T)), 0.0).astype(np.float32)
    return {"scores": rng.uniform(0, 1, n).astype(np.float32), "mask": mask, "loss_mask": mask.copy(),
            "behavior_logp": logp * (1 - sup[:, None]), "old_logp": logp,
            "sampler_logp": logp * (1 - sup[:, None]),
            "ref_logp": np.where(mask > 0, -rng.uniform(0.1, 3.0, (n, T)), 0.0).astype(np.float32),
            "teacher_logp": np.where(mask > 0, -rng.uniform(0.1, 3.0, (n, T)), 0.0).astype(np.float32),
            "old_values": rng.normal(size=(n, T)).astype(np.float32) * mask, "supervised": sup}


def _rows(b, rows):
    return {k: v[rows] for k, v in b.items() if k != "supervised"}


@pytest.mark.parametrize("algo", ["ppo", "grpo_batch_std", "reinforce_pp"])
def test_supervised_rows_stay_out_of_every_statistic_of_the_on_policy_rows(algo):
    """Against the same objective on the on-policy rows alone (no supervised row in the batch): the
    advantages, returns, KL statistics, policy and value losses, their gradients and metrics of the
    on-policy rows are the same, whatever the supervised rows' scores, values and log-probs; the divergence
    alone trains the supervised rows, averaged over every loss token."""
    from jaxrl_llm.rl import Objective
    G = 2
    common = dict(group_size=G, distill="gkd", entropy_coef=0.01)
    objective = {"ppo": Objective(estimator="gae", whiten=True, aggregate="token-mean", kl_coef=0.05,
                                  kl_estimator="k1", kl_placement="reward", value=True, **common),
                 "grpo_batch_std": Objective(scale="batch", kl_coef=0.04, **common),
                 "reinforce_pp": Objective(estimator="reinforce_pp", aggregate="token-mean", kl_coef=0.01,
                                           kl_estimator="k1", kl_placement="reward", **common)}[algo]
    rng = np.random.default_rng(0)
    supervised = [False, True, False, True, True]
    b = _mixed_batch(rng, supervised, G)
    on = np.repeat(~np.asarray(supervised), G)
    other = dict(b)  # the supervised rows' scores, values and log-probs changed
    for k in ("scores", "old_values", "ref_logp", "old_logp", "teacher_logp"):
        other[k] = np.where(on.reshape((-1,) + (1,) * (b[k].ndim - 1)), b[k], b[k] * 3.0 + 1.0).astype(np.float32)
    alone = _rows(b, on)
    n, T = b["mask"].shape
    logp = (b["old_logp"] + rng.normal(0, 0.1, (n, T)) * b["mask"]).astype(np.float32)
    ent = rng.uniform(0.5, 2, (n, T)).astype(np.float32)
    values = rng.normal(size=(n, T)).astype(np.float32)
    div = rng.uniform(0, 1, (n, T)).astype(np.float32)

    def step(batch, logp, ent, values, div):
        new, stats = objective.prepare(batch, 0.05)
        mb = {**batch, **new}
        den = objective.denominators(mb)

        def loss(logp, values):
            pl, aux = objective.policy_loss(logp, ent, mb, 0.05, den, divergence=div)
            if objective.value:
                vl, vaux = objective.value_loss(values, mb, den)
                pl, aux = pl + vl, {**aux, **vaux}
            return pl, aux
        (l, aux), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(logp, values)
        return new, stats, l, aux, grads

    full = step(b, logp, ent, values, div)
    moved = step(other, logp, ent, values, div)
    ref = step(alone, logp[on], ent[on], values[on], np.zeros_like(div[on]))  # no divergence: the RL part alone
    for got in (full, moved):
        new, stats, _, aux, (g_logp, g_values) = got
        np.testing.assert_allclose(np.asarray(new["adv"])[on], ref[0]["adv"], rtol=1e-5, atol=1e-6)
        if objective.value:
            np.testing.assert_allclose(np.asarray(new["returns"])[on], ref[0]["returns"], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(np.asarray(g_values)[on], ref[4][1], rtol=1e-5, atol=1e-7)
            assert not np.asarray(g_values)[~on].any()  # no value target from a supervised row
        for k in ref[1]:
            np.testing.assert_allclose(float(stats[k]), float(ref[1][k]), rtol=1e-5, err_msg=k)
        for k, v in ref[3].items():
            if not k.startswith("distill/"):
                np.testing.assert_allclose(np.asarray(aux[k]), np.asarray(v), rtol=1e-5, atol=1e-7, err_msg=k)
        # the policy gradient of an on-policy token: the RL part (as alone) plus the divergence's, which
        # is linear in `div` (d/dlogp of the gkd term is 0: the divergence is passed in as is)
        np.testing.assert_allclose(np.asarray(g_logp)[on], ref[4][0], rtol=1e-5, atol=1e-7)
        assert not np.asarray(g_logp)[~on].any()  # the surrogate, KL and entropy never reach a supervised row
        jsd = float(np.sum(div * b["loss_mask"]) / np.sum(b["loss_mask"]))  # over every loss token
        np.testing.assert_allclose(float(aux["distill/jsd"]), jsd, rtol=1e-6)
    np.testing.assert_allclose(float(full[2]), float(moved[2]), rtol=1e-6)  # the loss itself
