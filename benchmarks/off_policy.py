"""The sampler/trainer gap of the tiny task, measured: a bfloat16 sampler against the float32 trainer with
the rollout correction, and GSPO's first update in bfloat16 with and without recomputed proximal
log-probs.

    python benchmarks/off_policy.py                 # the figures of docs/algorithms/off_policy.md
    python benchmarks/off_policy.py --steps 2       # seconds: keeps the script from rotting

Each run is `configs/tiny.py` (the embedded default) for `--steps` steps in a temporary workdir; the
figures are the mean over the steps (the first update's for the clip fraction).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "configs"))


def run(workdir: str, algo: str, steps: int, **fields) -> list[dict]:
    import tiny

    from jaxrl_llm import Trainer, from_dict
    c = tiny.get_config(f"algo={algo}")
    c.total_steps, c.log.progress, c.export.at_end, c.export.plot = steps, False, False, False
    c.checkpoint.every_steps = 10 ** 6
    return Trainer(from_dict(fields, c), workdir).run()


def mean(history: list[dict], key: str) -> float:
    return sum(h[key] for h in history) / len(history)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="steps of each run")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        gap = {"rollout.compute_dtype": "bfloat16", "rollout.recompute_logprobs": True}
        print(f"bfloat16 sampler, float32 trainer (GRPO, {args.steps} steps, mean per step)")
        print(f"{'correction.mode':18s} {'logp_diff_max':>14s} {'mismatch_kl':>12s} {'ess':>10s} {'kept_frac':>10s}")
        for mode in ("none", "token_truncate", "token_mask", "geometric_mask"):
            h = run(os.path.join(tmp, mode), "grpo", args.steps, **gap, **{"correction.mode": mode})
            print(f"{mode:18s} {mean(h, 'sampler/logp_diff_max'):14.3e} {mean(h, 'correction/mismatch_kl'):12.3e} "
                  f"{mean(h, 'correction/ess'):10.6f} {mean(h, 'correction/kept_frac'):10.4f}")
        print("\nGSPO in bfloat16 (sampler and trainer), policy/clipfrac of the first update")
        for recompute in (False, True):
            h = run(os.path.join(tmp, f"gspo{recompute}"), "gspo", 1, **{"model.compute_dtype": "bfloat16",
                                                                         "rollout.recompute_logprobs": recompute})
            print(f"rollout.recompute_logprobs={recompute!s:5s}  clipfrac {h[0]['policy/clipfrac']:.4f}  "
                  f"ratio in [{h[0]['policy/ratio_min']:.6f}, {h[0]['policy/ratio_max']:.6f}]")


if __name__ == "__main__":
    main()
