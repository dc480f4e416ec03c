"""Our sampler's calls as the benchmarks time them, and its log-prob check against the trainer."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def jax_generate(config, params, prompts, mask, max_new_tokens, seed, num_samples=1):
    """`sampling.generate` from the full distribution (temperature 1), EOS = the last id (drawn with ~1/V
    probability per step: the loop runs until every row drew it, `full_length` checks it ran T steps)."""
    from jaxrl_llm.sampling import generate
    eos = config.vocab_size - 1
    return generate(config, params, prompts, mask, jax.random.PRNGKey(seed), max_new_tokens=max_new_tokens,
                    num_samples=num_samples, temperature=1.0, top_k=0, top_p=1.0, eos_ids=[eos], pad_id=0)


def full_length(rollout, max_new_tokens):
    """The rollout, after checking that the while loop ran all T steps (it exits early only when every
    row is done, and then no row reaches length T)."""
    longest = int(np.asarray(rollout.lengths).max())
    if longest != max_new_tokens:
        raise RuntimeError(f"the sampler stopped after {longest} of {max_new_tokens} steps")
    return rollout


def logp_gap(config, params, rollout) -> float:
    """Max |sampler log-prob - trainer log-prob| over the rollout's valid tokens (the trainer's
    `token_logprobs` recomputed teacher-forced on [prompt ; completion])."""
    from jaxrl_llm.models import token_logprobs
    full = jnp.concatenate([rollout.prompt_tokens, rollout.tokens], axis=1)
    full_mask = jnp.concatenate([rollout.prompt_mask, rollout.mask], axis=1)
    p = rollout.prompt_tokens.shape[1]
    ref = token_logprobs(config, params, full[:, :-1], full_mask[:, :-1], full[:, 1:], 1.0)[:, p - 1:]
    valid = np.asarray(rollout.mask).astype(bool)
    return float(np.abs(np.asarray(ref) - np.asarray(rollout.logprobs))[valid].max())
