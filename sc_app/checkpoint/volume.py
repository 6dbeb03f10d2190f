"""Is a checkpoint directory usable at all? Checked before anything else runs, so a bad volume is one clear line.

Invariant: the probe leaves nothing behind (its file is removed whatever happens) and changes nothing else, apart
from creating the directory a run was told to use.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from sc_app.config.input import NAME_MAX, PATH_MAX
from sc_app.io.safe_files import kind

PROBE_BYTES = 4096
PATH_RESERVE = 512  # the longest path sc-app writes under checkpoint.dir (tmp bundle, data plane parts, run log)


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


def too_long(root: Path) -> str | None:
    """Why paths under ``root`` would pass the system's limits (``PATH_MAX`` for the longest path sc-app writes
    under it, ``NAME_MAX`` per component), else None: said at start-up, so no save fails on "File name too long"."""
    full = os.fsencode(os.path.abspath(root))
    longest = max((len(part) for part in full.split(b"/")), default=0)
    if longest > NAME_MAX:
        return (
            f"checkpoint dir {str(root)[:60]}...: a path component of {longest} bytes, over the system's {NAME_MAX}; "
            "choose a shorter checkpoint.dir"
        )
    if len(full) + PATH_RESERVE > PATH_MAX:
        return (
            f"checkpoint dir {str(root)[:60]}... is {len(full)} bytes long: the files of a bundle under it would pass "
            f"the system's {PATH_MAX}-byte path limit (keep it under {PATH_MAX - PATH_RESERVE}); choose a shorter "
            "checkpoint.dir"
        )
    return None


def unusable_as_dir(root: Path) -> str | None:
    """Why ``root`` cannot be read as a checkpoint directory (it exists and is not one, or its paths are too long),
    else None. Read-only."""
    if problem := too_long(root):
        return problem
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


def not_appendable(path: str | None, key: str) -> str | None:
    """Why a file the run will append to (``key``, e.g. ``run.trace_file``) cannot be one: it exists and is not a
    regular file (a FIFO would block the process that opens it). None when unset, absent or a regular file."""
    if path is None:
        return None
    try:
        mode = os.stat(path).st_mode  # a link to a regular file is fine: appending never blocks there
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{key} {path}: cannot be examined ({exc.strerror or exc}); point it at a writable file"
    if stat.S_ISREG(mode):
        return None
    return f"{key} {path}: is {kind(mode)}, not a regular file; point it at a new file"
