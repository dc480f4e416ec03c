"""Sliding windows and soft caps in the cuDNN and splash wrappers (Mistral, Gemma 2 and 3 layers), and
`auto`'s choice and reasons. The wrappers run on CPU through JAX's reference implementation of the same
cuDNN call and through Pallas' interpreter, against the dense path (itself checked against float64 in
test_attention.py): outputs and gradients, left/right padding, packed rows, a shared prefix with holes
(the multi-turn sampler's prompt + cache slots), the traced window of the scanned layer kinds."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models.kernels import (CPU_BLOCKWISE_MIN_KEYS, attend, choose_attention, cudnn_attend, dense_attend,
                                      dense_mask, explain_attention, resolve_attention)
from jaxrl_llm.models.transformer import FULL_WINDOW

N, S, H, KV, HD, W = 4, 13, 4, 2, 8, 4  # window 4 < 13 tokens; GQA 2 query heads per key/value head
B, P = 2, 7


@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
    with jax.default_matmul_precision("float32"):
        yield


def _inputs(seed=0, prefix=False):
    """q, k, v, loss weights; a key mask whose rows have contiguous real tokens (left padding, right
    padding, none, all; with a prefix the rows are completions: right padding only); a prefix whose masks
    hold holes (left padding, then unused cache slots)."""
    r = np.random.default_rng(seed)
    a = lambda *shape: jnp.asarray(r.standard_normal(shape) * 2, jnp.float32)  # scores large enough to cap
    q, k, v, w = a(N, S, H, HD), a(N, S, KV, HD), a(N, S, KV, HD), a(N, S, H, HD)
    start = np.array([[0], [0 if prefix else 5], [S], [0]])
    mask = jnp.asarray((np.arange(S)[None] >= start) & (np.arange(S)[None] < np.array([[S], [S], [S], [9]])))
    pmask = np.zeros((B, P), bool)
    pmask[0, 2:5] = True  # prompt left-padded by 2, then 3 real tokens, then 2 empty cache slots
    pmask[1, :6] = True
    prefix = (a(B, P, KV, HD), a(B, P, KV, HD), jnp.asarray(pmask))
    positions = jnp.repeat(jnp.asarray(pmask.sum(1)), N // B)[:, None] + jnp.arange(S)[None]
    return q, k, v, w, mask, prefix, positions


def _compare(ours, ref, mask, w, args, grads=True):
    """Outputs [and gradients (a weighted sum over real queries)] equal on the real queries."""
    real = np.asarray(mask)[..., None, None]
    np.testing.assert_allclose(np.where(real, ours(*args), 0), np.where(real, ref(*args), 0), atol=2e-5)
    if not grads:
        return
    loss = lambda f: lambda *x: jnp.sum(f(*x) * w * real)
    for a, b in zip(jax.grad(loss(ours), (0, 1, 2))(*args), jax.grad(loss(ref), (0, 1, 2))(*args)):
        np.testing.assert_allclose(a, b, atol=5e-5)


@pytest.mark.parametrize("case", ["self", "prefix", "packed"])
def test_cudnn_wrapper_with_window_through_the_reference_implementation(case):
    """The cuDNN call with `local_window_size` (its arguments built by the same wrapper) equals the dense
    windowed path, on a windowed layer (traced window = window_size) and a full one (FULL_WINDOW); the
    gradients here without a prefix (with one: tests/test_attention_windows_model.py)."""
    q, k, v, w, mask, prefix, positions = _inputs(1, case == "prefix")
    pre = prefix if case == "prefix" else None
    seg = jnp.asarray(np.arange(S)[None].repeat(N, 0) // 5) if case == "packed" else None
    scale = 0.2  # Gemma's query_pre_attn_scalar: q rescaled before the call, as `attend` does
    for window in (jnp.int32(W), jnp.int32(FULL_WINDOW)):
        ours = lambda q, k, v: cudnn_attend(q * jnp.float32(scale * HD ** 0.5), k, v, mask, seg, pre,
                                            window=window, window_size=W, implementation="xla")
        ref = lambda q, k, v: dense_attend(q, k, v, dense_mask(mask, seg, window), pre, scale=scale,
                                           window=window, positions=positions)
        _compare(ours, ref, mask, w, (q, k, v), grads=case == "self" and window == W)


def test_the_window_binds_and_local_window_size_counts_the_current_token():
    """JAX's (w - 1, 0) window is HF's w: query i sees w keys (itself included), not w + 1: the windowed
    output differs from the full one, and equals dense attention masked to keys i-w+1..i."""
    q, k, v, _, _, _, _ = _inputs(2)
    full = jnp.ones((N, S), bool)
    windowed = cudnn_attend(q, k, v, full, window=W, implementation="xla")
    assert np.abs(np.asarray(windowed - cudnn_attend(q, k, v, full, implementation="xla")))[:, W:].max() > 1e-2
    i = np.arange(S)
    visible = jnp.asarray(np.broadcast_to((i[:, None] >= i[None]) & (i[:, None] - i[None] <= W - 1), (N, S, S)))
    np.testing.assert_allclose(windowed, dense_attend(q, k, v, visible), atol=2e-5)


@pytest.mark.parametrize("case", ["self", "prefix", "packed"])
def test_splash_with_window_and_soft_cap_in_the_pallas_interpreter(case):
    """Splash's LocalMask + attn_logits_soft_cap against the dense path: a binding cap, windowed and full
    layers, outputs [and gradients: without a prefix; with one in tests/test_attention_windows_model.py]."""
    pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")
    from jaxrl_llm.models.splash import splash_attend
    q, k, v, w, mask, prefix, positions = _inputs(3, case == "prefix")
    pre = prefix if case == "prefix" else None
    seg = jnp.asarray(np.arange(S)[None].repeat(N, 0) // 6) if case == "packed" else None
    cap = 1.0
    assert np.abs(np.einsum("nshd,ntkd->nst", q, k)).max() * HD ** -0.5 > 3 * cap  # the cap binds
    for window in (jnp.int32(W), jnp.int32(FULL_WINDOW)):
        ours = lambda q, k, v: splash_attend(q, k, v, mask, seg, pre, softcap=cap, window=window, window_size=W,
                                             interpret=True)
        ref = lambda q, k, v: dense_attend(q, k, v, dense_mask(mask, seg, window), pre, softcap=cap, window=window,
                                           positions=positions)
        _compare(ours, ref, mask, w, (q, k, v), grads=case == "self" and window == W)


def test_splash_local_mask_is_the_dense_window():
    """The static mask the kernel is built with, materialised: causal within w keys (the current one
    included), equal to dense_mask's window, for every head."""
    pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")
    from jaxrl_llm.models.splash import splash_mask
    m = splash_mask(H, 256, W)
    dense = np.asarray(dense_mask(jnp.ones((1, 256), bool), None, W))[0]
    assert m.shape == (H, 256, 256)
    for h in range(H):
        np.testing.assert_array_equal(np.asarray(m[h, :, :]), dense)
    np.testing.assert_array_equal(np.asarray(splash_mask(1, 256)[0, :, :]), np.tril(np.ones((256, 256), bool)))


