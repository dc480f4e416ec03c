"""The paged KV cache (`kv_page_size`, sampling/paged.py, models/paged.py) against the unpaged continuous-
batching sampler (`slots`, itself held to a teacher-forced reference and the trainer's log-probs by
tests/test_sampling_slots.py): the same tokens, masks, MoE routes, and log-probs to 1e-5 (float32), for
left-padded prompts of ragged lengths, EOS at varied steps, every sampling mode, a sliding window with soft
caps (unrolled and scanned decode steps), an MoE model, LoRA adapters -- with pools large enough for every
row at once and pools so small that rows wait and restart (the restart path is asserted to have run). A
model whose every layer is windowed frees the pages its window has passed: the same rollout from a pool
too small for one row's whole completion, and freeing a page early is caught. On a mesh of 4 fake devices
(tests/paged_worker.py) the per-shard pools give the one-device rollout.
"""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fixtures_hf import left_padded_batch
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.lm import init_params
from jaxrl_llm.sampling import freeing_window, generate, pages_needed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAD = 0
EOS = (3, 9, 17)  # rows end at varied steps, some run to the cap
B, G, T, S = 3, 4, 13, 4


def _model(**kw):
    c = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=8, max_position_embeddings=128, dtype="float32", param_dtype="float32", **kw)
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(  # std 0.3: sharp distributions, varied lengths and routes
        lambda p, x: x if "scale" in jax.tree_util.keystr(p) else jnp.asarray(rng.normal(0, 0.3, x.shape), x.dtype),
        init_params(c, jax.random.PRNGKey(0)))
    return c, params


MODELS = {
    "dense": {},
    "window_softcap": dict(sliding_window=4, layer_types=("sliding_attention", "full_attention"), attn_softcap=3.0),
    "moe": dict(model_type="qwen3_moe", qk_norm=True, num_experts=6, num_experts_per_tok=2,
                moe_intermediate_size=16, norm_topk_prob=True),
    "lora": dict(lora_rank=4, lora_targets=("q", "v", "o", "down")),
}


@pytest.fixture(scope="module")
def prompts():
    return left_padded_batch(np.random.default_rng(5), [5, 9, 2], 61, pad=PAD)


def _pair(config, params, prompts, pool, page=4, seed=3, **kw):
    """(slots rollout, paged rollout) of the same draws; pool "tight": the fewest pages allowed, an int: so many."""
    args = {**dict(max_new_tokens=T, num_samples=G, temperature=1.3, eos_ids=EOS, pad_id=PAD, decode_slots=S), **kw}
    key = jax.random.PRNGKey(seed)
    pages = {"tight": pages_needed(prompts[0].shape[1], T, B, 1, page, freeing_window(config)),
             "ample": 64}.get(pool, pool)
    return (generate(config, params, *prompts, key, **args),
            generate(config, params, *prompts, key, kv_page_size=page, kv_pages=pages, **args))


def _assert_same(a, b):
    np.testing.assert_array_equal(np.asarray(a.mask), np.asarray(b.mask))
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    for x, y in ((a.logprobs, b.logprobs), (a.behavior_logprobs, b.behavior_logprobs)):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=1e-5, rtol=1e-5)
    if a.routes is not None:
        np.testing.assert_array_equal(np.asarray(a.routes), np.asarray(b.routes))
        np.testing.assert_array_equal(np.asarray(a.prompt_routes), np.asarray(b.prompt_routes))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_paged_equals_unpaged(name, prompts):
    config, params = _model(**MODELS[name])
    if name == "lora":  # adapters that change the outputs (b is zero at init)
        params = jax.tree_util.tree_map_with_path(
            lambda p, x: x + 0.2 if "lora_b" in jax.tree_util.keystr(p) else x, params)
    for pool, page in (("tight", 4), ("ample", 8))[:2 if name == "dense" else 1]:
        a, b = _pair(config, params, prompts, pool, page)
        _assert_same(a, b)
        lengths = np.asarray(a.lengths)
        assert lengths.min() < T and lengths.max() == T, lengths  # ragged: some rows end early, some at the cap
        restarts, peak = map(int, np.asarray(b.page_stats))
        if pool == "tight":  # the pool ran out: rows waited and restarted, and every page was in use
            assert restarts > 0 and peak == pages_needed(prompts[0].shape[1], T, B, 1, page), (restarts, peak)
        else:
            assert restarts == 0 and peak <= 64


@pytest.mark.parametrize("mode", [dict(temperature=0.0), dict(top_k=5, top_p=0.8), dict(min_p=0.2),
                                  dict(repetition_penalty=1.7)])
def test_every_sampling_mode(mode, prompts):
    config, params = _model()
    a, b = _pair(config, params, prompts, "tight", **mode)
    _assert_same(a, b)
    if mode.get("temperature") != 0.0:  # greedy rows never draw an EOS here: each slot keeps one row to the cap
        assert int(np.asarray(b.page_stats)[0]) > 0  # a restarted row redraws (from its prompt's penalty set)


