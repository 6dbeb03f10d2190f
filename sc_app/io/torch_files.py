"""The two ways sc-app touches torch's file format: ``save`` that fails like a file write, ``load`` that never
unpickles code.

* ``save``: torch's zip writer turns a failed write into ``RuntimeError("unexpected pos ...")``; saving through an
  unbuffered Python file keeps the real ``OSError`` (a full disk raises ``OSError(ENOSPC)``), so callers can tell a
  full disk from a bug. Post: on success the file is complete and fsynced, and the returned ``FileDigest`` is that
  of exactly the bytes written (hashed as they went out, ``sc_app.io.hashing``; nothing is read back). torch's zip
  CRC-32 is not computed (``without_zip_crc``): it cost more CPU than the BLAKE3 digest that every reader checks
  before a byte is decoded (0.5-1.6 against 0.23 CPU-ms per MiB here); torch.load reads such files as any other.
* ``load``: ``weights_only=True`` always (tensors and plain containers only), onto the CPU unless told otherwise;
  a path is opened as a regular file without following a link (``sc_app.io.safe_files.open_regular``), bytes are read
  as they are. Callers load only files whose digest already matched a verified manifest, and check what they got
  with the validator of that file (``docs/checkpoint.md``, "What verification checks").
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from sc_app.io import hashing
from sc_app.io.safe_files import open_regular


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


@contextmanager
def without_zip_crc() -> Iterator[None]:
    """``torch.save`` (and DCP, which saves each item with it) without the zip CRC-32 of every record, for files
    a digest stands behind. Process-wide while it lasts (torch has one setting): another thread's save meanwhile
    skips it too, which is harmless for the same reason."""
    from torch.utils.serialization import config

    before = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        yield
    finally:
        config.save.compute_crc32 = before


def save(obj: Any, path: str | Path, hash_alg: str = hashing.DEFAULT) -> hashing.FileDigest:
    with open(path, "wb", buffering=0) as raw:
        out = hashing.HashingWriter(raw, hash_alg)
        rec = _RecordingFile(out)
        try:
            with without_zip_crc():
                torch.save(obj, rec)  # type: ignore[arg-type]
        except RuntimeError:
            if rec.error is not None:
                raise rec.error from None
            raise
        os.fsync(raw.fileno())
    return out.result()


def load(source: str | Path | bytes, *, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load`` with ``weights_only=True``: tensors and plain containers, never arbitrary objects.
    ``source``: a path (a regular file, no link followed: ``FileProblem`` otherwise) or the file's bytes."""
    if isinstance(source, bytes | bytearray):
        return torch.load(io.BytesIO(source), map_location=map_location, weights_only=True)
    with os.fdopen(open_regular(source), "rb") as f:
        return torch.load(f, map_location=map_location, weights_only=True)
