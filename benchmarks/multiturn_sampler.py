"""Multi-turn episodes: our multi-turn sampler (`sampling.turns`: one KV cache per row across turns, each
observation prefilled into it) against re-prefilling every turn, the way a loop of single-turn
`generate` calls runs an episode (our own sampler, and transformers `generate`, as TRL's multi-turn
rollouts call it). Same weights, same prompts, same observations, side by side.

    python benchmarks/multiturn_sampler.py                           # 3M model, 16 rows, 4 turns of 64 + 32
    python benchmarks/multiturn_sampler.py --out docs/benchmarks.md  # also refresh the doc's results block
    python benchmarks/multiturn_sampler.py --toy                     # seconds: keeps the script from rotting

An episode: a P-token prompt, then K turns of up to T model tokens (sampled at temperature 1 from the
full distribution; the stop id is the last of the vocabulary, drawn with probability ~1/V, so turns run
to their budget) each followed by an O-token observation (random ids, the same for every side). Every
side decodes the same token counts; model tokens/s = the model tokens of the timed calls over their time.
Calls alternate (`harness.timing.time_interleaved`); the first call (compilation) is excluded. transformers runs
at each `--threads` count and the ratio is taken against its fastest.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.peers import hf_with_threads  # noqa: E402
from harness.report import machine_description, markdown_table, update_markdown  # noqa: E402
from harness.shapes import SIZES, build_models  # noqa: E402
from harness.timing import time_interleaved  # noqa: E402

from jaxrl_llm.data.padding import left_pad  # noqa: E402
from jaxrl_llm.models import token_logprobs  # noqa: E402
from jaxrl_llm.sampling import generate, turns  # noqa: E402


def kv_episodes(config, params, prompts, observations, t, seed):
    """Our multi-turn sampler: (N, rows of [turn ; observation]*K ids, log-probs of the model tokens)."""
    n, p = prompts.shape
    k = len(observations)
    ep = turns.start(config, params, prompts, np.ones_like(prompts), capacity=k * (t + observations.shape[2]))
    stop, rng, seqs, logps = config.vocab_size - 1, jax.random.PRNGKey(seed), [[] for _ in range(n)], []
    for turn in range(k):
        ep, out = turns.decode_turn(config, params, ep, rng, np.full(n, t), max_tokens=t, stop_ids=[stop])
        counts, tokens = np.asarray(out.count), np.asarray(out.tokens)
        logps.append([np.asarray(out.logprobs)[i, :counts[i]] for i in range(n)])
        for i in range(n):
            seqs[i] += tokens[i, :counts[i]].tolist() + observations[turn, i].tolist()
        if turn < k - 1:
            ep = turns.append(config, params, ep, list(observations[turn]))
    return seqs, logps


def reprefill_episodes(config, params, prompts, observations, t, seed):
    """A loop of single-turn `generate` calls: each turn prefills the whole sequence so far."""
    n, k, o = prompts.shape[0], len(observations), observations.shape[2]
    width = prompts.shape[1] + (k - 1) * (t + o)  # the longest sequence a turn starts from
    seqs = [[] for _ in range(n)]
    for turn in range(k):
        tokens, mask = left_pad([list(prompts[i]) + seqs[i] for i in range(n)], width, 0)
        r = generate(config, params, tokens, mask, jax.random.fold_in(jax.random.PRNGKey(seed), turn), max_new_tokens=t,
                     temperature=1.0, eos_ids=[config.vocab_size - 1], pad_id=0)
        lengths, out = np.asarray(r.lengths), np.asarray(r.tokens)
        for i in range(n):
            seqs[i] += out[i, :lengths[i]].tolist() + observations[turn, i].tolist()
    return seqs


def hf_episodes(hf, prompts, observations, t, seed, vocab):
    """transformers `generate` per turn on the whole sequence so far (no cache kept across turns)."""
    import torch
    torch.manual_seed(seed)
    ids = torch.as_tensor(prompts, dtype=torch.long)
    with torch.inference_mode():
        for turn in range(len(observations)):
            out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                              top_k=0, top_p=1.0, max_new_tokens=t, min_new_tokens=t, pad_token_id=0,
                              eos_token_id=vocab - 1)
            ids = torch.cat([out, torch.as_tensor(observations[turn], dtype=torch.long)], 1)
    return ids


def logp_gap(config, params, prompts, seqs, logps, o) -> float:
    """Max |multi-turn sampler log-prob - trainer teacher-forced log-prob| over the model tokens."""
    p, width = prompts.shape[1], max(map(len, seqs))
    full = np.zeros((len(seqs), p + width), np.int32)
    mask = np.zeros_like(full)
    for i, s in enumerate(seqs):  # right-padded: positions come from the mask
        full[i, :p + len(s)], mask[i, :p + len(s)] = list(prompts[i]) + s, 1
    ref = np.asarray(token_logprobs(config, params, full[:, :-1], mask[:, :-1], full[:, 1:]))
    gap = 0.0
    for i in range(len(seqs)):
        at = p - 1  # ref[i, at + j] predicts the episode's token j
        for turn in logps:
            lp = turn[i]
            gap = max(gap, float(np.abs(ref[i, at:at + len(lp)] - lp).max(initial=0.0)))
            at += len(lp) + o
    return gap


def run(args, log=print) -> dict:
    size = SIZES[args.size]
    n, p, k, t, o = args.rows, args.prompt_len, args.turns, args.turn_tokens, args.obs_tokens
    with tempfile.TemporaryDirectory() as tmp:
        hf, config, params = build_models(tmp, size, max_positions=max(256, p + k * (t + o)))
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, config.vocab_size - 1, (n, p)).astype(np.int32)
    observations = rng.integers(1, config.vocab_size - 1, (k, n, o)).astype(np.int32)
    log(f"{size.name}: {config.num_params() / 1e6:.2f}M parameters; {n} rows, {p}-token prompts, {k} turns of "
        f"{t} model + {o} observation tokens")
    made: dict[str, dict[int, int]] = {}

    def counted(name, fn, model_tokens):
        def call(i):
            out = fn(i)
            made.setdefault(name, {})[i] = model_tokens(out)
            return out
        return call

    kv_tokens = lambda out: sum(len(x) for turn in out[1] for x in turn)
    fixed = lambda out: n * k * t  # the re-prefill sides run every turn to its budget (min_new_tokens for HF)
    fns = {"ours multi-turn (KV cache)": counted("ours multi-turn (KV cache)", lambda i: kv_episodes(
               config, params, prompts, observations, t, i), kv_tokens),
           "ours re-prefill per turn": counted("ours re-prefill per turn", lambda i: reprefill_episodes(
               config, params, prompts, observations, t, i), fixed),
           **{f"hf{thr}": counted(f"hf{thr}", hf_with_threads(thr, lambda i: hf_episodes(
               hf, prompts, observations, t, i, config.vocab_size)), fixed) for thr in args.threads}}
    times = time_interleaved(fns, repeats=args.repeats)
    best = min((name for name in fns if name.startswith("hf")), key=lambda name: times[name].median)
    timed = range(1, 1 + args.repeats)
    rows = {}
    for name in ("ours multi-turn (KV cache)", "ours re-prefill per turn", best):
        label = "transformers re-prefill per turn" if name == best else name
        rows[label] = dict(s=times[name].median, first=times[name].first,
                           tps=sum(made[name][i] for i in timed) / sum(times[name].runs))
    base_hf, base_re = rows["transformers re-prefill per turn"]["tps"], rows["ours re-prefill per turn"]["tps"]
    for name, r in rows.items():
        r["vs_hf"], r["vs_reprefill"] = r["tps"] / base_hf, r["tps"] / base_re
        log(f"{name:34s}: {r['s'] * 1e3:8.0f} ms  {r['tps']:8.0f} model tok/s  {r['vs_hf']:.2f}x transformers  "
            f"{r['vs_reprefill']:.2f}x re-prefill")
    gap = logp_gap(config, params, prompts, *kv_episodes(config, params, prompts, observations, t, 0), o)
    return dict(rows=rows, gap=gap, hf_threads=int(best[2:]), params=config.num_params(), size=size.name)


def report(result, args) -> str:
    n, p, k, t, o = args.rows, args.prompt_len, args.turns, args.turn_tokens, args.obs_tokens
    table = markdown_table(
        ["episodes", "ms per call", "model tok/s", "vs transformers", "vs re-prefill", "first call s"],
        [[name + (f" ({result['hf_threads']} thr)" if name.startswith("transformers") else ""), r["s"] * 1e3,
          r["tps"], f"**{r['vs_hf']:.2f}x**", f"{r['vs_reprefill']:.2f}x", r["first"]]
         for name, r in result["rows"].items()])
    return (f"Machine: {machine_description()}.\n\n{result['size']} model ({result['params'] / 1e6:.2f}M "
            f"parameters), {n} episodes of a {p}-token prompt then {k} turns of {t} model tokens (temperature "
            f"1, float32) each followed by a {o}-token observation; {args.repeats} timed calls each, "
            f"alternating. Log-prob gap of the multi-turn sampler against the trainer's teacher-forced "
            f"`token_logprobs` over the episodes' model tokens: {result['gap']:.0e}.\n\n{table}\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="3M", choices=sorted(SIZES))
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=64)
    ap.add_argument("--obs-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", default=f"{os.cpu_count()},1", help="torch thread counts; the fastest is compared")
    ap.add_argument("--toy", action="store_true", help="tiny model and batch, 1 repeat (smoke test)")
    ap.add_argument("--out", default=None, help="markdown file whose multiturn-sampler results block is refreshed")
    args = ap.parse_args(argv)
    if args.toy:
        args.size, args.rows, args.prompt_len, args.turns, args.turn_tokens, args.obs_tokens, args.repeats = (
            "toy", 2, 8, 2, 6, 3, 1)
        args.threads = "1"
    args.threads = sorted({int(x) for x in args.threads.split(",")}, reverse=True)
    import torch
    torch.set_num_threads(args.threads[0])
    result = run(args)
    text = report(result, args)
    print("\n" + text)
    if args.out:
        update_markdown(args.out, "multiturn-sampler-results", text)
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
