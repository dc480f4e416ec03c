"""GKD time per step against TRL's GKDTrainer: the same tiny student and teacher, the same batch, side by side.

    python benchmarks/gkd_step.py                      # toy student, 2x wider teacher, 8 rows, 16 + 16 tokens
    python benchmarks/gkd_step.py --repeats 5 --out docs/benchmarks.md

What is measured: the median wall time of one training step at two settings of λ (TRL's `lmbda`), each side
timed in turn within every round (harness/timing.time_interleaved), in this process, on the CPU:

  lmbda=1  on-policy: the student samples T new tokens for each of the B prompts (temperature 1, full
           vocabulary, every row to T: the models have no EOS), then the teacher's and the student's
           forwards on [prompt; completion], the generalized JSD (β) over the vocabulary at every
           completion token, the backward and one AdamW step.
  lmbda=0  supervised: the same without sampling, on the dataset's completions (T tokens each).

jaxrl_llm: `Trainer.train_step` of the gkd preset (rollout.group_size 1, distill.lmbda, data.completion_column;
its sampling, teacher score pass and update, metrics included). TRL: `GKDTrainer.training_step` (its random
on-policy draw forced by lmbda 0 or 1; `generate` with min_new_tokens = T; the loss and backward) followed
by the optimizer's step, the work of one step of `Trainer.train`'s inner loop. Both load the same
transformers checkpoints (harness/shapes.build_models: a random "toy"-shaped Llama student and a teacher twice as
wide and deep, one word-level tokenizer). Prints each side's median and first call (compile), and the ratio
TRL / jaxrl_llm (> 1: ours is faster).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import report  # noqa: E402  (sets torch's OMP policy before torch loads)
from harness.shapes import build_models, make_tokenizer, size_of  # noqa: E402
from harness.timing import time_interleaved  # noqa: E402

MARKER = "gkd-step"


def workspace(root: str, args) -> dict[str, str]:
    """student/, teacher/, tokenizer/ and data.jsonl ({"prompt", "completion"}: random words) under `root`."""
    # Llama (transformers would read a word tokenizer saved with a Qwen2 config as Qwen2's own BPE).
    student = dataclasses.replace(size_of("toy"), model_type="llama")
    teacher = dataclasses.replace(student, name="toy-teacher", hidden_size=2 * student.hidden_size,
                                  intermediate_size=2 * student.intermediate_size, num_layers=2 * student.num_layers)
    paths = {k: os.path.join(root, k) for k in ("student", "teacher", "tokenizer")}
    positions = args.prompt_len + args.new_tokens + 8
    build_models(paths["student"], student, seed=0, max_positions=positions)
    build_models(paths["teacher"], teacher, seed=1, max_positions=positions)
    tok = make_tokenizer(student.vocab_size)
    tok.save_pretrained(paths["tokenizer"])
    tok.save_pretrained(paths["teacher"])  # the teacher's tokenizer is checked against the student's
    rng = np.random.default_rng(0)
    words = lambda n: " ".join(f"w{i}" for i in rng.integers(2, student.vocab_size, n))
    paths["data"] = os.path.join(root, "data.jsonl")
    with open(paths["data"], "w") as f:  # T − 1 words: with the EOS the completion is T tokens on both sides
        for _ in range(4 * args.batch):
            f.write(json.dumps({"prompt": words(args.prompt_len), "completion": words(args.new_tokens - 1)}) + "\n")
    return paths


def ours_step(paths: dict, args, lmbda: float, workdir: str):
    """A gkd Trainer at `lmbda` and a step function (the state threads through its calls)."""
    from jaxrl_llm.config import base_config
    from jaxrl_llm.trainer import Trainer
    c = base_config()
    c.algo = "gkd"
    c.model.path, c.tokenizer, c.teacher.path = paths["student"], paths["tokenizer"], paths["teacher"]
    c.data.path, c.data.prompt_column, c.data.answer_column = paths["data"], "prompt", ""
    c.data.completion_column, c.distill.lmbda, c.distill.beta = "completion", lmbda, args.beta
    c.data.use_chat_template, c.data.max_prompt_length = False, args.prompt_len
    c.reward.functions = "harness.grpo:even_words"  # logged only: gkd alone has no reward advantage
    c.rollout.batch_prompts, c.rollout.group_size, c.rollout.max_new_tokens = args.batch, 1, args.new_tokens
    c.optimizer.learning_rate = 1e-6
    c.total_steps = 10 ** 6
    c.checkpoint.every_steps, c.checkpoint.async_save = 10 ** 6, False
    c.log.progress, c.log.tensorboard, c.export.at_end, c.export.plot = False, False, False, False
    t = Trainer(c, workdir)
    box = [t.state]

    def step(_):
        box[0], m, _ = t.train_step(box[0])
        return box[0].params

    return t, step


def trl_step(paths: dict, args, lmbda: float, outdir: str):
    """TRL's GKDTrainer at `lmbda` on the same rows, and a step function: training_step + optimizer step."""
    import datasets
    import torch
    import transformers
    from trl.experimental.gkd import GKDConfig, GKDTrainer
    torch.set_num_threads(os.cpu_count() or 1)
    tok = transformers.AutoTokenizer.from_pretrained(paths["tokenizer"])
    rows = [json.loads(line) for line in open(paths["data"])]
    gkd_args = GKDConfig(output_dir=outdir, lmbda=lmbda, beta=args.beta, temperature=1.0, max_new_tokens=args.new_tokens,
                         per_device_train_batch_size=args.batch, learning_rate=1e-6, report_to=[], use_cpu=True,
                         save_strategy="no", logging_strategy="no", disable_tqdm=True)
    msgs = [{"messages": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["completion"]}]}
            for r in rows]
    trainer = GKDTrainer(model=paths["student"], teacher_model=paths["teacher"], args=gkd_args,
                         train_dataset=datasets.Dataset.from_list(msgs), processing_class=tok)
    trainer.generation_config.min_new_tokens = args.new_tokens  # every row to T, as ours (no EOS anyway)
    trainer.create_optimizer_and_scheduler(num_training_steps=10 ** 6)
    trainer.current_gradient_accumulation_steps = 1  # what Trainer.train's inner loop sets
    model = trainer.model
    model.train()

    def inputs(i):
        """The batch as GKD's collator gives it: [prompt; completion; EOS], labels −100 on the prompt."""
        batch = [rows[(i * args.batch + k) % len(rows)] for k in range(args.batch)]
        p = torch.tensor([tok.encode(r["prompt"]) for r in batch])
        comp = torch.tensor([tok.encode(r["completion"]) + [tok.eos_token_id] for r in batch])
        ids = torch.cat([p, comp], 1)
        labels = ids.clone()
        labels[:, :p.shape[1]] = -100
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels, "prompts": p,
                "prompt_attention_mask": torch.ones_like(p)}

    def step(i):
        trainer.training_step(model, inputs(i))
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()
        return None

    return trainer, step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8, help="rows per step (prompts; one completion each)")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=16, help="completion tokens T")
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--lmbdas", default="1,0", help="comma-separated values of λ to time")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="", help="also write the results block into this markdown file")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="gkd_step_")
    paths = workspace(root, args)
    rows, lines = [], []
    for lmbda in (float(x) for x in args.lmbdas.split(",")):
        _, ours = ours_step(paths, args, lmbda, os.path.join(root, f"ours_{lmbda}"))
        _, trl = trl_step(paths, args, lmbda, os.path.join(root, f"trl_{lmbda}"))
        t = time_interleaved({"jaxrl_llm": ours, "TRL": trl}, repeats=args.repeats)
        rows.append([f"{lmbda:g}", t["jaxrl_llm"].median, t["TRL"].median, t["TRL"].median / t["jaxrl_llm"].median,
                     t["jaxrl_llm"].first, t["TRL"].first])
        lines.append(f"lmbda={lmbda:g}: " + report.ratio_line("jaxrl_llm", "TRL", t["jaxrl_llm"].median,
                                                              t["TRL"].median, higher_is_better=False, unit="s/step"))
    table = report.markdown_table(["λ", "jaxrl_llm s/step", "TRL s/step", "TRL / ours", "ours first (compile)",
                                   "TRL first"], rows)
    body = (f"`python benchmarks/gkd_step.py --batch {args.batch} --prompt-len {args.prompt_len} --new-tokens "
            f"{args.new_tokens} --beta {args.beta:g} --repeats {args.repeats}` on {report.machine_description()}:\n\n"
            f"{table}\n")
    print(body)
    print("\n".join(lines))
    if args.out:
        report.update_markdown(args.out, MARKER, body)


if __name__ == "__main__":
    main()
