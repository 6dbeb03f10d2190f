"""The on-disk format of the streamed data-plane snapshot (``sc-app/streamed-v2``): pure of Ray and TransferQueue.

Field bytes <-> tensors, part files and their JSON headers, ``metadata.json``. The format, and why it has no pickle,
is described in ``docs/checkpoint.md`` ("The streamed data-plane format"); ``sc_app.data_plane.streamed`` moves
rows between these files and TransferQueue. Reading checks every JSON file with the validators of
``sc_app.data_plane.schema`` (the ones verification uses) before a byte of a part is viewed as a tensor, reads only
regular files of the directory (no link followed) and never more than a JSON file may hold.

v2 (written now) holds one *stream* of part files per storage unit (``part-SS-NNNNN``), each written by its own
writer; a segment is the rows of one group that one unit held, so a group may span a segment per stream.
v1 (``part-NNNNN``, one stream, a segment per whole group) is still read: it is a v2 directory of one stream.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from sc_app.data_plane.client import METADATA_FILE
from sc_app.data_plane.part_buffers import PartBuffers, PartLease
from sc_app.data_plane.part_writer import PartWriter, digest_of, merged_metadata
from sc_app.data_plane.schema import (
    DTYPE_SIZES,
    MAX_HEADER_BYTES,
    MAX_METADATA_BYTES,
    READABLE_FORMATS,
    STREAMED_FORMAT,
    STREAMED_FORMAT_V1,
    FieldSpec,
    PartHeader,
    PartsTally,
    StreamedFormatError,
    StreamedMetadata,
    group_of,
    parse_header,
    parse_streamed_metadata,
    snapshot_format,
    streamed_metadata,
)
from sc_app.io import hashing
from sc_app.io.durable import write_durable
from sc_app.io.safe_files import FileProblem, open_regular, read_regular

__all__ = [
    "PART_BYTES",
    "READABLE_FORMATS",
    "STREAMED_FORMAT",
    "STREAMED_FORMAT_V1",
    "PartWriter",
    "RestoredGroup",
    "StreamedFormatError",
    "group_ids",
    "group_of",
    "is_streamed",
    "iter_groups",
    "merged_metadata",
    "read_metadata",
    "stream_headers",
    "stream_parts",
    "write_metadata",
]  # the writing side (``PartWriter``, ``merged_metadata``) is ``sc_app.data_plane.part_writer``

PART_BYTES = 64 * 1024 * 1024  # a part file is closed (and fsynced) once it holds this much


def group_ids(sample_ids: list[str]) -> dict[str, list[str]]:
    """Sample ids grouped by group id; groups in first-seen order, ids in the order given."""
    groups: dict[str, list[str]] = {}
    for sid in sample_ids:
        groups.setdefault(group_of(sid), []).append(sid)
    return groups


def is_streamed(directory: Path) -> bool:
    """True when ``directory/metadata.json`` names a streamed format this version reads (v1 or v2)."""
    try:
        return snapshot_format(read_regular(Path(directory) / METADATA_FILE, MAX_METADATA_BYTES)) in READABLE_FORMATS
    except (OSError, ValueError):
        return False


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None) if name in DTYPE_SIZES else None
    if not isinstance(dt, torch.dtype):
        raise StreamedFormatError(f"unknown dtype {name!r}")
    return dt


def _rebuild(buf: torch.Tensor, spec: FieldSpec, base: int = 0) -> torch.Tensor:
    """Tensor described by ``spec`` (checked by ``parse_header``) from a uint8 buffer holding the part's bytes from
    offset ``base`` on (a view, no copy)."""
    start, n = spec.offset - base, spec.nbytes
    values = buf[start : start + n].view(_dtype(spec.dtype)).reshape(spec.shape)
    if spec.offsets is None:
        return values
    return torch.nested.nested_tensor_from_jagged(values, offsets=torch.tensor(spec.offsets, dtype=torch.int64))


def write_metadata(directory: Path, doc: dict[str, Any], hash_alg: str = hashing.DEFAULT) -> dict[str, Any]:
    """Write ``metadata.json`` durably; its ``hashing.FileDigest.as_dict()``."""
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    write_durable(directory / METADATA_FILE, data)  # fsyncs the file and the directory
    return digest_of(data, hash_alg)


# ---------------------------------------------------------------------------------------------------- reading
def _metadata(directory: Path) -> StreamedMetadata:
    path = Path(directory) / METADATA_FILE
    try:
        data = read_regular(path, MAX_METADATA_BYTES)
    except FileProblem as exc:
        raise StreamedFormatError(f"{exc} (the snapshot was never completed, or was changed)") from None
    try:
        return parse_streamed_metadata(data)
    except StreamedFormatError as exc:
        raise StreamedFormatError(f"{path}: {exc}") from None


def read_metadata(directory: Path) -> dict[str, Any]:
    """``metadata.json`` of a streamed directory (v1 or v2), checked in full (``parse_streamed_metadata``); keys
    a format does not have (v1: ``segments``, ``streams``) are absent."""
    doc = _metadata(directory).model_dump()
    return {k: v for k, v in doc.items() if v is not None or k not in ("segments", "streams")}


def _meta_of(doc: dict[str, Any]) -> StreamedMetadata:
    """A ``read_metadata`` document checked again (it may have crossed a process boundary)."""
    return streamed_metadata(doc)


def stream_parts(doc: dict[str, Any]) -> list[list[str]]:
    """The part names of each stream, in write order (a v1 directory is one stream)."""
    return _meta_of(doc).stream_parts()


@dataclass
class RestoredGroup:
    group: str
    ids: list[str]
    tags: list[dict[str, Any]]
    data: TensorDict
    lease: PartLease | None = None  # the pooled buffer ``data`` views (``iter_groups(buffers=...)``)

    def release(self) -> None:
        """Nothing reads ``data`` any more (its put completed): its pooled buffer may be reused."""
        if self.lease is not None:
            self.lease.release()
            self.lease = None


def _open_part(directory: Path, name: str) -> tuple[PartHeader, int]:
    """Header of part ``name`` (checked in full against the bin's size) and an open descriptor of its bin (the
    caller closes it)."""
    header_path = directory / f"{name}.json"
    try:
        data = read_regular(header_path, MAX_HEADER_BYTES)
        fd = open_regular(directory / f"{name}.bin")
    except FileProblem as exc:
        raise StreamedFormatError(str(exc)) from None
    try:
        return parse_header(data, name=name, bin_size=os.fstat(fd).st_size), fd
    except StreamedFormatError as exc:
        os.close(fd)
        raise StreamedFormatError(f"{header_path}: {exc}") from None


def _read_range(path: Path, fd: int, offset: int, out: torch.Tensor) -> None:
    """``out.numel()`` bytes of the file from ``offset`` into ``out`` (``parse_header`` checked they are inside it)."""
    view = memoryview(out.numpy())
    got = 0
    while got < view.nbytes:
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            raise StreamedFormatError(f"{path}: short read at {offset + got}")
        got += n


def _read_bin(directory: Path, header: PartHeader, fd: int) -> torch.Tensor:
    """The bin's bytes into an uninitialised (never zero-filled) uint8 tensor: one plain read of the file."""
    size = header.bytes
    buf = torch.empty(size, dtype=torch.uint8)
    if not size:
        return buf
    view = memoryview(buf.numpy())
    got = 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if not n:
            raise StreamedFormatError(f"{directory / header.bin}: short read at {got} of {size}")
        got += n
    return buf


