"""What a local input of the data layer must be, checked with the standard library alone.

No `datasets`, no `transformers`: the trainer's start-up checks (trainer/preflight.py) run these in a
fraction of a second, before the heavy imports and before any model or data loads; the loaders
(loading.py, tokenizer.py) run the same ones, so that the message is the same whoever meets it first.
"""
from __future__ import annotations

import os

# What a Hugging Face tokenizer directory holds (one of them at least): fast, slow and SentencePiece forms.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")
# The local file formats of `data.path`, by extension (data/loading.py maps each to its `datasets` builder).
DATA_EXTENSIONS = (".json", ".jsonl", ".ndjson", ".parquet", ".csv", ".tsv", ".arrow")


def looks_like_local_path(path: str) -> bool:
    """Hub names are "name" or "org/name"; anything absolute, relative-dotted or under ~ is meant as a local
    path, and must not fall through to a (slow, retried) hub request when it does not exist."""
    return os.path.isabs(path) or path.startswith(("./", "../", "~")) or path in (".", "..")


def check_tokenizer_path(path_or_name: str) -> None:
    """A local tokenizer path must be a directory holding one of TOKENIZER_FILES; a hub name passes."""
    local = os.path.expanduser(path_or_name)
    if looks_like_local_path(path_or_name) and not os.path.isdir(local):
        raise ValueError(f"tokenizer path {path_or_name!r} is not an existing directory")
    if os.path.isdir(local) and not any(os.path.isfile(os.path.join(local, f)) for f in TOKENIZER_FILES):
        raise ValueError(f"tokenizer directory {path_or_name!r} holds none of {', '.join(TOKENIZER_FILES)}; "
                         "set config.tokenizer to the model's tokenizer")


def data_file_extension(path: str, field: str = "data.path") -> str | None:
    """The extension of the local data file `path` (one of DATA_EXTENSIONS), or None for a directory or a
    hub name. A path meant as local (absolute, relative-dotted, or named with a data extension) that does
    not exist, a file of another extension and an empty path are errors naming `field`."""
    if not path:
        raise ValueError(f"{field} is empty; set a hub dataset name or a local file")
    local = os.path.expanduser(path)
    if os.path.isfile(local):
        extension = os.path.splitext(local)[1].lower()
        if extension not in DATA_EXTENSIONS:
            raise ValueError(f"{field} {path!r} has extension {extension!r}; expected one of {sorted(DATA_EXTENSIONS)}")
        return extension
    if not os.path.isdir(local) and (looks_like_local_path(path)
                                     or os.path.splitext(path)[1].lower() in DATA_EXTENSIONS):
        raise ValueError(f"{field} {path!r} does not exist")
    return None
