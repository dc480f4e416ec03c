"""Profile of the sampler's decode step, before and after a change, measured side by side on the same
checkpoint: the old code (by default revision eb19df0, before the rewrite of commit fab7559; any other with
`--old-rev`) against the working tree.

    python benchmarks/sampler_profile.py                          # ~3M and ~30M models, B=64, 32 + 64 tokens
    python benchmarks/sampler_profile.py --old-rev HEAD           # the working tree's change against HEAD
    python benchmarks/sampler_profile.py --old-rev 328ae12 --out docs/benchmarks_history.md \
        --block sampler-profile-kT-results --plot docs/sampler_profile_kT.png  # "The decode step's attention and RoPE"
    python benchmarks/sampler_profile.py --out docs/benchmarks_history.md # its block + docs/sampler_profile.png
    python benchmarks/sampler_profile.py --toy                    # seconds: keeps the script from rotting

What is measured, for each model size, in rows N = B = 64, a 32-token prompt and a 64-slot cache:
  * the three stages of one decode step, each jitted and timed alone: the decoder (embedding, L layers,
    final norm: `models.lm.decode_step`, cache carried from call to call and donated as in the loop), the
    LM head (`decode_logits`), and drawing one token per row (`sampling.draw_tokens` at temperature 1 from
    the full vocabulary, and greedy); plus the drawing primitives alone: `jax.random.categorical` (Gumbel-
    max, V random numbers per row) against `sampling.categorical` (one uniform per row), `jnp.argmax`
    against `sampling.argmax`;
  * end to end: `sampling.generate` (temperature 1, every row to full length) and the prefill alone, so
    that ms per decode step = (generate - prefill) / (T - 1) -- the step as it runs inside the loop, where
    the stages fuse and no call is dispatched from Python.

Old and new code each run in a worker process of their own (harness/revisions.py: the old package from
`git archive <old-rev> jaxrl_llm`), loading the same checkpoint (`harness.shapes.build_models`) and inputs;
the workers take turns call by call, each timing its own calls (the pipe is never timed; the dispatch floor,
a jitted no-op, is reported). A stage's sample is the median of `--calls` back-to-back calls; the table
gives the median over `--repeats` rounds, the first round (compilation) excluded.

Checks: both rollouts run all T steps; their sampled log-probs are compared with the trainer's
`token_logprobs` (this checkout's) recomputed on [prompt ; completion]; the old and new decode steps, run
T-1 steps from an empty cache on the same prompts, must give the same hidden states. Nothing here asserts on
time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.report import machine_description, markdown_table, update_markdown  # noqa: E402
from harness.revisions import REPLY, ROOT, Worker, extract_package, time_remote  # noqa: E402
from harness.shapes import build_models  # noqa: E402
from harness.timing import block, wait_for_idle  # noqa: E402

OLD_REV = "eb19df0"  # the parent of fab7559, the sampler rewrite
STAGES = (("layers", "decoder layers"), ("lm_head", "LM head"), ("draw", "draw (temperature 1)"))


# ------------------------------------------------------------------------------------------------ worker
def _worker_functions(ns):
    """The functions a worker times, built against whichever `jaxrl_llm` is first on sys.path.

    Returns (functions: name -> fn(i) returning something to block on, description of the package)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxrl_llm
    from jaxrl_llm import sampling
    from jaxrl_llm.models import lm, load_hf

    if not os.path.abspath(jaxrl_llm.__file__).startswith(os.path.abspath(ns.src) + os.sep):
        raise RuntimeError(f"worker imported jaxrl_llm from {jaxrl_llm.__file__}, expected it under {ns.src}")
    new = hasattr(lm, "decode_prepare")  # the rewrite's API; the old decode_step took the params alone
    config, params = load_hf(ns.checkpoint)
    b, p, t, v = ns.batch, ns.prompt_len, ns.new_tokens, config.vocab_size
    rng = np.random.default_rng(0)  # the coordinator builds the same prompts (logp gap check)
    prompts = jnp.asarray(rng.integers(1, v - 1, (b, p)).astype(np.int32))
    mask = jnp.ones((b, p), jnp.int32)
    key = jax.random.PRNGKey(0)

    def prefill(prm, x, m):
        """generate's first stage: the prompt prefix (L,B,P,Hkv,hd) and the first logits (B,V), from which
        it draws the first token; also the last hidden (B,D), the decode stages' input."""
        h, kv = lm.prefill(config, prm, x, m, with_lm_head=False)
        return lm.logits_from_hidden(config, prm, h[:, -1]), h[:, -1], kv

    # The state generate holds when its loop starts (G=1: N = B rows): the prompt prefix and last hidden.
    prefill_fn = jax.jit(prefill)
    _, hidden, prefix_kv = prefill_fn(params, prompts, mask)
    prefix_mask = mask.astype(bool)
    token = prompts[:, -1]
    if new:
        weights, prefix = jax.jit(lambda prm, kv: lm.decode_prepare(config, prm, kv))(params, prefix_kv)
        new_cache = jax.jit(lambda: lm.init_cache(config, b, t))
        step = jax.jit(lambda prm, w, tok, cache, i, pre, pm: lm.decode_step(
            config, prm, w, tok, jnp.full_like(tok, p) + i, cache, i, pre, pm), donate_argnums=(3,))
        run_step = lambda cache, i: step(params, weights, token, cache, i, prefix, prefix_mask)
    else:
        shape = (config.num_layers, b, t, config.num_kv_heads, config.head_dim)
        new_cache = lambda: (jnp.zeros(shape, config.dtype), jnp.zeros(shape, config.dtype))
        step = jax.jit(lambda prm, tok, cache, i, pre, pm: lm.decode_step(
            config, prm, tok[:, None], jnp.full_like(tok, p)[:, None] + i, cache, i, pre, pm), donate_argnums=(2,))
        run_step = lambda cache, i: (lambda h, c: (h[:, 0], c))(*step(params, token, cache, i, prefix_kv, prefix_mask))
    state = {"cache": new_cache()}

    def layers(i):
        """One decode step, the cache carried from the previous call (and donated, as the loop updates it
        in place); the slot cycles through 0..T-2 as in a generation."""
        out, state["cache"] = run_step(state["cache"], np.int32(i % (t - 1)))
        return out

    def steps():
        """The hidden states (N,D) after decode steps 0..T-2 from an empty cache: old and new must agree."""
        cache = new_cache()
        for i in range(t - 1):
            out, cache = run_step(cache, np.int32(i))
        return out

    head = jax.jit(lambda prm, h: getattr(lm, "decode_logits", lm.logits_from_hidden)(config, prm, h))  # old revs
    logits = head(params, hidden)  # (N,V) float32, this version's own
    one, temperature = jnp.float32(1.0), jnp.float32(1.0)

    # Revisions before the public name (2026-11-24) called it `_draw`; --old-rev may point at one.
    draw_tokens = getattr(sampling, "draw_tokens", None) or getattr(sampling, "_draw")

    def drawer(greedy):
        f = jax.jit(lambda i, lg, temp, top_p: draw_tokens(jax.random.fold_in(key, i), lg, temp, top_p, top_k=0,
                                                           greedy=greedy, nucleus=False))
        return lambda i: f(np.int32(i), logits, temperature, one)

    def generate(i):
        out = sampling.generate(config, params, prompts, mask, jax.random.PRNGKey(i), max_new_tokens=t, num_samples=1,
                                temperature=1.0, top_k=0, top_p=1.0, eos_ids=[v - 1], pad_id=0)
        longest = int(np.asarray(out.lengths).max())
        if longest != t:  # the loop exits early only when every row drew the EOS: then it did less work
            raise RuntimeError(f"the sampler stopped after {longest} of {t} steps")
        return out

    noop = jax.jit(lambda x: x + 1)
    fns = {"layers": layers, "lm_head": lambda i: head(params, hidden), "draw": drawer(False),
           "greedy": drawer(True), "generate": generate, "prefill": lambda i: prefill_fn(params, prompts, mask),
           "dispatch": lambda i: noop(token)}
    if new:  # the primitives side by side, in one process
        categorical = jax.jit(lambda i, lg: jax.random.categorical(jax.random.fold_in(key, i), lg, axis=-1))
        inverse_cdf = jax.jit(lambda i, lg: sampling.categorical(jax.random.fold_in(key, i), lg))
        pair_argmax = jax.jit(lambda lg: jnp.argmax(lg, axis=-1))
        single_argmax = jax.jit(sampling.argmax)
        fns.update({"prim_categorical": lambda i: categorical(np.int32(i), logits),
                    "prim_inverse_cdf": lambda i: inverse_cdf(np.int32(i), logits),
                    "prim_argmax": lambda i: pair_argmax(logits), "prim_single_argmax": lambda i: single_argmax(logits)})
    fns["_check"] = lambda: (generate(0), steps())
    return fns, {"package": os.path.dirname(jaxrl_llm.__file__), "new": new}


