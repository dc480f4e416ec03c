"""Workdir files on local disks and object stores alike (gs://, s3://, ... through etils.epath), and the
atomic replacement of a local directory (exports: `atomic_directory`)."""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import tempfile
from collections.abc import Callable

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


def _exchange(a: str, b: str) -> bool:
    """Atomically swaps two existing paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # kernel or filesystem without the flag
        return False
    raise OSError(err, os.strerror(err), b)


def check_replaceable(path: str) -> None:
    """`atomic_directory(path, ...)` may write there: `path` is a directory or does not exist."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"{os.path.abspath(path)} exists and is not a directory; refusing to replace it")


def atomic_directory(path: str, write: Callable[[str], None]):
    """Runs write(tmp_dir) in a sibling temp dir, then renames it to `path` (replacing an old one).

    An interrupted write leaves only a hidden `.NAME.tmp-*` sibling, never a `path` that looks complete;
    an old `path` is swapped out in one atomic exchange (Linux), so a kill at any moment leaves either
    the old directory or the new one at `path`. Elsewhere the swap is two renames, and a kill between
    them leaves the old directory under `.NAME.old-*/x`.
    """
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    check_replaceable(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        write(tmp)
        if not os.path.exists(path):
            os.rename(tmp, path)
        elif _exchange(tmp, path):  # tmp now holds the old directory
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old-", dir=parent)
            os.rename(path, os.path.join(old, "x"))
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
