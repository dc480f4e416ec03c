"""model.attention: blockwise attention against an explicit dense reference (outputs and gradients), its
causal block skipping and memory, the cuDNN and splash wrappers' logic on CPU, the choice of `auto`, and
the config checks. Model-level parity (transformers, sampler vs trainer) is in test_models / test_sampling."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import kernels
from jaxrl_llm.models.attention import EMPTY_LSE, blockwise_attend, flash_attention
from jaxrl_llm.models.kernels import (ATTENTION_IMPLS, check_attention, cudnn_attend, dense_attend, dense_mask,
                                      resolve_attention)

@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
    """float32 comparisons at 1e-5 on any backend (GPUs default to TF32 matmuls)."""
    with jax.default_matmul_precision("float32"):
        yield


N, S, H, KV, HD = 4, 13, 4, 2, 8  # GQA: 2 query heads per key/value head; 13 tokens: no block size divides it


def _mask():
    m = np.ones((N, S), bool)
    m[0, :5] = False  # left padding
    m[1, :] = False  # a fully padded row
    m[2, [0, 3, 4, 9]] = False  # ragged: holes
    m[3, 10:] = False  # right padding
    return jnp.asarray(m)


def _qkv(seed=0, n=N, s=S):
    r = np.random.default_rng(seed)
    a = lambda *shape: jnp.asarray(r.standard_normal(shape), jnp.float32)
    return a(n, s, H, HD), a(n, s, KV, HD), a(n, s, KV, HD), a(n, s, H, HD)


def reference(q, k, v, visible):
    """Independent dense attention: visible (N,S,K) bool says which key each query sees; a query that sees
    none gets zeros. Computed in float64 numpy, heads expanded explicitly (query head h uses kv head h//R)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    visible = np.asarray(visible)
    r = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)
    s = np.einsum("nshd,nthd->nhst", q, k) / np.sqrt(q.shape[-1])
    s = np.where(visible[:, None], s, -np.inf)
    top = np.max(np.where(visible[:, None], s, -1e300), axis=-1, keepdims=True)
    e = np.where(visible[:, None], np.exp(s - top), 0.0)
    w = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    return np.einsum("nhst,nthd->nshd", w, v)


def _causal_visible(mask, segments=None):
    return np.asarray(dense_mask(mask, segments))


def _loss(fn, w):
    return lambda q, k, v: jnp.sum(fn(q, k, v) * w)


@pytest.mark.parametrize("block", [(1, 2), (3, 5), (4, 4), (64, 64)])  # tiny, uneven, even, larger than T
def test_blockwise_equals_dense_path_outputs_and_gradients(block):
    q, k, v, w = _qkv()
    mask = _mask()
    visible = _causal_visible(mask)
    rows = jnp.asarray(visible.any(-1))[..., None, None]  # queries that see a key
    w = w * rows
    ours = lambda q, k, v: blockwise_attend(q, k, v, mask, block_q=block[0], block_k=block[1])
    xla = lambda q, k, v: dense_attend(q, k, v, dense_mask(mask))
    out = ours(q, k, v)
    np.testing.assert_allclose(np.where(rows, out, 0), np.where(rows, reference(q, k, v, visible), 0), atol=1e-5)
    np.testing.assert_allclose(np.where(rows, out, 0), np.where(rows, xla(q, k, v), 0), atol=1e-5)
    assert np.all(np.asarray(out)[~np.asarray(rows)[..., 0, 0]] == 0)  # no visible key: zeros
    g_ours = jax.grad(_loss(ours, w), (0, 1, 2))(q, k, v)
    g_xla = jax.grad(_loss(xla, w), (0, 1, 2))(q, k, v)
    for a, b in zip(g_ours, g_xla):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_rows_without_visible_keys_give_zeros_and_finite_gradients():
    q, k, v, w = _qkv(1)
    mask = jnp.zeros((N, S), bool).at[0].set(True)  # rows 1..3 fully padded; w is nonzero everywhere
    out = blockwise_attend(q, k, v, mask, block_q=4, block_k=4)
    assert np.all(np.asarray(out[1:]) == 0) and np.all(np.isfinite(out))
    grads = jax.grad(_loss(lambda q, k, v: blockwise_attend(q, k, v, mask, block_q=4, block_k=4), w), (0, 1, 2))(q, k, v)
    assert all(np.all(np.isfinite(g)) for g in grads)
    assert np.all(np.asarray(grads[0][1:]) == 0)  # a query that sees nothing has no gradient
    _, lse = flash_attention(q, k, v, jnp.zeros((N, S), jnp.int32), jnp.where(mask, 0, -1), True, 4, 4)
    assert np.all(np.asarray(lse[1:]) == EMPTY_LSE)


