"""jaxrl_llm: reinforcement learning of large language models in JAX/Flax.

The names a user needs, imported on first use (so `import jaxrl_llm` stays light):

  base_config(), from_dict(d)    the run config: the full schema, or a dict of fields on top of it
  Trainer(config, workdir, *, rewards=None, dataset=None).run() -> the metric history (list of dicts)
  register_reward(name)          a decorator making a reward function available by name in configs
  Objective                      the algorithm's math as one value (jaxrl_llm.rl)
  load_hf, save_hf               Hugging Face checkpoints in and out
  generate                       the group sampler

See README.md ("Python API") and docs/design.md.
"""
import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "base_config": "jaxrl_llm.config",
    "from_dict": "jaxrl_llm.config",
    "Trainer": "jaxrl_llm.trainer",
    "register_reward": "jaxrl_llm.rewards",
    "Objective": "jaxrl_llm.rl",
    "load_hf": "jaxrl_llm.models",
    "save_hf": "jaxrl_llm.models",
    "generate": "jaxrl_llm.sampling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jaxrl_llm' has no attribute {name!r}")


def __dir__():
    return __all__ + ["__version__"]
