"""One full GRPO iteration -- generate, reward, reference log-probs, one update epoch -- against TRL's
`GRPOTrainer` (and Tunix when it installs), same checkpoint, tokenizer, batch and reward, side by side.

    python benchmarks/grpo_iteration.py                            # 3M Qwen2, 8 prompts x G=8, 32 + 64 tokens
    python benchmarks/grpo_iteration.py --out docs/benchmarks.md   # also refresh the results block there
    python benchmarks/grpo_iteration.py --toy --frameworks ours    # seconds: keeps the script from rotting
    python benchmarks/grpo_iteration.py --prompt-len 64 --new-tokens 512 --heavy-tailed --decode-slots 16 --pack-length 1024

Environments. jaxrl_llm runs in this process (the main virtualenv). TRL runs in a subprocess of its own
virtualenv, `benchmarks/.venv/trl` (git-ignored, created on first use with `torch==2.13.0` pinned, the
CPU build on disk here -- plain `torch` would pull a multi-GB CUDA build -- and `trl==1.16.0`), so that
TRL never enters the main environment. Tunix (`google-tunix`) gets `benchmarks/.venv/tunix` and runs its
own `GRPOLearner` with the vanilla rollout on its own Qwen2 model loaded from the same safetensors (see
`tunix_worker`); the script reports why when it cannot run.

What is compared. The checkpoint is a random Qwen2 (`--size`, ~3M parameters by default, untied head)
saved by transformers, with a word-level tokenizer of the same vocabulary (`w<id>` words) saved beside it;
prompts are 32 random words = 32 tokens. Both sides: 8 prompts x G=8 completions, temperature 1, no
top-k/top-p, exactly 64 new tokens (TRL: `min_new_tokens=64`; ours: fixed shapes, so a row that draws
the EOS early costs the same), GRPO loss ('grpo' = seq-mean-token-mean) with beta = 0.04 (so both run a
reference forward), one optimizer step of AdamW per iteration (no gradient accumulation, no old-log-prob
recomputation: the samples are on-policy), the same reward function (`even_words`) on decoded text,
float32, no gradient checkpointing. TRL: `use_vllm=False`, transformers `generate` on CPU; torch runs with
1 thread and with 2 (the faster is the one compared, see benchmarks/sampler.py for why).

Heavy-tailed lengths (`--heavy-tailed`): instead of exactly T new tokens, a row ends at the first of a set
of stop ids, written as generation_config.json's `eos_token_id` list, which both TRL (its
`eos_token_ids`, for generation and its completion mask) and jaxrl_llm (`trainer.setup.eos_ids_of`) read.
A random model's next-token distribution is close to uniform, so the set (`gpu_stages.eos_set_for_median`
on the mean next-token probabilities over the prompts) gives geometric lengths with median `--median` x T,
cut at T. Both sides draw from the same distribution (not the same draws); the lengths of both are
reported. `--decode-slots` sets our `rollout.decode_slots` (continuous batching), `--pack-length` our
`train.pack_length` (sequence packing of the score and update passes).

Timing. The iterations of all frameworks alternate (ours, TRL, ours, TRL, ...; TRL's training loop waits
on a pipe between steps), so the load of a shared machine hits them alike. The first `--warmup`
iterations (jit compilation, torch's lazy init) are reported separately; then the median of `--repeats`.
An iteration is timed from its start to the start of the next one (data, generation, rewards on the host,
reference log-probs, forward + backward, optimizer step, logging). `--wait-idle` waits before each timed
iteration until other processes leave the machine idle.

FLOPs and the roofline. `iteration_flops` counts the matmul and attention FLOPs of the minimal work of
one iteration: generation (prompt prefill + one decode step per new token, LM head included), the
reference forward, and the policy forward + backward (3x a forward), with the prompt computed once per
group (prefix sharing) -- and, for comparison, without sharing (what TRL does: every completion row
carries its prompt). The roofline time is those FLOPs over the matmul peak measured in the same run (a
jitted 2048x2048 float32 matmul).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENVS = os.path.join(HERE, ".venv")  # git-ignored (".venv/" in .gitignore)
# What each framework's virtualenv installs, in order (torch first and pinned: see the module docstring).
VENV_PACKAGES = {"trl": [["torch==2.13.0"], ["trl==1.16.0"]], "tunix": [["google-tunix==0.1.7"]]}

# Qwen2-style decoders (GQA, q/k/v biases, untied head). 3M: as benchmarks/sampler.py's.
SIZES = {
    "3M": dict(vocab_size=8192, hidden_size=128, intermediate_size=512, num_layers=4, num_heads=4, num_kv_heads=2),
    "toy": dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2),
    # Qwen2.5-0.5B's shapes (tied embeddings), random weights: the GPU suite's model (benchmarks/gpu_suite.py).
    "0.5B": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                 num_kv_heads=2, tie_word_embeddings=True),
}
PAD, EOS = "<pad>", "<eos>"  # ids 0 and 1; word w<i> has id i
WORD = re.compile(r"w(\d+)")


# ------------------------------------------------------------------------- shared by every process
def even_words(prompts, completions, **_):
    """Fraction of the completion's words with an even id: differs between the samples of a group, so
    every group has a nonzero advantage. Same signature in jaxrl_llm and TRL: lists of texts -> floats."""
    out = []
    for text in completions:
        ids = [int(m) for m in WORD.findall(text)]
        out.append(sum(1 for i in ids if i % 2 == 0) / max(len(ids), 1))
    return out


def make_tokenizer(vocab_size: int):
    """A word-level tokenizer: `<pad>` 0, `<eos>` 1, then `w2` .. `w<V-1>`, split on whitespace, no
    special token added on encode: a prompt of k words is exactly k tokens in both libraries."""
    import tokenizers
    import transformers
    from tokenizers import models, pre_tokenizers
    vocab = {PAD: 0, EOS: 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD, eos_token=EOS)


def emit(event: str, **data) -> None:
    """One protocol line to the parent (other output of the libraries is ignored)."""
    print("@@ " + json.dumps({"event": event, **data}), flush=True)


# ------------------------------------------------------------------------------------------- FLOPs
def iteration_flops(config, batch: int, group: int, prompt_len: int, new_tokens: int, *,
                    prefix_shared: bool = True) -> dict[str, float]:
    """FLOPs of the minimal work of one GRPO iteration, by stage (metrics.flops_per_token per token:
    2 per weight of the blocks [+ LM head] and 4*H*hd per key of attention and layer).

    B prompts of P tokens, N = B*G completions of T tokens. A forward scores T tokens per row: the LM
    head runs N*T times; the blocks run the prompt (B*P tokens, or N*P without prefix sharing) and the
    first T-1 completion tokens (the last token predicts nothing). Token i of a sequence attends to i+1
    keys, so a run of tokens at positions a..b-1 costs count * flops_per_token(context = mean of i+1),
    attention being linear in the context. Generation: the same blocks' work (prefill, then T-1 decode
    steps) and N*T draws' LM head. Returns {'generation', 'reference', 'policy_fwd_bwd', 'total'}.
    """
    from jaxrl_llm.metrics import flops_per_token
    B, G, P, T = batch, group, prompt_len, new_tokens
    if min(B, G, P, T) < 1:
        raise ValueError(f"batch, group, prompt_len and new_tokens must be >= 1, got {B}, {G}, {P}, {T}")
    N = B * G

    def blocks(rows, start, stop):
        """Block FLOPs of `rows` sequences' tokens at positions start..stop-1 (no LM head)."""
        count = stop - start
        return 0.0 if count <= 0 else rows * count * flops_per_token(config, (start + stop + 1) / 2, lm_head=False)

    head = 2.0 * config.hidden_size * config.vocab_size * N * T
    prompt_rows = B if prefix_shared else N
    forward = blocks(prompt_rows, 0, P) + blocks(N, P, P + T - 1) + head
    return {"generation": forward, "reference": forward, "policy_fwd_bwd": 3 * forward, "total": 6 * forward}


