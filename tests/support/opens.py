"""Which files a piece of code really opened: every ``os.open`` that succeeded, by the path the kernel opened
(``/proc/self/fd``), so a link followed anywhere shows up as its target. For tests that prove a reader stays inside
a directory (sc-app's readers open bundle files only through ``os.open``: ``sc_app.io.safe_files``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any


@contextmanager
def opened_files() -> Iterator[list[Path]]:
    seen: list[Path] = []
    real_open = os.open

    def spy(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        with suppress(OSError):
            seen.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        return fd

    os.open = spy  # type: ignore[assignment]
    try:
        yield seen
    finally:
        os.open = real_open  # type: ignore[assignment]


def outside(seen: list[Path], root: Path) -> list[Path]:
    """What was opened that is not ``root`` or under it."""
    real = root.resolve()
    return [p for p in seen if p != real and real not in p.parents]
