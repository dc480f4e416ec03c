"""The Pallas paged-attention kernels (models/paged_kernel.py for TPU, models/paged_kernel_gpu.py in
Triton's form), run by Pallas' interpreter on CPU, against the XLA path (models/paged.py `attend`, itself
held to a float64 softmax by tests/test_sampling_paged.py): float32 outputs to 1e-5 for ragged page counts,
slots that do not step, GQA, a sliding window, a soft cap and the stacked pool of the scanned step with a
traced layer index; the choice of implementation per backend; the kernels in shard_map on meshes of 4
fake devices (tests/paged_kernel_worker.py); and the paged sampler with a kernel forced on, against the
same sampler on the XLA path.
"""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import paged
from jaxrl_llm.models.decode import paged_attention
from jaxrl_llm.models.paged import page_counts
from jaxrl_llm.models.paged_kernel import paged_attend
from jaxrl_llm.models.paged_kernel_gpu import triton_paged_attend
from jaxrl_llm.sampling import generate, pages_needed
from test_sampling_paged import (EOS, MODELS, PAD, S, T, G, _assert_same, _model, prompts,  # noqa: F401 (fixture)
                                 run_mesh_worker)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _case(rng, r=2, s=3, kvh=2, rq=2, hd=8, z=4, m=9, w=5, layers=None, waiting=0):
    """(q, pool, view) of r row shards x s slots, ragged page counts (one slot with a single page, one with
    all w), holes in the seen keys, positions of a left-padded prompt, a table over distinct pool pages.
    waiting: the last `waiting` slots do not step (as the sampler's slots that wait for a page): their
    write goes to the spare page M, they see one key on a page they do not hold (table entry M), and
    `pages_in_use` does not count them. layers: a stacked (L, ...) pool."""
    n = r * s
    lead = () if layers is None else (layers,)
    pool = paged.Pool(jnp.asarray(rng.normal(size=(*lead, r, m + 1, kvh, hd, z)), jnp.float32),
                      jnp.asarray(rng.normal(size=(*lead, r, m + 1, kvh, z, hd)), jnp.float32))
    table = np.stack([rng.permutation(m)[:w] for _ in range(n)]).astype(np.int32)
    used = rng.integers(1, w + 1, n)
    used[0], used[-1 - waiting] = 1, w
    key = np.arange(w * z)
    seen = (key[None] < used[:, None] * z) & (rng.random((n, w * z)) < 0.8)
    seen[np.arange(n), used * z - 1] = True  # every slot sees at least its newest key
    steps = np.arange(n) < n - waiting
    for i in np.flatnonzero(~steps):  # it would start logical page used[i], which it has not been granted
        used[i] = min(used[i], w - 1)
        seen[i, used[i] * z:] = False
        seen[i, used[i] * z] = True
        table[i, used[i]] = m
    pos = np.broadcast_to(key + 3, seen.shape).astype(np.int32)  # coordinates, not indices
    qpos = (used * z - 1 + 3).astype(np.int32)
    q = jnp.asarray(rng.normal(size=(n, kvh, rq, hd)), jnp.float32)
    view = paged.View(jnp.asarray(table), jnp.where(steps, 0, m).astype(jnp.int32), jnp.zeros(n, jnp.int32),
                      jnp.asarray(pos), jnp.asarray(seen), jnp.asarray(qpos), jnp.int32(used[steps].max()))
    return q, pool, view, steps


CASES = {  # block_pages: the kernel's pages per grid step (W = 5 or 4 pages: blocks of 1, 2, 3 and all)
    "ragged": dict(block_pages=2),
    "waiting_slots": dict(waiting=2, block_pages=1),
    "gqa": dict(kvh=2, rq=4, hd=16, block_pages=3),
    "window": dict(window=6, block_pages=2),
    "softcap": dict(softcap=1.5, scale=0.7),
    "window_softcap_one_shard": dict(r=1, s=5, z=8, w=4, window=11, softcap=2.0, block_pages=3),
}


