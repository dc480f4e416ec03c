"""The Pallas paged-attention kernel (models/paged_kernel.py), run by Pallas' interpreter on CPU, against
the XLA path (models/paged.py `attend`, itself held to a float64 softmax by tests/test_sampling_paged.py):
float32 outputs to 1e-5 for ragged page counts, slots that do not step, GQA, a sliding window, a soft cap
and the stacked pool of the scanned step with a traced layer index; the choice of implementation per
backend; the kernel in shard_map on meshes of 4 fake devices (tests/paged_kernel_worker.py); and the paged
sampler with the kernel forced on, against the same sampler on the XLA path.
"""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import paged
from jaxrl_llm.models.decode import paged_attention
from jaxrl_llm.models.paged_kernel import page_counts, paged_attend
from jaxrl_llm.sampling import generate, pages_needed
from test_sampling_paged import EOS, MODELS, PAD, S, T, G, _assert_same, _model, prompts  # noqa: F401 (fixture)

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


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_equals_the_xla_path(name):
    kw = dict(CASES[name])
    window, softcap, scale = kw.pop("window", None), kw.pop("softcap", None), kw.pop("scale", None)
    bp = kw.pop("block_pages", paged.BLOCK_PAGES)
    q, pool, view, steps = _case(np.random.default_rng(sorted(CASES).index(name)), **kw)
    window = None if window is None else jnp.int32(window)
    want = paged.attend(q, pool, view, scale=scale, softcap=softcap, window=window)
    got = jax.jit(lambda q, pool, view, window: paged_attend(q, pool, view, scale=scale, softcap=softcap,
                                                             window=window, block_pages=bp, interpret=True))(
        q, pool, view, window)
    assert got.shape == want.shape and got.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(np.asarray(got)[steps], np.asarray(want)[steps], atol=1e-5, rtol=1e-5)
    if not steps.all():  # the XLA path read the waiting slots' spare page too: their outputs agree, unused
        np.testing.assert_allclose(np.asarray(got)[~steps], np.asarray(want)[~steps], atol=1e-5, rtol=1e-5)


def test_stacked_pool_with_a_traced_layer_index():
    q, pool, view, _ = _case(np.random.default_rng(7), layers=3)
    run = jax.jit(lambda layer: paged_attention("pallas_interpret", q, pool, view, layer, 0.5, 2.5, jnp.int32(9)))
    for layer in (0, 2):
        want = paged.attend(q, pool, view, jnp.int32(layer), 0.5, 2.5, jnp.int32(9))
        np.testing.assert_allclose(np.asarray(run(jnp.int32(layer))), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_page_counts_follow_each_slot():
    """Each slot's work stops at its own last visible page (at least one page)."""
    seen = np.zeros((3, 12), bool)
    seen[0, 1], seen[1, [0, 9]] = True, True
    assert page_counts(jnp.asarray(seen), 4).tolist() == [1, 3, 1]


def test_the_kernel_is_chosen_where_the_passes_take_a_tpu_kernel():
    assert paged.attention_impl("auto", "tpu") == paged.attention_impl("splash", "tpu") == "pallas"
    for name, backend in (("auto", "cpu"), ("auto", "gpu"), ("cudnn", "gpu"), ("xla", "tpu"), ("blockwise", "tpu")):
        assert paged.attention_impl(name, backend) == "xla", (name, backend)
    with pytest.raises(ValueError, match="expected one of xla, pallas, pallas_interpret"):
        paged_attention("triton", *_case(np.random.default_rng(0))[:3])


@pytest.mark.parametrize("name,scanned", [("dense", False), ("window_softcap", True)])
def test_sampler_with_the_kernel_equals_the_xla_path(name, scanned, prompts, monkeypatch):  # noqa: F811 (fixture)
    """`generate(kv_page_size=...)` with the kernel forced on (interpreted) against the XLA path: the same
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
    monkeypatch.setattr(paged, "attention_impl", lambda *a, **kw: "pallas_interpret")  # as on a TPU
    config = config.replace(logits_chunk=config.logits_chunk + 1)  # a fresh compile under the patch
    got = generate(config, params, *prompts, jax.random.PRNGKey(3), **args)
    _assert_same(want, got)
    assert int(np.asarray(got.page_stats)[0]) > 0  # rows restarted: slots waited


def test_kernel_on_a_mesh_equals_the_xla_path():
    """The kernel in shard_map over row shards (data x fsdp) and over KV heads (tensor): each chip's slots
    read only its own pools, and the result is the XLA path's."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from xla_flags import with_flags
    env["XLA_FLAGS"] = with_flags("--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "paged_kernel_worker.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    diffs = json.loads(proc.stdout.strip().splitlines()[-1])["kernel_max_diff"]
    assert len(diffs) == 4 and max(diffs.values()) <= 1e-5, diffs
