"""Model FLOP utilization (MFU) of the policy update: the trainer's own jitted `update` (forward, backward,
AdamW) on a ~30M-parameter Qwen2, achieved model FLOP/s over the machine's peak.

    python benchmarks/mfu.py                            # 30M Qwen2, 2 prompts x G=8, 64 + 192 tokens
    python benchmarks/mfu.py --out docs/benchmarks.md   # also refresh the mfu-results block there
    python benchmarks/mfu.py --toy                      # seconds: keeps the script from rotting (tests)

What runs. A `jaxrl_llm.trainer.Trainer` (GRPO preset: kl.coef 0.04, one minibatch, no gradient
accumulation) is built on a random checkpoint of `--size` saved with `save_hf`, and its `fns.update` is
called on a synthetic batch made by the trainer's own `rollouts.device_batch`, `fns.score` (reference log-probs)
and `fns.prepare`, exactly as `Trainer.train_step` does after a rollout: B prompts of P tokens (no
padding), N = B*G completions of T tokens, every token valid (the worst case: no row stops early). The
sequence is P + T = 64 + 192 = 256 tokens by default. The sampled log-probs are the policy's own (an
on-policy first update: ratios 1).

FLOPs. Model FLOPs only (`update_flops`): 3x the forward's matmul + attention FLOPs (`jaxrl_llm.metrics.
flops_per_token`), where the forward is what the update needs -- the prompt once per group (the trainer
shares it across its G completions), completion tokens 0..T-2 through the blocks (token T-1 predicts
nothing), the LM head on the N*T completion positions only. Causal attention counts i+1 keys for the
token at position i. Work the program does on top (the dense attention squares, the last token, the
log-prob chunk padding, the LM head recomputed by the chunked log-prob's checkpoint, remat) is reported as
"executed" FLOPs but never counted as useful.

Peak. On CPU: a jitted 2048x2048 float32 matmul measured in the same run (`harness.timing.matmul_peak_flops`). On
TPU/GPU: the chip's dense bfloat16 datasheet peak (`jaxrl_llm.metrics.PEAK_FLOPS` by `device_kind`; H100
means SXM) and the compute dtype defaults to bfloat16; the measured matmul peak is printed beside it.

Breakdown. The same shapes are timed piece by piece (side by side, interleaved with the update): the
blocks' forward, the log-prob forward (blocks + chunked LM head + entropy), their forward + backward, the
AdamW step, and each matmul shape of the model alone (what these shapes can reach on this machine).
`--variants` re-runs the whole update with other settings of the knobs that change what is executed
(model.logits_chunk, model.remat).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from harness.flops import update_flops  # noqa: E402
from harness.grpo import build_trainer, measure_update, update_batch  # noqa: E402
from harness.report import machine_description, markdown_table, update_markdown  # noqa: E402
from harness.shapes import SIZES  # noqa: E402
from harness.timing import matmul_peak_flops  # noqa: E402

from jaxrl_llm.metrics import peak_flops  # noqa: E402

TARGET = 0.40  # issue 9: MFU of the update on CPU against the measured matmul peak


# ------------------------------------------------------------------------------------- measurement
def breakdown_fns(trainer, params, b) -> dict:
    """Pieces of the update at its shapes, each jitted alone (library functions, the trainer's optimizer).
    `params` must not be the trainer state's (the update donates those)."""
    from jaxrl_llm.models import completion_hidden, logprobs_from_hidden
    from jaxrl_llm.trainer import make_optimizer
    mc, c = trainer.mc, trainer.c
    temperature = c.rollout.temperature
    hidden_of = lambda p: completion_hidden(mc, p, b["prompt_tokens"], b["prompt_mask"], b["tokens"], b["mask"])
    logp_of = lambda p: logprobs_from_hidden(mc, p, hidden_of(p), b["tokens"], temperature, with_entropy=True)
    cotangent = jax.random.normal(jax.random.PRNGKey(1), b["tokens"].shape + (mc.hidden_size,), jnp.float32)
    weight = b["loss_mask"] * b["adv"][:, None] / jnp.sum(b["loss_mask"])

    def surrogate(p):  # the policy loss's matmul work: the clipped ratio is elementwise on (N,T)
        logp, ent = logp_of(p)
        return -jnp.sum(weight * jnp.exp(logp - b["old_logp"])), ent

    tx, _ = make_optimizer(c.optimizer, c.optimizer.learning_rate, 1)
    opt_state = tx.init(params)
    grads = jax.tree_util.tree_map(lambda x: 1e-3 * jnp.ones_like(x), params)

    def adamw(g, o, p):
        import optax
        updates, o = tx.update(g, o, p)
        return optax.apply_updates(p, updates), o

    fns = {"blocks forward": jax.jit(hidden_of),
           "log-prob forward (blocks + LM head + entropy)": jax.jit(logp_of),
           "blocks forward + backward": jax.jit(jax.grad(lambda p: jnp.sum(hidden_of(p) * cotangent))),
           "loss forward + backward": jax.jit(jax.grad(surrogate, has_aux=True)),
           "AdamW step (clip + adamw)": jax.jit(adamw)}
    args = {"AdamW step (clip + adamw)": (grads, opt_state, params)}
    return {name: (lambda i, f=f, a=args.get(name, (params,)): f(*a)) for name, f in fns.items()}


def matmul_shapes(config, tokens: int) -> list[tuple[str, int, int, int, int]]:
    """The weight matmuls of a forward as (name, M, K, N, how many per layer or model): `tokens` rows."""
    c = config
    hq, hkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    return [("q proj", tokens, c.hidden_size, hq, c.num_layers), ("o proj", tokens, hq, c.hidden_size, c.num_layers),
            ("k, v proj", tokens, c.hidden_size, hkv, 2 * c.num_layers),
            ("gate, up proj", tokens, c.hidden_size, c.intermediate_size, 2 * c.num_layers),
            ("down proj", tokens, c.intermediate_size, c.hidden_size, c.num_layers),
            ("LM head", tokens, c.hidden_size, c.vocab_size, 1)]


def shape_fns(config, tokens: int, dtype) -> dict:
    """Each matmul shape of the model alone, jitted: the ceiling these shapes reach on this machine.
    Returns {name: (timed function, FLOPs of one call, calls per forward)}."""
    out = {}
    for i, (name, m, k, n, count) in enumerate(matmul_shapes(config, tokens)):
        x = jax.random.normal(jax.random.PRNGKey(2 * i), (m, k), dtype)
        w = jax.random.normal(jax.random.PRNGKey(2 * i + 1), (k, n), dtype)
        f = jax.jit(lambda a, b_: jnp.dot(a, b_, preferred_element_type=jnp.float32))
        out[f"matmul {name} ({m}x{k} . {k}x{n})"] = (lambda i_, f=f, x=x, w=w: f(x, w), 2.0 * m * k * n, count)
    return out


# ------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=list(SIZES), default="30M")
    p.add_argument("--toy", action="store_true", help="toy model and batch, 1 timed call each, no variants "
                   "(smoke test)")
    p.add_argument("--batch", type=int, default=2, help="prompts per update (B)")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=192)
    p.add_argument("--dtype", default="", help="compute dtype; default float32 on CPU, bfloat16 elsewhere")
    p.add_argument("--remat", default="none", choices=["none", "full", "dots"], help="model.remat of the main run")
    p.add_argument("--logits-chunk", type=int, default=128, help="model.logits_chunk of the main run")
    p.add_argument("--variants", default="logits_chunk=64;logits_chunk=192;remat=full;remat=dots",
                   help="';'-separated settings (k=v,k=v of logits_chunk, remat) also measured; '' for none")
    p.add_argument("--repeats", type=int, default=3, help="timed calls of each function")
    p.add_argument("--no-breakdown", action="store_true", help="time only the update (and the variants)")
    p.add_argument("--out", default="", help="markdown file whose mfu-results block is rewritten")
    args = p.parse_args(argv)
    if args.toy:
        args.size, args.batch, args.group, args.prompt_len, args.new_tokens = "toy", 2, 2, 4, 6
        args.logits_chunk, args.repeats = 4, 1
        args.variants = ""  # each variant compiles another update: ~10 s of CPU even at toy size
    for name in ("batch", "group", "prompt_len", "new_tokens", "repeats", "logits_chunk"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.group < 2:
        raise ValueError(f"--group must be >= 2 (GRPO normalizes within a group), got {args.group}")
    args.variant_list = []
    for spec in filter(None, (s.strip() for s in args.variants.split(";"))):
        v = {"remat": args.remat, "logits_chunk": args.logits_chunk}
        for kv in spec.split(","):
            k, _, val = kv.partition("=")
            if k not in v or not val:
                raise ValueError(f"--variants: expected logits_chunk=<int> or remat=<none|full|dots>, got {kv!r}")
            v[k] = int(val) if k == "logits_chunk" else val
        if v["remat"] not in ("none", "full", "dots") or v["logits_chunk"] < 1:
            raise ValueError(f"--variants: bad setting {spec!r}")
        args.variant_list.append(v)
    return args


def main(argv=None):
    args = parse_args(argv)
    log = lambda *a: print(*a, flush=True)
    device = jax.devices()[0]
    on_cpu = device.platform == "cpu"
    dtype = args.dtype or ("float32" if on_cpu else "bfloat16")
    size = SIZES[args.size]
    B, G, P, T = args.batch, args.group, args.prompt_len, args.new_tokens
    N = B * G
    load_before = os.getloadavg()[0]

    with tempfile.TemporaryDirectory(prefix="mfu-bench-") as ws:
        t0 = time.perf_counter()
        trainer = build_trainer(ws, size, batch=B, group=G, prompt_len=P, new_tokens=T, compute_dtype=dtype,
                                remat=args.remat, logits_chunk=args.logits_chunk)
        mc = trainer.mc
        log(f"trainer built in {time.perf_counter() - t0:.1f} s: {args.size} ({mc.num_params() / 1e6:.1f}M "
            f"parameters), {B} prompts x G={G}, {P} prompt + {T} completion tokens, {dtype}")
        peak = matmul_peak_flops()
        extra = {}
        if not args.no_breakdown:
            params = jax.tree_util.tree_map(jnp.copy, trainer.state.params)
            b = update_batch(trainer, trainer.state)
            extra.update(breakdown_fns(trainer, params, b))
            shapes = shape_fns(mc, N * T, jnp.dtype(dtype))
            extra.update({name: fn for name, (fn, _, _) in shapes.items()})
        main_timing, pieces = measure_update(trainer, repeats=args.repeats, extra=extra)
        del trainer
        variants = []
        for v in args.variant_list:
            name = ", ".join(f"{k}={val}" for k, val in v.items())
            t0 = time.perf_counter()
            tr = build_trainer(ws, size, batch=B, group=G, prompt_len=P, new_tokens=T, compute_dtype=dtype,
                               run=f"run-{v['remat']}-{v['logits_chunk']}", **v)
            timing, _ = measure_update(tr, repeats=args.repeats)
            log(f"variant {name}: {timing.median:.3f} s per update ({time.perf_counter() - t0:.0f} s with setup)")
            variants.append((v, timing))
            del tr
    load_after = os.getloadavg()[0]

    # ---- results
    flops = update_flops(mc, B, G, P, T, logits_chunk=args.logits_chunk, remat=args.remat)
    useful = flops["useful"]
    achieved = useful / main_timing.median
    mfu = achieved / peak
    chip = peak_flops(device) if not on_cpu else float("nan")
    log(f"\n{machine_description()}")
    log(f"load average {load_before:.2f} before, {load_after:.2f} after")
    log(f"measured matmul peak (2048x2048 float32): {peak / 1e9:.0f} GFLOP/s")
    log(f"update: {useful / 1e9:.1f} GFLOP useful (forward {flops['forward'] / 1e9:.1f}: blocks "
        f"{flops['blocks_fwd'] / 1e9:.1f} + LM head {flops['head_fwd'] / 1e9:.1f}; x3 for forward + backward), "
        f"{flops['executed'] / 1e9:.1f} GFLOP executed; {main_timing.median:.3f} s (median of {args.repeats}, "
        f"first call {main_timing.first:.1f} s with compilation)")
    log(f"achieved {achieved / 1e9:.1f} GFLOP/s")
    summary = [f"MFU {100 * mfu:.1f}% of measured peak (target >= {100 * TARGET:.0f}%)"]
    if not on_cpu:
        summary.append(f"MFU {100 * achieved / chip:.1f}% of the {device.device_kind} datasheet peak "
                       f"({chip / 1e12:.0f} TFLOP/s, dense bfloat16)")
    for line in summary:
        log(line)

    rows = [[f"remat={args.remat}, logits_chunk={args.logits_chunk} (main)", main_timing.median, main_timing.spread,
             flops["executed"] / useful, achieved / 1e9, 100 * mfu]]
    for v, timing in variants:
        f = update_flops(mc, B, G, P, T, **v)
        rows.append([", ".join(f"{k}={val}" for k, val in v.items()), timing.median, timing.spread,
                     f["executed"] / useful, useful / timing.median / 1e9, 100 * useful / timing.median / peak])
    table = markdown_table(["update settings", "s (median)", "spread", "executed / useful FLOPs", "GFLOP/s",
                            "MFU %"], rows)
    log("\n" + table)

    piece_table = ""
    if pieces:
        blocks_fwd_fb = 3 * flops["blocks_fwd"]
        piece_flops = {"blocks forward": flops["blocks_fwd"], "log-prob forward (blocks + LM head + entropy)":
                       flops["forward"], "blocks forward + backward": blocks_fwd_fb,
                       "loss forward + backward": useful, "AdamW step (clip + adamw)": 0.0}
        piece_flops.update({name: fl for name, (_, fl, _) in shapes.items()})
        nan = float("nan")
        row = lambda name, s, share, fl: [name, s, share, fl / 1e9, fl / s / 1e9 if fl and s > 0 else nan,
                                          100 * fl / s / peak if fl and s > 0 else nan]
        prow = [row("update (trainer's fns.update)", main_timing.median, 1.0, useful)]
        for name, tm in pieces.items():
            share = nan if name.startswith("matmul") else tm.median / main_timing.median
            prow.append(row(name, tm.median, share, piece_flops[name]))
        # Differences of the pieces above: the LM head's part of the loss, and what the update adds to it.
        head_fb = pieces["loss forward + backward"].median - pieces["blocks forward + backward"].median
        rest = (main_timing.median - pieces["loss forward + backward"].median
                - pieces["AdamW step (clip + adamw)"].median)
        prow.append(row("= LM head + entropy forward + backward (difference)", head_fb,
                        head_fb / main_timing.median, 3 * flops["head_fwd"]))
        prow.append(row("= rest of the update (loss terms, metrics, minibatch gather, state select)", rest,
                        rest / main_timing.median, 0.0))
        piece_table = markdown_table(["piece (same shapes)", "s (median)", "share of update", "useful GFLOP",
                                      "GFLOP/s", "% of peak"], prow)
        # A forward's mix of these shapes: each timed once, weighted by how often a forward runs it.
        total_fl = sum(fl * n for _, fl, n in shapes.values())
        total_t = sum(pieces[name].median * n for name, (_, _, n) in shapes.items())
        ceiling = total_fl / total_t
        summary.append(f"the model's matmul shapes alone reach {ceiling / 1e9:.0f} GFLOP/s = "
                       f"{100 * ceiling / peak:.0f}% of the measured peak (a forward's mix of them)")
        log("\n" + piece_table)
        log(summary[-1])

    if args.out:
        body = (f"Measured on {machine_description()}; load average {load_before:.2f} before and {load_after:.2f} "
                f"after.\n\nModel {args.size} ({mc.num_params() / 1e6:.1f}M parameters, Qwen2, untied head), "
                f"the trainer's jitted GRPO update (forward, backward, AdamW) on {B} prompts x G={G}, {P} prompt + "
                f"{T} completion tokens, {dtype}. Matmul peak {peak / 1e9:.0f} GFLOP/s (2048x2048 float32, same "
                f"run). Useful FLOPs per update {useful / 1e9:.1f} G (3x the forward: prompt once per group, LM "
                f"head on completion tokens only; recomputation not counted).\n\n{table}\n\n"
                + "\n".join(f"- {line}" for line in summary)
                + (f"\n\nBreakdown (main settings):\n\n{piece_table}" if piece_table else ""))
        update_markdown(args.out, "mfu-results", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