def stream_headers(directory: Path, doc: dict[str, Any] | None = None) -> list[list[PartHeader]]:
    """Every part header of every stream, each checked in full and all of them against each other and
    ``metadata.json`` (``PartsTally``): what a restore knows before it registers a row."""
    directory = Path(directory)
    meta = _meta_of(doc) if doc is not None else _metadata(directory)
    tally = PartsTally(meta)
    out: list[list[PartHeader]] = []
    for parts in meta.stream_parts():
        headers = []
        for name in parts:
            header, fd = _open_part(directory, name)
            os.close(fd)
            try:
                tally.add(header, name)
            except StreamedFormatError as exc:
                raise StreamedFormatError(f"{directory / (name + '.json')}: {exc}") from None
            headers.append(header)
        out.append(headers)
    try:
        tally.finish()
    except StreamedFormatError as exc:
        raise StreamedFormatError(f"{directory}: {exc}") from None
    return out


def iter_groups(
    directory: Path, doc: dict[str, Any] | None = None, stream: int | None = None, buffers: PartBuffers | None = None
) -> Iterator[RestoredGroup]:
    """Every stored segment (a group's rows; in v2 the rows of a group one unit held) of stream ``stream`` (default:
    every stream), in write order; a part's bytes are read once into memory and viewed, not copied. Without
    ``buffers``, each part is read whole into a fresh tensor; with, each segment's bytes alone into a pooled buffer
    that the group holds (``RestoredGroup.lease``) until the consumer calls ``release()`` — so a restore touches
    fresh pages only for the segments it has in flight, not for every part.

    Each part's header is checked in full before any of its bytes is viewed as a tensor, a sample id stored twice
    is refused before it is yielded again, and after the last part the totals (of the stream, and with every stream
    of the directory) must be ``metadata.json``'s — the checks verification makes (``sc_app.data_plane.schema``)."""
    directory = Path(directory)
    meta = _meta_of(doc) if doc is not None else _metadata(directory)
    streams = meta.stream_parts()
    chosen = range(len(streams)) if stream is None else [stream]
    tally = PartsTally(meta, chosen)
    for k in chosen:
        for name in streams[k]:
            header, fd = _open_part(directory, name)
            try:
                try:
                    tally.add(header, name)
                    buf = _read_bin(directory, header, fd) if buffers is None else None
                except StreamedFormatError as exc:
                    raise StreamedFormatError(f"{directory / (name + '.json')}: {exc}") from None
                for seg in header.segments:
                    lease = None
                    if buf is None:  # pooled: this segment's byte range alone, into a buffer it holds
                        assert buffers is not None
                        lo = min(spec.offset for spec in seg.fields.values())
                        hi = max(spec.offset + spec.nbytes for spec in seg.fields.values())
                        lease = buffers.take(hi - lo)
                        _read_range(directory / header.bin, fd, lo, lease.tensor)
                        data = {key: _rebuild(lease.tensor, spec, lo) for key, spec in seg.fields.items()}
                    else:
                        data = {key: _rebuild(buf, spec) for key, spec in seg.fields.items()}
                    tags = [dict(t) for t in seg.tags]
                    td = TensorDict(data, batch_size=len(seg.ids))
                    yield RestoredGroup(seg.group, list(seg.ids), tags, td, lease)  # the group holds the lease
            finally:
                os.close(fd)
    try:
        tally.finish()
    except StreamedFormatError as exc:
        raise StreamedFormatError(f"{directory}: {exc}") from None
