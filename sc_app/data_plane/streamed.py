"""The streamed data-plane snapshot: capture rows inside the barrier window, copy them to disk after it; restore
them with one put per segment. No pickle anywhere.

The format of the files is ``sc_app.data_plane.streamed_format`` (described in ``docs/checkpoint.md``). Writing
after the window is correct because the caller keeps the freeze (``sc_app/data_plane/replay_buffer.py``) until it ends.

Both directions run one stream per storage unit, concurrently (``sc_app.data_plane.stream_io``): a save looks up
the captured rows' global indexes once, splits them by the unit TransferQueue routes them to, and each stream reads
its unit's rows into part files of its own; a restore registers every stored row once (in an order that gives each
stream's rows one unit where the counts allow), then each stream puts its own segments back. A stream runs in
this process, or in a ``StreamWorker`` on its unit's node when that node is another one and sees the same volume.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from sc_app import waits
from sc_app.data_plane import stream_io, units
from sc_app.data_plane.client import METADATA_FILE, CapturedRows, DataPlaneSnapshot
from sc_app.data_plane.stream_io import GET_BYTES, GETS_IN_FLIGHT, PUTS_IN_FLIGHT, RowSource, Segment
from sc_app.data_plane.streamed_format import (
    PART_BYTES,
    StreamedFormatError,
    group_ids,
    merged_metadata,
    read_metadata,
    stream_headers,
    write_metadata,
)
from sc_app.io.background import run_blocking

log = logging.getLogger(__name__)

__all__ = ["GETS_IN_FLIGHT", "GET_BYTES", "PUTS_IN_FLIGHT", "StreamedSnapshot", "load_streamed"]

_MARKER = ".sc-app-stream-probe"  # written before remote streams start: a worker that sees it shares the volume


@dataclass
class StreamedSnapshot(DataPlaneSnapshot):
    """Rows captured inside the barrier window; ``write()`` copies them to ``directory`` after it.

    Pre: the freeze (``replay_buffer.py``) holds from ``capture`` until ``write()`` returns. ``field_names``
    are the names each group held at capture; a group missing from it, or mapped to ``None``, has every field it
    holds read. Rows added meanwhile are never read.
    Post of ``write()``: ``directory`` holds exactly the captured rows and fields, every file fsynced,
    ``metadata.json`` last; the returned ``files`` hold the digest (``hashing.FileDigest.as_dict()``) of every file
    written.
    """

    tq: Any
    directory: Path
    partition: str
    groups: dict[str, list[str]]
    metadata: dict[str, Any]
    field_names: dict[str, list[str] | None] | None = None
    tags: dict[str, dict[str, Any]] | None = None
    part_bytes: int = PART_BYTES
    gets_in_flight: int = GETS_IN_FLIGHT
    source: RowSource | None = None  # None: TransferQueue's own client; set: every stream runs here through it
    placement: bool = True  # False: every stream runs in this process
    streams: list[dict[str, Any]] = field(default_factory=list)  # after write(): where each stream ran, its rows

    @classmethod
    def capture(
        cls, tq: Any, directory: Path, metadata: dict[str, Any], partition: str, captured: CapturedRows, **kw: Any
    ) -> StreamedSnapshot:
        """Record which rows (and fields, tags) form the snapshot. No I/O and no data-plane call."""
        groups = group_ids(list(captured.sample_ids))
        field_names, tags = captured.field_names, captured.tags
        if tags is not None:
            tags = {sid: dict(tags[sid]) for ids in groups.values() for sid in ids}
        if field_names is not None:
            field_names = {gid: None if (names := field_names.get(gid)) is None else list(names) for gid in groups}
        return cls(tq, Path(directory), partition, groups, dict(metadata), field_names, tags, **kw)

    @property
    def rows(self) -> int:
        return sum(len(ids) for ids in self.groups.values())

    def _select(self, gid: str) -> list[str] | None:
        return None if self.field_names is None else self.field_names.get(gid)

    async def write(self, *, executor: Executor | None = None) -> dict[str, Any]:
        started = time.perf_counter()
        blocking = functools.partial(run_blocking, executor)

        # never parents: the bundle's tmp dir must still be where its writer made it (a new lease holder may have
        # moved a fenced-off writer's tmp dir aside; recreating it would collide with the holder's own save)
        self.directory.mkdir(exist_ok=True)
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
        plan = await self._plan(tags) if self.groups else []
        summaries = await asyncio.gather(*(self._run_stream(k, unit, segs) for k, (unit, segs) in enumerate(plan)))
        doc = merged_metadata(list(summaries), partition=self.partition, user_metadata=self.metadata)
        files: dict[str, Any] = {}
        for st in summaries:
            files.update(st["hashes"])
        files[METADATA_FILE] = await blocking(write_metadata, self.directory, doc)
        seconds = time.perf_counter() - started
        size = sum(f["size"] for f in files.values())
        log.info(
            "streamed snapshot: %d rows in %d streams, %d bytes in %.3fs to %s",
            self.rows,
            len(plan),
            size,
            seconds,
            self.directory,
        )
        return {"bytes": size, "rows": self.rows, "seconds": seconds, "files": files, "streams": len(plan)}

    async def _plan(self, tags: dict[str, Any]) -> list[tuple[str, list[Segment]]]:
        """One lookup of every captured row's global index, split by unit into segments (group order kept)."""
        client = units.tq_client(self.tq)
        gids = list(self.groups)
        ids = [sid for gid in gids for sid in self.groups[gid]]
        try:
            gis = await units.locate(client, self.partition, ids)
        except KeyError as exc:
            raise RuntimeError(
                f"captured rows left partition {self.partition!r} before the snapshot was written ({exc}); "
                "captured rows must not be cleared until write() returns"
            ) from None
        sizes = [len(self.groups[gid]) for gid in gids]
        plan = []
        for unit_rows in units.route(client, gis):
            segments = []
            for g, start, count in units.segments_of(sizes, unit_rows.positions):
                seg_ids = [ids[p] for p in unit_rows.positions[start : start + count]]
                segments.append(
                    Segment(
                        gids[g],
                        seg_ids,
                        unit_rows.global_indexes[start : start + count],
                        [dict(tags[sid]) for sid in seg_ids],
                        self._select(gids[g]),
                    )
                )
            plan.append((unit_rows.unit, segments))
        return plan

    async def _run_stream(self, k: int, unit: str, segments: list[Segment]) -> dict[str, Any]:
        prefix = f"part-{k:02d}"
        worker = await self._remote_worker(unit)
        rows = sum(len(seg.ids) for seg in segments)
        if worker is not None:
            summary = await worker.copy.remote(str(self.directory), self.partition, prefix, segments, self.part_bytes)
            self.streams.append({"unit": unit, "rows": rows, "where": "remote"})
            return {**summary, "unit": unit}
        source = self.source or RowSource(self.tq, self.partition)
        writer = await stream_io.write_stream(
            source, self.directory, prefix, segments, self.part_bytes, thread=f"stream-{k}",
            gets_in_flight=self.gets_in_flight,
        )
        self.streams.append({"unit": unit, "rows": rows, "where": "local"})
        return writer.summary(unit)

    async def _remote_worker(self, unit: str) -> Any:
        """A ``StreamWorker`` on ``unit``'s node when that is another node that sees this directory, else None."""
        if not self.placement or self.source is not None:
            return None
        return await asyncio.to_thread(_worker_for_unit, self.tq, unit, self.directory)


