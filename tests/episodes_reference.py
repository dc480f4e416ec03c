"""The slow, independent reference of the multi-turn sampler (tests only): each turn re-prefills every
row's whole token sequence (prompt, then the kept ids of earlier turns and observations) and calls the
single-turn `sampling.generate`. Same episode rules as `trainer.episodes.sample_episodes` (stop tokens,
budgets, observations through `envs.observation_ids`); only the way tokens are decoded differs, so the
two give the same greedy episodes. Its random stream is `generate`'s, not the multi-turn sampler's."""
from __future__ import annotations

import jax
import numpy as np

from jaxrl_llm import envs
from jaxrl_llm.data.padding import left_pad
from jaxrl_llm.sampling import generate
from jaxrl_llm.sampling.turns import bucket
from jaxrl_llm.trainer.episodes import _arrays


def reference_episodes(mc, params, tokenizer, env, rows, rng, *, max_turns, max_new_tokens, max_turn_tokens=0,
                       temperature=1.0, top_k=0, top_p=1.0, pad_id=0, stop_strings=()):
    stop_ids = envs.turn_end_ids(tokenizer)
    turn_end = tokenizer.convert_tokens_to_ids(envs.turn_end_text(tokenizer)) if tokenizer.chat_template else None
    episode_end = {tokenizer.eos_token_id} - {turn_end}
    with envs.EpisodeBatch(env, rows, max_turns=max_turns, max_workers=1) as batch:
        tools = env.tool_schemas() if hasattr(env, "tool_schemas") else None
        prompts = [envs.prompt_ids(tokenizer, p, tools) for p in batch.prompts]
        trajs = [envs.Trajectory(max_new_tokens) for _ in prompts]
        logps = [[] for _ in prompts]
        truncated = [False] * len(prompts)
        texts = [[] for _ in prompts]
        width, turn_budget = bucket(max(map(len, prompts)) + max_new_tokens), max_turn_tokens or max_new_tokens
        for turn in range(max_turns):
            active = [i for i in range(len(prompts)) if not batch.done[i]]
            if not active:
                break
            limits = {i: min(turn_budget, trajs[i].room()) for i in active}
            tokens, mask = left_pad([p + tr.ids for p, tr in zip(prompts, trajs)], width, pad_id)
            out = generate(mc, params, tokens, mask, jax.random.fold_in(rng, turn), max_new_tokens=turn_budget,
                           temperature=temperature, top_k=top_k, top_p=top_p, eos_ids=stop_ids, pad_id=pad_id)
            out_tokens, out_logp, out_blogp, lengths = (np.asarray(x) for x in (out.tokens, out.logprobs,
                                                                                  out.behavior_logprobs, out.lengths))
            turn_texts = [None] * len(prompts)
            stop, ended, history = [False] * len(prompts), {}, {}
            for i in active:
                n = min(int(lengths[i]), limits[i])
                n = envs.stop_string_cut(tokenizer, out_tokens[i, :n].tolist(), stop_strings) or n
                ids = [int(t) for t in out_tokens[i, :n]]
                ended[i] = bool(ids) and ids[-1] in stop_ids
                trajs[i].add_model(ids)
                logps[i].extend(zip(out_logp[i, :n].tolist(), out_blogp[i, :n].tolist()))
                turn_texts[i] = tokenizer.decode(ids[:-1] if ended[i] else ids, skip_special_tokens=False)
                texts[i].append(turn_texts[i])
                stop[i] = (ended[i] and ids[-1] in episode_end) or not trajs[i].room()
                truncated[i] = not trajs[i].room() and not (ended[i] and ids[-1] in episode_end)
                history[i] = None if batch.history[i] is None else list(batch.history[i])
            observations = batch.step(turn_texts, cannot_continue=stop)
            for i, obs in enumerate(observations):
                if obs is not None:
                    ids = envs.observation_ids(tokenizer, history[i], turn_texts[i], obs, tools=tools,
                                               turn_ended=ended[i])
                    if not trajs[i].add_env(ids):
                        batch.done[i] = truncated[i] = True
        return _arrays(prompts, bucket(max(map(len, prompts))), trajs, logps, truncated, batch, texts, pad_id,
                       max_new_tokens)
