"""The RL trainer: `Trainer(config, workdir).run()`; see `loop` for the loop and docs/design.md for the map.

  loop      the Trainer: setup order, the RL step, the run
  setup     model path, tokenizer, parameters on the mesh, train state, rewards, data
  rollout   sampling, rewards and DAPO resampling on the host; the batch on the mesh
  steps     the jitted step functions (score pass, advantages, update, reference refresh)
  state     TrainState, optimizers, the UpdatePlan that keys the compiled steps
  report    metrics, samples and FLOPs of a step
  workdir   the run directory: checks and the files that describe the run
  preflight the local files a run reads, checked before anything loads
"""
import importlib

_EXPORTS = {"Trainer": "loop", "Rollouts": "rollout", "OptimizerSpec": "state", "TrainState": "state",
            "UpdatePlan": "state", "make_optimizer": "state", "StepFunctions": "steps", "step_functions": "steps",
            "RESUMABLE_FIELDS": "workdir"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):  # names are imported on first use: `trainer.preflight` loads without the trainer
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"jaxrl_llm.trainer.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jaxrl_llm.trainer' has no attribute {name!r}")


def __dir__():
    return __all__
