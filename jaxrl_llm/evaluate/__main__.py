"""Command line of held-out evaluation: a checkpoint of a run, or any Hugging Face model.

  python -m jaxrl_llm.evaluate --workdir=DIR [--step=N] [--out=OUT] [--config.eval.path=FILE ...]
  python -m jaxrl_llm.evaluate --model=HF_DIR --config=configs/FILE.py[:arg] --out=OUT [--config.eval.k=16 ...]

With --workdir the run's own config (config.json) decides everything, so a checkpoint evaluated here
gives the numbers the loop logged for that step (eval.every_steps on, same mesh); `--config.eval.*`
overrides change the evaluation only (another held-out set, k, temperature, ...). A run trained on its
own data.path without eval.path held out 1 prompt in eval.holdout when it evaluated periodically: that
slice is its held-out set here too. With --model the
config file names the data, rewards and eval section, and the model is HF_DIR (e.g. the base model
before training). Prints a table; writes the report `<name>.json` and every sample `<name>.samples.jsonl`
to OUT (default DIR/eval), name `step_<N>` or `model`. Deterministic given the seed. Multi-host like
`jaxrl_llm.train` (--coordinator/--num_processes/--process_id, or from the environment): every process
samples its share of each batch, the metrics cover all of them, and process 0 writes its own samples.
"""
from __future__ import annotations

import json

from absl import app, flags
from etils import epath
from ml_collections import config_flags

from jaxrl_llm.cli import flags_parser, run_cli, setup_logging, use_compilation_cache
from jaxrl_llm.evaluate.overrides import run_config

_WORKDIR = flags.DEFINE_string("workdir", None, "Workdir of a training run: evaluate one of its checkpoints.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step; the latest when omitted.")
_MODEL = flags.DEFINE_string("model", None, "A Hugging Face model directory (or hub name) to evaluate instead.")
_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file for --model: configs/FILE.py[:arg].",
                                          lock_config=True)
_OUT = flags.DEFINE_string("out", None, "Directory of the report and samples; default <workdir>/eval.")
_COORDINATOR = flags.DEFINE_string("coordinator", "", "Multi-host: address host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Multi-host: number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "Multi-host: index of this process.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Full tracebacks.")


_EVAL_OVERRIDES: list[str] = []  # --config.eval.* arguments given with --workdir (no config file to apply them to)


def parse_flags(argv):
    """absl's parse, after taking the `--config.*` overrides out of argv when --workdir comes without a
    config file: `run_config` applies them to the run's config.json."""
    config_file = any(a == "--config" or a.startswith("--config=") for a in argv)
    if any(a.startswith("--workdir") for a in argv) and not config_file:
        _EVAL_OVERRIDES[:] = [a for a in argv[1:] if a.startswith("--config.")]
        argv = [a for a in argv if not a.startswith("--config.")]
    return flags_parser("jaxrl_llm.evaluate")(argv)


def evaluate_run(c, source: str, workdir: str | None, step: int | None):
    """(metrics, this process's samples, step or None, number of prompts): the held-out evaluation of a
    checkpoint or of c.model.path."""
    import jax

    from jaxrl_llm import evaluate, sharding
    from jaxrl_llm.checkpoint import Checkpointer
    from jaxrl_llm.trainer import adapters, setup

    mesh = sharding.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor, expert=c.mesh.expert, sequence=c.mesh.sequence)
    setup.check_batch_fits(c, mesh)
    reward_fns = setup.build_rewards(evaluate.reward_config(c), mesh)
    model_path, tokenizer, mc, eos_ids, pad_id = setup.load_model_config(c)
    setup.check_pool(c, mesh, mc)
    if source == "model":
        params, _ = setup.load_params(c, mc, model_path, mesh, jax.random.PRNGKey(c.seed))
    else:  # a LoRA run's adapters go on its base, read from model.path (or drawn from the seed)
        base = setup.load_params(c, mc, model_path, mesh, adapters.base_rng(c.seed))[0] if mc.lora_rank else None
        ckpt = Checkpointer(str(epath.Path(workdir) / "checkpoints"), async_save=False)
        try:
            step, params = adapters.restore_policy(mc, base, ckpt, step, mesh, workdir)
        finally:
            ckpt.close()
    rows = evaluate.load_eval_data(c, tokenizer)
    reward_fns = setup.user_rewards(evaluate.reward_config(c), reward_fns, rows)  # as training passed them
    evaluator = evaluate.Evaluator(c, mc, mesh, tokenizer, reward_fns, eos_ids, pad_id, rows)
    metrics, samples = evaluator(params, step=step if source == "checkpoint" else 0)
    return metrics, samples, step if source == "checkpoint" else None, evaluator.num_prompts


def write_report(out: str, name: str, report: dict, samples: list[dict]) -> tuple[str, str]:
    """`<out>/<name>.json` and `<out>/<name>.samples.jsonl`, each written whole then renamed."""
    from jaxrl_llm import fs

    d = epath.Path(out)
    d.mkdir(parents=True, exist_ok=True)
    report_path, samples_path = d / f"{name}.json", d / f"{name}.samples.jsonl"
    fs.write_text_atomic(report_path, json.dumps(report, indent=2, sort_keys=True) + "\n")
    fs.write_text_atomic(samples_path, "".join(json.dumps(s) + "\n" for s in samples))
    return str(report_path), str(samples_path)


def table(metrics: dict[str, float]) -> str:
    width = max(len(k) for k in metrics)
    return "\n".join(f"{k:<{width}}  {v:.4f}" for k, v in sorted(metrics.items()))


def main(argv):
    del argv
    setup_logging(_VERBOSE.value)

    def go():
        c, source = run_config(_WORKDIR.value, _MODEL.value, _CONFIG.value, _EVAL_OVERRIDES)
        use_compilation_cache(c, "jaxrl_llm.evaluate")
        out = _OUT.value or (str(epath.Path(_WORKDIR.value) / "eval") if _WORKDIR.value else None)
        if not out:
            raise ValueError("--out is required with --model")
        from jaxrl_llm import distributed
        distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
        metrics, samples, step, num_prompts = evaluate_run(c, source, _WORKDIR.value, _STEP.value)
        if not distributed.is_main():
            return
        name = f"step_{step}" if step is not None else "model"
        report = {"source": _WORKDIR.value or _MODEL.value, "step": step, "seed": c.seed, "eval": c.eval.to_dict(),
                  "num_prompts": num_prompts, "metrics": metrics}
        paths = write_report(out, name, report, samples)
        print(table(metrics))
        print(f"wrote {paths[0]} and {paths[1]}")

    run_cli(go, _VERBOSE.value, "jaxrl_llm.evaluate")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