def worker_main(ns) -> None:
    """Serves the coordinator: one JSON request per stdin line, one reply per stdout line (see Worker)."""
    def reply(obj):
        sys.stdout.write(REPLY + json.dumps(obj) + "\n")
        sys.stdout.flush()

    fns, info = _worker_functions(ns)
    reply({"ready": True, **info, "functions": sorted(fns)})
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "quit":
            return
        if req["cmd"] == "time":
            fn, times = fns[req["name"]], []
            for c in range(req["calls"]):
                t0 = time.perf_counter()
                block(fn(req["i"] * req["calls"] + c))
                times.append(time.perf_counter() - t0)
            reply({"seconds": times})
        elif req["cmd"] == "check":  # outputs, not times: a rollout and the decode step's hidden states
            import numpy as np
            rollout, hidden = fns["_check"]()
            np.savez(req["path"], hidden=np.asarray(hidden),
                     **{k: np.asarray(getattr(rollout, k)) for k in ("tokens", "logprobs", "mask")})
            reply({"path": req["path"]})
        else:
            raise ValueError(f"unknown worker command {req['cmd']!r}")


def _rollout(path, prompts, mask):
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_llm.sampling import Rollout
    d = np.load(path)
    mask_out = jnp.asarray(d["mask"])
    logprobs = jnp.asarray(d["logprobs"])  # sampled without top-k/top-p: the behaviour log-probs are these
    return Rollout(tokens=jnp.asarray(d["tokens"]), logprobs=logprobs, behavior_logprobs=logprobs, mask=mask_out,
                   lengths=mask_out.sum(-1), truncated=jnp.zeros(mask_out.shape[0], bool),
                   prompt_tokens=jnp.asarray(prompts), prompt_mask=jnp.asarray(mask))


