"""Moving bundles and leftovers aside: ``<root>/quarantine/`` with a reason file. sc-app never deletes them.

Invariant: ``move_aside`` removes nothing; after it returns the entry is intact under ``quarantine/`` and its
reason is written beside it. Only the holder of the directory's writer lease (or a command that found no live
writer) may call it on a live directory — see ``sc_app.checkpoint.lease``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sc_app.durable_io import fsync_dir, utc_stamp


def move_aside(path: Path, quarantine: Path, reason: str) -> Path:
    """Move ``path`` into ``quarantine/`` with a ``.reason.txt`` beside it; returns where it went."""
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
