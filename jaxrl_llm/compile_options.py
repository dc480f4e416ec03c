"""`jit`: `jax.jit` for the library's top-level programs, compiled on CPU at LLVM's O2 rather than XLA's O3.

Why: XLA:CPU hands the code it generates to LLVM at `xla_backend_optimization_level` 3 by default. At the
real 135M shape the O3 pipeline is about half of the update's and the sampler's compile (XLA's compile of
the first step 23.4 s at O3, 11-15 s at O2) and does nothing for their speed: in one process, the same
programs compiled both ways and timed alternately on the same inputs, O2 ran the sampler, the score pass and
the update in 0.95-0.99x, 0.97-1.00x and 0.97-1.01x of O3's time (0.5B: 0.98x, 0.97x, 0.96x), and the
first GRPO step from a cold start took 21-24 s against 26-27 s (docs/benchmarks.md, "Compiling at O2 on
CPU"). The matmuls are library calls either way; LLVM only compiles the fusions around them.

Only CPU programs get the option: on a GPU the same field sets the LLVM level of the generated kernels,
which is not what was measured. A user's own `XLA_FLAGS=--xla_backend_optimization_level=N` wins (the
plain `jax.jit` is used). jax refuses compiler options on a jit called inside another function's trace,
so a call there goes to the plain jit too (it is inlined into the caller's program): a call with traced
arguments at once, one with concrete arguments only when jax has refused the options (before running
anything).
"""
from __future__ import annotations

import functools
import os

import jax

CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 2}


def cpu_options_apply() -> bool:
    """Whether the library's programs get CPU_COMPILER_OPTIONS now: the default backend is the CPU and
    XLA_FLAGS does not set the level itself."""
    return (jax.default_backend() == "cpu"
            and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""))


class _Program:
    """A jitted function that is a `jax.jit(fun, **kwargs)` plus, on CPU, the same with the options."""

    def __init__(self, fun, kwargs):
        functools.update_wrapper(self, fun)
        self.plain = jax.jit(fun, **kwargs)
        self.cpu = jax.jit(fun, **kwargs, compiler_options=CPU_COMPILER_OPTIONS)

    def _top(self):
        return self.cpu if cpu_options_apply() else self.plain

    def __call__(self, *args, **kwargs):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs))):
            return self.plain(*args, **kwargs)
        program = self._top()
        try:
            return program(*args, **kwargs)
        except ValueError as e:  # under a trace with concrete arguments only: jax refuses the nested options
            if program is self.plain or "compiler_options" not in str(e):
                raise
            return self.plain(*args, **kwargs)

    def __getattr__(self, name):  # lower, trace, eval_shape, _cache_size: of the program a call would run
        if name in ("plain", "cpu") or name.startswith("__"):  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self._top(), name)


def jit(fun=None, /, **kwargs):
    """`jax.jit(fun, **kwargs)` whose programs compile with CPU_COMPILER_OPTIONS on CPU; also a decorator
    (`@jit`, `@functools.partial(jit, static_argnames=...)`). For programs called at the top level; a
    call under another trace runs the plain jit."""
    if fun is None:
        return functools.partial(jit, **kwargs)
    return _Program(fun, kwargs)
