"""Durable file I/O shared by the checkpoint bundle, the data-plane snapshot and the writer lease. Pure: no Ray, no
torch.

Invariant: whatever these helpers report as written is on disk (fsynced) when they return; ``write_durable``
replaces a file atomically, so a reader sees the old content or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from sc_app.io import hashing

CHUNK = hashing.CHUNK


def utc_stamp(at: float | None = None) -> str:
    """The one timestamp format of sc-app (ISO 8601 basic, UTC, safe in file names): ``20261130T101500Z``."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(at))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def hash_and_fsync(path: Path, alg: str = hashing.DEFAULT) -> hashing.FileDigest:
    """Digest (by ``alg``) and size of a file, fsyncing it on the way (one read pass does both)."""
    return hashing.digest_file(path, alg, fsync=True)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a sibling temp file, fsync, rename, fsync the directory.

    On failure (a full or read-only disk) the temp file is removed and ``path`` is as it was."""
    tmp = path.with_name(f".{path.name}.partial")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_tree_dirs(root: Path) -> None:
    """fsync every directory under ``root`` (files are fsynced when hashed), deepest first."""
    dirs = [Path(d) for d, _, _ in os.walk(root)]
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)


def os_error_line(exc: BaseException) -> str:
    """The system's words and the file they are about ("No space left on device: /ckpt/tmp_step_4/..."); the
    exception's own text when it has no ``strerror`` (a message of sc-app's)."""
    strerror, filename = getattr(exc, "strerror", None), getattr(exc, "filename", None)
    if strerror and filename:
        return f"{strerror}: {filename}"
    return strerror or str(exc)