def test_auto_choice_and_reasons_for_windows_and_soft_caps():
    kw = dict(dtype=jnp.bfloat16, head_dim=128, keys=4096, segments=False)
    pick = lambda name, backend, **f: choose_attention(name, backend=backend, **{**kw, **f})
    assert pick("auto", "gpu", windowed=True) == ("cudnn", "")  # Mistral, Gemma 3
    assert pick("auto", "tpu", windowed=True) == ("splash", "")
    assert pick("auto", "tpu", windowed=True, softcap=True) == ("splash", "")  # Gemma 2
    assert pick("auto", "gpu", windowed=True, softcap=True) == ("blockwise", "cuDNN has no attention soft cap")
    assert pick("auto", "gpu", segments=True)[0] == "blockwise" and "packed" in pick("auto", "gpu", segments=True)[1]
    assert "bfloat16/float16" in pick("auto", "gpu", dtype=jnp.float32)[1]
    assert pick("auto", "cpu", windowed=True, softcap=True) == ("blockwise", "")
    assert pick("auto", "cpu", keys=CPU_BLOCKWISE_MIN_KEYS - 1, softcap=True) == ("xla", "")
    assert pick("cudnn", "gpu", windowed=True) == ("cudnn", "") and pick("splash", "tpu", softcap=True)[0] == "splash"
    assert resolve_attention("auto", backend="gpu", **kw, softcap=True) == "blockwise"
    with pytest.raises(ValueError, match=r"^config.model.attention='cudnn' does not support an attention soft cap"):
        pick("cudnn", "gpu", softcap=True)


def test_explain_attention_per_layer_kind():
    gemma3 = types.SimpleNamespace(attention="auto", dtype="bfloat16", head_dim=128, attn_softcap=None,
                                   sliding_layers=(True,) * 5 + (False,))
    gemma2 = types.SimpleNamespace(**{**vars(gemma3), "attn_softcap": 50.0, "sliding_layers": (True, False)})
    assert explain_attention(gemma3, "gpu") == ["model.attention=auto on gpu, sliding-attention layers: cudnn",
                                                "model.attention=auto on gpu, full-attention layers: cudnn"]
    assert explain_attention(gemma2, "gpu")[1] == ("model.attention=auto on gpu, full-attention layers: blockwise "
                                                   "(cuDNN has no attention soft cap)")
    assert explain_attention(gemma2, "tpu")[0].endswith("sliding-attention layers: splash")
    with pytest.raises(ValueError, match="'cudnn' does not support an attention soft cap"):
        explain_attention(types.SimpleNamespace(**{**vars(gemma2), "attention": "cudnn"}), "gpu")


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN runs on a GPU only")
@pytest.mark.parametrize("prefix", [False, True])
def test_cudnn_window_on_gpu_equals_blockwise(prefix):
    """The real cuDNN kernel with a window (bfloat16, traced window of the scanned layers) against
    blockwise: outputs and gradients on the real queries, within bfloat16 rounding."""
    q, k, v, w = (jax.random.normal(jax.random.key(i), (N, 64, h, HD), jnp.bfloat16) for i, h in
                  enumerate((H, KV, KV, H)))
    mask = jnp.asarray(np.arange(64)[None] < np.array([[64], [5], [0], [20]]) if prefix else
                       np.arange(64)[None] >= np.array([[0], [5], [63], [20]]))
    _, _, _, _, _, pre, positions = _inputs(4, prefix)
    pre = tuple(x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x for x in pre) if prefix else None
    positions = positions[:, :1] + jnp.arange(64)[None] if prefix else None
    real = np.asarray(mask)[..., None, None]
    for window in (jnp.int32(9), jnp.int32(FULL_WINDOW)):
        fns = {n: (lambda q, k, v, n=n: attend(n, q, k, v, mask, None, pre, block=16, window=window, window_size=9,
                                               positions=positions)) for n in ("cudnn", "blockwise")}
        outs = {n: np.where(real, np.asarray(f(q, k, v), np.float32), 0) for n, f in fns.items()}
        np.testing.assert_allclose(outs["cudnn"], outs["blockwise"], atol=3e-2)
        loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * w.astype(jnp.float32) * real)
        grads = {n: jax.grad(loss(f), (0, 1, 2))(q, k, v) for n, f in fns.items()}
        for a, b in zip(grads["cudnn"], grads["blockwise"]):
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=6e-2)
