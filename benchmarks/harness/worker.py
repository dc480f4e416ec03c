"""A framework in a subprocess of its own, one GRPO iteration per 'go' line on stdin (`peers.Worker`):

    python -m harness.worker trl|tunix|ours '<json settings>'     # run from benchmarks/, by the parent

TRL runs in its own virtualenv (benchmarks/.venv/trl, or `--trl-python`), Tunix in benchmarks/.venv/tunix,
jaxrl_llm in this one; each reports its setup time, lengths and peak RSS. Top-level imports are the
standard library's: the peers' virtualenvs have no jax.
"""
from __future__ import annotations

import json
import os
import sys
import time
import types

from harness.grpo import even_words
from harness.memory import device_peak_gib, peak_rss_gib
from harness.peers import emit, wait_for_go


# ------------------------------------------------------------------------------------------------ TRL
def trl_worker(args) -> None:
    """GRPOTrainer on the workspace, one iteration per 'go' line read from stdin (see `Worker`)."""
    import datasets
    import torch
    import transformers
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tokenizer = transformers.AutoTokenizer.from_pretrained(os.path.join(args.workspace, "tokenizer"))
    data = datasets.load_dataset("json", data_files=os.path.join(args.workspace, "prompts.jsonl"), split="train")
    n = args.batch * args.group
    config = GRPOConfig(
        output_dir=os.path.join(args.workspace, f"trl-out-{args.threads}"), use_cpu=args.device == "cpu",
        bf16=args.dtype == "bfloat16", fp16=False,
        gradient_checkpointing=False, per_device_train_batch_size=n, gradient_accumulation_steps=1,
        num_generations=args.group, max_completion_length=args.new_tokens,
        generation_kwargs={} if args.heavy_tailed else {"min_new_tokens": args.new_tokens},
        temperature=1.0, top_k=0, top_p=1.0,
        beta=0.04, loss_type="grpo", num_iterations=1, learning_rate=1e-6, max_grad_norm=1.0,
        max_steps=args.steps, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, seed=0, use_vllm=False)
    lengths = {"prompt": set(), "completion": [], "completion_min": [], "completion_max": []}

    class Handshake(TrainerCallback):
        def on_step_begin(self, *_, **__):
            wait_for_go()

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "completions/mean_length" in logs:
                lengths["completion"].append(logs["completions/mean_length"])
                lengths["completion_min"].append(logs.get("completions/min_length"))
                lengths["completion_max"].append(logs.get("completions/max_length"))

    trainer = GRPOTrainer(model=os.path.join(args.workspace, "model"), reward_funcs=[even_words], args=config,
                          train_dataset=data, processing_class=tokenizer, callbacks=[Handshake()])
    tokenize = trainer._tokenize_prompts

    def recording(prompts):  # only records the prompt lengths TRL generates from
        out = tokenize(prompts)
        lengths["prompt"].update(len(ids) for ids in out[0])
        return out

    trainer._tokenize_prompts = recording
    emit("setup", seconds=time.perf_counter() - t0, torch=torch.__version__,
         trl=__import__("trl").__version__, threads=torch.get_num_threads())
    trainer.train()
    emit("done", prompt_lengths=sorted(lengths["prompt"]), completion_mean_lengths=lengths["completion"],
         completion_min_lengths=lengths["completion_min"], completion_max_lengths=lengths["completion_max"],
         peak_rss_gib=peak_rss_gib(), device_peak_gib=device_peak_gib("torch"))


# ---------------------------------------------------------------------------------------------- Tunix
def tunix_config(model_dir: str):
    """Tunix's Qwen2 ModelConfig from the transformers config.json beside the safetensors (float32)."""
    from tunix.models.qwen2 import model as qwen2
    with open(os.path.join(model_dir, "config.json")) as f:
        hf = json.load(f)
    # transformers 5 nests rope_theta under rope_parameters; older configs keep it at the top level.
    rope_theta = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    return qwen2.ModelConfig(
        num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"], rope_theta=rope_theta, norm_eps=hf["rms_norm_eps"],
        use_tied_embedding=hf.get("tie_word_embeddings", False))


