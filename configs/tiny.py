"""The embedded default: a tiny random model learns the built-in digit puzzles on CPU in minutes.

No download: the model is initialized from the seed, the tokenizer is the built-in character one and the
task (jaxrl_llm/data/tasks.py) is generated. `arg` picks the algorithm; GRPO when absent:

  python -m jaxrl_llm.train --config=configs/tiny.py --workdir=/tmp/tiny
  python -m jaxrl_llm.train --config=configs/tiny.py:algo=ppo --workdir=/tmp/tiny_ppo

Any field can be overridden, e.g. `--config.total_steps=20 --config.rollout.group_size=4`.
"""
from jaxrl_llm.config import ALGOS, base_config
from jaxrl_llm.presets import preset_defaults


def parse_arg(arg: str | None) -> dict[str, str]:
    """'algo=ppo,foo=bar' -> {'algo': 'ppo', 'foo': 'bar'}; a bare 'ppo' means algo=ppo."""
    out = {}
    for part in filter(None, (arg or "").split(",")):
        key, _, value = part.partition("=")
        out.update({key: value} if value else {"algo": key})
    return out


def get_config(arg=None):
    args = parse_arg(arg)
    algo = args.pop("algo", "grpo")
    if args:
        raise ValueError(f"configs/tiny.py: unknown argument(s) {sorted(args)}; expected algo=<{'|'.join(ALGOS)}>")
    c = base_config()
    c.algo = algo
    c.seed = 0
    c.total_steps = 800

    c.model.path = ""  # the built-in tiny Llama-style model, tied embeddings
    c.model.hidden_size = 64
    c.model.num_layers = 2
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.intermediate_size = 128
    c.model.max_position_embeddings = 64
    c.model.remat = "none"  # a tiny model's activations are kilobytes: rematerialising only costs compile time

    c.data.task = "digit_puzzles"
    c.data.prompt_column = "prompt"
    c.data.answer_column = "answer"
    c.data.extra_columns = ("level",)
    c.data.max_prompt_length = 16
    c.data.use_chat_template = False

    c.reward.functions = "digit_puzzles"

    c.rollout.batch_prompts = 16
    c.rollout.group_size = 16
    c.rollout.max_new_tokens = 4
    c.rollout.temperature = 1.0

    c.optimizer.learning_rate = 1e-3
    c.optimizer.max_grad_norm = 1.0
    c.value.learning_rate = 1e-3
    # A tiny policy trained from scratch collapses onto a few outputs before it finds the answers unless
    # something holds its entropy up: every algorithm here keeps a small KL to the (random) initial
    # policy, which for a near-uniform reference acts as an entropy regularizer.
    c.kl.coef = 0.02
    if algo in ("dr_grpo", "rloo"):
        c.kl.coef = 0.005  # their advantages are not divided by the group std: ~5x smaller than GRPO's
    if algo == "rloo":
        # RLOO as its paper writes it: each completion one action, its token terms summed (here over the
        # fixed N·L, Dr. GRPO's normaliser), not the preset's token mean, with which it stalled on a
        # deterministic policy (bar 0.50; seeds 0-3 at kl 0.02: 0.46-0.54; seeds 0, 1, 3 at 0.005:
        # 0.49-0.53). Its advantage being G/(G-1) times Dr. GRPO's, this is Dr. GRPO's run up to that factor.
        c.loss.aggregate = "seq-mean-token-sum-norm"
    # (an unknown algo reaches prepare's one-line error; DAPO keeps k3: below)
    if algo in ALGOS and algo != "dapo" and preset_defaults(algo, 0)["kl.placement"] == "loss":
        # k3+ (k3's value, k2's gradient), not k3: differentiated in the loss, k3's gradient is that of the
        # *forward* KL(ref || policy), whose pull towards the near-uniform reference stays ~(policy - uniform)
        # however sharp the policy gets. Once most groups score alike the reward's gradient fades, Adam takes
        # full-size steps along that steady pull, and a run can lose late what it learned (seed 0 on a Zen 5
        # host: 0.5 -> 0.3 after step ~430, with an entropy rebound). k3+'s is the reverse KL's, here minus
        # the entropy's, which fades as the policy sharpens (docs/algorithms/grpo.md, "KL to the reference";
        # README: the ten-seed counts).
        # DAPO keeps k3: it trains only on groups whose rewards vary, so a policy that turned deterministic
        # early has nothing left to learn from but the KL; k3's steady pull is what restores its exploration
        # (seeds 0-9 on one host: with k3+ five settled at a reward of 0.2-0.36, with k3 one, at 0.2).
        c.kl.estimator = "k3+"

    # Held-out pass@1..16 and maj@16 on 128 prompts of the task's test split (never trained on), before
    # the first step, every 100 steps and at the end. 16 samples per prompt is GRPO's group size: the
    # evaluation runs the sampler program that training compiled.
    c.eval.every_steps = 100
    c.eval.num_prompts = 128
    c.eval.k = 16

    c.checkpoint.every_steps = 100
    c.log.samples_every = 20
    if algo == "reinforce_pp":
        # Its baseline form: each score minus its group's mean, then REINFORCE++'s whitening over the batch.
        # The plain form's baseline is the batch mean alone: over 16 prompts of four difficulty levels it
        # credits an easy prompt's completions and blames a hard one's whatever they did. Its seeds 0-3 ended
        # at 0.32-0.50 (bar 0.50); 64 prompts of 4 samples each did not fix it (five runs: 0.35-0.58). The KL
        # is the preset's, k1 in the token rewards at 0.01 (at 0.02 the entropy stayed near 2).
        c.advantage.reinforce_pp_baseline = True
        c.kl.coef = 0.01
    if algo == "ppo":
        c.rollout.group_size = 4  # PPO's baseline is the value model; G only sets prompt diversity
        c.rollout.batch_prompts = 64
        c.train.minibatches = 2
        c.kl.coef = 0.01  # k1 in the per-token reward
    return c
