"""Per-chip memory of an RL run on a device mesh, from the compiled programs themselves, without any chip.

    python benchmarks/memory_plan.py                          # Qwen2.5-7B GRPO, G=8, 1k prompt + 4k completion
    python benchmarks/memory_plan.py --meshes 1x64x1,1x16x4 --batch_prompts 64 --grad_accum 1
    python benchmarks/memory_plan.py --algo ppo               # adds the value model and its optimizer state
    python benchmarks/memory_plan.py --out docs/scaling.md    # also refresh the table in the doc
    python benchmarks/memory_plan.py --toy                    # seconds: a tiny model (keeps the script from rotting)
    python benchmarks/memory_plan.py --attention xla          # the dense attention path instead of auto's choice
    python benchmarks/memory_plan.py --pack_length 5120 --mean_new_tokens 1024   # packed score/update passes
    python benchmarks/memory_plan.py --max_tokens_per_microbatch 16384 --pack_length 16384   # a token budget
    python benchmarks/memory_plan.py --new_tokens 32768 --meshes 1x8x1x8 --max_tokens_per_microbatch 8192  # sequence 8
    python benchmarks/memory_plan.py --model qwen2.5-32b --meshes 1x8x1 --lora-rank 16   # LoRA: adapters train
    python benchmarks/memory_plan.py --model qwen2.5-1.5b --teacher qwen2.5-7b --algo opd   # distillation
    python benchmarks/memory_plan.py --model qwen2.5-1.5b --teacher qwen2.5-7b --algo gkd   # 151936 vs 152064 logits

How: the script makes as many fake CPU devices as the largest mesh needs (XLA_FLAGS, set here before jax
starts), builds the run's abstract state (jax.ShapeDtypeStruct with the trainer's shardings: nothing is
allocated), and lowers and compiles the trainer's REAL jitted functions on it: the sampler
(`sampling.generate_program`), the reference/value pass (`score`) and the update (`update`), from
`trainer.step_functions`. XLA's `memory_analysis()` of each compiled program gives the per-device bytes
of its arguments, outputs and temporaries after SPMD partitioning. With --lora-rank the state holds the
adapters and their optimizer state, the frozen base is held beside it ("params" counts both) and is
the reference itself ("reference" is 0), as in the trainer (docs/lora.md). With --teacher the frozen
teacher (in the parameter dtype, sharded like the policy) is held beside the state ("teacher"), its
forward is in the score program (opd) and, with --algo gkd, in the update too
(docs/algorithms/distillation.md). Parameters, optimizer states and the
reference are summed from their shardings (exact). The decode cache (L, N, T, Hkv, hd) for keys and
values is shown apart, from the layout the sampler's program gives it (rows like the batch over
data x fsdp, KV heads over tensor when it divides them; checked by tests/test_scaling.py); it is part
of the sampler's temporaries.

Attention: `--attention` is `model.attention`; the programs are compiled for CPU, where `auto` means the
dense path below 384 keys per query and blockwise from there (docs/attention.md), so `auto` plans what
blockwise needs (cuDNN's and splash's memory on GPU/TPU is of the same order: no T x T array).

Packing (`--pack_length` L > 0): the score and update programs run on packed rows, as many as the host
plans from the rollout's lengths, so the plan assumes completions of `--mean_new_tokens` tokens on average
packed at 90% efficiency: R = the trainer's rounding (models/packing.pack_rows) of ceil(tokens / (0.9 L))
rows per micro-batch of n rows, tokens = n/G (P - 1) + n (1 + mean) with shared prompts (the default), n (P
+ mean) without; the LM head's rows K = R L, as the trainer sets them (its chunks past the last predicting
slot are skipped at run time, and only one chunk's logits exist at a time). Longer completions need more rows.

Token budget (`--max_tokens_per_microbatch` K, train.max_tokens_per_microbatch): the score and update
programs run micro-batches of rows by tokens (trainer/microbatches.py): unpacked, shards x floor(K / (P+T))
rows each; packed, all of a pass's rows packed as above then split into micro-batches of
shards x floor(K / L) packed rows, M of them (rounded as the trainer rounds them). "grad accum" then shows
the update's M.

Sequence axis (a fourth mesh entry, DATAxFSDPxTENSORxSEQUENCE; mesh.sequence, models/context.py): the
score and update programs are compiled under the trainer's rules (`use_mesh(mesh, sequence=True)`: rows
over data x fsdp, each row's tokens over sequence, attention in shard_map), the sampler's under the plain
ones (rows over data x fsdp x sequence: the KV cache's rows too), and the token budget is per chip (a
micro-batch of a row shard holds budget x sequence tokens).

Caveat: the programs are compiled for CPU. Partitioning and buffer sizes are the same on TPU/GPU, but
the backends schedule, fuse and rematerialize differently, and XLA:CPU widens some bfloat16 arithmetic
to float32, so "temp" (activations, gradients, logits) is an estimate, usually on the high side. Keep
~10-15% headroom under the chip's memory for the runtime and fragmentation.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.hf_models import (GEMMA2_9B, GEMMA3_4B, MISTRAL_7B, QWEN3_30B_A3B, QWEN25_1_5B, QWEN25_7B,  # noqa: E402
                               QWEN25_32B, TOY)
from harness.microbatch_plan import micro_batches, packed_rows, update_micro_batches  # noqa: E402
from harness.plan_sizes import GIB, abstract, kv_cache_bytes, per_chip, table  # noqa: E402
from harness.shapes import SIZES, hf_dict  # noqa: E402  (no jax: XLA_FLAGS are set below before it starts)

MODELS = {"qwen2.5-7b": QWEN25_7B, "qwen2.5-1.5b": QWEN25_1_5B, "qwen2.5-32b": QWEN25_32B, "toy": TOY,
          "smollm2-135m": hf_dict(SIZES["135M"]), "qwen2.5-0.5b": hf_dict(SIZES["0.5B"]),
          "qwen3-30b-a3b": QWEN3_30B_A3B, "gemma2-9b": GEMMA2_9B, "gemma3-4b": GEMMA3_4B, "mistral-7b": MISTRAL_7B}
BY_SIZE = {"135M": "smollm2-135m", "0.5B": "qwen2.5-0.5b", "1.5B": "qwen2.5-1.5b", "toy": "toy"}  # --size
DEFAULT_MESHES = "1x8x1,1x2x4,1x16x1,1x4x4,1x64x1,1x16x4,1x8x8"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--meshes", default=DEFAULT_MESHES, help="comma-separated DATAxFSDPxTENSOR[xSEQUENCE] meshes")
    p.add_argument("--model", choices=list(MODELS), default="qwen2.5-7b", help="the model's shapes")
    p.add_argument("--size", choices=list(BY_SIZE), default="",
                   help="the benchmarks' shape names (harness/shapes.py) for --model: 135M, 0.5B, 1.5B, toy")
    p.add_argument("--algo", default="grpo", help="config preset (ppo adds a value model)")
    p.add_argument("--batch_prompts", type=int, default=64, help="prompts per RL step (B)")
    p.add_argument("--group_size", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--prompt_length", type=int, default=1024, help="prompt tokens (P)")
    p.add_argument("--new_tokens", type=int, default=4096, help="completion tokens (T)")
    p.add_argument("--grad_accum", type=int, default=0,
                   help="micro-batches per optimizer step; 0 = the most the mesh allows (1 prompt per row shard)")
    p.add_argument("--minibatches", type=int, default=1, help="optimizer steps per batch")
    p.add_argument("--param_dtype", default="bfloat16", help="dtype of parameters and optimizer states")
    p.add_argument("--compute_dtype", default="bfloat16", help="dtype of matmuls and activations")
    p.add_argument("--remat", default="full", help="none | full | dots")
    p.add_argument("--logits_chunk", type=int, default=128, help="sequence chunk of the log-prob pass")
    p.add_argument("--attention", default="auto", help="model.attention: auto | xla | blockwise")
    p.add_argument("--pack_length", "--pack-length", type=int, default=0,
                   help="train.pack_length: tokens per packed row of the score and update passes; 0 = off")
    p.add_argument("--max_tokens_per_microbatch", "--microbatch_tokens", dest="microbatch_tokens", type=int, default=0,
                   help="train.max_tokens_per_microbatch: score/update micro-batches of rows by this many tokens per "
                        "data x fsdp shard (packed: of packed rows); 0 = grad_accum's micro-batches of prompts")
    p.add_argument("--mean_new_tokens", "--mean-new-tokens", type=int, default=0,
                   help="mean completion length the packed plan assumes; 0 = new_tokens / 4")
    p.add_argument("--lora-rank", dest="lora_rank", type=int, default=0, help="LoRA adapters of this rank; 0 = full")
    p.add_argument("--lora-targets", dest="lora_targets", default="q,k,v,o,gate,up,down", help="LoRA targets")
    p.add_argument("--teacher", choices=list(MODELS), default="", help="a distillation teacher's shapes (teacher.path)")
    p.add_argument("--decode_slots", type=int, default=0,
                   help="rollout.decode_slots: the sampler's continuous batching (0: the static batch)")
    p.add_argument("--kv_page_size", type=int, default=0, help="rollout.kv_page_size: a paged cache (with slots)")
    p.add_argument("--kv_pages", type=int, default=0,
                   help="rollout.kv_pages per row shard; 0 = sized for --mean_new_tokens (see the docstring)")
    p.add_argument("--ragged_dot", choices=("proxy", "cpu"), default="proxy",
                   help="MoE expert products: proxy = the buffers an accelerator's grouped kernel allocates "
                        "(harness/grouped_proxy.py); cpu = XLA:CPU's masked lowering")
    p.add_argument("--toy", action="store_true", help="a tiny model and small batch on meshes of 4 devices")
    p.add_argument("--out", default="", help="markdown file whose memory-plan block is replaced")
    p.add_argument("--key", default="memory-plan", help="name of the block of --out to replace")
    p.add_argument("--json", default="", help="also write the per-chip bytes of every mesh to this JSON file")
    args = p.parse_args(argv)
    if args.size:
        args.model = BY_SIZE[args.size]
    if args.toy:
        args.model = "toy"
        args.batch_prompts, args.group_size, args.prompt_length, args.new_tokens = 4, 2, 8, 8
        args.param_dtype = args.compute_dtype = "float32"
        if args.meshes == DEFAULT_MESHES:
            args.meshes = "1x2x2"
    try:
        args.mesh_list = [tuple(int(v) for v in m.lower().split("x")) for m in args.meshes.split(",") if m]
    except ValueError:
        p.error(f"--meshes: expected DATAxFSDPxTENSOR[xSEQUENCE] entries like 1x16x4, got {args.meshes!r}")
    if not args.mesh_list or any(len(m) not in (3, 4) or min(m) < 1 for m in args.mesh_list):
        p.error(f"--meshes: expected DATAxFSDPxTENSOR[xSEQUENCE] entries of positive ints, got {args.meshes!r}")
    return args


def grad_accum_for(args, mesh_shape) -> int:
    """--grad_accum, or (0) the smallest micro-batch the mesh allows: one prompt per data x fsdp shard; 1
    with a token budget (which sets the micro-batches itself)."""
    if args.microbatch_tokens:
        return 1
    if args.grad_accum:
        return args.grad_accum
    per_step = args.batch_prompts // args.minibatches
    return max(1, per_step // (mesh_shape[0] * mesh_shape[1]))


def planned_pages(args, mesh_shape) -> int:
    """--kv_pages 0: a row shard's pool for rows of --mean_new_tokens (default T/4) on average: its prompts'
    pages plus every slot's mean row, rounded up, and one row at the cap (the fewest the sampler accepts)."""
    shards = math.prod(mesh_shape[:2]) * (mesh_shape[3] if len(mesh_shape) > 3 else 1)
    z, mean = args.kv_page_size, args.mean_new_tokens or args.new_tokens // 4
    prompts = args.batch_prompts // shards * -(-args.prompt_length // z)
    return prompts + args.decode_slots // shards * -(-mean // z) + -(-args.new_tokens // z)