def test_scanned_decode_step(prompts, monkeypatch):
    """The stacked pools of the scanned step (layer kinds as data) against the unrolled step's."""
    from jaxrl_llm.models import lm
    monkeypatch.setattr(lm, "DECODE_UNROLL_MAX_LAYERS", 0)
    config, params = _model(**MODELS["window_softcap"])
    config = config.replace(logits_chunk=config.logits_chunk + 1)  # a fresh compile under the patch
    assert not lm.decode_unrolled(config)
    _assert_same(*_pair(config, params, prompts, "tight"))


def test_one_slot_and_every_slot(prompts):
    config, params = _model()
    for slots in (1, B * G):
        args = dict(max_new_tokens=T, num_samples=G, temperature=1.3, eos_ids=EOS, pad_id=PAD, decode_slots=slots)
        a = generate(config, params, *prompts, jax.random.PRNGKey(3), **args)
        b = generate(config, params, *prompts, jax.random.PRNGKey(3), kv_page_size=2,
                     kv_pages=pages_needed(prompts[0].shape[1], T, B, 1, 2) + 3, **args)
        _assert_same(a, b)


def test_a_pool_too_small_or_without_slots_is_refused(prompts):
    config, params = _model()
    need = pages_needed(prompts[0].shape[1], T, B, 1, 4)  # 3 prompts x 3 pages + 4 pages of completion
    assert need == 13
    args = dict(max_new_tokens=T, num_samples=G, eos_ids=EOS, pad_id=PAD)
    with pytest.raises(ValueError, match=r"^kv_pages=12 per row shard is fewer than the 13 pages of 4 tokens its 3 "
                                         r"prompts of 9 tokens and one row of 13 new tokens need$"):
        generate(config, params, *prompts, jax.random.PRNGKey(0), decode_slots=S, kv_page_size=4, kv_pages=12, **args)
    with pytest.raises(ValueError, match="needs decode_slots > 0"):
        generate(config, params, *prompts, jax.random.PRNGKey(0), kv_page_size=4, kv_pages=64, **args)


WINDOW, WZ = 4, 2  # every layer windowed (no layer_types) and its pages of 2 tokens


def test_what_a_window_frees_and_the_fewest_pages_it_needs(prompts):
    """With 9-token prompts, a window of 4 and pages of 2: the first 3 of a prompt's 5 pages (keys 0..5)
    are past for its first token already (the query at 9 sees keys 6..9); a row's token t sees its keys
    t-3..t, on at most 3 pages; a model mixing windowed and full layers frees nothing."""
    from jaxrl_llm.sampling.paged import passed_pages, prompt_pages_passed, row_pages
    assert [int(passed_pages(t, WINDOW, WZ)) for t in range(9)] == [0, 0, 0, 0, 0, 1, 1, 2, 2]
    assert prompt_pages_passed(9, WINDOW, WZ) == 3 and prompt_pages_passed(9, None, WZ) == 0
    assert prompt_pages_passed(9, 1, 3) == 2  # a prompt's last page is always kept
    assert row_pages(T, WZ, WINDOW) == 3 and row_pages(T, WZ) == 7 and row_pages(3, WZ, WINDOW) == 2
    assert pages_needed(9, T, B, 1, WZ, WINDOW) == 3 * 2 + 3 and pages_needed(9, T, B, 1, WZ) == 3 * 5 + 7
    assert freeing_window(_model(sliding_window=WINDOW)[0]) == WINDOW
    assert freeing_window(_model(**MODELS["window_softcap"])[0]) is None and freeing_window(_model()[0]) is None
    config, params = _model(sliding_window=WINDOW)
    args = dict(max_new_tokens=T, num_samples=G, eos_ids=EOS, pad_id=PAD, decode_slots=S, kv_page_size=WZ)
    with pytest.raises(ValueError, match=r"^kv_pages=8 per row shard is fewer than the 9 pages of 2 tokens its 3 "
                                         r"prompts of 9 tokens and one row of 13 new tokens need \(with the pages "
                                         r"every layer's sliding window of 4 has passed freed\)$"):
        generate(config, params, *prompts, jax.random.PRNGKey(0), kv_pages=8, **args)


@pytest.mark.parametrize("mode", [dict(), dict(temperature=0.0), dict(top_k=5, top_p=0.8), dict(min_p=0.2),
                                  dict(repetition_penalty=1.7)])
