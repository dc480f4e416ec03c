"""A learned reward model: a Hugging Face `*ForSequenceClassification` checkpoint (Llama, Qwen2, Qwen3)
with one label, scoring a whole (prompt, completion) text with one float.

    rm = RewardModel.from_pretrained("path/to/rm", max_length=2048, batch_size=16)
    scores = rm(prompts, completions)                    # list[float], a reward function
    scores = rm.score_tokens(tokens, mask)               # (B,) float32, jitted

Where the score is read. transformers reads the score at the rightmost token that is not
`config.pad_token_id` (`input_ids != pad_token_id`). We read it at the LAST POSITION WHERE THE
ATTENTION MASK IS 1, for left- and right-padded rows alike. The two agree whenever the pad id never
occurs in the text. They differ when pad == eos (a common fallback) and the text ends with that
token: transformers then skips the trailing EOS and scores the token before it, while we score the
EOS itself, which is the last token the model actually attended to. The mask is explicit here, so the
pad id carries no meaning and may be any id.

Text path (`__call__`). Each (prompt, completion) is rendered as the conversation
[{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}] with the
tokenizer's chat template (no generation prompt) when it has one, else as `prompt + completion`.
Template text is tokenized without special tokens (a template that wants BOS writes it); plain text
gets BOS in front when the tokenizer prepends one (the BOS rule of `jaxrl_llm.data.prompts`). No EOS
is appended. A row longer than `max_length` keeps its LAST `max_length` tokens (a leading BOS stays in
front): the end of the completion, where the score is read, is never cut; the start of the prompt is.
Rows are scored in batches of `batch_size` rows (the last one filled with empty rows), each left-padded
to the length bucket of its longest row (`jaxrl_llm.data.bucket_length`), so at most
len(prompt_buckets(max_length)) shapes are compiled. Rows are sorted by length first, so that a batch
holds rows of similar length.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from jaxrl_llm import sharding as sharding_lib
from jaxrl_llm.compile_options import jit
from jaxrl_llm.data import prompts as prompts_lib
from jaxrl_llm.data.padding import DEFAULT_MIN_BUCKET, bucket_length, left_pad, prompt_buckets
from jaxrl_llm.data.tokenizer import has_chat_template, load_tokenizer
from jaxrl_llm.models.config import ModelConfig, read_hf_config
from jaxrl_llm.models.hf import CheckpointError, TensorIndex
from jaxrl_llm.models.lm import hidden_states, init_params
from jaxrl_llm.models.value import init_value_params, load_hf_value, value_head, value_logical_axes
from jaxrl_llm.rewards.registry import register_reward

logger = logging.getLogger(__name__)

SCORE_TENSOR = "score.weight"
_CHAT_FLAGS = ("auto", True, False)


# ------------------------------------------------------------------------------------------ scoring
def last_token_index(mask: jax.Array) -> jax.Array:
    """(B,T) 0/1 -> (B,) int32: the last column where mask == 1; -1 for a row with no valid token."""
    t = mask.shape[-1]
    columns = jnp.arange(t, dtype=jnp.int32)
    return jnp.max(jnp.where(mask.astype(bool), columns[None], -1), axis=-1)


@functools.partial(jit, static_argnames="config")
def reward_scores(config: ModelConfig, params, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """(B,) float32 scores of a left- or right-padded batch: the head at each row's last valid token.

    params: value parameters {"backbone", "head"} (`load_hf_value`); tokens, mask (B,T) int.
    Positions come from the mask, so padding on either side gives each row's score alone.
    A row with no valid token scores 0 (it holds no text to score; batch filler rows are such rows).
    """
    hidden = hidden_states(config, params["backbone"], tokens, mask)  # (B,T,D)
    last = last_token_index(mask)  # (B,)
    # Only B hidden vectors go through the head: the (B,T) values are never formed.
    h = jnp.take_along_axis(hidden, jnp.maximum(last, 0)[:, None, None], axis=1)[:, 0]  # (B,D)
    return jnp.where(last >= 0, value_head(config, params, h), 0.0)


# ------------------------------------------------------------------------------------------ loading
def check_reward_checkpoint(path: str) -> None:
    """One-line ValueError unless `path` holds a sequence-classification checkpoint with one label.

    Reads only config.json and the safetensors headers, so a wrong directory fails before any weight
    is loaded.
    """
    config_file = os.path.join(path, "config.json")
    read_hf_config(path)  # missing directory / config.json / unsupported model type: its own errors
    with open(config_file, encoding="utf-8") as f:
        raw = json.load(f)
    archs = [a for a in (raw.get("architectures") or []) if isinstance(a, str)]
    if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
        kind = "a causal LM" if any(a.endswith("ForCausalLM") for a in archs) else "not a reward model"
        raise ValueError(
            f"{config_file}: architectures {archs} is {kind}; a reward model is a *ForSequenceClassification "
            "checkpoint with num_labels=1 (AutoModelForSequenceClassification)"
        )
    labels = raw.get("num_labels", len(raw["id2label"]) if isinstance(raw.get("id2label"), dict) else None)
    if labels is not None and labels != 1:
        raise ValueError(f"{config_file}: num_labels={labels}; a reward model has exactly one label (num_labels=1)")
    index = TensorIndex(path)
    if SCORE_TENSOR not in index.where:
        hint = " (it holds lm_head.weight: a causal LM)" if "lm_head.weight" in index.where else ""
        raise CheckpointError(
            f"{path}: no tensor {SCORE_TENSOR}{hint}; a reward model is a *ForSequenceClassification "
            "checkpoint with num_labels=1"
        )
    shape = index.shape(SCORE_TENSOR)
    if len(shape) != 2 or shape[0] != 1:
        raise CheckpointError(
            f"{path}: tensor {SCORE_TENSOR} has shape {shape}; a reward model has one label, shape (1, hidden_size)"
        )


def resolve_checkpoint(path: str) -> str:
    """A local directory as is; otherwise a hub name, downloaded once (configs, safetensors, tokenizer)."""
    if os.path.isdir(os.path.expanduser(path)):
        return os.path.expanduser(path)
    if path.startswith(("/", ".", "~")) or os.path.exists(path):
        raise FileNotFoundError(f"reward model path {path!r} is not a directory")
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(path, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
    except Exception as e:  # offline, unknown repo, gated model: one line, naming the path
        raise FileNotFoundError(f"reward model path {path!r} is neither a local directory nor a downloadable "
                                f"hub model ({' '.join(str(e).split())[:160]})") from None


def _param_shardings(config: ModelConfig, mesh, rules, shardings):
    """Shardings of the value parameters: given, from logical rules, replicated on `mesh`, or None."""
    logical = value_logical_axes(config)
    is_spec = lambda x: isinstance(x, PartitionSpec)
    if shardings is not None:
        is_sharding = lambda x: isinstance(x, Sharding)
        leaves, got = jax.tree_util.tree_flatten(shardings, is_leaf=is_sharding)
        if got != jax.tree_util.tree_structure(logical, is_leaf=is_spec) or not all(map(is_sharding, leaves)):
            raise ValueError(
                "shardings must be a pytree of jax.sharding.Sharding shaped like the value parameters "
                f"{{'backbone': <decoder tree>, 'head': {{'kernel', 'bias'}}}}; got {str(got)[:100]}"
            )
        return shardings
    if mesh is None:
        return None
    if rules is not None:
        # The training mesh's helper: a dimension its mesh axes do not divide is replicated, not an error.
        shapes = jax.eval_shape(lambda: init_value_params(
            config, init_params(config, jax.random.PRNGKey(0), with_lm_head=False)))
        return sharding_lib.logical_to_sharding(logical, shapes, mesh, rules, name="reward_model")
    return jax.tree_util.tree_map(lambda _: NamedSharding(mesh, PartitionSpec()), logical, is_leaf=is_spec)


def _input_sharding(mesh, rules, batch_size: int):
    """Tokens/mask sharding: batch over the mesh axes the rules give the logical 'batch' axis."""
    if mesh is None:
        return None
    if rules is None:
        return NamedSharding(mesh, PartitionSpec())
    spec = nn.logical_to_mesh_axes(("batch", "length"), rules)
    axes = spec[0] if isinstance(spec[0], tuple) else (() if spec[0] is None else (spec[0],))
    ways = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
    if batch_size % ways:
        raise ValueError(f"batch_size={batch_size} must be a multiple of {ways}, the mesh axes {axes} of 'batch'")
    return NamedSharding(mesh, spec)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


# ------------------------------------------------------------------------------------------ the model
@dataclasses.dataclass(frozen=True, eq=False)
class RewardModel:
    """A loaded reward model; `__call__` is a reward function, `score_tokens` the jitted array path.

    Build it with `from_pretrained`. Fields: config (static), params {"backbone", "head"}, the
    tokenizer, max_length (longest scored row, tokens), batch_size (rows per jitted call), use_chat
    (render with the chat template), prepend_bos (plain text gets BOS), pad_id (filler id, any valid id),
    input_sharding (of tokens/mask, or None), min_bucket (smallest padded length).
    """

    config: ModelConfig
    params: Any
    tokenizer: Any
    max_length: int
    batch_size: int
    use_chat: bool
    prepend_bos: bool
    pad_id: int
    input_sharding: Sharding | None = None
    min_bucket: int = DEFAULT_MIN_BUCKET

    @classmethod
    def from_pretrained(cls, path: str, *, tokenizer=None, dtype=jnp.float32, compute_dtype=None,
                        max_length: int | None = None, batch_size: int = 16, mesh=None, shardings=None,
                        rules=None, use_chat_template: Any = "auto",
                        min_bucket: int = DEFAULT_MIN_BUCKET) -> "RewardModel":
        """Loads a `*ForSequenceClassification` checkpoint with num_labels=1: a local directory, or a hub
        name downloaded with `huggingface_hub.snapshot_download`.

        tokenizer: a tokenizer or a path/name for `load_tokenizer` (default: `path`).
        dtype / compute_dtype: parameter / activation dtype (compute defaults to dtype).
        max_length: longest scored row in tokens (default: the model's max_position_embeddings);
          longer rows keep their last max_length tokens.
        batch_size: rows per jitted call.
        mesh, rules, shardings: placement. `shardings` (a pytree of Shardings shaped like the value
          parameters) wins; else with a mesh, logical axis `rules` (pairs (logical, mesh axes), e.g.
          `jaxrl_llm.sharding.LOGICAL_RULES`) map `value_logical_axes(config)` to the mesh with
          `jaxrl_llm.sharding.logical_to_sharding` (a dimension its mesh axes do not divide is
          replicated), and token batches are split over the mesh axes of 'batch' (batch_size must be a
          multiple of their size); with a mesh and no rules, parameters and batches are replicated.
        use_chat_template: 'auto' (when the tokenizer has one), True (error if none) or False.
        """
        if not isinstance(path, str) or not path:
            raise ValueError(f"path must be a checkpoint directory, got {path!r}")
        batch_size = _positive_int("batch_size", batch_size)
        if max_length is not None:
            max_length = _positive_int("max_length", max_length)
        if rules is not None and mesh is None:
            raise ValueError("rules need a mesh: pass mesh=... with rules=...")
        if not isinstance(use_chat_template, (str, bool)) or use_chat_template not in _CHAT_FLAGS:
            raise ValueError(f"use_chat_template must be 'auto', True or False, got {use_chat_template!r}")
        path = resolve_checkpoint(path)
        check_reward_checkpoint(path)
        config = read_hf_config(path)
        max_length = config.max_position_embeddings if max_length is None else max_length
        prompt_buckets(max_length, min_bucket=min_bucket)  # validates min_bucket before any loading

        tok = load_tokenizer(tokenizer or path) if tokenizer is None or isinstance(tokenizer, str) else tokenizer
        if use_chat_template is True and not has_chat_template(tok):
            raise ValueError(f"use_chat_template=True but tokenizer {tok.name_or_path!r} has no chat template")
        use_chat = has_chat_template(tok) if use_chat_template == "auto" else use_chat_template
        # Any id works as filler (the mask is explicit); it only has to index the embedding.
        pad_id = next(i for i in (tok.pad_token_id, tok.eos_token_id, 0) if i is not None)
        if not 0 <= pad_id < config.vocab_size:
            raise ValueError(f"tokenizer pad id {pad_id} is outside the model's vocabulary "
                             f"(vocab_size={config.vocab_size})")
        input_sharding = _input_sharding(mesh, rules, batch_size)

        param_shardings = _param_shardings(config, mesh, rules, shardings)
        config, params = load_hf_value(path, dtype, compute_dtype=compute_dtype, shardings=param_shardings)
        if param_shardings is not None:
            params = jax.device_put(params, param_shardings)  # the head (the backbone is placed already)
        return cls(config=config, params=params, tokenizer=tok, max_length=max_length, batch_size=batch_size,
                   use_chat=bool(use_chat), prepend_bos=not use_chat and prompts_lib.tokenizer_adds_bos(tok),
                   pad_id=int(pad_id), input_sharding=input_sharding, min_bucket=min_bucket)

    # ---------------------------------------------------------------------------------- arrays
    def score_tokens(self, tokens, mask) -> jax.Array:
        """(B,T) token ids and 0/1 mask (left or right padded) -> (B,) float32 scores at each row's last
        mask==1 token; jitted, one compilation per (B,T). A row with no valid token scores 0."""
        # Host arrays stay on the host until placed: with a mesh they go straight to their shards.
        tokens, mask = (x if isinstance(x, jax.Array) else np.asarray(x) for x in (tokens, mask))
        if tokens.ndim != 2 or tokens.shape != mask.shape:
            raise ValueError(f"tokens and mask must both be (B, T); got tokens {tokens.shape} and mask {mask.shape}")
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"tokens must be integer ids, got dtype {tokens.dtype}")
        vocab = self.config.vocab_size
        if isinstance(tokens, np.ndarray) and tokens.size and not 0 <= tokens.min() <= tokens.max() < vocab:
            raise ValueError(f"tokens must lie in [0, {vocab}), got ids in [{tokens.min()}, {tokens.max()}]")
        tokens, mask = tokens.astype(jnp.int32), mask.astype(jnp.int32)
        if self.input_sharding is not None:
            tokens, mask = jax.device_put((tokens, mask), self.input_sharding)
        return reward_scores(self.config, self.params, tokens, mask)

    # ---------------------------------------------------------------------------------- text
    def encode(self, prompts: Sequence[str], completions: Sequence[str]) -> tuple[list[list[int]], int]:
        """Token ids of each rendered (prompt, completion), cut to max_length; and the number cut."""
        if self.use_chat:
            conversations = [[{"role": "user", "content": p}, {"role": "assistant", "content": c}]
                             for p, c in zip(prompts, completions)]
            try:
                texts = list(self.tokenizer.apply_chat_template(conversations, tokenize=False,
                                                                add_generation_prompt=False))
            except Exception as e:  # Jinja raises its own types; the template is the reward model's
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ValueError(f"the reward model's chat template failed: {first}") from e
        else:
            texts = [p + c for p, c in zip(prompts, completions)]
        ids = prompts_lib.encode_prompts(self.tokenizer, texts, prepend_bos=self.prepend_bos)
        cut = 0
        for i, row in enumerate(ids):
            if not row:
                raise ValueError(f"row {i}: prompt and completion render to no tokens; there is nothing to score")
            if len(row) > self.max_length:
                ids[i] = prompts_lib.truncate_left(row, self.max_length, self.tokenizer.bos_token_id)
                cut += 1
            top = max(ids[i])
            if top >= self.config.vocab_size:
                raise ValueError(f"row {i}: token id {top} >= the reward model's vocab_size={self.config.vocab_size}; "
                                 "tokenizer and checkpoint do not match")
        return ids, cut

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns) -> list[float]:
        """Reward function: one score per (prompt, completion); other columns are ignored."""
        for name, texts in (("prompts", prompts), ("completions", completions)):
            if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
                raise ValueError(f"{name} must be a list of strings")
        if len(prompts) != len(completions):
            raise ValueError(f"prompts has {len(prompts)} rows but completions has {len(completions)}")
        ids, cut = self.encode(prompts, completions)
        if cut:
            logger.warning("reward model: %d of %d rows longer than max_length=%d were cut from the left",
                           cut, len(ids), self.max_length)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        scores = np.zeros((len(ids),), np.float32)
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            chunk = [ids[i] for i in rows]
            length = bucket_length(max(map(len, chunk)), self.max_length, min_bucket=self.min_bucket)
            # Filler rows are empty (mask 0): constant (batch_size, bucket) shapes, their scores unread.
            tokens, mask = left_pad(chunk + [[]] * (self.batch_size - len(chunk)), length, self.pad_id)
            scores[rows] = np.asarray(self.score_tokens(tokens, mask))[:len(chunk)]
        return [float(s) for s in scores]


# ------------------------------------------------------------------------------------------ registry
@register_reward("reward_model", factory=True)
def reward_model(path: str, *, tokenizer=None, dtype="float32", compute_dtype=None, max_length=None,
                 batch_size: int = 16, mesh=None, shardings=None, rules=None,
                 use_chat_template="auto") -> RewardModel:
    """Factory of the `reward_model` reward: `get_reward_fn("reward_model", path=...)`.

    Keyword arguments as `RewardModel.from_pretrained`; dtypes may be names ("bfloat16").
    """
    return RewardModel.from_pretrained(path, tokenizer=tokenizer, dtype=jnp.dtype(dtype),
                                       compute_dtype=None if compute_dtype is None else jnp.dtype(compute_dtype),
                                       max_length=max_length, batch_size=batch_size, mesh=mesh,
                                       shardings=shardings, rules=rules, use_chat_template=use_chat_template)
