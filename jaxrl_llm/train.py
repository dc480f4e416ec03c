"""Command line of the RL trainer.

  python -m jaxrl_llm.train --config=configs/tiny.py[:arg] --workdir=DIR [--config.a.b=value ...]

Rerunning the same command with the same workdir resumes from the latest checkpoint. Multi-host:
`jax.distributed` starts from the environment (TPU pods, SLURM) or from --coordinator/--num_processes/
--process_id. Errors print one line (the full traceback with --verbose) and exit with status 1.
"""
from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from jaxrl_llm.cli import flags_parser, run_cli, setup_logging, use_compilation_cache

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file: configs/FILE.py[:arg].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of checkpoints, metrics, samples and the export.")
_COORDINATOR = flags.DEFINE_string("coordinator", "", "Multi-host: address host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Multi-host: number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "Multi-host: index of this process.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Full tracebacks and debug logging.")


def main(argv):
    del argv
    setup_logging(_VERBOSE.value)

    def go():
        if not _WORKDIR.value:
            raise ValueError("--workdir is required")
        if _CONFIG.value is None:
            raise ValueError("--config is required, e.g. --config=configs/tiny.py")
        from jaxrl_llm import config as config_lib
        config = config_lib.prepare(_CONFIG.value)  # a bad field fails before the cluster and the models load
        use_compilation_cache(config, "jaxrl_llm.train")
        from jaxrl_llm.trainer import preflight
        preflight.check_inputs(config)  # and a bad file, before the trainer's imports (datasets, transformers)
        from jaxrl_llm import distributed
        distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
        from jaxrl_llm.trainer import Trainer
        Trainer(config, _WORKDIR.value).run()

    run_cli(go, _VERBOSE.value, "jaxrl_llm.train")


if __name__ == "__main__":
    app.run(main, flags_parser=flags_parser("jaxrl_llm.train"))
