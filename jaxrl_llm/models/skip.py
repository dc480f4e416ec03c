"""A map over chunks that skips, at run time, the chunks past a traced bound: forward and backward.

The packed passes gather the slots that predict a completion token first (models/packing.lm_head_rows), so
the LM head and the distillation divergence only need the chunks before the last of them; how many is
data-dependent while the shapes are static. `skip_chunks` runs a chunk's function under `lax.cond` and
has a custom VJP whose residuals are its inputs: autodiff through `lax.cond` makes every branch return the
union of the branches' residuals, zero-filled, so a weight closed over by the chunk function (the LM head)
came out of every chunk's cond and was stacked over the chunks (a (2, 49152, 576) float32 array, 226 MB,
in the 135M update). The backward recomputes each kept chunk's forward (as `jax.checkpoint` does) and
accumulates the gradients of the shared arguments.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def skip_chunks(f, shared, xs, fixed_xs, fixed, starts, active):
    """ys with ys[i] = f(shared, xs[i], fixed_xs[i], fixed) where starts[i] < active, else zeros.

    f: pure, of (shared, x, fixed_x, fixed) pytrees, returning a pytree of float arrays; it must not close
    over traced values (pass them in `fixed`). shared (differentiated, the same for every chunk), xs
    (differentiated, leading axis = chunks), fixed_xs (not differentiated, leading axis = chunks: integer
    targets, a teacher's hidden states) and fixed (not differentiated). starts (n,) int32, active int32.
    Gradients: shared summed over the kept chunks, xs per chunk (0 for a skipped one); none for the rest.
    """
    return _skip(f, shared, xs, fixed_xs, fixed, starts, jnp.asarray(active, jnp.int32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _skip(f, shared, xs, fixed_xs, fixed, starts, active):
    return _skip_fwd(f, shared, xs, fixed_xs, fixed, starts, active)[0]


def _skip_fwd(f, shared, xs, fixed_xs, fixed, starts, active):
    first = lambda tree: jax.tree_util.tree_map(lambda a: a[0], tree)
    out = jax.eval_shape(f, shared, first(xs), first(fixed_xs), fixed)
    zeros = lambda: jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), out)

    def body(c, chunk):
        start, x, fx = chunk
        return c, jax.lax.cond(start < active, lambda: f(shared, x, fx, fixed), zeros)
    _, ys = jax.lax.scan(body, None, (starts, xs, fixed_xs))
    return ys, (shared, xs, fixed_xs, fixed, starts, active)


def _skip_bwd(f, res, cts):
    shared, xs, fixed_xs, fixed, starts, active = res
    zeros_like = lambda tree: jax.tree_util.tree_map(jnp.zeros_like, tree)

    def body(acc, chunk):
        start, x, fx, ct = chunk

        def run(acc):
            _, vjp = jax.vjp(lambda s, x_: f(s, x_, fx, fixed), shared, x)
            d_shared, dx = vjp(ct)
            return jax.tree_util.tree_map(jnp.add, acc, d_shared), dx
        return jax.lax.cond(start < active, run, lambda acc: (acc, zeros_like(x)), acc)
    d_shared, dxs = jax.lax.scan(body, zeros_like(shared), (starts, xs, fixed_xs, cts))
    return d_shared, dxs, None, None, None, None


_skip.defvjp(_skip_fwd, _skip_bwd)


def column_chunks(t: int, chunk: int):
    """(split, merge, starts) for T columns in n equal chunks of at most `chunk` (padding < n columns, not up
    to a whole chunk): split (B,T,...) -> (n,B,c,...), merge (n,B,c) -> (B,T), starts (n,) int32 the first
    column of each chunk."""
    n = -(-t // max(1, min(chunk, t)))
    c = -(-t // n)

    def split(a):
        a = jnp.pad(a, [(0, 0), (0, n * c - t)] + [(0, 0)] * (a.ndim - 2))
        return a.reshape(a.shape[0], n, c, *a.shape[2:]).swapaxes(0, 1)

    def merge(y):
        return y.swapaxes(0, 1).reshape(y.shape[1], n * c)[:, :t]
    return split, merge, jnp.arange(n, dtype=jnp.int32) * c


def skip_columns(f, shared, x, fixed_x, fixed, chunk: int, active):
    """`skip_chunks` over `column_chunks` of (B,T,...) arrays: x and fixed_x are pytrees of (B,T,...) arrays,
    f maps a (B,c,...) chunk of each to a pytree of (B,c) arrays, and the result is that pytree at (B,T):
    columns of a chunk starting at or past `active` are 0."""
    split, merge, starts = column_chunks(jax.tree_util.tree_leaves(x)[0].shape[1], chunk)
    ys = skip_chunks(f, shared, jax.tree_util.tree_map(split, x), jax.tree_util.tree_map(split, fixed_x), fixed,
                     starts, active)
    return jax.tree_util.tree_map(merge, ys)