@pytest.mark.parametrize("kernel", ["pallas", "triton"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_equals_the_xla_path(name, kernel):
    kw = dict(CASES[name])
    window, softcap, scale = kw.pop("window", None), kw.pop("softcap", None), kw.pop("scale", None)
    bp = kw.pop("block_pages", paged.BLOCK_PAGES)
    q, pool, view, steps = _case(np.random.default_rng(sorted(CASES).index(name)), **kw)
    window = None if window is None else jnp.int32(window)
    want = paged.attend(q, pool, view, scale=scale, softcap=softcap, window=window)
    run = (functools.partial(paged_attend, block_pages=bp) if kernel == "pallas" else triton_paged_attend)
    got = jax.jit(lambda q, pool, view, window: run(q, pool, view, scale=scale, softcap=softcap, window=window,
                                                    interpret=True))(q, pool, view, window)
    assert got.shape == want.shape and got.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(np.asarray(got)[steps], np.asarray(want)[steps], atol=1e-5, rtol=1e-5)
    if not steps.all():  # the XLA path read the waiting slots' spare page too: their outputs agree, unused
        np.testing.assert_allclose(np.asarray(got)[~steps], np.asarray(want)[~steps], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["pallas", "triton"])
def test_stacked_pool_with_a_traced_layer_index(kernel):
    q, pool, view, _ = _case(np.random.default_rng(7), layers=3)
    run = jax.jit(lambda layer: paged_attention(f"{kernel}_interpret", q, pool, view, layer, 0.5, 2.5, jnp.int32(9)))
    for layer in (0, 2):
        want = paged.attend(q, pool, view, jnp.int32(layer), 0.5, 2.5, jnp.int32(9))
        np.testing.assert_allclose(np.asarray(run(jnp.int32(layer))), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_page_counts_follow_each_slot():
    """Each slot's work stops at its own last visible page (at least one page)."""
    seen = np.zeros((3, 12), bool)
    seen[0, 1], seen[1, [0, 9]] = True, True
    assert page_counts(jnp.asarray(seen), 4).tolist() == [1, 3, 1]


def test_a_kernel_is_chosen_where_the_passes_take_the_backends_kernel():
    assert paged.attention_impl("auto", "tpu") == paged.attention_impl("splash", "tpu") == "pallas"
    assert paged.attention_impl("auto", "gpu", 128, 16) == paged.attention_impl("cudnn", "gpu", 64, 32) == "triton"
    for args in (("auto", "cpu", 128, 16), ("xla", "tpu"), ("blockwise", "tpu"), ("blockwise", "gpu", 128, 16),
                 ("auto", "gpu", 128, 8), ("auto", "gpu", 96, 16)):  # Triton: powers of two, at least 16
        assert paged.attention_impl(*args) == "xla", args
    with pytest.raises(ValueError, match="expected one of xla, pallas, pallas_interpret, triton, triton_interpret"):
        paged_attention("cuda", *_case(np.random.default_rng(0))[:3])


@pytest.mark.parametrize("name,scanned,kernel", [("dense", False, "triton"), ("window_softcap", True, "pallas")])
def test_sampler_with_the_kernel_equals_the_xla_path(name, scanned, kernel, prompts, monkeypatch):  # noqa: F811
    """`generate(kv_page_size=...)` with a kernel forced on (interpreted) against the XLA path: the same
    tokens, masks and log-probs, with a pool so small that rows wait (slots that do not step) and restart;
    windows and soft caps in the scanned step (the stacked pool, a traced layer index)."""
    from jaxrl_llm.models import lm
    if scanned:
        monkeypatch.setattr(lm, "DECODE_UNROLL_MAX_LAYERS", 0)
    config, params = _model(**MODELS[name])
    config = config.replace(logits_chunk=config.logits_chunk + 2)  # compiles of its own, under the patches
    assert lm.decode_unrolled(config) != scanned
    args = dict(max_new_tokens=T, num_samples=G, temperature=1.3, eos_ids=EOS, pad_id=PAD, decode_slots=S,
                kv_page_size=4, kv_pages=pages_needed(prompts[0].shape[1], T, prompts[0].shape[0], 1, 4))
    want = generate(config, params, *prompts, jax.random.PRNGKey(3), **args)
    monkeypatch.setattr(paged, "attention_impl", lambda *a, **kw: f"{kernel}_interpret")  # as on a TPU / GPU
    config = config.replace(logits_chunk=config.logits_chunk + (1 if kernel == "pallas" else 3))  # fresh compiles
    got = generate(config, params, *prompts, jax.random.PRNGKey(3), **args)
    _assert_same(want, got)
    assert int(np.asarray(got.page_stats)[0]) > 0  # rows restarted: slots waited


def test_the_kernel_reads_pages_a_window_freed_and_another_row_took(prompts, monkeypatch):  # noqa: F811
    """An all-windowed model on a pool that works only because passed pages go back: the kernel sees page
    tables whose old entries now belong to other rows, and must mask them by position as the XLA path does."""
    from test_sampling_paged import WINDOW, WZ
    config, params = _model(sliding_window=WINDOW, attn_softcap=3.0)
    config = config.replace(logits_chunk=config.logits_chunk + 5)  # compiles of its own, under the patch
    args = dict(max_new_tokens=T, num_samples=G, temperature=1.3, eos_ids=EOS, pad_id=PAD, decode_slots=S,
                kv_page_size=WZ, kv_pages=pages_needed(prompts[0].shape[1], T, prompts[0].shape[0], 1, WZ, WINDOW))
    want = generate(config, params, *prompts, jax.random.PRNGKey(3), **args)
    monkeypatch.setattr(paged, "attention_impl", lambda *a, **kw: "pallas_interpret")
    config = config.replace(logits_chunk=config.logits_chunk + 1)
    got = generate(config, params, *prompts, jax.random.PRNGKey(3), **args)
    _assert_same(want, got)
    assert int(np.asarray(want.lengths).max()) == T  # rows longer than the pool holds without freeing


def test_kernel_on_a_mesh_equals_the_xla_path():
    """The kernel in shard_map over row shards (data x fsdp) and over KV heads (tensor): each chip's slots
    read only its own pools, and the result is the XLA path's."""
    diffs = run_mesh_worker("paged_kernel_worker.py")["kernel_max_diff"]
    assert len(diffs) == 8 and max(diffs.values()) <= 1e-5, diffs


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_the_kernels_lower_for_their_backends(platform):
    """Without the hardware, as far as CPU can go: each kernel through Pallas' lowering for its backend
    (Mosaic's TPU dialect for a v5e, Triton's for CUDA; `jax.export`), at a Qwen2.5-7B-like shape (7 query
    heads per KV head, head dim 128, pages of 16, bfloat16, the stacked pool). Neither Mosaic's nor
    Triton's own compiler runs here."""
    from jax import export
    q, pool, view, _ = _case(np.random.default_rng(0), rq=7, hd=128, z=16, layers=2)
    q, pool = q.astype(jnp.bfloat16), paged.Pool(pool.k.astype(jnp.bfloat16), pool.v.astype(jnp.bfloat16))
    run = paged_attend if platform == "tpu" else triton_paged_attend
    f = jax.jit(lambda q, pool, view: run(q, pool, view, jnp.int32(1), None, 30.0, jnp.int32(9)))
    target = "tpu_custom_call" if platform == "tpu" else "__gpu$xla.gpu.triton"
    chip = jax.sharding.AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=chip)):
        exported = export.export(f, platforms=[platform], disabled_checks=[  # the kernels' calls are not stable
            export.DisabledSafetyCheck.custom_call(target)])(q, pool, view)
    assert target in exported.mlir_module()
