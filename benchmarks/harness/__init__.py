"""The benchmarks' shared harness. Every question script in benchmarks/ imports from here and never from
another script, so there are no import circles:

- `timing`: synchronized calls, warm-up then repeats, side by side (interleaved), the matmul peak, peak RSS.
- `report`: the machine line with its load average, markdown tables, ratio lines, results blocks, JSON.
- `shapes`: model shapes (toy ... and the real SmolLM2-135M, Qwen2.5-0.5B, Qwen2.5-1.5B), the same random
  weights in transformers and JAX, the word tokenizer, prompts, heavy-tailed stop ids.
- `flops`: FLOP counts of an iteration, an update, a decode token (the rooflines).
- `peers`: transformers `generate`, and frameworks in subprocesses of their own (`worker`: TRL, Tunix,
  jaxrl_llm) stepping in lockstep.
- `grpo`: one GRPO iteration's settings on both sides (config, reward, workspace) and our trainer's setup.
- `sampling`: our sampler's calls and its log-prob check against the trainer.
"""
import os

# Before anything imports torch: its OpenMP threads sleep at barriers instead of spinning (harness.peers).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
