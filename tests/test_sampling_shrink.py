"""The static sampler's shrinking decode (`generate(decode_shrink=k)`, `rollout.decode_shrink`): once at most
N/k rows are still decoding, the decode goes on over N/k rows (the alive ones, their caches gathered).

Reference: the same sampler without shrinking (`phases=()`), itself checked against transformers and a
teacher-forced per-step reference (tests/test_sampling.py): every row draws the uniforms it draws in the
whole batch, so tokens, log-probs, masks and truncation flags must be the same (the tiny float32 models
here give equal matrix-product rows at every row count; at real shapes a token can flip on rounding).
The cases cover each sampling mode, rows running to the cap (the loops stop on T, not on the alive count),
a row block of a larger batch, a mixture-of-experts model's recorded routes, and a sharded mesh whose
batch shards round the phases up. That the phases run at all is checked in the lowered program (more
decode loops with each phase), by the lengths (each phase's row count is reached before the last step)
and through `generate`'s plumbing.
"""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.sampling as sampling
from fixtures_hf import left_padded_batch
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.lm import init_params
from jaxrl_llm.sampling import generate, generate_program, shrink_phases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V, PAD, B, G, T = 97, 0, 4, 4, 20  # N = 16 rows
EOS_IDS = tuple(range(3, 97, 7))  # 14 of 97 ids (~14% a step): most rows end early, some run to the cap


@pytest.fixture(scope="module")
def model():
    c = ModelConfig(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                    max_position_embeddings=64)
    return c, init_params(c, jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def prompts():
    return left_padded_batch(np.random.default_rng(5), [5, 9, 3, 7], V, pad=PAD)


def _run(model, prompts, phases, seed=3, eos=EOS_IDS, row_block=None, **kw):
    c, params = model
    mode = dict(top_k=0, greedy=False, nucleus=False)
    mode.update(kw.pop("mode", {}))
    return generate_program(c, params, *map(jnp.asarray, prompts), jax.random.PRNGKey(seed), jnp.float32(1.3),
                            jnp.float32(kw.pop("top_p", 1.0)), jnp.float32(kw.pop("penalty", 1.0)),
                            jnp.float32(kw.pop("min_p", 0.0)), max_new_tokens=T, num_samples=G, eos_ids=eos,
                            pad_id=PAD, phases=phases, row_block=row_block, **mode, **kw)


def _assert_same(got, want):
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    np.testing.assert_array_equal(np.asarray(got.mask), np.asarray(want.mask))
    np.testing.assert_array_equal(np.asarray(got.truncated), np.asarray(want.truncated))
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), atol=1e-5)
    np.testing.assert_allclose(np.asarray(got.behavior_logprobs), np.asarray(want.behavior_logprobs), atol=1e-5)


def test_shrink_phases():
    assert shrink_phases(16, 0) == () and shrink_phases(16, 4) == (4,)
    assert shrink_phases(16, 2) == (8, 4, 2) and shrink_phases(64, 4) == (16, 4)
    assert shrink_phases(256, 4, 2) == (64, 16, 4)
    assert shrink_phases(16, 4, multiple=8) == (8,)  # 4 rounded up to the batch shards
    assert shrink_phases(12, 4) == () and shrink_phases(8, 4) == ()  # 3 or 2 rows: under k
    assert shrink_phases(6, 2, multiple=4) == (4,)  # 3 -> 4; then 2 -> 4 is no smaller


MODES = {
    "categorical": {},
    "top-k-top-p-min-p": dict(mode=dict(top_k=20, nucleus=True), top_p=0.9, min_p=0.05, use_min_p=True),
    "penalty": dict(penalty=1.4, penalize=True),
    "greedy": dict(mode=dict(greedy=True)),
}


@pytest.mark.parametrize("mode, phases", [(m, (8, 4, 2)) for m in MODES] + [("categorical", (4,))], ids=str)
def test_shrinking_decode_draws_the_same_rollout(model, prompts, mode, phases):
    want = _run(model, prompts, (), **dict(MODES[mode]))
    lengths = np.asarray(want.lengths)
    assert (lengths == T).any() and lengths.min() < T, lengths  # rows that end, rows cut at the cap
    # the phases that decode: alive rows at most m before the last step (greedy: G equal rows a prompt)
    engaged = [m for m in phases if (lengths >= T - 1).sum() <= m]
    assert engaged and (mode == "greedy" or engaged == list(phases)), (lengths, engaged)
    _assert_same(_run(model, prompts, phases, **dict(MODES[mode])), want)


def test_rows_that_all_end_at_once_or_never(model, prompts):
    """A rare EOS: the loops stop at T with more rows alive than a phase keeps (the phases decode nothing).
    Every token an EOS: each row ends at its first token and no loop runs."""
    never = _run(model, prompts, (), eos=(1,))
    assert np.asarray(never.truncated).sum() > 8
    _assert_same(_run(model, prompts, (8, 4), eos=(1,)), never)
    first = _run(model, prompts, (), eos=tuple(range(V)))
    assert (np.asarray(first.lengths) == 1).all()
    _assert_same(_run(model, prompts, (8, 4), eos=tuple(range(V))), first)