def profile_size(size, args, old_src, before_each, log) -> dict:
    import numpy as np

    from harness.sampling import logp_gap
    b, p, t = args.batch, args.prompt_len, args.new_tokens
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "checkpoint")
        _, config, params = build_models(ckpt, size, max_positions=max(256, p + t))
        log(f"\n== {size.name}: {config.num_params() / 1e6:.2f}M parameters (vocab {config.vocab_size}, hidden "
            f"{config.hidden_size}, {config.num_layers} layers, {config.num_heads}/{config.num_kv_heads} heads, "
            f"mlp {config.intermediate_size}); N = {b} rows, prompt {p}, cache {t} slots")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--checkpoint", ckpt, "--batch", str(args.batch),
               "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens)]
        workers = {"old": Worker("old", old_src, [*cmd, "--src", old_src], tmp),
                   "new": Worker("new", ROOT, [*cmd, "--src", ROOT], tmp)}
        try:
            for label, w in workers.items():
                info = w.ready()  # the worker itself checks that it imported the package it was given
                log(f"{label} code: {info['package']}")
            old, new = workers["old"], workers["new"]
            k = args.calls
            calls = {}
            for stage in ("layers", "lm_head", "draw", "greedy", "dispatch"):
                calls[f"old.{stage}"], calls[f"new.{stage}"] = (old, stage, k), (new, stage, k)
            for prim in ("categorical", "inverse_cdf", "argmax", "single_argmax"):
                calls[f"prim.{prim}"] = (new, f"prim_{prim}", k)
            for e2e in ("generate", "prefill"):
                calls[f"old.{e2e}"], calls[f"new.{e2e}"] = (old, e2e, 1), (new, e2e, 1)
            times = time_remote(calls, repeats=args.repeats, before_each=before_each)

            rng = np.random.default_rng(0)  # the workers' prompts
            prompts = rng.integers(1, config.vocab_size - 1, (b, p)).astype(np.int32)
            mask = np.ones((b, p), np.int32)
            gaps, hidden = {}, {}
            for label, w in workers.items():
                path = os.path.join(tmp, f"{label}.npz")
                w.request(cmd="check", path=path)
                gaps[label] = logp_gap(config, params, _rollout(path, prompts, mask))
                hidden[label] = np.load(path)["hidden"]
        finally:
            for w in workers.values():
                w.close()

    ms = lambda name: times[name].median * 1e3
    r = dict(name=size.name, params=config.num_params(), times=times, gaps=gaps,
             step_diff=float(np.abs(hidden["old"] - hidden["new"]).max()))
    for label in ("old", "new"):
        r[f"{label}.step"] = (ms(f"{label}.generate") - ms(f"{label}.prefill")) / (t - 1)
        r[f"{label}.stages"] = sum(ms(f"{label}.{s}") for s, _ in STAGES)
    log(f"{'ms per call':24s} {'before':>9s} {'after':>9s} {'speed-up':>9s}")
    for key, label in (*STAGES, ("greedy", "draw (greedy)"), ("dispatch", "jitted no-op (floor)")):
        log(f"{label:24s} {ms('old.' + key):9.3f} {ms('new.' + key):9.3f} {ms('old.' + key) / ms('new.' + key):8.2f}x")
    log(f"{'sum of the 3 stages':24s} {r['old.stages']:9.3f} {r['new.stages']:9.3f} "
        f"{r['old.stages'] / r['new.stages']:8.2f}x")
    log(f"{'step inside generate':24s} {r['old.step']:9.3f} {r['new.step']:9.3f} {r['old.step'] / r['new.step']:8.2f}x")
    log(f"{'generate (whole call)':24s} {ms('old.generate'):9.1f} {ms('new.generate'):9.1f} "
        f"{ms('old.generate') / ms('new.generate'):8.2f}x   (first call {times['old.generate'].first:.1f} s / "
        f"{times['new.generate'].first:.1f} s)")
    log(f"primitives: categorical {ms('prim.categorical'):.3f} ms, categorical {ms('prim.inverse_cdf'):.3f} ms; "
        f"argmax {ms('prim.argmax'):.3f} ms, argmax {ms('prim.single_argmax'):.3f} ms")
    log(f"log-probs vs the trainer: max |diff| old {gaps['old']:.1e}, new {gaps['new']:.1e}; hidden states after "
        f"{t - 1} decode steps, old vs new: max |diff| {r['step_diff']:.1e}")
    return r


