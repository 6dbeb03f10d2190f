"""Durable file operations: everything a bundle claims is on disk is fsynced before the rename that publishes it."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

CHUNK = 8 * 1024 * 1024


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def hash_and_fsync(path: Path) -> tuple[str, int]:
    """sha256 and size of a file, fsyncing it on the way (one read pass does both)."""
    return _sha256(path, fsync=True)


def sha256_file(path: Path) -> tuple[str, int]:
    return _sha256(path, fsync=False)


def _sha256(path: Path, *, fsync: bool) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while chunk := os.read(fd, CHUNK):
            h.update(chunk)
            size += len(chunk)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return h.hexdigest(), size


def write_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a sibling temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_tree_dirs(root: Path) -> None:
    """fsync every directory under ``root`` (files are fsynced when hashed), deepest first."""
    dirs = [Path(d) for d, _, _ in os.walk(root)]
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)


def utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def move_aside(path: Path, quarantine: Path, reason: str) -> Path:
    """Move ``path`` into ``quarantine/`` with a ``.reason.txt`` beside it. Never deletes anything.

    Post: ``path`` no longer exists; its content is intact under the returned path.
    """
    quarantine.mkdir(parents=True, exist_ok=True)
    base = f"{path.name}.{utc_stamp()}"
    dest = quarantine / base
    n = 1
    while dest.exists():
        n += 1
        dest = quarantine / f"{base}.{n}"
    (quarantine / f"{dest.name}.reason.txt").write_text(reason.rstrip() + "\n")
    if path.parent.resolve() == quarantine.parent.resolve():
        os.replace(path, dest)
    else:
        shutil.move(str(path), str(dest))
    fsync_dir(quarantine)
    fsync_dir(path.parent)
    return dest
