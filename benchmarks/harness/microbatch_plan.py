"""The micro-batches benchmarks/memory_plan.py plans for: packed rows of a pass, and the count and size of
micro-batches by a token budget (train.max_tokens_per_microbatch), as the trainer chooses them. jax is
imported by the functions, not here (memory_plan sets XLA_FLAGS before jax starts)."""
from __future__ import annotations

import math


def packed_rows(c, n: int, mean: int, divisor: int) -> int:
    """Packed rows of `n` rows of a mean completion of `mean` tokens at 90% efficiency, rounded as the trainer
    rounds them (benchmarks/memory_plan.py, "Packing")."""
    from jaxrl_llm.models.packing import pack_rows
    G, P, L = c.rollout.group_size, c.data.max_prompt_length, c.train.pack_length
    tokens = n // G * (P - 1) + n * (1 + mean) if c.train.pack_share_prompt else n * (P + mean)
    return pack_rows(math.ceil(tokens / (0.9 * L)), divisor, cap=n)


def micro_batches(c, n: int, mean: int, divisor: int) -> tuple[int, int]:
    """(M micro-batches, rows each) of a pass over `n` rows with a token budget, as the trainer chooses
    them: unpacked, rows by trainer/microbatches.rows_per_micro; packed (rows = packed rows), all the
    rows packed, then split (trainer/packs.py `_split`)."""
    from jaxrl_llm.models.packing import pack_rows
    from jaxrl_llm.trainer.microbatches import rows_per_micro
    budget, L = c.train.max_tokens_per_microbatch * c.mesh.sequence, c.train.pack_length  # per row shard
    if not L:
        r = rows_per_micro(budget, c.data.max_prompt_length + c.rollout.max_new_tokens, divisor, n)
        return -(-n // r), r
    per_micro = divisor * (budget // L)
    return pack_rows(-(-packed_rows(c, n, mean, 1) // per_micro), 1, cap=2 ** 62), per_micro


def update_micro_batches(c, mesh_shape, args) -> int:
    """The update's micro-batches with a token budget (0 without one: grad_accum's)."""
    if not c.train.max_tokens_per_microbatch:
        return 0
    rows = c.rollout.batch_prompts // c.train.minibatches * c.rollout.group_size
    mean = args.mean_new_tokens or c.rollout.max_new_tokens // 4
    return micro_batches(c, rows, mean, mesh_shape[0] * mesh_shape[1])[0]