# ------------------------------------------------------------------------------ TRL (its own venv)
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
            emit("ready")
            if sys.stdin.readline().strip() != "go":
                raise SystemExit(0)

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
         completion_min_lengths=lengths["completion_min"], completion_max_lengths=lengths["completion_max"])


# ---------------------------------------------------------------------------- Tunix (its own venv)
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
            emit("ready")
            if sys.stdin.readline().strip() != "go":
                raise SystemExit(0)
            yield {"prompts": np.array(prompts[i * B:(i + 1) * B])}  # an array: Tunix repeats it G times

    emit("setup", seconds=time.perf_counter() - t0, framework=f"tunix {version('google-tunix')}",
         jax=jax.__version__, threads=len(os.sched_getaffinity(0)))
    learner.train(batches())
    emit("done", prompt_lengths=sorted(lengths["prompt"]), completion_mean_lengths=lengths["completion"])


# ------------------------------------------------------------------------------ parent: processes
def ensure_venv(name: str, log) -> str:
    """The python of benchmarks/.venv/<name>, created and installed on first use."""
    venv = os.path.join(VENVS, name)
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, ".installed")
    if os.path.exists(marker):
        return python
    log(f"creating {venv} ({', '.join(p for step in VENV_PACKAGES[name] for p in step)}); minutes, once")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    for packages in VENV_PACKAGES[name]:
        proc = subprocess.run([python, "-m", "pip", "install", "-q", *packages], capture_output=True, text=True)
        if proc.returncode:
            tail = " ".join(proc.stderr.strip().splitlines()[-3:])[:400]
            raise RuntimeError(f"pip install {' '.join(packages)} into {venv} failed: {tail}")
    with open(marker, "w") as f:
        f.write("ok\n")
    return python