def _worker_for_unit(tq: Any, unit: str, directory: Path) -> Any:
    """Blocking: the stream worker for ``unit``'s node, or None (same node, node unknown, or volume not shared)."""
    if not ray.is_initialized():
        return None
    node = units.unit_nodes(units.tq_client(tq)).get(unit)
    if node is None or node == ray.get_runtime_context().get_node_id():
        return None
    worker = stream_io.worker_on(node)
    marker = f"{_MARKER}-{uuid.uuid4().hex[:8]}"
    (Path(directory) / marker).write_bytes(b"")
    try:
        seen = worker.sees.remote(str(directory), marker)
        shared = bool(waits.get(seen, what=f"the stream worker on node {node}", bound=waits.current().capped(300)))
    finally:
        (Path(directory) / marker).unlink()
    if not shared:
        log.info("node %s does not see %s: unit %s's stream runs in this process", node, directory, unit)
        return None
    return worker


# ------------------------------------------------------------------------------------------------ restore
def _interleave(streams: list[list[str]]) -> list[str]:
    """Round-robin over the streams' ids: registered in this order, consecutive global indexes alternate between
    streams, so each stream's rows route to one unit when the counts match (TransferQueue routes ``gi % n``)."""
    out: list[str] = []
    longest = max((len(s) for s in streams), default=0)
    for i in range(longest):
        for s in streams:
            if i < len(s):
                out.append(s[i])
    return out


