"""Exports a checkpoint of a run to a Hugging Face model directory.

  python -m jaxrl_llm.export --workdir=DIR [--step=N] --out=HF_DIR [--dtype=bfloat16]

`transformers.AutoModelForCausalLM.from_pretrained(HF_DIR)` then gives the checkpoint's logits. The
directory is written atomically (a temporary sibling renamed at the end); the tokenizer saved in the
workdir at the start of the run goes with it. WORKDIR and HF_DIR may be gs:// (or other etils.epath)
URLs; an object-store output is written locally first, then copied.
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
_DTYPE = flags.DEFINE_enum("dtype", "", ["", "float32", "bfloat16", "float16"], "Weight dtype; '' = as trained.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Full tracebacks.")


def export(workdir: str, out: str, step: int | None = None, dtype: str = "") -> int:
    """Writes checkpoint `step` (default: latest) of `workdir` to `out`; returns the step exported."""
    import jax
    from transformers import AutoTokenizer

    from jaxrl_llm.checkpoint import Checkpointer
    from jaxrl_llm.models import init_params, save_hf
    from jaxrl_llm.models.config import config_from_hf_dict

    wd = epath.Path(workdir)
    config_file = wd / "model_config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file}: not found; is {workdir} the workdir of a jaxrl_llm run?")
    hf_config = json.loads(config_file.read_text(encoding="utf-8"))
    mc = config_from_hf_dict(hf_config, source=str(config_file),
                             param_dtype=hf_config.get("torch_dtype", "float32"))
    abstract = jax.eval_shape(lambda: init_params(mc, jax.random.PRNGKey(0)))
    ckpt_dir = wd / "checkpoints"
    if not ckpt_dir.is_dir():
        raise FileNotFoundError(f"{ckpt_dir}: no checkpoints in this workdir")
    ckpt = Checkpointer(str(ckpt_dir), async_save=False)
    step, params = ckpt.restore_params(abstract, step)
    ckpt.close()
    with tempfile.TemporaryDirectory(prefix="jaxrl_llm-tok-") as tmp:
        tokenizer = None
        if (wd / "tokenizer").is_dir():  # copied down first: transformers reads local paths only
            fs.copy_dir(wd / "tokenizer", epath.Path(tmp))
            tokenizer = AutoTokenizer.from_pretrained(tmp)
        write = lambda path: save_hf(path, mc, params, tokenizer=tokenizer, dtype=dtype or None)
        if fs.is_url(out):
            fs.write_via_local_dir(epath.Path(out), write)
        else:
            write(out)  # atomic in place
    return step


def main(argv):
    del argv
    setup_logging(_VERBOSE.value)

    def go():
        if not _WORKDIR.value or not _OUT.value:
            raise ValueError("--workdir and --out are required")
        step = export(_WORKDIR.value, _OUT.value, _STEP.value, _DTYPE.value)
        print(f"exported step {step} of {_WORKDIR.value} to {_OUT.value}")

    run_cli(go, _VERBOSE.value, "jaxrl_llm.export")


if __name__ == "__main__":
    app.run(main, flags_parser=flags_parser("jaxrl_llm.export"))