class Worker:
    """A framework in a subprocess of its own venv, stepping one iteration per `step()` call."""

    def __init__(self, python: str, args: list[str], log, keep_path: bool = False):
        # A venv of its own must not see this process's packages; a given interpreter keeps its PYTHONPATH
        # (the GPU suite's wheels are there).
        drop = () if keep_path else ("PYTHONPATH", "VIRTUAL_ENV")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        # stderr goes to a file, read only on failure: a pipe nobody drains blocks a chatty worker.
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env, cwd=HERE)
        self.log = log
        self.events: dict[str, dict] = {}

    def expect(self, *events: str) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self._stderr.seek(0)
                err = self._stderr.read()[-3000:]
                raise RuntimeError(f"worker exited (code {self.proc.wait()}) before {events}: {err}")
            if line.startswith("@@ "):
                msg = json.loads(line[3:])
                self.events[msg["event"]] = msg
                if msg["event"] in events:
                    return msg

    def step(self, _i=None) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        self.expect("ready", "done")

    def close(self) -> dict:
        done = self.expect("done") if "done" not in self.events else self.events["done"]
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        return done


# ------------------------------------------------------------------------------ parent: jaxrl_llm
def make_workspace(path: str, size_name: str, num_prompts: int, prompt_len: int, seed: int = 0,
                   max_positions: int = 1024):
    """model/ (random Qwen2 saved by transformers), tokenizer/ and prompts.jsonl under `path`."""
    import numpy as np
    sys.path.insert(0, HERE)
    from common import ModelSize, build_models
    size = ModelSize(size_name, **SIZES[size_name])
    build_models(os.path.join(path, "model"), size, seed=seed, max_positions=max_positions)
    make_tokenizer(size.vocab_size).save_pretrained(os.path.join(path, "tokenizer"))
    rng = np.random.default_rng(seed)
    with open(os.path.join(path, "prompts.jsonl"), "w") as f:
        for _ in range(num_prompts):
            words = rng.integers(2, size.vocab_size, prompt_len)
            f.write(json.dumps({"prompt": " ".join(f"w{i}" for i in words)}) + "\n")


