"""Multi-turn rollouts: G episodes per prompt under an environment, on the multi-turn sampler
(`sampling.turns`). `trainer/rollout.py` calls it for every rollout when `env.name` is set.

The device holds each row's KV cache across turns; the host runs the environment between them. Per turn:
`turns.decode_turn` decodes every active row until the chat template's turn-end token, EOS or the
per-turn budget. The ids the model sampled are kept as sampled; the turn's text is decoded only for the
environment. Then the environment replies, the reply's ids are those of `envs.observation_ids` (the chat
template's suffix after the model's turn; the batch's texts are encoded in one tokenizer call), and
`turns.append` prefills them into the row's cache. No text the model generated is ever re-encoded, so the
trainer's teacher-forced log-probs on these tokens equal the sampler's (tests/test_envs_rollout.py).
tests/episodes_reference.py re-prefills each turn with the single-turn sampler instead (and encodes each
observation alone): its greedy episodes are the same (tests/test_sampling_turns.py).

Several processes: each runs the environments of its own rows (its block of the batch) and keeps their
trajectories; the device state holds every process's rows. Before each call the hosts gather what the
call needs from every row (limits, observations, rewinds) and agree on whether any row is still active,
so every host makes the same calls with the same arguments; each reads back its own rows. Row n draws
from fold_in(rng, n) with n its global index: an episode's tokens depend on its row and the key alone,
not on the process count. The metrics are over every process's episodes.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_llm import distributed as dist
from jaxrl_llm import envs
from jaxrl_llm.data.padding import left_pad
from jaxrl_llm.models.moe import NO_ROUTE
from jaxrl_llm.sampling import turns


@dataclasses.dataclass
class Episodes:
    """N episodes as arrays. prompt_tokens/prompt_mask (N,P) left-padded; tokens (N,T) right-padded after
    the prompt: model turns and observations; attention_mask (N,T) 1 on every real token; mask (N,T) 1 on
    the model's tokens only (trained); logprobs (N,T) the sampler's, 0 off `mask`; behavior_logprobs (N,T)
    of the distribution each token was drawn from (top-k/top-p; = logprobs without them); truncated (N,)
    bool: the episode's token budget ran out (its last turn filled it, or an observation did not fit);
    rewards (N,) the sum of each episode's turn rewards; metrics: `EpisodeBatch.metrics()`; texts: each episode's turn texts;
    prompts: each episode's prompt as `reset()` returned it (a string or a message list: what the logs show).
    MoE models (else None): routes (N,T,L,k) int32, the experts each token (model's or observation) was
    routed to when the sampler fed it; prompt_routes (N/G,P,L,k) per prompt (routing replay)."""

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
    prompts: list = dataclasses.field(default_factory=list)
    routes: np.ndarray | None = None
    prompt_routes: np.ndarray | None = None

    def finals(self) -> list[str]:
        """Each episode's last model turn: the text the reward functions judge."""
        return [t[-1] if t else "" for t in self.texts]

    def decoded(self, tokenizer) -> list[str]:
        """Each whole episode after its prompt as text, observations included (what the logs show)."""
        return tokenizer.batch_decode([row[:n] for row, n in zip(self.tokens, self.attention_mask.sum(1))],
                                      skip_special_tokens=False)


def sample_episodes(mc, params, tokenizer, env, rows: Sequence[Mapping[str, Any]], rng, *, max_turns: int,
                    max_new_tokens: int, max_turn_tokens: int = 0, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0, repetition_penalty: float = 1.0, min_p: float = 0.0,
                    pad_id: int = 0, max_workers: int = 8, group_size: int = 1,
                    stop_strings: Sequence[str] = (), max_failed_frac: float = 0.5) -> Episodes:
    """One episode per row of `rows` under `env` (see the module docstring). `max_new_tokens` bounds an
    episode's tokens after the prompt (model and environment); `max_turn_tokens` one turn's (0 = no
    bound but the episode's). group_size G: rows i*G .. i*G+G-1 are one prompt's group and must get the
    same prompt from `env.reset`; the sampler prefills it once for the G of them. stop_strings: a turn
    also ends where its text first contains one (kept in the turn; later tokens are dropped and the
    row's cache rewound). max_failed_frac: more failed episodes than this fraction (an environment or
    agent that raised, hung, returned what cannot be used: the statuses of envs/base.py) stop the run with
    `envs.EnvironmentFailed`, one line naming the cause; fewer are counted in the metrics and the batch
    goes on."""
    stop_ids = envs.turn_end_ids(tokenizer)
    # EOS ends the episode, unless the template ends turns with it (Qwen2.5-Instruct's EOS is <|im_end|>).
    turn_end = tokenizer.convert_tokens_to_ids(envs.turn_end_text(tokenizer)) if tokenizer.chat_template else None
    episode_end = {tokenizer.eos_token_id} - {turn_end}
    with envs.EpisodeBatch(env, rows, max_turns=max_turns, max_workers=max_workers, group_size=group_size) as batch:
        tools = env.tool_schemas() if hasattr(env, "tool_schemas") else None
        prompts = envs.prompts_ids(tokenizer, batch.prompts, tools)
        _check_groups(env, prompts, group_size)
        n = len(prompts)  # this process's rows; the device state holds every process's
        trajs = [envs.Trajectory(max_new_tokens) for _ in prompts]
        logps: list[list[tuple[float, float]]] = [[] for _ in prompts]  # (sampler's, behaviour) per model token
        truncated = [False] * n
        texts: list[list[str]] = [[] for _ in prompts]
        turn_budget = max_turn_tokens or max_new_tokens
        every_prompt = dist.allgather_lists(prompts[::group_size])
        prompt_width = turns.bucket(max(map(len, every_prompt)))
        state = turns.start(mc, params, *left_pad(every_prompt, prompt_width, pad_id),
                            capacity=max_new_tokens, num_samples=group_size,
                            repetition_penalty=repetition_penalty != 1.0)
        for _ in range(max_turns):
            active = [i for i in range(n) if not batch.done[i]]
            if not dist.any_process(bool(active)):
                break
            limit = np.zeros(n, np.int32)
            limit[active] = [min(turn_budget, trajs[i].room()) for i in active]
            state, out = turns.decode_turn(mc, params, state, rng, dist.allgather_rows(limit), max_tokens=turn_budget,
                                           stop_ids=stop_ids, temperature=temperature, top_k=top_k, top_p=top_p,
                                           repetition_penalty=repetition_penalty, min_p=min_p)
            out_tokens, out_logp, out_blogp, counts = (dist.to_local(x) for x in (out.tokens, out.logprobs,
                                                                                   out.behavior_logprobs, out.count))
            turn_texts: list[str | None] = [None] * n
            stop, ended, history = [False] * n, {}, {}
            dropped = np.zeros(n, np.int32)  # tokens drawn after a stop string: out of the row's cache
            dropped_ids: list[list[int]] = [[] for _ in range(n)]
            for i in active:
                ids = [int(t) for t in out_tokens[i, :counts[i]]]
                cut = envs.stop_string_cut(tokenizer, ids, stop_strings)
                if cut is not None and cut < len(ids):
                    dropped[i], dropped_ids[i], ids = len(ids) - cut, ids[cut:], ids[:cut]
                ended[i] = bool(ids) and ids[-1] in stop_ids
                trajs[i].add_model(ids)
                logps[i].extend(zip(out_logp[i, :len(ids)].tolist(), out_blogp[i, :len(ids)].tolist()))
                turn_texts[i] = tokenizer.decode(ids[:-1] if ended[i] else ids, skip_special_tokens=False)
                texts[i].append(turn_texts[i])
                # EOS (when it is not the turn end) ends the episode, as does a spent budget.
                stop[i] = (ended[i] and ids[-1] in episode_end) or not trajs[i].room()
                truncated[i] = not trajs[i].room() and not (ended[i] and ids[-1] in episode_end)
                history[i] = None if batch.history[i] is None else list(batch.history[i])
            observations = batch.step(turn_texts, cannot_continue=stop)
            appended = _observations(tokenizer, tools, batch, observations, history, turn_texts, ended, trajs,
                                     truncated)
            if dist.any_process(dropped.any()):
                state = _rewind(state, batch, trajs, dropped, dropped_ids, appended)
            if dist.any_process(any(appended)):
                state = turns.append(mc, params, state, dist.allgather_lists(appended), pad_id=pad_id)
        batch.end()  # every episode's `env.end`: an agent's reward comes once its episode is over
        batch.check_failures(max_failed_frac, dist.allgather_rows)
        out = _arrays(prompts, prompt_width, trajs, logps, truncated, batch, texts, pad_id, max_new_tokens)
        if state.routes is None:
            return out
        # Cache slot j holds the episode's token j (turns.py's invariant): its experts are column j's.
        routes = dist.to_local(state.routes.transpose(1, 2, 0, 3))  # (N,C,L,k) rows first, C = T
        routes = np.where(out.attention_mask[:, :, None, None] > 0, routes, NO_ROUTE)  # padding: none
        prompt_routes = dist.to_local(state.prompt_routes.transpose(1, 2, 0, 3))  # (this host's prompts,P,L,k)
        return dataclasses.replace(out, routes=routes.astype(np.int32), prompt_routes=prompt_routes)


def _observations(tokenizer, tools, batch, observations, history, turn_texts, ended, trajs, truncated):
    """Each row's observation ids ([] for none), added to its trajectory; an observation that does not fit
    the budget ends its episode, truncated."""
    out: list[list[int]] = [[] for _ in observations]
    rows, texts = [], []
    for i, obs in enumerate(observations):
        if obs is None:
            continue
        try:
            texts.append(envs.observation_text(tokenizer, history[i], turn_texts[i], obs, tools=tools,
                                               turn_ended=ended[i]))
            rows.append(i)
        except envs.TemplateDrift:
            raise  # the template's property, not the episode's: every episode would meet it
        except Exception as e:  # noqa: BLE001 - e.g. a template that refuses two user turns in a row
            # An agent's messages are its request's; an environment's, its result: either fails its episode.
            batch.fail(i, "bad_request" if isinstance(batch.env, envs.AgentEnvironment) else "malformed",
                       f"the chat template cannot render the observation: {type(e).__name__}: {e}")
    for i, ids in zip(rows, envs.encode_all(tokenizer, texts)):  # one tokenizer call for the batch's rows
        if trajs[i].add_env(ids):
            out[i] = ids
        else:
            batch.done[i] = truncated[i] = True
    return out


def _rewind(state, batch, trajs, dropped, dropped_ids, appended):
    """Drops the tokens drawn after a stop string (dropped (N,)) from the continuing rows' caches. A row
    with nothing to append next would read the dropped token's hidden state: it is rewound one token
    further and its last kept token re-fed (put in `appended`)."""
    for i in np.flatnonzero(dropped):
        if not batch.done[i] and not appended[i]:
            dropped[i] += 1
            appended[i] = trajs[i].ids[-1:]
            dropped_ids[i] = appended[i] + dropped_ids[i]
    dropped = np.where(batch.done, 0, dropped)
    return turns.rewind(state, dist.allgather_rows(dropped),
                        dist.allgather_lists([d if k else [] for d, k in zip(dropped_ids, dropped)]))


def _check_groups(env, prompts: list[list[int]], g: int) -> None:
    if g < 1 or len(prompts) % g:
        raise ValueError(f"group_size {g} does not divide the {len(prompts)} episodes")
    for i in range(0, len(prompts), g):
        if any(p != prompts[i] for p in prompts[i + 1:i + g]):
            raise ValueError(f"environment {type(env).__name__}: reset gave different prompts for the same row "
                             f"(episodes {i}..{i + g - 1}); a row's prompt must not depend on chance (keep the "
                             "randomness in the state)")


def _arrays(prompts, prompt_width, trajs, logps, truncated, batch, texts, pad_id, t) -> Episodes:
    prompt_tokens, prompt_mask = left_pad(prompts, prompt_width, pad_id)
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
                    np.asarray(truncated, bool), batch.episode_rewards(), batch.metrics(dist.allgather_rows), texts,
                    list(batch.prompts))
