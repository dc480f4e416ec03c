"""Shared command-line behaviour: logging setup and one-line errors."""
from __future__ import annotations

import logging
import sys


def setup_logging(verbose: bool):
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname).1s %(name)s: %(message)s", datefmt="%H:%M:%S", force=True)
    for noisy in ("absl", "orbax", "matplotlib", "jax", "datasets", "filelock", "urllib3", "httpx", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)


def run_cli(main_fn, verbose: bool, prog: str):
    """Runs main_fn; any error becomes one line on stderr and exit status 1 (unless verbose)."""
    try:
        main_fn()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # one line for the user; the traceback with --verbose
        if verbose:
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.exit(1)