def tunix_worker(args) -> None:
    """Tunix's GRPOLearner with the vanilla rollout on the workspace, one iteration per 'go' line read
    from stdin (see `Worker`); reports 'unavailable' with the reason when it cannot be built here.

    The checkpoint goes through Tunix's own Qwen2 classes and safetensors loader (one copy for the
    actor, which the rollout shares since both sit on the same 1-device mesh, so no weight sync; one
    for the reference). Settings mirror `trl_worker`: G completions per prompt, temperature 1, no
    top-k/top-p, `--new-tokens` new tokens, beta 0.04 with the k3 ('low_var_kl') estimator as TRL's,
    seq-mean-token-mean, one AdamW step (lr 1e-6, no weight decay, grad-norm clip 1.0) per iteration.
    """
    t0 = time.perf_counter()
    try:
        from importlib.metadata import version

        import jax
        import jax.numpy as jnp
        import numpy as np
        import optax
        import transformers
        from absl import logging as absl_logging
        from flax import nnx
        from tunix.models.qwen2 import params as qwen2_params
        from tunix.rl import rl_cluster as rl_cluster_lib
        from tunix.rl.grpo import grpo_learner
        from tunix.rl.rollout import base_rollout

        # The parent drains our stderr only at exit: keep Tunix's absl INFO chatter out of the pipe.
        absl_logging.set_verbosity(absl_logging.ERROR)
        B, G, P, T = args.batch, args.group, args.prompt_len, args.new_tokens
        model_dir = os.path.join(args.workspace, "model")
        config = tunix_config(model_dir)
        # Tunix's models name the mesh axes 'fsdp' and 'tp'; one CPU device holds everything. Auto axes
        # as Tunix's own mesh helper makes them (jax's default, Explicit, fails its embedding gather).
        mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), devices=jax.devices()[:1],
                             axis_types=(jax.sharding.AxisType.Auto,) * 2)
        actor = qwen2_params.create_model_from_safe_tensors(model_dir, config, mesh, dtype=jnp.float32)
        reference = qwen2_params.create_model_from_safe_tensors(model_dir, config, mesh, dtype=jnp.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(os.path.join(args.workspace, "tokenizer"))
        rollout = base_rollout.RolloutConfig(
            max_tokens_to_generate=T, temperature=1.0, top_p=1.0, top_k=None, max_prompt_length=P,
            kv_cache_size=P + T)  # the decode step attends over the whole cache: no slack
        training = rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6, weight_decay=0.0)),
            eval_every_n_steps=10 ** 9, max_steps=args.steps)
        roles = rl_cluster_lib.Role
        cluster = rl_cluster_lib.RLCluster(
            actor=actor, reference=reference, tokenizer=tokenizer,
            cluster_config=rl_cluster_lib.ClusterConfig(
                role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
                rollout_engine="vanilla", offload_to_cpu=False, training_config=training,
                rollout_config=rollout))
        learner = grpo_learner.GRPOLearner(
            rl_cluster=cluster, reward_fns=[even_words],
            algo_config=grpo_learner.GRPOConfig(
                num_generations=G, num_iterations=1, beta=0.04, epsilon=0.2, kl_loss_mode="low_var_kl",
                loss_agg_mode="sequence-mean-token-mean"))
    except Exception as e:  # noqa: BLE001 - the reason is the report
        tb = __import__("traceback").extract_tb(e.__traceback__)[-1]
        emit("unavailable", reason=f"{type(e).__name__} at {os.path.basename(tb.filename)}:{tb.lineno}: "
                                   f"{' '.join(str(e).split())[:300]}")
        return

    with open(os.path.join(args.workspace, "prompts.jsonl")) as f:
        prompts = [json.loads(line)["prompt"] for line in f]
    lengths = {"prompt": set(), "completion": []}
    generate = cluster.generate

    def recording(*a, **kw):
        """`generate`, with a fresh sampling seed per iteration (Tunix's sampler uses PRNGKey(0) on every
        call unless told otherwise), recording the prompt and completion lengths it generated."""
        rollout.seed = len(lengths["completion"])
        out = generate(*a, **kw)
        lengths["prompt"].update(int(n) for n in (out.left_padded_prompt_tokens != cluster.rollout.pad_id()).sum(-1))
        lengths["completion"].append(float(np.mean([len(t) for t in out.tokens])))
        return out

    cluster.generate = recording

    def batches():
        """B prompts per iteration; pulling one starts an iteration, so the handshake sits here. The
        update of the previous one is dispatched asynchronously: wait for it before saying 'ready'."""
        for i in range(args.steps):
            jax.block_until_ready(nnx.state(cluster.actor_trainer.model))
            wait_for_go()
            yield {"prompts": np.array(prompts[i * B:(i + 1) * B])}  # an array: Tunix repeats it G times

    emit("setup", seconds=time.perf_counter() - t0, framework=f"tunix {version('google-tunix')}",
         jax=jax.__version__, threads=len(os.sched_getaffinity(0)))
    learner.train(batches())
    emit("done", prompt_lengths=sorted(lengths["prompt"]), completion_mean_lengths=lengths["completion"],
         peak_rss_gib=peak_rss_gib())


# ------------------------------------------------------------------------------------------ jaxrl_llm
def ours_worker(args) -> None:
    """jaxrl_llm's Trainer: one `train_step` per 'go' (state kept between steps); then, with `stages`,
    each stage of the step timed alone. Its own process, so its peak RSS is its alone (no torch)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import jax

    from harness.grpo import ours_config, stage_times
    from jaxrl_llm.trainer import Trainer
    t0 = time.perf_counter()
    ours = types.SimpleNamespace(trainer=Trainer(ours_config(args.workspace, args),
                                                 os.path.join(args.workspace, "ours-run")))
    ours.state = ours.trainer.state
    emit("setup", seconds=time.perf_counter() - t0, framework=f"jaxrl_llm, jax {jax.__version__}",
         threads=os.cpu_count())
    metrics = []
    for _ in range(args.steps):
        wait_for_go()
        ours.state, m, _ = ours.trainer.train_step(ours.state)
        jax.block_until_ready(ours.state.params)
        metrics.append({k: float(m[k]) for k in ("response_length/mean", "response_length/min",
                                                 "response_length/max", "sampler/logp_diff_max") if k in m})
    # The parent times a step up to the worker's next 'ready' or 'done': say it now, or the last step's
    # time would include the stage timing below (minutes at 0.5B, and the median of 2 repeats is a mean).
    emit("ready")
    stages = stage_times(ours, args.stages) if args.stages else {}
    emit("done", metrics=metrics, stages=stages, peak_rss_gib=peak_rss_gib(), device_peak_gib=device_peak_gib("jax"))
    ours.trainer.ckpt.close()
    ours.trainer.writer.close()


if __name__ == "__main__":
    worker = {"trl": trl_worker, "tunix": tunix_worker, "ours": ours_worker}[sys.argv[1]]
    worker(types.SimpleNamespace(**json.loads(sys.argv[2])))
