"""Attention implementations side by side: forward + backward of causal GQA attention under a left-padded
key mask, for a Qwen2.5-0.5B head layout (14 query heads, 2 key/value heads, head dim 64).

    python benchmarks/attention.py                 # CPU: xla vs blockwise, T = 128 ... 4096, float32
    python benchmarks/attention.py --toy           # seconds: keeps the script from rotting (tests)
    python benchmarks/attention.py --device-suite  # GPU: xla vs blockwise vs cudnn, bfloat16, a markdown table

Each case is `jax.value_and_grad` of sum(out * w) with respect to q, k and v, jitted. Reported: the median
wall time of the repeats (the first call, compilation included, is not timed), GFLOP/s of the causal
attention's useful work (7 matmuls of N*H*T^2*hd/2 multiply-adds each over forward and backward: QK^T and
PV forward; the recomputed QK^T, dV, dP, dQ, dK backward, counted once for every implementation), and the
compiled program's temporary memory (`memory_analysis().temp_size_in_bytes`: the peak of what XLA
allocates besides arguments and outputs). The ratio column is blockwise time / xla time (< 1: blockwise
faster). The CPU threshold of `model.attention=auto` (models/kernels.py CPU_BLOCKWISE_MIN_KEYS) is the
first T from which blockwise is faster here; docs/attention.md has the measured table.
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.report import machine_description, markdown_table  # noqa: E402
from harness.timing import time_interleaved  # noqa: E402

from jaxrl_llm.models.kernels import attend  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 14, 2, 64  # Qwen2.5-0.5B


def inputs(rows: int, length: int, dtype, seed: int = 0):
    """q (rows,T,14,64), k, v (rows,T,2,64), a left-padded key mask (row i padded by i*T/8), cotangent w."""
    r = np.random.default_rng(seed)
    arr = lambda *shape: jnp.asarray(r.standard_normal(shape), dtype)
    pad = (np.arange(rows) * length // 8) % length
    mask = jnp.asarray(np.arange(length)[None, :] >= pad[:, None])
    return (arr(rows, length, HEADS, HEAD_DIM), arr(rows, length, KV_HEADS, HEAD_DIM),
            arr(rows, length, KV_HEADS, HEAD_DIM), mask, arr(rows, length, HEADS, HEAD_DIM))


def step_fn(impl: str):
    """jitted (q, k, v, mask, w) -> (sum(attend * w), (dq, dk, dv))."""
    def loss(q, k, v, mask, w):
        return jnp.sum(attend(impl, q, k, v, mask).astype(jnp.float32) * w.astype(jnp.float32))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def useful_flops(rows: int, length: int) -> float:
    return 7 * 2 * rows * HEADS * length * length * HEAD_DIM / 2


def measure(impls, rows: int, length: int, dtype, repeats: int) -> dict[str, tuple[float, float]]:
    """{impl: (median seconds, temp bytes)} for one sequence length, the implementations interleaved."""
    args = inputs(rows, length, dtype)
    temp, calls = {}, {}
    for impl in impls:
        fn = step_fn(impl)
        temp[impl] = fn.lower(*args).compile().memory_analysis().temp_size_in_bytes
        calls[impl] = lambda i, fn=fn: fn(*args)
    timings = time_interleaved(calls, repeats=repeats)
    return {impl: (timings[impl].median, temp[impl]) for impl in impls}


def table(impls, rows: int, lengths, dtype, repeats: int) -> str:
    headers = ["T"] + [f"{i} ms" for i in impls] + [f"{i} GFLOP/s" for i in impls] + [f"{i} temp MiB" for i in impls]
    headers += [f"{i}/xla time" for i in impls if i != "xla"]
    out = []
    for t in lengths:
        res = measure(impls, rows, t, dtype, repeats)
        row = [t] + [f"{res[i][0] * 1e3:.1f}" for i in impls]
        row += [f"{useful_flops(rows, t) / res[i][0] / 1e9:.1f}" for i in impls]
        row += [f"{res[i][1] / 2 ** 20:.1f}" for i in impls]
        row += [f"{res[i][0] / res['xla'][0]:.2f}" for i in impls if i != "xla"]
        out.append(row)
        print(markdown_table(headers, [row]).splitlines()[-1], flush=True)
    return markdown_table(headers, out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--toy", action="store_true", help="tiny lengths, one repeat: seconds on CPU")
    p.add_argument("--device-suite", action="store_true", help="GPU: xla, blockwise, cudnn in bfloat16")
    p.add_argument("--rows", type=int, default=2, help="rows of the batch")
    p.add_argument("--lengths", default="128,256,512,1024,2048,4096", help="comma-separated T")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    lengths = [int(t) for t in args.lengths.split(",")]
    impls, dtype, repeats = ["xla", "blockwise"], jnp.float32, args.repeats
    if args.toy:
        lengths, repeats = [16, 40], 1
    if args.device_suite:
        if jax.default_backend() != "gpu":
            raise SystemExit(f"--device-suite needs a GPU; JAX runs on {jax.default_backend()}")
        impls, dtype = ["xla", "blockwise", "cudnn"], jnp.bfloat16
        lengths, repeats = [512, 1024, 2048, 4096, 8192], max(repeats, 5)
        args.rows = max(args.rows, 4)
    print(f"== attention forward+backward: {machine_description()}; backend {jax.default_backend()}, "
          f"{jnp.dtype(dtype).name}, rows={args.rows}, heads {HEADS}/{KV_HEADS}, head dim {HEAD_DIM}")
    print(table(impls, args.rows, lengths, dtype, repeats))


if __name__ == "__main__":
    main()
