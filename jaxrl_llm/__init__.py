"""jaxrl_llm: reinforcement learning of large language models in JAX/Flax."""

__version__ = "0.1.0"
