"""Checkpoint load time: `jaxrl_llm.models.load_hf` against transformers `from_pretrained` on the same
random ~100M-parameter Qwen2 checkpoint, single-file and sharded, side by side.

    python benchmarks/load_time.py                          # ~100M parameters, float32 and bfloat16
    python benchmarks/load_time.py --out docs/benchmarks.md # also refresh the results block of the doc
    python benchmarks/load_time.py --toy                    # seconds: keeps the script from rotting (tests)

What is timed: from the directory on disk to parameters in memory, ready to use (jax arrays blocked on;
torch in eval mode, every tensor read once, since transformers can leave them memory-mapped and unread). The page cache is warm for both (each library loads the files once untimed first),
so the numbers are the libraries' own cost, not the disk's. The peak resident memory growth of one load
in a fresh subprocess is reported too: a load that reads tensors one at a time, memory-mapped, grows by
about the parameters' size, not by twice it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {
    # 16k vocab x 768 (embedding + untied head: 24.6M) + 12 layers x 6.3M = 100M parameters.
    "100M": dict(vocab_size=16000, hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12,
                 num_kv_heads=4),
    "toy": dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2),
}


def save_checkpoint(path: str, size: dict, max_shard_size: str | None) -> int:
    """A random Qwen2 saved by transformers at `path` (sharded when `max_shard_size`); returns its size."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config
    cfg = Qwen2Config(vocab_size=size["vocab_size"], hidden_size=size["hidden_size"],
                      intermediate_size=size["intermediate_size"], num_hidden_layers=size["num_layers"],
                      num_attention_heads=size["num_heads"], num_key_value_heads=size["num_kv_heads"],
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    return sum(p.numel() for p in model.parameters())


def load_once(library: str, path: str, dtype: str) -> float:
    """Seconds of one load of `path` by `library` ('jaxrl_llm' or 'transformers') in `dtype`."""
    t0 = time.perf_counter()
    if library == "jaxrl_llm":
        import jax
        import jax.numpy as jnp

        from jaxrl_llm.models import load_hf
        _, params = load_hf(path, getattr(jnp, dtype))
        jax.block_until_ready(params)
    else:
        import torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        # transformers may leave float32 tensors memory-mapped, unread: reading every one (a sum) makes
        # them resident, as ours are when load_hf returns.
        with torch.no_grad():
            for p in model.parameters():
                p.sum()
    return time.perf_counter() - t0


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _measure_growth(library: str, path: str, dtype: str) -> None:
    """In a fresh process: resets the peak-RSS mark (Linux /proc/self/clear_refs), loads once, prints the
    peak resident bytes during the load minus the resident bytes before it."""
    import jax  # noqa: F401 - imported before the mark, with the libraries the load uses
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import jaxrl_llm.models  # noqa: F401
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kib("VmRSS")
    load_once(library, path, dtype)
    print((_status_kib("VmHWM") - before) * 1024)


def peak_rss_growth(library: str, path: str, dtype: str) -> float:
    """Peak resident memory growth (bytes) of one load in a fresh process, over its state just before."""
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import load_time; "
            f"load_time._measure_growth({library!r}, {path!r}, {dtype!r})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=list(SIZES), default="100M")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-rss", action="store_true", help="skip the peak-memory loads (a fresh process each)")
    ap.add_argument("--toy", action="store_true", help="toy model, 1 repeat, float32, no memory loads (smoke test)")
    ap.add_argument("--out", default="", help="markdown file whose load-time block is rewritten")
    args = ap.parse_args(argv)
    if args.toy:
        args.size, args.repeats, args.dtypes, args.no_rss = "toy", 1, "float32", True
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
    sys.path.insert(0, HERE)
    from harness.report import machine_description, markdown_table, update_markdown
    from harness.timing import time_interleaved

    rows, results = [], []
    with tempfile.TemporaryDirectory(prefix="load-bench-") as tmp:
        layouts = {"one file": None, "sharded": "20MB" if not args.toy else "20KB"}
        for layout, shard in layouts.items():
            path = os.path.join(tmp, layout.replace(" ", "_"))
            n = save_checkpoint(path, SIZES[args.size], shard)
            files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
            nbytes = sum(os.path.getsize(os.path.join(path, f)) for f in files)
            for dtype in args.dtypes.split(","):
                fns = {lib: (lambda i, lib=lib: load_once(lib, path, dtype)) for lib in ("jaxrl_llm", "transformers")}
                t = time_interleaved(fns, repeats=args.repeats, warmup=1)
                mem = {lib: float("nan") if args.no_rss else peak_rss_growth(lib, path, dtype) for lib in fns}
                ratio = t["transformers"].median / t["jaxrl_llm"].median
                rows.append([layout, len(files), dtype, t["jaxrl_llm"].median, t["transformers"].median, ratio,
                             mem["jaxrl_llm"] / 2 ** 20, mem["transformers"] / 2 ** 20])
                results.append(dict(layout=layout, files=len(files), dtype=dtype, ours_s=t["jaxrl_llm"].median,
                                    hf_s=t["transformers"].median, ours_rss=mem["jaxrl_llm"], hf_rss=mem["transformers"]))
                print(f"{layout:8s} ({len(files)} files, {nbytes / 2 ** 20:.0f} MiB) {dtype:8s}: jaxrl_llm "
                      f"{t['jaxrl_llm'].median:.2f} s, transformers {t['transformers'].median:.2f} s "
                      f"({ratio:.2f}x); peak RSS growth {mem['jaxrl_llm'] / 2 ** 20:.0f} / "
                      f"{mem['transformers'] / 2 ** 20:.0f} MiB", flush=True)
    table = markdown_table(["checkpoint", "files", "dtype", "load_hf s", "from_pretrained + read s",
                            "from_pretrained / load_hf", "load_hf peak RSS MiB", "from_pretrained peak RSS MiB"], rows)
    text = (f"Machine: {machine_description()}.\n\nA random Qwen2 of {n / 1e6:.1f}M parameters saved by "
            f"transformers in float32 ({nbytes / 2 ** 20:.0f} MiB), loaded as {' and as '.join(args.dtypes.split(','))}; median "
            f"of {args.repeats} alternating loads with a warm page cache; peak RSS: growth of one load in a fresh "
            f"process.\n\n{table}\n")
    print("\n" + text)
    print(json.dumps(results))
    if args.out:
        update_markdown(args.out, "load-time-results", text)
    return results


if __name__ == "__main__":
    main()
