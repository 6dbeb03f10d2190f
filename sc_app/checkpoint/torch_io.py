"""torch.save that fails like a file write: a full disk raises ``OSError(ENOSPC)``, not torch's RuntimeError.

torch's zip writer turns a failed write into ``RuntimeError("unexpected pos ...")``; saving through an unbuffered
Python file lets us keep the real ``OSError`` and re-raise it, so callers can tell a full disk from a bug.
Post: on success the file is complete and fsynced.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


class _RecordingFile:
    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self._raw.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self._raw.flush()


def save(obj: Any, path: str | Path) -> None:
    with open(path, "wb", buffering=0) as raw:
        rec = _RecordingFile(raw)
        try:
            torch.save(obj, rec)  # type: ignore[arg-type]
        except RuntimeError:
            if rec.error is not None:
                raise rec.error from None
            raise
        os.fsync(raw.fileno())
