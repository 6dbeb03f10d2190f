"""The on-disk format of the streamed data-plane snapshot (``sc-app/streamed-v1``): pure of Ray and TransferQueue.

Field bytes <-> tensors, part files and their JSON headers, ``metadata.json``. The format, and why it has no pickle,
is described in ``docs/checkpoint.md`` ("The streamed data-plane format"); ``sc_app.data_plane.streamed`` moves
rows between these files and TransferQueue.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from sc_app.data_plane.client import METADATA_FILE
from sc_app.durable_io import write_durable

FORMAT = "sc-app/streamed-v1"
PART_BYTES = 64 * 1024 * 1024  # a part file is closed (and fsynced) once it holds this much
_ALIGN = 64


class StreamedFormatError(ValueError):
    """A streamed data-plane directory is incomplete or does not match its own headers."""


def group_of(sample_id: str) -> str:
    """Group id of a sample id: everything before its last ``':'`` (``"p7:3"`` → ``"p7"``)."""
    gid, sep, _ = sample_id.rpartition(":")
    if not sep or not gid:
        raise ValueError(f"sample id {sample_id!r} has no group part (expected '<group>:<row>')")
    return gid


def group_ids(sample_ids: list[str]) -> dict[str, list[str]]:
    """Sample ids grouped by group id; groups in first-seen order, ids in the order given."""
    groups: dict[str, list[str]] = {}
    for sid in sample_ids:
        groups.setdefault(group_of(sid), []).append(sid)
    return groups


def is_streamed(directory: Path) -> bool:
    """True when ``directory/metadata.json`` says ``sc-app/streamed-v1``."""
    try:
        doc = json.loads((Path(directory) / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise StreamedFormatError(f"unknown dtype {name!r}")
    return dt


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


def _rebuild(buf: torch.Tensor, spec: dict[str, Any]) -> torch.Tensor:
    """Tensor described by ``spec`` from the part's uint8 buffer (a view, no copy)."""
    start, n = int(spec["offset"]), int(spec["nbytes"])
    if start < 0 or start + n > buf.numel():
        raise StreamedFormatError(f"field bytes [{start}, {start + n}) lie outside the part file ({buf.numel()})")
    dtype = _dtype(spec["dtype"])
    values = buf[start : start + n].view(dtype).reshape(spec["shape"])
    offsets = spec.get("offsets")
    if offsets is None:
        return values
    return torch.nested.nested_tensor_from_jagged(values, offsets=torch.tensor(offsets, dtype=torch.int64))


# ---------------------------------------------------------------------------------------------------- writing
class PartWriter:
    """Appends group segments to ``part-NNNNN.bin`` files; every closed part is fsynced with its JSON header.

    ``hashes`` maps each finished file's name to ``{"sha256", "size"}`` of exactly the bytes written to it."""

    def __init__(self, directory: Path, part_bytes: int) -> None:
        self.directory = directory
        self.part_bytes = part_bytes
        self.parts: list[str] = []
        self.bytes = 0
        self.hashes: dict[str, dict[str, Any]] = {}
        self._fh: Any = None
        self._sha: Any = None
        self._segments: list[dict[str, Any]] = []
        self.rows = 0
        self.groups = 0
        self._pos = 0

    def _open(self) -> None:
        name = f"part-{len(self.parts):05d}"
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
        header = {"format": FORMAT, "bin": f"{name}.bin", "bytes": self._pos, "segments": self._segments}
        data = json.dumps(header, separators=(",", ":")).encode()
        with open(self.directory / f"{name}.json", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self.hashes[f"{name}.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        self.bytes += self._pos

    def append(self, gid: str, ids: list[str], tags: list[dict[str, Any]], td: TensorDict) -> None:
        if self._fh is None:
            self._open()
        specs: dict[str, Any] = {}
        rows = len(ids)
        for key in td.keys():  # noqa: SIM118 - iterating a TensorDict walks its batch, not its keys
            tensor, shape, offsets = _as_blocks(td.get(key), rows, str(key))
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
        self.groups += 1
        if self._pos >= self.part_bytes:
            self._close()

    def append_all(self, segments: list[tuple[str, list[str], list[dict[str, Any]], TensorDict]]) -> None:
        for gid, ids, tags, td in segments:
            self.append(gid, ids, tags, td)

    def metadata(self, *, partition: str, user_metadata: dict[str, Any]) -> dict[str, Any]:
        """The ``metadata.json`` document describing every part written (call after ``finish()``)."""
        return {
            "format": FORMAT,
            "partition": partition,
            "rows": self.rows,
            "groups": self.groups,
            "bytes": self.bytes,
            "parts": self.parts,
            "user_metadata": user_metadata,
        }

    def finish(self) -> None:
        self._close()

    def abandon(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def write_metadata(directory: Path, doc: dict[str, Any]) -> dict[str, Any]:
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    write_durable(directory / METADATA_FILE, data)  # fsyncs the file and the directory
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


# ---------------------------------------------------------------------------------------------------- reading
def read_metadata(directory: Path) -> dict[str, Any]:
    """``metadata.json`` of a streamed directory, checked for format and parts."""
    path = Path(directory) / METADATA_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise StreamedFormatError(f"{path}: missing (the snapshot was never completed)") from None
    except ValueError as exc:
        raise StreamedFormatError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise StreamedFormatError(f"{path}: format is not {FORMAT}")
    if not isinstance(doc.get("parts"), list) or not isinstance(doc.get("partition"), str):
        raise StreamedFormatError(f"{path}: parts or partition missing")
    return doc


@dataclass
class RestoredGroup:
    group: str
    ids: list[str]
    tags: list[dict[str, Any]]
    data: TensorDict


def iter_groups(directory: Path, doc: dict[str, Any] | None = None) -> Iterator[RestoredGroup]:
    """Every stored group, in write order; a part's bytes are read once into memory and viewed, not copied."""
    directory = Path(directory)
    doc = doc or read_metadata(directory)
    for name in doc["parts"]:
        header_path = directory / f"{name}.json"
        try:
            header = json.loads(header_path.read_text())
        except (OSError, ValueError) as exc:
            raise StreamedFormatError(f"{header_path}: unreadable ({exc})") from None
        bin_path = directory / header["bin"]
        size = bin_path.stat().st_size
        if size != header["bytes"]:
            raise StreamedFormatError(f"{bin_path}: {size} bytes, header says {header['bytes']}")
        raw = bytearray(size)
        with open(bin_path, "rb", buffering=0) as f:
            view = memoryview(raw)
            got = 0
            while got < size:
                n = f.readinto(view[got:])
                if not n:
                    raise StreamedFormatError(f"{bin_path}: short read at {got} of {size}")
                got += n
        buf = torch.frombuffer(raw, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
        for seg in header["segments"]:
            ids = list(seg["ids"])
            data = {k: _rebuild(buf, spec) for k, spec in seg["fields"].items()}
            yield RestoredGroup(seg["group"], ids, list(seg["tags"]), TensorDict(data, batch_size=len(ids)))
