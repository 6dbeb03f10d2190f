"""Is a checkpoint directory usable at all? Checked before anything else runs, so a bad volume is one clear line.

Invariant: the probe leaves nothing behind (its file is removed whatever happens) and changes nothing else, apart
from creating the directory a run was told to use.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

PROBE_BYTES = 4096


def _kind(path: Path) -> str:
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        return "a symbolic link to something that is not a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a directory"


def unusable_as_dir(root: Path) -> str | None:
    """Why ``root`` cannot be read as a checkpoint directory (it exists and is not one), else None. Read-only."""
    if (root.exists() or root.is_symlink()) and not root.is_dir():
        return f"checkpoint dir {root} is {_kind(root)}; point it at a directory"
    return None


def unwritable(root: Path) -> str | None:
    """Why ``root`` cannot hold checkpoints (not a directory, cannot be created, read-only, full), else None.

    Creates ``root`` when missing; writes, fsyncs and removes one small probe file."""
    problem = unusable_as_dir(root)
    if problem:
        return problem
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"checkpoint dir {root} cannot be created ({exc.strerror or exc}); point it at a writable volume"
    probe = root / f".sc-app-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return (
            f"checkpoint dir {root} cannot be written ({exc.strerror or exc}); free space or mount it read-write, "
            "or point checkpoint.dir elsewhere"
        )
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None
