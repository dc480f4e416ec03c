"""Exports a checkpoint of a run to a Hugging Face model directory.

  python -m jaxrl_llm.export --workdir=DIR [--step=N] --out=HF_DIR [--adapter_out=DIR] [--dtype=bfloat16]

`transformers.AutoModelForCausalLM.from_pretrained(HF_DIR)` then gives the checkpoint's logits. The
directory is written atomically (a temporary sibling renamed at the end); the tokenizer saved in the
workdir at the start of the run goes with it. WORKDIR and HF_DIR may be gs:// (or other etils.epath)
URLs; an object-store output is written locally first, then copied. A LoRA run (lora.rank > 0) is
exported twice, as the trainer does at its end: HF_DIR is the merged model (the checkpoint's adapters
folded into the base read from the run's model.path), and --adapter_out (default HF_DIR + "_adapter")
the PEFT adapter that `peft.PeftModel.from_pretrained(<the base>, DIR)` loads.
"""
from __future__ import annotations

import json
import tempfile

from absl import app, flags
from etils import epath

from jaxrl_llm import fs
from jaxrl_llm.cli import flags_parser, run_cli, setup_logging

_WORKDIR = flags.DEFINE_string("workdir", None, "Workdir of a training run.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step; the latest when omitted.")
_OUT = flags.DEFINE_string("out", None, "Output directory (replaced atomically if it exists).")
_ADAPTER_OUT = flags.DEFINE_string("adapter_out", None, "LoRA runs: the PEFT adapter's directory; default <out>_adapter.")
_DTYPE = flags.DEFINE_enum("dtype", "", ["", "float32", "bfloat16", "float16"], "Weight dtype; '' = as trained.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Full tracebacks.")


def export(workdir: str, out: str, step: int | None = None, dtype: str = "", adapter_out: str | None = None) -> int:
    """Writes checkpoint `step` (default: latest) of `workdir` to `out` [and its LoRA adapter to
    `adapter_out`]; returns the step exported."""
    from jaxrl_llm.checkpoint import Checkpointer

    wd = epath.Path(workdir)
    config_file = wd / "model_config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file}: not found; is {workdir} the workdir of a jaxrl_llm run?")
    ckpt_dir = wd / "checkpoints"
    if not ckpt_dir.is_dir():
        raise FileNotFoundError(f"{ckpt_dir}: no checkpoints in this workdir")
    targets = [out, adapter_dir(out, adapter_out)] if _lora_run(wd) else [out]
    for target in targets:  # refused before anything is read, not after the checkpoint is restored
        if not fs.is_url(target):
            fs.check_replaceable(target)
    # The rest (transformers, the trainer's modules) is imported once the cheap checks have passed.
    from transformers import AutoTokenizer

    from jaxrl_llm import sharding
    from jaxrl_llm.models import lora, save_hf
    from jaxrl_llm.models.config import config_from_hf_dict
    from jaxrl_llm.models.hf import save_peft_adapter
    from jaxrl_llm.trainer.adapters import restore_policy

    ckpt = Checkpointer(str(ckpt_dir), async_save=False)
    try:
        step = ckpt.require_step(step)  # a missing step fails before the LoRA base loads
        hf_config = json.loads(config_file.read_text(encoding="utf-8"))
        mc = config_from_hf_dict(hf_config, source=str(config_file),
                                 param_dtype=hf_config.get("torch_dtype", "float32"))
        c, mc, base = _lora_base(wd, mc)
        step, params = restore_policy(mc, base, ckpt, step, sharding.make_mesh(1, 1, 1), workdir)
    finally:
        ckpt.close()
    writes = [(out, lambda path: save_hf(path, mc, lora.merge(mc, params), tokenizer=tokenizer, dtype=dtype or None))]
    if base is not None:
        adapters = lora.split(params)[1]
        writes.append((targets[1], lambda path: save_peft_adapter(path, mc, adapters, c.model.path, dtype or None)))
    with tempfile.TemporaryDirectory(prefix="jaxrl_llm-tok-") as tmp:
        tokenizer = None
        if (wd / "tokenizer").is_dir():  # copied down first: transformers reads local paths only
            fs.copy_dir(wd / "tokenizer", epath.Path(tmp))
            tokenizer = AutoTokenizer.from_pretrained(tmp)
        for target, write in writes:
            if fs.is_url(target):
                fs.write_via_local_dir(epath.Path(target), write)
            else:
                write(target)  # atomic in place
    return step


def adapter_dir(out: str, adapter_out: str | None) -> str:
    """Where a LoRA run's PEFT adapter goes: --adapter_out, default <out>_adapter."""
    return adapter_out or out.rstrip("/") + "_adapter"


def _lora_run(wd: epath.Path) -> bool:
    """Whether the run of `wd` trained LoRA adapters (config.json's lora.rank > 0)."""
    return json.loads((wd / "config.json").read_text(encoding="utf-8")).get("lora", {}).get("rank", 0) > 0


def _lora_base(wd: epath.Path, mc):
    """(the run's config, the model config with its LoRA fields, the base parameters or None): the
    base of a LoRA run is read from its model.path (or drawn from its seed, for the built-in model)."""
    from jaxrl_llm import config as config_lib
    from jaxrl_llm.trainer import adapters, setup

    c = config_lib.prepare(config_lib.from_dict(json.loads((wd / "config.json").read_text(encoding="utf-8"))))
    mc = mc.replace(**adapters.model_fields(c))
    if not mc.lora_rank:
        return c, mc, None
    from jaxrl_llm import sharding
    model_path = setup.resolve_model_path(c.model.path) if c.model.path else ""
    base, _ = setup.load_params(c, mc, model_path, sharding.make_mesh(1, 1, 1), adapters.base_rng(c.seed))
    return c, mc, base


def main(argv):
    del argv
    setup_logging(_VERBOSE.value)

    def go():
        if not _WORKDIR.value or not _OUT.value:
            raise ValueError("--workdir and --out are required")
        step = export(_WORKDIR.value, _OUT.value, _STEP.value, _DTYPE.value, _ADAPTER_OUT.value)
        print(f"exported step {step} of {_WORKDIR.value} to {_OUT.value}")
        if _lora_run(epath.Path(_WORKDIR.value)):
            print(f"  its LoRA adapter (PEFT) to {adapter_dir(_OUT.value, _ADAPTER_OUT.value)}")

    run_cli(go, _VERBOSE.value, "jaxrl_llm.export")


if __name__ == "__main__":
    app.run(main, flags_parser=flags_parser("jaxrl_llm.export"))
