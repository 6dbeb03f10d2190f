"""The run-log file itself, as the writer meets it: what an earlier attempt left (``scan_prior``, reading the tail
back), a last line a SIGKILL cut short, and opening it for appending. Only a regular file is ever opened, never
blocking (a FIFO there is an ``OSError``), and a line is held in memory only up to ``MAX_LINE_BYTES``."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sc_app.io import strict_json
from sc_app.io.safe_files import open_regular

_STEP_RE = re.compile(r'"kind":"step".*?"step":(\d{1,16})(?!\d)')
MAX_LINE_BYTES = 1 << 20  # a record is well under 1 KiB


@dataclass(frozen=True)
class Prior:
    """What the log held before this attempt."""

    high_water: int = 0  # the highest step any earlier attempt logged
    last_attempt: int = 0


def _lines_backwards(path: Path, block: int = 1 << 16) -> Iterator[str]:
    """The file's lines, last first (a torn last line included); a line over ``MAX_LINE_BYTES`` is skipped, so
    memory stays bounded whatever the file holds. A regular file only (opened without blocking)."""
    with os.fdopen(open_regular(path), "rb") as fh:
        pos = fh.seek(0, os.SEEK_END)
        tail = b""
        oversized = False  # the line being collected passed MAX_LINE_BYTES: drop it whole
        while pos > 0:
            size = min(block, pos)
            pos -= size
            fh.seek(pos)
            parts = (fh.read(size) + tail).split(b"\n")
            tail = parts[0]
            complete = parts[1:]
            if oversized and complete:
                complete, oversized = complete[:-1], False  # the head of the oversized line
            for raw in reversed(complete):
                if raw:
                    yield raw.decode("utf-8", "replace")
            if len(tail) > MAX_LINE_BYTES:
                tail, oversized = b"", True
        if tail and not oversized:
            yield tail.decode("utf-8", "replace")


def scan_prior(path: Path) -> Prior:
    """High-water step and last attempt of the log at ``path``: reads backwards to the newest ``start`` event.

    Every step line after that event is looked at (a superseded attempt still dying may interleave its steps), and
    the event's own ``high_water`` covers everything before it. A missing or non-regular file has no prior."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return Prior()
    except FileNotFoundError:
        return Prior()
    high, attempt = 0, 0
    for line in _lines_backwards(path):
        m = _STEP_RE.search(line)
        if m:
            high = max(high, int(m.group(1)))
            continue
        if '"event":"start"' in line:
            try:
                obj = strict_json.parse(line.encode("utf-8", "surrogatepass"))
                high = max(high, int(obj.get("high_water") or 0))
                attempt = int(obj.get("attempt") or 0)
            except (AttributeError, TypeError, ValueError):
                continue  # a torn start line: keep looking further back
            break
    return Prior(high, attempt)


def close_torn_line(path: Path) -> None:
    """End a last line a SIGKILL cut short, so the next append starts a line of its own."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return
    with open(path, "rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) != b"\n":
            fh.write(b"\n")
