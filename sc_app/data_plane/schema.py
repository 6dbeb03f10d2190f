"""What the JSON files of a data-plane snapshot must hold, checked in full. Pure: no Ray, no torch, no TransferQueue.

One validator per file, used both by ``sc-app ckpt verify``/preflight (``sc_app.checkpoint.contents``) and by the
restore (``sc_app.data_plane.streamed_format``), so a snapshot that verifies is one the restore can read:

* ``parse_streamed_metadata`` — ``metadata.json`` of ``sc-app/streamed-v2`` (or ``-v1``, still read): exact keys
  and types, part names ``part-SS-NNNNN`` (v1: ``part-NNNNN``; so every file it names lies in its own directory), no
  part twice; in v2 the ``streams`` (one per storage unit) list exactly the parts, in order, and add up to the totals;
* ``parse_header`` — ``<part>.json``: its format is the snapshot's, its ``bin`` is exactly ``<part>.bin``,
  ``bytes`` is that file's size,
  every field's dtype is known, its bytes lie inside the bin, aligned for its dtype, without overlapping another
  field's, its shape matches its ``nbytes`` (and its jagged ``offsets`` its rows), every sample id belongs to its
  segment's group, one tag record per row;
* ``PartsTally`` / ``check_parts_agree`` — across parts: no sample id twice, no group twice in one stream (v1: at
  all; in v2 a group may have one segment per stream, the rows each unit held), each stream's and the directory's
  totals equal to what ``metadata.json`` says;
* ``parse_native_metadata`` — TransferQueue's own ``metadata.json``. The rest of the native format is pickles, which
  no reader can check safely: only their digest (and, with a key, the manifest's HMAC) stands behind them.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, model_validator

from sc_app.io.strict_json import Name, NonNegInt, Scalar, SchemaError, StrictModel, parse, validate, validate_json

STREAMED_FORMAT = "sc-app/streamed-v2"  # written now: one stream of parts per storage unit
STREAMED_FORMAT_V1 = "sc-app/streamed-v1"  # one stream, one segment per group; still read
READABLE_FORMATS = (STREAMED_FORMAT_V1, STREAMED_FORMAT)
PART_RE = re.compile(r"^part-(\d{2,4}-)?\d{5,9}$")
_PART_RE_OF = {
    STREAMED_FORMAT_V1: re.compile(r"^part-\d{5,9}$"),
    STREAMED_FORMAT: re.compile(r"^part-\d{2,4}-\d{5,9}$"),
}
MAX_DIMS = 32
MAX_METADATA_BYTES = 16 * 1024 * 1024  # metadata.json: a few bytes per part
MAX_HEADER_BYTES = 256 * 1024 * 1024  # a part header: a few hundred bytes per group of a 64 MiB part

# Every dtype the streamed snapshot stores, with its size in bytes (``PartWriter`` refuses any other).
DTYPE_SIZES: dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "complex64": 8,
    "complex128": 16,
}


class StreamedFormatError(ValueError):
    """A streamed data-plane directory is incomplete or does not match its own headers."""


def group_of(sample_id: str) -> str:
    """Group id of a sample id: everything before its last ``':'`` (``"p7:3"`` → ``"p7"``)."""
    gid, sep, _ = sample_id.rpartition(":")
    if not sep or not gid:
        raise ValueError(f"sample id {sample_id!r} has no group part (expected '<group>:<row>')")
    return gid


PartName = Annotated[str, StringConstraints(pattern=PART_RE.pattern)]


class FieldSpec(StrictModel):
    dtype: str
    shape: Annotated[list[NonNegInt], Field(max_length=MAX_DIMS)]
    offset: NonNegInt
    nbytes: NonNegInt
    offsets: list[NonNegInt] | None = None


class Segment(StrictModel):
    group: Name
    ids: Annotated[list[Name], Field(min_length=1)]
    tags: list[dict[str, Scalar]]
    fields: Annotated[dict[Name, FieldSpec], Field(min_length=1)]


class PartHeader(StrictModel):
    format: Literal["sc-app/streamed-v1", "sc-app/streamed-v2"]
    bin: str
    bytes: NonNegInt
    segments: list[Segment]


class StreamEntry(StrictModel):
    """One stream of a v2 snapshot: the parts one writer wrote (one storage unit's rows) and what they hold."""

    unit: Name | None
    parts: list[PartName]
    rows: NonNegInt
    segments: NonNegInt
    bytes: NonNegInt


class StreamedMetadata(StrictModel):
    format: Literal["sc-app/streamed-v1", "sc-app/streamed-v2"]
    partition: Name
    rows: NonNegInt
    groups: NonNegInt
    bytes: NonNegInt
    parts: list[PartName]
    user_metadata: dict[str, Any]
    segments: NonNegInt | None = None  # v2 only (v1: one segment per group)
    streams: list[StreamEntry] | None = None  # v2 only (v1: one stream, every part)

    @model_validator(mode="after")
    def _consistent(self) -> StreamedMetadata:
        if len(set(self.parts)) != len(self.parts):
            raise ValueError("parts lists a part twice")
        v1 = self.format == STREAMED_FORMAT_V1
        if v1 and (self.segments is not None or self.streams is not None):
            raise ValueError(f"{STREAMED_FORMAT_V1} has no segments or streams")
        if not v1 and (self.segments is None or self.streams is None):
            raise ValueError(f"{STREAMED_FORMAT} needs segments and streams")
        bad = [p for p in self.parts if not _PART_RE_OF[self.format].match(p)]
        if bad:
            raise ValueError(f"part name {bad[0]!r} is not one of {self.format}")
        if self.streams is None:
            return self
        if [p for st in self.streams for p in st.parts] != self.parts:
            raise ValueError("the streams' parts are not the parts listed, in order")
        for key in ("rows", "segments", "bytes"):
            total = sum(getattr(st, key) for st in self.streams)
            if total != getattr(self, key):
                raise ValueError(f"metadata.json says {getattr(self, key)} {key}, its streams add up to {total}")
        return self

    def stream_parts(self) -> list[list[str]]:
        """The part names of each stream, in write order (a v1 directory is one stream)."""
        if self.streams is None:
            return [list(self.parts)]
        return [list(st.parts) for st in self.streams]


class NativeMetadata(StrictModel):
    """TransferQueue's ``save_checkpoint`` metadata (``transfer_queue/interface.py``)."""

    storage_saved: bool
    user_metadata: dict[str, Any]


def _json(data: bytes) -> Any:
    try:
        return parse(data)
    except ValueError as exc:
        raise StreamedFormatError(str(exc)) from None


def snapshot_format(data: bytes) -> str | None:
    """The ``format`` a ``metadata.json`` declares (``None`` when it declares none: TransferQueue's native one)."""
    doc = _json(data)
    if not isinstance(doc, dict):
        raise StreamedFormatError("not a JSON object")
    fmt = doc.get("format")
    if fmt is not None and not isinstance(fmt, str):
        raise StreamedFormatError(f"format is {fmt!r}, not a string")
    return fmt


def parse_streamed_metadata(data: bytes) -> StreamedMetadata:
    doc = _json(data)
    if not isinstance(doc, dict) or doc.get("format") not in READABLE_FORMATS:
        raise StreamedFormatError(f"format is not one of {', '.join(READABLE_FORMATS)}")
    return streamed_metadata(doc)


def streamed_metadata(doc: Any) -> StreamedMetadata:
    """An already parsed ``metadata.json`` document, checked in full."""
    try:
        return validate(StreamedMetadata, doc)
    except SchemaError as exc:
        raise StreamedFormatError(str(exc).replace("Value error, ", "")) from None


def parse_native_metadata(data: bytes) -> NativeMetadata:
    try:
        return validate(NativeMetadata, _json(data))
    except SchemaError as exc:
        raise StreamedFormatError(str(exc)) from None


def _check_field(key: str, spec: FieldSpec, rows: int, bin_size: int) -> None:
    where = f"field {key!r}"
    size = DTYPE_SIZES.get(spec.dtype)
    if size is None:
        raise StreamedFormatError(f"{where}: unknown dtype {spec.dtype!r}")
    if not spec.shape:
        raise StreamedFormatError(f"{where}: shape is empty (a field has a row dimension)")
    if spec.offsets is None:
        if spec.shape[0] != rows:
            raise StreamedFormatError(f"{where}: shape {spec.shape} does not start with the segment's {rows} rows")
    else:
        offs = spec.offsets
        if len(offs) != rows + 1 or offs[0] != 0 or offs[-1] != spec.shape[0]:
            raise StreamedFormatError(
                f"{where}: jagged offsets must be {rows + 1} values from 0 to {spec.shape[0]}, got {len(offs)}"
            )
        if any(b < a for a, b in itertools.pairwise(offs)):
            raise StreamedFormatError(f"{where}: jagged offsets decrease")
    if math.prod(spec.shape) * size != spec.nbytes:
        raise StreamedFormatError(
            f"{where}: shape {spec.shape} of {spec.dtype} is {math.prod(spec.shape) * size} bytes, nbytes says "
            f"{spec.nbytes}"
        )
    if spec.offset % size:
        raise StreamedFormatError(f"{where}: offset {spec.offset} is not aligned to its {size}-byte dtype")
    if spec.offset + spec.nbytes > bin_size:
        raise StreamedFormatError(
            f"{where}: bytes [{spec.offset}, {spec.offset + spec.nbytes}) lie outside the part file ({bin_size} bytes)"
        )


def parse_header(data: bytes, *, name: str, bin_size: int) -> PartHeader:
    """Part header ``name``.json, checked against itself and the size of ``name``.bin."""
    try:
        header = validate_json(PartHeader, data)
    except ValueError as exc:  # not JSON, or not the schema
        raise StreamedFormatError(str(exc)) from None
    if header.bin != f"{name}.bin":
        raise StreamedFormatError(f"bin is {header.bin!r}, a part header names only its own {name}.bin")
    if header.bytes != bin_size:
        raise StreamedFormatError(f"says {name}.bin holds {header.bytes} bytes, it holds {bin_size}")
    ranges: list[tuple[int, int, str]] = []
    for i, seg in enumerate(header.segments):
        where = f"segment {i} (group {seg.group!r})"
        if len(set(seg.ids)) != len(seg.ids):
            raise StreamedFormatError(f"{where}: a sample id appears twice")
        for sid in seg.ids:
            gid, sep, _ = sid.rpartition(":")
            if not sep or gid != seg.group:
                raise StreamedFormatError(f"{where}: sample id {sid!r} does not belong to the group")
        if len(seg.tags) != len(seg.ids):
            raise StreamedFormatError(f"{where}: {len(seg.tags)} tag records for {len(seg.ids)} rows")
        for key, spec in seg.fields.items():
            try:
                _check_field(key, spec, len(seg.ids), bin_size)
            except StreamedFormatError as exc:
                raise StreamedFormatError(f"{where}: {exc}") from None
            if spec.nbytes:
                ranges.append((spec.offset, spec.offset + spec.nbytes, f"{where} field {key!r}"))
    ranges.sort()
    for (_, end, first), (start, _, second) in itertools.pairwise(ranges):
        if start < end:
            raise StreamedFormatError(f"{second}: its bytes overlap those of {first}")
    return header


class PartsTally:
    """Adds up parts as they are read (the restore reads one part at a time): ``add`` refuses a part of another
    format, a sample id stored twice, a group stored twice in one stream (v1: at all); ``finish`` totals that differ
    from ``metadata.json``. ``streams``: tally only these streams (a restore reads each stream on its own) — then
    ``finish`` checks each one's totals, and the directory's totals only when every stream is tallied."""

    def __init__(self, meta: StreamedMetadata, streams: Iterable[int] | None = None) -> None:
        self.meta = meta
        all_streams = meta.stream_parts()
        self.streams = sorted(set(range(len(all_streams)) if streams is None else streams))
        self._stream_of = {name: k for k in self.streams for name in all_streams[k]}
        self.groups: dict[str, list[str]] = {}
        self._seen: set[tuple[int, str]] = set()  # (stream, group)
        self._ids: set[str] = set()
        self._bytes = 0
        self._per_stream = {k: [0, 0, 0] for k in self.streams}  # rows, segments, bytes

    def add(self, header: PartHeader, name: str | None = None) -> None:
        """``header`` of part ``name`` (default: its ``bin`` less ``.bin``)."""
        meta = self.meta
        name = name if name is not None else header.bin.removesuffix(".bin")
        if header.format != meta.format:
            raise StreamedFormatError(f"part is {header.format}, metadata.json says {meta.format}")
        k = self._stream_of.get(name)
        if k is None:
            raise StreamedFormatError(f"part {name!r} is not one of the streams read")
        tally = self._per_stream[k]
        self._bytes += header.bytes
        tally[2] += header.bytes
        for seg in header.segments:
            if (k, seg.group) in self._seen:
                where = "" if meta.format == STREAMED_FORMAT_V1 else " in one stream"
                raise StreamedFormatError(f"group {seg.group!r} is stored twice{where}")
            self._seen.add((k, seg.group))
            dup = self._ids.intersection(seg.ids)
            if dup:
                raise StreamedFormatError(f"sample id {sorted(dup)[0]!r} is stored twice")
            self._ids.update(seg.ids)
            self.groups.setdefault(seg.group, []).extend(seg.ids)
            tally[0] += len(seg.ids)
            tally[1] += 1

    def finish(self) -> dict[str, list[str]]:
        """Group id → sample ids over every part added."""
        meta = self.meta
        if meta.streams is not None:
            for k in self.streams:
                st, (rows, segments, size) = meta.streams[k], self._per_stream[k]
                if (rows, segments, size) != (st.rows, st.segments, st.bytes):
                    raise StreamedFormatError(
                        f"stream {k}'s parts hold {rows} rows in {segments} segments and {size} bytes, "
                        f"metadata.json says {st.rows} rows in {st.segments} segments and {st.bytes} bytes"
                    )
        if len(self.streams) < len(meta.stream_parts()):
            return self.groups
        if (len(self._ids), len(self.groups), self._bytes) != (meta.rows, meta.groups, meta.bytes):
            raise StreamedFormatError(
                f"the parts hold {len(self._ids)} rows in {len(self.groups)} groups and {self._bytes} bytes, "
                f"metadata.json says {meta.rows} rows in {meta.groups} groups and {meta.bytes} bytes"
            )
        return self.groups


def check_parts_agree(meta: StreamedMetadata, headers: Iterable[PartHeader]) -> dict[str, list[str]]:
    """Group id → sample ids over every part; ``StreamedFormatError`` unless they are disjoint and add up to
    ``metadata.json``'s rows, groups and bytes."""
    tally = PartsTally(meta)
    for header in headers:
        tally.add(header)
    return tally.finish()
