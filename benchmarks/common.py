"""Shared helpers of the benchmark scripts: timing, the measured matmul peak, same-weight HF + JAX models,
tables, and the markdown results file.

Benchmarks are scripts, never timed tests: everything here measures and prints, nothing asserts on time.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import re
import statistics
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp


# ------------------------------------------------------------------------------------------- timing
def block(x: Any) -> Any:
    """Waits for every jax array in the pytree `x` (no-op on torch tensors and Python values)."""
    for leaf in jax.tree_util.tree_leaves(x):
        if isinstance(leaf, jax.Array):
            leaf.block_until_ready()
    return x


@dataclasses.dataclass(frozen=True)
class Timing:
    """Wall-clock seconds: `first` is the first call (compile + run for jitted code), `runs` the repeats."""

    first: float
    runs: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def spread(self) -> float:
        """(max - min) / median of the repeats: how noisy the machine was during the measurement."""
        return (max(self.runs) - min(self.runs)) / self.median

    @property
    def warmup(self) -> float:
        """The first call's extra cost over a steady-state call (compilation, caches, allocator)."""
        return max(self.first - self.median, 0.0)


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def wait_for_idle(max_busy: float = 0.15, window: float = 0.5, timeout: float = 120.0) -> float:
    """Waits until the whole machine was at most `max_busy` busy over the last `window` seconds (other
    processes of a shared machine), or `timeout` passed. Returns the busy fraction last seen. Without
    /proc/stat (not Linux) it returns at once with NaN. Call it only when this process is idle."""
    if not os.path.exists("/proc/stat"):
        return float("nan")
    deadline = time.monotonic() + timeout
    while True:
        b0, t0 = _cpu_times()
        time.sleep(window)
        b1, t1 = _cpu_times()
        busy = (b1 - b0) / max(t1 - t0, 1e-9)
        if busy <= max_busy or time.monotonic() > deadline:
            return busy


def time_fn(fn: Callable[[int], Any], *, repeats: int, warmup: int = 1) -> Timing:
    """Times `fn(i)` (i = call index, e.g. to vary the seed): `warmup` calls, then `repeats` timed ones.
    Every call is synchronized with `block`, so asynchronous dispatch is not timed as done work."""
    return time_interleaved({"fn": fn}, repeats=repeats, warmup=warmup)["fn"]


def time_interleaved(fns: dict[str, Callable[[int], Any]], *, repeats: int, warmup: int = 1,
                     before_each: Callable[[], Any] | None = None) -> dict[str, Timing]:
    """Times several functions side by side: each round runs every function once, so a change of load on
    a shared machine hits all of them alike instead of whichever happened to run last. Returns a Timing
    per name; `first` is each function's first call (compilation included for jitted code).
    `before_each` (e.g. `wait_for_idle`) runs untimed before every call."""
    if repeats < 1 or warmup < 1:
        raise ValueError(f"repeats and warmup must be >= 1, got repeats={repeats}, warmup={warmup}")
    first: dict[str, float] = {}
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(warmup + repeats):
        for name, fn in fns.items():
            if before_each is not None:
                before_each()
            t0 = time.perf_counter()
            block(fn(i))
            dt = time.perf_counter() - t0
            if i == 0:
                first[name] = dt
            elif i >= warmup:
                runs[name].append(dt)
    return {name: Timing(first=first[name], runs=tuple(runs[name])) for name in fns}


def matmul_peak_flops(n: int = 2048, repeats: int = 10, dtype=jnp.float32, precision=None) -> float:
    """Measured FLOP/s of a jitted n x n matmul (2 n^3 FLOPs) of `dtype` on the default device, on random
    data (zeros run faster), at `precision` (None: XLA's default): the roofline's compute peak on this
    machine, in the same process and thread settings as the benchmark."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
    matmul = jax.jit(lambda x, y: jnp.dot(x, y, precision=precision))
    timing = time_fn(lambda i: matmul(a, b), repeats=repeats, warmup=2)
    return 2.0 * n ** 3 / min(timing.runs)  # best run: the peak, not the load of a shared machine


# ------------------------------------------------------------------------------------------- models
@dataclasses.dataclass(frozen=True)
class ModelSize:
    """Dimensions of a benchmark decoder (Qwen2-style: GQA, q/k/v biases, untied LM head)."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    model_type: str = "qwen2"
    tie_word_embeddings: bool = False


def build_models(path: str, size: ModelSize, *, seed: int = 0, max_positions: int = 1024):
    """Saves a random transformers model of `size` to `path` and loads the same weights into JAX.

    The HF config has no EOS token (so `generate` runs every row to max_new_tokens) and pad id 0.
    Returns (torch model in eval mode, float32; jaxrl_llm ModelConfig; params).
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from jaxrl_llm.models import load_hf

    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[size.model_type]
    cfg = cls(vocab_size=size.vocab_size, hidden_size=size.hidden_size, intermediate_size=size.intermediate_size,
              num_hidden_layers=size.num_layers, num_attention_heads=size.num_heads,
              num_key_value_heads=size.num_kv_heads, max_position_embeddings=max_positions,
              tie_word_embeddings=size.tie_word_embeddings, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        # Larger weights than HF's init so the sampled distribution is far from uniform, as in a trained LM.
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.05 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(path)
    config, params = load_hf(path)
    n_torch = sum(p.numel() for p in model.parameters())
    if n_torch != config.num_params():
        raise RuntimeError(f"parameter count mismatch: transformers {n_torch} vs jaxrl_llm {config.num_params()}")
    return model, config, params


# -------------------------------------------------------------------------------------------- output
def machine_description() -> str:
    """One line: CPU model, core count, load average, library versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import flax
    import torch
    import transformers
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{cpu}, {os.cpu_count()} cores, load average {load}; jax {jax.__version__} "
            f"({jax.default_backend()}), flax {flax.__version__}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; floats keep 3 significant digits."""
    def fmt(x):
        if isinstance(x, float):
            return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"
        return str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def update_markdown(path: str, key: str, body: str) -> None:
    """Writes `body` between the markers `<!-- key:begin -->` and `<!-- key:end -->` of `path`, replacing
    what a previous run wrote there and keeping the hand-written text around it. Without the markers the
    block is appended at the end of the file (created if missing)."""
    if not re.fullmatch(r"[\w.-]+", key):
        raise ValueError(f"key must be letters, digits, '_', '.' or '-', got {key!r}")
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    block_text = f"{begin}\n<!-- written by the benchmark script on {stamp}; rerun it to refresh -->\n{body.strip()}\n{end}"
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block_text, text, count=1)
    else:
        text = (text.rstrip() + "\n\n" if text.strip() else "") + block_text + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
