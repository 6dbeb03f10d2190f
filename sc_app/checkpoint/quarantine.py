"""Moving bundles and leftovers aside: ``<root>/quarantine/`` with a reason file. sc-app never deletes them.

Invariant: ``move_aside`` removes nothing; after it returns the entry is intact under ``quarantine/`` and its
reason is written beside it. It moves only a real directory or regular file (never a link: what a link points to is
never touched), only into a ``quarantine`` that is a real directory of the same root (``QuarantineError`` otherwise,
before anything moved), and never writes through a link planted in ``quarantine/``. Only the holder of the
directory's writer lease (or a command that found no live writer) may call it on a live directory — see
``sc_app.checkpoint.lease``.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from sc_app.io.durable import fsync_dir, utc_stamp
from sc_app.io.safe_files import kind, show


class QuarantineError(OSError):
    """``quarantine/`` cannot take the entry (it is not a directory, a link, unwritable); nothing was moved."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "quarantine unusable"


def _usable_quarantine(quarantine: Path) -> None:
    try:
        mode = os.lstat(quarantine).st_mode
    except FileNotFoundError:
        try:
            quarantine.mkdir(parents=True)
        except OSError as exc:
            raise QuarantineError(f"{show(quarantine)}: cannot be created ({exc.strerror})") from None
        return
    if not stat.S_ISDIR(mode):
        raise QuarantineError(
            f"{show(quarantine)}: is {kind(mode)}, not a directory; sc-app moves bad bundles there — "
            "move it away and retry"
        )


def move_aside(path: Path, quarantine: Path, reason: str) -> Path:
    """Move ``path`` into ``quarantine/`` with a ``.reason.txt`` beside it; returns where it went."""
    mode = os.lstat(path).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise QuarantineError(f"{show(path)}: is {kind(mode)}; sc-app moves only directories and files it wrote")
    _usable_quarantine(quarantine)
    base = f"{path.name}.{utc_stamp()}"
    dest = quarantine / base
    n = 1
    while os.path.lexists(dest) or os.path.lexists(quarantine / f"{dest.name}.reason.txt"):
        n += 1
        dest = quarantine / f"{base}.{n}"
    try:
        fd = os.open(
            quarantine / f"{dest.name}.reason.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644
        )
    except OSError as exc:
        raise QuarantineError(f"{show(quarantine)}: cannot take a reason file ({exc.strerror})") from None
    with os.fdopen(fd, "w") as f:
        f.write(reason.rstrip() + "\n")
    if path.parent.resolve() == quarantine.parent.resolve():
        os.replace(path, dest)
    else:
        shutil.move(str(path), str(dest))
    fsync_dir(quarantine)
    fsync_dir(path.parent)
    return dest