def report(results, args, image: str | None) -> str:
    ms = lambda r, name: r["times"][name].median * 1e3
    speed = lambda a, b: f"{a / b:.2f}x"
    rows = []
    for r in results:
        for key, label in (*STAGES, ("greedy", "draw (greedy)")):
            rows.append([r["name"], label, ms(r, f"old.{key}"), ms(r, f"new.{key}"),
                         speed(ms(r, f"old.{key}"), ms(r, f"new.{key}"))])
        rows.append([r["name"], "sum of the three stages", r["old.stages"], r["new.stages"],
                     speed(r["old.stages"], r["new.stages"])])
        rows.append([r["name"], "**step inside `generate`**", r["old.step"], r["new.step"],
                     f"**{speed(r['old.step'], r['new.step'])}**"])
        rows.append([r["name"], "jitted no-op (dispatch floor)", ms(r, "old.dispatch"), ms(r, "new.dispatch"), ""])
    stages = markdown_table(["model", "stage (ms per call)", "before", "after", "speed-up"], rows)
    prims = markdown_table(
        ["model", "`jax.random.categorical`", "`categorical`", "speed-up", "`jnp.argmax`", "`argmax`", "speed-up"],
        [[r["name"], ms(r, "prim.categorical"), ms(r, "prim.inverse_cdf"),
          speed(ms(r, "prim.categorical"), ms(r, "prim.inverse_cdf")), ms(r, "prim.argmax"),
          ms(r, "prim.single_argmax"), speed(ms(r, "prim.argmax"), ms(r, "prim.single_argmax"))] for r in results])
    e2e = markdown_table(
        ["model", "params", "before ms", "after ms", "speed-up", "before ms/step", "after ms/step", "step speed-up",
         "prefill ms before / after", "first call s before / after", "logp gap before / after",
         "step old vs new"],
        [[r["name"], f"{r['params'] / 1e6:.2f}M", ms(r, "old.generate"), ms(r, "new.generate"),
          f"**{speed(ms(r, 'old.generate'), ms(r, 'new.generate'))}**", r["old.step"], r["new.step"],
          speed(r["old.step"], r["new.step"]), f"{ms(r, 'old.prefill'):.3g} / {ms(r, 'new.prefill'):.3g}",
          f"{r['times']['old.generate'].first:.3g} / {r['times']['new.generate'].first:.3g}",
          f"{r['gaps']['old']:.0e} / {r['gaps']['new']:.0e}", f"{r['step_diff']:.0e}"] for r in results])
    b, p, t = args.batch, args.prompt_len, args.new_tokens
    text = (f"Machine: {machine_description()}.\n\n"
            f"Before: revision {args.old_rev}{' (the parent of fab7559)' if args.old_rev == OLD_REV else ''}; "
            f"after: this checkout. Same checkpoint, same "
            f"prompts; {b} rows, {p}-token prompts, {t} new tokens (a {t}-slot cache), float32, sampling at "
            f"temperature 1 from the full vocabulary. Old and new code run in two worker processes that take "
            f"turns call by call; median of {args.repeats} rounds, a stage's sample being the median of "
            f"{args.calls} calls{' taken when the machine was idle' if args.wait_idle else ''}. Stages are jitted "
            f"and timed alone (each call includes one Python dispatch, whose floor is the no-op row); the step "
            f"inside `generate` is (generate - prefill) / {t - 1}, where the stages run fused in the loop (it also "
            f"carries the first token's draw and the loop's set-up, spread over the steps). With at most "
            f"`DECODE_UNROLL_MAX_LAYERS` layers, as here, the new step unrolls its layers; deeper models take "
            f"its scanned path, not profiled here.\n\n"
            f"Stages of one decode step:\n\n{stages}\n\n"
            f"Drawing primitives on the same ({b}, V) logits:\n\n{prims}\n\n"
            f"End to end, `generate` of {b} x ({p} + {t}) tokens (logp gap: max |sampler log-prob - trainer "
            f"`token_logprobs`| over the rollout, each code's sampled rollout against this checkout's trainer; step old "
            f"vs new: max |difference| of the hidden states that old and new decode steps compute from the same "
            f"prompts after {t - 1} steps):\n\n{e2e}\n")
    if image:
        text += f"\n![ms per decode step by stage, before and after]({image})\n"
    return text


