"""compile_options.jit: the library's top-level programs compile with CPU_COMPILER_OPTIONS on CPU (LLVM O2, not
XLA's O3: docs/benchmarks.md, "Compiling at O2 on CPU"), a user's XLA_FLAGS level wins, and a call under another
function's trace (jit, grad, vmap, scan) runs the plain jit, which jax requires."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import compile_options
from jaxrl_llm.compile_options import CPU_COMPILER_OPTIONS, jit


def options_of(lowered) -> dict:
    # jax keeps a program's compiler options on its lowering (jax 0.10: MeshComputation._compiler_options_kvs)
    return dict(lowered._lowering._compiler_options_kvs)


def program(x, w):
    return jnp.tanh(x @ w).sum(-1)


def fresh():
    """A new function: jax keeps one compilation cache per function and set of jit options, across jit objects."""
    return lambda x, w: program(x, w)


@pytest.fixture
def users_flags(monkeypatch):
    """XLA_FLAGS as a user runs (the test run's own set the LLVM level: tests/xla_flags.py)."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")


def test_on_cpu_a_call_runs_the_program_compiled_with_the_options(users_flags):
    assert jax.default_backend() == "cpu" and compile_options.cpu_options_apply()
    f = fresh()
    p = jit(f)
    # no cancelling sum: the two programs' float rounding (O2 here, the test run's flags for jax.jit) may differ
    x, w = jnp.linspace(0.1, 0.5, 32).reshape(4, 8), jnp.linspace(0.01, 0.2, 64).reshape(8, 8)
    out = p(x, w)
    assert (p.cpu._cache_size(), p.plain._cache_size()) == (1, 0)
    assert options_of(p.lower(x, w)) == CPU_COMPILER_OPTIONS == {"xla_backend_optimization_level": 2}
    assert options_of(p.plain.lower(x, w)) == {}
    np.testing.assert_allclose(out, jax.jit(program)(x, w), rtol=1e-5)
    assert float(out.min()) > 0.1
    assert p.__wrapped__ is f and jit(program).__name__ == "program"


def test_a_users_xla_flags_level_wins(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=3")
    assert not compile_options.cpu_options_apply()
    p = jit(fresh())
    p(jnp.ones((2, 3)), jnp.ones((3, 3)))
    assert (p.cpu._cache_size(), p.plain._cache_size()) == (0, 1)
    assert options_of(p.lower(jnp.ones((2, 3)), jnp.ones((3, 3)))) == {}


def test_other_platforms_keep_xlas_defaults(monkeypatch, users_flags):
    assert compile_options.cpu_options_apply()
    for platform in ("gpu", "tpu", "cuda", "rocm"):
        monkeypatch.setattr(jax, "default_backend", lambda: platform)
        assert not compile_options.cpu_options_apply(), platform


def test_under_another_trace_the_plain_jit_runs(users_flags):
    """jax raises on compiler options of a nested jit: every transformation of a caller must still work."""
    p = jit(fresh())
    x, w = jnp.arange(12.0).reshape(3, 4) / 10, jnp.eye(4) * 0.5
    want = jax.jit(program)(x, w)
    np.testing.assert_allclose(jax.jit(lambda a, b: p(a, b))(x, w), want, rtol=1e-5)
    np.testing.assert_allclose(jax.vmap(p, in_axes=(0, None))(x, w), want, rtol=1e-5)
    np.testing.assert_allclose(jax.grad(lambda a: p(a, w).sum())(x),
                               jax.grad(lambda a: program(a, w).sum())(x), rtol=1e-5)
    _, ys = jax.lax.scan(lambda c, row: (c, p(row[None], w)[0]), 0.0, x)
    np.testing.assert_allclose(ys, want, rtol=1e-5)
    # concrete arguments only, under a caller's trace: jax refuses the options, the plain jit runs
    np.testing.assert_allclose(jax.jit(lambda a: p(np.asarray(x), np.asarray(w)) + a)(1.0), want + 1.0, rtol=1e-5)
    with pytest.raises(ValueError, match="compiler_options"):  # what both checks avoid
        jax.jit(lambda a, b: p.cpu(a, b))(x, w)


def test_other_value_errors_are_not_swallowed(users_flags):
    def bad(x):
        raise ValueError("a shape the caller got wrong")
    p = jit(bad)
    with pytest.raises(ValueError, match="a shape the caller got wrong"):
        p(jnp.ones(2))
    with pytest.raises(ValueError, match="a shape the caller got wrong"):
        jax.jit(lambda a: p(np.ones(2)) + a)(1.0)


def test_decorator_forms_and_static_arguments(users_flags):
    @functools.partial(jit, static_argnames="k")
    def top(x, *, k):
        return jax.lax.top_k(x, k)[0]

    @jit
    def double(x):
        return 2 * x

    x = jnp.array([3.0, 1.0, 2.0])
    np.testing.assert_array_equal(top(x, k=2), [3.0, 2.0])
    np.testing.assert_array_equal(double(x), 2 * x)
    assert top.cpu._cache_size() == 1 and double.cpu._cache_size() == 1


def test_a_program_copies(users_flags):
    import copy
    p = jit(fresh())
    q = copy.copy(p)
    x, w = jnp.ones((2, 3)), jnp.ones((3, 3))
    np.testing.assert_array_equal(q(x, w), p(x, w))
    with pytest.raises(AttributeError):
        p.not_an_attribute_of_jit


def test_donation_and_shardings_pass_through(users_flags):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    p = jit(lambda a: a + 1, donate_argnums=(0,), out_shardings=repl)
    a = jnp.ones(5)
    out = p(a)
    assert out.sharding == repl and a.is_deleted()


def test_the_library_programs_go_through_it():
    """Every program jaxrl_llm compiles outside models/ (whose jitted functions users call inside their own
    traces) is built by compile_options.jit: the sampler's and the trainer's decide the first step's compile."""
    import os
    import re
    root = os.path.dirname(compile_options.__file__)
    plain = {}
    for d, _, files in os.walk(root):
        for f in files:
            path = os.path.join(d, f)
            if f.endswith(".py") and f != "compile_options.py" and os.sep + "models" + os.sep not in path:
                hits = re.findall(r"(?:partial\(jax\.jit\b|@jax\.jit\b|(?<!`)\bjax\.jit\()", open(path).read())  # `prose`
                if hits:
                    plain[os.path.relpath(path, root)] = len(hits)
    assert not plain, plain
    from jaxrl_llm.sampling import batch, slots, turns
    from jaxrl_llm.trainer import steps
    for fn in (batch.generate_program, slots.slots_program, turns._start, turns._decode_turn, turns._append):
        assert fn.cpu is not fn.plain
    assert "jit(make_update(" in open(steps.__file__).read()
