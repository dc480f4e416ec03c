"""What a run prints and draws: progress as plain lines in a log file, the summary of the whole run after
a resume (and the LoRA adapter's directory), the panels and smoothing of curves.png."""
import io
import json

import pytest

from jaxrl_llm import metrics as metrics_lib
from jaxrl_llm.trainer import feedback

from test_trainer import small_config


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_a_log_file_gets_one_line_every_n_seconds_and_no_carriage_returns():
    out, clock = io.StringIO(), Clock()  # StringIO is no terminal
    progress = feedback.Progress(12, 0, "grpo", file=out, every_s=30.0, clock=clock)
    m = {"reward/mean": 0.25, "kl/ref": 0.001, "perf/sample_tokens_per_s": 500.0}
    clock.t = 60.0  # the first step compiles
    for _ in range(12):
        progress.update(m)
        clock.t += 7.0
    progress.close()
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and progress.bar is None
    # step 1, then the first step at least 30 s after the last line (every 5th step), and the last step
    assert [line.split(",")[0] for line in lines] == ["grpo: step 1/12", "grpo: step 6/12", "grpo: step 11/12",
                                                      "grpo: step 12/12"]
    assert lines[1] == "grpo: step 6/12, reward 0.250, kl 0.0010, 500 tok/s, 7.00 s/step, eta 0m42s"
    assert "(first step: compiled)" in lines[0] and lines[-1].endswith("eta 0m00s")


def _rows(tmp_path, steps):
    rows = [{"step": 0, "eval/pass@1": 0.1, "eval/mean_reward": 0.2}]
    rows += [{"step": s, "reward/mean": s / 10} for s in range(1, steps + 1)]
    rows[-1].update({"eval/pass@1": 0.4, "eval/mean_reward": 0.5})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_the_summary_after_a_resume_covers_every_segment(tmp_path):
    rows = _rows(tmp_path, 20)
    history = [dict(r, step=float(r["step"])) for r in rows[-5:]]  # this segment: steps 16-20
    c = small_config(total_steps=20)
    text = feedback.summary(c, str(tmp_path), history, 20, None, 1.0, 9.0)
    assert "grpo: trained steps 1-20 of 20 in 9 s (setup 1 s) (this segment: steps 16-20)" in text
    assert f"reward      {(1.9 + 2.0) / 2:.3f} (mean of the last 2 steps; 0.100 at step 1)" in text
    assert "held-out    pass@1 0.100 -> 0.400, mean reward 0.500" in text  # the step-0 row of segment 1
    one = feedback.summary(c, str(tmp_path / "elsewhere"), history, 20, None, 1.0, 9.0)  # no metrics.jsonl
    assert "trained steps 16-20 of 20" in one and "this segment" not in one


def test_the_summary_lists_the_lora_adapter(tmp_path):
    c = small_config(**{"lora.rank": 4, "export.at_end": True})
    text = feedback.summary(c, str(tmp_path), [{"reward/mean": 0.5}], 1, None, 0.0, 1.0)
    assert f"adapter     {tmp_path / 'hf_adapter'} (PEFT" in text
    assert "adapter" not in feedback.summary(small_config(**{"export.at_end": True}), str(tmp_path),
                                             [{"reward/mean": 0.5}], 1, None, 0.0, 1.0)


def test_smoothing_is_a_debiased_moving_average():
    assert metrics_lib.smooth([1.0, 0.0, 0.0], 0.5) == pytest.approx([1.0, 1 / 3, 1 / 7])
    assert metrics_lib.smooth([2.0] * 5, 0.9) == pytest.approx([2.0] * 5)  # no start at zero


def test_curves_have_entropy_truncation_and_per_reward_panels(tmp_path):
    rows = [{"step": s, "reward/mean": s, "reward/fmt/mean": 1.0, "reward/acc/mean": s / 2, "kl/ref": 0.1,
             "response_length/mean": 3.0, "response_length/clip_ratio": 0.5, "policy/entropy": 2.0}
            for s in range(1, 6)]
    titles = [t for t, _ in metrics_lib.curve_panels(rows)]
    assert titles == ["reward/mean", "reward/acc/mean", "reward/fmt/mean", "kl/ref", "response_length/mean",
                      "truncated (response_length/clip_ratio)", "policy/entropy"]
    one_fn = [{k: v for k, v in r.items() if k != "reward/acc/mean"} for r in rows]
    assert "reward/fmt/mean" not in [t for t, _ in metrics_lib.curve_panels(one_fn)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics_lib.plot_curves(str(path), str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
