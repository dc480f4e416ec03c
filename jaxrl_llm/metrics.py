"""Metric sinks of a run: `metrics.jsonl` (one line per step), TensorBoard (tensorboardX), `samples.jsonl`
(prompt/completion/reward triples, also as TensorBoard text), W&B with `log.wandb` (jaxrl_llm/wandb_log.py:
the scalars, the samples as a table), and a PNG of the curves at the end.

Only process 0 writes. On resume from step s, lines of later steps (logged after the last checkpoint,
before a crash) are dropped from the JSONL files and TensorBoard purges its later events, so every
file reads as one uninterrupted run.

The workdir may be a local path or a URL (gs://, s3://: etils.epath; TensorBoard on gs:// needs
google-cloud-storage). Object stores cannot append to a file, so there the JSONL lines are kept in
memory and each file is rewritten whole on `flush()` (the trainer flushes at every checkpoint) and at
most every `sync_every_s` seconds while logging.
"""
from __future__ import annotations

import io
import json
import math
import re
import time

import numpy as np
from etils import epath

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


def _truncate_jsonl(path: epath.Path, max_step: int) -> list[str]:
    """Drops the lines of steps after `max_step` (and lines cut by a crash); returns the kept lines."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    keep = []
    for line in lines:
        try:
            if json.loads(line).get("step", 0) <= max_step:
                keep.append(line if line.endswith("\n") else line + "\n")  # the next line must not join it
        except json.JSONDecodeError:  # a line cut by a crash mid-write
            continue
    if keep != lines:
        tmp = path.parent / (path.name + ".tmp")
        tmp.write_text("".join(keep), encoding="utf-8")
        tmp.replace(path)
    return keep


def tensorboard_tag(name: str) -> str:
    """The TensorBoard name of a metric: tensorboardX accepts only [-/\w.], so `eval/pass@8` is written
    `eval/pass_at_8` (tensorboardX would rename it itself, logging a line for every write)."""
    return re.sub(r"[^-/\w.]", "_", name.replace("@", "_at_"))


def _jsonable(v):
    if isinstance(v, (np.floating, np.integer)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class MetricsWriter:
    """Writes per-step scalars and samples. `resume_step`: drop anything logged after it.

    rewrite: keep the lines in memory and rewrite whole files (default: for URLs, which cannot append).
    wandb: keyword arguments of `wandb_log.WandbSink` (project, name, entity, config) to log there too.
    """

    def __init__(self, workdir: str, *, enabled: bool = True, tensorboard: bool = True, resume_step: int = 0,
                 rewrite: bool | None = None, sync_every_s: float = 60.0, wandb: dict | None = None):
        self.enabled = enabled
        wd = epath.Path(workdir)
        self.metrics_path = wd / "metrics.jsonl"
        self.samples_path = wd / "samples.jsonl"
        self.rewrite = "://" in str(workdir) if rewrite is None else rewrite
        self.sync_every_s = sync_every_s
        self._lines: dict[epath.Path, list[str]] = {}
        self._synced = time.monotonic()
        self.tb = self.wandb = None
        if not enabled:
            return
        for path in (self.metrics_path, self.samples_path):
            kept = _truncate_jsonl(path, resume_step)
            if self.rewrite:
                self._lines[path] = kept
        if tensorboard:
            from tensorboardX import SummaryWriter
            self.tb = SummaryWriter(str(wd / "tb"), purge_step=resume_step + 1 if resume_step else None)
        if wandb is not None:
            from jaxrl_llm.wandb_log import WandbSink
            self.wandb = WandbSink(workdir, **wandb)

    def _append(self, path: epath.Path, lines: list[str]):
        if not self.rewrite:
            with path.open("a", encoding="utf-8") as f:
                f.writelines(lines)
            return
        self._lines[path].extend(lines)
        if time.monotonic() - self._synced >= self.sync_every_s:
            self._sync()

    def _sync(self):
        for path, lines in self._lines.items():
            if lines or path.exists():
                path.write_text("".join(lines), encoding="utf-8")
        self._synced = time.monotonic()

    def write(self, step: int, scalars: dict[str, float]):
        if not self.enabled:
            return
        row = {"step": int(step), **{k: _jsonable(v) for k, v in sorted(scalars.items()) if k != "step"}}
        self._append(self.metrics_path, [json.dumps(row) + "\n"])
        if self.tb is not None:
            for k, v in scalars.items():
                if k != "step" and isinstance(v, (int, float, np.floating, np.integer)):
                    self.tb.add_scalar(tensorboard_tag(k), float(v), int(step))
        if self.wandb is not None:
            self.wandb.log(step, scalars)

    def write_samples(self, step: int, samples: list[dict]):
        if not self.enabled or not samples:
            return
        # default=str: a dataset's reference column may hold values JSON has no type for (dates, ...).
        self._append(self.samples_path, [json.dumps({"step": int(step), **s}, default=str) + "\n" for s in samples])
        if self.tb is not None:
            text = "\n\n".join(f"**prompt:** `{s['prompt']}`  \n**completion:** `{s['completion']}`  \n"
                               + (f"**reference:** `{s['reference']}`  \n" if "reference" in s else "")
                               + f"**reward:** {s['reward']:.4f}" for s in samples)
            self.tb.add_text("samples", text, int(step))
        if self.wandb is not None:
            self.wandb.log_samples(step, samples)

    def flush(self):
        if self.enabled and self.rewrite:
            self._sync()
        if self.tb is not None:
            self.tb.flush()

    def close(self):
        self.flush()
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb is not None:
            self.wandb.close()
            self.wandb = None


def read_metrics(path: str) -> list[dict]:
    text = epath.Path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def held_out_keys(rows: list[dict]) -> list[str]:
    """The held-out metrics worth a curve: eval/pass@1, the largest eval/pass@k, eval/maj@k."""
    names = {k for r in rows for k in r if k.startswith("eval/") and k.count("/") == 1}
    ks = sorted(int(k.split("@")[1]) for k in names if k.startswith("eval/pass@"))
    out = [f"eval/pass@{k}" for k in dict.fromkeys(ks[:1] + ks[-1:])]
    return out + sorted(k for k in names if k.startswith("eval/maj@"))


def smooth(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average whose start is debiased (the first point is
    itself, not weight x 0), so a short run's curve does not start at zero. weight in [0, 1)."""
    out, avg = [], 0.0
    for i, v in enumerate(values, 1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight ** i))
    return out


