"""What a user sees of a run on the terminal: a progress bar whose ETA leaves out compilation (plain lines
in a log file), the settings that would skip the padding the run's lengths waste, and a summary of the
whole run when training finishes."""
from __future__ import annotations

import json
import math
import sys
import time

import jax
from etils import epath

from jaxrl_llm.sampling.turns import bucket


class Progress:
    """The run's progress. On a terminal, a tqdm bar whose first step compiles the programs (a minute on a
    big model, most of a short run), so the bar is started again once that step is done: tqdm's rate and
    ETA then count only steps that ran compiled programs. Elsewhere (a log file, a pipe) tqdm's `\r`
    redraws would pile up, so it writes one plain line at the first step, then at most one every
    `every_s` seconds, and at the last step."""

    def __init__(self, total: int, initial: int, desc: str, *, enabled: bool = True, file=None,
                 every_s: float = 30.0, clock=time.monotonic):
        self.total, self.desc, self.file = total, desc, file if file is not None else sys.stderr
        self.every_s, self.clock = every_s, clock
        self.bar = None
        self.enabled = enabled
        self.lines = enabled and not _is_tty(self.file)
        self._clock_started = False
        self.n, self._first_done, self._last_line = initial, None, None
        if enabled and not self.lines:
            from tqdm import tqdm
            self._tqdm = tqdm
            # Cleared, not kept, when the real bar replaces it.
            self.bar = tqdm(total=total, initial=initial, desc=f"{desc} (first step: compiling)", leave=False,
                            dynamic_ncols=True, file=self.file)

    def update(self, m: dict[str, float]) -> None:
        """One step done, with its metrics for the postfix (or the line)."""
        if self.lines:
            self._line(m)
            return
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

    def _line(self, m: dict[str, float]) -> None:
        self.n += 1
        now = self.clock()
        if self._first_done is None:  # the rate counts the steps after the first (compiling) one
            self._first_done = (self.n, now)
        elif self._last_line is not None and now - self._last_line < self.every_s and self.n < self.total:
            return
        done, t0 = self._first_done
        rate = (now - t0) / (self.n - done) if self.n > done else None
        eta = f", eta {_duration(rate * (self.total - self.n))}" if rate is not None else ""
        speed = f", {rate:.2f} s/step" if rate is not None else " (first step: compiled)"
        self.file.write(f"{self.desc}: step {self.n}/{self.total}, reward {m['reward/mean']:.3f}, "
                        f"kl {m.get('kl/ref', 0):.4f}, {m['perf/sample_tokens_per_s']:.0f} tok/s{speed}{eta}\n")
        self.file.flush()
        self._last_line = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _is_tty(file) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


# A hint names a setting when at least this share of what the passes or the decode computed was padding.
PADDING_HINT_SHARE = 0.5
# The run logs its hints once, after this many steps of a segment (the summary repeats them for the run).
HINT_AFTER_STEPS = 3
# Completion budgets shorter than this have too few columns to skip for a packing plan or a decode phase
# of their own to pay (the built-in task's 4 tokens among them).
HINT_MIN_NEW_TOKENS = 32
# The decode's hint needs a batch that a shrink by this factor (the one it suggests) leaves rows in.
_SHRINK = 4