def run_config(args, grad_accum: int, mesh_shape=(1, 1, 1)):
    from jaxrl_llm.config import base_config, prepare
    c = base_config()
    c.mesh.sequence = mesh_shape[3] if len(mesh_shape) > 3 else 1
    c.algo = args.algo
    c.model.path = "memory-plan"  # a non-empty path: the model config comes from the dict above
    c.model.dtype, c.model.compute_dtype = args.param_dtype, args.compute_dtype
    c.model.remat, c.model.logits_chunk, c.model.attention = args.remat, args.logits_chunk, args.attention
    c.rollout.batch_prompts, c.rollout.group_size = args.batch_prompts, args.group_size
    c.rollout.max_new_tokens = args.new_tokens
    c.rollout.decode_slots, c.rollout.kv_page_size = args.decode_slots, args.kv_page_size
    c.rollout.kv_pages = args.kv_pages or (planned_pages(args, mesh_shape) if args.kv_page_size else 0)
    c.data.path, c.data.max_prompt_length = "memory-plan", args.prompt_length
    c.train.grad_accum, c.train.minibatches = grad_accum, args.minibatches
    c.train.pack_length, c.train.max_tokens_per_microbatch = args.pack_length, args.microbatch_tokens
    c.lora.rank, c.lora.targets = args.lora_rank, args.lora_targets
    c.teacher.path = "memory-plan-teacher" if args.teacher else ""  # shapes from MODELS[args.teacher]
    return prepare(c)