def _stream_ids(directory: Path, doc: dict[str, Any]) -> list[list[str]]:
    """Each stream's row ids in file order, from its part headers, every header checked in full and all of them
    against ``metadata.json`` (``stream_headers``) before a row is registered."""
    return [
        [sid for header in headers for seg in header.segments for sid in seg.ids]
        for headers in stream_headers(directory, doc)
    ]


async def _restore(tq: Any, directory: Path, doc: dict[str, Any], placement: bool) -> dict[str, Any]:
    client = units.tq_client(tq)
    partition = doc["partition"]
    ids = await asyncio.to_thread(_stream_ids, directory, doc)
    order = _interleave(ids)
    if len(set(order)) != len(order):
        raise StreamedFormatError(f"{directory}: a row id is stored twice")
    gi_of = dict(zip(order, await units.register(client, partition, order), strict=True)) if order else {}
    source = RowSource(tq, partition)

    async def one(k: int) -> dict[str, Any]:
        gis = [gi_of[sid] for sid in ids[k]]
        worker = None
        if placement and gis:
            # the unit most of this stream's rows now route to
            unit = max(units.route(client, gis), key=lambda u: len(u.positions)).unit
            worker = await asyncio.to_thread(_worker_for_unit, tq, unit, directory)
        if worker is not None:
            got = await worker.restore.remote(str(directory), doc, k, gis)
            return {**got, "where": "remote"}
        got = await stream_io.restore_stream(source, directory, doc, k, gis)
        return {**got, "where": "local"}

    results = await asyncio.gather(*(one(k) for k in range(len(ids))))
    return {
        "rows": sum(r["rows"] for r in results),
        "segments": sum(r["segments"] for r in results),
        "groups": len({sid.rpartition(":")[0] for sid in order}),
        "streams": [r["where"] for r in results],
    }


def load_streamed(tq: Any, directory: Path, *, placement: bool = True) -> dict[str, Any]:
    """Put every stored segment back into TransferQueue, one put per segment, tags restored, one stream per stream
    of the directory running concurrently; returns ``metadata.json`` (v1 or v2) plus ``restored``: rows, segments,
    and where each stream ran (``local`` or ``remote``).

    Pre: the caller checked the data plane is untouched. Post: the partition holds exactly the stored rows.
    Runs its own event loop in a worker thread, so it may be called with or without a running loop.
    """
    directory = Path(directory)
    doc = read_metadata(directory)
    result: dict[str, Any] = {}
    box: list[BaseException] = []

    def thread_main() -> None:
        try:
            result.update(asyncio.run(_restore(tq, directory, doc, placement)))
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=thread_main, name="streamed-restore", daemon=True)
    t.start()
    t.join()
    stream_io.shutdown_workers()  # a restore is once per process; saves start their own workers again
    if box:
        raise box[0]
    want_segments = doc.get("segments", doc.get("groups"))  # v1: one segment per group
    if (
        result.get("rows") != doc.get("rows")
        or result.get("groups") != doc.get("groups")
        or (result.get("segments") != want_segments)
    ):
        raise StreamedFormatError(
            f"{directory}: restored {result.get('rows')} rows in {result.get('groups')} groups, metadata.json "
            f"lists {doc.get('rows')} rows in {doc.get('groups')} groups"
        )
    log.info("streamed restore: %d rows, streams %s", result["rows"], result["streams"])
    return {**doc, "restored": result}
