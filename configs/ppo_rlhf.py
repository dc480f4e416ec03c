"""PPO from human-preference rewards (RLHF): a learned reward model scores each completion, a value model
estimates returns (GAE), and the KL to the reference policy is part of the per-token reward.

On a Cloud TPU pod (see tpu_scripts/README.md):
  bash tpu_scripts/launch.sh --name rl-pod --zone us-east5-a --config configs/ppo_rlhf.py \\
      --workdir gs://BUCKET/ppo_rlhf
On one machine or a GPU node:
  python -m jaxrl_llm.train --config=configs/ppo_rlhf.py --workdir=/tmp/ppo_rlhf
With local checkpoints (policy, and a *ForSequenceClassification reward model):
  python -m jaxrl_llm.train --config=configs/ppo_rlhf.py --workdir=/tmp/p --config.model.path=/path/policy \\
      --config.reward.kwargs.reward_model.path=/path/rm --config.data.path=/path/prompts.jsonl
"""
from jaxrl_llm.config import base_config


def get_config(arg=None):
    del arg
    c = base_config()
    c.algo = "ppo"
    c.total_steps = 1000

    c.model.path = "meta-llama/Llama-3.2-1B-Instruct"
    c.model.dtype = "float32"
    c.model.compute_dtype = "bfloat16"
    c.model.remat = "full"

    c.data.path = "HuggingFaceH4/ultrafeedback_binarized"
    c.data.split = "train_prefs"
    c.data.prompt_column = "prompt"
    c.data.answer_column = ""
    c.data.use_chat_template = "auto"
    c.data.max_prompt_length = 512
    c.data.max_prompt_length_policy = "drop"

    c.reward.functions = "reward_model"
    c.reward.kwargs.reward_model = dict(path="Skywork/Skywork-Reward-Llama-3.1-8B-v0.2")

    c.rollout.batch_prompts = 128
    c.rollout.group_size = 1
    c.rollout.max_new_tokens = 256
    c.rollout.temperature = 1.0

    c.kl.coef = 0.05
    c.kl.adaptive = True
    c.kl.target = 6.0  # summed per-sequence KL the controller steers to
    c.entropy_coef = 0.0
    c.value.init = "policy"
    c.value.learning_rate = 5e-6
    c.value.clip = 0.2
    c.train.epochs = 2
    c.train.minibatches = 4
    c.optimizer.learning_rate = 1e-6
    c.optimizer.warmup_steps = 10

    c.mesh.fsdp = -1
    c.checkpoint.every_steps = 50
    c.export.dtype = "bfloat16"
    return c
