"""GRPO on GSM8K math word problems with a Qwen2.5 instruct model and the math-answer verifier.

On a Cloud TPU pod (see tpu_scripts/README.md):
  bash tpu_scripts/launch.sh --name rl-pod --zone us-east5-a --config configs/grpo_gsm8k.py \\
      --workdir gs://BUCKET/grpo_gsm8k
On one machine or a GPU node:
  python -m jaxrl_llm.train --config=configs/grpo_gsm8k.py --workdir=/tmp/grpo_gsm8k
A small local run (any local HF checkpoint and dataset file in the GSM8K schema):
  python -m jaxrl_llm.train --config=configs/grpo_gsm8k.py --workdir=/tmp/g \\
      --config.model.path=/path/to/model --config.data.path=/path/to/gsm8k.jsonl --config.rollout.batch_prompts=2
`arg` may name another group algorithm: configs/grpo_gsm8k.py:dapo, :dr_grpo, :gspo, ...
"""
from jaxrl_llm.config import ALGOS, base_config


def get_config(arg=None):
    c = base_config()
    c.algo = arg or "grpo"
    if c.algo not in ALGOS or c.algo == "ppo":
        raise ValueError(f"configs/grpo_gsm8k.py: arg must name a group algorithm, got {arg!r}")
    c.total_steps = 500

    c.model.path = "Qwen/Qwen2.5-1.5B-Instruct"
    c.model.dtype = "float32"  # master weights and AdamW states in float32 ...
    c.model.compute_dtype = "bfloat16"  # ... matmuls in bfloat16
    c.model.remat = "full"
    c.model.logits_chunk = 128  # 152k vocabulary: logits in (rows, 128, V) blocks

    c.data.path = "openai/gsm8k"
    c.data.name = "main"
    c.data.split = "train"
    c.data.prompt_column = "question"
    c.data.answer_column = "answer"  # "... #### 72": the verifier reads the number after ####
    c.data.system_prompt = "Please reason step by step, and put your final answer within \\boxed{}."
    c.data.use_chat_template = "auto"
    c.data.max_prompt_length = 256
    c.data.max_prompt_length_policy = "drop"

    c.reward.functions = "math_answer"

    c.rollout.batch_prompts = 64
    c.rollout.group_size = 8
    c.rollout.max_new_tokens = 512
    c.rollout.temperature = 1.0

    c.train.minibatches = 2
    c.optimizer.learning_rate = 1e-6
    c.optimizer.warmup_steps = 10
    c.optimizer.max_grad_norm = 1.0
    c.optimizer.weight_decay = 0.0

    c.mesh.data = 1
    c.mesh.fsdp = -1
    c.mesh.tensor = 1
    c.checkpoint.every_steps = 50
    c.log.samples_every = 10
    c.export.dtype = "bfloat16"
    return c