def padding_hints(c, rows: list[dict]) -> list[str]:
    """The settings that would skip the padding the run's completion lengths waste, one sentence each, from
    its metrics rows (`response_length/mean` and `/max` of each step); [] when little is wasted or the
    settings are already on. Single-turn runs with rollout.max_new_tokens >= HINT_MIN_NEW_TOKENS only: an
    episode's columns are not rollout.max_new_tokens.

    - Unpacked, the score and update passes run every row over rollout.max_new_tokens completion columns:
      the padding share is 1 - mean length / max_new_tokens; `train.pack_length` runs only the real tokens.
    - The static decode runs all N rows until the step's longest ends: the share of row-steps spent on rows
      already finished is 1 - sum of means / sum of maxima; `rollout.decode_shrink` (fewer rows once most
      have ended) or `rollout.decode_slots` (continuous batching) decode fewer of them."""
    steps = [(m["response_length/mean"], m["response_length/max"]) for m in rows if "response_length/mean" in m]
    T = c.rollout.max_new_tokens
    if not steps or c.env.name or T < HINT_MIN_NEW_TOKENS:
        return []
    mean = sum(s[0] for s in steps) / len(steps)
    hints = []
    padded = 1.0 - mean / T
    router_loss = c.model.router_aux_loss_coef or c.model.router_z_loss_coef  # packing refuses it
    if c.train.pack_length == 0 and not router_loss and padded >= PADDING_HINT_SHARE:
        # Rows of the power of two that holds the dataset's longest prompt and a full completion; packing
        # asks pack_length >= data.max_prompt_length + T, so a looser bound is lowered to what the rows hold.
        prompt = next((int(m["data/prompt_length_max"]) for m in rows if "data/prompt_length_max" in m),
                      c.data.max_prompt_length)
        length = bucket(min(prompt, c.data.max_prompt_length) + T, smallest=1)
        bound = f" with data.max_prompt_length={length - T}" if c.data.max_prompt_length > length - T else ""
        hints.append(f"{padded:.0%} of the completion columns the score and update passes ran were padding "
                     f"(completions of {mean:.1f} tokens on average, rollout.max_new_tokens={T}): "
                     f"train.pack_length={length}{bound} packs the real tokens into rows (README, Models)")
    decoded = sum(s[1] for s in steps)  # row-steps per row: every step decodes until its longest row ends
    finished = 1.0 - sum(s[0] for s in steps) / decoded if decoded else 0.0
    rows_decoded = c.rollout.batch_prompts // jax.process_count() * c.rollout.group_size  # one process's batch
    if (c.rollout.decode_slots == 0 and c.rollout.decode_shrink == 0 and rows_decoded >= 2 * _SHRINK
            and finished >= PADDING_HINT_SHARE):
        hints.append(f"{finished:.0%} of the decode's row-steps went to rows that had already finished (the "
                     f"{rows_decoded} rows of a batch decode until its longest ends): rollout.decode_shrink={_SHRINK} "
                     f"goes on over a quarter of the rows once that few are left, rollout.decode_slots keeps a "
                     f"fixed number in flight (docs/sampling.md)")
    return hints


def summary(c, workdir: str, history: list[dict], end_step: int, initial_eval: dict | None, setup_s: float,
            train_s: float) -> str:
    """The end-of-run report: steps and wall time, the final reward (mean of the last 10% of the run's
    steps), the held-out score when evaluation ran, and where the checkpoint, export and metrics are.
    After a resume the reward and held-out lines cover the whole run, read from metrics.jsonl (every
    segment); the time is this segment's."""
    wd = epath.Path(workdir)
    lines = []
    rows = _whole_run(wd / "metrics.jsonl", history, end_step)
    steps = [m for m in rows if "reward/mean" in m]
    if history:
        start = end_step - len(history)
        first = int(steps[0].get("step", start + 1)) if steps else start + 1
        this = f" (this segment: steps {start + 1}-{end_step})" if first < start + 1 else ""
        lines.append(f"{c.algo}: trained steps {first}-{end_step} of {c.total_steps} in {train_s:.0f} s "
                     f"(setup {setup_s:.0f} s){this}")
        window = max(1, math.ceil(0.1 * len(steps)))
        final = sum(m["reward/mean"] for m in steps[-window:]) / window
        lines.append(f"  reward      {final:.3f} (mean of the last {window} step{'s' * (window > 1)}; "
                     f"{steps[0]['reward/mean']:.3f} at step {first})")
    else:
        lines.append(f"{c.algo}: the run had already reached step {end_step} of {c.total_steps}; nothing to train")
    last = next((m for m in reversed(rows) if "eval/pass@1" in m), None)
    initial = initial_eval or next((m for m in rows if m.get("step") == 0 and "eval/pass@1" in m), None)
    if last is not None:
        before = f"{initial['eval/pass@1']:.3f} -> " if initial and "eval/pass@1" in initial else ""
        lines.append(f"  held-out    pass@1 {before}{last['eval/pass@1']:.3f}, mean reward "
                     f"{last['eval/mean_reward']:.3f}")
    lines.append(f"  checkpoint  {wd / 'checkpoints' / str(end_step)}")
    lines.append(f"  export      {wd / 'hf'}" if c.export.at_end else
                 f"  export      off: python -m jaxrl_llm.export --workdir={workdir} --out=HF_DIR")
    if c.export.at_end and c.lora.rank > 0:
        lines.append(f"  adapter     {wd / 'hf_adapter'} (PEFT, on the base {c.model.path or 'built-in model'})")
    lines.append(f"  metrics     {wd / 'metrics.jsonl'}" + (f", curves {wd / 'curves.png'}" if c.export.plot else ""))
    lines.extend(f"  hint        {h}" for h in padding_hints(c, steps))
    return "\n".join(lines)


def _whole_run(path: epath.Path, history: list[dict], end_step: int) -> list[dict]:
    """The rows of every segment of the run up to `end_step`: metrics.jsonl when it holds this segment's
    steps (process 0 wrote it), else this segment's `history`."""
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return history
    rows = [r for r in rows if r.get("step", 0) <= end_step]
    logged = {int(r["step"]) for r in rows if "reward/mean" in r}
    mine = {int(m["step"]) for m in history if "step" in m}
    return rows if mine <= logged else history