def plot(results, path: str, old_rev: str = OLD_REV) -> None:
    """Stacked bars of ms per call of the three stages, before and after, one panel per model size; the
    black tick is the step as measured inside `generate`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"layers": "#4c72b0", "lm_head": "#dd8452", "draw": "#55a868"}
    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 4.2), squeeze=False)
    for ax, r in zip(axes[0], results):
        for x, label in enumerate(("old", "new")):
            bottom = 0.0
            for key, name in STAGES:
                h = r["times"][f"{label}.{key}"].median * 1e3
                ax.bar(x, h, 0.6, bottom=bottom, color=colors[key], label=name if x == 0 else None)
                bottom += h
            ax.plot([x - 0.36, x + 0.36], [r[f"{label}.step"]] * 2, color="black", lw=2,
                    label="step inside generate" if x == 0 else None)
        ax.set_xticks([0, 1], [f"before\n({old_rev})", "after"])
        ax.set_ylabel("ms per decode step")
        ax.set_title(f"{r['name']} ({r['params'] / 1e6:.2g}M params): step "
                     f"{r['old.step'] / r['new.step']:.2g}x faster", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="3M,30M", help="comma-separated sizes of benchmarks/sampler.py")
    ap.add_argument("--batch", type=int, default=64, help="rows N (prompts, G=1)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64, help="T: new tokens, i.e. slots of the cache")
    ap.add_argument("--old-rev", default=OLD_REV, help="git revision of the 'before' code (default: the parent "
                    "of the sampler rewrite fab7559)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds (after one warm-up round)")
    ap.add_argument("--calls", type=int, default=10, help="back-to-back calls per stage per round")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                    help="before each timed request, wait up to this long for the machine to be idle")
    ap.add_argument("--toy", action="store_true", help="tiny model and batch, 1 round (smoke test)")
    ap.add_argument("--out", default=None, help="markdown file whose sampler-profile block is refreshed")
    ap.add_argument("--block", default="sampler-profile-results",
                    help="key of the markers in --out between which the results are written")
    ap.add_argument("--plot", default=None,
                    help="PNG of the stage breakdown (default with --out: sampler_profile.png next to it)")
    # worker mode (internal): serve timing requests against the package under --src
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--src", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        if not (args.src and args.checkpoint):
            raise SystemExit("--worker needs --src and --checkpoint")
        return worker_main(args)
    if args.toy:
        args.sizes, args.batch, args.prompt_len, args.new_tokens, args.repeats, args.calls = "toy", 4, 8, 6, 1, 2
    from harness.shapes import SIZES
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise SystemExit(f"--sizes: unknown {unknown}; expected some of {', '.join(SIZES)}")
    for name in ("batch", "prompt_len", "repeats", "calls"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.new_tokens < 2:
        raise SystemExit(f"--new-tokens must be >= 2 (one decode step at least), got {args.new_tokens}")
    plot_path = args.plot or (os.path.join(os.path.dirname(os.path.abspath(args.out)), "sampler_profile.png")
                              if args.out else None)
    before_each = (lambda: wait_for_idle(timeout=args.wait_idle)) if args.wait_idle > 0 else None

    print(machine_description())
    with tempfile.TemporaryDirectory() as tmp:
        old_src = extract_package(os.path.join(tmp, "old"), args.old_rev)
        results = [profile_size(SIZES[s], args, old_src, before_each, print) for s in sizes]
    if plot_path:
        plot(results, plot_path, args.old_rev)
        print(f"wrote {plot_path}")
    image = None
    if plot_path and args.out:
        image = os.path.relpath(os.path.abspath(plot_path), os.path.dirname(os.path.abspath(args.out)))
    text = report(results, args, image)
    print("\n" + text)
    if args.out:
        update_markdown(args.out, args.block, text)
        print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
