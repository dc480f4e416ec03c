"""Token-in-token-out: the token ids of an episode are the ones the model sampled plus the ones of the
environment's observations, never a re-encoding of text the model generated.

After a model turn (its sampled ids, ending with the chat template's turn-end token), the observation is
turned into the ids to append by rendering the chat template twice -- the history with the assistant
turn, and the same plus the observation and the next generation prompt -- checking that the first is
a prefix of the second, and encoding only the text after the assistant's turn end. The model's ids stay
as sampled; the trainer's score pass recomputes log-probs on exactly those tokens.

`Trajectory` accumulates the ids with the loss mask: 1 on model tokens, 0 on environment tokens.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxrl_llm.envs.base import Observation
from jaxrl_llm.envs.runner import as_messages

# Turn-end tokens of the common chat templates (ChatML/Qwen, Llama 3, Gemma, Phi-3).
KNOWN_TURN_ENDS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>")
_PROBE = "jaxrl probe 7f3a"  # an assistant text no template rewrites, to find what follows a turn


class TemplateDrift(ValueError):
    """The chat template renders earlier turns differently once later ones follow."""


def _render(tokenizer, messages, tools, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(list(messages), tools=tools, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def turn_end_text(tokenizer) -> str:
    """The special token that closes an assistant turn in `tokenizer`'s chat template (e.g. `<|im_end|>`)."""
    text = _render(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}],
                   None, False)
    after = text[text.rindex(_PROBE) + len(_PROBE):]
    specials = sorted(set(tokenizer.all_special_tokens) | set(KNOWN_TURN_ENDS), key=len, reverse=True)
    for i in range(len(after)):
        for s in specials:
            if after.startswith(s, i):
                return s
    raise ValueError("the chat template closes an assistant turn with no special token; it cannot mark turn ends")


def turn_end_ids(tokenizer) -> list[int]:
    """The ids that end a model turn: the template's turn-end token (with a chat template) and EOS."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    if getattr(tokenizer, "chat_template", None):
        ids.add(tokenizer.convert_tokens_to_ids(turn_end_text(tokenizer)))
    return sorted(ids)


def stop_string_cut(tokenizer, ids: Sequence[int], stop_strings: Sequence[str]) -> int | None:
    """The fewest leading `ids` whose text contains one of `stop_strings` (the turn ends there, the string
    included), or None when the whole text contains none. A binary search over prefixes: a prefix's
    text contains a stop string whenever a shorter prefix's does."""
    text = lambda k: tokenizer.decode(list(ids[:k]), skip_special_tokens=False)
    found = lambda k: any(s in text(k) for s in stop_strings)
    if not stop_strings or not ids or not found(len(ids)):
        return None
    lo, hi = 1, len(ids)  # found(hi) holds; find the smallest such k
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if found(mid) else (mid + 1, hi)
    return lo


def neutralize_specials(tokenizer, text: str) -> str:
    """`text` with every special-token string broken by a zero-width space, so that an environment's
    output (a tool's stdout: anything the policy made it print) can never forge a turn boundary."""
    for s in sorted(set(tokenizer.all_special_tokens) | set(KNOWN_TURN_ENDS), key=len, reverse=True):
        if len(s) > 1 and s in text:
            text = text.replace(s, s[0] + "\u200b" + s[1:])
    return text


def encode_all(tokenizer, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
    """`tokenizer.encode(t, add_special_tokens=...)` of each text, in one call of the tokenizer (a fast
    tokenizer encodes the batch in Rust: a batch's episodes need no Python call per row)."""
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"]]


def prompt_ids(tokenizer, prompt: str | Sequence[dict], tools: list[dict] | None = None) -> list[int]:
    """Ids of an episode's initial prompt: messages through the chat template (with the generation
    prompt and the tools), a text as the tokenizer encodes it."""
    return prompts_ids(tokenizer, [prompt], tools)[0]


def prompts_ids(tokenizer, prompts: Sequence[str | Sequence[dict]],
                tools: list[dict] | None = None) -> list[list[int]]:
    """`prompt_ids` of each prompt, encoded in (at most) two batched calls: the texts, the rendered chats."""
    texts = iter(encode_all(tokenizer, [p for p in prompts if isinstance(p, str)], add_special_tokens=True))
    chats = iter(encode_all(tokenizer, [_render(tokenizer, p, tools, True) for p in prompts
                                        if not isinstance(p, str)]))
    return [next(texts) if isinstance(p, str) else next(chats) for p in prompts]


def observation_ids(tokenizer, history: Sequence[dict] | None, turn_text: str, observation: Observation, *,
                    tools: list[dict] | None = None, turn_ended: bool = True) -> list[int]:
    """The ids to append after a model turn: the encoded `observation_text` (see there)."""
    return encode_all(tokenizer, [observation_text(tokenizer, history, turn_text, observation, tools=tools,
                                                   turn_ended=turn_ended)])[0]


def observation_text(tokenizer, history: Sequence[dict] | None, turn_text: str, observation: Observation, *,
                     tools: list[dict] | None = None, turn_ended: bool = True) -> str:
    """The text whose ids are appended after a model turn (encoded without special tokens): the
    observation and, in a chat, the template's framing around it up to the next assistant generation prompt.

    history: the messages before the turn (None: a text episode, the observation text is encoded as is).
    turn_text: the model's turn, decoded (only to render the template; its ids are never re-encoded).
    turn_ended: whether the model's ids end with the turn-end token; False (the per-turn budget cut the
      turn) makes the text start with that token, so that the next turn starts in a closed one.
    Raises TemplateDrift if the template renders the history differently once the observation follows.
    """
    if history is None:
        if not isinstance(observation, str):
            raise ValueError("a text episode (no chat messages) needs text observations, got messages")
        return observation
    obs = [{**m, "content": neutralize_specials(tokenizer, m["content"])} for m in as_messages(observation)]
    turn = [*history, {"role": "assistant", "content": turn_text}]
    before = _render(tokenizer, turn, tools, False)
    after = _render(tokenizer, [*turn, *obs], tools, True)
    if not after.startswith(before):
        at = next(i for i, (a, b) in enumerate(zip(before + "\0", after)) if a != b)
        raise TemplateDrift(f"the chat template renders the history differently once an observation follows "
                            f"(first difference at character {at}: {before[at:at + 30]!r}); its earlier turns "
                            "would not match the tokens the model saw")
    end = turn_end_text(tokenizer)
    pos = before.rfind(end)
    if pos < 0 or pos < before.rfind(turn_text):
        raise ValueError(f"the rendered assistant turn does not end with {end!r}")
    return after[pos + len(end) if turn_ended else pos:]


@dataclasses.dataclass
class Trajectory:
    """One episode as a token sequence: `ids` after the prompt, `mask` 1 on model tokens (trained), 0 on
    environment tokens (context only). `budget`: the most ids after the prompt (rollout.max_new_tokens)."""

    budget: int
    ids: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)

    def room(self) -> int:
        return self.budget - len(self.ids)

    def add_model(self, ids: Sequence[int]) -> None:
        self._add(ids, 1)

    def add_env(self, ids: Sequence[int]) -> bool:
        """Appends the observation's ids if they fit with room for at least one model token after them;
        False (nothing appended: the episode ends, truncated) otherwise."""
        if len(ids) + 1 > self.room():
            return False
        self._add(ids, 0)
        return True

    def _add(self, ids: Sequence[int], flag: int) -> None:
        if len(ids) > self.room():
            raise ValueError(f"{len(ids)} ids do not fit in the {self.room()} left of the budget")
        self.ids.extend(int(i) for i in ids)
        self.mask.extend([flag] * len(ids))
