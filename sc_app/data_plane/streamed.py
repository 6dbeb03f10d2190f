"""Streamed data-plane snapshot: capture inside the barrier window, copy the bytes after it, no pickle anywhere.

TransferQueue's native ``save_checkpoint`` writes every byte while the caller holds the barrier's exclusive
window, and pickles each row together with the whole buffer of the put that created it. This module splits the
snapshot in two:

* **capture** (``StreamedSnapshot.capture``, inside the window): records *which* rows form the snapshot — the
  ``sample_ids`` the replay index lists, grouped by group id (the part of an id before its last ``':'``) — and,
  when the caller knows them, each group's field names and each row's tags. No I/O, no data-plane call.
* **write** (``StreamedSnapshot.write``, after the window): reads exactly those rows (and only the captured
  fields) back from TransferQueue one group at a time (a few gets in flight), and appends each group's tensors
  as raw bytes to ``part-NNNNN.bin`` files, each described by a ``part-NNNNN.json`` header (group, ids, tags, and
  per field dtype / shape / byte range). Every file is fsynced and hashed as it is written (``write()`` returns
  the sha256 of each file, so the bundle manifest need not read them again); ``metadata.json`` is written last,
  so a directory without it is incomplete.

Consistency invariant (what makes deferred writing correct): between ``capture`` and the return of ``write``
nothing clears a captured row or rewrites a captured field. The replay buffer guarantees it while frozen: a drop
of a captured group is deferred to ``thaw()``, and the advantage stage may add a field the group did not have at
capture (never read: ``write`` selects the captured fields) but waits for ``thaw()`` to rewrite one it had.
Rows *added* meanwhile are never read either: ``write`` fetches captured ids only, so the snapshot equals the
captured state exactly, whatever the train pump and the rollout pumps do during the copy.

Restore (``load_streamed``) puts every group back with **one put per group**, so each row shares its storage
buffer only with rows of its own group and a later clear of the group frees the whole buffer — bundle bytes stay
≈ live bytes however groups are committed and cleared.

On-disk format ``sc-app/streamed-v1`` (only JSON and raw little-endian tensor bytes)::

    metadata.json     {"format", "partition", "rows", "groups", "bytes", "parts": [...], "user_metadata": {...}}
    part-00000.json   {"format", "bin", "bytes", "segments": [{"group", "ids", "tags",
                        "fields": {name: {"dtype", "shape", "offset", "nbytes", "offsets"}}}]}
    part-00000.bin    the segments' bytes, each field 64-byte aligned

A field is stored as one dense block ``[rows, ...]`` when every row of the group has the same shape, else as the
jagged values plus ``offsets`` (restored as a jagged nested tensor). Fields are read per group, so a field must
be present on every row of its group (true for commits and the advantage stage, which write whole groups).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import json
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from sc_app.background import run_blocking
from sc_app.checkpoint.fsio import write_durable
from sc_app.data_plane.client import CapturedRows, DataPlaneSnapshot

log = logging.getLogger(__name__)

FORMAT = "sc-app/streamed-v1"
METADATA_FILE = "metadata.json"
PART_BYTES = 64 * 1024 * 1024  # a part file is closed (and fsynced) once it holds this much
GETS_IN_FLIGHT = 2  # group reads overlapping the file writes
GET_BYTES = 4 * 1024 * 1024  # small groups share a get up to about this many bytes
MAX_GROUPS_PER_GET = 64
PUTS_IN_FLIGHT = 2  # group puts overlapping the file reads on restore
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


# ---------------------------------------------------------------------------------------------------- tensors
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
class _PartWriter:
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
        fields: dict[str, Any] = {}
        rows = len(ids)
        for key in td.keys():  # noqa: SIM118 - iterating a TensorDict walks its batch, not its keys
            tensor, shape, offsets = _as_blocks(td.get(key), rows, str(key))
            pad = -self._pos % _ALIGN
            if pad:
                self._write(b"\0" * pad)
                self._pos += pad
            data = _tensor_bytes(tensor)
            self._write(data)
            fields[str(key)] = {
                "dtype": _dtype_name(tensor.dtype),
                "shape": shape,
                "offset": self._pos,
                "nbytes": data.nbytes,
                "offsets": offsets,
            }
            self._pos += data.nbytes
        self._segments.append({"group": gid, "ids": ids, "tags": tags, "fields": fields})
        if self._pos >= self.part_bytes:
            self._close()

    def append_all(self, segments: list[tuple[str, list[str], list[dict[str, Any]], TensorDict]]) -> None:
        for gid, ids, tags, td in segments:
            self.append(gid, ids, tags, td)

    def finish(self) -> None:
        self._close()

    def abandon(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class StreamedSnapshot(DataPlaneSnapshot):
    """Rows captured inside the barrier window; ``write()`` copies them to ``directory`` after it.

    Pre (the caller's, for the whole time until ``write()`` returns): no captured row is cleared and no captured
    field rewritten (``fields``: the field names each group held at capture; a group missing from it, or mapped to
    ``None``, has every field it holds read, so none of its fields may change).
    Post of ``write()``: ``directory`` holds exactly the captured rows and fields, every file fsynced,
    ``metadata.json`` last; the returned ``files`` hold the sha256 of every file written.
    """

    tq: Any
    directory: Path
    partition: str
    groups: dict[str, list[str]]
    metadata: dict[str, Any]
    captured_at: float
    fields: dict[str, list[str] | None] | None = None
    tags: dict[str, dict[str, Any]] | None = None
    part_bytes: int = PART_BYTES
    gets_in_flight: int = GETS_IN_FLIGHT

    @classmethod
    def capture(
        cls, tq: Any, directory: Path, metadata: dict[str, Any], partition: str, rows: CapturedRows, **kw: Any
    ) -> StreamedSnapshot:
        """Record which rows (and fields, tags) form the snapshot. No I/O and no data-plane call."""
        groups = group_ids(list(rows.sample_ids))
        fields, tags = rows.fields, rows.tags
        if tags is not None:
            tags = {sid: dict(tags[sid]) for ids in groups.values() for sid in ids}
        if fields is not None:
            fields = {gid: None if (names := fields.get(gid)) is None else list(names) for gid in groups}
        return cls(tq, Path(directory), partition, groups, dict(metadata), time.perf_counter(), fields, tags, **kw)

    @property
    def rows(self) -> int:
        return sum(len(ids) for ids in self.groups.values())

    async def write(self, *, executor: Executor | None = None) -> dict[str, Any]:
        started = time.perf_counter()
        blocking = functools.partial(run_blocking, executor)

        self.directory.mkdir(parents=True, exist_ok=True)
        if any(self.directory.iterdir()):
            raise FileExistsError(f"{self.directory}: not empty; a streamed snapshot writes into an empty directory")
        tags: dict[str, Any] = self.tags or {}
        if self.groups and self.tags is None:
            listing = await self.tq.async_kv_list(partition_id=self.partition)
            tags = listing.get(self.partition, {})
        missing = [sid for ids in self.groups.values() for sid in ids if sid not in tags]
        if missing:
            raise RuntimeError(
                f"{len(missing)} captured rows (e.g. {missing[0]!r}) left partition {self.partition!r} before the "
                "snapshot was written; captured rows must not be cleared until write() returns"
            )
        writer = _PartWriter(self.directory, self.part_bytes)
        try:
            await self._copy(writer, tags, blocking)
            await blocking(writer.finish)
        except BaseException:
            writer.abandon()
            raise
        doc = {
            "format": FORMAT,
            "partition": self.partition,
            "rows": self.rows,
            "groups": len(self.groups),
            "bytes": writer.bytes,
            "parts": writer.parts,
            "user_metadata": self.metadata,
        }
        files = dict(writer.hashes)
        files[METADATA_FILE] = await blocking(_write_metadata, self.directory, doc)
        seconds = time.perf_counter() - started
        size = sum(f["size"] for f in files.values())
        log.info("streamed snapshot: %d rows, %d bytes in %.3fs to %s", self.rows, size, seconds, self.directory)
        return {"bytes": size, "rows": self.rows, "seconds": seconds, "payload_bytes": writer.bytes, "files": files}

    def _select(self, gid: str) -> list[str] | None:
        return None if self.fields is None else self.fields.get(gid)

    async def _copy(self, writer: _PartWriter, tags: dict[str, Any], blocking: Callable[..., Awaitable[Any]]) -> None:
        """Fetch groups in order with a few gets in flight; append them to the parts in a worker thread.

        Small groups are fetched several per get (the RPC, not the bytes, is their cost): only groups with the
        same captured field list share a get, so every row holds every selected field and TransferQueue's
        multi-key get (which returns the fields *all* rows have) cannot drop one. A group of unknown fields is
        fetched alone. How many share a get is sized from the first group's bytes (``GET_BYTES``)."""
        items = list(self.groups.items())
        pos = 0
        per_get = 1
        pending: deque[tuple[list[tuple[str, list[str]]], asyncio.Task[Any]]] = deque()

        def next_batch() -> tuple[list[tuple[str, list[str]]], asyncio.Task[Any]]:
            nonlocal pos
            select = self._select(items[pos][0])
            batch = [items[pos]]
            pos += 1
            while select is not None and len(batch) < per_get and pos < len(items):
                if self._select(items[pos][0]) != select:
                    break
                batch.append(items[pos])
                pos += 1
            keys = [sid for _, ids in batch for sid in ids]
            get = self.tq.async_kv_batch_get(keys=keys, partition_id=self.partition, select_fields=select)
            return batch, asyncio.ensure_future(get)

        try:
            while pos < len(items) or pending:
                while pos < len(items) and len(pending) < max(1, self.gets_in_flight):
                    pending.append(next_batch())
                batch, task = pending.popleft()
                td = await task
                rows = sum(len(ids) for _, ids in batch)
                if td.batch_size[0] != rows:
                    raise RuntimeError(f"groups {batch[0][0]}..: read back {td.batch_size[0]} rows, captured {rows}")
                if per_get == 1 and len(batch) == 1:
                    per_get = max(1, min(MAX_GROUPS_PER_GET, GET_BYTES // max(1, _td_bytes(td))))
                segments = [
                    (gid, ids, [dict(tags[sid]) for sid in ids], part) for (gid, ids), part in _split(td, batch)
                ]
                await blocking(writer.append_all, segments)
        finally:
            for _, t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*(t for _, t in pending), return_exceptions=True)


def _td_bytes(td: TensorDict) -> int:
    total = 0
    for key in td.keys():  # noqa: SIM118 - iterating a TensorDict walks its batch, not its keys
        v = td.get(key)
        if isinstance(v, torch.Tensor):
            v = v.values() if v.is_nested else v
            total += v.numel() * v.element_size()
    return total


def _split(td: TensorDict, batch: list[tuple[str, list[str]]]) -> Iterator[tuple[tuple[str, list[str]], TensorDict]]:
    """The rows of each group of ``batch`` (in order) out of one get's result."""
    if len(batch) == 1:
        yield batch[0], td
        return
    columns = {}
    for key in td.keys():  # noqa: SIM118
        v = td.get(key)
        columns[str(key)] = list(v.unbind()) if isinstance(v, torch.Tensor) and v.is_nested else v
    start = 0
    for gid, ids in batch:
        end = start + len(ids)
        fields = {}
        for key, col in columns.items():
            if isinstance(col, list):
                rows = col[start:end]
                same = all(r.shape == rows[0].shape for r in rows)
                fields[key] = torch.stack(rows) if same else torch.nested.nested_tensor(rows, layout=torch.jagged)
            else:
                fields[key] = col[start:end]
        yield (gid, ids), TensorDict(fields, batch_size=len(ids))
        start = end


def _write_metadata(directory: Path, doc: dict[str, Any]) -> dict[str, Any]:
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
    fields: TensorDict


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
            fields = {k: _rebuild(buf, spec) for k, spec in seg["fields"].items()}
            yield RestoredGroup(seg["group"], ids, list(seg["tags"]), TensorDict(fields, batch_size=len(ids)))


def _prefetched(it: Iterator[RestoredGroup], depth: int = 8) -> Iterator[RestoredGroup]:
    """Run ``it`` in a thread, ``depth`` groups ahead (file reads overlap the puts)."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def run() -> None:
        try:
            for item in it:
                if stop.is_set():
                    return
                q.put(item)
            q.put(done)
        except BaseException as exc:  # handed to the consumer
            q.put(exc)

    t = threading.Thread(target=run, name="streamed-restore-reader", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while t.is_alive():  # unblock a reader waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.05)


def load_streamed(
    tq: Any, directory: Path, *, puts_in_flight: int = PUTS_IN_FLIGHT, on_group: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Put every stored group back into TransferQueue, one put per group, tags restored; returns ``metadata.json``.

    Pre: the caller checked the data plane is untouched. Post: the partition holds exactly the stored rows.
    Runs its own event loop in a worker thread, so it may be called with or without a running loop.
    """
    doc = read_metadata(Path(directory))
    result: dict[str, Any] = {}

    async def run() -> None:
        rows = groups = 0
        inflight: set[asyncio.Task[Any]] = set()
        for g in _prefetched(iter_groups(Path(directory), doc)):
            while len(inflight) >= max(1, puts_in_flight):
                finished, inflight_left = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                for t in finished:
                    t.result()
                inflight = set(inflight_left)
            put = tq.async_kv_batch_put(keys=g.ids, partition_id=doc["partition"], fields=g.fields, tags=g.tags)
            inflight.add(asyncio.ensure_future(put))
            rows += len(g.ids)
            groups += 1
            if on_group is not None:
                on_group(g.group)
        for t in asyncio.as_completed(inflight):
            await t
        result.update(rows=rows, groups=groups)

    box: list[BaseException] = []

    def thread_main() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=thread_main, name="streamed-restore", daemon=True)
    t.start()
    t.join()
    if box:
        raise box[0]
    if result.get("rows") != doc.get("rows") or result.get("groups") != doc.get("groups"):
        raise StreamedFormatError(
            f"{directory}: restored {result.get('rows')} rows in {result.get('groups')} groups, metadata.json "
            f"lists {doc.get('rows')} rows in {doc.get('groups')} groups"
        )
    return doc
