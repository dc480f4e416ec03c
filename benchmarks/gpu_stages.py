"""The stages of the GPU suite (benchmarks/gpu_suite.py runs each in a process of its own) and their
pure helpers. A stage is a function of the suite's plan (`gpu_suite.PLANS`) returning a JSON-able dict.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def model_size(name: str):
    """The suite's shapes (harness/shapes.py): the real Qwen2.5-0.5B and 1.5B, and a toy for the dry run."""
    from harness.shapes import size_of
    return size_of({"toy": "gpu-toy"}.get(name, name))


# ------------------------------------------------------------------------------------- stage helpers
def random_checkpoint(path: str, name: str, dtype: str, max_positions: int):
    """A random checkpoint of shape `name` written by `save_hf` in `dtype`, loaded back: (config, params)."""
    import jax
    from harness.shapes import save_random_checkpoint

    from jaxrl_llm.models import load_hf
    save_random_checkpoint(path, model_size(name), max_positions=max_positions)
    jax.clear_caches()
    return load_hf(path, dtype=dtype)


def hf_model(path: str, torch_dtype: str, device: str):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, torch_dtype)).to(device).eval()


def torch_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_sync(x):
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return x


# ------------------------------------------------------------------------------------------- stages
def stage_env(p) -> dict:
    from harness.timing import matmul_peak_flops
    import flax
    import jax
    import jax.numpy as jnp
    import optax
    import orbax.checkpoint
    import transformers
    out = {"device": jax.devices()[0].device_kind, "platform": jax.default_backend(),
           "devices": jax.device_count(), "python": sys.version.split()[0],
           "versions": {"jax": jax.__version__, "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__")
                        else "", "flax": flax.__version__, "optax": optax.__version__,
                        "orbax": getattr(orbax.checkpoint, "__version__", ""), "transformers": transformers.__version__}}
    for name in ("torch", "trl", "datasets"):
        try:
            out["versions"][name] = __import__(name).__version__
        except ImportError:
            out["versions"][name] = "absent"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        out["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out["nvidia_smi"] = "absent"
    n = p["matmul_n"]
    out["matmul_tflops"] = {"bfloat16": matmul_peak_flops(n, dtype=jnp.bfloat16) / 1e12,
                            "float32 (default precision)": matmul_peak_flops(n // 2) / 1e12,
                            "float32 (highest)": matmul_peak_flops(n // 2, precision="highest") / 1e12}
    from jaxrl_llm.metrics import peak_flops
    out["datasheet_tflops"] = peak_flops(jax.devices()[0]) / 1e12
    return out


# With the packed passes' attention (segments and shared-prompt branches: blockwise and the cuDNN wrapper).
PYTEST = ["tests/test_models.py", "tests/test_sampling.py", "tests/test_precision.py", "tests/test_attention.py",
          "tests/test_packing.py", "-k", "transformers or trainer_logprobs or bfloat16 or precision or branch or shared "
          "or cudnn"]


def run_pytest(budget: float) -> dict:
    """The parity and sampler tests of tests/ on this device: a failure here is a GPU-only bug."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *PYTEST]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget)
    except subprocess.TimeoutExpired:
        return {"status": f"timed out after {budget:.0f} s"}
    summary = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {"returncode": proc.returncode, "summary": summary, "failed": failed[:20]}


def parity(p, hf, config, params, device: str) -> dict:
    """Max |logit difference| against transformers on the same card: float32 compute (the library's
    'highest' matmuls), float32 at XLA's default precision (what it would be without them) and bfloat16."""
    import jax
    import numpy as np
    import torch

    from jaxrl_llm.models import forward
    rows, length = p["parity_rows"], p["parity_len"]
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, config.vocab_size, (rows, length)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[1, : length // 3] = 0  # a left-padded row
    # Positions from the mask, as transformers' generate and our forward count them: without position_ids,
    # transformers numbers the padding too, which shifts the left-padded row's RoPE angles (a different
    # float32 rounding of the same relative angles: 2e-4 on that row of the 0.5B model, in transformers alone).
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    as_torch = lambda a: torch.as_tensor(a, dtype=torch.long, device=device)
    with torch.no_grad():
        ref = hf(input_ids=as_torch(tokens), attention_mask=as_torch(mask),
                 position_ids=as_torch(positions)).logits.float().cpu().numpy()
    valid = mask.astype(bool)
    scale = float(np.abs(ref[valid]).max())
    out = {}
    for label, compute, off in (("float32", "float32", False), ("float32 at XLA's default precision", "float32", True),
                                ("bfloat16", "bfloat16", False)):
        cfg = config.replace(dtype=compute)  # float32 parameters either way, as load_hf(compute_dtype=...)
        fn = jax.jit(lambda w, t, m: forward(cfg, w, t, m))  # weights as an argument: never baked into the program
        # Traced afresh (the model's own jitted functions are cached by config, not by this override).
        jax.clear_caches()
        if off:  # the same program with the library's precision request overridden
            import jaxrl_llm.models.precision as precision
            keep, precision.precision_for = precision.precision_for, lambda d: jax.default_matmul_precision("default")
            try:
                ours = np.asarray(fn(params, tokens, mask), np.float32)
            finally:
                precision.precision_for = keep
                jax.clear_caches()
        else:
            ours = np.asarray(fn(params, tokens, mask), np.float32)
        diff = float(np.abs(ours - ref)[valid].max())
        out[label] = {"max_abs": diff, "max_rel": diff / scale}
    out["max_abs_logit"] = scale
    out["rows_x_len"] = [rows, length]
    return out


def identity(p, config, params, dtype: str) -> float:
    """Max |sampler log-prob - trainer log-prob| over a rollout, the model computing in `dtype`."""
    import jax
    import numpy as np
    from harness.sampling import logp_gap

    from jaxrl_llm.sampling import generate
    config = config.replace(dtype=dtype)
    rng = np.random.default_rng(1)
    prompts = rng.integers(1, config.vocab_size, (p["identity_rows"], p["identity_prompt"])).astype(np.int32)
    mask = np.ones_like(prompts)
    mask[0, :2] = 0
    rollout = generate(config, params, prompts, mask, jax.random.PRNGKey(0), max_new_tokens=p["identity_new"],
                       eos_ids=[config.vocab_size - 1], pad_id=0)
    return logp_gap(config, params, rollout)


def stage_correctness(p, budget: float) -> dict:
    from harness.shapes import build_models
    out = {}
    if p["pytest"]:
        out["pytest"] = run_pytest(min(budget / 3, 100))
        out["pytest"]["tests"] = " ".join(PYTEST)
    device = torch_device()
    length = max(p["parity_len"], p["identity_prompt"] + p["identity_new"])
    with tempfile.TemporaryDirectory() as tmp:
        hf, config, params = build_models(tmp, model_size(p["parity"]), max_positions=length)
    out["parity"] = parity(p, hf.to(device), config, params, device)
    del hf
    out["logp_identity"] = {dtype: identity(p, config, params, dtype) for dtype in ("float32", "bfloat16")}
    return out


def sample_size(p, name: str, device: str) -> dict:
    """Ours against transformers on one model shape: every row to full length, then heavy-tailed lengths."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from harness.shapes import completion_lengths, eos_set_for_median, length_summary
    from harness.timing import once
    from jaxrl_llm.models import forward
    from jaxrl_llm.sampling import generate
    B, G, P, T = p["sampler_prompts"], p["sampler_group"], p["sampler_prompt"], p["sampler_new"]
    out = {"rows": B * G, "prompts": B, "group": G, "prompt": P, "new": T}
    with tempfile.TemporaryDirectory() as tmp:
        config, params = random_checkpoint(tmp, name, "bfloat16", P + T)
        hf = hf_model(tmp, "bfloat16", device)
    out["params"] = config.num_params()
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, config.vocab_size, (B, P)).astype(np.int32)
    mask = np.ones_like(prompts)
    # Calibrate the stop set on the model's own next-token distributions over these prompts.
    probs = jax.jit(lambda w, t, m: jax.nn.softmax(forward(config, w, t, m).astype(jnp.float32), -1).mean((0, 1)))
    eos_set = eos_set_for_median(np.asarray(probs(params, prompts[:4], mask[:4])), T / 5)
    out["eos_set_size"] = len(eos_set)
    sync_j = lambda r: (r.tokens.block_until_ready(), r)[1]

    def ours(stop):
        return lambda i: generate(config, params, prompts, mask, jax.random.PRNGKey(i), max_new_tokens=T,
                                  num_samples=G, eos_ids=stop, pad_id=0)

    def theirs(stop, fixed, new):
        def run(i):
            torch.manual_seed(i)
            with torch.inference_mode():
                return hf.generate(input_ids=torch.as_tensor(prompts, dtype=torch.long, device=device),
                                   attention_mask=torch.as_tensor(mask, dtype=torch.long, device=device),
                                   do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                                   min_new_tokens=new if fixed else 0, num_return_sequences=G, pad_token_id=0,
                                   eos_token_id=list(stop))
        return run

    theirs([config.vocab_size - 1], False, 4)(0)  # CUDA, cuBLAS and the generate loop warmed up, untimed
    for label, stop, fixed in (("full length", [config.vocab_size - 1], True), ("heavy-tailed", eos_set, False)):
        t0 = time.perf_counter()
        sync_j(ours(stop)(0))  # compilation (eos_ids are static) + a first run
        compile_s = time.perf_counter() - t0
        t_ours, rollout = once(lambda: ours(stop)(1), sync_j)
        t_hf, hf_out = once(lambda: theirs(stop, fixed, T)(1), torch_sync)
        lengths_ours = np.asarray(rollout.lengths)
        hf_new = hf_out.cpu().numpy()[:, P:]
        lengths_hf = np.full(len(hf_new), T) if fixed else completion_lengths(hf_new, stop, T)
        if fixed and (lengths_ours.max() != T or hf_new.shape[1] != T):
            raise RuntimeError(f"a full-length run stopped early: ours {lengths_ours.max()}, HF {hf_new.shape[1]} of {T}")
        useful_ours, useful_hf = int(lengths_ours.sum()), int(lengths_hf.sum())
        out[label] = {"ours_s": t_ours, "ours_compile_s": max(compile_s - t_ours, 0.0), "hf_s": t_hf,
                      "ours_useful_tps": useful_ours / t_ours, "hf_useful_tps": useful_hf / t_hf,
                      "ratio": (useful_ours / t_ours) / (useful_hf / t_hf),
                      "lengths_ours": length_summary(lengths_ours), "lengths_hf": length_summary(lengths_hf)}
    return out


def stage_sampler(p) -> dict:
    import gc

    import torch
    device, out = torch_device(), {}
    for name in p["sampler_sizes"]:
        out[name] = sample_size(p, name, device)
        gc.collect()  # the last size's models, before the next size's
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out


def stage_update(p) -> dict:
    from harness.timing import matmul_peak_flops
    import jax
    import jax.numpy as jnp
    from harness.flops import update_flops
    from harness.grpo import build_trainer, measure_update

    from jaxrl_llm.metrics import peak_flops
    on_cpu = jax.default_backend() == "cpu"
    dtype = "float32" if on_cpu else "bfloat16"
    measured = matmul_peak_flops(p["matmul_n"], dtype=jnp.dtype(dtype))
    datasheet = peak_flops(jax.devices()[0])
    out = {"dtype": dtype, "measured_peak_tflops": measured / 1e12, "datasheet_tflops": datasheet / 1e12, "runs": []}
    for B, G, P, T in p["update_shapes"]:
        with tempfile.TemporaryDirectory(prefix="gpu-suite-update-") as ws:
            trainer = build_trainer(ws, model_size(p["update_size"]), batch=B, group=G, prompt_len=P, new_tokens=T,
                                    compute_dtype=dtype, remat="full", logits_chunk=128)
            mc = trainer.mc
            timing, _ = measure_update(trainer, repeats=p["update_repeats"])
            del trainer
        useful = update_flops(mc, B, G, P, T, logits_chunk=128, remat="full")["useful"]
        achieved = useful / timing.median
        out["runs"].append({"shape": [B, G, P, T], "sequence": P + T, "tokens": B * G * T, "seconds": timing.median,
                            "compile_s": timing.warmup, "tflops": achieved / 1e12, "mfu_datasheet": achieved / datasheet,
                            "mfu_measured": achieved / measured})
    out["params"] = mc.num_params()
    return out


def stage_grpo(p, save) -> dict:
    """Each of the plan's GRPO runs in turn (`save` gets the runs so far after each one)."""
    import gc
    import importlib.util

    import grpo_iteration
    import jax
    frameworks = "ours,trl" if importlib.util.find_spec("trl") else "ours"
    device = "cpu" if jax.default_backend() == "cpu" else "cuda"
    dtype = "float32" if device == "cpu" else "bfloat16"
    runs = {}
    for label, run in p["grpo"].items():
        args = [*run, "--frameworks", frameworks, "--device", device, "--dtype", dtype,
                "--trl-python", sys.executable, "--trl-threads", str(os.cpu_count())]
        try:
            out = grpo_iteration.main(args)
        except Exception as e:  # recorded; the next run still goes
            out = {"error": " ".join(f"{type(e).__name__}: {e}".split())[-2000:]}  # the tail: a worker's exception
        out["args"] = args
        if frameworks == "ours":
            out.setdefault("lines", []).append("TRL: not installed in this environment")
        runs[label] = out
        save({"runs": runs})
        gc.collect()
    return {"runs": runs}


def stage_memory(p) -> dict:
    import jax
    import jax.numpy as jnp
    import memory_plan
    from harness.grpo import build_trainer, update_batch

    m = p["memory"]
    on_cpu = jax.default_backend() == "cpu"
    dtype = "float32" if on_cpu else "bfloat16"
    plan_args = ["--meshes", "1x1x1", "--batch_prompts", str(m["batch"]), "--group_size", str(m["group"]),
                 "--prompt_length", str(m["prompt"]), "--new_tokens", str(m["new"]), "--grad_accum",
                 str(m["grad_accum"]), "--param_dtype", dtype, "--compute_dtype", dtype, "--remat", "full"]
    plan_args += ["--model", {"toy": "toy", "1.5B": "qwen2.5-1.5b"}[m["size"]]]
    out = {"run": dict(m, dtype=dtype)}
    args = memory_plan.parse_args(plan_args)  # the plan compiled for this device
    c = memory_plan.run_config(args, m["grad_accum"])
    out["plan_device"] = memory_plan.plan_one(c, memory_plan.model_config(args), (1, 1, 1), jax.devices())
    if on_cpu:  # this device is a CPU: the documented plan is this one (memory_plan.py's CLI: tests/test_scaling.py)
        out["plan_cpu"] = out["plan_device"]
    else:
        with tempfile.TemporaryDirectory() as tmp:  # the documented plan: compiled for CPU devices
            path = os.path.join(tmp, "plan.json")
            env = dict(os.environ, JAX_PLATFORMS="cpu")
            proc = subprocess.run([sys.executable, os.path.join(HERE, "memory_plan.py"), *plan_args, "--json", path],
                                  capture_output=True, text=True, env=env, timeout=600)
            if proc.returncode:
                raise RuntimeError(f"memory_plan.py failed: {proc.stderr.strip().splitlines()[-1:]}")
            with open(path) as f:
                out["plan_cpu"] = json.load(f)[0]
    with tempfile.TemporaryDirectory(prefix="gpu-suite-memory-") as ws:
        trainer = build_trainer(ws, model_size(m["size"]), batch=m["batch"], group=m["group"], prompt_len=m["prompt"],
                                new_tokens=m["new"], compute_dtype=dtype, param_dtype=dtype, remat="full",
                                grad_accum=m["grad_accum"])
        b = update_batch(trainer, trainer.state)
        t0 = time.perf_counter()
        state, metrics = trainer.fns.update(trainer.state, b, jnp.arange(m["batch"]))
        jax.block_until_ready(state.params)
        out["update_s_with_compile"] = time.perf_counter() - t0
        stats = jax.devices()[0].memory_stats() or {}
        out["measured_peak_bytes"] = stats.get("peak_bytes_in_use")
        out["device_bytes_limit"] = stats.get("bytes_limit")
        out["loss_finite"] = bool(jnp.isfinite(metrics["loss"])) if "loss" in metrics else None
        trainer.ckpt.close()
        trainer.writer.close()
    return out
