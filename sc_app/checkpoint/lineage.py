"""The training lineage of a checkpoint directory: a stable id the first run writes and every retry keeps.

``<root>/LINEAGE`` holds it; every manifest records the lineage of the run that wrote it, and a bundle of another
lineage (copied in from another job) is never resumed nor counted by retention (``verify``, ``resume``,
``retention`` compare against it). Invariant: once written, LINEAGE is never rewritten by sc-app.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from sc_app.io import strict_json
from sc_app.io.durable import utc_stamp, write_durable
from sc_app.io.safe_files import FileProblem, read_optional

LINEAGE_FILE = "LINEAGE"
MAX_LINEAGE_BYTES = 16 * 1024


class LineageError(ValueError):
    """LINEAGE is unreadable; ``str()`` is one line naming the file and what to do."""


def read_lineage(root: Path) -> str | None:
    """The directory's lineage id, None when it has none yet. Read-only."""
    path = Path(root) / LINEAGE_FILE
    try:
        raw = read_optional(path, MAX_LINEAGE_BYTES)
    except FileProblem as exc:  # a FIFO, device, directory or link is never opened for reading
        raise LineageError(f"{exc}; not a lineage record: fix or move it aside") from None
    if raw is None:
        return None
    try:
        doc = strict_json.parse(raw)
        lineage = doc["lineage"]
        if not isinstance(lineage, str) or not lineage:
            raise ValueError("lineage is not a non-empty string")
    except (ValueError, KeyError, TypeError) as exc:
        raise LineageError(
            f"{path}: not a lineage record ({exc}); if this directory belongs to one job, restore the file from a "
            "bundle's manifest.json ('lineage') or move it aside"
        ) from None
    return lineage


def ensure_lineage(root: Path, adopt: str | None = None) -> str:
    """The directory's lineage, written first if it has none: ``adopt`` (e.g. the lineage its newest verified
    bundle records) or a new id. Call only while holding the directory's lease."""
    current = read_lineage(root)
    if current is not None:
        return current
    lineage = adopt or uuid.uuid4().hex
    record = json.dumps({"lineage": lineage, "created_at": utc_stamp()}) + "\n"
    write_durable(Path(root) / LINEAGE_FILE, record.encode())
    return lineage
