"""Writing the streamed data-plane format (``sc_app.data_plane.streamed_format``): one stream of part files with
their JSON headers (``PartWriter``), and the ``metadata.json`` document of the streams a snapshot wrote.

Pure of Ray and TransferQueue. Every dtype written is one a reader checks (``schema.DTYPE_SIZES``); each field's
bytes start at a multiple of ``_ALIGN`` so a reader can view them as a tensor in place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from sc_app.data_plane import row_blocks
from sc_app.data_plane.schema import DTYPE_SIZES, STREAMED_FORMAT
from sc_app.io import hashing

_ALIGN = 64


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class PartWriter:
    """Appends group segments to ``<prefix>-NNNNN.bin`` files; every closed part is fsynced with its JSON header.

    One writer is one stream (one storage unit's rows); it is used by one thread at a time. ``hashes`` maps each
    finished file's name to ``hashing.FileDigest.as_dict()`` of exactly the bytes written to it, hashed (by
    ``hash_alg``) chunk by chunk right after each chunk is written, from the tensors' own memory (no copy)."""

    def __init__(
        self, directory: Path, part_bytes: int, prefix: str = "part-00", hash_alg: str = hashing.DEFAULT
    ) -> None:
        self.directory = directory
        self.part_bytes = part_bytes
        self.prefix = prefix
        self.parts: list[str] = []
        self.bytes = 0
        self.hashes: dict[str, dict[str, Any]] = {}
        self.hash_alg = hashing.check_alg(hash_alg)
        self._fh: Any = None
        self._out: hashing.HashingWriter | None = None
        self._segments: list[dict[str, Any]] = []
        self.rows = 0
        self.segments = 0
        self.group_ids: set[str] = set()
        self._pos = 0

    @property
    def groups(self) -> int:
        return len(self.group_ids)

    def _open(self) -> None:
        name = f"{self.prefix}-{len(self.parts):05d}"
        self.parts.append(name)
        self._fh = open(self.directory / f"{name}.bin", "wb", buffering=0)  # noqa: SIM115 - closed in _close
        self._out = hashing.HashingWriter(self._fh, self.hash_alg)
        self._segments, self._pos = [], 0

    def _write(self, data: bytes | memoryview) -> None:
        assert self._out is not None
        self._out.write(data)

    def _close(self) -> None:
        if self._fh is None:
            return
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        name = self.parts[-1]
        assert self._out is not None and self._out.size == self._pos
        self.hashes[f"{name}.bin"] = self._out.result().as_dict()
        self._out = None
        header = {"format": STREAMED_FORMAT, "bin": f"{name}.bin", "bytes": self._pos, "segments": self._segments}
        data = json.dumps(header, separators=(",", ":")).encode()
        with open(self.directory / f"{name}.json", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self.hashes[f"{name}.json"] = digest_of(data, self.hash_alg)
        self.bytes += self._pos

    def append(self, gid: str, ids: list[str], tags: list[dict[str, Any]], td: TensorDict) -> None:
        """One segment: rows ``ids`` (of group ``gid``) with their tags and fields, as a batched TensorDict."""
        fields = {str(k): row_blocks.packed(td.get(k), len(ids), str(k)) for k in td.keys()}  # noqa: SIM118
        self._append(gid, ids, tags, fields)

    def append_rows(self, gid: str, ids: list[str], tags: list[dict[str, Any]], columns: dict[str, list[Any]]) -> None:
        """One segment from per-row tensors (field → one tensor per row, TransferQueue's unpacked reply): the same
        bytes as ``append`` of the packed rows, without packing them first (``row_blocks``)."""
        self._append(gid, ids, tags, {k: row_blocks.per_row(v, len(ids), k) for k, v in columns.items()})

    def _append(self, gid: str, ids: list[str], tags: list[dict[str, Any]], fields: dict[str, Any]) -> None:
        if self._fh is None:
            self._open()
        specs: dict[str, Any] = {}
        rows = len(ids)
        for key, blocks in fields.items():
            if _dtype_name(blocks.dtype) not in DTYPE_SIZES:  # what a reader could not check, is never written
                raise TypeError(f"field {key!r} is {blocks.dtype}; the streamed snapshot stores {sorted(DTYPE_SIZES)}")
            pad = -self._pos % _ALIGN
            if pad:
                self._write(b"\0" * pad)
                self._pos += pad
            for view in blocks.views:
                self._write(view)
            specs[key] = {
                "dtype": _dtype_name(blocks.dtype),
                "shape": blocks.shape,
                "offset": self._pos,
                "nbytes": blocks.nbytes,
                "offsets": blocks.offsets,
            }
            self._pos += blocks.nbytes
        self._segments.append({"group": gid, "ids": ids, "tags": tags, "fields": specs})
        self.rows += rows
        self.segments += 1
        self.group_ids.add(gid)
        if self._pos >= self.part_bytes:
            self._close()

    def append_all(self, segments: list[tuple[str, list[str], list[dict[str, Any]], Any]]) -> None:
        """Segments whose data is a TensorDict (``append``) or field → per-row values (``append_rows``)."""
        for gid, ids, tags, data in segments:
            if isinstance(data, dict):
                self.append_rows(gid, ids, tags, data)
            else:
                self.append(gid, ids, tags, data)

    def summary(self, unit: str | None = None) -> dict[str, Any]:
        """What this finished writer wrote (plain data, so a remote writer can hand it back): its ``streams`` entry
        in ``metadata.json`` plus the files' hashes and the ids of the groups it holds."""
        return {
            "unit": unit,
            "parts": list(self.parts),
            "rows": self.rows,
            "segments": self.segments,
            "bytes": self.bytes,
            "hashes": dict(self.hashes),
            "group_ids": sorted(self.group_ids),
        }

    def metadata(self, *, partition: str, user_metadata: dict[str, Any]) -> dict[str, Any]:
        """``metadata.json`` of a directory this one writer wrote (call after ``finish()``)."""
        return merged_metadata([self.summary()], partition=partition, user_metadata=user_metadata)

    def finish(self) -> None:
        self._close()

    def abandon(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def merged_metadata(
    summaries: list[dict[str, Any]], *, partition: str, user_metadata: dict[str, Any]
) -> dict[str, Any]:
    """The ``metadata.json`` document of a directory written by these finished streams (``PartWriter.summary``)."""
    groups: set[str] = set()
    for st in summaries:
        groups.update(st["group_ids"])
    keep = ("unit", "parts", "rows", "segments", "bytes")
    return {
        "format": STREAMED_FORMAT,
        "partition": partition,
        "rows": sum(st["rows"] for st in summaries),
        "groups": len(groups),
        "segments": sum(st["segments"] for st in summaries),
        "bytes": sum(st["bytes"] for st in summaries),
        "parts": [name for st in summaries for name in st["parts"]],
        "streams": [{k: st[k] for k in keep} for st in summaries],
        "user_metadata": user_metadata,
    }


def digest_of(data: bytes, alg: str) -> dict[str, Any]:
    """``hashing.FileDigest.as_dict()`` of ``data`` as one file's bytes."""
    return hashing.FileDigest(alg, hashing.digest_bytes(data, alg), len(data)).as_dict()