def test_an_all_windowed_model_frees_the_pages_its_window_has_passed(mode, prompts):
    """A pool of 9 pages: the 3 prompts keep 2 pages each, which leaves 3 for the completions of 4 slots
    -- rows of 13 tokens write 7 pages each, so they ran only because passed pages went back (and without
    freeing the sampler refuses a pool under 22 pages)."""
    config, params = _model(sliding_window=WINDOW, attn_softcap=3.0)
    need = pages_needed(prompts[0].shape[1], T, B, 1, WZ, WINDOW)
    assert need == 9 < pages_needed(prompts[0].shape[1], T, B, 1, WZ)
    a, b = _pair(config, params, prompts, "tight", page=WZ, **mode)
    _assert_same(a, b)
    restarts, peak = map(int, np.asarray(b.page_stats))
    assert int(np.asarray(a.lengths).max()) == T and peak <= need, peak  # 7 pages written by a row, 3 at hand
    if not mode:
        assert restarts > 0  # rows waited and restarted with pages freed by the window in flight


def test_freeing_a_page_early_is_caught(prompts, monkeypatch):
    """The mutation: every page freed Z tokens before its last key leaves the window. Another row takes
    it and writes over keys still seen, and the rollout differs from the unpaged one."""
    from jaxrl_llm.sampling import paged
    config, params = _model(sliding_window=WINDOW, attn_softcap=3.0)
    config = config.replace(logits_chunk=config.logits_chunk + 1)  # a fresh compile under the patch
    passed = paged.passed_pages
    monkeypatch.setattr(paged, "passed_pages", lambda t, window, z: passed(t + z, window, z))
    a, b = _pair(config, params, prompts, 9, page=WZ)
    with pytest.raises(AssertionError):
        _assert_same(a, b)


def run_mesh_worker(script: str) -> dict:
    """tests/<script> in a subprocess on 4 fake CPU devices; the JSON of its last output line."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from xla_flags import with_flags
    env["XLA_FLAGS"] = with_flags("--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", script)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_per_shard_pools_on_a_mesh_equal_one_device():
    out = run_mesh_worker("paged_worker.py")
    assert out["shards"] == 4 and out["restarts"] > 0, out
    assert out["tokens_equal"] and out["mask_equal"] and out["logp_max_diff"] <= 1e-5, out


@pytest.mark.parametrize("block_pages", [1, 3, 8])
def test_paged_attention_against_a_dense_softmax(block_pages):
    """models/paged.attend, read in blocks of 1, 3 or 8 pages with its online softmax and stopped at
    `pages_in_use`, against a float64 softmax over each slot's gathered keys: two row shards, GQA, holes in
    the seen keys, a window and a soft cap."""
    from jaxrl_llm.models import paged
    rng = np.random.default_rng(0)
    r, s, kvh, rq, hd, z, m, w = 2, 3, 2, 2, 8, 4, 9, 5  # shards, slots per shard, heads, page size, pages
    pool = paged.Pool(jnp.asarray(rng.normal(size=(r, m + 1, kvh, hd, z)), jnp.float32),
                      jnp.asarray(rng.normal(size=(r, m + 1, kvh, z, hd)), jnp.float32))
    table = jnp.asarray(rng.integers(0, m, (r * s, w)), jnp.int32)
    used = rng.integers(1, w + 1, r * s)  # logical pages each slot sees
    key = np.arange(w * z)
    seen = (key[None] < used[:, None] * z) & (rng.random((r * s, w * z)) < 0.8)
    seen[np.arange(r * s), used * z - 1] = True  # every slot sees at least its newest key
    pos = np.broadcast_to(key, seen.shape).astype(np.int32)
    qpos = (used * z - 1).astype(np.int32)
    q = jnp.asarray(rng.normal(size=(r * s, kvh, rq, hd)), jnp.float32)
    view = paged.View(table, jnp.zeros(r * s, jnp.int32), jnp.zeros(r * s, jnp.int32), jnp.asarray(pos),
                      jnp.asarray(seen), jnp.asarray(qpos), jnp.int32(used.max()))
    window, cap = 7, 2.0
    got = paged.attend(q, pool, view, scale=0.3, softcap=cap, window=jnp.int32(window), block_pages=block_pages)
    k = np.asarray(pool.k, np.float64)[np.repeat(np.arange(r), s)[:, None], np.asarray(table)]  # (S,W,Hkv,hd,Z)
    v = np.asarray(pool.v, np.float64)[np.repeat(np.arange(r), s)[:, None], np.asarray(table)]  # (S,W,Hkv,Z,hd)
    k = k.transpose(0, 2, 3, 1, 4).reshape(r * s, kvh, hd, w * z)
    v = v.transpose(0, 2, 1, 3, 4).reshape(r * s, kvh, w * z, hd)
    scores = np.einsum("nkrd,nkdt->nkrt", np.asarray(q, np.float64), k) * 0.3
    scores = cap * np.tanh(scores / cap)
    visible = seen & (qpos[:, None] - pos < window)
    scores = np.where(visible[:, None, None], scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("nkrt,nktd->nkrd", p / p.sum(-1, keepdims=True), v)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)
