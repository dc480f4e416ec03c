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
import logging

__version__ = "0.1.0"

# transformers warns when it is imported without PyTorch ("PyTorch was not found. Models won't be
# available..."): jaxrl_llm uses it for tokenizers and configs only and runs its models in JAX, so on the
# install the README gives every command would print a warning that is no problem. Dropped here, before
# any entry point (python -m jaxrl_llm.*) or the Python API imports transformers; its other messages stay.
logging.getLogger("transformers").addFilter(lambda record: not str(record.msg).startswith("PyTorch was not found"))

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
