"""Moving bundles and leftovers aside: ``<root>/quarantine/`` with a reason file. sc-app never deletes them.

Invariant: ``move_aside`` removes nothing; after it returns the entry is intact under ``quarantine/`` and its
reason is written beside it. It moves only a real directory or regular file (never a link: what a link points to is
never touched), only into a ``quarantine`` that is a real directory of the same root (``QuarantineError`` otherwise,
before anything moved), and never writes through a link planted in ``quarantine/``. A bundle's pin
(``pins/step_N``) goes with it (``<dest>.pin``): left behind, it would silently pin the next bundle of that name.
Only the holder of the directory's writer lease (or a command that found no live writer) may call it on a live
directory — see ``sc_app.checkpoint.lease``.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from sc_app.checkpoint.layout import PINS_DIR, parse_step
from sc_app.io.durable import fsync_dir, utc_stamp
from sc_app.io.safe_files import kind, show


class QuarantineError(OSError):
    """``quarantine/`` cannot take the entry (it is not a directory, a link, unwritable); nothing was moved."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "quarantine unusable"


def check_quarantine(quarantine: Path) -> None:
    """``QuarantineError`` unless ``quarantine`` is (or, absent, could become) a real directory sc-app can write:
    what a command that moves several entries checks before it moves the first. Creates nothing."""
    try:
        mode = os.lstat(quarantine).st_mode
    except FileNotFoundError:
        parent = quarantine.parent
        if not os.access(parent, os.W_OK | os.X_OK):
            raise QuarantineError(f"{show(quarantine)}: cannot be created ({show(parent)} is not writable)") from None
        return
    except OSError as exc:
        raise QuarantineError(f"{show(quarantine)}: cannot be inspected ({exc.strerror})") from None
    if not stat.S_ISDIR(mode):
        raise QuarantineError(
            f"{show(quarantine)}: is {kind(mode)}, not a directory; sc-app moves bad bundles there — "
            "move it away and retry"
        )
    if not os.access(quarantine, os.W_OK | os.X_OK):
        raise QuarantineError(f"{show(quarantine)}: is not writable; sc-app moves bad bundles there — fix its mode")


def _usable_quarantine(quarantine: Path) -> None:
    check_quarantine(quarantine)
    if not os.path.lexists(quarantine):
        try:
            quarantine.mkdir(parents=True)
        except OSError as exc:
            raise QuarantineError(f"{show(quarantine)}: cannot be created ({exc.strerror})") from None


def pin_of(path: Path) -> Path:
    """Where the pin of the bundle ``path`` would be (``<root>/pins/step_N``, ``sc_app.checkpoint.retention``)."""
    return path.parent / PINS_DIR / path.name


def _move_pin(path: Path, quarantine: Path, dest: Path) -> None:
    """A pinned bundle's pin goes with it (first: a crash in between leaves the bundle unpinned in place, never a
    pin that would silently hold the next bundle of that name): ``<dest>.pin`` beside it in quarantine."""
    pin = pin_of(path)
    if not os.path.lexists(pin) or parse_step(path.name) is None:
        return
    try:
        os.replace(pin, quarantine / f"{dest.name}.pin")
    except OSError as exc:
        raise QuarantineError(f"{show(pin)}: the pin of {path.name} cannot go with it ({exc.strerror})") from None
    fsync_dir(pin.parent)


def move_aside(path: Path, quarantine: Path, reason: str) -> Path:
    """Move ``path`` into ``quarantine/`` with a ``.reason.txt`` beside it; returns where it went."""
    mode = os.lstat(path).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise QuarantineError(f"{show(path)}: is {kind(mode)}; sc-app moves only directories and files it wrote")
    _usable_quarantine(quarantine)
    base = f"{path.name}.{utc_stamp()}"
    dest = quarantine / base
    n = 1
    while any(os.path.lexists(quarantine / f"{dest.name}{suffix}") for suffix in ("", ".reason.txt", ".pin")):
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
    _move_pin(path, quarantine, dest)
    try:
        if path.parent.resolve() == quarantine.parent.resolve():
            os.replace(path, dest)
        else:
            shutil.move(str(path), str(dest))
    except OSError as exc:  # the reason file is all that was written; the entry stays where it was
        why = exc.strerror or exc
        raise QuarantineError(f"{show(path)}: cannot be moved into {show(quarantine)} ({why})") from None
    fsync_dir(quarantine)
    fsync_dir(path.parent)
    return dest