def test_a_row_block_draws_its_rows_uniforms(model, prompts):
    """Prompts 1-2 as rows 4..11 of the 16: shrunk, they draw what they draw in the whole batch."""
    whole = _run(model, prompts, (8,))
    part = _run(model, tuple(x[1:3] for x in prompts), (4,), row_block=(4, 16))
    np.testing.assert_array_equal(np.asarray(part.tokens), np.asarray(whole.tokens)[4:12])
    np.testing.assert_allclose(np.asarray(part.logprobs), np.asarray(whole.logprobs)[4:12], atol=1e-5)


def test_the_phases_are_compiled_and_passed(model, prompts, monkeypatch):
    """More decode loops with each phase in the program; `generate(decode_shrink=k)` passes shrink_phases(N, k)."""
    c, params = model
    kw = dict(max_new_tokens=T, num_samples=G, top_k=0, greedy=False, nucleus=False, eos_ids=EOS_IDS, pad_id=PAD)
    args = (c, params, *map(jnp.asarray, prompts), jax.random.PRNGKey(0), jnp.float32(1.0), jnp.float32(1.0))
    loops = [generate_program.lower(*args, phases=ph, **kw).as_text().count("stablehlo.while")
             for ph in [(), (8,), (8, 4)]]
    assert loops[0] < loops[1] < loops[2], loops  # each phase: a decode loop of its own
    seen = []
    real = sampling.generate_program
    monkeypatch.setattr(sampling, "generate_program", lambda *a, **k: seen.append(k["phases"]) or real(*a, **k))
    out = generate(c, params, *prompts, jax.random.PRNGKey(3), max_new_tokens=T, num_samples=G, temperature=1.3,
                   eos_ids=list(EOS_IDS), pad_id=PAD, decode_shrink=2)
    assert seen == [(8, 4, 2)]
    _assert_same(out, _run(model, prompts, ()))
    with pytest.raises(ValueError, match="decode_shrink must be 0 .off. or an int >= 2, got 1"):
        generate(c, params, *prompts, jax.random.PRNGKey(3), max_new_tokens=T, eos_ids=[3], pad_id=PAD, decode_shrink=1)
    with pytest.raises(ValueError, match="decode_shrink shrinks the static batch"):
        generate(c, params, *prompts, jax.random.PRNGKey(3), max_new_tokens=T, num_samples=G, eos_ids=[3], pad_id=PAD,
                 decode_shrink=2, decode_slots=4)


def test_mixture_of_experts_routes_are_recorded_in_every_phase():
    c = ModelConfig(model_type="qwen3_moe", vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, num_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=16, norm_topk_prob=True, max_position_embeddings=64)
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(  # std-0.1 weights: routing varies by token
        lambda p, x: x if "scale" in jax.tree_util.keystr(p) else jnp.asarray(rng.normal(0, 0.1, x.shape), x.dtype),
        init_params(c, jax.random.PRNGKey(0)))
    prompts = left_padded_batch(np.random.default_rng(1), [6, 4, 5, 6], V, pad=PAD)
    want, got = _run((c, params), prompts, ()), _run((c, params), prompts, (8, 4))
    _assert_same(got, want)
    # The experts of every token fed before the row's last (the last is never fed by the shrunk loops; the
    # static loop records it for rows that end before the loop does, and nothing reads it)
    fed = (np.arange(T)[None, :] < np.asarray(want.lengths)[:, None] - 1)[None, :, :, None]
    assert np.asarray(want.routes)[np.broadcast_to(fed, want.routes.shape)].any()
    np.testing.assert_array_equal(np.where(fed, np.asarray(got.routes), -1), np.where(fed, np.asarray(want.routes), -1))


def test_sharded_rows_shrink_to_multiples_of_the_batch_shards():
    """On a (data 2, fsdp 2) mesh of 4 fake devices the phases are multiples of 4 and the rollout is the
    unsharded, unshrunk one."""
    code = textwrap.dedent(f"""
        import jax, jax.numpy as jnp, numpy as np
        from fixtures_hf import left_padded_batch
        from jaxrl_llm import sharding
        from jaxrl_llm.models.config import ModelConfig
        from jaxrl_llm.models.lm import init_params
        import jaxrl_llm.sampling as sampling
        c = ModelConfig(vocab_size={V}, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
        params = init_params(c, jax.random.PRNGKey(0))
        prompts = left_padded_batch(np.random.default_rng(5), [5, 9, 3, 7], {V}, pad={PAD})
        kw = dict(max_new_tokens={T}, num_samples={G}, temperature=1.3, eos_ids={list(EOS_IDS)}, pad_id={PAD})
        want = sampling.generate(c, params, *prompts, jax.random.PRNGKey(3), **kw)
        seen, real = [], sampling.generate_program
        sampling.generate_program = lambda *a, **k: seen.append(k["phases"]) or real(*a, **k)
        with sharding.use_mesh(sharding.make_mesh(data=2, fsdp=2)):
            got = sampling.generate(c, params, *prompts, jax.random.PRNGKey(3), decode_shrink=2, **kw)
        assert seen == [(8, 4)], seen
        assert (np.asarray(got.tokens) == np.asarray(want.tokens)).all()
        assert np.abs(np.asarray(got.logprobs) - np.asarray(want.logprobs)).max() < 1e-5
        assert (np.asarray(want.lengths) >= {T} - 1).sum() <= 4
        print("ok")
    """)
    from xla_flags import with_flags
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=with_flags("--xla_force_host_platform_device_count=4"),
               PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
