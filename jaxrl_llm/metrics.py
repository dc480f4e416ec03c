"""Metric sinks of a run: `metrics.jsonl` (one line per step), TensorBoard (tensorboardX), `samples.jsonl`
(prompt/completion/reward triples, also as TensorBoard text), and a PNG of the curves at the end.

Only process 0 writes. On resume from step s, lines of later steps (logged after the last checkpoint,
before a crash) are dropped from the JSONL files and TensorBoard purges its later events, so every
file reads as one uninterrupted run.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np

# Dense bf16 peak FLOP/s per chip by `device_kind`; CPU: the measured float32 matmul peak of our machine.
PEAK_FLOPS = {
    "cpu": 340e9,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "NVIDIA H100": 989e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100": 312e12,
}


def peak_flops(device) -> float:
    """Per-device peak FLOP/s for MFU; longest matching prefix of the device kind, CPU fallback."""
    kind = getattr(device, "device_kind", "cpu")
    if device.platform == "cpu":
        return PEAK_FLOPS["cpu"]
    matches = [k for k in PEAK_FLOPS if kind.startswith(k)]
    return PEAK_FLOPS[max(matches, key=len)] if matches else float("nan")


def flops_per_token(config, context: float, *, lm_head: bool = True) -> float:
    """Forward FLOPs of one token attending to `context` tokens: 2 per weight + attention scores/values."""
    c = config
    attn_w = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
    mlp_w = 3 * c.hidden_size * c.intermediate_size
    weights = c.num_layers * (attn_w + mlp_w) + (c.hidden_size * c.vocab_size if lm_head else 0)
    attention = c.num_layers * 4 * c.num_heads * c.head_dim * context
    return 2.0 * weights + attention


def _truncate_jsonl(path: str, max_step: int):
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    keep = []
    for line in lines:
        try:
            if json.loads(line).get("step", 0) <= max_step:
                keep.append(line)
        except json.JSONDecodeError:  # a line cut by a crash mid-write
            continue
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(keep)
    os.replace(tmp, path)


def _jsonable(v):
    if isinstance(v, (np.floating, np.integer)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class MetricsWriter:
    """Writes per-step scalars and samples. `resume_step`: drop anything logged after it."""

    def __init__(self, workdir: str, *, enabled: bool = True, tensorboard: bool = True, resume_step: int = 0):
        self.enabled = enabled
        self.metrics_path = os.path.join(workdir, "metrics.jsonl")
        self.samples_path = os.path.join(workdir, "samples.jsonl")
        self.tb = None
        if not enabled:
            return
        _truncate_jsonl(self.metrics_path, resume_step)
        _truncate_jsonl(self.samples_path, resume_step)
        if tensorboard:
            from tensorboardX import SummaryWriter
            self.tb = SummaryWriter(os.path.join(workdir, "tb"), purge_step=resume_step + 1 if resume_step else None)

    def write(self, step: int, scalars: dict[str, float]):
        if not self.enabled:
            return
        row = {"step": int(step), **{k: _jsonable(v) for k, v in sorted(scalars.items()) if k != "step"}}
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in scalars.items():
                if k != "step" and isinstance(v, (int, float, np.floating, np.integer)):
                    self.tb.add_scalar(k, float(v), int(step))

    def write_samples(self, step: int, samples: list[dict]):
        if not self.enabled or not samples:
            return
        with open(self.samples_path, "a", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps({"step": int(step), **s}) + "\n")
        if self.tb is not None:
            text = "\n\n".join(f"**prompt:** `{s['prompt']}`  \n**completion:** `{s['completion']}`  \n"
                               f"**reward:** {s['reward']:.4f}" for s in samples)
            self.tb.add_text("samples", text, int(step))

    def flush(self):
        if self.tb is not None:
            self.tb.flush()

    def close(self):
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_curves(metrics_path: str, out_png: str,
                keys=("reward/mean", "kl/ref", "response_length/mean")) -> str:
    """A PNG with one panel per metric (reward, KL, response length) against the step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = read_metrics(metrics_path)
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.2))
    for ax, key in zip(np.atleast_1d(axes), keys):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if pts:
            ax.plot(*zip(*pts), lw=1.2)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
