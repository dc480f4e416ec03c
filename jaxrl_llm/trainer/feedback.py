"""What a user sees of a run on the terminal: a progress bar whose ETA leaves out compilation, and a
summary when training finishes."""
from __future__ import annotations

import math

from etils import epath


class Progress:
    """The tqdm bar of the run. Its first step compiles the programs (a minute on a big model, most of a
    short run), so the bar is started again once that step is done: tqdm's rate and ETA then count only
    steps that ran compiled programs."""

    def __init__(self, total: int, initial: int, desc: str, *, enabled: bool = True, file=None):
        self.total, self.desc, self.file = total, desc, file
        self.bar = None
        self._clock_started = False
        if enabled:
            from tqdm import tqdm
            self._tqdm = tqdm
            # Cleared, not kept, when the real bar replaces it.
            self.bar = tqdm(total=total, initial=initial, desc=f"{desc} (first step: compiling)", leave=False,
                            dynamic_ncols=True, file=file)

    def update(self, m: dict[str, float]) -> None:
        """One step done, with its metrics for the postfix."""
        if self.bar is None:
            return
        postfix = dict(reward=f"{m['reward/mean']:.3f}", kl=f"{m.get('kl/ref', 0):.4f}",
                       tok_s=f"{m['perf/sample_tokens_per_s']:.0f}")
        if not self._clock_started:
            n = self.bar.n + 1
            self.bar.close()
            self.bar = self._tqdm(total=self.total, initial=n, desc=self.desc, dynamic_ncols=True, file=self.file,
                                  postfix=postfix)
            self._clock_started = True
        else:
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def summary(c, workdir: str, history: list[dict], end_step: int, initial_eval: dict | None, setup_s: float,
            train_s: float) -> str:
    """The end-of-run report: steps and wall time, the final reward (mean of the last 10% of this run's
    steps), the held-out score when evaluation ran, and where the checkpoint, export and metrics are."""
    wd = epath.Path(workdir)
    lines = []
    if history:
        start = end_step - len(history)
        lines.append(f"{c.algo}: trained steps {start + 1}-{end_step} of {c.total_steps} in {train_s:.0f} s "
                     f"(setup {setup_s:.0f} s)")
        window = max(1, math.ceil(0.1 * len(history)))
        final = sum(m["reward/mean"] for m in history[-window:]) / window
        lines.append(f"  reward      {final:.3f} (mean of the last {window} step{'s' * (window > 1)}; "
                     f"{history[0]['reward/mean']:.3f} at step {start + 1})")
    else:
        lines.append(f"{c.algo}: the run had already reached step {end_step} of {c.total_steps}; nothing to train")
    last = next((m for m in reversed(history) if "eval/pass@1" in m), None)
    if last is not None:
        before = (f"{initial_eval['eval/pass@1']:.3f} -> " if initial_eval and "eval/pass@1" in initial_eval
                  else "")
        lines.append(f"  held-out    pass@1 {before}{last['eval/pass@1']:.3f}, mean reward "
                     f"{last['eval/mean_reward']:.3f}")
    lines.append(f"  checkpoint  {wd / 'checkpoints' / str(end_step)}")
    lines.append(f"  export      {wd / 'hf'}" if c.export.at_end else
                 f"  export      off: python -m jaxrl_llm.export --workdir={workdir} --out=HF_DIR")
    lines.append(f"  metrics     {wd / 'metrics.jsonl'}" + (f", curves {wd / 'curves.png'}" if c.export.plot else ""))
    return "\n".join(lines)
