"""Shared command-line behaviour: logging setup, one-line errors and the compilation cache."""
from __future__ import annotations

import inspect
import logging
import os
import sys


def setup_logging(verbose: bool):
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname).1s %(name)s: %(message)s", datefmt="%H:%M:%S", force=True)
    for noisy in ("orbax", "matplotlib", "jax", "datasets", "filelock", "urllib3", "httpx", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)
    # Orbax logs routine notices (e.g. "read_only=True, setting create=False") as absl warnings.
    logging.getLogger("absl").setLevel(logging.DEBUG if verbose else logging.ERROR)
    if not verbose:  # read by `datasets` when it is imported (later, and only if needed)
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if not verbose:
        # When an Orbax restore fails (a corrupt checkpoint, reported in one line and skipped), its other
        # pending reads fail too: asyncio logs each "exception was never retrieved" with a traceback, and
        # tensorstore's callbacks into the closed event loop print more. Noise then; kept with --verbose.
        logging.getLogger("asyncio").addFilter(_drop_unretrieved)
        sys.unraisablehook = _drop_closed_loop_callbacks(sys.unraisablehook)


def _drop_unretrieved(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(("Task exception was never retrieved", "Future exception was never retrieved"))


def _drop_closed_loop_callbacks(hook):
    def filtered(unraisable):
        e = unraisable.exc_value
        if (isinstance(e, RuntimeError) and str(e) == "Event loop is closed") or inspect.iscoroutine(unraisable.object):
            return  # a callback into the closed loop, or an abandoned read's coroutine being finalized
        hook(unraisable)
    return filtered


def use_compilation_cache(config, prog: str) -> str:
    """Points JAX's persistent compilation cache at `config.compilation_cache.dir` (made if missing;
    `$XDG_CACHE_HOME` replaces a leading ~/.cache), at most `max_gb`, least recently used programs evicted
    first. JAX_COMPILATION_CACHE_DIR, when set, wins (JAX reads it itself) and "" turns it off. A directory
    that cannot be made is one warning, and the run goes on compiling everything. Call before the first
    compilation; returns the directory in use ('' for none)."""
    import jax
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    directory = config.compilation_cache.dir
    if not directory:
        return ""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and directory.startswith("~/.cache/"):
        directory = os.path.join(xdg, directory[len("~/.cache/"):])
    directory = os.path.abspath(os.path.expanduser(directory))
    try:
        os.makedirs(directory, exist_ok=True)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except OSError as e:
        print(f"{prog}: warning: compilation_cache.dir {directory} cannot be used ({e.strerror or e}): every "
              "program is compiled afresh (--config.compilation_cache.dir= to turn the cache off)", file=sys.stderr)
        return ""
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_compilation_cache_max_size", int(config.compilation_cache.max_gb * 2**30))
    return directory


def flags_parser(prog: str):
    """An `absl.app.run(..., flags_parser=)` that reports a bad flag in one line and exits with status 1.

    absl's own prints a multi-line usage hint, and an unknown `--config.a.b` field (or an error raised
    inside the config file) escapes it as a traceback. With --verbose in argv the error propagates.
    """
    from absl import flags

    def parse(argv):
        try:
            _check_config_overrides(argv)
            return flags.FLAGS(argv)
        except Exception as e:  # flags.Error, and ml_collections' AttributeError for an unknown field
            if any(a in ("--verbose", "--verbose=true", "--verbose=True", "--verbose=1") for a in argv):
                raise
            print(f"{prog}: error: {_flag_error(e, argv)}", file=sys.stderr)
            sys.exit(1)
    return parse


class UnknownConfigField(ValueError):
    pass


def _check_config_overrides(argv) -> None:
    """Refuses a `--config.a.b=V` override naming no field of the schema, in one line naming that
    argument, the field and the nearest ones, before ml_collections reads it: its own error names a
    field of the first argument it did not recognise, and reports it against the last one."""
    overrides = [a for a in argv[1:] if a.startswith("--config.")]
    if not overrides:
        return
    from jaxrl_llm.config import base_config  # every config file builds on it; check_fields holds them to it
    from jaxrl_llm.field_names import unknown_field
    schema = base_config()
    for arg in overrides:
        problem = unknown_field(arg[len("--config."):].split("=", 1)[0], schema)
        if problem:
            raise UnknownConfigField(f"{arg}: {problem}")


def _flag_error(e: Exception, argv) -> str:
    text = str(e)
    if isinstance(e, (AttributeError, KeyError)):  # a config key missing where the schema allows any
        # (reward.kwargs.<fn>.<arg>): ml_collections' message is the bare key, e.g. "'math_answer'".
        name = text.strip("'\"\\ ").split("'")[0].split()[0] if text.strip("'\"\\ ") else ""
        arg = next((a for a in argv[1:] if a.startswith("--config.") and name and
                    name in a.split("=", 1)[0].split(".")), None)
        text = (f"{arg or 'a --config override'}: no config field '{name}' to override; "
                "reward.kwargs and data.reasoning_gym.options entries must be set in the config file (or through the "
                "Python API) first")
    head, sep, tb = text.partition("Traceback (most recent call last):")
    if sep:  # an exception raised inside the config file: keep its last line, the message
        lines = [line.strip() for line in tb.splitlines() if line.strip()]
        text = f"{head.strip()} {lines[-1] if lines else ''}"
    return " ".join(text.split())


def run_cli(main_fn, verbose: bool, prog: str):
    """Runs main_fn; any error becomes one line on stderr and exit status 1 (unless verbose). A run stopped
    by a signal after saving says where a rerun resumes and exits with 75 (preempted: rerun it) or 130
    (interrupted by Ctrl-C); see jaxrl_llm/preemption.py."""
    from jaxrl_llm.preemption import Preempted
    try:
        main_fn()
    except Preempted as e:
        print(f"{prog}: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # one line for the user; the traceback with --verbose
        if verbose:
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.exit(1)