def model_config(args, teacher: bool = False):
    from jaxrl_llm.models.config import config_from_hf_dict
    lora = {"lora_rank": args.lora_rank, "lora_targets": tuple(args.lora_targets.split(","))} if args.lora_rank else {}
    if teacher:
        return config_from_hf_dict(MODELS[args.teacher], source="memory_plan", param_dtype=args.param_dtype,
                                   dtype=args.compute_dtype, remat=args.remat, logits_chunk=args.logits_chunk,
                                   attention=args.attention)
    return config_from_hf_dict(MODELS[args.model], source="memory_plan", param_dtype=args.param_dtype,
                               dtype=args.compute_dtype, remat=args.remat, logits_chunk=args.logits_chunk,
                               attention=args.attention, **lora)


def abstract_packs(c, mesh, mean_new_tokens: int):
    """(score plan, update plan) as ShapeDtypeStructs (module docstring, "Packing"), or (None, None)."""
    import jax
    from jaxrl_llm import sharding
    if not c.train.pack_length:
        return None, None
    B, G, L = c.rollout.batch_prompts, c.rollout.group_size, c.train.pack_length
    mean, divisor = mean_new_tokens or c.rollout.max_new_tokens // 4, sharding.row_shards(mesh)
    rep = sharding.replicated(mesh)
    shape = lambda *s: jax.ShapeDtypeStruct(s, "int32", sharding=rep)

    def plan(m, n, r):  # the LM head's rows: every slot (chunks past the tokens skipped)
        return {"row": shape(m, n), "offset": shape(m, n), "slots": shape(m, r), "predict": shape(m, r * L)} | (
            {"prompt_offset": shape(m, n)} if c.train.pack_share_prompt else {})
    if c.train.max_tokens_per_microbatch:  # each pass packs all its rows, then splits them by the budget
        n_score, n_update = B * G, B // c.train.minibatches * G
        (ms, rs), (mu, ru) = (micro_batches(c, n, mean, divisor) for n in (n_score, n_update))
        return plan(ms, n_score, rs), plan(mu, n_update, ru)
    chunks, accum = c.train.minibatches * c.train.grad_accum, c.train.grad_accum
    n = B // chunks * G  # rows of a score chunk = rows of an update micro-batch
    r = packed_rows(c, n, mean, divisor)
    return plan(chunks, n, r), plan(accum, n, r)