def curve_panels(rows: list[dict]) -> list[tuple[str, tuple[str, ...]]]:
    """(title, metric names) of each panel of curves.png that the rows have data for: the reward, each
    reward function's mean, KL, response length, truncation rate, entropy, and the held-out evaluation."""
    names = {k for r in rows for k, v in r.items() if isinstance(v, (int, float))}
    per_fn = sorted(k for k in names if k.startswith("reward/") and k.endswith("/mean") and k.count("/") == 2)
    panels = [("reward/mean", ("reward/mean",))]
    panels += [(k, (k,)) for k in per_fn] if len(per_fn) > 1 else []  # one function: it is reward/mean
    panels += [(k, (k,)) for k in ("kl/ref", "response_length/mean")]
    panels.append(("truncated (response_length/clip_ratio)", ("response_length/clip_ratio",)))
    panels.append(("policy/entropy", ("policy/entropy",)))
    held_out = held_out_keys(rows)
    panels += [("held-out evaluation", ("reward/mean", *held_out))] if held_out else []
    return [(t, keys) for t, keys in panels if any(k in names for k in keys)]


def plot_curves(metrics_path: str, out_png: str, smoothing: float = 0.6) -> str:
    """A PNG of the run's curves against the step (`curve_panels`): each training metric faint as logged
    and bold smoothed (`smooth`, weight `smoothing`), the held-out points marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = read_metrics(metrics_path)
    panels = curve_panels(rows)
    cols = min(4, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3.2 * nrows), squeeze=False)
    for ax, (title, lines) in zip(axes.ravel(), panels):
        for key in lines:
            pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if not pts:
                continue
            steps, values = zip(*pts)
            if key.startswith("eval/"):  # a few points: marked, never smoothed
                ax.plot(steps, values, lw=1.2, marker="o", ms=3, label=key)
                continue
            line, = ax.plot(steps, values, lw=0.8, alpha=0.3)
            ax.plot(steps, smooth(list(values), smoothing), lw=1.4, color=line.get_color(),
                    label=f"{key} (smoothed)" if len(lines) > 1 else None)
        if len(lines) > 1:
            ax.legend(fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    png = io.BytesIO()  # through epath: the workdir may be gs://
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    epath.Path(out_png).write_bytes(png.getvalue())
    return out_png
