"""Workdir files on local disks and object stores alike (gs://, s3://, ... through etils.epath)."""
from __future__ import annotations

import os
import shutil
import tempfile

from etils import epath


def is_url(path) -> bool:
    """gs://, s3://, ...: object stores, reached through etils.epath (and Orbax for checkpoints)."""
    return "://" in str(path)


def write_text_atomic(path: epath.Path, text: str) -> None:
    """Writes a sibling temporary file, then renames it over `path`: readers see the old or the new text."""
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_via_local_dir(dest: epath.Path, write) -> None:
    """Runs `write(local_dir)` (a writer that only knows local paths: save_pretrained, save_hf) in a
    temporary directory, then copies the files to `dest`, replacing what was there. Used for local
    workdirs too, so that the copy is the code path every test exercises."""
    with tempfile.TemporaryDirectory(prefix="jaxrl_llm-") as tmp:
        out = os.path.join(tmp, dest.name)
        write(out)
        if dest.exists():
            dest.rmtree()
        for root, _, files in os.walk(out):
            target = dest / os.path.relpath(root, out)
            target.mkdir(parents=True, exist_ok=True)
            for name in files:
                with open(os.path.join(root, name), "rb") as src, (target / name).open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 24)


def copy_dir(src: epath.Path, dest: epath.Path) -> None:
    """Copies the files under `src` into `dest` (created), across local disks and object stores.

    Walks one directory level at a time (object stores refuse recursive globs)."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_dir():
            copy_dir(path, dest / path.name)
        else:
            with path.open("rb") as a, (dest / path.name).open("wb") as b:
                shutil.copyfileobj(a, b, 1 << 24)