def test_segment_ids_attend_within_their_segment_only():
    q, k, v, w = _qkv(2)
    mask = _mask()
    seg = np.zeros((N, S), np.int32)
    seg[:, 4:] = 1
    seg[:, 9:] = 2
    seg[3, :] = np.arange(S) // 3  # many short segments
    seg = jnp.asarray(seg)
    visible = np.tril(np.ones((S, S), bool))[None] & np.asarray(mask)[:, None, :] \
        & (np.asarray(seg)[:, :, None] == np.asarray(seg)[:, None, :])  # built here, not by dense_mask
    _equals_visibility(lambda q, k, v: blockwise_attend(q, k, v, mask, seg, block_q=3, block_k=4), q, k, v, w, visible)


def _equals_visibility(ours, q, k, v, w, visible):
    """`ours` against attention under `visible` (N,S,S): outputs against the float64 reference, gradients
    against the dense path, on every query that sees a key. Returns those rows (N,S,1,1)."""
    rows = jnp.asarray(visible.any(-1))[..., None, None]
    np.testing.assert_allclose(np.where(rows, ours(q, k, v), 0), np.where(rows, reference(q, k, v, visible), 0),
                               atol=1e-5)
    xla = lambda q, k, v: dense_attend(q, k, v, jnp.asarray(visible))
    w = w * rows
    for a, b in zip(jax.grad(_loss(ours, w), (0, 1, 2))(q, k, v), jax.grad(_loss(xla, w), (0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(a, b, atol=1e-5)
    return rows


@pytest.mark.parametrize("window", [None, 3])
def test_branch_ids_see_their_shared_prompt_and_themselves(window):
    """Shared-prompt packing's (segment, branch) ids: a key is visible iff same segment, causal, real, and
    of branch 0 (the prompt) or the query's own branch, and (windowed) within the window by positions.
    The visibility is built here by a loop; blockwise (outputs and gradients), the dense path and the
    cuDNN wrapper (through the reference implementation) against it."""
    q, k, v, w = _qkv(4)
    mask = _mask()
    seg = np.ones((N, S), np.int32)
    seg[:, 11:] = 2
    br = np.zeros((N, S), np.int32)
    br[:, 4:7], br[:, 7:9], br[:, 9:11] = 1, 2, 3  # prompt 0..3, three branches; then a second segment
    br[:, 12:] = 4
    pos = np.where(br == 0, np.arange(S) % 11, 0)
    for n in range(N):
        for b in (1, 2, 3, 4):
            idx = np.flatnonzero(br[n] == b)
            pos[n, idx] = (4 if b < 4 else 1) + np.arange(len(idx))  # each branch continues its prompt
    visible = np.zeros((N, S, S), bool)
    for n in range(N):
        for i in range(S):
            for j in range(i + 1):
                visible[n, i, j] = bool(mask[n, j]) and seg[n, i] == seg[n, j] and br[n, j] in (0, br[n, i]) \
                    and (window is None or pos[n, i] - pos[n, j] < window)
    ids, positions = (jnp.asarray(seg), jnp.asarray(br)), jnp.asarray(pos)
    win = None if window is None else jnp.int32(window)
    np.testing.assert_array_equal(np.asarray(dense_mask(mask, ids, win, positions)), visible)
    rows = _equals_visibility(lambda q, k, v: blockwise_attend(q, k, v, mask, ids, block_q=3, block_k=4, window=win,
                                                               positions=positions), q, k, v, w, visible)
    if window is None:  # (the wrapper's window goes through with_static_window: a separate test)
        cud = cudnn_attend(q, k, v, mask, ids, implementation="xla", positions=positions)  # 13: padded to even
        np.testing.assert_allclose(np.where(rows, cud, 0), np.where(rows, reference(q, k, v, visible), 0), atol=1e-5)


def _prefix(seed=3, b=2, p=7):
    r = np.random.default_rng(seed)
    pk = jnp.asarray(r.standard_normal((b, p, KV, HD)), jnp.float32)
    pv = jnp.asarray(r.standard_normal((b, p, KV, HD)), jnp.float32)
    pmask = jnp.asarray(np.arange(p)[None, :] >= np.array([[2], [0]]))  # prompt 0 left-padded by 2
    return pk, pv, pmask


@pytest.mark.parametrize("block", [(2, 3), (64, 64)])
def test_blockwise_prefix_equals_dense_path(block):
    """The prompt prefix (rows b*G..b*G+G-1 see prompt b) merged with the self part by log-sum-exp; the
    fully padded row 1 still sees its prompt."""
    q, k, v, w = _qkv(4)
    mask = _mask()
    pk, pv, pmask = _prefix()
    ours = lambda q, k, v, pk, pv: blockwise_attend(q, k, v, mask, None, (pk, pv, pmask), block_q=block[0],
                                                    block_k=block[1])
    xla = lambda q, k, v, pk, pv: dense_attend(q, k, v, dense_mask(mask), (pk, pv, pmask))
    np.testing.assert_allclose(ours(q, k, v, pk, pv), xla(q, k, v, pk, pv), atol=1e-5)
    loss = lambda fn: lambda *a: jnp.sum(fn(*a) * w)
    for a, b in zip(jax.grad(loss(ours), range(5))(q, k, v, pk, pv), jax.grad(loss(xla), range(5))(q, k, v, pk, pv)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_causal_blocks_above_the_diagonal_are_never_computed():
    """NaN in the values of the last key block: if a query block computed that tile at all (even fully
    masked), 0 * NaN would reach its output. Only the diagonal query block may, and does, see it. Backward:
    NaN in the cotangent of the first query block reaches dK/dV only through tiles (0, j); key blocks
    j >= 1 lie above the diagonal for it, so their gradients stay finite."""
    s, b = 16, 4
    q, k, v, w = _qkv(5, n=2, s=s)
    mask = jnp.ones((2, s), bool)
    fn = lambda q, k, v: blockwise_attend(q, k, v, mask, block_q=b, block_k=b)
    out = fn(q, k, v.at[:, 12:].set(jnp.nan))
    assert np.all(np.isfinite(out[:, :12])) and np.all(np.isnan(out[:, 12:]))
    w = w.at[:, :4].set(jnp.nan)
    _, dk, dv = jax.grad(_loss(fn, w), (0, 1, 2))(q, k, v)
    for g in (dk, dv):
        assert np.all(np.isnan(g[:, :4])) and np.all(np.isfinite(g[:, 4:]))
    # The dense path computes every tile: the same poison reaches every output.
    dense = dense_attend(q, k, v.at[:, 12:].set(jnp.nan), dense_mask(mask))
    assert np.all(np.isnan(dense[:, :12]))


def test_blockwise_temp_memory_far_below_the_dense_path_at_long_t():
    """Compiled, not run: XLA's temporary buffers of forward + backward at T=2048."""
    t = 2048
    spec = jax.ShapeDtypeStruct
    args = (spec((1, t, H, HD), jnp.float32), spec((1, t, KV, HD), jnp.float32), spec((1, t, KV, HD), jnp.float32),
            spec((1, t), jnp.bool_))

    def temp(name):
        loss = lambda q, k, v, m: jnp.sum(kernels.attend(name, q, k, v, m, block=128))
        return jax.jit(jax.grad(loss, (0, 1, 2))).lower(*args).compile().memory_analysis().temp_size_in_bytes

    dense, blockwise = temp("xla"), temp("blockwise")
    assert dense >= H * t * t * 4  # at least one (H, T, T) float32 score array
    assert blockwise * 20 < dense, (blockwise, dense)


@pytest.mark.parametrize("prefix", [False, True])
def test_cudnn_wrapper_logic_through_the_reference_implementation(prefix):
    """The cuDNN wrapper (sort real tokens first, lengths, the inlined prefix) run through JAX's 'xla'
    implementation of the same call: equal to the dense path on every real query."""
    q, k, v, _ = _qkv(6)
    mask = _mask()
    pre = _prefix() if prefix else None
    ours = cudnn_attend(q, k, v, mask, None, pre, implementation="xla")
    ref = dense_attend(q, k, v, dense_mask(mask), pre)
    real = np.asarray(mask)[..., None, None]
    np.testing.assert_allclose(np.where(real, ours, 0), np.where(real, ref, 0), atol=1e-5)
    seg = jnp.asarray(np.arange(S)[None].repeat(N, 0) // 5)
    ours = cudnn_attend(q, k, v, mask, seg, implementation="xla")
    np.testing.assert_allclose(np.where(real, ours, 0), np.where(real, dense_attend(q, k, v, dense_mask(mask, seg)), 0),
                               atol=1e-5)


@pytest.mark.parametrize("prefix", [False, True])
def test_splash_wrapper_in_the_pallas_interpreter(prefix):
    """The splash call (scaling, head-major layout, segment ids for mask and segments, the inlined prefix)
    run by Pallas' interpreter on CPU: equal to the dense path on every real query, gradients too."""
    pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")
    from jaxrl_llm.models.splash import splash_attend
    q, k, v, w = _qkv(7)
    mask = _mask()
    pre = _prefix() if prefix else None
    real = np.asarray(mask)[..., None, None]
    w = w * real
    seg = None if prefix else jnp.asarray(np.arange(S)[None].repeat(N, 0) // 6)
    ours = lambda q, k, v: splash_attend(q, k, v, mask, seg, pre, interpret=True)
    xla = lambda q, k, v: dense_attend(q, k, v, dense_mask(mask, seg), pre)
    np.testing.assert_allclose(np.where(real, ours(q, k, v), 0), np.where(real, xla(q, k, v), 0), atol=1e-5)
    for a, b in zip(jax.grad(_loss(ours, w), (0, 1, 2))(q, k, v), jax.grad(_loss(xla, w), (0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_auto_choice():
    pick = lambda backend, dtype=jnp.bfloat16, hd=64, keys=512, segments=False, name="auto": resolve_attention(
        name, backend=backend, dtype=dtype, head_dim=hd, keys=keys, segments=segments)
    t = kernels.CPU_BLOCKWISE_MIN_KEYS
    assert pick("cpu", jnp.float32, keys=t - 1) == "xla" and pick("cpu", jnp.float32, keys=t) == "blockwise"
    assert pick("gpu") == "cudnn" and pick("gpu", jnp.float16, hd=128) == "cudnn"
    assert pick("gpu", jnp.float32) == "blockwise" and pick("gpu", hd=60) == "blockwise"
    assert pick("gpu", hd=256) == "blockwise" and pick("gpu", segments=True) == "blockwise"
    assert pick("tpu") == "splash"
    shared = lambda backend, name="auto": resolve_attention(name, backend=backend, dtype=jnp.bfloat16, head_dim=64,
                                                            keys=512, segments=True, branches=True)
    assert shared("tpu") == "blockwise" and shared("gpu") == "blockwise" and shared("tpu", "blockwise") == "blockwise"
    with pytest.raises(ValueError, match="train.pack_share_prompt=false"):
        shared("tpu", "splash")
    for name in ("xla", "blockwise"):
        assert pick("cpu", name=name) == name and pick("gpu", name=name) == name
    with pytest.raises(ValueError, match="model.attention='cudnn' needs bfloat16"):
        pick("gpu", jnp.float32, name="cudnn")


def test_choice_on_a_sequence_axis():
    """With mesh.sequence > 1 (models/context_kernels.py) splash and cudnn run when named; xla runs as blockwise;
    auto takes splash on a TPU and blockwise on a GPU (cuDNN would need a dense mask per query chunk)."""
    choose = lambda backend, name="auto", **kw: kernels.choose_attention(
        name, backend=backend, dtype=jnp.bfloat16, head_dim=64, keys=64, segments=False, sequence=True, **kw)
    assert choose("tpu") == ("splash", "") and choose("tpu", "splash", softcap=True) == ("splash", "")
    assert choose("gpu", "cudnn") == ("cudnn", "") and choose("gpu")[0] == "blockwise"
    assert "dense mask" in choose("gpu")[1]
    assert choose("cpu") == ("blockwise", "") and choose("cpu", "xla") == ("blockwise", "")
    with pytest.raises(ValueError, match="'cudnn' does not support an attention soft cap"):
        choose("gpu", "cudnn", softcap=True)
    with pytest.raises(ValueError, match="train.pack_share_prompt=false"):
        choose("tpu", "splash", branches=True)


@pytest.mark.parametrize("name,backend,message", [
    ("cudnn", "cpu", r"config.model.attention='cudnn' needs a GPU \(cuDNN\), but JAX runs on cpu"),
    ("cudnn", "tpu", "needs a GPU"),
    ("splash", "cpu", r"config.model.attention='splash' needs a TPU"),
    ("splash", "gpu", "needs a TPU"),
    ("flash", "cpu", "config.model.attention='flash': expected one of auto, xla, blockwise, cudnn, splash"),
])
def test_kernels_the_backend_lacks_are_refused(name, backend, message):
    with pytest.raises(ValueError, match=message):
        check_attention(name, backend)
    assert check_attention("cudnn", "gpu") is None and check_attention("splash", "tpu") is None


def test_run_config_checks_model_attention():
    from jaxrl_llm import config as config_lib
    from jaxrl_llm.validation import ATTENTION_IMPLS as VALIDATED
    assert VALIDATED == ATTENTION_IMPLS
    base = {"data.task": "digit_puzzles"}
    for name in ATTENTION_IMPLS:
        for sequence in (1, 2):  # every kernel composes with a sequence axis (models/context_kernels.py)
            config_lib.prepare(config_lib.from_dict({**base, "model.attention": name, "model.compute_dtype": "bfloat16",
                                                     "mesh.sequence": sequence}))
    with pytest.raises(ValueError, match="config.model.attention must be one of auto, xla, blockwise"):
        config_lib.prepare(config_lib.from_dict({**base, "model.attention": "flash"}))
    with pytest.raises(ValueError, match="config.model.attention must be auto, xla or blockwise with a float32"):
        config_lib.prepare(config_lib.from_dict({**base, "model.attention": "cudnn"}))
    with pytest.raises(ValueError, match="config.model.attention_block must be a positive int"):
        config_lib.prepare(config_lib.from_dict({**base, "model.attention_block": 0}))
    if jax.default_backend() != "gpu":  # the backend check runs at setup, before anything is loaded
        from jaxrl_llm.trainer import setup
        c = config_lib.prepare(config_lib.from_dict({**base, "model.attention": "cudnn",
                                                     "model.compute_dtype": "bfloat16"}))
        with pytest.raises(ValueError, match="config.model.attention='cudnn' needs a GPU"):
            setup.load_model_config(c)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN runs on a GPU only")
@pytest.mark.parametrize("prefix", [False, True])
def test_cudnn_on_gpu_equals_blockwise(prefix):
    """The real cuDNN kernel (bfloat16) against blockwise on the same inputs: outputs and gradients on the
    real queries, within bfloat16 rounding."""
    q, k, v, w = (x.astype(jnp.bfloat16) for x in _qkv(8, s=64))
    mask = jnp.asarray(np.arange(64)[None] >= np.array([[0], [5], [63], [20]]))
    pre = tuple(x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x for x in _prefix()) if prefix else None
    real = np.asarray(mask)[..., None, None]
    w = w * real
    fns = {name: (lambda q, k, v, name=name: kernels.attend(name, q, k, v, mask, None, pre, block=16))
           for name in ("cudnn", "blockwise")}
    outs = {n: np.where(real, np.asarray(f(q, k, v), np.float32), 0) for n, f in fns.items()}
    np.testing.assert_allclose(outs["cudnn"], outs["blockwise"], atol=3e-2)
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * w.astype(jnp.float32))
    grads = {n: jax.grad(loss(f), (0, 1, 2))(q, k, v) for n, f in fns.items()}
    for a, b in zip(grads["cudnn"], grads["blockwise"]):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=6e-2)


def _windowed_reference(q, k, v, visible, scale, cap):
    """float64 numpy attention with a score scale and soft cap (Gemma 2), heads expanded explicitly."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    r = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)
    s = np.einsum("nshd,nthd->nhst", q, k) * scale
    s = np.tanh(s / cap) * cap
    s = np.where(visible[:, None], s, -np.inf)
    e = np.where(visible[:, None], np.exp(s - np.max(s, axis=-1, keepdims=True, initial=-1e300)), 0.0)
    return np.einsum("nhst,nthd->nshd", e / np.maximum(e.sum(-1, keepdims=True), 1e-300), v)


@pytest.mark.parametrize("block", [(2, 3), (4, 4)])
def test_sliding_window_and_soft_cap_outputs_and_gradients_against_float64(block):
    """Blockwise and dense attention with a window (4 < S), a binding soft cap and a query scale against a
    float64 reference; gradients by central differences of the float64 reference in 3 random directions."""
    q, k, v, w = _qkv(seed=3, n=2)
    mask = jnp.asarray(np.arange(S)[None] >= np.array([[0], [3]]))  # one row left-padded
    window, scale, cap = jnp.int32(4), 0.3, 0.5
    i = np.arange(S)
    visible = np.asarray(dense_mask(mask)) & ((i[:, None] - i[None, :]) < 4)[None]
    assert np.abs(np.einsum("nshd,ntkd->nst", q, k)[visible]).max() * scale > 3 * cap  # the cap binds
    rows = visible.any(-1)  # padded queries see no key: left out (their output is unspecified)
    w = w * jnp.asarray(rows)[..., None, None]
    q = jnp.where(jnp.asarray(rows)[..., None, None], q, 0.0)
    kw = dict(scale=scale, softcap=cap, window=window)
    impls = {"blockwise": lambda q, k, v: blockwise_attend(q, k, v, mask, block_q=block[0], block_k=block[1], **kw),
             "xla": lambda q, k, v: dense_attend(q, k, v, dense_mask(mask, None, window), **kw)}
    ref = lambda q, k, v: float(np.sum(_windowed_reference(q, k, v, visible, scale, cap) * np.asarray(w, np.float64)))
    rng = np.random.default_rng(0)
    for name, fn in impls.items():
        keep = rows[..., None, None]
        np.testing.assert_allclose(np.where(keep, fn(q, k, v), 0),
                                   np.where(keep, _windowed_reference(q, k, v, visible, scale, cap), 0), atol=1e-5)
        grads = jax.grad(_loss(fn, w), (0, 1, 2))(q, k, v)
        for _ in range(3):
            d = [rng.standard_normal(x.shape) for x in (q, k, v)]
            eps = 1e-5
            plus = [np.asarray(x, np.float64) + eps * di for x, di in zip((q, k, v), d)]
            minus = [np.asarray(x, np.float64) - eps * di for x, di in zip((q, k, v), d)]
            numeric = (ref(*plus) - ref(*minus)) / (2 * eps)
            analytic = sum(float(np.sum(np.asarray(g, np.float64) * di)) for g, di in zip(grads, d))
            assert abs(numeric - analytic) <= 1e-4 * max(1.0, abs(numeric)), name


def test_window_skips_key_blocks_outside_it():
    """Causal + window: query block i runs key blocks from the window's start only; key block j runs
    query blocks up to the window's end (the transpose)."""
    from jaxrl_llm.models.attention import _key_block_start, _query_block_stop
    bq = bk = 4
    for i in range(8):
        start = int(_key_block_start(i, bq, bk, True, 6))
        # every key of an earlier block is out of the window of every query of block i
        assert all(q - kk >= 6 for q in range(i * bq, i * bq + bq) for kk in range(0, start * bk))
        assert start == 0 or any(q - kk < 6 for q in range(i * bq, i * bq + bq) for kk in range((start - 1) * bk + bk, start * bk + bk))
    for j in range(8):
        stop = int(_query_block_stop(j, bq, bk, 8, True, 6))
        assert all(q - kk >= 6 for q in range(stop * bq, 8 * bq) for kk in range(j * bk, j * bk + bk))
