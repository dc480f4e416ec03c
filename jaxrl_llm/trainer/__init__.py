"""The RL trainer: `Trainer(config, workdir).run()`; see `loop` for the loop and docs/design.md for the map.

  loop      the Trainer: setup order, the RL step, the run
  setup     model path, tokenizer, parameters on the mesh, train state, rewards, data
  rollout   sampling, rewards and DAPO resampling on the host; the batch on the mesh
  steps     the jitted step functions (score pass, advantages, update, reference refresh)
  state     TrainState, optimizers, the UpdatePlan that keys the compiled steps
  report    metrics, samples and FLOPs of a step
  workdir   the run directory: checks and the files that describe the run
"""
from jaxrl_llm.trainer.loop import Trainer
from jaxrl_llm.trainer.rollout import Rollouts
from jaxrl_llm.trainer.state import OptimizerSpec, TrainState, UpdatePlan, make_optimizer
from jaxrl_llm.trainer.steps import StepFunctions, step_functions
from jaxrl_llm.trainer.workdir import RESUMABLE_FIELDS

__all__ = ["RESUMABLE_FIELDS", "OptimizerSpec", "Rollouts", "StepFunctions", "TrainState", "Trainer", "UpdatePlan",
           "make_optimizer", "step_functions"]
