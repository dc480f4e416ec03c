"""The train state, the optimizers, and the plan of a step that is not the algorithm's math.

`TrainState` is everything a step changes and is checkpointed whole. `UpdatePlan` holds the sizes, the
optimizers and the sampling temperature the jitted step depends on: with the hashable `Objective` and
the model config it keys the compiled step functions (`steps.step_functions`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import optax


@flax.struct.dataclass
class TrainState:
    """Everything a step changes; checkpointed whole. Optional parts are None when unused."""

    step: jax.Array  # RL iterations done
    opt_step: jax.Array  # optimizer updates done (drives the lr schedule)
    rng: jax.Array  # split every step: same seed + config = same run
    params: Any  # policy
    opt_state: Any
    ref_params: Any  # reference, only when it is refreshed during the run (else frozen outside)
    value_params: Any  # PPO value model
    value_opt_state: Any
    kl: Any  # KL controller (fixed or adaptive) holding beta
    nonfinite: jax.Array  # consecutive updates skipped for NaN/inf


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """The fields of the `optimizer` config section, with the peak learning rate and the run's length."""

    learning_rate: float
    warmup_steps: int
    schedule: str
    min_lr_ratio: float
    weight_decay: float
    b1: float
    b2: float
    eps: float
    max_grad_norm: float
    total_updates: int

    @classmethod
    def from_config(cls, o, learning_rate: float, total_updates: int) -> OptimizerSpec:
        return cls(learning_rate, o.warmup_steps, o.schedule, o.min_lr_ratio, o.weight_decay, o.b1, o.b2, o.eps,
                   o.max_grad_norm, total_updates)

    def build(self):
        return make_optimizer(self, self.learning_rate, self.total_updates)


def make_optimizer(o, learning_rate: float, total_updates: int):
    """(AdamW with linear warmup then constant/cosine/linear decay after global-norm clipping, the
    learning-rate schedule). `o` has the fields of the `optimizer` config section."""
    decay_steps = max(1, total_updates - o.warmup_steps)
    end = learning_rate * o.min_lr_ratio
    after = {"constant": optax.constant_schedule(learning_rate),
             "cosine": optax.cosine_decay_schedule(learning_rate, decay_steps, alpha=o.min_lr_ratio),
             "linear": optax.linear_schedule(learning_rate, end, decay_steps)}[o.schedule]
    schedule = after if o.warmup_steps == 0 else optax.join_schedules(
        [optax.linear_schedule(0.0, learning_rate, o.warmup_steps), after], [o.warmup_steps])
    chain = [optax.clip_by_global_norm(o.max_grad_norm)] if o.max_grad_norm > 0 else []
    chain.append(optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay))
    return optax.chain(*chain), schedule


@dataclasses.dataclass(frozen=True)
class UpdatePlan:
    """What the jitted step depends on besides the objective and the model: hashable."""

    temperature: float  # the sampler's, also used for the trainer's log-probs
    group_size: int
    minibatches: int  # optimizer steps per epoch
    grad_accum: int  # micro-batches per optimizer step
    recompute_logprobs: bool  # old log-probs from a trainer forward rather than the sampler's
    ref_mix_alpha: float  # reference refresh: ref <- alpha * policy + (1 - alpha) * ref
    optimizer: OptimizerSpec
    value_optimizer: OptimizerSpec
    pack_length: int = 0  # tokens per packed row of the score and update passes; 0 = unpacked
    microbatch_tokens: int = 0  # >0: micro-batches of rows by this many tokens per row shard (microbatches.py):
    # train.max_tokens_per_microbatch x mesh.sequence (a row shard's C chips each hold 1/C of its rows' tokens)

    @classmethod
    def from_config(cls, c) -> UpdatePlan:
        total = total_updates(c)
        # The schedule's length only matters when it decays; a constant one compiles once for any length.
        length = 0 if c.optimizer.schedule == "constant" else total
        return cls(temperature=c.rollout.temperature, group_size=c.rollout.group_size,
                   minibatches=c.train.minibatches, grad_accum=c.train.grad_accum,
                   recompute_logprobs=c.rollout.recompute_logprobs, ref_mix_alpha=c.ref.mix_alpha,
                   optimizer=OptimizerSpec.from_config(c.optimizer, c.optimizer.learning_rate, length),
                   value_optimizer=OptimizerSpec.from_config(c.optimizer, c.value.learning_rate, length),
                   pack_length=c.train.pack_length,
                   microbatch_tokens=c.train.max_tokens_per_microbatch * max(int(c.mesh.sequence), 1))

    @property
    def score_chunks(self) -> int:
        """The score pass runs in as many chunks as the update has micro-batches: a chunk is no larger
        than what one forward + backward of the update holds, so scoring never sets the memory peak."""
        return self.minibatches * self.grad_accum


def total_updates(c) -> int:
    """Optimizer steps of the whole run."""
    return c.total_steps * c.train.epochs * c.train.minibatches
