"""The teacher of on-policy distillation (config `teacher`, `distill`; rl/distill.py): a second frozen model
on the training mesh, loaded like the policy from an HF directory or hub name with its own dtype. Like
the LoRA base it lives outside the train state (never donated, updated or checkpointed); its identity
(a hash of its config and arrays) is recorded with each checkpoint and a resume with another teacher is
refused. Its tokenizer must be the student's: the teacher reads the very token ids the student sampled.
Output sizes may differ (embeddings padded to other multiples): gkd compares the shared first
min(V_s, V_t) ids, provided every tokenizer id is below both (shared_vocab, check_gkd_vocab).
"""
from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import ml_collections

from jaxrl_llm import sharding
from jaxrl_llm.data import load_tokenizer
from jaxrl_llm.models import ModelConfig, init_params, load_hf, param_logical_axes
from jaxrl_llm.models.config import read_hf_config
from jaxrl_llm.trainer.adapters import base_identity

log = logging.getLogger(__name__)

TEACHER_KEY = "teacher"  # checkpoint metadata: the identity of the teacher the run distilled from


def first_vocab_difference(student_vocab: dict[str, int], teacher_vocab: dict[str, int]) -> str | None:
    """None when both map the same tokens to the same ids; else a phrase naming the first id (in id
    order) whose token differs, or the first size mismatch."""
    s = {i: t for t, i in student_vocab.items()}
    t = {i: tok for tok, i in teacher_vocab.items()}
    for i in range(max(len(s), len(t), max(s, default=-1) + 1, max(t, default=-1) + 1)):
        if s.get(i) != t.get(i):
            return f"id {i} is {s.get(i)!r} for the student and {t.get(i)!r} for the teacher"
    return None


def check_tokenizers(student, teacher, where: str) -> None:
    """A one-line refusal naming the first differing token when the two vocabularies differ."""
    diff = first_vocab_difference(student.get_vocab(), teacher.get_vocab())
    if diff is not None:
        raise ValueError(f"config.teacher.path {where}: its tokenizer differs from the student's ({diff}); the "
                         "teacher must read the student's token ids (same vocabulary)")


def shared_vocab(mc: ModelConfig, tmc: ModelConfig) -> int:
    """The ids gkd compares: the first min(V_s, V_t). Both models have the same tokenizer, whose ids are
    all below both sizes (check_gkd_vocab); the ids past it are padding rows of the embedding (sizes are
    rounded up for the hardware) that no text maps to. Equal sizes: the whole distributions, as before
    and as TRL's GKD; else the smaller model's whole distribution against the larger one's renormalised
    over the same ids (its padding logits dropped), so only padding is ever left out."""
    return min(mc.vocab_size, tmc.vocab_size)


def check_gkd_vocab(student_size: int, teacher_size: int, tokenizer_len: int, where: str) -> None:
    """A one-line refusal when a tokenizer id has no logit in one of the models (gkd compares the two
    distributions over every real token)."""
    if tokenizer_len > min(student_size, teacher_size):
        raise ValueError(f"config.teacher.path {where}: the tokenizer has {tokenizer_len} tokens but the student "
                         f"has {student_size} logits and the teacher {teacher_size}; distill.kind='gkd' needs a "
                         "logit for every token in both (use opd)")


def load_teacher(c: ml_collections.ConfigDict, tokenizer, mc: ModelConfig, mesh, resolve):
    """(teacher ModelConfig, its parameters on the mesh, its identity). `resolve` turns a hub name into a
    local directory (trainer/setup.py). Execution fields (attention, remat, chunks) follow the policy's."""
    path = resolve(c.teacher.path)
    dtype = c.teacher.dtype or c.model.dtype
    fields = dict(remat=c.model.remat, logits_chunk=c.model.logits_chunk, attention=c.model.attention,
                  attention_block=c.model.attention_block)
    tmc = read_hf_config(path, param_dtype=dtype, dtype=c.model.compute_dtype, **fields)
    check_tokenizers(tokenizer, load_tokenizer(path), c.teacher.path)
    if c.distill.kind == "gkd":
        check_gkd_vocab(mc.vocab_size, tmc.vocab_size, len(tokenizer), c.teacher.path)
    if mc.vocab_size > tmc.vocab_size:  # a sampled id past the teacher's rows would read no embedding (NaN)
        raise ValueError(f"config.teacher.path {c.teacher.path}: the student has {mc.vocab_size} logits and the teacher "
                         f"{tmc.vocab_size}; the student could sample an id the teacher has no row for: use a teacher "
                         "with at least as many")
    abstract = jax.eval_shape(lambda: init_params(tmc, jax.random.PRNGKey(0)))
    shardings = sharding.logical_to_sharding(param_logical_axes(tmc), abstract, mesh, name="teacher")
    _, params = load_hf(path, jnp.dtype(dtype), compute_dtype=c.model.compute_dtype, shardings=shardings, **fields)
    identity = base_identity(tmc, params)
    log.info("teacher %s: %d layers, hidden %d, %s (identity %s)", c.teacher.path, tmc.num_layers, tmc.hidden_size,
             dtype, identity)
    return tmc, params, identity


def check_teacher(meta: dict, identity: str | None, where: str) -> None:
    """Refuses to resume a run distilled from another teacher than the one teacher.path gives now."""
    saved = meta.get(TEACHER_KEY)
    if saved != identity and (saved is not None or identity is not None):
        raise ValueError(f"the checkpoint in {where} was distilled from another teacher (identity {saved}; "
                         f"teacher.path gives {identity}): point teacher.path at the teacher it was trained with")
