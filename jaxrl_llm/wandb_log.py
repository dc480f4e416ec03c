"""Weights & Biases as a metric sink (`log.wandb`): the scalars of metrics.jsonl and the logged samples as a
`wandb.Table`, next to the files and TensorBoard. wandb is optional: imported only when a run asks for it.

A resumed run continues the same W&B run: its id is kept in `<workdir>/wandb_id`. `WANDB_MODE=offline`
(wandb's own variable) writes the run under `<workdir>/wandb/` without a network, for `wandb sync` later.
"""
from __future__ import annotations

import math
import secrets

import numpy as np
from etils import epath

SAMPLE_COLUMNS = ("step", "prompt", "completion", "reference", "reward")


def import_wandb():
    """The wandb module, or a one-line error saying how to get it."""
    try:
        import wandb
    except ImportError:
        raise ImportError("log.wandb=True needs the wandb package: pip install wandb "
                          "(or set log.wandb=False)") from None
    return wandb


class WandbSink:
    """One W&B run per workdir. `config`: the run's config as a dict (shown on the run's page)."""

    def __init__(self, workdir: str, config: dict, *, project: str, name: str = "", entity: str = ""):
        wandb = import_wandb()
        self._wandb = wandb
        wd = epath.Path(workdir)
        id_path = wd / "wandb_id"
        run_id = id_path.read_text().strip() if id_path.exists() else secrets.token_hex(4)  # W&B: [a-z0-9]
        local = "://" not in str(workdir)  # wandb writes its files locally; an object-store workdir: its default
        self.run = wandb.init(project=project or None, name=name or None, entity=entity or None, config=config,
                              id=run_id, resume="allow", dir=str(wd) if local else None)
        if not id_path.exists():
            id_path.write_text(run_id + "\n")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """The step's numeric scalars (non-finite ones too: W&B shows NaN)."""
        row = {k: float(v) for k, v in scalars.items() if k != "step" and _is_number(v)}
        self.run.log(row, step=int(step))

    def log_samples(self, step: int, samples: list[dict]) -> None:
        """The step's samples as a table (columns SAMPLE_COLUMNS, then each reward function's part)."""
        parts = sorted({k for s in samples for k in s.get("rewards", {})})
        columns = list(SAMPLE_COLUMNS) + [f"reward/{p}" for p in parts]
        data = [[int(step), str(s.get("prompt", "")), str(s.get("completion", "")),
                 None if s.get("reference") is None else str(s["reference"]), _num(s.get("reward"))]
                + [_num(s.get("rewards", {}).get(p)) for p in parts] for s in samples]
        self.run.log({"samples": self._wandb.Table(columns=columns, data=data)}, step=int(step))

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)


def _num(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