def plan_one(c, mc, mesh_shape, devices, mean_new_tokens: int = 0, tmc=None) -> dict:
    """Per-device bytes of every part of the run on one mesh."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jaxrl_llm import rl, sharding
    from jaxrl_llm.models import init_params, init_value_params, lora, param_logical_axes, value_logical_axes
    from jaxrl_llm.sampling import generate_program, paged_program, slots_program
    from jaxrl_llm.trainer import TrainState, UpdatePlan, make_optimizer, step_functions

    data, fsdp, tensor, *seq = mesh_shape
    mesh = sharding.make_mesh(data, fsdp, tensor, devices=devices[:int(np.prod(mesh_shape))],
                              sequence=seq[0] if seq else 1)
    rep = sharding.replicated(mesh)
    B, G, P, T = c.rollout.batch_prompts, c.rollout.group_size, c.data.max_prompt_length, c.rollout.max_new_tokens
    N = B * G
    divisor, shards = sharding.batch_divisor(mesh), sharding.row_shards(mesh)
    micro = B // c.train.minibatches // c.train.grad_accum
    if B % divisor or micro % shards:
        raise ValueError(f"mesh {mesh_shape}: batch_prompts={B} (micro-batch {micro} prompts) is not divisible by "
                         f"data*fsdp*sequence={divisor} (micro-batch: data*fsdp={shards})")

    # ---- the abstract train state, laid out as Trainer.__init__ lays it out
    bmc = lora.base_config(mc)
    p_abs = base_abs = jax.eval_shape(lambda: init_params(bmc, jax.random.PRNGKey(0)))
    p_sh = sharding.logical_to_sharding(param_logical_axes(bmc), p_abs, mesh)
    params, base = abstract(p_abs, p_sh), None
    if mc.lora_rank:  # the state trains the adapters; the base is frozen beside it (trainer/adapters.py)
        base = params
        p_abs = lora.split(jax.eval_shape(lambda: init_params(mc, jax.random.PRNGKey(0))))[1]
        p_sh = sharding.logical_to_sharding(lora.split(param_logical_axes(mc))[1], p_abs, mesh, name="lora")
        params = abstract(p_abs, p_sh)
    total_updates = c.total_steps * c.train.epochs * c.train.minibatches
    tx, _ = make_optimizer(c.optimizer, c.optimizer.learning_rate, total_updates)
    o_abs = jax.eval_shape(tx.init, p_abs)
    opt = abstract(o_abs, sharding.optimizer_shardings(tx, o_abs, p_sh, mesh))
    value = value_opt = None
    if c.value.enabled:
        v_abs = jax.eval_shape(lambda p: init_value_params(bmc, p), base_abs)
        v_sh = sharding.logical_to_sharding(value_logical_axes(bmc), v_abs, mesh, name="value")
        value = abstract(v_abs, v_sh)
        vtx, _ = make_optimizer(c.optimizer, c.value.learning_rate, total_updates)
        vo_abs = jax.eval_shape(vtx.init, v_abs)
        value_opt = abstract(vo_abs, sharding.optimizer_shardings(vtx, vo_abs, v_sh, mesh))
    objective = rl.Objective.from_config(c)
    uses_ref, refresh = objective.uses_ref, objective.uses_ref and c.ref.refresh_every > 0
    kl_abs = jax.eval_shape(objective.kl_controller)
    scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype, sharding=rep)
    state = TrainState(step=scalar(jnp.int32), opt_step=scalar(jnp.int32),
                       rng=jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep), params=params, opt_state=opt,
                       ref_params=params if refresh else None, value_params=value, value_opt_state=value_opt,
                       kl=abstract(kl_abs, jax.tree_util.tree_map(lambda _: rep, kl_abs)), nonfinite=scalar(jnp.int32))
    ref = (params if base is None else base) if uses_ref and not refresh else None
    shardings = jax.tree_util.tree_map(lambda x: x.sharding, state)
    leaves, treedef = jax.tree_util.tree_flatten(shardings)
    fns = step_functions(objective, UpdatePlan.from_config(c), mc, mesh, treedef, tuple(leaves), tmc)
    teacher = None
    if tmc is not None:  # frozen beside the state, sharded by the same rules (trainer/teacher.py)
        t_abs = jax.eval_shape(lambda: init_params(tmc, jax.random.PRNGKey(0)))
        teacher = abstract(t_abs, sharding.logical_to_sharding(param_logical_axes(tmc), t_abs, mesh, name="teacher"))

    # ---- the rollout batch as Rollouts.device_batch builds it
    rows, vec = sharding.batch_sharding(mesh, 2), sharding.batch_sharding(mesh, 1)
    sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rows if len(shape) == 2 else vec)
    batch = {"prompt_tokens": sds((B, P), jnp.int32), "prompt_mask": sds((B, P), jnp.int32),
             "tokens": sds((N, T), jnp.int32), "mask": sds((N, T), jnp.int32), "loss_mask": sds((N, T), jnp.float32),
             "sampler_logp": sds((N, T), jnp.float32), "behavior_logp": sds((N, T), jnp.float32),
             "scores": sds((N,), jnp.float32), "truncated": sds((N,), jnp.int32)}

    out = {"params": per_chip(params) + per_chip(base), "opt": per_chip(opt),
           "ref": per_chip(state.ref_params or ref) if base is None else 0,  # LoRA: the base is the reference
           "trainable": sum(x.size for x in jax.tree_util.tree_leaves(params)),
           "value": per_chip(value) + per_chip(value_opt), "teacher": per_chip(teacher)}
    S, Z, M = c.rollout.decode_slots, c.rollout.kv_page_size, c.rollout.kv_pages
    program, static = generate_program, {}
    if S:  # continuous batching [on a paged cache]: sampling/slots.py, sampling/paged.py
        program, static = (paged_program, dict(slots=S, page_size=Z, pages=M, shards=divisor)) if Z else \
            (slots_program, dict(slots=S))
    with sharding.use_mesh(mesh):  # the sampler: rows over data x fsdp [x sequence]
        gen = program.lower(mc, lora.join(base, params), batch["prompt_tokens"], batch["prompt_mask"],
                            jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep), scalar(jnp.float32),
                            scalar(jnp.float32), max_new_tokens=T, num_samples=G, top_k=0, greedy=False,
                            nucleus=False, eos_ids=tuple(mc.eos_token_id) or (0,), pad_id=0, **static).compile()
    with sharding.use_mesh(mesh, sequence=True):  # the trainer's passes: each row's tokens over sequence
        score_pack, update_pack = abstract_packs(c, mesh, mean_new_tokens)
        score = fns.score.lower(state, ref, batch, score_pack, base, teacher).compile()
        scored = jax.eval_shape(fns.score, state, ref, batch, score_pack, base, teacher)
        full = dict(batch, **{k: sds(v.shape, v.dtype) for k, v in scored.items()})
        full.setdefault("old_logp", full["behavior_logp"])
        fields, _ = jax.eval_shape(fns.prepare, full, state.kl.value)
        full.update({k: None if v is None else sds(v.shape, v.dtype) for k, v in fields.items()})
        pidx = jax.ShapeDtypeStruct((B // c.train.minibatches,), jnp.int32, sharding=rep)
        update = fns.update.lower(state, full, pidx, update_pack, base, teacher).compile()

    mem = {name: prog.memory_analysis() for name, prog in (("sample", gen), ("score", score), ("update", update))}
    out["kv_cache"] = kv_cache_bytes(mc, N, T, mesh, S, Z, M, P)
    out["batch"] = per_chip(full)
    for name, m in mem.items():
        out[f"{name}_temp"] = int(m.temp_size_in_bytes)
        out[f"{name}_out"] = int(m.output_size_in_bytes - m.alias_size_in_bytes)
    resident = out["params"] + out["opt"] + out["ref"] + out["value"] + out["teacher"]
    out["peak"] = resident + max(out["sample_temp"] + out["sample_out"],
                                 out["batch"] + out["score_temp"] + out["score_out"],
                                 out["batch"] + out["update_temp"] + out["update_out"])
    return out


def _plan_meshes(args, mc, devices, results: list):
    """Appends (mesh, plan) for every mesh of --meshes to `results`; returns the last mesh's run config."""
    for mesh in args.mesh_list:
        print(f"compiling the sampler, score and update programs on mesh {'x'.join(map(str, mesh))} ...",
              file=sys.stderr, flush=True)
        c = run_config(args, grad_accum_for(args, mesh), mesh)
        results.append((mesh, {"grad_accum": c.train.grad_accum, "micro_batches": update_micro_batches(c, mesh, args),
                               **plan_one(c, mc, mesh, devices, args.mean_new_tokens,
                                          model_config(args, teacher=True) if args.teacher else None)}))
    return c