def heavy_tailed_stop_ids(path: str, median: float) -> list[int]:
    """Writes the stop ids (EOS and a set calibrated for geometric lengths of `median`, see the module
    docstring) into the workspace model's generation_config.json; returns them."""
    import jax
    import numpy as np

    from gpu_stages import eos_set_for_median
    from jaxrl_llm.models import forward, load_hf
    config, params = load_hf(os.path.join(path, "model"))
    with open(os.path.join(path, "prompts.jsonl")) as f:
        prompts = np.array([[int(w) for w in WORD.findall(json.loads(line)["prompt"])] for line in f][:16])
    probs = jax.nn.softmax(forward(config, params, prompts, np.ones_like(prompts)), -1).mean((0, 1))
    stop = sorted({1, *eos_set_for_median(np.asarray(probs), median, exclude=(0,))})  # 1 is <eos>
    gen_path = os.path.join(path, "model", "generation_config.json")
    gen = json.load(open(gen_path)) if os.path.exists(gen_path) else {}
    with open(gen_path, "w") as f:
        json.dump({**gen, "eos_token_id": stop}, f)
    return stop


def ours_config(workspace: str, args):
    """The GRPO preset on the workspace, with TRL's settings where they differ from our defaults."""
    from jaxrl_llm.config import base_config
    c = base_config()
    c.algo = "grpo"  # kl.coef 0.04, seq-mean-token-mean ('grpo' in TRL), group-scaled advantages
    c.model.path = os.path.join(workspace, "model")
    c.tokenizer = os.path.join(workspace, "tokenizer")
    c.data.path = os.path.join(workspace, "prompts.jsonl")
    c.data.prompt_column, c.data.answer_column = "prompt", ""
    c.data.use_chat_template = False
    c.data.max_prompt_length = args.prompt_len
    c.model.compute_dtype = getattr(args, "dtype", "float32")
    c.reward.functions = "grpo_iteration:even_words"
    c.rollout.batch_prompts, c.rollout.group_size = args.batch, args.group
    c.rollout.max_new_tokens = args.new_tokens
    c.rollout.decode_slots = getattr(args, "decode_slots", 0)
    c.train.pack_length = getattr(args, "pack_length", 0)
    c.optimizer.learning_rate = 1e-6
    c.total_steps = 10 ** 6
    c.checkpoint.every_steps, c.checkpoint.async_save = 10 ** 6, False
    c.log.progress, c.log.tensorboard = False, False
    c.export.at_end, c.export.plot = False, False
    return c


class Ours:
    """jaxrl_llm's Trainer in this process; `step()` is one `train_step` (state kept between calls)."""

    def __init__(self, workspace: str, args):
        from jaxrl_llm.trainer import Trainer
        t0 = time.perf_counter()
        self.trainer = Trainer(ours_config(workspace, args), os.path.join(workspace, "ours-run"))
        self.state = self.trainer.state
        self.setup_s = time.perf_counter() - t0
        self.metrics: list[dict] = []

    def step(self, _i=None):
        self.state, m, _ = self.trainer.train_step(self.state)
        self.metrics.append(m)
        return self.state.params


def stage_times(ours: Ours, repeats: int) -> dict[str, float]:
    """Median seconds of each stage of `train_step`, each synchronized: rollout (generation + rewards on
    the host), reference log-probs, advantages, the update. Uses the trainer's own jitted functions."""
    import statistics

    import jax
    t = ours.trainer
    rows: dict[str, list[float]] = {}

    def timed(name, fn):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn())
        rows.setdefault(name, []).append(time.perf_counter() - t0)
        return out

    state = ours.state
    for i in range(repeats + 1):
        key = jax.random.fold_in(state.rng, i)
        local, _, _ = timed("generate + rewards", lambda: t.rollouts.collect(state.params, key))
        b = timed("to device", lambda: t.rollouts.device_batch(local))
        ref = state.ref_params if state.ref_params is not None else t.frozen_ref
        b.update(timed("reference log-probs", lambda: t.fns.score(state, ref, b)))
        b.setdefault("old_logp", b["behavior_logp"])
        b.update(timed("advantages", lambda: t.fns.prepare(b, state.kl.value))[0])
        pidx = jax.numpy.arange(t.c.rollout.batch_prompts)
        state, _ = timed("update (fwd + bwd + AdamW)", lambda: t.fns.update(state, b, pidx))
        if i == 0:
            rows = {}
    ours.state = state
    return {k: statistics.median(v) for k, v in rows.items()}


