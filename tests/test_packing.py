"""Sequence packing (`train.pack_length`): plans, packed passes against the unpacked path (the slow
reference), the trainer's score and update passes, and a short run with and without packing."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import sharding
from jaxrl_llm.models import ModelConfig, completion_hidden, logprobs_from_hidden, value_head
from jaxrl_llm.models import packing
from jaxrl_llm.models.lm import init_params
from jaxrl_llm.models.packing import (first_fit_decreasing, first_fit_shared, pack_layout, pack_rows, packed_logprobs,
                                      packed_values, plan_packs, plan_shared_packs, sequence_lengths)
from jaxrl_llm.models.value import init_value_params
from jaxrl_llm.trainer import Trainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_trainer import small_config  # noqa: E402

B, G, P, T, L = 3, 2, 6, 12, 20
PLENS, CLENS = (2, 6, 4), (1, 12, 3, 0, 7, 2)  # very uneven; row 3 is empty (a DAPO filler row)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    pm, cm = np.zeros((B, P), np.int32), np.zeros((B * G, T), np.int32)
    for i, n in enumerate(PLENS):
        pm[i, P - n:] = 1
    for i, n in enumerate(CLENS):
        cm[i, :n] = 1
    cm[4, 3] = 0  # a hole inside a completion
    return (rng.integers(1, 50, (B, P)).astype(np.int32), pm, rng.integers(1, 50, (B * G, T)).astype(np.int32), cm,
            jnp.asarray(rng.normal(size=(B * G, T)), jnp.float32) * cm)


def model(attention):
    return ModelConfig(model_type="qwen2", vocab_size=50, hidden_size=16, intermediate_size=32, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=4, qkv_bias=True, max_position_embeddings=64,
                       attention=attention, attention_block=8)


def single(plan):
    return jax.tree_util.tree_map(lambda x: x[0], plan)


def test_plans_are_valid_packings_and_rows_are_bucketed():
    rng = np.random.default_rng(1)
    for _ in range(20):
        lengths = rng.integers(0, 30, size=rng.integers(1, 40)) * (rng.random() > 0.2)
        row, offset, fills = first_fit_decreasing(lengths, 30)
        used = np.zeros((len(fills), 30), int)
        for n, (r, o) in enumerate(zip(row, offset)):
            assert (r < 0) == (lengths[n] == 0)
            if r >= 0:
                used[r, o:o + lengths[n]] += 1
        assert used.max(initial=0) <= 1 and used.sum() == lengths.sum()  # disjoint, all placed, within a row
        assert list(used.sum(axis=1)) == fills
        total = lengths.sum()
        assert -(-total // 30) <= len(fills) <= 2 * total / 30 + 1  # first fit: no two rows half empty
    for needed in range(1, 200):
        for multiple in (1, 2, 8):
            r = pack_rows(needed, multiple, cap=10 ** 6)
            assert r % multiple == 0 and needed <= r <= max(1.25 * needed + 8 * multiple, 8 * multiple)
    assert pack_rows(50, 4, cap=40) == 52  # at most one row per sequence (rounded to the shards), never fewer than needed
    with pytest.raises(ValueError, match="train.pack_length=10"):
        first_fit_decreasing(np.array([3, 11]), 10)


def test_packed_shapes_follow_the_need_and_reuse_compiled_ones():
    """choose_shape: every step's R fits its need, at most one bucket above it (a high-water mark would keep
    the largest ever), and reuses a shape it has run whenever one is that close: over 300 steps of
    heavy-tailed needs, a handful of shapes, not one per step."""
    from jaxrl_llm.trainer.packs import choose_shape
    rng = np.random.default_rng(3)
    for multiple in (1, 4):
        used = set()
        for step in range(300):
            ext = np.minimum(rng.geometric(0.07, 16), 48)
            r = pack_rows(int(-(-(4 * 31 + (ext + 1).sum()) // 128)), multiple, cap=16)
            shape = choose_shape(used, r, multiple)
            used.add(shape)
            assert r <= shape <= pack_rows(r + 1, multiple, cap=2 ** 62) and shape % multiple == 0
            if step == 0:
                assert shape == r
        assert len(used) <= 4, used
    assert choose_shape({6}, 4) == 4  # 6 rows is two buckets above 4: not reused
    assert choose_shape({5, 6}, 4) == 5


def test_reuse_of_a_larger_shape_is_bounded_by_a_compile():
    """With its `wasted` ledger, choose_shape reuses a shape one bucket above a need only until the rows that
    wastes add up to REUSE_BUDGET passes at the need's shape, then compiles the need: over 300 heavy-tailed
    steps the slots are as full as with exact shapes (within 2 points), where unbounded reuse ran the
    frequent need of 4 rows on 5 for good; still a handful of shapes, and never more waste than the budget
    per need."""
    from jaxrl_llm.trainer.packs import REUSE_BUDGET, choose_shape
    wasted: dict = {}
    picks = [choose_shape({5}, 4, 1, wasted) for _ in range(8)]
    k = int(REUSE_BUDGET / 0.25)  # each reuse of 5 rows for 4 wastes a quarter of a pass
    assert picks == [5] * k + [4] * (8 - k) and wasted[4] <= REUSE_BUDGET
    assert choose_shape({4, 5}, 4, 1, wasted) == 4  # once compiled, the need runs its own shape

    rng = np.random.default_rng(1)
    needs = []
    for _ in range(300):
        ext = np.minimum(rng.geometric(0.067, 16), 48)
        plen = np.full(16, 31)
        fills = first_fit_shared(plen, plen + ext, 4, 128)[3]
        needs.append((pack_rows(len(fills), 1, cap=16), sum(fills)))
    real = sum(t for _, t in needs)
    eff = {}
    for name, ledger in (("unbounded", None), ("bounded", {})):
        used, slots = set(), 0
        for r, _ in needs:
            shape = choose_shape(used, r, 1, ledger)
            used.add(shape)
            slots += shape * 128
        eff[name] = real / slots
        assert len(used) <= 4, (name, used)
        if ledger is not None:
            assert all(v <= REUSE_BUDGET for v in ledger.values()), ledger
    exact = real / sum(r * 128 for r, _ in needs)
    assert eff["bounded"] >= exact - 0.02 and eff["bounded"] >= eff["unbounded"] + 0.05, (eff, exact)


def test_skipped_lm_head_chunks_change_nothing_they_read():
    """logprobs_from_hidden with `active`: the chunks wholly past column `active` are skipped (their outputs
    exactly 0, where the full pass gives log-probs < 0), the others are the full pass's, and so is the
    gradient of anything that reads only columns < active."""
    mc = model("xla")
    params = init_params(mc, jax.random.PRNGKey(0))
    hidden = jax.random.normal(jax.random.PRNGKey(1), (2, 10, mc.hidden_size))
    targets = jax.random.randint(jax.random.PRNGKey(2), (2, 10), 0, mc.vocab_size)
    w = jax.random.normal(jax.random.PRNGKey(3), (2, 10)) * (jnp.arange(10) < 4)  # reads columns 0..3

    def run(active):  # chunks of 3 columns start at 0, 3, 6, 9: with active=4 those at 6 and 9 are skipped
        def f(p, h):
            logp, ent = logprobs_from_hidden(mc, p, h, targets, 0.7, with_entropy=True, chunk=3, active=active)
            return jnp.sum(logp * w) + jnp.sum(ent * w), (logp, ent)
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(params, hidden)

    (_, full), g_full = run(None)
    (_, part), g_part = run(jnp.int32(4))
    for x, y in zip(full, part):
        np.testing.assert_allclose(np.asarray(y)[:, :6], np.asarray(x)[:, :6], atol=1e-6)
        assert np.all(np.asarray(y)[:, 6:] == 0) and np.all(np.asarray(x)[:, 6:] != 0)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(y, x, atol=1e-6), g_full, g_part)
    # Memory: the skipping gradient keeps no per-chunk copy of the LM head (autodiff through lax.cond did:
    # cond's residuals came out zero-filled per branch and were stacked over the chunks).
    big = mc.replace(vocab_size=8192, tie_word_embeddings=False)
    head_bytes = big.vocab_size * big.hidden_size * 4
    p_big = init_params(big, jax.random.PRNGKey(0))

    def temp(active):
        f = lambda p, h: jnp.sum(logprobs_from_hidden(big, p, h, targets, chunk=3, active=active) * w)
        return jax.jit(jax.grad(f, argnums=(0, 1))).lower(p_big, hidden).compile().memory_analysis().temp_size_in_bytes
    assert temp(jnp.int32(4)) < 2 * head_bytes, (temp(jnp.int32(4)), temp(None), head_bytes)


def test_prompts_are_shared_except_where_splash_runs(monkeypatch):
    """train.pack_share_prompt is honoured where the packed passes' attention takes branch ids; where it
    would be splash (auto on a TPU, or named) packed rows keep a prompt copy per completion."""
    from jaxrl_llm.trainer.packs import shares_prompt
    for name in ("auto", "xla", "blockwise"):
        assert shares_prompt(True, model(name), 64) and not shares_prompt(False, model(name), 64)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert not shares_prompt(True, model("auto"), 64) and not shares_prompt(True, model("splash"), 64)
    assert shares_prompt(True, model("blockwise"), 64)


def shared_plan(pm, cm, length):
    lengths = np.asarray(sequence_lengths(pm, cm))
    return single(plan_shared_packs(np.repeat(np.asarray(pm).sum(1), G)[None], lengths[None], G, length))


def test_shared_plans_are_valid_packings():
    """first_fit_shared on random groups: every branch and every prompt copy inside its row, no two
    overlapping; a group's completions in one row share one copy (a single row: one copy per prompt);
    never more slots than with a prompt copy per completion (first_fit_decreasing); first fit's row bound."""
    rng = np.random.default_rng(2)
    more = 0
    for trial in range(200):
        g, length = int(rng.integers(1, 9)), int(rng.integers(12, 80))
        b = int(rng.integers(1, 7))
        plen = np.repeat(rng.integers(1, 9, b), g)
        ext = rng.integers(0, length - 8, b * g) * (rng.random(b * g) > 0.15)
        lengths = np.where(ext > 0, plen + ext, 0)
        row, offset, poff, fills = first_fit_shared(plen, lengths, g, length)
        used = np.zeros((len(fills), length), int)
        copies = {}
        for n in range(b * g):
            assert (row[n] < 0) == (lengths[n] == 0)
            if row[n] < 0:
                continue
            copies.setdefault((row[n], n // g), set()).add(int(poff[n]))
            used[row[n], offset[n] + plen[n] - 1:offset[n] + lengths[n]] += 1  # the branch: positions plen-1..
        for (r, grp), starts in copies.items():
            assert len(starts) == 1  # one copy per row and group
            used[r, min(starts):min(starts) + plen[grp * g] - 1] += 1
        assert used.max(initial=0) <= 1 and list(used.sum(axis=1)) == fills
        if len(fills) == 1:  # everything fits one row: one copy of each prompt
            assert len(copies) == len({n // g for n in range(b * g) if lengths[n]})
        _, _, fills_rep = first_fit_decreasing(lengths, length)
        assert sum(fills) <= sum(fills_rep) and -(-sum(fills) // length) <= len(fills) <= 2 * sum(fills) / length + 1
        more += len(fills) > len(fills_rep)
    assert more <= 10  # rarely more rows than a copy per completion (it fits whole groups first)
    with pytest.raises(ValueError, match="train.pack_length=10"):
        first_fit_shared(np.array([3, 3]), np.array([3, 11]), 2, 10)


def test_shared_layout_holds_each_prompt_once(batch):
    """The packed rows of a shared plan: each prompt once per row with its completions, each completion
    after its prompt's last token again (one branch), positions as unpacked, and the slots the log-probs are
    read from predicting their own completion's token."""
    pt, pm, ct, cm, _ = batch
    plan = shared_plan(pm, cm, 64)
    packed, source, valid = pack_layout(pt, pm, ct, cm, plan, 64)
    assert plan["slots"].shape == (1,)  # one row of 64
    toks, seg, br = (np.asarray(packed[k])[0] for k in ("tokens", "segment_ids", "branch_ids"))
    # 39 tokens (43 with a prompt copy per completion: prompts 0 and 2, of 2 and 4 tokens, once less)
    assert (seg > 0).sum() == 39 == plan["slots"][0] and len(set(seg[seg > 0])) == 3
    for n in range(B * G):
        if CLENS[n] == 0:
            assert not np.any(br == n + 1)
            continue
        mine = np.flatnonzero(br == n + 1)
        plen = PLENS[n // G]
        assert list(toks[mine]) == [pt[n // G, -1]] + list(ct[n, :CLENS[n]])  # the prompt's last token, then its own
        assert list(np.asarray(packed["positions"])[0, mine]) == list(range(plen - 1, plen + CLENS[n]))
        prompt = np.flatnonzero((seg == seg[mine[0]]) & (br == 0))
        assert list(toks[prompt]) == list(pt[n // G, P - plen:P - 1])
        flat_next = np.roll(np.asarray(packed["tokens"]).reshape(-1), -1)
        real = np.flatnonzero(cm[n])
        assert list(flat_next[np.asarray(source)[n, real]]) == list(ct[n, real])


@pytest.mark.parametrize("attention,kind", [("xla", "repeated"), ("blockwise", "repeated"), ("xla", "shared"),
                                            ("blockwise", "shared"), ("blockwise", "shared-split"),
                                            ("xla", "shared-predict"), ("xla", "shared-predict-all")])
def test_packed_logprobs_values_and_gradients_equal_unpacked(batch, attention, kind, monkeypatch):
    """Against the unpacked prompt-shared pass (the reference): 1e-5 on every real token, float32. Plans:
    a prompt copy per completion; shared prompts (rows of 40); shared in rows of 14, where prompt 0's group
    does not fit a row and is split (two copies of its prompt); shared, the LM head on the predictor slots
    only ("predict": K = 28 rows for the 27 completion tokens up to each row's last; and K = every slot, as
    the trainer sets it, in LM-head chunks of 4 rows or one column so that most are skipped)."""
    pt, pm, ct, cm, w = batch
    mc = model(attention)
    params = init_params(mc, jax.random.PRNGKey(0))
    if kind == "repeated":
        plan, length = single(plan_packs(np.asarray(sequence_lengths(pm, cm))[None], L)), L
        assert plan["slots"].shape == (3,) and (plan["row"][3] == -1)  # 43 real tokens in 3 rows of 20; row 3 dropped
    else:
        length = 14 if kind == "shared-split" else 2 * L
        plan = shared_plan(pm, cm, length)
        assert plan["row"][3] == -1
        # group 0 (a prompt of 2, completions of 1 and 12): 1 + 2 + 13 = 16 tokens shared, split in rows of 14
        assert (plan["row"][0] != plan["row"][1]) == (kind == "shared-split"), plan
        if kind == "shared-predict":
            plan = {**plan, "predict": np.zeros(28, np.int32)}
        if kind == "shared-predict-all":
            monkeypatch.setattr(packing, "PREDICT_CHUNK_ROWS", 4)
            monkeypatch.setattr(packing, "LOGITS_MIN_CHUNK", 1)
            plan = {**plan, "predict": np.zeros(plan["slots"].shape[-1] * length, np.int32)}
    L_ = length

    def ref(p):
        return logprobs_from_hidden(mc, p, completion_hidden(mc, p, pt, pm, ct, cm), ct, 0.7, with_entropy=True)

    def packed(p):
        return packed_logprobs(mc, p, pt, pm, ct, cm, plan, L_, 0.7, with_entropy=True)

    loss = lambda f: lambda p: sum(jnp.sum(x * w) for x in f(p))
    la, ga = jax.jit(jax.value_and_grad(loss(ref)))(params)
    lb, gb = jax.jit(jax.value_and_grad(loss(packed)))(params)
    np.testing.assert_allclose(lb, la, atol=1e-5)
    past_end = np.cumsum(cm[:, ::-1], axis=1)[:, ::-1] == 0  # after a row's last real token
    for x, y in zip(jax.jit(ref)(params), jax.jit(packed)(params)):
        np.testing.assert_allclose(np.where(cm > 0, y, 0), np.where(cm > 0, x, 0), atol=1e-5)
        assert np.all(np.asarray(y)[past_end] == 0)  # padding reads 0, not another sequence's value
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(y, x, atol=1e-5), ga, gb)
    # Values with the bootstrap column: V(s_T) of the full-length row 1 is its last token's state.
    vp = init_value_params(mc, params, jax.random.PRNGKey(1), head_std=0.5)
    ext_t, ext_m = np.pad(ct, ((0, 0), (0, 1))), np.pad(cm, ((0, 0), (0, 1)), constant_values=1)
    want = jax.jit(lambda v: value_head(mc, v, completion_hidden(mc, v["backbone"], pt, pm, ext_t, ext_m)))(vp)
    got = jax.jit(lambda v: packed_values(mc, v, pt, pm, ct, cm, plan, L_, lambda h: value_head(mc, v, h),
                                          last=True))(vp)
    assert got.shape == (B * G, T + 1)
    np.testing.assert_allclose(np.where(cm > 0, got[:, :-1], 0), np.where(cm > 0, want[:, :-1], 0), atol=1e-5)
    np.testing.assert_allclose(got[1, -1], want[1, -1], atol=1e-5)


@pytest.mark.parametrize("attention", ["xla", "blockwise"])
def test_shared_packing_with_a_sliding_window_equals_unpacked(batch, attention):
    """A windowed layer (window 3) and a full one: through shared prompts the window must measure positions
    (a branch's tokens sit after other branches, not after their prompt); log-probs equal unpacked."""
    pt, pm, ct, cm, _ = batch
    mc = model(attention).replace(sliding_window=3, layer_types=("sliding_attention", "full_attention"))
    params = init_params(mc, jax.random.PRNGKey(0))
    plan = shared_plan(pm, cm, 2 * L)
    want = jax.jit(lambda p: logprobs_from_hidden(mc, p, completion_hidden(mc, p, pt, pm, ct, cm), ct))(params)
    got = jax.jit(lambda p: packed_logprobs(mc, p, pt, pm, ct, cm, plan, 2 * L))(params)
    np.testing.assert_allclose(np.where(cm > 0, got, 0), np.where(cm > 0, want, 0), atol=1e-5)
    wide = jax.jit(lambda p: packed_logprobs(mc.replace(sliding_window=None, layer_types=()), p, pt, pm, ct, cm,
                                             plan, 2 * L))(params)
    assert np.abs(np.where(cm > 0, wide - want, 0)).max() > 1e-3  # the window matters here


def test_packed_gkd_divergence_and_gradients_equal_unpacked(batch, monkeypatch):
    """gkd through packed rows (steps.gkd_divergence with a plan): the student's log-probs, entropies and
    generalized JSD to a teacher of another family and width, and the gradient of the masked divergence,
    equal the unpacked pass on every real token; padding reads 0."""
    from jaxrl_llm import rl
    from jaxrl_llm.trainer.steps import gkd_divergence
    pt, pm, ct, cm, w = batch
    mc, tmc = model("xla").replace(num_layers=1), model("xla").replace(model_type="llama", hidden_size=24, intermediate_size=48,
                                                   num_layers=1, head_dim=6, qkv_bias=False)
    params, teacher = init_params(mc, jax.random.PRNGKey(0)), init_params(tmc, jax.random.PRNGKey(5))
    plan = single(plan_packs(np.asarray(sequence_lengths(pm, cm))[None], L))
    o = rl.Objective(group_size=G, estimator="none", distill="gkd", distill_beta=0.3, distill_chunk=64)
    b = {"prompt_tokens": pt, "prompt_mask": pm, "tokens": ct, "mask": cm}
    def run(pack):  # (sum of the masked divergence, its three outputs), its gradient: one compile
        def f(p):
            out = gkd_divergence(mc, tmc, o, p, teacher, b, 0.7, pack=pack, pack_length=L)
            return jnp.sum(out[2] * cm), out
        return jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    (_, ref), g_ref = run(None)
    lengths = np.asarray(sequence_lengths(pm, cm))
    predicted = single(plan_shared_packs(np.repeat(pm.sum(1), G)[None], lengths[None], G, L))
    predicted["predict"] = np.zeros(predicted["slots"].shape[-1] * L, np.int32)  # as the trainer sets K
    monkeypatch.setattr(packing, "PREDICT_CHUNK_ROWS", 4)  # chunks of a column: the log-probs' and the
    monkeypatch.setattr(packing, "LOGITS_MIN_CHUNK", 1)  # divergence's chunks past the predictors skipped
    past_end = np.cumsum(cm[:, ::-1], axis=1)[:, ::-1] == 0
    for pack in (plan, predicted):  # a prompt copy each, LM heads on every slot; shared, on the predictors only
        (_, packed), g_packed = run(pack)
        for x, y in zip(ref, packed):
            np.testing.assert_allclose(np.where(cm > 0, y, 0), np.where(cm > 0, x, 0), atol=1e-5)
            assert np.all(np.asarray(y)[past_end] == 0)
        jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(y, x, atol=1e-5), g_ref, g_packed)
    assert np.asarray(ref[2])[cm > 0].min() > 0  # a real divergence, not two zeros


def test_which_rows_share_a_pack_does_not_matter(batch):
    """Property: any valid assignment of sequences to packed rows (here: FFD, one row each in reverse
    order, and all in one long row) gives the same log-probs; a plan that overlaps two sequences does not."""
    pt, pm, ct, cm, _ = batch
    mc = model("blockwise")
    params = init_params(mc, jax.random.PRNGKey(0))
    lengths = np.asarray(sequence_lengths(pm, cm))
    f = jax.jit(lambda plan, length: packed_logprobs(mc, params, pt, pm, ct, cm, plan, length), static_argnums=1)
    base = np.asarray(f(single(plan_packs(lengths[None], L)), L))
    n = len(lengths)
    alone = {"row": np.where(lengths > 0, n - 1 - np.arange(n), -1).astype(np.int32),
             "offset": np.zeros(n, np.int32), "slots": np.zeros(n, np.int32)}
    one_row = {"row": np.where(lengths > 0, 0, -1).astype(np.int32),
               "offset": np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32), "slots": np.zeros(1, np.int32)}
    for plan, length in ((alone, L), (one_row, int(lengths.sum()))):
        np.testing.assert_allclose(np.where(cm > 0, f(plan, length), 0), np.where(cm > 0, base, 0), atol=1e-5)
    overlap = dict(one_row, offset=np.maximum(one_row["offset"] - 2, 0).astype(np.int32))
    assert np.abs(np.where(cm > 0, f(overlap, int(lengths.sum())) - base, 0)).max() > 1e-3


def packed_config(**overrides):
    """PPO (value model, bootstrap column, KL to a reference, recomputed log-probs) with 2 micro-batches."""
    return small_config("ppo", **{"rollout.group_size": 2, "rollout.max_new_tokens": 6, "train.grad_accum": 2,
                                  "rollout.recompute_logprobs": True, "advantage.bootstrap_truncated": True,
                                  "kl.coef": 0.05, "entropy_coef": 0.01, **overrides})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two short runs, packed and not: (trainers, histories) by pack_length."""
    trainers = {n: Trainer(packed_config(**{"train.pack_length": n, "total_steps": 2}),
                           str(tmp_path_factory.mktemp(f"pack{n}"))) for n in (0, 32)}
    return trainers, {n: t.run() for n, t in trainers.items()}


def test_short_run_packed_matches_unpacked(runs):
    _, history = runs
    for a, b in zip(history[0], history[32]):
        assert "train/pack_efficiency" not in a and 0 < b.pop("train/pack_efficiency") <= 1
        assert set(a) == set(b)
        for k in a:
            if not k.startswith("perf/"):
                np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_packed_score_and_update_equal_unpacked(runs):
    """The trainer's jitted passes (value model with the bootstrap column, reference, recomputed
    log-probs, 2 micro-batches), packed against unpacked, on one rollout of the trained policy."""
    t = runs[0][32]
    state = t.state
    local, _, _ = t.rollouts.collect(state.params, jax.random.PRNGKey(3))
    b = t.rollouts.device_batch(local)
    ref = t.frozen_ref if state.ref_params is None else state.ref_params
    pidx = jnp.array([3, 0, 2, 1])
    with sharding.use_mesh(t.mesh):
        pack = t.packer.score(b)
        want, got = t.fns.score(state, ref, b), t.fns.score(state, ref, b, pack)
        assert set(got) == set(want) == {"ref_logp", "old_values", "last_values", "old_logp"}
        for k in ("old_values", "last_values", "old_logp"):  # masked where the trainer masks them
            np.testing.assert_allclose(got[k], want[k], atol=1e-5, err_msg=k)
        np.testing.assert_allclose(np.where(b["mask"], got["ref_logp"], 0), np.where(b["mask"], want["ref_logp"], 0),
                                   atol=1e-5)
        b.update(want)
        b.update(t.fns.prepare(b, state.kl.value)[0])
        plan = t.packer.update(pidx)
        copy = lambda s: jax.tree_util.tree_map(jnp.copy, s)  # the update donates its state
        s_want, m_want = t.fns.update(copy(state), b, pidx)
        s_got, m_got = t.fns.update(copy(state), b, pidx, plan)
    assert plan["row"].shape == (2, 4) and 0 < t.packer.metrics()["train/pack_efficiency"] <= 1
    for k in m_want:
        np.testing.assert_allclose(m_got[k], m_want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for new in ("params", "value_params"):
        jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(y, x, atol=1e-5),
                               getattr(s_want, new), getattr(s_got, new))


def test_rows_without_loss_tokens_are_not_packed_and_change_nothing(runs):
    """A filler group (DAPO: loss_mask 0) is left out of the packing plans: its outputs are 0, and the
    statistics and the update equal the unpacked pass, which does score it."""
    t = runs[0][32]
    state = t.state
    local, _, _ = t.rollouts.collect(state.params, jax.random.PRNGKey(4))
    local = dict(local, valid=np.asarray(local["valid"]).copy())
    local["valid"][2:4] = 0.0  # prompt 1's group: filler rows
    b = t.rollouts.device_batch(local)
    ref = t.frozen_ref if state.ref_params is None else state.ref_params
    pidx = jnp.array([3, 0, 2, 1])
    with sharding.use_mesh(t.mesh):
        pack = t.packer.score(b)
        assert np.all(np.asarray(pack["row"])[1, :2] < 0)  # chunk 1 holds prompts 1 and 3: 1's rows unpacked
        want, got = t.fns.score(state, ref, b), t.fns.score(state, ref, b, pack)
        assert not np.any(np.asarray(got["old_logp"])[2:4]) and np.any(np.asarray(want["old_logp"])[2:4])
        out = []
        for scored, plan in ((want, None), (got, t.packer.update(pidx))):
            bb = {**b, **scored}
            fields, stats = t.fns.prepare(bb, state.kl.value)
            bb.update(fields)
            out.append((stats, t.fns.update(jax.tree_util.tree_map(jnp.copy, state), bb, pidx, plan)[1]))
    (s_want, m_want), (s_got, m_got) = out
    for k in s_want:
        np.testing.assert_allclose(s_got[k], s_want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for k in m_want:
        np.testing.assert_allclose(m_got[k], m_want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_pack_length_shorter_than_a_row_is_refused(tmp_path):
    c = packed_config(**{"train.pack_length": 8})
    with pytest.raises(ValueError, match=r"config.train.pack_length must be 0 \(off\) or at least "
                                         r"data.max_prompt_length \+ rollout.max_new_tokens"):
        Trainer(c, str(tmp_path))