def main(argv=None):
    args = parse_args(argv)
    need = max(math.prod(m) for m in args.mesh_list)
    # Fake CPU devices: only this process (a script, never imported by tests) sets the flag.
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    # The programs are analysed, never run: skip LLVM's optimizations (buffer sizes are fixed before).
    flags += ["--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true"]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={need}"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import contextlib

    import jax
    from harness.flops import roofline
    from harness.grouped_proxy import grouped_products_as_on_accelerators
    from harness.report import markdown_table, update_markdown

    mc = model_config(args)
    devices = jax.devices()
    results = []
    moe_proxy = mc.num_experts > 0 and args.ragged_dot == "proxy"
    with grouped_products_as_on_accelerators() if moe_proxy else contextlib.nullcontext():
        c = _plan_meshes(args, mc, devices, results)
    headers, rows = table(results, unit=2 ** 20 if args.model == "toy" else GIB)
    name = "toy model" if args.model == "toy" else args.model.replace("qwen", "Qwen").replace("b", "B")
    title = (f"{name} {c.algo.upper()}, B={c.rollout.batch_prompts} prompts x "
             f"G={c.rollout.group_size}, P={c.data.max_prompt_length} + T={c.rollout.max_new_tokens} tokens, "
             f"params/optimizer {mc.param_dtype}, compute {mc.dtype}, remat={mc.remat}, attention={mc.attention}, "
             f"{'LoRA r=%d on %s, ' % (mc.lora_rank, args.lora_targets) if mc.lora_rank else ''}"
             f"{'teacher %s (%s), ' % (args.teacher, c.distill.kind) if args.teacher else ''}"
             f"{results[0][1]['trainable']:,} trainable parameters; "
             + (f"packed in rows of {c.train.pack_length} (mean completion {args.mean_new_tokens or c.rollout.max_new_tokens // 4}); "
                if c.train.pack_length else "unpacked; ") +
             (f"micro-batches of {c.train.max_tokens_per_microbatch} tokens per chip; "
              if c.train.max_tokens_per_microbatch else "") +
             (f"sampler: {c.rollout.decode_slots} decode slots" + (
                 f" on a paged cache of {c.rollout.kv_pages} pages of {c.rollout.kv_page_size} tokens per row shard "
                 f"(the last mesh's; rows of {args.mean_new_tokens or args.new_tokens // 4} tokens on average)"
                 if c.rollout.kv_page_size else "") + "; " if c.rollout.decode_slots else "") +
             ("expert products planned as an accelerator's grouped kernel allocates them (--ragged_dot proxy); "
              if moe_proxy else "") +
             f"{'MiB' if args.model == 'toy' else 'GiB'} per chip; fits = peak <= 90% of the chip's memory")
    text = f"{title}\n\n{markdown_table(headers, rows)}\n\n{roofline(c, mc, args.mesh_list)}\n"
    print(text)
    if args.out:
        update_markdown(args.out, args.key, text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([{"mesh": list(mesh), **r} for mesh, r in results], f, indent=1)
    return results


if __name__ == "__main__":
    main()
