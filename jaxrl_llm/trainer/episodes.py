"""A host-side multi-turn rollout with the existing single-turn sampler: the reference that the
multi-turn sampler (turn handling inside the jitted loop, observations prefilled into the KV cache)
must reproduce, and a working path for small runs.

Each turn re-prefills every active row's whole token sequence (prompt, then the kept ids of earlier
turns and observations) and calls `sampling.generate` for one turn: it decodes until the chat template's
turn-end token or EOS, or the per-turn budget. The ids the model sampled are kept as sampled (the turn's
text is decoded only for the environment); the observation's ids come from `envs.observation_ids`. No
text the model generated is ever re-encoded, so the trainer's teacher-forced log-probs on these tokens
equal the sampler's (tests/test_envs_rollout.py). Cost: a prefill per turn of every sequence padded to its
longest possible length (prompt + the episode's budget; one shape, one compile) -- quadratic in the
episode's length: what the multi-turn sampler removes.
`trainer/rollout.py` calls it for every rollout when `env.name` is set.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxrl_llm import envs
from jaxrl_llm.data.padding import left_pad
from jaxrl_llm.sampling import generate


@dataclasses.dataclass
class Episodes:
    """N episodes as arrays. prompt_tokens/prompt_mask (N,P) left-padded; tokens (N,T) right-padded after
    the prompt: model turns and observations; attention_mask (N,T) 1 on every real token; mask (N,T) 1 on
    the model's tokens only (trained); logprobs (N,T) the sampler's, 0 off `mask`; behavior_logprobs (N,T)
    of the distribution each token was drawn from (top-k/top-p; = logprobs without them); truncated (N,)
    bool: the episode's token budget ran out (its last turn filled it, or an observation did not fit);
    rewards (N,) the sum of each episode's turn rewards; metrics: `EpisodeBatch.metrics()`; texts: each episode's turn texts."""

    prompt_tokens: np.ndarray
    prompt_mask: np.ndarray
    tokens: np.ndarray
    attention_mask: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray
    behavior_logprobs: np.ndarray
    truncated: np.ndarray
    rewards: np.ndarray
    metrics: dict[str, float]
    texts: list[list[str]]


def sample_episodes(mc, params, tokenizer, env, rows: Sequence[Mapping[str, Any]], rng, *, max_turns: int,
                    max_new_tokens: int, max_turn_tokens: int = 0, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0, pad_id: int = 0, max_workers: int = 8) -> Episodes:
    """One episode per row of `rows` under `env` (see the module docstring). `max_new_tokens` bounds an
    episode's tokens after the prompt (model and environment); `max_turn_tokens` one turn's (0 = no
    bound but the episode's)."""
    stop_ids = envs.turn_end_ids(tokenizer)
    # EOS ends the episode, unless the template ends turns with it (Qwen2.5-Instruct's EOS is <|im_end|>).
    turn_end = tokenizer.convert_tokens_to_ids(envs.turn_end_text(tokenizer)) if tokenizer.chat_template else None
    episode_end = {tokenizer.eos_token_id} - {turn_end}
    with envs.EpisodeBatch(env, rows, max_turns=max_turns, max_workers=max_workers) as batch:
        tools = env.tool_schemas() if hasattr(env, "tool_schemas") else None
        prompts = [envs.prompt_ids(tokenizer, p, tools) for p in batch.prompts]
        trajs = [envs.Trajectory(max_new_tokens) for _ in prompts]
        logps: list[list[tuple[float, float]]] = [[] for _ in prompts]  # (sampler's, behaviour) per model token
        truncated = [False] * len(prompts)
        texts: list[list[str]] = [[] for _ in prompts]
        # One shape for every turn, hence one compile of the sampler: every sequence fits this length.
        width, turn_budget = _bucket(max(map(len, prompts)) + max_new_tokens), max_turn_tokens or max_new_tokens
        for turn in range(max_turns):
            active = [i for i in range(len(prompts)) if not batch.done[i]]
            if not active:
                break
            limits = {i: min(turn_budget, trajs[i].room()) for i in active}
            # every row, finished ones too (their draws are ignored): the batch keeps its shape
            tokens, mask = left_pad([p + tr.ids for p, tr in zip(prompts, trajs)], width, pad_id)
            out = generate(mc, params, tokens, mask, jax.random.fold_in(rng, turn), max_new_tokens=turn_budget,
                           temperature=temperature, top_k=top_k, top_p=top_p, eos_ids=stop_ids, pad_id=pad_id)
            out_tokens, out_logp, out_blogp, lengths = (np.asarray(x) for x in (out.tokens, out.logprobs,
                                                                                  out.behavior_logprobs, out.lengths))
            turn_texts: list[str | None] = [None] * len(prompts)
            stop, ended, history = [False] * len(prompts), {}, {}
            for i in active:
                n = min(int(lengths[i]), limits[i])
                ids = [int(t) for t in out_tokens[i, :n]]
                ended[i] = bool(ids) and ids[-1] in stop_ids
                trajs[i].add_model(ids)
                logps[i].extend(zip(out_logp[i, :n].tolist(), out_blogp[i, :n].tolist()))
                turn_texts[i] = tokenizer.decode(ids[:-1] if ended[i] else ids, skip_special_tokens=False)
                texts[i].append(turn_texts[i])
                # EOS (when it is not the turn end) ends the episode, as does a spent budget.
                stop[i] = (ended[i] and ids[-1] in episode_end) or not trajs[i].room()
                truncated[i] = not trajs[i].room() and not (ended[i] and ids[-1] in episode_end)
                history[i] = None if batch.history[i] is None else list(batch.history[i])
            observations = batch.step(turn_texts, cannot_continue=stop)
            for i, obs in enumerate(observations):
                if obs is not None:
                    ids = envs.observation_ids(tokenizer, history[i], turn_texts[i], obs, tools=tools,
                                               turn_ended=ended[i])
                    if not trajs[i].add_env(ids):
                        batch.done[i] = truncated[i] = True  # the observation does not fit the budget
        return _arrays(prompts, trajs, logps, truncated, batch, texts, pad_id, max_new_tokens)


def _bucket(n: int) -> int:
    """The power of two from 8 at or above n."""
    return max(8, 1 << (n - 1).bit_length())


def _arrays(prompts, trajs, logps, truncated, batch, texts, pad_id, t) -> Episodes:
    prompt_tokens, prompt_mask = left_pad(prompts, _bucket(max(map(len, prompts))), pad_id)
    n = len(prompts)
    tokens = np.full((n, t), pad_id, np.int32)
    attention, mask = np.zeros((n, t), np.int32), np.zeros((n, t), np.int32)
    logprobs, behavior = np.zeros((n, t), np.float32), np.zeros((n, t), np.float32)
    for i, tr in enumerate(trajs):
        k = len(tr.ids)
        tokens[i, :k], attention[i, :k], mask[i, :k] = tr.ids, 1, tr.mask
        model = np.flatnonzero(mask[i])
        logprobs[i, model] = [a for a, _ in logps[i]]
        behavior[i, model] = [b for _, b in logps[i]]
    return Episodes(prompt_tokens, prompt_mask, tokens, attention, mask, logprobs, behavior,
                    np.asarray(truncated, bool), batch.episode_rewards(), batch.metrics(), texts)
