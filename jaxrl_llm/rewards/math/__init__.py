"""`math_answer` reward: extract a completion's final answer and judge it against the reference.

Which answer counts (`extraction`): the last `\\boxed{}` (against several values, the last run of
boxes joined by `and`/commas), else the last `####` line, else the answer after the last "final
answer is" / "the answer is" / "answer:" (its number when that is a sentence, its value when a
remark follows it: `20 cups, which is ...`), else a closing math segment, else (for a structured
reference) the last math segment or bracketed group, else the last number. The completion ends at
its first chat end-of-turn marker (`<|im_end|>`, `</s>`, ...). Hedging scores 0: declared answers
(boxes, `####` lines, numbers after an answer phrase) with different values, unless a
self-correction ("Wait, ...") withdrew the earlier ones; `A or B` with different values; a last
sentence offering alternatives.

How it is judged (`scoring`): a plain-number reference by exact rationals in pure Python (the fast
path; `1/2 = 0.5`, `3.0 = 3`, a decimal rounding a non-terminating rational, thousands separators,
decimal commas, `a \\times 10^b`, units); a
scalar expression by sympy (`\\log_2 8` is 3); a set, interval, tuple, matrix, system, equation,
inequality, choice or text as that structure (`structures`). math-verify judges every non-numeric
reference too; where our judge cannot read the reference its verdict is used, and disagreements are
reported as the metric `reward/math_answer/judge_disagreement`. Sympy and math-verify run in a
worker process under a hard time limit (`worker`): sympy can run for ever and only killing a process
stops C-level work.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxrl_llm.rewards.math.expressions import to_sympy_source
from jaxrl_llm.rewards.math.extraction import FinalAnswer, extract_answer, final_answer
from jaxrl_llm.rewards.math.numeric import clean_answer, normalize_answer, numbers_equal, parse_number
from jaxrl_llm.rewards.math.scoring import DEFAULT_SYMPY_TIMEOUT, Verdict, judge, reference_answer, score_answer
from jaxrl_llm.rewards.math.structures import Structure, parse_structure
# Kept importable from here: tests reach the worker as `math._WORKER`, and a process started by an
# older revision's reward (benchmarks/math_reward.py) runs `jaxrl_llm.rewards.math._worker_main`.
from jaxrl_llm.rewards.math.worker import WORKER as _WORKER  # noqa: F401
from jaxrl_llm.rewards.math.worker import worker_main as _worker_main  # noqa: F401
from jaxrl_llm.rewards.registry import RewardScores, register_reward

__all__ = [
    "DEFAULT_SYMPY_TIMEOUT", "FinalAnswer", "Structure", "Verdict", "clean_answer", "extract_answer",
    "final_answer", "judge", "math_answer", "normalize_answer", "numbers_equal", "parse_number",
    "parse_structure", "reference_answer", "score_answer", "to_sympy_source",
]  # fmt: skip


@register_reward("math_answer")
def math_answer(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    answer: Sequence[str | int | float | None],
    sympy_timeout: float = DEFAULT_SYMPY_TIMEOUT,
    second_judge: bool = True,
    **columns,
) -> RewardScores:
    """Reward 1.0 when a completion's final answer equals the row's reference `answer`, else 0.0.

    answer: (N,) reference answers (a dataset column; GSM8K's "...#### 72" works as is). A numeric
      or None entry is allowed; None, or a reference neither judge can read, gives None.
    sympy_timeout: seconds allowed for each worker request (sympy or math-verify); on time-out the
      row scores 0.
    second_judge: also ask math-verify on non-numeric references. Returns (N,) scores with the
      metric `judge_disagreement`: rows where both judges gave a verdict and the verdicts differ.
    """
    del prompts, columns
    if isinstance(answer, str) or not isinstance(answer, Sequence) or len(answer) != len(completions):
        raise ValueError(f"math_answer needs the column 'answer' with {len(completions)} references")
    if not sympy_timeout > 0:
        raise ValueError(f"sympy_timeout must be > 0 seconds, got {sympy_timeout!r}")
    scores: list[float | None] = []
    disagreements = 0
    for completion, reference in zip(completions, answer):
        if reference is None:
            scores.append(None)
            continue
        if isinstance(reference, bool) or not isinstance(reference, (str, int, float)):
            raise ValueError(f"math_answer references must be strings or numbers, got {type(reference).__name__}")
        verdict = judge(completion, str(reference), timeout=sympy_timeout, second_judge=second_judge)
        scores.append(verdict.score)
        disagreements += verdict.ours is not None and verdict.second is not None and verdict.ours != verdict.second
    metrics = {"judge_disagreement": float(disagreements)} if second_judge else {}
    return RewardScores(scores, metrics=metrics)