def length_line(name, means, mins, maxs, cap) -> str:
    """One framework's completion lengths over all its iterations: the per-iteration means, the extremes."""
    valid = [x for x in mins if x is not None], [x for x in maxs if x is not None]
    return (f"{name} completion lengths: mean per iteration {min(means):.1f}..{max(means):.1f} (overall "
            f"{sum(means) / len(means):.1f}), min {min(valid[0], default=float('nan')):.0f}, max "
            f"{max(valid[1], default=float('nan')):.0f} of {cap}")


# ------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", choices=["trl", "tunix"], help=argparse.SUPPRESS)
    p.add_argument("--workspace", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--size", choices=list(SIZES), default="3M")
    p.add_argument("--toy", action="store_true", help="toy model and batch, 1 timed iteration (smoke test)")
    p.add_argument("--frameworks", default="ours,trl,tunix", help="comma-separated: ours, trl, tunix")
    p.add_argument("--trl-threads", default="1,2", help="torch thread counts to run TRL with (CPU)")
    p.add_argument("--trl-python", default="", help="run TRL with this interpreter instead of benchmarks/.venv/trl")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="TRL's device (ours: JAX's default)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="compute dtype of both (TRL: bf16 autocast over float32 weights, ours: model.compute_dtype)")
    p.add_argument("--batch", type=int, default=8, help="prompts per iteration")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--heavy-tailed", action="store_true", help="heavy-tailed completion lengths (module docstring)")
    p.add_argument("--median", type=float, default=0.2, help="--heavy-tailed: median length / --new-tokens")
    p.add_argument("--decode-slots", type=int, default=0, help="our rollout.decode_slots (0 = all rows)")
    p.add_argument("--pack-length", type=int, default=0,
                   help="our train.pack_length (0 = unpacked; at least --prompt-len + --new-tokens)")
    p.add_argument("--warmup", type=int, default=2, help="iterations not timed (compilation, warm-up)")
    p.add_argument("--repeats", type=int, default=7, help="timed iterations per framework")
    p.add_argument("--stages", action="store_true", help="also time each stage of our iteration")
    p.add_argument("--wait-idle", action="store_true", help="wait for an idle machine before each iteration")
    p.add_argument("--out", default="", help="markdown file whose grpo-iteration block is rewritten")
    args = p.parse_args(argv)
    if args.toy:
        args.size, args.batch, args.group, args.prompt_len = "toy", 2, 2, 4
        args.new_tokens = 16 if args.heavy_tailed else 4  # a median of at least one token
        args.warmup, args.repeats = 1, 1
    for name in ("batch", "group", "prompt_len", "new_tokens", "warmup", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.group < 2:
        raise ValueError(f"--group must be >= 2 (GRPO normalizes within a group), got {args.group}")
    unknown = set(args.frameworks.split(",")) - {"ours", "trl", "tunix"}
    if unknown:
        raise ValueError(f"--frameworks: unknown {sorted(unknown)}; expected ours, trl, tunix")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return {"trl": trl_worker, "tunix": tunix_worker}[args.worker](args)

    sys.path.insert(0, HERE)
    from common import machine_description, markdown_table, matmul_peak_flops, time_interleaved, wait_for_idle

    log = lambda *a: print(*a, flush=True)
    frameworks = args.frameworks.split(",")
    B, G, P, T = args.batch, args.group, args.prompt_len, args.new_tokens
    steps = args.warmup + args.repeats
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as ws:
        make_workspace(ws, args.size, num_prompts=max(64, B * steps), prompt_len=P, max_positions=max(1024, P + T))
        stop = heavy_tailed_stop_ids(ws, args.median * T) if args.heavy_tailed else []
        if stop:
            log(f"heavy-tailed: {len(stop)} stop ids for a median of {args.median * T:.0f} of {T} tokens")
        workers, unavailable = {}, {}
        if "trl" in frameworks:
            python = args.trl_python or ensure_venv("trl", log)
            thread_counts = sorted({int(x) for x in args.trl_threads.split(",")}) if args.device == "cpu" else [1]
            for threads in thread_counts:
                w = Worker(python, ["--worker", "trl", "--workspace", ws, "--threads", str(threads),
                                    "--steps", str(steps), "--batch", str(B), "--group", str(G),
                                    "--prompt-len", str(P), "--new-tokens", str(T), "--device", args.device,
                                    "--dtype", args.dtype, *(["--heavy-tailed"] if args.heavy_tailed else [])],
                           log, keep_path=bool(args.trl_python))
                label = f"{threads} thread{'s' * (threads > 1)}" if args.device == "cpu" else args.device
                workers[f"TRL ({label})"] = w
        if "tunix" in frameworks:
            try:
                w = Worker(ensure_venv("tunix", log), ["--worker", "tunix", "--workspace", ws, "--steps", str(steps),
                                                       "--batch", str(B), "--group", str(G), "--prompt-len", str(P),
                                                       "--new-tokens", str(T)], log)
                msg = w.expect("unavailable", "setup")
                if msg["event"] == "unavailable":
                    unavailable["Tunix"] = msg["reason"]
                    w.proc.stdin.close()
                    w.proc.wait(timeout=60)
                else:
                    workers["Tunix"] = w
            except RuntimeError as e:
                unavailable["Tunix"] = " ".join(str(e).split())[:400]
        ours = Ours(ws, args) if "ours" in frameworks else None
        setup = {"jaxrl_llm": ours.setup_s} if ours else {}
        for name, w in workers.items():
            msg = w.events.get("setup") or w.expect("setup")  # Tunix's was read when it was started
            setup[name] = msg["seconds"]
            if "trl" in msg:
                log(f"{name}: torch {msg['torch']}, trl {msg['trl']}, {msg['threads']} threads")
            else:  # Tunix: jax in its own venv, XLA's CPU threads
                log(f"{name}: {msg['framework']}, jax {msg['jax']}, {msg['threads']} threads")
        for w in workers.values():
            w.expect("ready")

        peak = matmul_peak_flops()
        fns = ({"jaxrl_llm": ours.step} if ours else {}) | {name: w.step for name, w in workers.items()}
        idle = (lambda: wait_for_idle(timeout=60)) if args.wait_idle else None
        load_before = os.getloadavg()[0]
        timings = time_interleaved(fns, repeats=args.repeats, warmup=args.warmup, before_each=idle)
        load_after = os.getloadavg()[0]
        done = {name: w.close() for name, w in workers.items()}
        stages = stage_times(ours, args.repeats) if (ours and args.stages) else {}

        config = ours.trainer.mc if ours else None
        if config is None:
            from jaxrl_llm.models import read_hf_config
            config = read_hf_config(os.path.join(ws, "model"))

    flops = iteration_flops(config, B, G, P, T)
    flops_unshared = iteration_flops(config, B, G, P, T, prefix_shared=False)
    roofline = flops["total"] / peak
    log(f"\n{machine_description()}")
    log(f"model {args.size}: {config.num_params() / 1e6:.2f}M parameters; {B} prompts x G={G}, {P} prompt + "
        f"{T} new tokens; load average {load_before:.2f} before, {load_after:.2f} after the timed iterations")
    log(f"measured matmul peak {peak / 1e9:.0f} GFLOP/s; iteration {flops['total'] / 1e9:.2f} GFLOP with the "
        f"prompt shared across its group ({flops_unshared['total'] / 1e9:.2f} without): roofline "
        f"{roofline * 1e3:.0f} ms")
    for stage in ("generation", "reference", "policy_fwd_bwd"):
        log(f"  {stage}: {flops[stage] / 1e9:.2f} GFLOP")
    length_lines = []
    if ours:
        m = ours.metrics
        gaps = [x["sampler/logp_diff_max"] for x in m]
        length_lines.append(length_line("jaxrl_llm", [x["response_length/mean"] for x in m],
                                         [x["response_length/min"] for x in m], [x["response_length/max"] for x in m], T))
        log(f"{length_lines[-1]}; sampler vs trainer log-prob max gap {max(gaps):.2e}")
    for name, d in done.items():
        if "completion_min_lengths" in d:
            length_lines.append(length_line(name, d["completion_mean_lengths"], d["completion_min_lengths"],
                                            d["completion_max_lengths"], T))
        log(f"{name}: prompt lengths {d['prompt_lengths']}, completion mean lengths "
            f"{min(d['completion_mean_lengths'], default=float('nan')):.1f}..{max(d['completion_mean_lengths'], default=float('nan')):.1f}")

    headers = ["framework", "setup s", "first iteration s", "iteration s (median)", "spread", "iterations/s",
               "x roofline", "GFLOP/s"]
    rows = []
    for name, tm in timings.items():
        rows.append([name, setup.get(name, float("nan")), tm.first, tm.median, tm.spread, 1 / tm.median,
                     tm.median / roofline, flops["total"] / tm.median / 1e9])
    table = markdown_table(headers, rows)
    log("\n" + table)
    ratio_lines = []
    if ours:
        for name in workers:
            ratio = timings[name].median / timings["jaxrl_llm"].median
            ratio_lines.append(f"jaxrl_llm / {name} iterations/s ratio: {ratio:.2f}x")
        trl = [n for n in workers if n.startswith("TRL")]
        if trl:
            best = min(trl, key=lambda n: timings[n].median)
            ratio_lines.append(f"ratio against the faster TRL ({best}): "
                               f"{timings[best].median / timings['jaxrl_llm'].median:.2f}x "
                               f"(target >= {3 if args.heavy_tailed else 2}x)")
    for name, reason in unavailable.items():
        ratio_lines.append(f"{name}: not run -- {reason}")
    ratio_lines += length_lines
    for line in ratio_lines:
        log(line)
    stage_table = ""
    if stages:
        stage_table = markdown_table(["stage of our iteration", "seconds (median)", "share"],
                                     [[k, v, v / sum(stages.values())] for k, v in stages.items()])
        log("\n" + stage_table)
    if args.out:
        from common import update_markdown
        body = (f"Measured on {machine_description()}; load average {load_before:.2f} before and "
                f"{load_after:.2f} after the timed iterations.\n\n"
                f"Model {args.size} ({config.num_params() / 1e6:.2f}M parameters), {B} prompts x G={G}, {P} prompt + "
                f"{T} new tokens{f' (heavy-tailed: {len(stop)} stop ids, median {args.median * T:.0f}; FLOPs and roofline count every row at full length)' if stop else ''}"
                f", rollout.decode_slots={args.decode_slots}, train.pack_length={args.pack_length}. Matmul peak {peak / 1e9:.0f} GFLOP/s; iteration {flops['total'] / 1e9:.2f} GFLOP "
                f"(generation {flops['generation'] / 1e9:.2f}, reference {flops['reference'] / 1e9:.2f}, policy "
                f"forward + backward {flops['policy_fwd_bwd'] / 1e9:.2f}; {flops_unshared['total'] / 1e9:.2f} without "
                f"prefix sharing): roofline {roofline * 1e3:.0f} ms.\n\n{table}\n\n"
                + "\n".join(f"- {line}" for line in ratio_lines) + (f"\n\n{stage_table}" if stage_table else ""))
        update_markdown(args.out, "grpo-iteration-results", body)
    return {"timings": {name: {"first": tm.first, "median": tm.median, "spread": tm.spread}
                        for name, tm in timings.items()},
            "setup_s": setup, "flops": flops, "roofline_s": roofline, "peak_flops": peak, "lines": ratio_lines,
            "params": config.num_params(), "unavailable": unavailable}


if __name__ == "__main__":
    main()
