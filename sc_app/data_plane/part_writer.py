"""Writing the streamed data-plane format (``sc_app.data_plane.streamed_format``): one stream of part files with
their JSON headers (``PartWriter``), and the ``metadata.json`` document of the streams a snapshot wrote.

Pure of Ray and TransferQueue. Every dtype written is one a reader checks (``schema.DTYPE_SIZES``); each field's
bytes start at a multiple of ``_ALIGN`` so a reader can view them as a tensor in place.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from sc_app.data_plane.schema import DTYPE_SIZES, STREAMED_FORMAT

_ALIGN = 64


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _as_blocks(value: Any, rows: int, field: str) -> tuple[torch.Tensor, list[int], list[int] | None]:
    """``(contiguous tensor, logical shape, jagged offsets or None)`` for one field of one group."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"field {field!r} holds {type(value).__name__}; the streamed snapshot stores tensors only")
    if value.is_nested and value.layout != torch.jagged:
        value = torch.nested.nested_tensor(list(value.unbind()), layout=torch.jagged)
    if value.is_nested:
        values = value.values().contiguous()
        offsets = [int(o) for o in value.offsets().tolist()]
        lengths = {b - a for a, b in itertools.pairwise(offsets)}
        if len(lengths) == 1:  # equal rows: store dense [rows, len, ...]
            shape = [rows, lengths.pop(), *values.shape[1:]]
            return values, shape, None
        return values, list(values.shape), offsets
    if value.shape[0] != rows:
        raise ValueError(f"field {field!r} has {value.shape[0]} rows, expected {rows}")
    return value.contiguous(), list(value.shape), None


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


class PartWriter:
    """Appends group segments to ``<prefix>-NNNNN.bin`` files; every closed part is fsynced with its JSON header.

    One writer is one stream (one storage unit's rows); it is used by one thread at a time. ``hashes`` maps each
    finished file's name to ``{"sha256", "size"}`` of exactly the bytes written to it."""

    def __init__(self, directory: Path, part_bytes: int, prefix: str = "part-00") -> None:
        self.directory = directory
        self.part_bytes = part_bytes
        self.prefix = prefix
        self.parts: list[str] = []
        self.bytes = 0
        self.hashes: dict[str, dict[str, Any]] = {}
        self._fh: Any = None
        self._sha: Any = None
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
        self._sha = hashlib.sha256()
        self._segments, self._pos = [], 0

    def _write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view.nbytes:
            n = self._fh.write(view)
            view = view[n:]
        self._sha.update(data)

    def _close(self) -> None:
        if self._fh is None:
            return
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        name = self.parts[-1]
        self.hashes[f"{name}.bin"] = {"sha256": self._sha.hexdigest(), "size": self._pos}
        header = {"format": STREAMED_FORMAT, "bin": f"{name}.bin", "bytes": self._pos, "segments": self._segments}
        data = json.dumps(header, separators=(",", ":")).encode()
        with open(self.directory / f"{name}.json", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self.hashes[f"{name}.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        self.bytes += self._pos

    def append(self, gid: str, ids: list[str], tags: list[dict[str, Any]], td: TensorDict) -> None:
        """One segment: rows ``ids`` (of group ``gid``) with their tags and fields."""
        if self._fh is None:
            self._open()
        specs: dict[str, Any] = {}
        rows = len(ids)
        for key in td.keys():  # noqa: SIM118 - iterating a TensorDict walks its batch, not its keys
            tensor, shape, offsets = _as_blocks(td.get(key), rows, str(key))
            if _dtype_name(tensor.dtype) not in DTYPE_SIZES:  # what a reader could not check, is never written
                raise TypeError(f"field {key!r} is {tensor.dtype}; the streamed snapshot stores {sorted(DTYPE_SIZES)}")
            pad = -self._pos % _ALIGN
            if pad:
                self._write(b"\0" * pad)
                self._pos += pad
            data = _tensor_bytes(tensor)
            self._write(data)
            specs[str(key)] = {
                "dtype": _dtype_name(tensor.dtype),
                "shape": shape,
                "offset": self._pos,
                "nbytes": data.nbytes,
                "offsets": offsets,
            }
            self._pos += data.nbytes
        self._segments.append({"group": gid, "ids": ids, "tags": tags, "fields": specs})
        self.rows += rows
        self.segments += 1
        self.group_ids.add(gid)
        if self._pos >= self.part_bytes:
            self._close()

    def append_all(self, segments: list[tuple[str, list[str], list[dict[str, Any]], TensorDict]]) -> None:
        for gid, ids, tags, td in segments:
            self.append(gid, ids, tags, td)

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
